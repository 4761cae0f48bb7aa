/* forward_attn.c - the attention sublayer (MODEL.md 5.2), the compressor (5.3), index keys and
 * selection (5.4) on a batch of rows; window rings and KV pages of the batch's sequences.
 *
 * Activations, rings, pending halves, selections and pages are backend memory (device memory on
 * CUDA): host code here only computes pointers into them and moves bytes with ops->mem_copy.
 * What the host must know or build (positions, the selection bookkeeping, row-pointer arrays,
 * page headers) goes through fwd_host_alloc staging with D2H / H2D copies (docs/NUMERICS.md 7,
 * items 4 to 6, with their cost on a GPU). */
#include "engine/forward_impl.h"

#include "common/log.h"
#include "kernels/kv_page.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define FLOAT_BYTES(n) ((size_t)(n) * sizeof(float))

/* FLOPs engine_fwd_attn_flops counts for one query row: the sink attention of nh heads of
 * width d over n_keys keys (scores q.k and the weighted sum of values: 2 multiply-adds per head
 * dimension per key), and the indexer's scores of HI heads of width dI over n keys (one
 * multiply-add each). */
static uint64_t attn_row_flops(int64_t nh, int64_t d, int64_t n_keys)
{
    return (uint64_t)(4 * nh * d * n_keys);
}

static uint64_t index_row_flops(int64_t HI, int64_t dI, int64_t n)
{
    return (uint64_t)(2 * HI * dI * n);
}

/* Position of batch row r. */
static int64_t row_pos(const fwd_batch_t *b, int64_t r, const fwd_seg_t **seg_out)
{
    for (int s = 0; s < b->n_segs; s++) {
        const fwd_seg_t *seg = &b->segs[s];
        if (r >= seg->row0 && r < seg->row0 + seg->n) {
            if (seg_out != NULL) {
                *seg_out = seg;
            }
            return seg->pos0 + (r - seg->row0);
        }
    }
    return -1;
}

int64_t fwd_ring_run(const engine_seq_t *seq, int64_t p, int64_t end)
{
    int64_t run = seq->C - p % seq->C;
    return run < end - p ? run : end - p;
}

tdm_status_t fwd_ring_write(engine_fwd_t *fwd, const fwd_seg_t *seg, int l, const uint8_t *kc,
                            const uint8_t *ks)
{
    int64_t d = fwd->cfg->head_dim;
    int64_t end = seg->pos0 + seg->n;
    tdm_status_t st = TDM_OK;

    if (seg->draft) {
        return TDM_OK;
    }
    for (int64_t p = seg->pos0, run; p < end && st == TDM_OK; p += run) {
        int64_t row = seg->row0 + (p - seg->pos0);
        run = fwd_ring_run(seg->seq, p, end);
        st = fwd_copy(fwd, engine_seq_ring_codes_at(seg->seq, l, p), kc + row * d,
                      (size_t)(run * d));
        if (st == TDM_OK) {
            st = fwd_copy(fwd, engine_seq_ring_scales_at(seg->seq, l, p), ks + row * d / 32,
                          (size_t)(run * d / 32));
        }
    }
    return st;
}

/* Region pointers of a page (kernels/kv_page.h layout). */
typedef struct {
    kern_kv_page_layout_t ly;
} page_geom_t;

static tdm_status_t page_geom(const engine_config_t *cfg, page_geom_t *g)
{
    return kern_kv_page_layout((uint32_t)cfg->head_dim, (uint32_t)cfg->index_head_dim, &g->ly);
}

/* Where main row j of table lies in its page: *codes_out, *scales_out (for ops->dequant_rows). */
static tdm_status_t main_row_at(engine_fwd_t *fwd, const page_geom_t *g, const engine_kv_table_t *t,
                                int64_t j, const uint8_t **codes_out, const uint8_t **scales_out)
{
    uint32_t slot;
    const uint8_t *page = engine_kv_table_row_page(fwd->pool, t, j, &slot);
    if (page == NULL) {
        return TDM_ERR_INTERNAL;
    }
    fwd->read_kv_bytes += (uint64_t)(g->ly.main_codes_row_bytes + g->ly.main_scales_row_bytes);
    *codes_out = page + g->ly.main_codes_offset + slot * g->ly.main_codes_row_bytes;
    *scales_out = page + g->ly.main_scales_offset + slot * g->ly.main_scales_row_bytes;
    return TDM_OK;
}

/* Rows [0, n) of table t, dequantized page by page with `dequant` from the codes and scales at
 * codes_off / scales_off of each page into *buf [*cap_rows, dim] (grown to n rows); counts
 * counted_row_bytes per row into fwd->read_kv_bytes (0: the caller counts what it reads). */
static tdm_status_t load_table_rows(engine_fwd_t *fwd, const engine_kv_table_t *t, int64_t n,
                                    int64_t dim, size_t codes_off, size_t scales_off,
                                    kern_dequant_mx4_fn *dequant, uint64_t counted_row_bytes,
                                    float **buf, int64_t *cap_rows)
{
    tdm_status_t st = fwd_grow_rows(fwd, buf, cap_rows, n, dim);
    for (int64_t j0 = 0; j0 < n && st == TDM_OK; j0 += KERN_KV_PAGE_ROWS) {
        uint32_t slot;
        const uint8_t *page = engine_kv_table_row_page(fwd->pool, t, j0, &slot);
        int64_t cnt = n - j0 < KERN_KV_PAGE_ROWS ? n - j0 : KERN_KV_PAGE_ROWS;
        if (page == NULL || slot != 0) {
            return TDM_ERR_INTERNAL;
        }
        fwd->read_kv_bytes += (uint64_t)cnt * counted_row_bytes;
        st = dequant(&fwd->kctx, page + codes_off, page + scales_off, cnt, dim, *buf + j0 * dim);
    }
    return st;
}

/* Dequantize main (compressed KV) rows [0, n) of table into fwd->ckv_cache: the same values
 * kern_dequant_rows gives row by row (one codec, element by element). Their bytes are counted
 * where a query selects them. */
static tdm_status_t load_main_rows(engine_fwd_t *fwd, const page_geom_t *g,
                                   const engine_kv_table_t *t, int64_t n)
{
    return load_table_rows(fwd, t, n, fwd->cfg->head_dim, g->ly.main_codes_offset,
                           g->ly.main_scales_offset, fwd->ops->dequant_ckv, 0, &fwd->ckv_cache,
                           &fwd->ckv_cap_rows);
}

/* Dequantize index keys [0, n) of table into fwd->ikey_cache. */
static tdm_status_t load_index_keys(engine_fwd_t *fwd, const page_geom_t *g,
                                    const engine_kv_table_t *t, int64_t n)
{
    int64_t dI = g->ly.d_I;
    return load_table_rows(fwd, t, n, dI, g->ly.index_codes_offset, g->ly.index_scales_offset,
                           fwd->ops->dequant_mx4, (uint64_t)(dI / 2 + dI / 32), &fwd->ikey_cache,
                           &fwd->ikey_cap_rows);
}

/*
 * Rows [slot, slot + n) of one page (slot + n <= 64) from n consecutive quantized rows mc [n, d/2],
 * ms [n, d/16], ic [n, d_I/2], is [n, d_I/32] (backend memory, like the page): one backend copy
 * per region, and the header's row count and stale flag either on the backend (ops->page_mark,
 * in a decode step: a status word on the context) or through host staging hdr [64] (copied
 * out, kern_kv_page_mark_rows, copied back). The page's bytes equal those of
 * kern_kv_page_write_row on each slot, and no host code touches the page (docs/NUMERICS.md 7).
 * Errors: TDM_ERR_INVALID_ARG (not an initialised page; through host staging nothing is
 * written, on the backend the rows are and the call fails: on CUDA through the status word),
 * copy errors.
 */
static tdm_status_t page_write_rows(engine_fwd_t *fwd, const kern_kv_page_layout_t *ly,
                                    uint8_t *page, uint32_t slot, int64_t n, const uint8_t *mc,
                                    const uint8_t *ms, const uint8_t *ic, const uint8_t *is,
                                    uint8_t *hdr)
{
    const size_t offset[4] = {ly->main_codes_offset, ly->main_scales_offset, ly->index_codes_offset,
                              ly->index_scales_offset};
    const size_t row_bytes[4] = {ly->main_codes_row_bytes, ly->main_scales_row_bytes,
                                 ly->index_codes_row_bytes, ly->index_scales_row_bytes};
    const uint8_t *src[4] = {mc, ms, ic, is};
    /* in a decode step (a status word on the context) the header is marked on the backend;
     * otherwise through a host copy, whose refusal comes back at once */
    int on_backend = fwd->kctx.status_word != NULL;
    tdm_status_t st = on_backend ? TDM_OK : fwd_to_host(fwd, hdr, page, KERN_KV_PAGE_HEADER_BYTES);

    if (st == TDM_OK && !on_backend) {
        st = kern_kv_page_mark_rows(hdr, slot + (uint32_t)n);
    }
    for (int i = 0; i < 4 && st == TDM_OK; i++) {
        st =
            fwd_copy(fwd, page + offset[i] + slot * row_bytes[i], src[i], (size_t)n * row_bytes[i]);
    }
    if (st == TDM_OK) {
        st = on_backend ? fwd->ops->page_mark(&fwd->kctx, page, slot + (uint32_t)n)
                        : fwd_to_backend(fwd, page, hdr, KERN_KV_PAGE_HEADER_BYTES);
    }
    return st;
}

/*
 * The compressor of KV source l for one segment (MODEL.md 5.3): rows completed by the
 * segment's tokens are published into the sequence's pages with their index keys; the pending
 * half-group is carried across segments. a, bg: [N, d] projections of the batch (bg NULL at
 * ratio 1).
 */
static tdm_status_t compress_segment(engine_fwd_t *fwd, const fwd_seg_t *seg, int l, const float *a,
                                     const float *bg, const page_geom_t *g)
{
    const engine_config_t *cfg = fwd->cfg;
    const engine_layer_weights_t *lw = &fwd->model->layers[l];
    engine_seq_t *seq = seg->seq;
    int r = cfg->roles[l].ratio;
    int slot = engine_seq_source_slot(seq, l);
    engine_kv_table_t *t = &seq->tables[slot];
    int64_t d = cfg->head_dim, dI = cfg->index_head_dim;
    int64_t n_new = 0;
    int64_t first_row = -1;
    float *V = fwd_alloc(fwd, FLOAT_BYTES((seg->n / r + 1) * d));
    float *ab = fwd_alloc(fwd, FLOAT_BYTES(4 * d)); /* one group: a_even, a_odd, b_even, b_odd */
    float *main_rows;
    float *kI;
    int64_t *rpos;
    int64_t *rpos_host;
    uint8_t *hdr;
    uint8_t *mc, *ms, *ic, *is;
    tdm_status_t st = TDM_OK;
    float *pa = seq->pend_a + (int64_t)slot * d;
    float *pb = seq->pend_b + (int64_t)slot * d;

    if (V == NULL || ab == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    for (int64_t i = 0; i < seg->n; i++) {
        int64_t p = seg->pos0 + i;
        int64_t row = seg->row0 + i;
        if (r == 1) {
            st = fwd_copy(fwd, V + n_new * d, a + row * d, FLOAT_BYTES(d));
        } else if (p % 2 == 0) {
            st = fwd_copy(fwd, pa, a + row * d, FLOAT_BYTES(d));
            if (st == TDM_OK) {
                st = fwd_copy(fwd, pb, bg + row * d, FLOAT_BYTES(d));
            }
            if (st != TDM_OK) {
                return st;
            }
            seq->has_pend[slot] = 1;
            st = engine_seq_keep_pending(seq, slot, p); /* verify scratch (MODEL.md 7, 8) */
            if (st != TDM_OK) {
                return st;
            }
            continue;
        } else {
            if (!seq->has_pend[slot]) {
                tdm_log(TDM_LOG_ERROR, "engine",
                        "ratio-2 group without its first half: layer=%d pos=%lld", l, (long long)p);
                return TDM_ERR_INTERNAL;
            }
            st = fwd_copy(fwd, ab, pa, FLOAT_BYTES(d));
            if (st == TDM_OK) {
                st = fwd_copy(fwd, ab + d, a + row * d, FLOAT_BYTES(d));
            }
            if (st == TDM_OK) {
                st = fwd_copy(fwd, ab + 2 * d, pb, FLOAT_BYTES(d));
            }
            if (st == TDM_OK) {
                st = fwd_copy(fwd, ab + 3 * d, bg + row * d, FLOAT_BYTES(d));
            }
            if (st == TDM_OK) {
                st = fwd->ops->compress_pool(&fwd->kctx, ab, ab + 2 * d, 2, d, V + n_new * d);
            }
            if (st == TDM_OK) {
                seq->has_pend[slot] = 0;
            }
        }
        if (st != TDM_OK) {
            return st;
        }
        if (first_row < 0) {
            first_row = p / r;
        }
        n_new++;
    }
    if (n_new == 0) {
        return TDM_OK;
    }
    main_rows = fwd_alloc(fwd, FLOAT_BYTES(n_new * d));
    kI = fwd_alloc(fwd, FLOAT_BYTES(n_new * dI));
    rpos = fwd_alloc(fwd, (size_t)n_new * sizeof(int64_t));
    rpos_host = fwd_host_alloc(fwd, (size_t)n_new * sizeof(int64_t));
    hdr = fwd_host_alloc(fwd, KERN_KV_PAGE_HEADER_BYTES);
    mc = fwd_alloc(fwd, (size_t)(n_new * d / 2));
    ms = fwd_alloc(fwd, (size_t)(n_new * d / 16));
    ic = fwd_alloc(fwd, (size_t)(n_new * dI / 2));
    is = fwd_alloc(fwd, (size_t)(n_new * dI / 32));
    if (main_rows == NULL || kI == NULL || rpos == NULL || rpos_host == NULL || hdr == NULL ||
        mc == NULL || ms == NULL || ic == NULL || is == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    for (int64_t k = 0; k < n_new; k++) {
        rpos_host[k] = (first_row + k) * r;
    }
    st = fwd_to_backend(fwd, rpos, rpos_host, (size_t)n_new * sizeof(int64_t));
    /* latent c = BF16(RMSNorm(BF16(v))) (v already BF16) */
    if (st == TDM_OK) {
        st = fwd->ops->rmsnorm(&fwd->kctx, V, d, n_new, d, lw->c_norm, (float)cfg->rms_norm_eps, V,
                               d);
    }
    if (st == TDM_OK) {
        st = fwd_copy(fwd, main_rows, V, FLOAT_BYTES(n_new * d));
    }
    if (st == TDM_OK) {
        st = fwd->ops->rope(&fwd->kctx, main_rows, n_new, 1, d, (int)cfg->qk_rope_head_dim, rpos,
                            fwd->model->rope_freqs[l], KERN_ROPE_FORWARD);
    }
    if (st == TDM_OK) {
        st = fwd->ops->quant_ckv(&fwd->kctx, main_rows, n_new, d, mc, ms);
    }
    if (st == TDM_OK) {
        st = fwd_gemm(fwd, &lw->i_wk, V, d, n_new, KERN_GEMM_OUT_BF16, kI, dI);
    }
    if (st == TDM_OK) {
        st = fwd->ops->rmsnorm(&fwd->kctx, kI, dI, n_new, dI, lw->i_k_norm,
                               (float)cfg->rms_norm_eps, kI, dI);
    }
    if (st == TDM_OK) {
        st = fwd->ops->rope(&fwd->kctx, kI, n_new, 1, dI, (int)cfg->qk_rope_head_dim, rpos,
                            fwd->model->rope_freqs[l], KERN_ROPE_FORWARD);
    }
    if (st == TDM_OK) {
        st = fwd->ops->quant_mx4(&fwd->kctx, kI, n_new, dI, ic, is);
    }
    /* the rows into their pages: one run of slots per page */
    for (int64_t k = 0, run; k < n_new && st == TDM_OK; k += run) {
        int64_t j = first_row + k;
        uint32_t pslot;
        uint8_t *page = engine_kv_table_row_page_mut(fwd->pool, t, j, &pslot);
        if (page == NULL || j != t->n_rows) {
            tdm_log(TDM_LOG_ERROR, "engine",
                    "compressed row out of order: layer=%d row=%lld have=%lld", l, (long long)j,
                    (long long)t->n_rows);
            return TDM_ERR_INTERNAL;
        }
        run = KERN_KV_PAGE_ROWS - (int64_t)pslot;
        run = run < n_new - k ? run : n_new - k;
        st = page_write_rows(fwd, &g->ly, page, pslot, run, mc + k * d / 2, ms + k * d / 16,
                             ic + k * dI / 2, is + k * dI / 32, hdr);
        if (st == TDM_OK) {
            t->n_rows = j + run;
        }
    }
    return st;
}

/* Replay: keep the session's pending half, or rebuild it for odd H (MODEL.md 6(d)). */
static tdm_status_t replay_pending(engine_fwd_t *fwd, const fwd_seg_t *seg, int l, const float *a,
                                   const float *bg)
{
    engine_seq_t *seq = seg->seq;
    int slot = engine_seq_source_slot(seq, l);
    int64_t d = fwd->cfg->head_dim;
    int64_t H = seg->pos0 + seg->n;
    tdm_status_t st;

    if (fwd->cfg->roles[l].ratio != 2 || H % 2 == 0 || seq->has_pend[slot]) {
        return TDM_OK;
    }
    st = fwd_copy(fwd, seq->pend_a + (int64_t)slot * d, a + (seg->row0 + seg->n - 1) * d,
                  FLOAT_BYTES(d));
    if (st == TDM_OK) {
        st = fwd_copy(fwd, seq->pend_b + (int64_t)slot * d, bg + (seg->row0 + seg->n - 1) * d,
                      FLOAT_BYTES(d));
    }
    if (st == TDM_OK) {
        seq->has_pend[slot] = 1;
    }
    return st;
}

/* sel [n_sel] (distinct values in [0, n_vis)) into ascending order through a bitmap
 * bits [(n_vis + 31) / 32]; host memory. */
static void sort_sel_ascending(int32_t *sel, int64_t n_sel, int64_t n_vis, uint32_t *bits)
{
    int64_t n_words = (n_vis + 31) / 32, o = 0;
    memset(bits, 0, (size_t)n_words * sizeof(uint32_t));
    for (int64_t i = 0; i < n_sel; i++) {
        bits[sel[i] >> 5] |= 1u << (sel[i] & 31);
    }
    for (int64_t w = 0; w < n_words; w++) {
        for (uint32_t x = bits[w]; x != 0; x &= x - 1) {
            sel[o++] = (int32_t)(w * 32 + __builtin_ctz(x));
        }
    }
}

/* Visible compressed rows of table tab at layer l for position t: n_c(l, t) capped by the rows
 * the table holds. */
static int64_t row_n_vis(const engine_config_t *cfg, int l, int64_t t, const engine_kv_table_t *tab)
{
    int64_t n = engine_config_n_c(cfg, l, t);
    return n < tab->n_rows ? n : tab->n_rows;
}

/* The table layer l's compressed rows come from, in seg's sequence. */
static const engine_kv_table_t *seg_table(const engine_config_t *cfg, const fwd_seg_t *seg, int l)
{
    return &seg->seq->tables[engine_seq_source_slot(seg->seq, cfg->roles[l].kv_src)];
}

/*
 * Selections S(t) of index-source layer l for every row of the batch (MODEL.md 5.4), in two
 * passes so that a GPU waits once per layer instead of once or twice per query row:
 *   1. on the backend, row after row (segment by segment, each segment's index keys loaded once):
 *      the index scores, a candidate source's block maxima and pool top-k (b->pool) or a
 *      consumer's pool mask (its pool size from b->n_pool_h), and the index top-k; every row's
 *      counts and indices land in one backend array, copied to the host in one D2H copy;
 *   2. on the host: each row's selection -1 padded and sorted ascending into b->sel_h[ord] (the
 *      identity selection where n_vis <= k_I, no scores needed), a source's pool sizes into
 *      b->n_pool_h, then one H2D copy of all rows into b->sel[ord].
 * Each row's ops and their order are those of a row on its own, so the bits do not change.
 * The host bookkeeping (padding, order, pool sizes) is docs/NUMERICS.md 7 item 5.
 */
static tdm_status_t select_rows(engine_fwd_t *fwd, fwd_batch_t *b, int l, const page_geom_t *g,
                                const float *qI, const float *w)
{
    const engine_config_t *cfg = fwd->cfg;
    const engine_layer_role_t *role = &cfg->roles[l];
    int64_t N = b->N, kI = cfg->index_topk, HI = cfg->index_n_heads, dI = cfg->index_head_dim;
    int64_t Bc = cfg->candidate_block_size, nB = cfg->candidate_topk_blocks;
    int is_source = (role->flags & ENGINE_ROLE_CANDIDATE_SOURCE) != 0;
    int is_consumer = (role->flags & ENGINE_ROLE_CANDIDATE_CONSUMER) != 0;
    int ord = fwd_index_ordinal(fwd, l);
    /* per row, in int64 words: the top-k count, the pool count, then k_I int32 indices */
    int64_t stride = 2 + (kI + 1) / 2;
    int64_t n_vis_most = 0;
    int any_scored = 0;
    int64_t *tk_dev, *tk_h;
    float *scores = NULL;
    int32_t *iscratch = NULL;
    uint32_t *bits = NULL;
    tdm_status_t st = TDM_OK;

    for (int s = 0; s < b->n_segs; s++) {
        const fwd_seg_t *seg = &b->segs[s];
        int64_t n = row_n_vis(cfg, l, seg->pos0 + seg->n - 1, seg_table(cfg, seg, l));
        n_vis_most = n > n_vis_most ? n : n_vis_most;
    }
    tk_dev = fwd_alloc(fwd, (size_t)(N * stride) * sizeof(int64_t));
    tk_h = fwd_host_alloc(fwd, (size_t)(N * stride) * sizeof(int64_t));
    if (n_vis_most > kI) {
        scores = fwd_alloc(fwd, FLOAT_BYTES(2 * n_vis_most + 16) + (size_t)n_vis_most + 64);
        iscratch = fwd_alloc(fwd, (size_t)(n_vis_most + 1) * sizeof(int32_t));
        bits = fwd_host_alloc(fwd, (size_t)((n_vis_most + 31) / 32) * sizeof(uint32_t));
    }
    if (ord < 0 || tk_dev == NULL || tk_h == NULL ||
        (n_vis_most > kI && (scores == NULL || iscratch == NULL || bits == NULL))) {
        return ord < 0 ? TDM_ERR_INTERNAL : TDM_ERR_NO_MEMORY;
    }
    /* 1: every scored row's ops on the backend, no copy to the host between them */
    for (int s = 0; s < b->n_segs && st == TDM_OK; s++) {
        const fwd_seg_t *seg = &b->segs[s];
        const engine_kv_table_t *tab = seg_table(cfg, seg, l);
        int64_t n_vis_max = row_n_vis(cfg, l, seg->pos0 + seg->n - 1, tab);
        if (n_vis_max <= kI) {
            continue; /* every row of the segment takes the identity selection */
        }
        st = load_index_keys(fwd, g, tab, n_vis_max);
        for (int64_t i = 0; i < seg->n && st == TDM_OK; i++) {
            int64_t row = seg->row0 + i;
            int64_t n_vis = row_n_vis(cfg, l, seg->pos0 + i, tab);
            int64_t *slot = tk_dev + row * stride;
            if (n_vis <= kI) {
                continue;
            }
            any_scored = 1;
            fwd->attn_flops += index_row_flops(HI, dI, n_vis);
            st = fwd->ops->index_scores(&fwd->kctx, qI + row * HI * dI, w + row * HI, HI, dI,
                                        fwd->ikey_cache, n_vis, scores);
            if (st == TDM_OK && is_source) {
                int64_t nb = (n_vis + Bc - 1) / Bc;
                float *beta = scores + n_vis; /* scratch after the scores */
                st = fwd->ops->cand_blocks(&fwd->kctx, scores, n_vis, Bc, beta);
                if (st == TDM_OK) {
                    st = fwd->ops->topk(&fwd->kctx, beta, nb, nB < nb ? nB : nb, iscratch,
                                        b->pool + row * nB, slot + 1);
                }
            } else if (st == TDM_OK && is_consumer && b->n_pool_h[row] >= 0) {
                st = fwd->ops->cand_mask(&fwd->kctx, scores, n_vis, Bc, b->pool + row * nB,
                                         b->n_pool_h[row]);
            }
            if (st == TDM_OK) {
                st = fwd->ops->topk(&fwd->kctx, scores, n_vis, kI, iscratch, (int32_t *)(slot + 2),
                                    slot);
                if (st == TDM_ERR_INTERNAL) {
                    tdm_log(TDM_LOG_ERROR, "engine", "nan reached the index top-k: layer=%d", l);
                }
            }
        }
    }
    /* the one wait of the layer: every row's counts and indices */
    if (st == TDM_OK && any_scored) {
        st = fwd_to_host(fwd, tk_h, tk_dev, (size_t)(N * stride) * sizeof(int64_t));
    }
    /* 2: the host's part, row by row, then one copy of every row's selection */
    for (int s = 0; s < b->n_segs && st == TDM_OK; s++) {
        const fwd_seg_t *seg = &b->segs[s];
        const engine_kv_table_t *tab = seg_table(cfg, seg, l);
        for (int64_t i = 0; i < seg->n && st == TDM_OK; i++) {
            int64_t row = seg->row0 + i;
            int64_t n_vis = row_n_vis(cfg, l, seg->pos0 + i, tab);
            const int64_t *slot = tk_h + row * stride;
            int32_t *hs = b->sel_h[ord] + row * kI;
            int64_t n_sel;
            if (n_vis <= kI) { /* identity: every visible row, no pool */
                for (int64_t k = 0; k < kI; k++) {
                    hs[k] = k < n_vis ? (int32_t)k : -1;
                }
                if (is_source) {
                    b->n_pool_h[row] = -1;
                }
                continue;
            }
            n_sel = slot[0];
            if (n_sel < 0 || n_sel > kI || (is_source && (slot[1] < 0 || slot[1] > nB))) {
                tdm_log(TDM_LOG_ERROR, "engine",
                        "index top-k count out of range: layer=%d row=%lld", l, (long long)row);
                st = TDM_ERR_INTERNAL;
                break;
            }
            memcpy(hs, slot + 2, (size_t)n_sel * sizeof(int32_t));
            for (int64_t k = 0; k < n_sel && st == TDM_OK; k++) {
                if (hs[k] < 0 || hs[k] >= n_vis) { /* the bitmap below holds [0, n_vis) */
                    tdm_log(TDM_LOG_ERROR, "engine",
                            "index top-k result out of range: layer=%d row=%lld index=%d", l,
                            (long long)row, (int)hs[k]);
                    st = TDM_ERR_INTERNAL;
                }
            }
            if (st != TDM_OK) {
                break;
            }
            for (int64_t k = n_sel; k < kI; k++) {
                hs[k] = -1;
            }
            sort_sel_ascending(hs, n_sel, n_vis, bits);
            if (is_source) {
                b->n_pool_h[row] = (int32_t)slot[1];
            }
        }
    }
    if (st == TDM_OK) {
        st = fwd_to_backend(fwd, b->sel[ord], b->sel_h[ord], (size_t)(N * kI) * sizeof(int32_t));
    }
    return st;
}

/* Selected rows of a selection row hs [k_I] (ascending, -1 padded: they come first). */
static int64_t sel_count(const int32_t *hs, int64_t kI)
{
    int64_t n = 0;
    while (n < kI && hs[n] >= 0) {
        n++;
    }
    return n;
}

/* A segment's attention window in backend memory: positions [wstart, pos0) from its ring
 * (n_ring of them), then the batch's new rows of the segment; gathered: 1 when its rows' selected
 * rows are gathered by groups (fwd_attention pass 2). */
typedef struct {
    float *win;
    int64_t wstart;
    int64_t n_ring;
    int gathered;
} seg_win_t;

/*
 * Every segment's window at layer l (MODEL.md 5.2; a draft: every ring entry before pos0 and all
 * block rows) into sw[s], in one gather: the ring entries of [wstart, pos0) and the batch's new
 * Q_act8 rows kc [N, d] / ks [N, d / 32] (whose dequantized values are the k-hat rows the
 * attention would copy: the same codec, the same bits) as row pointers built on the host, one
 * copy to the backend and one dequant_rows, instead of up to two dequantizations and one copy
 * per segment (docs/NUMERICS.md 7 item 4).
 */
static tdm_status_t batch_windows(engine_fwd_t *fwd, const fwd_batch_t *b, int l, const uint8_t *kc,
                                  const uint8_t *ks, seg_win_t *sw)
{
    int64_t W = fwd->cfg->sliding_window, d = fwd->cfg->head_dim;
    int64_t total = 0, off = 0;
    const uint8_t **ptrs_h, **ptrs_d;
    float *win;
    tdm_status_t st;

    for (int s = 0; s < b->n_segs; s++) {
        const fwd_seg_t *seg = &b->segs[s];
        int64_t wstart = seg->draft ? seg->pos0 - W : seg->pos0 - W + 1;
        wstart = wstart < seg->lo ? seg->lo : wstart;
        wstart = wstart < 0 ? 0 : wstart;
        sw[s].wstart = wstart;
        sw[s].n_ring = seg->pos0 - wstart;
        total += sw[s].n_ring + seg->n;
    }
    win = fwd_alloc(fwd, FLOAT_BYTES(total * d));
    ptrs_h = fwd_host_alloc(fwd, (size_t)(2 * total) * sizeof(*ptrs_h));
    ptrs_d = fwd_alloc(fwd, (size_t)(2 * total) * sizeof(*ptrs_d));
    if (win == NULL || ptrs_h == NULL || ptrs_d == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    for (int s = 0; s < b->n_segs; s++) {
        const fwd_seg_t *seg = &b->segs[s];
        sw[s].win = win + off * d;
        fwd->read_kv_bytes += (uint64_t)(sw[s].n_ring * (d + d / 32));
        for (int64_t p = sw[s].wstart; p < seg->pos0; p++, off++) {
            ptrs_h[off] = engine_seq_ring_codes_at(seg->seq, l, p);
            ptrs_h[total + off] = engine_seq_ring_scales_at(seg->seq, l, p);
        }
        for (int64_t i = 0; i < seg->n; i++, off++) {
            ptrs_h[off] = kc + (seg->row0 + i) * d;
            ptrs_h[total + off] = ks + (seg->row0 + i) * (d / 32);
        }
    }
    st = fwd_to_backend(fwd, ptrs_d, ptrs_h, (size_t)(2 * total) * sizeof(*ptrs_d));
    if (st == TDM_OK) {
        st = fwd->ops->dequant_rows(&fwd->kctx, KERN_ROWS_ACT8, ptrs_d, ptrs_d + total, total, d,
                                    win);
    }
    return st;
}

/* The keys of segment row i in its window sw: *ws_out (a position), returns their count. */
static int64_t row_keys(const fwd_seg_t *seg, const seg_win_t *sw, int64_t W, int64_t i,
                        int64_t *ws_out)
{
    int64_t t = seg->pos0 + i;
    int64_t ws = t - W + 1 < sw->wstart ? sw->wstart : t - W + 1;

    if (seg->draft) { /* every ring entry and all block tokens (non-causal) */
        *ws_out = sw->wstart;
        return sw->n_ring + seg->n;
    }
    *ws_out = ws;
    return t - ws + 1;
}

/* Up to FWD_SEL_GROUP query rows whose selected rows are gathered together: row, segment,
 * first selected row in the group and count per query row; the group's row pointers (host:
 * codes [2 * FWD_SEL_GROUP * k_I], the scales packed after the codes at send time). */
typedef struct {
    int64_t row[FWD_SEL_GROUP];
    int seg[FWD_SEL_GROUP];
    int64_t off[FWD_SEL_GROUP];
    int64_t n_b[FWD_SEL_GROUP];
    int n_rows;
    int64_t n_sel_rows;
    const uint8_t **codes;
    const uint8_t **scales;
    kern_attn_row_t *desc;     /* host: the rows' attention descriptors [FWD_SEL_GROUP] */
    kern_attn_row_t *desc_dev; /* backend: their copy, what ops->attention_rows reads */
} sel_group_t;

/* The group's selected rows in one copy of their pointers and one dequant_rows into sel_rows,
 * then the query rows' attention over their windows and their rows: one ops->attention_rows call
 * over the group's descriptors (one copy of them) where the table has it and the group has more
 * than one row, else one ops->attention call per row (the same bits); empties the group. */
static tdm_status_t attend_group(engine_fwd_t *fwd, const fwd_batch_t *b, sel_group_t *grp,
                                 const seg_win_t *sw, const float *q, const uint8_t **sel_ptrs,
                                 float *sel_rows, float *att_scratch, int l, float *o)
{
    const engine_config_t *cfg = fwd->cfg;
    int64_t d = cfg->head_dim, nh = cfg->num_attention_heads, W = cfg->sliding_window;
    int64_t n = grp->n_sel_rows;
    tdm_status_t st = TDM_OK;

    if (n > 0) {
        memcpy(grp->codes + n, grp->scales, (size_t)n * sizeof(*grp->codes));
        st = fwd_to_backend(fwd, sel_ptrs, grp->codes, (size_t)(2 * n) * sizeof(*sel_ptrs));
        if (st == TDM_OK) {
            st = fwd->ops->dequant_rows(&fwd->kctx, KERN_ROWS_CKV, sel_ptrs, sel_ptrs + n, n, d,
                                        sel_rows);
        }
    }
    int batched = st == TDM_OK && fwd->ops->attention_rows != NULL && grp->n_rows > 1;
    for (int k = 0; k < grp->n_rows && st == TDM_OK; k++) {
        const fwd_seg_t *seg = &b->segs[grp->seg[k]];
        const seg_win_t *w = &sw[grp->seg[k]];
        int64_t row = grp->row[k], ws;
        int64_t n_keys = row_keys(seg, w, W, row - seg->row0, &ws);
        grp->desc[k] = (kern_attn_row_t){q + row * nh * d,
                                         w->win + (ws - w->wstart) * d,
                                         sel_rows + grp->off[k] * d,
                                         o + row * nh * d,
                                         n_keys,
                                         grp->n_b[k]};
        batched = batched && n_keys + grp->n_b[k] <= KERN_ATTENTION_ROWS_MAX_KEYS;
        fwd->attn_flops += attn_row_flops(nh, d, n_keys + grp->n_b[k]);
    }
    if (batched) {
        st =
            fwd_to_backend(fwd, grp->desc_dev, grp->desc, (size_t)grp->n_rows * sizeof(*grp->desc));
        if (st == TDM_OK) {
            st = fwd->ops->attention_rows(&fwd->kctx, grp->desc_dev, grp->n_rows,
                                          fwd->model->layers[l].attn_sink, nh, d,
                                          (float)(1.0 / sqrt((double)d)), att_scratch);
        }
    }
    for (int k = 0; k < grp->n_rows && st == TDM_OK && !batched; k++) {
        const kern_attn_row_t *r = &grp->desc[k];
        st = fwd->ops->attention(&fwd->kctx, r->q, r->keys_a, r->n_a, r->keys_b, r->n_b,
                                 fwd->model->layers[l].attn_sink, nh, d,
                                 (float)(1.0 / sqrt((double)d)), att_scratch, r->o);
    }
    grp->n_rows = 0;
    grp->n_sel_rows = 0;
    return st;
}

tdm_status_t fwd_attention(engine_fwd_t *fwd, fwd_batch_t *b, int l, const float *xn,
                           int32_t *sel_used, float *out)
{
    const engine_config_t *cfg = fwd->cfg;
    const engine_layer_weights_t *lw = &fwd->model->layers[l];
    const engine_layer_role_t *role = &cfg->roles[l];
    const float eps = (float)cfg->rms_norm_eps;
    int64_t N = b->N, H = cfg->hidden_size, d = cfg->head_dim, nh = cfg->num_attention_heads;
    int64_t rq = cfg->q_lora_rank, G = cfg->o_groups, ro = cfg->o_lora_rank;
    int64_t HI = cfg->index_n_heads, dI = cfg->index_head_dim, kI = cfg->index_topk;
    int64_t W = cfg->sliding_window;
    int dr = (int)cfg->qk_rope_head_dim;
    const float *freqs = fwd->model->rope_freqs[l];
    page_geom_t g;
    tdm_status_t st;
    int64_t *pos = fwd_alloc(fwd, (size_t)N * sizeof(int64_t));
    int64_t *pos_host = fwd_host_alloc(fwd, (size_t)N * sizeof(int64_t));
    float *xq = fwd_alloc(fwd, FLOAT_BYTES(N * H));
    float *qr = fwd_alloc(fwd, FLOAT_BYTES(N * rq));
    float *qrq = fwd_alloc(fwd, FLOAT_BYTES(N * rq));
    float *q = fwd_alloc(fwd, FLOAT_BYTES(N * nh * d));
    float *kv = fwd_alloc(fwd, FLOAT_BYTES(N * d));
    uint8_t *kc = fwd_alloc(fwd, (size_t)(N * d));
    uint8_t *ks = fwd_alloc(fwd, (size_t)(N * d / 32));
    float *o = fwd_alloc(fwd, FLOAT_BYTES(N * nh * d));
    float *oa = fwd_alloc(fwd, FLOAT_BYTES(N * G * ro));
    /* the selected rows of up to FWD_SEL_GROUP query rows, and their codes then scales
     * pointers (dequant_rows: backend memory) */
    float *sel_rows = fwd_alloc(fwd, FLOAT_BYTES(FWD_SEL_GROUP * kI * d));
    const uint8_t **sel_ptrs = fwd_alloc(fwd, (size_t)(2 * FWD_SEL_GROUP * kI) * sizeof(*sel_ptrs));
    float *att_scratch = fwd_alloc(fwd, FLOAT_BYTES(nh * (W + cfg->dspark_block_size + kI + 16)));
    float *qI = NULL;
    float *wI = NULL;

    if (pos == NULL || pos_host == NULL || xq == NULL || qr == NULL || qrq == NULL || q == NULL ||
        kv == NULL || kc == NULL || ks == NULL || o == NULL || oa == NULL || sel_rows == NULL ||
        sel_ptrs == NULL || att_scratch == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    st = page_geom(cfg, &g);
    if (st != TDM_OK) {
        return st;
    }
    for (int64_t r = 0; r < N; r++) {
        pos_host[r] = row_pos(b, r, NULL);
    }
    /* q and window KV (5.2, 12.3) */
    st = fwd_to_backend(fwd, pos, pos_host, (size_t)N * sizeof(int64_t));
    if (st == TDM_OK) {
        st = fwd->ops->qdq_act8(&fwd->kctx, xn, N, H, xq);
    }
    if (st == TDM_OK) {
        st = fwd_gemm(fwd, &lw->wq_a, xq, H, N, KERN_GEMM_OUT_BF16, qr, rq);
    }
    if (st == TDM_OK) {
        st = fwd->ops->rmsnorm(&fwd->kctx, qr, rq, N, rq, lw->q_norm, eps, qr, rq);
    }
    if (st == TDM_OK) {
        st = fwd->ops->qdq_act8(&fwd->kctx, qr, N, rq, qrq);
    }
    if (st == TDM_OK) {
        st = fwd_gemm(fwd, &lw->wq_b, qrq, rq, N, KERN_GEMM_OUT_BF16, q, nh * d);
    }
    if (st == TDM_OK) {
        st = fwd->ops->rope(&fwd->kctx, q, N, nh, d, dr, pos, freqs, KERN_ROPE_FORWARD);
    }
    if (st == TDM_OK) {
        st = fwd_gemm(fwd, &lw->wkv, xq, H, N, KERN_GEMM_OUT_BF16, kv, d);
    }
    if (st == TDM_OK) {
        st = fwd->ops->rmsnorm(&fwd->kctx, kv, d, N, d, lw->kv_norm, eps, kv, d);
    }
    if (st == TDM_OK) {
        st = fwd->ops->rope(&fwd->kctx, kv, N, 1, d, dr, pos, freqs, KERN_ROPE_FORWARD);
    }
    if (st == TDM_OK) {
        st = fwd->ops->quant_act8(&fwd->kctx, kv, N, d, kc, ks);
    }
    if (st != TDM_OK) {
        return st;
    }

    /* compressor (5.3) */
    if ((role->flags & ENGINE_ROLE_KV_SOURCE) != 0) {
        float *ca = fwd_alloc(fwd, FLOAT_BYTES(N * d));
        float *cb = role->ratio == 2 ? fwd_alloc(fwd, FLOAT_BYTES(N * d)) : NULL;
        if (ca == NULL || (role->ratio == 2 && cb == NULL)) {
            return TDM_ERR_NO_MEMORY;
        }
        st = fwd_gemm(fwd, &lw->c_wkv, xn, H, N,
                      role->ratio == 2 ? KERN_GEMM_OUT_F32 : KERN_GEMM_OUT_BF16, ca, d);
        if (st == TDM_OK && cb != NULL) {
            st = fwd_gemm(fwd, &lw->c_wgate, xn, H, N, KERN_GEMM_OUT_F32, cb, d);
        }
        for (int s = 0; s < b->n_segs && st == TDM_OK; s++) {
            if (b->segs[s].write_rows) {
                st = compress_segment(fwd, &b->segs[s], l, ca, cb, &g);
            } else if (cb != NULL) {
                st = replay_pending(fwd, &b->segs[s], l, ca, cb);
            }
        }
        if (st != TDM_OK) {
            return st;
        }
    }

    /* index query and weights (5.4) */
    if ((role->flags & ENGINE_ROLE_INDEX_SOURCE) != 0) {
        uint8_t *icodes = fwd_alloc(fwd, (size_t)(N * HI * dI / 2));
        uint8_t *iscales = fwd_alloc(fwd, (size_t)(N * HI * dI / 32));
        float sc_d = (float)pow((double)dI, -0.5);
        float sc_h = (float)pow((double)HI, -0.5);
        qI = fwd_alloc(fwd, FLOAT_BYTES(N * HI * dI));
        wI = fwd_alloc(fwd, FLOAT_BYTES(N * HI));
        if (qI == NULL || wI == NULL || icodes == NULL || iscales == NULL) {
            return TDM_ERR_NO_MEMORY;
        }
        st = fwd_gemm(fwd, &lw->i_wq_b, qrq, rq, N, KERN_GEMM_OUT_BF16, qI, HI * dI);
        if (st == TDM_OK) {
            st = fwd->ops->rope(&fwd->kctx, qI, N, HI, dI, dr, pos, freqs, KERN_ROPE_FORWARD);
        }
        if (st == TDM_OK) {
            st = fwd->ops->quant_mx4(&fwd->kctx, qI, N * HI, dI, icodes, iscales);
        }
        if (st == TDM_OK) {
            st = fwd->ops->dequant_mx4(&fwd->kctx, icodes, iscales, N * HI, dI, qI);
        }
        if (st == TDM_OK) {
            st = fwd_gemm(fwd, &lw->i_wp, xn, H, N, KERN_GEMM_OUT_BF16, wI, HI);
        }
        if (st == TDM_OK) {
            st = fwd->ops->scale2(&fwd->kctx, wI, N * HI, sc_d, sc_h);
        }
        if (st != TDM_OK) {
            return st;
        }
    }

    /* the selections this layer attends with: its own (an index source: every row's, one
     * wait), else its index source's (kept on the host since then); sel_used for the dumps and
     * attention_sel, in one copy */
    const int32_t *sel_h = NULL;
    seg_win_t *sw = fwd_host_alloc(fwd, (size_t)b->n_segs * sizeof(*sw));
    sel_group_t grp;
    grp.codes = fwd_host_alloc(fwd, (size_t)(2 * FWD_SEL_GROUP * kI) * sizeof(*grp.codes));
    grp.scales = fwd_host_alloc(fwd, (size_t)(FWD_SEL_GROUP * kI) * sizeof(*grp.scales));
    grp.desc = fwd_host_alloc(fwd, FWD_SEL_GROUP * sizeof(*grp.desc));
    grp.desc_dev = fwd_alloc(fwd, FWD_SEL_GROUP * sizeof(*grp.desc_dev));
    grp.n_rows = 0;
    grp.n_sel_rows = 0;
    if (sw == NULL || grp.codes == NULL || grp.scales == NULL || grp.desc == NULL ||
        grp.desc_dev == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    if (role->ratio == 0) { /* no compressed rows: selections all -1 */
        st = fwd->ops->mem_set(&fwd->kctx, sel_used, 0xff, (size_t)(N * kI) * sizeof(int32_t));
    } else {
        int ord = fwd_index_ordinal(
            fwd, (role->flags & ENGINE_ROLE_INDEX_SOURCE) != 0 ? l : (int)role->idx_src);
        if (ord < 0) {
            return TDM_ERR_INTERNAL;
        }
        if ((role->flags & ENGINE_ROLE_INDEX_SOURCE) != 0) {
            st = select_rows(fwd, b, l, &g, qI, wI);
        }
        if (st == TDM_OK) {
            st = fwd_copy(fwd, sel_used, b->sel[ord], (size_t)(N * kI) * sizeof(int32_t));
        }
        sel_h = b->sel_h[ord];
    }
    if (st != TDM_OK) {
        return st;
    }

    /* every segment's window, one gather */
    st = batch_windows(fwd, b, l, kc, ks, sw);
    /* 1: the rows of a prefill segment that attends in place (attention_sel), one by one */
    for (int s = 0; s < b->n_segs && st == TDM_OK; s++) {
        const fwd_seg_t *seg = &b->segs[s];
        const engine_kv_table_t *tab = role->ratio > 0 ? seg_table(cfg, seg, l) : NULL;
        int64_t n_ckv = 0;

        /* A prefill chunk whose queries together would dequantize more selected rows than the
         * table's visible rows: dequantize those once and attend to them in place. */
        if (role->ratio > 0 && fwd->ops->attention_sel != NULL && seg->n > 1 && st == TDM_OK) {
            int64_t n_c = row_n_vis(cfg, l, seg->pos0 + seg->n - 1, tab);
            if (n_c > 0 && n_c <= seg->n * kI) {
                st = load_main_rows(fwd, &g, tab, n_c);
                n_ckv = n_c;
            }
        }
        sw[s].gathered = n_ckv == 0; /* ratio 0 too: window-only rows go by groups */
        for (int64_t i = 0; i < seg->n && st == TDM_OK && !sw[s].gathered; i++) {
            int64_t row = seg->row0 + i, ws, n_keys = row_keys(seg, &sw[s], W, i, &ws);
            const int32_t *hs = sel_h + row * kI; /* n_ckv > 0: a compressed layer */
            int64_t n_b = sel_count(hs, kI);
            if (n_b > 0 && hs[n_b - 1] >= n_ckv) {
                int64_t k = 0;
                while (hs[k] < n_ckv) {
                    k++;
                }
                tdm_log(TDM_LOG_ERROR, "engine",
                        "selected row past the visible rows: layer=%d row=%d visible=%lld", l,
                        (int)hs[k], (long long)n_ckv);
                return TDM_ERR_INTERNAL;
            }
            fwd->read_kv_bytes +=
                (uint64_t)n_b * (uint64_t)(g.ly.main_codes_row_bytes + g.ly.main_scales_row_bytes);
            fwd->attn_flops += attn_row_flops(nh, d, n_keys + n_b);
            st = fwd->ops->attention_sel(
                &fwd->kctx, q + row * nh * d, sw[s].win + (ws - sw[s].wstart) * d, n_keys,
                fwd->ckv_cache, sel_used + row * kI, n_b, lw->attn_sink, nh, d,
                (float)(1.0 / sqrt((double)d)), att_scratch, o + row * nh * d);
        }
    }
    /* 2: the other rows, FWD_SEL_GROUP at a time: their selected rows' pointers (none in a
     * layer without compressed rows) built on the host from the block tables, one copy and one
     * gather per group (docs/NUMERICS.md 7 item 4), then the group's attention (attend_group) */
    for (int s = 0; s < b->n_segs && st == TDM_OK; s++) {
        const fwd_seg_t *seg = &b->segs[s];
        const engine_kv_table_t *tab = role->ratio > 0 ? seg_table(cfg, seg, l) : NULL;
        for (int64_t i = 0; i < seg->n && st == TDM_OK && sw[s].gathered; i++) {
            int64_t row = seg->row0 + i;
            const int32_t *hs = role->ratio > 0 ? sel_h + row * kI : NULL;
            int64_t n_b = hs != NULL ? sel_count(hs, kI) : 0, off = grp.n_sel_rows;
            for (int64_t k = 0; k < n_b && st == TDM_OK; k++) {
                st = main_row_at(fwd, &g, tab, hs[k], &grp.codes[off + k], &grp.scales[off + k]);
            }
            grp.row[grp.n_rows] = row;
            grp.seg[grp.n_rows] = s;
            grp.off[grp.n_rows] = off;
            grp.n_b[grp.n_rows++] = n_b;
            grp.n_sel_rows += n_b;
            if (st == TDM_OK && grp.n_rows == FWD_SEL_GROUP) {
                st = attend_group(fwd, b, &grp, sw, q, sel_ptrs, sel_rows, att_scratch, l, o);
            }
        }
    }
    if (st == TDM_OK && grp.n_rows > 0) {
        st = attend_group(fwd, b, &grp, sw, q, sel_ptrs, sel_rows, att_scratch, l, o);
    }
    if (st != TDM_OK) {
        return st;
    }

    /* inverse RoPE, grouped wo_a (BF16 operands), Q_act8, wo_b */
    st = fwd->ops->rope(&fwd->kctx, o, N, nh, d, dr, pos, freqs, KERN_ROPE_INVERSE);
    for (int64_t gi = 0; gi < G && st == TDM_OK; gi++) {
        int64_t gin = nh * d / G;
        kern_mat_t wg;
        st = kern_mat_rows(&lw->wo_a, gi * ro, ro, &wg);
        if (st != TDM_OK) {
            break;
        }
        st = fwd_gemm(fwd, &wg, o + gi * gin, nh * d, N, KERN_GEMM_OUT_BF16, oa + gi * ro, G * ro);
    }
    if (st == TDM_OK) {
        st = fwd->ops->qdq_act8(&fwd->kctx, oa, N, G * ro, oa);
    }
    if (st == TDM_OK) {
        st = fwd_gemm(fwd, &lw->wo_b, oa, G * ro, N, KERN_GEMM_OUT_BF16, out, H);
    }
    if (st != TDM_OK) {
        return st;
    }

    /* window ring writes (after every read of this layer) */
    for (int s = 0; s < b->n_segs && st == TDM_OK; s++) {
        st = fwd_ring_write(fwd, &b->segs[s], l, kc, ks);
    }
    return st;
}
