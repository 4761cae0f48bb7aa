/* forward_layer.c - one backbone layer (or DSpark block) on a batch of rows: Engram (MODEL.md
 * 5.6), the two mHC sites (5.1), attention (forward_attn.c) and MoE (5.5); dumps (12.10). */
#include "engine/forward_impl.h"

#include "common/log.h"

#include <stdlib.h>
#include <string.h>

#define FLOAT_BYTES(n) ((size_t)(n) * sizeof(float))

/* Token id at position p for a row of segment seg (segment ids, else the history). */
static int32_t token_at(const fwd_seg_t *seg, int64_t p)
{
    if (p >= seg->pos0) {
        return seg->ids[p - seg->pos0];
    }
    return engine_seq_id_at(seg->seq, p);
}

/*
 * The Engram table-row pointers of every row of b at Engram layer l (MODEL.md 5.6: the n-gram
 * hashes of each row's ids) into backend memory ptrs_d [2 * N * n_cols]: codes, then scales,
 * row r's column c at r * n_cols + c. Built in host staging, one copy to the backend.
 */
static tdm_status_t engram_row_ptrs(engine_fwd_t *fwd, const fwd_batch_t *b, int l,
                                    const uint8_t **ptrs_d)
{
    const engine_model_t *model = fwd->model;
    const engine_config_t *cfg = fwd->cfg;
    const engine_layer_weights_t *lw = &model->layers[l];
    int slot = cfg->roles[l].engram_slot;
    int64_t N = b->N;
    int ngram = (int)cfg->engram_max_ngram_size;
    int64_t de = cfg->engram_head_dim;
    int n_cols = model->engram_layout.n_cols;
    size_t ptr_bytes = (size_t)(N * n_cols) * sizeof(const uint8_t *);
    const uint8_t **ptrs_h = fwd_host_alloc(fwd, 2 * ptr_bytes);
    const int32_t *tmap = model->sidecar.token_map;
    int32_t pad_cid = tmap[cfg->engram_pad_token_id];

    if (ptrs_h == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    for (int s = 0; s < b->n_segs; s++) {
        const fwd_seg_t *seg = &b->segs[s];
        for (int64_t i = 0; i < seg->n; i++) {
            int64_t p = seg->pos0 + i;
            int64_t ids[ENGINE_CONFIG_MAX_NGRAM];
            int64_t rows[ENGINE_ENGRAM_MAX_COLS];
            int blocked = 0;
            for (int k = 0; k < ngram; k++) {
                blocked = blocked || p - k < 0;
                ids[k] = blocked ? pad_cid : tmap[token_at(seg, p - k)];
            }
            engine_engram_hash_rows(&model->engram_layout, slot,
                                    model->sidecar.multipliers + (int64_t)slot * ngram, ids, rows);
            fwd->read_weight_bytes += (uint64_t)(n_cols * (de + de / 32));
            for (int c = 0; c < n_cols; c++) {
                int64_t k = (seg->row0 + i) * n_cols + c; /* output row of e [N * n_cols, de] */
                ptrs_h[k] = lw->e_codes + rows[c] * de;
                ptrs_h[N * n_cols + k] = lw->e_scales + rows[c] * (de / 32);
            }
        }
    }
    return fwd_to_backend(fwd, ptrs_d, ptrs_h, 2 * ptr_bytes);
}

tdm_status_t fwd_engram_ahead(engine_fwd_t *fwd, fwd_batch_t *b, int n_layers_run)
{
    const engine_config_t *cfg = fwd->cfg;
    int64_t N = b->N, de = cfg->engram_head_dim;
    int64_t n_cols = fwd->model->engram_layout.n_cols;
    tdm_status_t st = TDM_OK;

    b->engram_ready = 0;
    if (fwd->engram_rows == NULL || N < 1 || N > ENGINE_FWD_MAX_BATCH) {
        return TDM_OK; /* gathered in the layer */
    }
    for (int s = 0; s < cfg->n_engram_layer_ids && st == TDM_OK; s++) {
        int l = (int)cfg->engram_layer_ids[s];
        float *rows = fwd->engram_rows + (int64_t)s * ENGINE_FWD_MAX_BATCH * n_cols * de;
        const uint8_t **ptrs = fwd->engram_ptrs + (int64_t)s * 2 * ENGINE_FWD_MAX_BATCH * n_cols;
        if (l >= n_layers_run) {
            continue;
        }
        if (fwd->engram_ahead[s].pending) { /* a failed batch's gather: done before the rewrite */
            st = fwd->ops->ahead_wait(&fwd->kctx, &fwd->engram_ahead[s]);
        }
        if (st == TDM_OK) {
            st = engram_row_ptrs(fwd, b, l, ptrs);
        }
        if (st == TDM_OK) {
            st = fwd->ops->rows_ahead(&fwd->kctx, KERN_ROWS_ACT8, ptrs, ptrs + N * n_cols,
                                      N * n_cols, de, rows, &fwd->engram_ahead[s]);
        }
        if (st == TDM_OK) {
            b->engram_ready |= 1u << s;
        }
    }
    return st;
}

static tdm_status_t engram_update(engine_fwd_t *fwd, fwd_batch_t *b, int l)
{
    const engine_model_t *model = fwd->model;
    const engine_config_t *cfg = fwd->cfg;
    const engine_layer_weights_t *lw = &model->layers[l];
    int slot = cfg->roles[l].engram_slot;
    int64_t N = b->N, m = cfg->hc_mult, H = cfg->hidden_size;
    int64_t de = cfg->engram_head_dim;
    int n_cols = model->engram_layout.n_cols;
    int64_t n_e = (int64_t)n_cols * de;
    float *kv = fwd_alloc(fwd, FLOAT_BYTES(N * (m + 1) * H));
    float *e;
    tdm_status_t st;

    if (kv == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    if ((b->engram_ready & (1u << slot)) != 0) { /* fwd_engram_ahead's gather: wait for it */
        e = fwd->engram_rows + (int64_t)slot * ENGINE_FWD_MAX_BATCH * n_e;
        b->engram_ready &= ~(1u << slot);
        st = fwd->ops->ahead_wait(&fwd->kctx, &fwd->engram_ahead[slot]);
    } else { /* every row's table rows in one gather, here */
        const uint8_t **ptrs_d = fwd_alloc(fwd, 2 * (size_t)(N * n_cols) * sizeof(*ptrs_d));
        e = fwd_alloc(fwd, FLOAT_BYTES(N * n_e));
        if (e == NULL || ptrs_d == NULL) {
            return TDM_ERR_NO_MEMORY;
        }
        st = engram_row_ptrs(fwd, b, l, ptrs_d);
        if (st == TDM_OK) {
            st = fwd->ops->dequant_rows(&fwd->kctx, KERN_ROWS_ACT8, ptrs_d, ptrs_d + N * n_cols,
                                        N * n_cols, de, e);
        }
    }
    if (st == TDM_OK) {
        st = fwd->ops->qdq_act8(&fwd->kctx, e, N, n_e, e);
    }
    if (st == TDM_OK) {
        st = fwd_gemm(fwd, &lw->e_wkv, e, n_e, N, KERN_GEMM_OUT_BF16, kv, (m + 1) * H);
    }
    if (st == TDM_OK) {
        st = fwd->ops->engram_gate(&fwd->kctx, b->X, kv, lw->e_qw, lw->e_kw, N, (int)m, H,
                                   (float)cfg->rms_norm_eps);
    }
    return st;
}

/* One mHC site's coefficients from X. */
static tdm_status_t site_coeffs(engine_fwd_t *fwd, fwd_batch_t *b, int l, int site, float *pre,
                                float *post, float *M)
{
    const engine_config_t *cfg = fwd->cfg;
    const engine_layer_weights_t *lw = &fwd->model->layers[l];
    int64_t N = b->N, m = cfg->hc_mult, H = cfg->hidden_size, n_mix = (2 + m) * m;
    float *raw = fwd_alloc(fwd, FLOAT_BYTES(N * n_mix));
    kern_mhc_params_t hp = {lw->hc_base[site], lw->hc_scale[site], (int)m,
                            (int)cfg->hc_sinkhorn_iters, (float)cfg->rms_norm_eps,
                            (float)cfg->hc_eps};
    tdm_status_t st;

    if (raw == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    st = fwd_gemm(fwd, &lw->hc_fn[site], b->X, m * H, N, KERN_GEMM_OUT_F32, raw, n_mix);
    if (st == TDM_OK) {
        st = fwd->ops->mhc_coeffs(&fwd->kctx, &hp, b->X, N, H, raw, pre, post, M);
    }
    return st;
}

tdm_status_t fwd_expert_ffn(engine_fwd_t *fwd, const engine_layer_weights_t *lw, int64_t e,
                            const float *xe, const float *we, int64_t ne, float *gu, float *h,
                            float *y)
{
    int64_t H = fwd->cfg->hidden_size, I = fwd->cfg->moe_intermediate_size;
    float lambda = (float)fwd->cfg->swiglu_limit;
    /* gate then up, side by side in gu [ne, 2I] */
    tdm_status_t st = fwd_gemm(fwd, &lw->w1[e], xe, H, ne, KERN_GEMM_OUT_BF16, gu, 2 * I);

    if (st == TDM_OK) {
        st = fwd_gemm(fwd, &lw->w3[e], xe, H, ne, KERN_GEMM_OUT_BF16, gu + I, 2 * I);
    }
    if (st == TDM_OK) {
        st = fwd->ops->swiglu(&fwd->kctx, gu, we, ne, I, lambda, h);
    }
    if (st == TDM_OK) {
        st = fwd->ops->qdq_act8(&fwd->kctx, h, ne, I, h);
    }
    if (st == TDM_OK) {
        st = fwd_gemm(fwd, &lw->w2[e], h, I, ne, KERN_GEMM_OUT_BF16, y, H);
    }
    return st;
}

/* MoE of layer l on normed input xn [N, H] into out [N, H] (R8); experts_out [N, K]. */
static tdm_status_t moe(engine_fwd_t *fwd, fwd_batch_t *b, int l, const float *xn, float *out,
                        int32_t *experts_out)
{
    const engine_config_t *cfg = fwd->cfg;
    const engine_layer_weights_t *lw = &fwd->model->layers[l];
    int dspark = l >= cfg->n_layers;
    int64_t N = b->N, H = cfg->hidden_size, I = cfg->moe_intermediate_size;
    int64_t E = lw->n_experts;
    int K = (int)(dspark ? cfg->dspark_num_experts_per_tok : cfg->num_experts_per_tok);
    float lambda = (float)cfg->swiglu_limit;
    float *logits = fwd_alloc(fwd, FLOAT_BYTES(N * E));
    float *wts = fwd_alloc(fwd, FLOAT_BYTES(N * K));
    float *xq = fwd_alloc(fwd, FLOAT_BYTES(N * H));
    float *acc = fwd_alloc(fwd, FLOAT_BYTES(N * H));
    /* xe [rows, H], gu [rows, 2I], h [rows, I], ye [rows, H] in one block (ops->moe_ffn's
     * scratch): N rows, or up to every (token, expert) pair where the arena has room for them */
    int64_t scr_rows = N;
    float *scr = NULL, *xe = NULL, *gu = NULL, *h = NULL, *ye = NULL;
    if (fwd->params.comm == NULL && N * K > N) {
        /* N <= fwd_max_rows, so this is at least N */
        scr_rows = N * K < fwd_max_rows(fwd) ? N * K : fwd_max_rows(fwd);
        scr = fwd_alloc(fwd, FLOAT_BYTES(KERN_MOE_SCRATCH_FLOATS(scr_rows, H, I)));
    }
    if (scr == NULL) {
        scr_rows = N;
        scr = fwd_alloc(fwd, FLOAT_BYTES(KERN_MOE_SCRATCH_FLOATS(scr_rows, H, I)));
    }
    if (scr != NULL) {
        kern_moe_scratch_split(scr, scr_rows, H, I, &xe, &gu, &h, &ye);
    }
    float *we = fwd_alloc(fwd, FLOAT_BYTES(N * K));
    int64_t *rows = fwd_alloc(fwd, (size_t)(N * K) * sizeof(int64_t));
    int64_t *off_d = fwd_alloc(fwd, (size_t)(E + 1) * sizeof(int64_t));
    int64_t *off = fwd_host_alloc(fwd, (size_t)(E + 1) * sizeof(int64_t));
    tdm_status_t st;

    if (logits == NULL || wts == NULL || xq == NULL || acc == NULL || xe == NULL || gu == NULL ||
        h == NULL || ye == NULL || we == NULL || rows == NULL || off_d == NULL || off == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    st = fwd_gemm(fwd, &lw->gate, xn, H, N, KERN_GEMM_OUT_F32, logits, E);
    if (st == TDM_OK) {
        st = fwd->ops->moe_route(&fwd->kctx, logits, lw->gate_bias, N, E, K,
                                 (float)cfg->routed_scaling_factor, experts_out, wts);
        if (st == TDM_ERR_INTERNAL) {
            tdm_log(TDM_LOG_ERROR, "engine", "nan reached the expert top-k: layer=%d", l);
        }
    }
    if (st == TDM_OK) {
        st = fwd->ops->qdq_act8(&fwd->kctx, xn, N, H, xq);
    }
    if (st != TDM_OK) {
        return st;
    }
    st = fwd->ops->mem_set(&fwd->kctx, acc, 0, FLOAT_BYTES(N * H));
    if (st == TDM_OK) {
        st = fwd->ops->expert_rows(&fwd->kctx, experts_out, wts, N, K, E, off_d, rows, we);
    }
    if (st == TDM_OK && fwd->params.comm != NULL) {
        /* expert parallel sizes its rounds from the E + 1 offsets: one copy to the host */
        st = fwd->ops->mem_copy(&fwd->kctx, off, off_d, (size_t)(E + 1) * sizeof(int64_t),
                                KERN_COPY_D2H);
        if (st == TDM_OK) {
            st = fwd_ep_routed(fwd, l, xq, rows, we, off, N * K, xe, gu, h, acc);
        }
    } else if (st == TDM_OK) {
        /* every routed expert in one op that reads the offsets where they are (no host copy) */
        st =
            fwd->ops->moe_ffn(&fwd->kctx, &lw->experts, xq, N, H, I, off_d, rows, we, N * K, lambda,
                              scr, scr_rows, acc, fwd->moe_active + (int64_t)l * fwd->moe_e_max);
    }
    /* shared expert, weight 1, same clamp */
    if (st == TDM_OK) {
        st = fwd_gemm(fwd, &lw->s_w1, xq, H, N, KERN_GEMM_OUT_BF16, gu, 2 * I);
    }
    if (st == TDM_OK) {
        st = fwd_gemm(fwd, &lw->s_w3, xq, H, N, KERN_GEMM_OUT_BF16, gu + I, 2 * I);
    }
    if (st == TDM_OK) {
        st = fwd->ops->swiglu(&fwd->kctx, gu, NULL, N, I, lambda, h);
    }
    if (st == TDM_OK) {
        st = fwd->ops->qdq_act8(&fwd->kctx, h, N, I, h);
    }
    if (st == TDM_OK) {
        st = fwd_gemm(fwd, &lw->s_w2, h, I, N, KERN_GEMM_OUT_BF16, ye, H);
    }
    if (st != TDM_OK) {
        return st;
    }
    return fwd->ops->add_bf16(&fwd->kctx, acc, ye, N * H, out);
}

/* The dump sink's view of a layer in host memory (debug path, allocated per layer with malloc
 * because a chunk's streams do not fit the host staging arena): x_in and pre copied before the
 * layer runs, x_out, sel and experts after. */
typedef struct {
    float *x_in;      /* [N, m, H] */
    float *pre;       /* [N, m] */
    float *x_out;     /* [N, m, H] */
    int32_t *sel;     /* [N, k_I] */
    int32_t *experts; /* [N, K] */
} dump_stage_t;

static tdm_status_t dump_begin(engine_fwd_t *fwd, const fwd_batch_t *b, int K, dump_stage_t *d)
{
    const engine_config_t *cfg = fwd->cfg;
    int64_t N = b->N, m = cfg->hc_mult, mH = m * cfg->hidden_size, kI = cfg->index_topk;
    float *all = malloc(FLOAT_BYTES(2 * N * mH + N * m) + (size_t)(N * (kI + K)) * sizeof(int32_t));
    tdm_status_t st;

    if (all == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    d->x_in = all;
    d->x_out = all + N * mH;
    d->pre = all + 2 * N * mH;
    d->sel = (int32_t *)(all + 2 * N * mH + N * m);
    d->experts = d->sel + N * kI;
    st = fwd->ops->mem_copy(&fwd->kctx, d->x_in, b->X, FLOAT_BYTES(N * mH), KERN_COPY_D2H);
    if (st == TDM_OK) {
        st = fwd->ops->mem_copy(&fwd->kctx, d->pre, b->pre, FLOAT_BYTES(N * m), KERN_COPY_D2H);
    }
    return st;
}

static tdm_status_t dump_layer(engine_fwd_t *fwd, const fwd_batch_t *b, int l,
                               const int32_t *sel_used, int K, dump_stage_t *d)
{
    const engine_config_t *cfg = fwd->cfg;
    int64_t N = b->N, mH = cfg->hc_mult * cfg->hidden_size, kI = cfg->index_topk;
    tdm_status_t st;

    st = fwd->ops->mem_copy(&fwd->kctx, d->x_out, b->X, FLOAT_BYTES(N * mH), KERN_COPY_D2H);
    if (st == TDM_OK) {
        st = fwd->ops->mem_copy(&fwd->kctx, d->sel, sel_used, (size_t)(N * kI) * sizeof(int32_t),
                                KERN_COPY_D2H);
    }
    if (st == TDM_OK) {
        st = fwd->ops->mem_copy(&fwd->kctx, d->experts, b->experts,
                                (size_t)(N * K) * sizeof(int32_t), KERN_COPY_D2H);
    }
    for (int s = 0; s < b->n_segs && st == TDM_OK; s++) {
        const fwd_seg_t *seg = &b->segs[s];
        engine_dump_layer_t rec;
        memset(&rec, 0, sizeof(rec));
        rec.layer = l;
        rec.seq_index = seg->seq_index;
        rec.first_position = seg->pos0;
        rec.n_rows = seg->n;
        rec.m = (int)cfg->hc_mult;
        rec.H = cfg->hidden_size;
        rec.k_I = kI;
        rec.K = K;
        rec.x_in = d->x_in + seg->row0 * mH;
        rec.x_out = d->x_out + seg->row0 * mH;
        rec.pre = d->pre + seg->row0 * cfg->hc_mult;
        rec.sel = d->sel + seg->row0 * kI;
        rec.experts = d->experts + seg->row0 * K;
        fwd->sink.layer(fwd->sink.user, &rec);
    }
    return st;
}

tdm_status_t fwd_layer_run(engine_fwd_t *fwd, fwd_batch_t *b, int l)
{
    const engine_config_t *cfg = fwd->cfg;
    const engine_layer_weights_t *lw = &fwd->model->layers[l];
    const engine_layer_role_t *role = &cfg->roles[l];
    int64_t N = b->N, m = cfg->hc_mult, H = cfg->hidden_size;
    int K = (int)(l >= cfg->n_layers ? cfg->dspark_num_experts_per_tok : cfg->num_experts_per_tok);
    float eps = (float)cfg->rms_norm_eps;
    int dumping = fwd->have_sink && fwd->sink.layer != NULL && l < cfg->n_layers;
    dump_stage_t dump = {NULL, NULL, NULL, NULL, NULL};
    float *pre_a, *post_a, *M_a, *pre_f, *post_f, *M_f, *y, *sub;
    int32_t *sel_used;
    tdm_status_t st = TDM_OK;

    fwd_layer_reset(fwd);
    pre_a = fwd_alloc(fwd, FLOAT_BYTES(N * m));
    post_a = fwd_alloc(fwd, FLOAT_BYTES(N * m));
    M_a = fwd_alloc(fwd, FLOAT_BYTES(N * m * m));
    pre_f = fwd_alloc(fwd, FLOAT_BYTES(N * m));
    post_f = fwd_alloc(fwd, FLOAT_BYTES(N * m));
    M_f = fwd_alloc(fwd, FLOAT_BYTES(N * m * m));
    y = fwd_alloc(fwd, FLOAT_BYTES(N * H));
    sub = fwd_alloc(fwd, FLOAT_BYTES(N * H));
    sel_used = fwd_alloc(fwd, (size_t)(N * cfg->index_topk) * sizeof(int32_t));
    if (pre_a == NULL || post_a == NULL || M_a == NULL || pre_f == NULL || post_f == NULL ||
        M_f == NULL || y == NULL || sub == NULL || sel_used == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    if (dumping) { /* host copies of what enters the layer (freed below on every path) */
        st = dump_begin(fwd, b, K, &dump);
    }
    if (st == TDM_OK && role->tap_slot >= 0 && b->taps != NULL && l < cfg->n_layers) {
        int64_t n_t = cfg->n_dspark_target_layer_ids;
        st = fwd->ops->stream_mean(&fwd->kctx, b->X, N, (int)m, H, b->taps + role->tap_slot * H,
                                   n_t * H);
    }
    if (st == TDM_OK && role->engram_slot >= 0 && l < cfg->n_layers) {
        st = engram_update(fwd, b, l);
    }
    /* attention site */
    if (st == TDM_OK) {
        st = site_coeffs(fwd, b, l, ENGINE_SITE_ATTN, pre_a, post_a, M_a);
    }
    if (st == TDM_OK) {
        st = fwd->ops->mhc_collapse(&fwd->kctx, b->pre, b->X, N, (int)m, H, y);
    }
    if (st == TDM_OK) {
        st = fwd->ops->rmsnorm(&fwd->kctx, y, H, N, H, lw->attn_norm, eps, y, H);
    }
    if (st == TDM_OK) {
        st = fwd_attention(fwd, b, l, y, sel_used, sub);
    }
    if (st == TDM_OK) {
        st = fwd->ops->mhc_update(&fwd->kctx, post_a, sub, M_a, N, (int)m, H, b->X);
    }
    /* FFN site */
    if (st == TDM_OK) {
        st = site_coeffs(fwd, b, l, ENGINE_SITE_FFN, pre_f, post_f, M_f);
    }
    if (st == TDM_OK) {
        st = fwd->ops->mhc_collapse(&fwd->kctx, pre_a, b->X, N, (int)m, H, y);
    }
    if (st == TDM_OK) {
        st = fwd->ops->rmsnorm(&fwd->kctx, y, H, N, H, lw->ffn_norm, eps, y, H);
    }
    if (st == TDM_OK) {
        st = moe(fwd, b, l, y, sub, b->experts);
    }
    if (st == TDM_OK) {
        st = fwd->ops->mhc_update(&fwd->kctx, post_f, sub, M_f, N, (int)m, H, b->X);
    }
    if (st == TDM_OK) {
        st = fwd_copy(fwd, b->pre, pre_f, FLOAT_BYTES(N * m));
    }
    if (st == TDM_OK && dumping) {
        st = dump_layer(fwd, b, l, sel_used, K, &dump);
    }
    free(dump.x_in);
    return st;
}
