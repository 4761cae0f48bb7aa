/* test_engine_ep.c - expert parallel (issue 14 item 6) on CPU ranks:
 *   - kernels/comm.h's cpu group: the in-place all-gather of uneven and empty blocks, abort while
 *     ranks wait (they return TDM_ERR_PEER_LOST, no hang), reset, and the refusals;
 *   - engine/ep.h: the tiny preset split over 2 and 3 ranks (8 experts: 4+4 and 3+3+2) runs the
 *     forward tests' whole schedule (CED prefill, batched decode, greedy, verify, DSpark draft,
 *     replay) and every rank's logits, ids and draft outputs equal the one-device run byte for
 *     byte; each rank holds only its experts (resident MXFP4 bytes split, summing to the whole);
 *   - a rank that fails mid-run: the run returns that rank's status (not PEER_LOST), nothing
 *     hangs, every page comes back, and the next run gives the one-device bits again;
 *   - the refusals: a comm that is not the model's shard, a rank outside the size, mixed device
 *     kinds, CUDA devices without NCCL / a GPU (the message names why).
 * The schedule runs on the rank threads (ftu_run_schedule's cmocka asserts there pass or crash
 * the test; either way a wrong result cannot pass). Two-GPU NCCL runs: test_engine_cuda.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "engine/ep.h"
#include "forward_test_util.h"
#include "kernels/comm.h"

#define POOL_PAGES 256
#define PROMPT     40
#define N_DECODE   4

/* ---- kernels/comm.h, cpu group ---- */

#define GATHER_RANKS 3

typedef struct {
    kern_comm_t *comm;
    uint8_t buf[64];
    const size_t *offsets;
    tdm_status_t st;
} gather_arg_t;

static void *gather_main(void *p)
{
    gather_arg_t *a = p;
    a->st = kern_comm_allgatherv(a->comm, NULL, a->buf, a->offsets);
    return NULL;
}

static void test_comm_allgatherv(void **state)
{
    (void)state;
    /* blocks of 0, 5 and 11 bytes from offset 3: rank 0's is empty */
    static const size_t offsets[GATHER_RANKS + 1] = {3, 3, 8, 19};
    kern_comm_group_t *g = NULL;
    gather_arg_t args[GATHER_RANKS];
    pthread_t th[GATHER_RANKS];

    assert_int_equal(kern_comm_group_create_cpu(GATHER_RANKS, &g), TDM_OK);
    assert_int_equal(kern_comm_group_size(g), GATHER_RANKS);
    for (int round = 0; round < 3; round++) { /* the barrier is reusable */
        for (int r = 0; r < GATHER_RANKS; r++) {
            args[r].comm = kern_comm_group_rank(g, r);
            args[r].offsets = offsets;
            assert_int_equal(kern_comm_rank(args[r].comm), r);
            memset(args[r].buf, 0xEE, sizeof(args[r].buf));
            for (size_t i = offsets[r]; i < offsets[r + 1]; i++) {
                args[r].buf[i] = (uint8_t)(round * 100 + r * 16 + i);
            }
            assert_int_equal(pthread_create(&th[r], NULL, gather_main, &args[r]), 0);
        }
        for (int r = 0; r < GATHER_RANKS; r++) {
            pthread_join(th[r], NULL);
            assert_int_equal(args[r].st, TDM_OK);
        }
        for (int r = 0; r < GATHER_RANKS; r++) {
            for (int q = 0; q < GATHER_RANKS; q++) {
                for (size_t i = offsets[q]; i < offsets[q + 1]; i++) {
                    assert_int_equal(args[r].buf[i], (uint8_t)(round * 100 + q * 16 + i));
                }
            }
            /* bytes outside every block untouched */
            assert_int_equal(args[r].buf[0], 0xEE);
            assert_int_equal(args[r].buf[offsets[GATHER_RANKS]], 0xEE);
        }
    }
    assert_null(kern_comm_group_rank(g, GATHER_RANKS));
    kern_comm_group_destroy(g);
}

/* All-to-all: rank r sends (q + 1) * (r + 1) % 4 bytes (some empty) of value 16 r + q to rank q. */
typedef struct {
    kern_comm_t *comm;
    uint8_t send[32], recv[32];
    size_t send_off[GATHER_RANKS + 1], recv_off[GATHER_RANKS + 1];
    tdm_status_t st;
} a2a_arg_t;

static size_t a2a_bytes(int from, int to)
{
    return (size_t)(((to + 1) * (from + 1)) % 4);
}

static void *a2a_main(void *p)
{
    a2a_arg_t *a = p;
    a->st = kern_comm_alltoallv(a->comm, NULL, a->send, a->send_off, a->recv, a->recv_off);
    return NULL;
}

static void test_comm_alltoallv(void **state)
{
    (void)state;
    kern_comm_group_t *g = NULL;
    a2a_arg_t args[GATHER_RANKS];
    pthread_t th[GATHER_RANKS];

    assert_int_equal(kern_comm_group_create_cpu(GATHER_RANKS, &g), TDM_OK);
    for (int r = 0; r < GATHER_RANKS; r++) {
        a2a_arg_t *a = &args[r];
        a->comm = kern_comm_group_rank(g, r);
        a->send_off[0] = a->recv_off[0] = 1; /* blocks need not start at 0 */
        for (int q = 0; q < GATHER_RANKS; q++) {
            a->send_off[q + 1] = a->send_off[q] + a2a_bytes(r, q);
            a->recv_off[q + 1] = a->recv_off[q] + a2a_bytes(q, r);
            memset(a->send + a->send_off[q], 16 * r + q, a2a_bytes(r, q));
        }
        memset(a->recv, 0xEE, sizeof(a->recv));
        assert_int_equal(pthread_create(&th[r], NULL, a2a_main, a), 0);
    }
    for (int r = 0; r < GATHER_RANKS; r++) {
        pthread_join(th[r], NULL);
        assert_int_equal(args[r].st, TDM_OK);
    }
    for (int r = 0; r < GATHER_RANKS; r++) {
        for (int q = 0; q < GATHER_RANKS; q++) {
            for (size_t i = args[r].recv_off[q]; i < args[r].recv_off[q + 1]; i++) {
                assert_int_equal(args[r].recv[i], 16 * q + r);
            }
        }
        assert_int_equal(args[r].recv[0], 0xEE);
        assert_int_equal(args[r].recv[args[r].recv_off[GATHER_RANKS]], 0xEE);
    }
    /* a size the sender does not send: an error on every rank, not a hang or an overrun */
    for (int r = 0; r < GATHER_RANKS; r++) {
        if (r == 1) {
            args[r].recv_off[GATHER_RANKS] += 1;
        }
        assert_int_equal(pthread_create(&th[r], NULL, a2a_main, &args[r]), 0);
    }
    for (int r = 0; r < GATHER_RANKS; r++) {
        pthread_join(th[r], NULL);
        assert_int_not_equal(args[r].st, TDM_OK);
    }
    kern_comm_group_destroy(g);
}

static void test_comm_abort_reset(void **state)
{
    (void)state;
    static const size_t offsets[3] = {0, 4, 8};
    kern_comm_group_t *g = NULL;
    gather_arg_t args[2];
    pthread_t th;

    assert_int_equal(kern_comm_group_create_cpu(2, &g), TDM_OK);
    /* rank 0 waits in the all-gather; rank 1 never comes: the abort releases rank 0 */
    args[0].comm = kern_comm_group_rank(g, 0);
    args[0].offsets = offsets;
    assert_int_equal(pthread_create(&th, NULL, gather_main, &args[0]), 0);
    usleep(20000);
    kern_comm_group_abort(g);
    pthread_join(th, NULL);
    assert_int_equal(args[0].st, TDM_ERR_PEER_LOST);
    /* aborted: every later collective refuses at once */
    assert_int_equal(kern_comm_allgatherv(kern_comm_group_rank(g, 1), NULL, args[1].buf, offsets),
                     TDM_ERR_PEER_LOST);
    /* reset: both ranks meet again */
    assert_int_equal(kern_comm_group_reset(g), TDM_OK);
    for (int r = 0; r < 2; r++) {
        args[r].comm = kern_comm_group_rank(g, r);
        args[r].offsets = offsets;
        memset(args[r].buf, r + 1, sizeof(args[r].buf));
    }
    assert_int_equal(pthread_create(&th, NULL, gather_main, &args[0]), 0);
    gather_main(&args[1]);
    pthread_join(th, NULL);
    assert_int_equal(args[0].st, TDM_OK);
    assert_int_equal(args[1].st, TDM_OK);
    assert_int_equal(args[0].buf[5], 2);
    assert_int_equal(args[1].buf[1], 1);
    kern_comm_group_destroy(g);
}

static void test_comm_refusals(void **state)
{
    (void)state;
    static const size_t bad[3] = {0, 8, 4}; /* decreasing */
    static const int twice[2] = {0, 0};
    static const int pair[2] = {0, 1};
    kern_comm_group_t *g = NULL;
    uint8_t buf[16];
    char err[256] = "";

    assert_int_equal(kern_comm_group_create_cpu(0, &g), TDM_ERR_INVALID_ARG);
    assert_int_equal(kern_comm_group_create_cpu(KERN_COMM_MAX_RANKS + 1, &g), TDM_ERR_INVALID_ARG);
    assert_null(g);
    assert_int_equal(kern_comm_group_create_cpu(2, &g), TDM_OK);
    assert_int_equal(kern_comm_allgatherv(kern_comm_group_rank(g, 0), NULL, buf, bad),
                     TDM_ERR_INVALID_ARG);
    assert_int_equal(kern_comm_allgatherv(NULL, NULL, buf, bad), TDM_ERR_INVALID_ARG);
    kern_comm_group_destroy(g);
    g = NULL;
    assert_int_equal(kern_comm_group_create_nccl(twice, 2, &g, err, sizeof(err)),
                     TDM_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "twice"));
    if (kern_cuda_device_count(NULL) < 2) {
        /* no NCCL in this build (unsupported) or not two devices (NCCL's own error) */
        err[0] = '\0';
        assert_int_not_equal(kern_comm_group_create_nccl(pair, 2, &g, err, sizeof(err)), TDM_OK);
        assert_true(strlen(err) > 0);
        assert_null(g);
        print_message("nccl group refused here: %s\n", err);
    }
}

/* ---- engine/ep.h ---- */

typedef struct {
    float *out[ENGINE_EP_MAX_RANKS];
    int64_t n_out[ENGINE_EP_MAX_RANKS];
    int fail_rank; /* -1: none; else this rank's fn fails at once with TDM_ERR_NO_MEMORY */
    int hetero;    /* 1: rank r does hetero_work(r) instead of the common schedule */
    uint32_t free_after[ENGINE_EP_MAX_RANKS];
} sched_arg_t;

#define HETERO_LONG  300 /* two prefill chunks of 256 */
#define HETERO_STEPS 6

/* Different work per role, as data-parallel ranks get it: role 0 one long prompt then greedy
 * decode steps; role 1 two short prompts decoded together for fewer steps, then a DSpark draft;
 * role 2 nothing.
 * Every logit row into out; returns the floats written. */
static int64_t hetero_work(ftu_engine_t *e, int role, float *out)
{
    int32_t ids[HETERO_LONG], next[2];
    engine_seq_t *seqs[2] = {NULL, NULL};
    int n_seqs = role == 0 ? 1 : role == 1 ? 2 : 0;
    int steps = role == 0 ? HETERO_STEPS : 2;
    int64_t at = 0;

    for (int i = 0; i < n_seqs; i++) {
        int64_t T = role == 0 ? HETERO_LONG : 30 + 11 * i;
        ftu_prompt(100 + (uint64_t)(role * 2 + i), e->V, ids, T);
        seqs[i] = ftu_new_seq(e);
        assert_int_equal(engine_fwd_prefill(e->fwd, seqs[i], ids, T, 0, out + at, NULL), TDM_OK);
        next[i] = (int32_t)ftu_argmax(out + at, e->V);
        at += e->V;
    }
    for (int step = 0; step < steps && n_seqs > 0; step++) {
        assert_int_equal(engine_fwd_decode(e->fwd, seqs, next, n_seqs, out + at), TDM_OK);
        for (int i = 0; i < n_seqs; i++) {
            next[i] = (int32_t)ftu_argmax(out + at + i * e->V, e->V);
        }
        at += n_seqs * e->V;
    }
    if (role == 1 && e->cfg->n_blocks > 0) {
        /* a DSpark draft (blocks of other expert counts: 4 experts over the ranks) while rank 0
         * is still in backbone layers: rounds mixing layers of different E */
        assert_int_equal(engine_fwd_dspark_draft(e->fwd, &seqs[1], &next[1], 1, out + at), TDM_OK);
        at += e->cfg->dspark_block_size * e->cfg->hidden_size;
    }
    for (int i = 0; i < n_seqs; i++) {
        engine_seq_destroy(seqs[i]);
    }
    return at;
}

/* The forward tests' schedule on one rank (its model shard, pool and context). */
static tdm_status_t sched_rank(const engine_ep_rank_t *rank, void *user)
{
    sched_arg_t *a = user;
    ftu_engine_t e;

    if (rank->rank == a->fail_rank) {
        return TDM_ERR_NO_MEMORY;
    }
    memset(&e, 0, sizeof(e));
    e.model = rank->model;
    e.cfg = engine_model_config(rank->model);
    e.pool = rank->pool;
    e.fwd = rank->fwd;
    e.V = e.cfg->vocab_size;
    if (a->fail_rank >= 0) {
        /* a peer failed: the first MoE layer's all-gather must give up, not hang */
        engine_seq_t *seq = NULL;
        int32_t ids[PROMPT];
        tdm_status_t st;
        assert_int_equal(engine_seq_create(e.model, e.pool, &seq), TDM_OK);
        ftu_prompt(5, e.V, ids, PROMPT);
        st = engine_fwd_prefill(e.fwd, seq, ids, PROMPT, 0, NULL, NULL);
        engine_seq_destroy(seq);
        a->free_after[rank->rank] = engine_kv_pool_n_free(e.pool);
        return st;
    }
    a->n_out[rank->rank] = a->hetero ? hetero_work(&e, rank->rank, a->out[rank->rank])
                                     : ftu_run_schedule(&e, PROMPT, N_DECODE, a->out[rank->rank]);
    a->free_after[rank->rank] = engine_kv_pool_n_free(e.pool);
    return TDM_OK;
}

static engine_ep_t *open_ep_mode(const char *dir, int n_ranks, int data_parallel)
{
    engine_ep_params_t p;
    engine_ep_t *ep = NULL;
    char err[256] = "";

    memset(&p, 0, sizeof(p));
    p.n_ranks = n_ranks;
    for (int r = 0; r < n_ranks; r++) {
        p.devices[r].backend = KERN_BACKEND_CPU;
    }
    engine_model_params_default(&p.model);
    p.n_pages = POOL_PAGES;
    p.fwd.max_chunk_tokens = 256;
    p.fwd.n_threads = 1;
    p.fwd.ep_data_parallel = data_parallel;
    if (engine_ep_open(dir, &p, &ep, err, sizeof(err)) != TDM_OK) {
        fail_msg("engine_ep_open: %s", err);
    }
    return ep;
}

static engine_ep_t *open_ep(const char *dir, int n_ranks)
{
    return open_ep_mode(dir, n_ranks, 0);
}

/* The one-device reference: tiny opened into the zeroed *one, its directory in dir, the common
 * schedule run into *ref (calloc'ed, at least min_rows logit rows; the caller frees it) with its
 * float count in *n_ref. Returns the floats *ref holds. */
static int64_t open_reference(ftu_engine_t *one, char *dir, int64_t min_rows, float **ref,
                              int64_t *n_ref)
{
    assert_int_equal(ftu_engine_open_preset(one, "tiny", POOL_PAGES, NULL, 0), 0);
    assert_int_equal(ftu_make_model("tiny", 1, "fwd-tiny", dir), 0);
    int64_t cap = ftu_schedule_floats(one, N_DECODE);
    cap = cap > min_rows * one->V ? cap : min_rows * one->V;
    *ref = calloc((size_t)cap, sizeof(float));
    assert_non_null(*ref);
    *n_ref = ftu_run_schedule(one, PROMPT, N_DECODE, *ref);
    return cap;
}

static void test_ep_matches_one_device(void **state)
{
    (void)state;
    ftu_engine_t one;
    char dir[FTU_PATH_BYTES];
    engine_model_resident_t res_one;
    float *ref = NULL;
    int64_t n_ref = 0;

    memset(&one, 0, sizeof(one));
    int64_t cap = open_reference(&one, dir, 0, &ref, &n_ref);
    engine_model_resident(one.model, &res_one);
    assert_true(res_one.mxfp4 > 0);

    for (int n_ranks = 2; n_ranks <= 3; n_ranks++) {
        engine_ep_t *ep = open_ep(dir, n_ranks);
        sched_arg_t a;
        uint64_t mxfp4_sum = 0;

        memset(&a, 0, sizeof(a));
        a.fail_rank = -1;
        for (int r = 0; r < n_ranks; r++) {
            a.out[r] = calloc((size_t)cap, sizeof(float));
            assert_non_null(a.out[r]);
        }
        assert_int_equal(engine_ep_run(ep, sched_rank, &a), TDM_OK);
        for (int r = 0; r < n_ranks; r++) {
            const engine_ep_rank_t *rk = engine_ep_rank(ep, r);
            engine_model_resident_t res;
            int e0, e1, er, es;

            assert_int_equal(a.n_out[r], n_ref);
            assert_memory_equal(a.out[r], ref, (size_t)n_ref * sizeof(float));
            assert_int_equal(a.free_after[r], engine_kv_pool_n_pages(rk->pool));
            engine_model_resident(rk->model, &res);
            assert_true(res.mxfp4 < res_one.mxfp4);
            assert_int_equal(res.fp8, res_one.fp8); /* dense weights replicated */
            mxfp4_sum += res.mxfp4;
            assert_int_equal(engine_model_expert_shard(rk->model, 0, &e0, &e1, &er, &es), TDM_OK);
            assert_int_equal(er, r);
            assert_int_equal(es, n_ranks);
            /* 8 experts: 4+4, or 3+3+2 (the first E mod R ranks one more) */
            static const int starts[2][4] = {{0, 4, 8, 8}, {0, 3, 6, 8}};
            assert_int_equal(one.cfg->n_routed_experts, 8);
            assert_int_equal(e0, starts[n_ranks - 2][r]);
            assert_int_equal(e1, starts[n_ranks - 2][r + 1]);
            free(a.out[r]);
        }
        assert_int_equal(mxfp4_sum, res_one.mxfp4);
        print_message("%d ranks: %lld floats equal the one-device run byte for byte\n", n_ranks,
                      (long long)n_ref);
        engine_ep_close(ep);
    }
    free(ref);
    assert_int_equal(ftu_engine_close(&one), 0);
}

/* Data-parallel attention (each rank its own sequences, all-to-all dispatch): every rank running
 * the common schedule, and then ranks doing different work at once (a chunked long prefill, a
 * batch of two, nothing), each equal byte for byte to the same calls on one device. */
static void test_ep_data_parallel_matches_one_device(void **state)
{
    (void)state;
    ftu_engine_t one;
    char dir[FTU_PATH_BYTES];
    float *ref[3];
    int64_t n_ref[3];

    int64_t n_sched = 0;

    memset(&one, 0, sizeof(one));
    /* ref[2]: the common schedule; ref[0], ref[1]: roles 0 and 1 of hetero_work */
    int64_t cap = open_reference(&one, dir, 2 + 2 * HETERO_STEPS + 4, &ref[2], &n_sched);
    for (int i = 0; i < 2; i++) {
        ref[i] = calloc((size_t)cap, sizeof(float));
        assert_non_null(ref[i]);
    }
    for (int role = 0; role < 2; role++) {
        n_ref[role] = hetero_work(&one, role, ref[role]);
    }
    n_ref[2] = 0;

    for (int n_ranks = 2; n_ranks <= 3; n_ranks++) {
        engine_ep_t *ep = open_ep_mode(dir, n_ranks, 1);
        sched_arg_t a;

        memset(&a, 0, sizeof(a));
        a.fail_rank = -1;
        for (int r = 0; r < n_ranks; r++) {
            a.out[r] = calloc((size_t)cap, sizeof(float));
            assert_non_null(a.out[r]);
        }
        assert_int_equal(engine_ep_run(ep, sched_rank, &a), TDM_OK);
        for (int r = 0; r < n_ranks; r++) {
            assert_int_equal(a.n_out[r], n_sched);
            assert_memory_equal(a.out[r], ref[2], (size_t)n_sched * sizeof(float));
        }
        a.hetero = 1;
        assert_int_equal(engine_ep_run(ep, sched_rank, &a), TDM_OK);
        for (int r = 0; r < n_ranks; r++) {
            const engine_ep_rank_t *rk = engine_ep_rank(ep, r);
            assert_int_equal(a.n_out[r], n_ref[r]);
            assert_memory_equal(a.out[r], ref[r], (size_t)n_ref[r] * sizeof(float));
            assert_int_equal(a.free_after[r], engine_kv_pool_n_pages(rk->pool));
            free(a.out[r]);
        }
        print_message("data-parallel, %d ranks: the common schedule and per-rank work equal one "
                      "device byte for byte\n",
                      n_ranks);
        engine_ep_close(ep);
    }
    for (int i = 0; i < 3; i++) {
        free(ref[i]);
    }
    assert_int_equal(ftu_engine_close(&one), 0);
}

static void test_ep_rank_failure(void **state)
{
    (void)state;
    ftu_engine_t one;
    char dir[FTU_PATH_BYTES];
    sched_arg_t a;
    float *ref = NULL;
    int64_t n_ref = 0;

    memset(&one, 0, sizeof(one));
    int64_t cap = open_reference(&one, dir, 0, &ref, &n_ref);

    engine_ep_t *ep = open_ep(dir, 2);
    memset(&a, 0, sizeof(a));
    a.fail_rank = 1;
    assert_int_equal(engine_ep_run(ep, sched_rank, &a), TDM_ERR_NO_MEMORY);
    assert_int_equal(a.free_after[0], engine_kv_pool_n_pages(engine_ep_rank(ep, 0)->pool));
    /* the group was reset: a whole schedule again, the one-device bits */
    a.fail_rank = -1;
    for (int r = 0; r < 2; r++) {
        a.out[r] = calloc((size_t)cap, sizeof(float));
        assert_non_null(a.out[r]);
    }
    assert_int_equal(engine_ep_run(ep, sched_rank, &a), TDM_OK);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(a.n_out[r], n_ref);
        assert_memory_equal(a.out[r], ref, (size_t)n_ref * sizeof(float));
        free(a.out[r]);
    }
    engine_ep_close(ep);
    free(ref);
    assert_int_equal(ftu_engine_close(&one), 0);
}

static void test_ep_refusals(void **state)
{
    (void)state;
    char dir[FTU_PATH_BYTES];
    char err[256] = "";
    engine_model_params_t mp;
    engine_model_t *model = NULL;
    engine_ep_params_t p;
    engine_ep_t *ep = NULL;
    kern_comm_group_t *g = NULL;

    assert_int_equal(ftu_make_model("tiny", 1, "fwd-tiny", dir), 0);
    engine_model_params_default(&mp);
    mp.ep_rank = 2;
    mp.ep_size = 2;
    assert_int_equal(engine_model_load(dir, &mp, &model, err, sizeof(err)), TDM_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "rank 2 of 2"));
    assert_null(model);

    /* a comm on a model that holds every expert, and no comm on a shard */
    engine_model_params_default(&mp);
    assert_int_equal(engine_model_load(dir, &mp, &model, err, sizeof(err)), TDM_OK);
    engine_kv_pool_t *pool = NULL;
    engine_fwd_params_t fp;
    engine_fwd_t *fwd = NULL;
    assert_int_equal(engine_kv_pool_create(engine_model_config(model),
                                           engine_model_fingerprint(model), 8, &pool),
                     TDM_OK);
    assert_int_equal(kern_comm_group_create_cpu(2, &g), TDM_OK);
    engine_fwd_params_default(model, &fp);
    fp.comm = kern_comm_group_rank(g, 0);
    assert_int_equal(engine_fwd_create(model, pool, &fp, &fwd), TDM_ERR_INVALID_ARG);
    assert_null(fwd);
    engine_kv_pool_destroy(pool);
    engine_model_destroy(model);
    model = NULL;
    mp.ep_rank = 1;
    mp.ep_size = 2;
    assert_int_equal(engine_model_load(dir, &mp, &model, err, sizeof(err)), TDM_OK);
    assert_int_equal(engine_kv_pool_create(engine_model_config(model),
                                           engine_model_fingerprint(model), 8, &pool),
                     TDM_OK);
    fp.comm = NULL;
    assert_int_equal(engine_fwd_create(model, pool, &fp, &fwd), TDM_ERR_INVALID_ARG);
    fp.comm = kern_comm_group_rank(g, 0); /* rank 0's handle on rank 1's shard */
    assert_int_equal(engine_fwd_create(model, pool, &fp, &fwd), TDM_ERR_INVALID_ARG);
    fp.comm = kern_comm_group_rank(g, 1);
    assert_int_equal(engine_fwd_create(model, pool, &fp, &fwd), TDM_OK);
    engine_fwd_destroy(fwd);
    engine_kv_pool_destroy(pool);
    engine_model_destroy(model);
    kern_comm_group_destroy(g);

    /* the group's own refusals */
    memset(&p, 0, sizeof(p));
    engine_model_params_default(&p.model);
    p.fwd.max_chunk_tokens = 64;
    p.fwd.n_threads = 1;
    p.n_pages = 8;
    p.n_ranks = 0;
    assert_int_equal(engine_ep_open(dir, &p, &ep, err, sizeof(err)), TDM_ERR_INVALID_ARG);
    p.n_ranks = 2;
    p.devices[0].backend = KERN_BACKEND_CPU;
    p.devices[1].backend = KERN_BACKEND_CUDA;
    assert_int_equal(engine_ep_open(dir, &p, &ep, err, sizeof(err)), TDM_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "mixed"));
    if (kern_cuda_device_count(NULL) < 2) {
        p.devices[0].backend = KERN_BACKEND_CUDA;
        p.devices[1].ordinal = 1;
        err[0] = '\0';
        assert_int_not_equal(engine_ep_open(dir, &p, &ep, err, sizeof(err)), TDM_OK);
        assert_true(strlen(err) > 0);
        print_message("cuda:0,cuda:1 refused here: %s\n", err);
    }
    assert_null(ep);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_comm_allgatherv),
        cmocka_unit_test(test_comm_alltoallv),
        cmocka_unit_test(test_comm_abort_reset),
        cmocka_unit_test(test_comm_refusals),
        cmocka_unit_test(test_ep_matches_one_device),
        cmocka_unit_test(test_ep_data_parallel_matches_one_device),
        cmocka_unit_test(test_ep_rank_failure),
        cmocka_unit_test(test_ep_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
