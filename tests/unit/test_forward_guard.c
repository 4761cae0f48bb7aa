/* test_forward_guard.c - the engine is device-clean (issue 14 item 1): the tiny preset loaded on
 * the test-only guard table (kernels/guard.h: CPU kernels, every backend buffer in one region that
 * is PROT_NONE outside op calls) runs CED prefill in chunks, batched decode, verify, a DSpark
 * draft and a replay, and gives the logits of the CPU table bit for bit. A host read or write of
 * backend memory anywhere in the engine faults (SIGSEGV), and a host pointer handed to an op
 * aborts, so passing proves the orchestration reaches backend memory only through the table.
 *
 * Runs only with TANDEM_GUARD_STRICT=1 (it skips otherwise, saying so) until every engine file
 * is converted. TANDEM_GUARD_REPORT=1 additionally lists every faulting site (the guard's report
 * mode: each fault prints its stack and the run goes on) and then fails on the count.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "forward_test_util.h"
#include "engine/sampler.h"
#include "engine/spec.h"
#include "kernels/guard.h"
#include "kernels/ops.h"

#define POOL_PAGES  256
#define GUARD_BYTES ((size_t)1 << 30) /* reserved, not committed (MAP_NORESERVE) */
#define PROMPT      90 /* > window 16, > index_topk 8 compressed rows: ring wrap, indexer, pool */
#define N_DECODE    3
#define N_SPEC      3 /* speculative steps per sequence */
#define DUMP_T      24

static int env_is(const char *name, const char *value)
{
    const char *v = getenv(name);
    return v != NULL && strcmp(v, value) == 0;
}

/* A batched prefill of two parts (the gathered head of forward_batch.c), then N_SPEC speculative
 * steps of both sequences (DSpark on one when the model has blocks, n-gram on the other;
 * temperature 0.8, rejection rule): first-token logits and every emitted token (as floats) into
 * out. Returns the floats written. */
static int64_t run_parts_and_spec(ftu_engine_t *e, float *out)
{
    const int64_t V = e->V;
    int32_t hist[2][PROMPT + N_SPEC * (ENGINE_SPEC_MAX_EMIT + 1)];
    int64_t n_hist[2] = {PROMPT - 3, PROMPT - 20};
    engine_prefill_part_t parts[2];
    engine_seq_t *seqs[2];
    engine_sampler_params_t sp;
    engine_spec_params_t pp;
    engine_spec_t *spec = NULL;
    int64_t at = 0;

    for (int i = 0; i < 2; i++) {
        ftu_prompt(31 + (uint64_t)i, V, hist[i], n_hist[i]);
        seqs[i] = ftu_new_seq(e);
        memset(&parts[i], 0, sizeof(parts[i]));
        parts[i].seq = seqs[i];
        parts[i].start = 0;
        parts[i].end = n_hist[i];
        parts[i].ids = hist[i];
        parts[i].n_ids = n_hist[i];
        parts[i].logits_out = out + at;
        at += V;
    }
    assert_int_equal(engine_fwd_prefill_parts(e->fwd, parts, 2), TDM_OK);
    engine_sampler_params_default(&sp);
    sp.temperature = 0.8;
    sp.seed = 5;
    engine_spec_params_default(e->model, &pp);
    pp.accept = ENGINE_SPEC_ACCEPT_REJECTION;
    pp.max_batch = 2;
    pp.max_drafts = 3;
    assert_int_equal(engine_spec_create(e->fwd, &pp, &spec), TDM_OK);
    for (int i = 0; i < 2; i++) {
        hist[i][n_hist[i]++] = (int32_t)ftu_argmax(parts[i].logits_out, V);
    }
    for (int step = 0; step < N_SPEC; step++) {
        engine_spec_req_t reqs[2];
        engine_spec_result_t res[2];

        for (int i = 0; i < 2; i++) {
            memset(&reqs[i], 0, sizeof(reqs[i]));
            reqs[i].seq = seqs[i];
            reqs[i].anchor = hist[i][n_hist[i] - 1];
            reqs[i].drafter =
                i == 0 && e->cfg->n_blocks > 0 ? ENGINE_SPEC_DSPARK : ENGINE_SPEC_NGRAM;
            reqs[i].sampling = &sp;
            reqs[i].history = hist[i];
            reqs[i].n_history = n_hist[i];
            reqs[i].max_emit = ENGINE_SPEC_MAX_EMIT;
        }
        assert_int_equal(engine_spec_step(spec, reqs, 2, res), TDM_OK);
        for (int i = 0; i < 2; i++) {
            for (int k = 0; k < res[i].n_emitted; k++) {
                hist[i][n_hist[i]++] = res[i].samples[k].token;
                out[at++] = (float)res[i].samples[k].token;
            }
            out[at++] = -1.0f; /* separator: the emitted counts must match too */
        }
    }
    engine_spec_destroy(spec);
    engine_seq_destroy(seqs[0]);
    engine_seq_destroy(seqs[1]);
    return at;
}

/* A DUMP_T-token prefill with the layer dump sink on (gathered into d, ftu_dump_init'ed). */
static void run_dumped(ftu_engine_t *e, ftu_dump_t *d)
{
    int32_t ids[DUMP_T];
    engine_dump_sink_t sink;
    engine_seq_t *seq = ftu_new_seq(e);

    memset(&sink, 0, sizeof(sink));
    sink.user = d;
    sink.layer = ftu_dump_cb;
    ftu_prompt(41, e->V, ids, DUMP_T);
    engine_fwd_set_dump(e->fwd, &sink);
    assert_int_equal(
        engine_fwd_prefill(e->fwd, seq, ids, DUMP_T, ENGINE_PREFILL_TAIL_FROM_H, NULL, NULL),
        TDM_OK);
    engine_fwd_set_dump(e->fwd, NULL);
    engine_seq_destroy(seq);
}

/* The steps of one run on engine e: ftu_run_schedule (CED prefill in 32-token chunks, batched
 * decode, a greedy step, verify, a DSpark draft, a replay), then run_parts_and_spec. Returns the
 * number of floats written. */
static int64_t run_steps(ftu_engine_t *e, float *out)
{
    int64_t at = ftu_run_schedule(e, PROMPT, N_DECODE, out);

    return at + run_parts_and_spec(e, out + at);
}

static void test_guard_table_gives_cpu_bits_without_host_access(void **state)
{
    ftu_engine_t plain, guarded;
    const kern_ops_t *guard = NULL;
    float *a, *b;
    int64_t cap, na, nb;
    size_t reports = 0;
    ftu_dump_t da, db;

    (void)state;
    memset(&plain, 0, sizeof(plain));
    memset(&guarded, 0, sizeof(guarded));
    assert_int_equal(ftu_engine_open_on(&plain, POOL_PAGES, kern_ops_cpu(), 32), 0);
    assert_int_equal(kern_guard_create(GUARD_BYTES, &guard), TDM_OK);
    if (env_is("TANDEM_GUARD_REPORT", "1")) {
        kern_guard_report(1);
    }
    assert_int_equal(ftu_engine_open_on(&guarded, POOL_PAGES, guard, 32), 0);
    assert_true(kern_guard_used() > 0); /* weights, arenas and the page pool are guard memory */
    cap = ftu_schedule_floats(&plain, N_DECODE) + 2 * plain.V +
          2 * N_SPEC * (ENGINE_SPEC_MAX_EMIT + 1);
    a = malloc(sizeof(float) * (size_t)cap);
    b = malloc(sizeof(float) * (size_t)cap);
    assert_non_null(a);
    assert_non_null(b);
    na = run_steps(&plain, a);
    nb = run_steps(&guarded, b);
    ftu_dump_init(&da, plain.cfg, 0, DUMP_T);
    ftu_dump_init(&db, plain.cfg, 0, DUMP_T);
    run_dumped(&plain, &da);
    run_dumped(&guarded, &db);
    reports = kern_guard_report(0);
    print_message("guard: %zu host accesses of backend memory reported\n", reports);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, sizeof(float) * (size_t)na);
    assert_int_equal(reports, 0);
    for (int l = 0; l < da.n_layers; l++) {
        size_t mh = (size_t)(DUMP_T * da.m * da.H) * sizeof(float);
        assert_true(da.rows_seen[l] > 0);
        assert_int_equal(da.rows_seen[l], db.rows_seen[l]);
        assert_memory_equal(da.x_in[l], db.x_in[l], mh);
        assert_memory_equal(da.x_out[l], db.x_out[l], mh);
        assert_memory_equal(da.pre[l], db.pre[l], (size_t)(DUMP_T * da.m) * sizeof(float));
        assert_memory_equal(da.sel[l], db.sel[l], (size_t)(DUMP_T * da.k_I) * sizeof(int32_t));
        assert_memory_equal(da.experts[l], db.experts[l],
                            (size_t)(DUMP_T * da.K) * sizeof(int32_t));
    }
    ftu_dump_fini(&da);
    ftu_dump_fini(&db);
    assert_int_equal(ftu_engine_close(&guarded), 0);
    assert_int_equal(kern_guard_destroy(), 0); /* every backend allocation was freed */
    assert_int_equal(ftu_engine_close(&plain), 0);
    free(a);
    free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_guard_table_gives_cpu_bits_without_host_access),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
