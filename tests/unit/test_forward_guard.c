/* test_forward_guard.c - the engine is device-clean (issue 14 item 1): the tiny preset loaded on
 * the test-only guard table (guard_ops.h: CPU kernels, every backend buffer in one region that
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
#include "guard_ops.h"
#include "kernels/ops.h"

#define POOL_PAGES  256
#define GUARD_BYTES ((size_t)1 << 30) /* reserved, not committed (MAP_NORESERVE) */
#define PROMPT      90 /* > window 16, > index_topk 8 compressed rows: ring wrap, indexer, pool */
#define N_DECODE    3

static int env_is(const char *name, const char *value)
{
    const char *v = getenv(name);
    return v != NULL && strcmp(v, value) == 0;
}

/* The steps of one run on engine e: CED prefill of two sequences in 32-token chunks, batched
 * decode, verify, a DSpark draft and a replay; every logit and draft output into out (rows of V
 * floats). Returns the number of floats written. (The schedule of test_forward_ops.c.) */
static int64_t run_steps(ftu_engine_t *e, float *out)
{
    const int64_t V = e->V, H = e->cfg->hidden_size;
    int32_t prompt[PROMPT];
    int32_t next[2];
    int32_t hist[PROMPT + N_DECODE]; /* the ids of sequence 1, for the replay */
    int64_t n_hist = PROMPT - 7;
    engine_seq_t *seqs[2];
    int64_t at = 0;

    ftu_prompt(21, V, prompt, PROMPT);
    memcpy(hist, prompt, sizeof(int32_t) * (size_t)n_hist);
    for (int i = 0; i < 2; i++) {
        seqs[i] = ftu_new_seq(e);
        assert_int_equal(
            engine_fwd_prefill(e->fwd, seqs[i], prompt, PROMPT - 7 * i, 0, out + at, NULL), TDM_OK);
        next[i] = (int32_t)ftu_argmax(out + at, V);
        at += V;
    }
    for (int step = 0; step < N_DECODE; step++) {
        hist[n_hist++] = next[1];
        assert_int_equal(engine_fwd_decode(e->fwd, seqs, next, 2, out + at), TDM_OK);
        for (int i = 0; i < 2; i++) {
            next[i] = (int32_t)ftu_argmax(out + at + i * V, V);
        }
        at += 2 * V;
    }
    assert_int_equal(engine_fwd_verify(e->fwd, seqs[0], next, 2, out + at), TDM_OK);
    at += 2 * V;
    if (e->cfg->n_blocks > 0) {
        int64_t n = e->cfg->dspark_block_size * H;
        assert_int_equal(engine_fwd_dspark_draft(e->fwd, &seqs[1], &next[1], 1, out + at), TDM_OK);
        at += n;
    }
    assert_int_equal(engine_seq_length(seqs[1]), n_hist);
    assert_int_equal(
        engine_fwd_replay(e->fwd, seqs[1], hist, n_hist, ENGINE_REPLAY_RECOVERY, out + at), TDM_OK);
    at += V;
    engine_seq_destroy(seqs[0]);
    engine_seq_destroy(seqs[1]);
    return at;
}

static void test_guard_table_gives_cpu_bits_without_host_access(void **state)
{
    ftu_engine_t plain, guarded;
    const kern_ops_t *guard = NULL;
    float *a, *b;
    int64_t cap, na, nb;
    size_t reports = 0;

    (void)state;
    if (!env_is("TANDEM_GUARD_STRICT", "1")) {
        print_message("skip: set TANDEM_GUARD_STRICT=1 to run the engine on the guard table "
                      "(until every engine file reaches backend memory through the table)\n");
        skip();
    }
    memset(&plain, 0, sizeof(plain));
    memset(&guarded, 0, sizeof(guarded));
    assert_int_equal(ftu_engine_open_on(&plain, POOL_PAGES, kern_ops_cpu(), 32), 0);
    assert_int_equal(guard_ops_create(GUARD_BYTES, &guard), TDM_OK);
    if (env_is("TANDEM_GUARD_REPORT", "1")) {
        guard_ops_report(1);
    }
    assert_int_equal(ftu_engine_open_on(&guarded, POOL_PAGES, guard, 32), 0);
    assert_true(guard_ops_used() > 0); /* weights, arenas and the page pool are guard memory */
    cap = (2 + 2 * N_DECODE + 2 + 1) * plain.V +
          plain.cfg->dspark_block_size * plain.cfg->hidden_size;
    a = malloc(sizeof(float) * (size_t)cap);
    b = malloc(sizeof(float) * (size_t)cap);
    assert_non_null(a);
    assert_non_null(b);
    na = run_steps(&plain, a);
    nb = run_steps(&guarded, b);
    reports = guard_ops_report(0);
    print_message("guard: %zu host accesses of backend memory reported\n", reports);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, sizeof(float) * (size_t)na);
    assert_int_equal(reports, 0);
    assert_int_equal(ftu_engine_close(&guarded), 0);
    assert_int_equal(guard_ops_destroy(), 0); /* every backend allocation was freed */
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
