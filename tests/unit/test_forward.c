/* test_forward.c - the schedules of MODEL.md section 6 on the tiny preset: CED vs oracle
 * (bit-identical where 6(e) says so, statistics elsewhere), chunked prefill, decode continuing a
 * prefill, batch composition, verify, export/import (and a record plus pages), replay, and the
 * page pool's baseline and error paths. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "common/hash.h"
#include "forward_test_util.h"

#define POOL_PAGES 512

typedef ftu_engine_t fixture_t;

static int setup(void **state)
{
    return ftu_fixture_setup(state, POOL_PAGES);
}

/* Compare every page byte of two sequences' KV sources. */
static void assert_same_pages(fixture_t *fx, engine_seq_t *a, engine_seq_t *b)
{
    size_t pb = engine_kv_pool_page_bytes(fx->pool);
    for (int s = 0; s < fx->cfg->n_kv_source_layer_ids; s++) {
        int layer = (int)fx->cfg->kv_source_layer_ids[s];
        const engine_kv_table_t *ta = engine_seq_table(a, layer);
        const engine_kv_table_t *tb = engine_seq_table(b, layer);
        assert_int_equal(ta->n_rows, tb->n_rows);
        for (uint32_t i = 0; i < ta->n_pages; i++) {
            const uint8_t *pa = engine_kv_pool_page_const(fx->pool, ta->page_ids[i]);
            const uint8_t *pbp = engine_kv_pool_page_const(fx->pool, tb->page_ids[i]);
            /* header bytes 32..40 hold the checksum, sealed or not: compare the body */
            assert_memory_equal(pa + 64, pbp + 64, pb - 64);
        }
    }
}

static void test_ced_equals_oracle_when_prompt_fits_window(void **state)
{
    fixture_t *fx = *state;
    int64_t T = fx->cfg->sliding_window; /* T <= W: CED is exact everywhere */
    int32_t ids[64];
    float *oracle = malloc(sizeof(float) * (size_t)(T * fx->V));
    float *ced = malloc(sizeof(float) * (size_t)fx->V);
    int64_t R = -1;
    ftu_prompt(3, fx->V, ids, T);
    assert_int_equal(engine_fwd_oracle(fx->fwd, ids, T, oracle), TDM_OK);
    engine_seq_t *seq = ftu_new_seq(fx);
    assert_int_equal(engine_fwd_prefill(fx->fwd, seq, ids, T, 0, ced, &R), TDM_OK);
    assert_int_equal(R, 0);
    assert_memory_equal(ced, oracle + (T - 1) * fx->V, sizeof(float) * (size_t)fx->V);
    assert_int_equal(engine_seq_length(seq), T);
    engine_seq_destroy(seq);
    free(oracle);
    free(ced);
}

static void test_ced_with_tail_override_equals_oracle_everywhere(void **state)
{
    fixture_t *fx = *state;
    int64_t T = 150;
    int32_t ids[150];
    float *oracle = malloc(sizeof(float) * (size_t)(T * fx->V));
    float *ced = malloc(sizeof(float) * (size_t)(T * fx->V));
    ftu_prompt(4, fx->V, ids, T);
    assert_int_equal(engine_fwd_oracle(fx->fwd, ids, T, oracle), TDM_OK);
    engine_seq_t *seq = ftu_new_seq(fx);
    assert_int_equal(engine_fwd_prefill(fx->fwd, seq, ids, 100, ENGINE_PREFILL_TAIL_FROM_H |
                                        ENGINE_PREFILL_ALL_LOGITS, ced, NULL), TDM_OK);
    assert_int_equal(engine_fwd_prefill(fx->fwd, seq, ids + 100, 50, ENGINE_PREFILL_TAIL_FROM_H |
                                        ENGINE_PREFILL_ALL_LOGITS, ced + 100 * fx->V, NULL),
                     TDM_OK);
    assert_memory_equal(ced, oracle, sizeof(float) * (size_t)(T * fx->V));
    engine_seq_destroy(seq);
    free(oracle);
    free(ced);
}

/* CED with the tail rule: pages and layers <= c bit-identical to the oracle. */
static void test_ced_pages_and_lower_layers_bit_identical(void **state)
{
    fixture_t *fx = *state;
    int64_t T = 120;
    int c = fx->cfg->ced_cut;
    int32_t ids[120];
    ftu_dump_t d_or, d_ced;
    engine_dump_sink_t sink = {NULL, ftu_dump_cb};
    float *logits = malloc(sizeof(float) * (size_t)(T * fx->V));
    ftu_prompt(5, fx->V, ids, T);
    engine_seq_t *a = ftu_new_seq(fx);
    engine_seq_t *b = ftu_new_seq(fx);
    ftu_dump_init(&d_or, fx->cfg, 0, T);
    ftu_dump_init(&d_ced, fx->cfg, 0, T);
    sink.user = &d_or;
    engine_fwd_set_dump(fx->fwd, &sink);
    assert_int_equal(engine_fwd_prefill(fx->fwd, a, ids, T, ENGINE_PREFILL_TAIL_FROM_H, logits,
                                        NULL), TDM_OK);
    sink.user = &d_ced;
    engine_fwd_set_dump(fx->fwd, &sink);
    assert_int_equal(engine_fwd_prefill(fx->fwd, b, ids, T, 0, logits, NULL), TDM_OK);
    engine_fwd_set_dump(fx->fwd, NULL);
    assert_same_pages(fx, a, b);
    for (int l = 0; l <= c; l++) {
        assert_int_equal(d_ced.rows_seen[l], T);
        assert_memory_equal(d_or.x_out[l], d_ced.x_out[l],
                            sizeof(float) * (size_t)(T * d_or.m * d_or.H));
    }
    for (int l = c + 1; l < fx->cfg->n_layers; l++) {
        assert_int_equal(d_ced.rows_seen[l], fx->cfg->sliding_window); /* tail only */
    }
    ftu_dump_fini(&d_or);
    ftu_dump_fini(&d_ced);
    engine_seq_destroy(a);
    engine_seq_destroy(b);
    free(logits);
}

/* 6(e): CED vs oracle for T > W, first-token logits: mean cosine >= 0.95, top-1 >= 80 %. */
static void test_ced_vs_oracle_statistics_beyond_window(void **state)
{
    fixture_t *fx = *state;
    int n_prompts = 16; /* 6(e) asks 64 seeds of 32-512 tokens; 16 keep ctest under ASan short */
    double cos_sum = 0;
    int top1 = 0;
    int32_t *ids = malloc(sizeof(int32_t) * 512);
    float *oracle = malloc(sizeof(float) * (size_t)(512 * fx->V));
    float *ced = malloc(sizeof(float) * (size_t)fx->V);
    for (int k = 0; k < n_prompts; k++) {
        int64_t T = 32 + (k * 97) % 321;
        ftu_prompt(100 + (uint64_t)k, fx->V, ids, T);
        assert_int_equal(engine_fwd_oracle(fx->fwd, ids, T, oracle), TDM_OK);
        engine_seq_t *seq = ftu_new_seq(fx);
        assert_int_equal(engine_fwd_prefill(fx->fwd, seq, ids, T, 0, ced, NULL), TDM_OK);
        const float *o = oracle + (T - 1) * fx->V;
        cos_sum += ftu_cosine(o, ced, fx->V);
        top1 += ftu_argmax(o, fx->V) == ftu_argmax(ced, fx->V);
        engine_seq_destroy(seq);
    }
    print_message("ced vs oracle: mean cosine %.4f top-1 %.1f %%\n", cos_sum / n_prompts,
                  100.0 * top1 / n_prompts);
    assert_true(cos_sum / n_prompts >= 0.95);
    assert_true(top1 >= (int)(0.8 * n_prompts));
    free(ids);
    free(oracle);
    free(ced);
}

static void test_chunked_prefill_equals_one_shot(void **state)
{
    fixture_t *fx = *state;
    int64_t T = 140;
    int32_t ids[140];
    int64_t chunks[3] = {1, 7, 64};
    float *one = malloc(sizeof(float) * (size_t)fx->V);
    float *got = malloc(sizeof(float) * (size_t)fx->V);
    ftu_prompt(6, fx->V, ids, T);
    engine_seq_t *ref = ftu_new_seq(fx);
    assert_int_equal(engine_fwd_prefill(fx->fwd, ref, ids, T, 0, one, NULL), TDM_OK);
    for (int k = 0; k < 3; k++) {
        engine_fwd_params_t fp;
        engine_fwd_t *fwd = NULL;
        engine_fwd_params_default(fx->model, &fp);
        fp.max_chunk_tokens = chunks[k];
        assert_int_equal(engine_fwd_create(fx->model, fx->pool, &fp, &fwd), TDM_OK);
        engine_seq_t *seq = ftu_new_seq(fx);
        assert_int_equal(engine_fwd_prefill(fwd, seq, ids, T, 0, got, NULL), TDM_OK);
        assert_memory_equal(one, got, sizeof(float) * (size_t)fx->V);
        assert_same_pages(fx, ref, seq);
        engine_seq_destroy(seq);
        engine_fwd_destroy(fwd);
    }
    engine_seq_destroy(ref);
    free(one);
    free(got);
}

/* A prefill split into parts at uneven points, with a decode step of another sequence between
 * the parts, equals one call: same first-token logits, same pages and state (export bytes), and
 * every tail row's logits with ENGINE_PREFILL_ALL_LOGITS. Bad parts change nothing. */
static void test_prefill_parts_equal_one_shot(void **state)
{
    fixture_t *fx = *state;
    enum { H = 40, T = 200 };
    static const int64_t cuts[] = {1, 7, 33, 110, 9}; /* sum T - H; the tail spans the last two */
    int32_t ids[T];
    int32_t other_ids[12];
    int64_t W = fx->cfg->sliding_window;
    int64_t n_tail = T - (T - W > H ? T - W : H);
    float *one = malloc(sizeof(float) * (size_t)(n_tail * fx->V));
    float *got = malloc(sizeof(float) * (size_t)(n_tail * fx->V));
    float *lg = malloc(sizeof(float) * (size_t)fx->V);
    int64_t n_got = 0;

    ftu_prompt(31, fx->V, ids, T);
    ftu_prompt(32, fx->V, other_ids, 12);
    for (int all = 0; all < 2; all++) {
        uint32_t flags = all ? ENGINE_PREFILL_ALL_LOGITS : 0;
        engine_seq_t *ref = ftu_new_seq(fx);
        engine_seq_t *seq = ftu_new_seq(fx);
        engine_seq_t *other = ftu_new_seq(fx);
        int64_t at = H;

        assert_int_equal(engine_fwd_prefill(fx->fwd, ref, ids, H, 0, NULL, NULL), TDM_OK);
        assert_int_equal(engine_fwd_prefill(fx->fwd, ref, ids + H, T - H, flags, one, NULL),
                         TDM_OK);
        assert_int_equal(engine_fwd_prefill(fx->fwd, seq, ids, H, 0, NULL, NULL), TDM_OK);
        assert_int_equal(engine_fwd_prefill(fx->fwd, other, other_ids, 11, 0, NULL, NULL),
                         TDM_OK);
        n_got = 0;
        for (size_t k = 0; k < sizeof(cuts) / sizeof(cuts[0]); k++) {
            engine_prefill_part_t part = {seq, H, T, ids + at, cuts[k], flags,
                                          got + n_got * fx->V, 0};
            engine_prefill_part_t bad = part;

            bad.n_ids = T - at + 1; /* past the prefill's end: refused, nothing changed */
            assert_int_equal(engine_fwd_prefill_parts(fx->fwd, &bad, 1), TDM_ERR_INVALID_ARG);
            assert_int_equal(engine_seq_length(seq), at);
            assert_int_equal(engine_fwd_prefill_parts(fx->fwd, &part, 1), TDM_OK);
            n_got += part.n_logits;
            at += cuts[k];
            if (k == 1) { /* another sequence decodes between two parts */
                assert_int_equal(engine_fwd_decode(fx->fwd, &other, other_ids + 11, 1, lg),
                                 TDM_OK);
            }
        }
        assert_int_equal(at, T);
        assert_int_equal(n_got, all ? n_tail : 1);
        assert_memory_equal(one, got, sizeof(float) * (size_t)(n_got * fx->V));
        assert_same_pages(fx, ref, seq);
        {
            size_t n_a = engine_seq_export_bytes(ref, ENGINE_SEQ_EXPORT_RECORD);
            size_t n_b = engine_seq_export_bytes(seq, ENGINE_SEQ_EXPORT_RECORD);
            uint8_t *a = malloc(n_a), *b = malloc(n_b);
            size_t w_a = 0, w_b = 0;
            assert_int_equal(n_a, n_b);
            assert_int_equal(engine_seq_export(ref, ENGINE_SEQ_EXPORT_RECORD, a, n_a, &w_a), TDM_OK);
            assert_int_equal(engine_seq_export(seq, ENGINE_SEQ_EXPORT_RECORD, b, n_b, &w_b), TDM_OK);
            assert_memory_equal(a, b, w_a); /* rings, pending halves, ids */
            free(a);
            free(b);
        }
        engine_seq_destroy(ref);
        engine_seq_destroy(seq);
        engine_seq_destroy(other);
    }
    free(one);
    free(got);
    free(lg);
}

/* The state record of two sequences is the same bytes (rings, pending halves, ids). */
static void assert_same_record(engine_seq_t *a, engine_seq_t *b)
{
    size_t n_a = engine_seq_export_bytes(a, ENGINE_SEQ_EXPORT_RECORD);
    size_t n_b = engine_seq_export_bytes(b, ENGINE_SEQ_EXPORT_RECORD);
    uint8_t *ra = malloc(n_a), *rb = malloc(n_b);
    size_t w_a = 0, w_b = 0;
    assert_int_equal(n_a, n_b);
    assert_int_equal(engine_seq_export(a, ENGINE_SEQ_EXPORT_RECORD, ra, n_a, &w_a), TDM_OK);
    assert_int_equal(engine_seq_export(b, ENGINE_SEQ_EXPORT_RECORD, rb, n_b, &w_b), TDM_OK);
    assert_int_equal(w_a, w_b);
    assert_memory_equal(ra, rb, w_a);
    free(ra);
    free(rb);
}

/* Several parts in one engine_fwd_prefill_parts call (one batch per pass) equal each prefill
 * alone, bit for bit: first-token logits, every tail row's logits with ENGINE_PREFILL_ALL_LOGITS,
 * pages and the state record. The parts mix a prompt from 0 that fits the window (R = H: every
 * layer on every row), a part that ends before its tail (no row above the cut, no logits), long
 * and short deltas with tails, and a second call that finishes the part left open; with one
 * pass for everything (chunk 256) and passes that cut the parts (chunk 24 and 5). */
static void test_prefill_parts_batched_equal_each_alone(void **state)
{
    fixture_t *fx = *state;
    enum { P = 6, MAXT = 120 };
    /* H, T, and where the first call's part ends (T: the whole prefill in the first call) */
    static const int64_t spec[P][3] = {{0, 10, 10},   {20, 100, 60}, {5, 50, 50},
                                       {30, 45, 45},  {0, 70, 70},   {60, 63, 63}};
    static const uint32_t flags[P] = {0, 0, 0, ENGINE_PREFILL_ALL_LOGITS,
                                      ENGINE_PREFILL_ALL_LOGITS, 0};
    static const int64_t chunk_sizes[] = {256, 24, 5};
    int32_t ids[P][MAXT];
    float *ref_lg[P], *got_lg[P];
    engine_seq_t *ref[P];
    int64_t W = fx->cfg->sliding_window;

    for (int i = 0; i < P; i++) {
        int64_t H = spec[i][0], T = spec[i][1];
        int64_t R = T - W > H ? T - W : H;
        ftu_prompt(500 + (uint64_t)i, fx->V, ids[i], T);
        ref_lg[i] = malloc(sizeof(float) * (size_t)((T - R) * fx->V));
        got_lg[i] = malloc(sizeof(float) * (size_t)((T - R) * fx->V));
        ref[i] = ftu_new_seq(fx);
        if (H > 0) {
            assert_int_equal(engine_fwd_prefill(fx->fwd, ref[i], ids[i], H, 0, NULL, NULL),
                             TDM_OK);
        }
        assert_int_equal(engine_fwd_prefill(fx->fwd, ref[i], ids[i] + H, T - H, flags[i],
                                            ref_lg[i], NULL),
                         TDM_OK);
    }
    for (size_t k = 0; k < sizeof(chunk_sizes) / sizeof(chunk_sizes[0]); k++) {
        engine_fwd_params_t fp;
        engine_fwd_t *fwd = NULL;
        engine_seq_t *seq[P];
        engine_prefill_part_t parts[P];
        int64_t n_logits[P] = {0};
        int n_open = 0;

        engine_fwd_params_default(fx->model, &fp);
        fp.max_chunk_tokens = chunk_sizes[k];
        assert_int_equal(engine_fwd_create(fx->model, fx->pool, &fp, &fwd), TDM_OK);
        for (int i = 0; i < P; i++) {
            int64_t H = spec[i][0];
            seq[i] = ftu_new_seq(fx);
            if (H > 0) {
                assert_int_equal(engine_fwd_prefill(fx->fwd, seq[i], ids[i], H, 0, NULL, NULL),
                                 TDM_OK);
            }
            parts[i] = (engine_prefill_part_t){seq[i], H, spec[i][1], ids[i] + H, spec[i][2] - H,
                                               flags[i], got_lg[i], 0};
        }
        assert_int_equal(engine_fwd_prefill_parts(fwd, parts, P), TDM_OK);
        for (int i = 0; i < P; i++) {
            n_logits[i] = parts[i].n_logits;
            assert_int_equal(engine_seq_length(seq[i]), spec[i][2]);
            if (spec[i][2] < spec[i][1]) { /* still open: finish it beside a fresh short part */
                parts[n_open++] = (engine_prefill_part_t){seq[i], spec[i][0], spec[i][1],
                                                          ids[i] + spec[i][2],
                                                          spec[i][1] - spec[i][2], flags[i],
                                                          got_lg[i] + n_logits[i] * fx->V, 0};
            }
        }
        assert_int_equal(n_open, 1);
        {
            engine_seq_t *extra = ftu_new_seq(fx);
            int32_t extra_ids[40];
            float *lx = malloc(sizeof(float) * (size_t)fx->V);
            ftu_prompt(599, fx->V, extra_ids, 40);
            parts[n_open++] = (engine_prefill_part_t){extra, 0, 40, extra_ids, 40, 0, lx, 0};
            assert_int_equal(engine_fwd_prefill_parts(fwd, parts, n_open), TDM_OK);
            n_logits[1] += parts[0].n_logits;
            assert_int_equal(parts[1].n_logits, 1);
            engine_seq_destroy(extra);
            free(lx);
        }
        for (int i = 0; i < P; i++) {
            int64_t H = spec[i][0], T = spec[i][1];
            int64_t R = T - W > H ? T - W : H;
            int all = (flags[i] & ENGINE_PREFILL_ALL_LOGITS) != 0;
            assert_int_equal(engine_seq_length(seq[i]), T);
            assert_int_equal(n_logits[i], all ? T - R : 1);
            assert_memory_equal(ref_lg[i], got_lg[i], sizeof(float) * (size_t)(n_logits[i] * fx->V));
            assert_same_pages(fx, ref[i], seq[i]);
            assert_same_record(ref[i], seq[i]);
            engine_seq_destroy(seq[i]);
        }
        engine_fwd_destroy(fwd);
    }
    for (int i = 0; i < P; i++) {
        engine_seq_destroy(ref[i]);
        free(ref_lg[i]);
        free(got_lg[i]);
    }
}

/* Canonical replays of several sequences in batches (engine_fwd_replay_batch) equal each
 * sequence's engine_fwd_replay alone: the same state record (rings, pending halves, ids), and a
 * prefill continuing after them the same logits; with batches cut by a small chunk (several
 * replays per pass, and passes of one). A sequence twice changes nothing. */
static void test_replay_batch_equals_each_alone(void **state)
{
    fixture_t *fx = *state;
    enum { S = 5, MAXH = 120 };
    static const int64_t lens[S] = {5, 17, 40, 101, 33};
    static const int64_t chunks[] = {256, 40};
    int32_t ids[S][MAXH + 8];
    float *la = malloc(sizeof(float) * (size_t)fx->V);
    float *lb = malloc(sizeof(float) * (size_t)fx->V);

    for (int i = 0; i < S; i++) {
        ftu_prompt(700 + (uint64_t)i, fx->V, ids[i], lens[i] + 8);
    }
    for (size_t k = 0; k < sizeof(chunks) / sizeof(chunks[0]); k++) {
        engine_fwd_params_t fp;
        engine_fwd_t *fwd = NULL;
        engine_seq_t *alone[S], *batch[S];
        const int32_t *bid[S];
        int64_t n_ids[S];

        engine_fwd_params_default(fx->model, &fp);
        fp.max_chunk_tokens = chunks[k];
        assert_int_equal(engine_fwd_create(fx->model, fx->pool, &fp, &fwd), TDM_OK);
        for (int i = 0; i < S; i++) {
            alone[i] = ftu_new_seq(fx);
            batch[i] = ftu_new_seq(fx);
            assert_int_equal(engine_fwd_prefill(fx->fwd, alone[i], ids[i], lens[i], 0, NULL, NULL),
                             TDM_OK);
            assert_int_equal(engine_fwd_prefill(fx->fwd, batch[i], ids[i], lens[i], 0, NULL, NULL),
                             TDM_OK);
            engine_seq_reset_rings(alone[i]);
            engine_seq_reset_rings(batch[i]);
            assert_int_equal(engine_fwd_replay(fwd, alone[i], ids[i], lens[i],
                                               ENGINE_REPLAY_CANONICAL, NULL),
                             TDM_OK);
            bid[i] = ids[i];
            n_ids[i] = lens[i];
        }
        {
            engine_seq_t *twice[2] = {batch[0], batch[0]};
            assert_int_equal(engine_fwd_replay_batch(fwd, twice, bid, n_ids, 2),
                             TDM_ERR_INVALID_ARG);
        }
        assert_int_equal(engine_fwd_replay_batch(fwd, batch, bid, n_ids, S), TDM_OK);
        for (int i = 0; i < S; i++) {
            assert_same_record(alone[i], batch[i]);
            assert_int_equal(engine_fwd_prefill(fwd, alone[i], ids[i] + lens[i], 8, 0, la, NULL),
                             TDM_OK);
            assert_int_equal(engine_fwd_prefill(fwd, batch[i], ids[i] + lens[i], 8, 0, lb, NULL),
                             TDM_OK);
            assert_memory_equal(la, lb, sizeof(float) * (size_t)fx->V);
            engine_seq_destroy(alone[i]);
            engine_seq_destroy(batch[i]);
        }
        engine_fwd_destroy(fwd);
    }
    free(la);
    free(lb);
}

/* Decode continuing a prefill equals the oracle on the same tokens (exact state). */
static void test_decode_after_prefill_equals_oracle(void **state)
{
    fixture_t *fx = *state;
    int64_t P = 10, n_dec = 20, T = P + n_dec;
    int32_t ids[30];
    float *oracle = malloc(sizeof(float) * (size_t)(T * fx->V));
    float *lg = malloc(sizeof(float) * (size_t)fx->V);
    ftu_prompt(7, fx->V, ids, T);
    assert_int_equal(engine_fwd_oracle(fx->fwd, ids, T, oracle), TDM_OK);
    engine_seq_t *seq = ftu_new_seq(fx);
    assert_int_equal(engine_fwd_prefill(fx->fwd, seq, ids, P, 0, lg, NULL), TDM_OK);
    assert_memory_equal(lg, oracle + (P - 1) * fx->V, sizeof(float) * (size_t)fx->V);
    for (int64_t t = P; t < T; t++) {
        assert_int_equal(engine_fwd_decode(fx->fwd, &seq, ids + t, 1, lg), TDM_OK);
        assert_memory_equal(lg, oracle + t * fx->V, sizeof(float) * (size_t)fx->V);
    }
    engine_seq_destroy(seq);
    free(oracle);
    free(lg);
}

/* A batch of 8 sequences of different lengths equals each alone, bit for bit. */
static void test_batch_of_8_equals_each_alone(void **state)
{
    fixture_t *fx = *state;
    enum { B = 8, STEPS = 3 };
    engine_seq_t *batch[B], *alone[B];
    int32_t prompt[200];
    float *lb = malloc(sizeof(float) * (size_t)(B * fx->V));
    float *la = malloc(sizeof(float) * (size_t)fx->V);
    for (int i = 0; i < B; i++) {
        int64_t n = 5 + 23 * i;
        ftu_prompt(200 + (uint64_t)i, fx->V, prompt, n);
        batch[i] = ftu_new_seq(fx);
        alone[i] = ftu_new_seq(fx);
        assert_int_equal(engine_fwd_prefill(fx->fwd, batch[i], prompt, n, 0, NULL, NULL), TDM_OK);
        assert_int_equal(engine_fwd_prefill(fx->fwd, alone[i], prompt, n, 0, NULL, NULL), TDM_OK);
    }
    for (int step = 0; step < STEPS; step++) {
        int32_t toks[B];
        for (int i = 0; i < B; i++) {
            toks[i] = (int32_t)(10 + 31 * i + step);
        }
        assert_int_equal(engine_fwd_decode(fx->fwd, batch, toks, B, lb), TDM_OK);
        for (int i = 0; i < B; i++) {
            assert_int_equal(engine_fwd_decode(fx->fwd, &alone[i], toks + i, 1, la), TDM_OK);
            assert_memory_equal(la, lb + i * fx->V, sizeof(float) * (size_t)fx->V);
        }
    }
    for (int i = 0; i < B; i++) {
        engine_seq_destroy(batch[i]);
        engine_seq_destroy(alone[i]);
    }
    free(lb);
    free(la);
}

static void test_verify_equals_successive_decodes(void **state)
{
    fixture_t *fx = *state;
    int32_t ids[40];
    float *lv = malloc(sizeof(float) * (size_t)(4 * fx->V));
    float *ld = malloc(sizeof(float) * (size_t)fx->V);
    ftu_prompt(9, fx->V, ids, 40);
    engine_seq_t *a = ftu_new_seq(fx);
    engine_seq_t *b = ftu_new_seq(fx);
    assert_int_equal(engine_fwd_prefill(fx->fwd, a, ids, 35, 0, NULL, NULL), TDM_OK);
    assert_int_equal(engine_fwd_prefill(fx->fwd, b, ids, 35, 0, NULL, NULL), TDM_OK);
    assert_int_equal(engine_fwd_verify(fx->fwd, a, ids + 35, 4, lv), TDM_OK);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(engine_fwd_decode(fx->fwd, &b, ids + 35 + i, 1, ld), TDM_OK);
        assert_memory_equal(ld, lv + i * fx->V, sizeof(float) * (size_t)fx->V);
    }
    engine_seq_destroy(a);
    engine_seq_destroy(b);
    free(lv);
    free(ld);
}

/* Export the state (with pages), import into a fresh sequence, continue: identical logits. */
static void test_export_import_then_continue_is_uninterrupted(void **state)
{
    fixture_t *fx = *state;
    int32_t ids[80];
    float *la = malloc(sizeof(float) * (size_t)fx->V);
    float *lb = malloc(sizeof(float) * (size_t)fx->V);
    ftu_prompt(11, fx->V, ids, 80);
    for (int odd = 0; odd < 2; odd++) {
        int64_t P = 67 + odd; /* odd and even lengths: with and without pending halves */
        engine_seq_t *a = ftu_new_seq(fx);
        engine_seq_t *b = NULL;
        assert_int_equal(engine_fwd_prefill(fx->fwd, a, ids, P, 0, NULL, NULL), TDM_OK);
        size_t n = engine_seq_export_bytes(a, ENGINE_SEQ_EXPORT_PAGES);
        uint8_t *blob = malloc(n);
        size_t written = 0;
        assert_int_equal(engine_seq_export(a, ENGINE_SEQ_EXPORT_PAGES, blob, n, &written),
                         TDM_OK);
        assert_int_equal(written, n);
        assert_int_equal(engine_seq_import(fx->model, fx->pool, blob, n, &b), TDM_OK);
        assert_int_equal(engine_seq_length(b), P);
        for (int64_t t = P; t < 80; t++) {
            assert_int_equal(engine_fwd_decode(fx->fwd, &a, ids + t, 1, la), TDM_OK);
            assert_int_equal(engine_fwd_decode(fx->fwd, &b, ids + t, 1, lb), TDM_OK);
            assert_memory_equal(la, lb, sizeof(float) * (size_t)fx->V);
        }
        /* a corrupted blob is refused and takes no page */
        uint32_t free_before = engine_kv_pool_n_free(fx->pool);
        engine_seq_t *c = NULL;
        blob[100] ^= 1;
        assert_int_equal(engine_seq_import(fx->model, fx->pool, blob, n, &c), TDM_ERR_FORMAT);
        assert_null(c);
        assert_int_equal(engine_kv_pool_n_free(fx->pool), free_before);
        free(blob);
        engine_seq_destroy(a);
        engine_seq_destroy(b);
    }
    free(la);
    free(lb);
}

/* Little-endian integer of `n_bytes` at p (the blob format's byte order). */
static uint64_t le_at(const uint8_t *p, int n_bytes)
{
    uint64_t v = 0;
    for (int b = n_bytes - 1; b >= 0; b--) {
        v = (v << 8) | p[b];
    }
    return v;
}

/* A record blob plus the pages, put together without the sequence (a handoff), is byte for byte
 * the sequence's own export with pages; a short or foreign record is refused. */
static void test_record_plus_pages_equals_export_with_pages(void **state)
{
    fixture_t *fx = *state;
    int32_t ids[70];
    engine_seq_t *a = ftu_new_seq(fx);
    uint8_t *want, *record, *got = NULL;
    size_t n_want, n_record, n_got = 0, written = 0;
    ftu_prompt(13, fx->V, ids, 70);
    assert_int_equal(engine_fwd_prefill(fx->fwd, a, ids, 69, 0, NULL, NULL), TDM_OK);
    n_want = engine_seq_export_bytes(a, ENGINE_SEQ_EXPORT_PAGES);
    n_record = engine_seq_export_bytes(a, ENGINE_SEQ_EXPORT_RECORD);
    want = malloc(n_want);
    record = malloc(n_record);
    assert_int_equal(engine_seq_export(a, ENGINE_SEQ_EXPORT_PAGES, want, n_want, &written),
                     TDM_OK);
    assert_int_equal(engine_seq_export(a, ENGINE_SEQ_EXPORT_RECORD, record, n_record, &written),
                     TDM_OK);

    /* Take each source's rows, page count and page pointers out of the pages section. */
    uint32_t n_sources = (uint32_t)le_at(want + 48, 4); /* header: u32 n_kv_sources */
    size_t page_bytes = (size_t)le_at(want + 56, 8);    /* header: u64 page bytes */
    int64_t *n_rows = calloc(n_sources, sizeof(*n_rows));
    uint32_t *n_pages = calloc(n_sources, sizeof(*n_pages));
    const void **pages = calloc(n_want / page_bytes + 1, sizeof(*pages));
    size_t at = n_record - 8, k = 0;
    assert_true(n_sources > 0);
    for (uint32_t s = 0; s < n_sources; s++) {
        n_rows[s] = (int64_t)le_at(want + at, 8);
        n_pages[s] = (uint32_t)le_at(want + at + 8, 4);
        at += 12;
        for (uint32_t i = 0; i < n_pages[s]; i++, at += page_bytes) {
            pages[k++] = want + at;
        }
    }
    assert_int_equal(at + 8, n_want);
    assert_true(k > 0);

    assert_int_equal(engine_seq_blob_add_pages(record, n_record, n_sources, n_rows, n_pages,
                                               pages, page_bytes, &got, &n_got),
                     TDM_OK);
    assert_int_equal(n_got, n_want);
    assert_memory_equal(got, want, n_want);
    free(got);

    got = NULL;
    n_got = 0;
    assert_int_equal(engine_seq_blob_add_pages(record, ENGINE_SEQ_BLOB_HEADER_BYTES, n_sources,
                                               n_rows, n_pages, pages, page_bytes, &got, &n_got),
                     TDM_ERR_FORMAT);
    record[0] ^= 1; /* not "TDSQ" */
    assert_int_equal(engine_seq_blob_add_pages(record, n_record, n_sources, n_rows, n_pages,
                                               pages, page_bytes, &got, &n_got),
                     TDM_ERR_FORMAT);
    record[0] ^= 1;
    record[4] ^= 1; /* another version */
    assert_int_equal(engine_seq_blob_add_pages(record, n_record, n_sources, n_rows, n_pages,
                                               pages, page_bytes, &got, &n_got),
                     TDM_ERR_FORMAT);
    assert_null(got);
    assert_int_equal(n_got, 0);
    free(pages);
    free(n_pages);
    free(n_rows);
    free(record);
    free(want);
    engine_seq_destroy(a);
}

/* Replay (recovery) of a short sequence (H <= W) rebuilds exactly the lost rings. */
static void test_replay_recovery_rebuilds_rings(void **state)
{
    fixture_t *fx = *state;
    int64_t H = 13, T = 20;
    int32_t ids[20];
    float *la = malloc(sizeof(float) * (size_t)fx->V);
    float *lb = malloc(sizeof(float) * (size_t)fx->V);
    float *lr = malloc(sizeof(float) * (size_t)fx->V);
    ftu_prompt(12, fx->V, ids, T);
    engine_seq_t *a = ftu_new_seq(fx);
    engine_seq_t *b = ftu_new_seq(fx);
    assert_int_equal(engine_fwd_prefill(fx->fwd, a, ids, H, 0, la, NULL), TDM_OK);
    assert_int_equal(engine_fwd_prefill(fx->fwd, b, ids, H, 0, NULL, NULL), TDM_OK);
    engine_seq_reset_rings(b);
    assert_int_equal(engine_fwd_replay(fx->fwd, b, ids, H, ENGINE_REPLAY_RECOVERY, lr), TDM_OK);
    assert_memory_equal(la, lr, sizeof(float) * (size_t)fx->V); /* H <= W: exact */
    for (int64_t t = H; t < T; t++) {
        assert_int_equal(engine_fwd_decode(fx->fwd, &a, ids + t, 1, la), TDM_OK);
        assert_int_equal(engine_fwd_decode(fx->fwd, &b, ids + t, 1, lb), TDM_OK);
        assert_memory_equal(la, lb, sizeof(float) * (size_t)fx->V);
    }
    engine_seq_destroy(a);
    engine_seq_destroy(b);
    free(la);
    free(lb);
    free(lr);
}

/* Replay vs loss-free continuation beyond the window: 6(e) statistics. */
static void test_replay_vs_continuation_statistics(void **state)
{
    fixture_t *fx = *state;
    int n_prompts = 12, top1 = 0;
    double cos_sum = 0;
    int32_t ids[400];
    float *la = malloc(sizeof(float) * (size_t)fx->V);
    float *lb = malloc(sizeof(float) * (size_t)fx->V);
    for (int k = 0; k < n_prompts; k++) {
        int64_t H = 40 + 29 * k;
        ftu_prompt(300 + (uint64_t)k, fx->V, ids, H + 1);
        engine_seq_t *a = ftu_new_seq(fx);
        engine_seq_t *b = ftu_new_seq(fx);
        assert_int_equal(engine_fwd_prefill(fx->fwd, a, ids, H, 0, NULL, NULL), TDM_OK);
        assert_int_equal(engine_fwd_prefill(fx->fwd, b, ids, H, 0, NULL, NULL), TDM_OK);
        engine_seq_reset_rings(b);
        assert_int_equal(engine_fwd_replay(fx->fwd, b, ids, H, ENGINE_REPLAY_RECOVERY, NULL),
                         TDM_OK);
        assert_int_equal(engine_fwd_decode(fx->fwd, &a, ids + H, 1, la), TDM_OK);
        assert_int_equal(engine_fwd_decode(fx->fwd, &b, ids + H, 1, lb), TDM_OK);
        cos_sum += ftu_cosine(la, lb, fx->V);
        top1 += ftu_argmax(la, fx->V) == ftu_argmax(lb, fx->V);
        engine_seq_destroy(a);
        engine_seq_destroy(b);
    }
    print_message("replay vs continuation: mean cosine %.4f top-1 %.1f %%\n",
                  cos_sum / n_prompts, 100.0 * top1 / n_prompts);
    assert_true(cos_sum / n_prompts >= 0.95);
    assert_true(top1 >= (int)(0.8 * n_prompts));
    free(la);
    free(lb);
}

/* Set the little-endian u32 at p and rewrite the blob's XXH3-64 trailer (n bytes in all). */
static void set_u32_and_trailer(uint8_t *blob, size_t n, size_t at, uint32_t v)
{
    uint64_t sum;
    for (int b = 0; b < 4; b++) {
        blob[at + (size_t)b] = (uint8_t)(v >> (8 * b));
    }
    sum = tdm_hash_xxh3_64(blob, n - 8);
    for (int b = 0; b < 8; b++) {
        blob[n - 8 + (size_t)b] = (uint8_t)(sum >> (8 * b));
    }
}

/* Found by fuzz/fuzz_state.c: a blob of T = 1 whose header said n_ids = 2 (checksum valid) made
 * the import write an id before position 0, outside the id ring (heap overflow). n_ids is exactly
 * min(N - 1, T): any other count is refused and takes no page. */
static void test_import_refuses_an_id_count_other_than_min_n_minus_1_t(void **state)
{
    fixture_t *fx = *state;
    int32_t ids[1];
    engine_seq_t *a = ftu_new_seq(fx), *b = NULL;
    size_t n, written = 0;
    uint8_t *blob;
    uint32_t free_before;
    ftu_prompt(17, fx->V, ids, 1);
    assert_int_equal(engine_fwd_prefill(fx->fwd, a, ids, 1, 0, NULL, NULL), TDM_OK);
    n = engine_seq_export_bytes(a, ENGINE_SEQ_EXPORT_PAGES);
    blob = malloc(n);
    assert_int_equal(engine_seq_export(a, ENGINE_SEQ_EXPORT_PAGES, blob, n, &written), TDM_OK);
    engine_seq_destroy(a);
    free_before = engine_kv_pool_n_free(fx->pool);
    for (uint32_t n_ids = 0; n_ids <= 4; n_ids++) { /* header: u32 n_ids at byte 44; 1 is right */
        if (n_ids == 1) {
            continue;
        }
        set_u32_and_trailer(blob, n, 44, n_ids);
        assert_int_equal(engine_seq_import(fx->model, fx->pool, blob, n, &b), TDM_ERR_FORMAT);
        assert_null(b);
        assert_int_equal(engine_kv_pool_n_free(fx->pool), free_before);
    }
    set_u32_and_trailer(blob, n, 44, 1);
    assert_int_equal(engine_seq_import(fx->model, fx->pool, blob, n, &b), TDM_OK);
    assert_int_equal(engine_seq_length(b), 1);
    engine_seq_destroy(b);
    free(blob);
}

static void test_pool_exhaustion_fails_and_changes_nothing(void **state)
{
    fixture_t *fx = *state;
    engine_kv_pool_t *small = NULL;
    engine_fwd_t *fwd = NULL;
    engine_fwd_params_t fp;
    int32_t ids[300];
    float *lg = malloc(sizeof(float) * (size_t)fx->V);
    ftu_prompt(13, fx->V, ids, 300);
    assert_int_equal(engine_kv_pool_create(fx->cfg, engine_model_fingerprint(fx->model), 4,
                                           &small), TDM_OK);
    engine_fwd_params_default(fx->model, &fp);
    assert_int_equal(engine_fwd_create(fx->model, small, &fp, &fwd), TDM_OK);
    engine_seq_t *seq = NULL;
    assert_int_equal(engine_seq_create(fx->model, small, &seq), TDM_OK);
    assert_int_equal(engine_fwd_prefill(fwd, seq, ids, 60, 0, lg, NULL), TDM_OK);
    uint32_t free_before = engine_kv_pool_n_free(small);
    /* tiny: sources 2 (ratio 2) and 4 (ratio 1): 300 tokens need 3 + 5 pages > 4 */
    assert_int_equal(engine_fwd_prefill(fwd, seq, ids + 60, 240, 0, lg, NULL), TDM_ERR_NO_PAGES);
    assert_int_equal(engine_kv_pool_n_free(small), free_before);
    assert_int_equal(engine_seq_length(seq), 60);
    /* bad ids change nothing either */
    int32_t bad = (int32_t)fx->V;
    assert_int_equal(engine_fwd_decode(fwd, &seq, &bad, 1, lg), TDM_ERR_INVALID_ARG);
    assert_int_equal(engine_seq_length(seq), 60);
    engine_seq_t *twice[2] = {seq, seq};
    int32_t two[2] = {5, 6};
    assert_int_equal(engine_fwd_decode(fwd, twice, two, 2, lg), TDM_ERR_INVALID_ARG);
    engine_seq_destroy(seq);
    assert_int_equal(engine_kv_pool_n_free(small), 4);
    engine_fwd_destroy(fwd);
    engine_kv_pool_destroy(small);
    free(lg);
}

static void test_fingerprint_is_stamped_and_checked(void **state)
{
    fixture_t *fx = *state;
    engine_kv_pool_t *other = NULL;
    engine_seq_t *seq = NULL;
    /* test_fingerprint.c: the value is tdm_model_fingerprint of the directory, the router's */
    assert_true(engine_model_fingerprint(fx->model) != 0);
    assert_int_equal(engine_kv_pool_create(fx->cfg, engine_model_fingerprint(fx->model) ^ 1, 4,
                                           &other), TDM_OK);
    assert_int_equal(engine_seq_create(fx->model, other, &seq), TDM_ERR_MISMATCH);
    assert_null(seq);
    engine_kv_pool_destroy(other);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ced_equals_oracle_when_prompt_fits_window),
        cmocka_unit_test(test_ced_with_tail_override_equals_oracle_everywhere),
        cmocka_unit_test(test_ced_pages_and_lower_layers_bit_identical),
        cmocka_unit_test(test_ced_vs_oracle_statistics_beyond_window),
        cmocka_unit_test(test_chunked_prefill_equals_one_shot),
        cmocka_unit_test(test_prefill_parts_equal_one_shot),
        cmocka_unit_test(test_prefill_parts_batched_equal_each_alone),
        cmocka_unit_test(test_replay_batch_equals_each_alone),
        cmocka_unit_test(test_decode_after_prefill_equals_oracle),
        cmocka_unit_test(test_batch_of_8_equals_each_alone),
        cmocka_unit_test(test_verify_equals_successive_decodes),
        cmocka_unit_test(test_export_import_then_continue_is_uninterrupted),
        cmocka_unit_test(test_record_plus_pages_equals_export_with_pages),
        cmocka_unit_test(test_import_refuses_an_id_count_other_than_min_n_minus_1_t),
        cmocka_unit_test(test_replay_recovery_rebuilds_rings),
        cmocka_unit_test(test_replay_vs_continuation_statistics),
        cmocka_unit_test(test_pool_exhaustion_fails_and_changes_nothing),
        cmocka_unit_test(test_fingerprint_is_stamped_and_checked),
    };
    return cmocka_run_group_tests(tests, setup, ftu_fixture_teardown);
}
