/* test_forward_ops.c - the forward pass drives its data work through the model's kern_ops_t
 * (issue 14 item 2): the tiny preset loaded once with kern_ops_cpu() and once with a table whose
 * memory and glue members count their calls before calling the CPU versions. Prefill (CED,
 * chunked), batched decode, verify, replay and the DSpark draft give bit-identical logits on both
 * tables, every counted member is called, and the engine copies in all three directions (backend
 * to backend, and through host staging both ways: positions, selections, row pointers, page
 * headers) and in no other (which side each pointer is on is the guard backend's test).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "forward_test_util.h"
#include "kernels/attention.h"
#include "kernels/kv_page.h"
#include "kernels/mhc.h"
#include "kernels/ops.h"
#include "kernels/sample.h"
#include "kernels/topk.h"

#define POOL_PAGES 256
#define PROMPT     90 /* > window 16, > index_topk 8 compressed rows: ring wrap, indexer, pool */
#define N_DECODE   3

/* Calls per counted member (test-only state: the op signatures carry no user pointer). */
enum {
    C_MEM_COPY,
    C_MEM_SET,
    C_EMBED,
    C_STREAM_MEAN,
    C_BF16_ROUND,
    C_ADD_BF16,
    C_ADD,
    C_SCALE2,
    C_MOE_FFN,
    C_CAND_BLOCKS,
    C_CAND_MASK,
    C_EXPERT_ROWS,
    C_DEQUANT_ROWS,
    C_PAGE_MARK,
    C_ROWS_AHEAD,
    C_AHEAD_WAIT,
    C_COUNT
};
static const char *const counter_names[C_COUNT] = {
    "mem_copy",     "mem_set",   "embed",      "stream_mean", "bf16_round", "add_bf16",
    "add",          "scale2",    "moe_ffn",    "cand_blocks", "cand_mask",  "expert_rows",
    "dequant_rows", "page_mark", "rows_ahead", "ahead_wait",
};
static int64_t counters[C_COUNT];
static int64_t copies_of_kind[3]; /* H2D, D2H, D2D */
static size_t watched_d2h_bytes;  /* D2H copies of exactly this size are counted apart */
static int64_t watched_d2h;
static const uint8_t *pool_lo, *pool_hi; /* D2H copies out of this range (the page pool) too */
static int64_t pool_d2h;
static int64_t bad_kind_copies;

static tdm_status_t count_mem_copy(kern_ctx_t *ctx, void *dst, const void *src, size_t n_bytes,
                                   kern_copy_kind_t kind)
{
    counters[C_MEM_COPY]++;
    if (kind == KERN_COPY_H2D || kind == KERN_COPY_D2H || kind == KERN_COPY_D2D) {
        copies_of_kind[kind]++;
        watched_d2h += kind == KERN_COPY_D2H && n_bytes == watched_d2h_bytes;
        pool_d2h += kind == KERN_COPY_D2H && (const uint8_t *)src >= pool_lo &&
                    (const uint8_t *)src < pool_hi;
    } else {
        bad_kind_copies++;
    }
    return kern_ops_cpu()->mem_copy(ctx, dst, src, n_bytes, kind);
}

static tdm_status_t count_mem_set(kern_ctx_t *ctx, void *dst, int byte, size_t n_bytes)
{
    counters[C_MEM_SET]++;
    return kern_ops_cpu()->mem_set(ctx, dst, byte, n_bytes);
}

static tdm_status_t count_embed(kern_ctx_t *ctx, const uint16_t *table, int64_t n_vocab,
                                const int32_t *ids, int64_t n, int64_t H, int m, float *x_out,
                                float *pre_out)
{
    counters[C_EMBED]++;
    return kern_ops_cpu()->embed(ctx, table, n_vocab, ids, n, H, m, x_out, pre_out);
}

static tdm_status_t count_stream_mean(kern_ctx_t *ctx, const float *x, int64_t n_rows, int m,
                                      int64_t H, float *y_out, int64_t ldy)
{
    counters[C_STREAM_MEAN]++;
    return kern_ops_cpu()->stream_mean(ctx, x, n_rows, m, H, y_out, ldy);
}

static tdm_status_t count_bf16_round(kern_ctx_t *ctx, const float *x, int64_t n, float *y_out)
{
    counters[C_BF16_ROUND]++;
    return kern_ops_cpu()->bf16_round(ctx, x, n, y_out);
}

static tdm_status_t count_add_bf16(kern_ctx_t *ctx, const float *a, const float *b, int64_t n,
                                   float *y_out)
{
    counters[C_ADD_BF16]++;
    return kern_ops_cpu()->add_bf16(ctx, a, b, n, y_out);
}

static tdm_status_t count_add(kern_ctx_t *ctx, const float *a, const float *b, int64_t n,
                              float *y_out)
{
    counters[C_ADD]++;
    return kern_ops_cpu()->add(ctx, a, b, n, y_out);
}

static tdm_status_t count_scale2(kern_ctx_t *ctx, float *x, int64_t n, float s0, float s1)
{
    counters[C_SCALE2]++;
    return kern_ops_cpu()->scale2(ctx, x, n, s0, s1);
}

static tdm_status_t count_moe_ffn(kern_ctx_t *ctx, const kern_moe_experts_t *ex, const float *xq,
                                  int64_t n_tokens, int64_t H, int64_t I, const int64_t *offsets,
                                  const int64_t *rows, const float *wts, int64_t n_pairs,
                                  float lambda, float *scratch, int64_t scratch_rows, float *acc,
                                  int64_t *active_out)
{
    counters[C_MOE_FFN]++;
    return kern_ops_cpu()->moe_ffn(ctx, ex, xq, n_tokens, H, I, offsets, rows, wts, n_pairs, lambda,
                                   scratch, scratch_rows, acc, active_out);
}

static tdm_status_t count_cand_blocks(kern_ctx_t *ctx, const float *scores, int64_t n,
                                      int64_t block, float *beta_out)
{
    counters[C_CAND_BLOCKS]++;
    return kern_ops_cpu()->cand_blocks(ctx, scores, n, block, beta_out);
}

static tdm_status_t count_cand_mask(kern_ctx_t *ctx, float *scores, int64_t n, int64_t block,
                                    const int32_t *pool, int64_t n_pool)
{
    counters[C_CAND_MASK]++;
    return kern_ops_cpu()->cand_mask(ctx, scores, n, block, pool, n_pool);
}

static tdm_status_t count_expert_rows(kern_ctx_t *ctx, const int32_t *experts, const float *wts,
                                      int64_t N, int K, int64_t E, int64_t *offsets_out,
                                      int64_t *rows_out, float *wts_out)
{
    counters[C_EXPERT_ROWS]++;
    return kern_ops_cpu()->expert_rows(ctx, experts, wts, N, K, E, offsets_out, rows_out, wts_out);
}

static tdm_status_t count_page_mark(kern_ctx_t *ctx, void *page, uint32_t slot_end)
{
    counters[C_PAGE_MARK]++;
    return kern_ops_cpu()->page_mark(ctx, page, slot_end);
}

static tdm_status_t count_dequant_rows(kern_ctx_t *ctx, kern_rows_format_t format,
                                       const uint8_t *const *codes, const uint8_t *const *scales,
                                       int64_t n_rows, int64_t dim, float *y_out)
{
    counters[C_DEQUANT_ROWS]++;
    return kern_ops_cpu()->dequant_rows(ctx, format, codes, scales, n_rows, dim, y_out);
}

/* The attention's multiply-adds as the counting table sees its calls (engine_fwd_attn_flops'
 * definition, from the ops' own arguments): 4 d per head and key of every attention row, 2 d_I
 * per index head and key of every index_scores call. */
static uint64_t seen_attn_flops;

static tdm_status_t count_attention(kern_ctx_t *ctx, const float *q, const float *keys_a,
                                    int64_t n_a, const float *keys_b, int64_t n_b,
                                    const float *sink, int64_t n_heads, int64_t d, float scale,
                                    float *scratch, float *o_out)
{
    seen_attn_flops += (uint64_t)(4 * n_heads * d * (n_a + n_b));
    return kern_ops_cpu()->attention(ctx, q, keys_a, n_a, keys_b, n_b, sink, n_heads, d, scale,
                                     scratch, o_out);
}

static tdm_status_t count_attention_sel(kern_ctx_t *ctx, const float *q, const float *keys_a,
                                        int64_t n_a, const float *rows, const int32_t *sel,
                                        int64_t n_b, const float *sink, int64_t n_heads, int64_t d,
                                        float scale, float *scratch, float *o_out)
{
    seen_attn_flops += (uint64_t)(4 * n_heads * d * (n_a + n_b));
    return kern_ops_cpu()->attention_sel(ctx, q, keys_a, n_a, rows, sel, n_b, sink, n_heads, d,
                                         scale, scratch, o_out);
}

static tdm_status_t count_attention_rows(kern_ctx_t *ctx, const kern_attn_row_t *rows,
                                         int64_t n_rows, const float *sink, int64_t n_heads,
                                         int64_t d, float scale, float *scratch)
{
    for (int64_t i = 0; i < n_rows; i++) { /* host memory on the CPU backend */
        seen_attn_flops += (uint64_t)(4 * n_heads * d * (rows[i].n_a + rows[i].n_b));
    }
    return kern_ops_cpu()->attention_rows(ctx, rows, n_rows, sink, n_heads, d, scale, scratch);
}

static tdm_status_t count_index_scores(kern_ctx_t *ctx, const float *q, const float *w,
                                       int64_t n_heads, int64_t d_I, const float *keys,
                                       int64_t n_keys, float *scores_out)
{
    seen_attn_flops += (uint64_t)(2 * n_heads * d_I * n_keys);
    return kern_ops_cpu()->index_scores(ctx, q, w, n_heads, d_I, keys, n_keys, scores_out);
}

/* rows_ahead as a side queue that runs only when waited for: the start fills y_out with NaN and
 * keeps its arguments, the wait does the gather. An engine that read the rows before waiting, or
 * rewrote the pointer arrays or reused the buffer between, would get other logits. */
typedef struct {
    kern_rows_format_t format;
    const uint8_t *const *codes;
    const uint8_t *const *scales;
    int64_t n_rows, dim;
    float *y_out;
} deferred_gather_t;
static deferred_gather_t deferred[16];
static int n_deferred;

static tdm_status_t count_rows_ahead(kern_ctx_t *ctx, kern_rows_format_t format,
                                     const uint8_t *const *codes, const uint8_t *const *scales,
                                     int64_t n_rows, int64_t dim, float *y_out,
                                     kern_ahead_t *ticket)
{
    deferred_gather_t *d;

    (void)ctx;
    counters[C_ROWS_AHEAD]++;
    if (ticket == NULL || ticket->pending || n_rows < 0 || dim <= 0) {
        return TDM_ERR_INVALID_ARG;
    }
    if (ticket->queue == NULL) { /* the ticket's "queue": one record per ticket */
        if (n_deferred == (int)(sizeof(deferred) / sizeof(deferred[0]))) {
            return TDM_ERR_NO_MEMORY;
        }
        ticket->queue = &deferred[n_deferred++];
    }
    d = ticket->queue;
    *d = (deferred_gather_t){format, codes, scales, n_rows, dim, y_out};
    for (int64_t i = 0; i < n_rows * dim; i++) {
        y_out[i] = NAN;
    }
    ticket->pending = 1;
    return TDM_OK;
}

static tdm_status_t count_ahead_wait(kern_ctx_t *ctx, kern_ahead_t *ticket)
{
    const deferred_gather_t *d;

    counters[C_AHEAD_WAIT]++;
    if (ticket == NULL || !ticket->pending || ticket->queue == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    d = ticket->queue;
    ticket->pending = 0;
    return kern_ops_cpu()->dequant_rows(ctx, d->format, d->codes, d->scales, d->n_rows, d->dim,
                                        d->y_out);
}

typedef struct {
    kern_ops_t counting; /* must outlive the model loaded with it */
    ftu_engine_t plain;
    ftu_engine_t counted;
} fixture_t;

/* The tiny checkpoint on `ops`, in 32-token chunks (longer than the window). */
static int open_on(ftu_engine_t *e, const kern_ops_t *ops)
{
    return ftu_engine_open_on(e, POOL_PAGES, ops, 32);
}

static int setup(void **state)
{
    fixture_t *fx = calloc(1, sizeof(*fx));

    if (fx == NULL) {
        return -1;
    }
    *state = fx;
    fx->counting = *kern_ops_cpu();
    fx->counting.mem_copy = count_mem_copy;
    fx->counting.mem_set = count_mem_set;
    fx->counting.embed = count_embed;
    fx->counting.stream_mean = count_stream_mean;
    fx->counting.bf16_round = count_bf16_round;
    fx->counting.add_bf16 = count_add_bf16;
    fx->counting.add = count_add;
    fx->counting.scale2 = count_scale2;
    fx->counting.moe_ffn = count_moe_ffn;
    fx->counting.cand_blocks = count_cand_blocks;
    fx->counting.cand_mask = count_cand_mask;
    fx->counting.expert_rows = count_expert_rows;
    fx->counting.dequant_rows = count_dequant_rows;
    fx->counting.page_mark = count_page_mark;
    fx->counting.rows_ahead = count_rows_ahead;
    fx->counting.ahead_wait = count_ahead_wait; /* ahead_free: the CPU's (zeroes the ticket) */
    fx->counting.attention = count_attention;
    fx->counting.attention_sel = count_attention_sel;
    fx->counting.attention_rows = count_attention_rows;
    fx->counting.index_scores = count_index_scores;
    if (open_on(&fx->plain, kern_ops_cpu()) != 0 || open_on(&fx->counted, &fx->counting) != 0) {
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    fixture_t *fx = *state;
    int ok = ftu_engine_close(&fx->plain) == 0 && ftu_engine_close(&fx->counted) == 0;

    free(fx);
    return ok ? 0 : -1;
}

/* The steps of one run on engine e (ftu_run_schedule: prefill, decode, a greedy step, verify,
 * DSpark draft, replay). Returns the number of floats written. */
static int64_t run_steps(ftu_engine_t *e, float *out)
{
    return ftu_run_schedule(e, PROMPT, N_DECODE, out);
}

static void test_counting_table_gives_same_bits_and_sees_every_glue_op(void **state)
{
    fixture_t *fx = *state;
    int64_t cap = ftu_schedule_floats(&fx->plain, N_DECODE);
    float *a = malloc(sizeof(float) * (size_t)cap);
    float *b = malloc(sizeof(float) * (size_t)cap);
    int64_t na, nb;

    assert_non_null(a);
    assert_non_null(b);
    memset(counters, 0, sizeof(counters));
    memset(copies_of_kind, 0, sizeof(copies_of_kind));
    bad_kind_copies = 0;
    na = run_steps(&fx->plain, a);
    for (int c = 0; c < C_COUNT; c++) {
        assert_int_equal(counters[c], 0); /* the plain table does not count */
    }
    engine_fwd_reset_read_bytes(fx->counted.fwd);
    seen_attn_flops = 0;
    nb = run_steps(&fx->counted, b);
    /* engine_fwd_attn_flops counted every attention and indexer call of the schedule (prefill
     * in place, grouped rows, single rows, DSpark blocks), no more */
    print_message("attention FLOPs: %llu counted by the engine, %llu seen by the ops\n",
                  (unsigned long long)engine_fwd_attn_flops(fx->counted.fwd),
                  (unsigned long long)seen_attn_flops);
    assert_true(seen_attn_flops > 0);
    assert_true(engine_fwd_attn_flops(fx->counted.fwd) == seen_attn_flops);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, sizeof(float) * (size_t)na);
    for (int c = 0; c < C_COUNT; c++) {
        print_message("%s: %lld calls\n", counter_names[c], (long long)counters[c]);
        if (c == C_ADD || (c == C_STREAM_MEAN && fx->plain.cfg->n_blocks == 0)) {
            continue; /* add: DSpark heads only (engine/spec_dspark.c, test_spec) */
        }
        assert_true(counters[c] > 0);
    }
    assert_true(copies_of_kind[KERN_COPY_H2D] > 0);
    assert_true(copies_of_kind[KERN_COPY_D2H] > 0);
    assert_true(copies_of_kind[KERN_COPY_D2D] > 0);
    assert_int_equal(bad_kind_copies, 0);
    /* every Engram gather started ahead was waited for (no batch here fails) */
    assert_int_equal(counters[C_ROWS_AHEAD], counters[C_AHEAD_WAIT]);
    free(a);
    free(b);
}

/* Every page the forward pass wrote (runs of rows copied per region, the header through
 * kern_kv_page_mark_rows on a host copy) equals, byte for byte, the page kern_kv_page_write_row
 * builds from the same rows slot by slot on a fresh kern_kv_page_init page: records, row_count,
 * stale flag, checksum field, zero slots. A prefill in 32-row chunks then decode steps: runs that
 * start mid-page, fill a page and cross into the next. */
static void test_pages_equal_row_by_row_writes(void **state)
{
    fixture_t *fx = *state;
    ftu_engine_t *e = &fx->counted;
    size_t page_bytes = engine_kv_pool_page_bytes(e->pool);
    uint8_t *want = malloc(page_bytes);
    uint8_t rec[4][1024];
    int32_t prompt[PROMPT];
    int32_t next = 5;
    float *logits = malloc(sizeof(float) * (size_t)e->V);
    engine_seq_t *seq = ftu_new_seq(e);
    int n_pages_checked = 0;
    (void)state;

    assert_non_null(want);
    assert_non_null(logits);
    ftu_prompt(33, e->V, prompt, PROMPT);
    assert_int_equal(engine_fwd_prefill(e->fwd, seq, prompt, PROMPT, 0, logits, NULL), TDM_OK);
    for (int step = 0; step < 40; step++) { /* past 128 rows of the ratio-1 sources */
        assert_int_equal(engine_fwd_decode(e->fwd, &seq, &next, 1, logits), TDM_OK);
        next = (int32_t)ftu_argmax(logits, e->V);
    }
    for (int s = 0; s < e->cfg->n_kv_source_layer_ids; s++) {
        const engine_kv_table_t *t = engine_seq_table(seq, (int)e->cfg->kv_source_layer_ids[s]);
        assert_non_null(t);
        assert_true(t->n_rows > KERN_KV_PAGE_ROWS);
        for (uint32_t i = 0; i < t->n_pages && (int64_t)i * KERN_KV_PAGE_ROWS < t->n_rows; i++) {
            const uint8_t *got = engine_kv_pool_page(e->pool, t->page_ids[i]);
            kern_kv_page_header_t h;
            kern_kv_page_params_t params;
            assert_int_equal(kern_kv_page_header_read(got, page_bytes, &h), TDM_OK);
            assert_true(h.row_count > 0);
            assert_int_equal(h.flags, KERN_KV_PAGE_FLAG_STALE);
            params.source_layer = h.source_layer;
            params.first_row = h.first_row;
            params.ratio = h.ratio;
            params.d = h.d;
            params.d_I = h.d_I;
            params.fingerprint = h.fingerprint;
            assert_true(h.d / 2 <= sizeof(rec[0]) && h.d_I / 2 <= sizeof(rec[0]));
            assert_int_equal(kern_kv_page_init(want, page_bytes, &params), TDM_OK);
            for (uint32_t slot = 0; slot < h.row_count; slot++) {
                assert_int_equal(kern_kv_page_read_row(got, slot, rec[0], rec[1], rec[2], rec[3]),
                                 TDM_OK);
                assert_int_equal(kern_kv_page_write_row(want, slot, rec[0], rec[1], rec[2], rec[3]),
                                 TDM_OK);
            }
            assert_memory_equal(got, want, page_bytes);
            n_pages_checked++;
        }
    }
    assert_true(n_pages_checked >= 2 * e->cfg->n_kv_source_layer_ids);
    engine_seq_destroy(seq);
    free(logits);
    free(want);
}

/* engine_fwd_decode_greedy: the tokens of argmax over engine_fwd_decode's logits, step after
 * step on two copies of the same sequences (so the states stay equal), with the same state
 * after (the next step's logits equal); bad arguments change nothing. */
static void test_decode_greedy_equals_argmax_of_logits(void **state)
{
    ftu_engine_t e;
    enum { B = 3, STEPS = 6 };
    engine_seq_t *a[B], *g[B];
    int32_t prompt[PROMPT], ta[B], tg[B], out[B];

    (void)state;
    memset(&e, 0, sizeof(e));
    assert_int_equal(ftu_engine_open_on(&e, POOL_PAGES, NULL, 32), 0);
    float *lg = malloc(sizeof(float) * (size_t)(B * e.V));
    assert_non_null(lg);
    for (int i = 0; i < B; i++) {
        int64_t T = PROMPT - 11 * i;
        ftu_prompt(91 + (uint64_t)i, e.V, prompt, T);
        a[i] = ftu_new_seq(&e);
        g[i] = ftu_new_seq(&e);
        assert_int_equal(engine_fwd_prefill(e.fwd, a[i], prompt, T, 0, NULL, NULL), TDM_OK);
        assert_int_equal(engine_fwd_prefill(e.fwd, g[i], prompt, T, 0, NULL, NULL), TDM_OK);
        ta[i] = tg[i] = prompt[T - 1];
    }
    assert_int_equal(engine_fwd_decode_greedy(e.fwd, g, tg, B, NULL), TDM_ERR_INVALID_ARG);
    assert_int_equal(engine_fwd_decode_greedy(e.fwd, g, tg, 0, out), TDM_ERR_INVALID_ARG);
    assert_int_equal(engine_seq_length(g[0]), engine_seq_length(a[0]));
    for (int step = 0; step < STEPS; step++) {
        assert_int_equal(engine_fwd_decode(e.fwd, a, ta, B, lg), TDM_OK);
        assert_int_equal(engine_fwd_decode_greedy(e.fwd, g, tg, B, out), TDM_OK);
        for (int i = 0; i < B; i++) {
            ta[i] = (int32_t)ftu_argmax(lg + i * e.V, e.V);
            assert_int_equal(out[i], ta[i]);
            tg[i] = out[i];
            assert_int_equal(engine_seq_length(g[i]), engine_seq_length(a[i]));
        }
    }
    for (int i = 0; i < B; i++) {
        engine_seq_destroy(a[i]);
        engine_seq_destroy(g[i]);
    }
    free(lg);
    assert_int_equal(ftu_engine_close(&e), 0);
}

/* A greedy decode step's MoE layers and page writes copy nothing to the host: each layer's routed
 * experts are one moe_ffn call that reads the expert offsets where kern_expert_rows left them (on a
 * GPU a copy to the host is a wait on the stream), and page headers are marked by ops->page_mark,
 * not copied out and back. The step's other copies to the host (selection bookkeeping, the ids) are
 * counted and printed; the experts the op ran are counted on the
 * backend and reach engine_fwd_read_bytes. */
static void test_decode_step_moe_copies_nothing_to_host(void **state)
{
    fixture_t *fx = *state;
    ftu_engine_t *e = &fx->counted;
    enum { B = 2 };
    engine_seq_t *s[B];
    int32_t prompt[PROMPT], tok[B], out[B];
    int n_moe = e->cfg->n_layers; /* a decode step runs the backbone's layers, each with a MoE */
    uint64_t w0 = 0, w1 = 0;

    for (int i = 0; i < B; i++) {
        ftu_prompt(7 + (uint64_t)i, e->V, prompt, PROMPT - 5 * i);
        s[i] = ftu_new_seq(e);
        assert_int_equal(engine_fwd_prefill(e->fwd, s[i], prompt, PROMPT - 5 * i, 0, NULL, NULL),
                         TDM_OK);
        tok[i] = prompt[PROMPT - 5 * i - 1];
    }
    engine_fwd_reset_read_bytes(e->fwd);
    engine_fwd_read_bytes(e->fwd, &w0, NULL);
    memset(counters, 0, sizeof(counters));
    memset(copies_of_kind, 0, sizeof(copies_of_kind));
    /* the expert offsets are E + 1 int64: no other copy of a step has that size here (ids,
     * counts, selections of at most index_topk rows, 64-byte page headers) */
    watched_d2h_bytes = (size_t)(e->cfg->n_routed_experts + 1) * sizeof(int64_t);
    watched_d2h = 0;
    pool_d2h = 0;
    {
        uint32_t n_pages = engine_kv_pool_n_pages(e->pool);
        pool_lo = engine_kv_pool_page(e->pool, 0); /* one allocation (kv_cache.c) */
        pool_hi = (const uint8_t *)engine_kv_pool_page(e->pool, n_pages - 1) +
                  engine_kv_pool_page_bytes(e->pool);
    }
    assert_true(watched_d2h_bytes != KERN_KV_PAGE_HEADER_BYTES &&
                watched_d2h_bytes > (size_t)B * e->cfg->index_topk * sizeof(int32_t));
    assert_int_equal(engine_fwd_decode_greedy(e->fwd, s, tok, B, out), TDM_OK);
    print_message("greedy decode step, batch %d: %lld moe_ffn calls, %lld copies to the host, "
                  "%lld of the offsets' size (%d MoE layers)\n",
                  B, (long long)counters[C_MOE_FFN], (long long)copies_of_kind[KERN_COPY_D2H],
                  (long long)watched_d2h, n_moe);
    assert_int_equal(counters[C_MOE_FFN], n_moe);
    assert_int_equal(watched_d2h, 0); /* one per MoE layer before moe_ffn */
    /* the waits of a step do not grow with the batch: one per index-source layer (every row's
     * top-k in one copy; layers that reuse a selection read the host's copy), the status word
     * and the ids (18 at batch 2 when each row and segment copied its own) */
    assert_true(copies_of_kind[KERN_COPY_D2H] <= e->cfg->n_index_source_layer_ids + 2);
    /* and the selected rows of a batch of up to FWD_SEL_GROUP rows are one gather per layer
     * with compressed rows, the windows of all segments one gather per layer (the Engram rows
     * go through rows_ahead), not one per row or segment */
    {
        int n_compressed = 0;
        for (int l = 0; l < e->cfg->n_layers; l++) {
            n_compressed += e->cfg->roles[l].ratio > 0;
        }
        print_message("greedy decode step, batch %d: %lld dequant_rows calls, %d layers with "
                      "compressed rows\n",
                      B, (long long)counters[C_DEQUANT_ROWS], n_compressed);
        assert_true(n_compressed > 0);
        /* B <= FWD_SEL_GROUP: one group per layer; per row and segment it would be
         * B * (n_compressed + n_layers) */
        assert_int_equal(counters[C_DEQUANT_ROWS], n_compressed + e->cfg->n_layers);
    }
    /* more steps, until new rows have filled compressed groups: their page headers are marked
     * on the backend, nothing is copied out of the page pool */
    for (int step = 0; step < 8; step++) {
        for (int i = 0; i < B; i++) {
            tok[i] = out[i];
        }
        assert_int_equal(engine_fwd_decode_greedy(e->fwd, s, tok, B, out), TDM_OK);
    }
    print_message("9 greedy steps: %lld page_mark calls, %lld copies out of the page pool\n",
                  (long long)counters[C_PAGE_MARK], (long long)pool_d2h);
    assert_true(counters[C_PAGE_MARK] > 0);
    assert_int_equal(pool_d2h, 0);
    assert_int_equal(watched_d2h, 0);
    watched_d2h_bytes = 0;
    pool_lo = pool_hi = NULL;
    engine_fwd_read_bytes(e->fwd, &w1, NULL);
    assert_true(w1 > w0); /* the experts run on the backend are counted */
    for (int i = 0; i < B; i++) {
        engine_seq_destroy(s[i]);
    }
}

/* The tiny checkpoint on `table` (e) and on the plain CPU table (ref, the reference), each in
 * 32-token chunks; close_pair checks that both gave every page back. */
static void open_pair(ftu_engine_t *e, ftu_engine_t *ref, const kern_ops_t *table)
{
    memset(e, 0, sizeof(*e));
    memset(ref, 0, sizeof(*ref));
    assert_int_equal(ftu_engine_open_on(e, POOL_PAGES, table, 32), 0);
    assert_int_equal(ftu_engine_open_on(ref, POOL_PAGES, NULL, 32), 0);
}

static void close_pair(ftu_engine_t *e, ftu_engine_t *ref)
{
    assert_int_equal(ftu_engine_close(ref), 0);
    assert_int_equal(ftu_engine_close(e), 0);
}

/* n new sequences on e and the same on ref, sequence i prefilled with prompt seed + i of
 * PROMPT - shrink * i tokens; last_ids[i] = its last prompt token (the first decode input). */
static void prefill_pairs(ftu_engine_t *e, ftu_engine_t *ref, engine_seq_t **s, engine_seq_t **r,
                          int n, uint64_t seed, int64_t shrink, int32_t *last_ids)
{
    int32_t prompt[PROMPT];

    for (int i = 0; i < n; i++) {
        int64_t T = PROMPT - shrink * i;
        ftu_prompt(seed + (uint64_t)i, e->V, prompt, T);
        s[i] = ftu_new_seq(e);
        r[i] = ftu_new_seq(ref);
        assert_int_equal(engine_fwd_prefill(e->fwd, s[i], prompt, T, 0, NULL, NULL), TDM_OK);
        assert_int_equal(engine_fwd_prefill(ref->fwd, r[i], prompt, T, 0, NULL, NULL), TDM_OK);
        last_ids[i] = prompt[T - 1];
    }
}

/* mhc_collapse failing once when fail_next_collapse is set (the table below). */
static int fail_next_collapse;
static tdm_status_t failing_mhc_collapse(kern_ctx_t *ctx, const float *pre, const float *X,
                                         int64_t n_rows, int m, int64_t H, float *y_out)
{
    if (fail_next_collapse) {
        fail_next_collapse = 0;
        return TDM_ERR_INTERNAL;
    }
    return kern_mhc_collapse_cpu(ctx, pre, X, n_rows, m, H, y_out);
}

/* A decode batch that fails in layer 0, after its Engram gathers were started ahead and before
 * any Engram layer waited for them, leaves them pending (on a GPU possibly still reading their
 * pointer arrays). The next batch waits for them before rewriting those arrays (a start on a
 * pending ticket is refused, so a forgotten wait fails the call) and gives the plain table's
 * logits. The gathers here run only when waited for (count_rows_ahead). */
static void test_engram_gather_pending_after_failed_batch(void **state)
{
    ftu_engine_t e, ref;
    kern_ops_t table = *kern_ops_cpu();
    enum { B = 3, B2 = 2 };
    engine_seq_t *g[B], *r[B], *g2[B2], *r2[B2];
    int32_t ids[B], ids2[B2];
    float *got = malloc(sizeof(float) * (size_t)(B * 40000));
    float *want = malloc(sizeof(float) * (size_t)(B * 40000));

    (void)state;
    table.rows_ahead = count_rows_ahead;
    table.ahead_wait = count_ahead_wait;
    table.mhc_collapse = failing_mhc_collapse;
    open_pair(&e, &ref, &table);
    assert_true(e.cfg->n_engram_layer_ids > 0 && e.V <= 40000);
    assert_non_null(got);
    assert_non_null(want);
    prefill_pairs(&e, &ref, g, r, B, 61, 5, ids);
    prefill_pairs(&e, &ref, g2, r2, B2, 71, 9, ids2);
    memset(counters, 0, sizeof(counters));
    fail_next_collapse = 1;
    assert_int_equal(engine_fwd_decode(e.fwd, g, ids, B, got), TDM_ERR_INTERNAL);
    assert_int_equal(fail_next_collapse, 0);
    assert_int_equal(counters[C_ROWS_AHEAD], e.cfg->n_engram_layer_ids);
    assert_int_equal(counters[C_AHEAD_WAIT], 0); /* left pending */
    /* other sequences, fewer rows: other pointer arrays into the same buffers */
    assert_int_equal(engine_fwd_decode(e.fwd, g2, ids2, B2, got), TDM_OK);
    assert_int_equal(engine_fwd_decode(ref.fwd, r2, ids2, B2, want), TDM_OK);
    assert_memory_equal(got, want, sizeof(float) * (size_t)(B2 * e.V));
    assert_int_equal(counters[C_ROWS_AHEAD], 2 * e.cfg->n_engram_layer_ids);
    assert_int_equal(counters[C_AHEAD_WAIT], 2 * e.cfg->n_engram_layer_ids);
    for (int i = 0; i < B; i++) {
        engine_seq_destroy(g[i]);
        engine_seq_destroy(r[i]);
    }
    for (int i = 0; i < B2; i++) {
        engine_seq_destroy(g2[i]);
        engine_seq_destroy(r2[i]);
    }
    close_pair(&e, &ref);
    free(got);
    free(want);
}

/* The CPU argmax after poisoning row POISON_ROW of its logits with a NaN (the table below). */
#define POISON_ROW 1
static tdm_status_t poisoned_argmax(kern_ctx_t *ctx, const float *logits, int64_t ld,
                                    int64_t n_rows, int64_t n_vocab, int32_t *ids_out)
{
    if (n_rows > POISON_ROW) {
        ((float *)logits)[POISON_ROW * ld + n_vocab / 2] = NAN; /* host memory: the CPU table */
    }
    return kern_argmax_cpu(ctx, logits, ld, n_rows, n_vocab, ids_out);
}

/* A row without a finite greedy token (a NaN in its logits) fails alone: the call succeeds, that
 * row's token is -1, the others are the plain CPU's, and every sequence stepped (as
 * engine_fwd_decode, whose caller's sampler would refuse that row). */
static void test_decode_greedy_bad_row_fails_alone(void **state)
{
    ftu_engine_t e, ref;
    kern_ops_t table = *kern_ops_cpu();
    enum { B = 3 };
    engine_seq_t *g[B], *r[B];
    int32_t ids[B], out[B], want[B];

    (void)state;
    table.argmax = poisoned_argmax;
    open_pair(&e, &ref, &table);
    prefill_pairs(&e, &ref, g, r, B, 51, 7, ids);
    assert_int_equal(engine_fwd_decode_greedy(e.fwd, g, ids, B, out), TDM_OK);
    assert_int_equal(engine_fwd_decode_greedy(ref.fwd, r, ids, B, want), TDM_OK);
    for (int i = 0; i < B; i++) {
        assert_int_equal(out[i], i == POISON_ROW ? -1 : want[i]);
        assert_int_equal(engine_seq_length(g[i]), engine_seq_length(r[i]));
        engine_seq_destroy(g[i]);
        engine_seq_destroy(r[i]);
    }
    close_pair(&e, &ref);
}

/* The router seen by the two tests below: how many calls carried the deferred status word, and
 * (while poison_route is set) a NaN put into row POISON_ROW's router logits (host memory: the
 * CPU table). */
static int64_t route_calls, route_calls_deferred;
static int poison_route;

static tdm_status_t watched_route(kern_ctx_t *ctx, const float *logits, const float *bias,
                                  int64_t n_rows, int64_t E, int K, float rho, int32_t *ids_out,
                                  float *weights_out)
{
    route_calls++;
    route_calls_deferred += ctx != NULL && ctx->status_word != NULL;
    if (poison_route && n_rows > POISON_ROW) {
        ((float *)logits)[POISON_ROW * E + E / 2] = NAN;
    }
    return kern_moe_route_cpu(ctx, logits, bias, n_rows, E, K, rho, ids_out, weights_out);
}

/* Decode steps run the router with the deferred status word (no wait per MoE layer on a device:
 * kernels/backend.h), prefill does not. A NaN that reaches the router in a decode step fails the
 * whole call with TDM_ERR_INTERNAL, as the router's own status did; no sequence advanced; the
 * failed sequences are destroyed (the contract: their state is invalid) and give back every
 * page (ftu_engine_close), and new sequences on the same engine get the bits of an engine that
 * never failed. */
static void test_decode_router_nan_deferred_fails_call_only(void **state)
{
    ftu_engine_t e, ref;
    kern_ops_t table = *kern_ops_cpu();
    enum { B = 3 };
    engine_seq_t *s[B], *r[B];
    int32_t ids[B], out[B];
    float *lg, *want;

    (void)state;
    table.moe_route = watched_route;
    open_pair(&e, &ref, &table);
    lg = malloc(sizeof(float) * (size_t)(B * e.V));
    want = malloc(sizeof(float) * (size_t)(B * e.V));
    assert_non_null(lg);
    assert_non_null(want);
    route_calls = route_calls_deferred = 0;
    prefill_pairs(&e, &ref, s, r, B, 61, 9, ids);
    assert_true(route_calls > 0);
    assert_int_equal(route_calls_deferred, 0); /* prefill: the router's status at once */
    route_calls = 0;
    assert_int_equal(engine_fwd_decode(e.fwd, s, ids, B, lg), TDM_OK);
    assert_int_equal(engine_fwd_decode(ref.fwd, r, ids, B, want), TDM_OK);
    assert_memory_equal(lg, want, sizeof(float) * (size_t)(B * e.V));
    assert_int_equal(route_calls, e.cfg->n_layers);
    assert_int_equal(route_calls_deferred, route_calls); /* every MoE layer of the step */
    for (int i = 0; i < B; i++) {
        ids[i] = (int32_t)ftu_argmax(lg + i * e.V, e.V);
    }
    /* poisoned: each decode form fails as a whole at the end of the step (every layer's router
     * deferred), no sequence moves; the failed sequences go (their state is invalid) and the
     * next form starts on fresh ones */
    for (int form = 0; form < 2; form++) {
        int64_t len0 = engine_seq_length(s[0]);
        route_calls = route_calls_deferred = 0;
        poison_route = 1;
        assert_int_equal(form == 0 ? engine_fwd_decode(e.fwd, s, ids, B, lg)
                                   : engine_fwd_decode_greedy(e.fwd, s, ids, B, out),
                         TDM_ERR_INTERNAL);
        poison_route = 0;
        assert_int_equal(route_calls, e.cfg->n_layers);
        assert_int_equal(route_calls_deferred, route_calls);
        assert_int_equal(engine_seq_length(s[0]), len0);
        for (int i = 0; i < B; i++) {
            engine_seq_destroy(s[i]);
            engine_seq_destroy(r[i]);
        }
        prefill_pairs(&e, &ref, s, r, B, 71 + 10 * (uint64_t)form, 4, ids);
    }
    /* new sequences on the same engine: the reference's bits */
    for (int step = 0; step < 2; step++) {
        assert_int_equal(engine_fwd_decode(e.fwd, s, ids, B, lg), TDM_OK);
        assert_int_equal(engine_fwd_decode(ref.fwd, r, ids, B, want), TDM_OK);
        assert_memory_equal(lg, want, sizeof(float) * (size_t)(B * e.V));
        for (int i = 0; i < B; i++) {
            ids[i] = (int32_t)ftu_argmax(lg + i * e.V, e.V);
        }
    }
    for (int i = 0; i < B; i++) {
        engine_seq_destroy(s[i]);
        engine_seq_destroy(r[i]);
    }
    free(lg);
    free(want);
    close_pair(&e, &ref);
}

/* The index top-k seen by the test below: calls, calls with the status word, and (while
 * poison_topk is set) a NaN among its values (host memory: the CPU table). */
static int64_t topk_calls, topk_calls_deferred;
static int poison_topk;
static int64_t bad_index_k; /* > 0: a top-k of this k returns the index n (out of range) */

static tdm_status_t watched_topk(kern_ctx_t *ctx, const float *vals, int64_t n, int64_t k,
                                 int32_t *scratch, int32_t *idx_out, int64_t *n_out)
{
    tdm_status_t st;

    topk_calls++;
    topk_calls_deferred += ctx != NULL && ctx->status_word != NULL;
    if (poison_topk && n > 1) {
        ((float *)vals)[n / 2] = NAN;
    }
    st = kern_topk_cpu(ctx, vals, n, k, scratch, idx_out, n_out);
    if (st == TDM_OK && k == bad_index_k && *n_out > 0) {
        idx_out[0] = (int32_t)n; /* a backend gone wrong */
    }
    return st;
}

/* Decode steps run the index top-k with the deferred status word (its count and result come to
 * the host in one copy afterwards); a NaN among the index scores fails the whole call with
 * TDM_ERR_INTERNAL at the end of the step; prefill keeps the immediate status. */
static void test_decode_index_topk_nan_deferred(void **state)
{
    ftu_engine_t e, ref;
    kern_ops_t table = *kern_ops_cpu();
    enum { B = 2 };
    engine_seq_t *s[B], *r[B];
    int32_t ids[B];
    float *lg;

    (void)state;
    table.topk = watched_topk;
    open_pair(&e, &ref, &table);
    lg = malloc(sizeof(float) * (size_t)(B * e.V));
    assert_non_null(lg);
    topk_calls = topk_calls_deferred = 0;
    prefill_pairs(&e, &ref, s, r, B, 81, 3, ids);
    assert_true(topk_calls > 0);
    assert_int_equal(topk_calls_deferred, 0);
    topk_calls = 0;
    assert_int_equal(engine_fwd_decode(e.fwd, s, ids, B, lg), TDM_OK);
    assert_true(topk_calls > 0); /* PROMPT > index_topk: real selections */
    assert_int_equal(topk_calls_deferred, topk_calls);
    int64_t len0 = engine_seq_length(s[0]);
    poison_topk = 1;
    assert_int_equal(engine_fwd_decode(e.fwd, s, ids, B, lg), TDM_ERR_INTERNAL);
    poison_topk = 0;
    assert_int_equal(engine_seq_length(s[0]), len0);
    /* an index out of [0, n_vis) from the index top-k: refused by the host's check (it would
     * have written past the sort's bitmap), the call fails, nothing else happens */
    bad_index_k = e.cfg->index_topk;
    assert_int_equal(engine_fwd_decode(e.fwd, s, ids, B, lg), TDM_ERR_INTERNAL);
    bad_index_k = 0;
    assert_int_equal(engine_seq_length(s[0]), len0);
    for (int i = 0; i < B; i++) {
        engine_seq_destroy(s[i]);
        engine_seq_destroy(r[i]);
    }
    free(lg);
    close_pair(&e, &ref);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counting_table_gives_same_bits_and_sees_every_glue_op),
        cmocka_unit_test(test_pages_equal_row_by_row_writes),
        cmocka_unit_test(test_decode_step_moe_copies_nothing_to_host),
        cmocka_unit_test(test_decode_greedy_equals_argmax_of_logits),
        cmocka_unit_test(test_decode_greedy_bad_row_fails_alone),
        cmocka_unit_test(test_engram_gather_pending_after_failed_batch),
        cmocka_unit_test(test_decode_router_nan_deferred_fails_call_only),
        cmocka_unit_test(test_decode_index_topk_nan_deferred),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
