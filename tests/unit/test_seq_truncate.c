/* test_seq_truncate.c - engine_seq_truncate (MODEL.md 6(d)(2)) on the tiny preset: a sequence
 * cut back to a prefix of its history and replayed equals one that held only the prefix's pages
 * and was replayed the same way (bit-identical export, pages and logits); against a plain
 * prefill of the prefix it is bit-identical when p <= W (the replay runs from 0) and within the
 * 6(e) statistics beyond W; bad arguments change nothing; pages come back. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "forward_test_util.h"

#define POOL_PAGES 512
#define MAX_T      600

typedef ftu_engine_t fixture_t;

static int setup(void **state)
{
    return ftu_fixture_setup(state, POOL_PAGES);
}

/* The export of seq with its pages (malloc'ed; *n_out bytes). */
static uint8_t *export_all(engine_seq_t *seq, size_t *n_out)
{
    size_t n = engine_seq_export_bytes(seq, ENGINE_SEQ_EXPORT_PAGES);
    uint8_t *blob = malloc(n);
    assert_non_null(blob);
    assert_int_equal(engine_seq_export(seq, ENGINE_SEQ_EXPORT_PAGES, blob, n, n_out), TDM_OK);
    return blob;
}

/* Asserts that a and b export (with pages) the same bytes. */
static void expect_same_export(engine_seq_t *a, engine_seq_t *b)
{
    size_t na = 0, nb = 0;
    uint8_t *ea = export_all(a, &na);
    uint8_t *eb = export_all(b, &nb);

    assert_int_equal(na, nb);
    assert_memory_equal(ea, eb, na);
    free(ea);
    free(eb);
}

/* Prefill ids[0..T) on seq, truncate it to p tokens and replay the rewind (recovery, no
 * logits). */
static void prefill_truncate_replay(fixture_t *fx, engine_seq_t *seq, const int32_t *ids, int64_t T,
                                    int64_t p)
{
    assert_int_equal(engine_fwd_prefill(fx->fwd, seq, ids, T, 0, NULL, NULL), TDM_OK);
    assert_int_equal(engine_seq_truncate(seq, p), TDM_OK);
    assert_int_equal(engine_fwd_replay(fx->fwd, seq, ids, p, ENGINE_REPLAY_RECOVERY, NULL), TDM_OK);
}

/* Decode ids[0..n) on a and b, logits of each step into la/lb; returns 1 when every step's
 * logits are bit-identical, and adds each step's cosine and top-1 agreement to *cos, *top1. */
static int decode_both(fixture_t *fx, engine_seq_t *a, engine_seq_t *b, const int32_t *ids,
                       int64_t n, double *cos, int *top1)
{
    float *la = malloc(sizeof(float) * (size_t)fx->V);
    float *lb = malloc(sizeof(float) * (size_t)fx->V);
    int same = 1;
    assert_non_null(la);
    assert_non_null(lb);
    for (int64_t t = 0; t < n; t++) {
        assert_int_equal(engine_fwd_decode(fx->fwd, &a, ids + t, 1, la), TDM_OK);
        assert_int_equal(engine_fwd_decode(fx->fwd, &b, ids + t, 1, lb), TDM_OK);
        same &= memcmp(la, lb, sizeof(float) * (size_t)fx->V) == 0;
        if (cos != NULL) {
            *cos += ftu_cosine(la, lb, fx->V);
            *top1 += ftu_argmax(la, fx->V) == ftu_argmax(lb, fx->V);
        }
    }
    free(la);
    free(lb);
    return same;
}

/* Prefill A + B, truncate to |A|, replay; vs prefill A, truncate at |A| (pages only), replay:
 * then decode C on both. Everything bit-identical, for p below, at and beyond W, odd and even. */
static void test_truncate_equals_pages_only_recovery(void **state)
{
    fixture_t *fx = *state;
    static const int64_t cases[][2] = {{13, 40}, {16, 7}, {37, 90}, {128, 200}, {257, 64}};
    int32_t ids[MAX_T];
    int32_t c_ids[8];
    const int64_t n_c = 8;

    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        int64_t p = cases[k][0], T = p + cases[k][1];
        uint32_t free0 = engine_kv_pool_n_free(fx->pool);
        float *lr_a = malloc(sizeof(float) * (size_t)fx->V);
        float *lr_b = malloc(sizeof(float) * (size_t)fx->V);

        ftu_prompt(40 + k, fx->V, ids, T);
        ftu_prompt(90 + k, fx->V, c_ids, n_c);
        engine_seq_t *a = ftu_new_seq(fx);
        engine_seq_t *b = ftu_new_seq(fx);
        assert_int_equal(engine_fwd_prefill(fx->fwd, a, ids, T, 0, NULL, NULL), TDM_OK);
        assert_int_equal(engine_fwd_prefill(fx->fwd, b, ids, p, 0, NULL, NULL), TDM_OK);
        assert_true(engine_seq_n_pages(a) >= engine_seq_n_pages(b));
        assert_int_equal(engine_seq_truncate(a, p), TDM_OK);
        assert_int_equal(engine_seq_truncate(b, p), TDM_OK);
        assert_int_equal(engine_seq_length(a), p);
        /* pages past the kept rows went back: a holds exactly what b holds */
        assert_int_equal(engine_seq_n_pages(a), engine_seq_n_pages(b));
        for (int s = 0; s < fx->cfg->n_kv_source_layer_ids; s++) {
            int layer = (int)fx->cfg->kv_source_layer_ids[s];
            assert_int_equal(engine_seq_n_rows(a, layer), engine_seq_n_rows(b, layer));
            assert_int_equal(engine_seq_n_rows(a, layer), p / engine_seq_table(a, layer)->ratio);
        }
        assert_int_equal(engine_fwd_replay(fx->fwd, a, ids, p, ENGINE_REPLAY_RECOVERY, lr_a),
                         TDM_OK);
        assert_int_equal(engine_fwd_replay(fx->fwd, b, ids, p, ENGINE_REPLAY_RECOVERY, lr_b),
                         TDM_OK);
        assert_memory_equal(lr_a, lr_b, sizeof(float) * (size_t)fx->V);
        expect_same_export(a, b);
        assert_true(decode_both(fx, a, b, c_ids, n_c, NULL, NULL));
        expect_same_export(a, b);
        engine_seq_destroy(a);
        engine_seq_destroy(b);
        assert_int_equal(engine_kv_pool_n_free(fx->pool), free0);
        free(lr_a);
        free(lr_b);
    }
}

/* p <= W: the replay runs every token from 0 with exact windows, so truncate + replay + decode
 * equals a plain prefill of the prefix then decode, bit for bit (logits and export). */
static void test_truncate_within_window_equals_plain_prefix(void **state)
{
    fixture_t *fx = *state;
    int64_t W = fx->cfg->sliding_window;
    int32_t ids[MAX_T];
    int32_t c_ids[6];

    for (int64_t p = 1; p <= W; p += 5) {
        int64_t T = p + 30;
        ftu_prompt(500 + (uint64_t)p, fx->V, ids, T);
        ftu_prompt(600 + (uint64_t)p, fx->V, c_ids, 6);
        engine_seq_t *a = ftu_new_seq(fx);
        engine_seq_t *b = ftu_new_seq(fx);
        prefill_truncate_replay(fx, a, ids, T, p);
        assert_int_equal(engine_fwd_prefill(fx->fwd, b, ids, p, 0, NULL, NULL), TDM_OK);
        expect_same_export(a, b);
        assert_true(decode_both(fx, a, b, c_ids, 6, NULL, NULL));
        engine_seq_destroy(a);
        engine_seq_destroy(b);
    }
}

/* p > W: truncate + replay vs a loss-free continuation of the prefix (plain prefill) is the
 * 6(e) "replay vs loss-free continuation" comparison: mean cosine >= 0.95, top-1 >= 80 %. */
static void test_truncate_beyond_window_statistics(void **state)
{
    fixture_t *fx = *state;
    int n_prompts = 12, top1 = 0, n = 0;
    double cos_sum = 0;
    int32_t ids[MAX_T];

    for (int k = 0; k < n_prompts; k++) {
        int64_t p = 40 + 29 * k, T = p + 50;
        ftu_prompt(700 + (uint64_t)k, fx->V, ids, T);
        engine_seq_t *a = ftu_new_seq(fx);
        engine_seq_t *b = ftu_new_seq(fx);
        prefill_truncate_replay(fx, a, ids, T, p);
        /* a loss-free continuation of [0, p): the oracle-exact R = H prefill */
        assert_int_equal(
            engine_fwd_prefill(fx->fwd, b, ids, p, ENGINE_PREFILL_TAIL_FROM_H, NULL, NULL), TDM_OK);
        /* the first decode after the rewind: token p of a different continuation */
        int32_t next = (int32_t)(3 + (ids[p] + 7) % (int32_t)(fx->V - 6));
        decode_both(fx, a, b, &next, 1, &cos_sum, &top1);
        n++;
        engine_seq_destroy(a);
        engine_seq_destroy(b);
    }
    print_message("truncate+replay vs continuation: mean cosine %.4f top-1 %.1f %%\n", cos_sum / n,
                  100.0 * top1 / n);
    assert_true(cos_sum / n >= 0.95);
    assert_true(top1 >= (int)(0.8 * n));
}

static void test_truncate_bad_args_change_nothing(void **state)
{
    fixture_t *fx = *state;
    int32_t ids[40];
    uint32_t free0 = engine_kv_pool_n_free(fx->pool);
    ftu_prompt(3, fx->V, ids, 40);
    engine_seq_t *a = ftu_new_seq(fx);
    assert_int_equal(engine_seq_truncate(NULL, 0), TDM_ERR_INVALID_ARG);
    assert_int_equal(engine_fwd_prefill(fx->fwd, a, ids, 40, 0, NULL, NULL), TDM_OK);
    uint32_t pages = engine_seq_n_pages(a);
    assert_int_equal(engine_seq_truncate(a, 41), TDM_ERR_INVALID_ARG);
    assert_int_equal(engine_seq_truncate(a, -1), TDM_ERR_INVALID_ARG);
    assert_int_equal(engine_seq_length(a), 40);
    assert_int_equal(engine_seq_n_pages(a), pages);
    /* p = 0: an empty sequence, every page back */
    assert_int_equal(engine_seq_truncate(a, 0), TDM_OK);
    assert_int_equal(engine_seq_length(a), 0);
    assert_int_equal(engine_seq_n_pages(a), 0);
    assert_int_equal(engine_kv_pool_n_free(fx->pool), free0);
    /* and it prefills again from 0 like a new sequence */
    assert_int_equal(engine_fwd_prefill(fx->fwd, a, ids, 40, 0, NULL, NULL), TDM_OK);
    engine_seq_destroy(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_truncate_equals_pages_only_recovery),
        cmocka_unit_test(test_truncate_within_window_equals_plain_prefix),
        cmocka_unit_test(test_truncate_beyond_window_statistics),
        cmocka_unit_test(test_truncate_bad_args_change_nothing),
    };
    return cmocka_run_group_tests(tests, setup, ftu_fixture_teardown);
}
