/* test_seq_guard.c - sequence state and KV pages in backend memory (issue 14 item 1): the tiny
 * preset on the test-only guard table (kernels/guard.h: every backend buffer PROT_NONE outside op
 * calls) imports a sequence the CPU table computed, exports it again, shares a prefix of it,
 * cuts into the shared page (copy-on-write, zeroed slots, header through staging), seals and
 * relinks pages - all through the table's memory members - and every exported blob equals the
 * CPU table's byte for byte. A host dereference of the rings, pending halves or pages would
 * fault. (The forward pass on the guard table is test_forward_guard's.)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "forward_test_util.h"
#include "kernels/guard.h"
#include "kernels/ops.h"

#define POOL_PAGES  128
#define GUARD_BYTES ((size_t)256 << 20) /* reserved, not committed (MAP_NORESERVE) */
#define PROMPT      300 /* > 2 * 64 rows of a ratio-2 source: a whole shared page and a cut one */
#define SHARE_AT    256 /* a multiple of 64 * max ratio */
#define CUT_AT      201 /* odd: inside the second page of every source */

/* The sequence's export with pages into a malloc'ed blob (*n_out bytes). */
static uint8_t *export_pages(engine_seq_t *seq, size_t *n_out)
{
    size_t cap = engine_seq_export_bytes(seq, ENGINE_SEQ_EXPORT_PAGES);
    uint8_t *blob = malloc(cap);

    assert_non_null(blob);
    assert_int_equal(engine_seq_export(seq, ENGINE_SEQ_EXPORT_PAGES, blob, cap, n_out), TDM_OK);
    return blob;
}

/* The exports of cpu and guarded are equal: whole (pages_only 0), or their page sections (the
 * ids a truncate leaves behind are stale until a replay, and differ with the sequences' past). */
static void assert_same_export(const ftu_engine_t *e, engine_seq_t *cpu, engine_seq_t *guarded,
                               int pages_only)
{
    size_t na = 0, nb = 0, from = 0;
    uint8_t *a = export_pages(cpu, &na);
    uint8_t *b = export_pages(guarded, &nb);

    assert_int_equal(na, nb);
    if (pages_only) {
        const engine_config_t *cfg = e->cfg;
        size_t page_bytes = engine_kv_pool_page_bytes(e->pool);
        from = na - 8;
        for (int s = 0; s < cfg->n_kv_source_layer_ids; s++) {
            const engine_kv_table_t *t = engine_seq_table(cpu, (int)cfg->kv_source_layer_ids[s]);
            from -= 12 + (size_t)t->n_pages * page_bytes;
        }
    }
    assert_memory_equal(a + from, b + from, na - 8 - from);
    free(a);
    free(b);
}

static void test_guard_state_and_pages_match_cpu(void **state)
{
    ftu_engine_t cpu, grd;
    const kern_ops_t *guard = NULL;
    int32_t prompt[PROMPT];
    float *logits;
    engine_seq_t *a = NULL, *g = NULL, *b = NULL, *h = NULL, *g2 = NULL;
    uint8_t *blob;
    size_t n_blob = 0;
    int src;

    (void)state;
    memset(&cpu, 0, sizeof(cpu));
    memset(&grd, 0, sizeof(grd));
    assert_int_equal(ftu_engine_open_on(&cpu, POOL_PAGES, kern_ops_cpu(), 32), 0);
    assert_int_equal(kern_guard_create(GUARD_BYTES, &guard), TDM_OK);
    assert_int_equal(ftu_engine_open_on(&grd, POOL_PAGES, guard, 32), 0);
    assert_int_equal(engine_kv_pool_host_pages(grd.pool), 0);
    assert_ptr_equal(engine_kv_pool_ops(grd.pool), guard);
    assert_int_equal(engine_kv_pool_host_pages(cpu.pool), 1);
    /* the weights were uploaded: the RoPE tables (model-made) are guard memory on that table */
    assert_true(kern_guard_contains(engine_model_rope_freqs(grd.model, 0), sizeof(float)));
    assert_false(kern_guard_contains(engine_model_rope_freqs(cpu.model, 0), sizeof(float)));
    logits = malloc(sizeof(float) * (size_t)cpu.V);
    assert_non_null(logits);

    /* computed on the CPU, imported into guard memory, exported back: the same bytes */
    ftu_prompt(5, cpu.V, prompt, PROMPT);
    a = ftu_new_seq(&cpu);
    assert_int_equal(engine_fwd_prefill(cpu.fwd, a, prompt, PROMPT, 0, logits, NULL), TDM_OK);
    blob = export_pages(a, &n_blob);
    assert_int_equal(engine_seq_import(grd.model, grd.pool, blob, n_blob, &g), TDM_OK);
    assert_same_export(&cpu, a, g, 0);

    /* a shared prefix, then a cut into its shared last page: copy-on-write on both tables */
    b = ftu_new_seq(&cpu);
    h = ftu_new_seq(&grd);
    assert_int_equal(engine_seq_share_prefix(b, a, SHARE_AT), TDM_OK);
    assert_int_equal(engine_seq_share_prefix(h, g, SHARE_AT), TDM_OK);
    assert_int_equal(engine_kv_pool_n_shared(grd.pool), engine_kv_pool_n_shared(cpu.pool));
    assert_true(engine_kv_pool_n_shared(grd.pool) > 0);
    assert_int_equal(engine_seq_truncate(b, CUT_AT), TDM_OK);
    assert_int_equal(engine_seq_truncate(h, CUT_AT), TDM_OK);
    assert_int_equal(engine_kv_pool_n_free(grd.pool), engine_kv_pool_n_free(cpu.pool));
    assert_same_export(&cpu, b, h, 0);
    assert_same_export(&cpu, a, g, 0); /* the originals did not see the cut */
    assert_int_equal(engine_seq_truncate(a, CUT_AT), TDM_OK);
    assert_int_equal(engine_seq_truncate(g, CUT_AT), TDM_OK);
    assert_same_export(&cpu, a, g, 1);

    /* relink compares page bytes through host staging: equal pages share, others do not */
    assert_int_equal(engine_seq_import(grd.model, grd.pool, blob, n_blob, &g2), TDM_OK);
    src = (int)grd.cfg->kv_source_layer_ids[0];
    {
        const engine_kv_table_t *tg = engine_seq_table(g, src);
        const engine_kv_table_t *tg2 = engine_seq_table(g2, src);
        uint32_t refs = engine_kv_pool_page_refs(grd.pool, tg->page_ids[0]);
        assert_non_null(tg);
        assert_non_null(tg2);
        assert_true(tg->n_pages >= 2 && tg2->n_pages >= 2);
        assert_int_equal(engine_seq_relink_page(g2, src, 1, tg->page_ids[0]), TDM_ERR_MISMATCH);
        assert_int_equal(engine_seq_relink_page(g2, src, 0, tg->page_ids[0]), TDM_OK);
        assert_int_equal(engine_kv_pool_page_refs(grd.pool, tg->page_ids[0]), refs + 1);
    }

    engine_seq_destroy(a);
    engine_seq_destroy(b);
    engine_seq_destroy(g);
    engine_seq_destroy(h);
    engine_seq_destroy(g2);
    free(blob);
    free(logits);
    assert_int_equal(ftu_engine_close(&grd), 0);
    assert_int_equal(kern_guard_destroy(), 0); /* every backend allocation was freed */
    assert_int_equal(ftu_engine_close(&cpu), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_guard_state_and_pages_match_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
