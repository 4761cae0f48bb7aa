/* forward.c - forward contexts and the schedules of MODEL.md section 6 (engine/forward.h):
 * batching of sequences into rows, page reservation, head and DSpark context rings. The CED
 * prefill of several parts in one batch is forward_batch.c's; one layer's math lives in
 * forward_layer.c and forward_attn.c. */
#include "engine/forward.h"

#include "common/log.h"
#include "engine/forward_impl.h"
#include "kernels/rope.h"

#include <stdlib.h>
#include <string.h>

#define FLOAT_BYTES(n)       ((size_t)(n) * sizeof(float))
#define DEFAULT_CHUNK_TOKENS 256
#define ARENA_SAFETY         2 /* factor over the per-row estimate */
#define ARENA_FIXED_BYTES    (4u << 20)
/* Positions per RoPE cache table: more than a prefill chunk's and a decode batch's positions. */
#define ROPE_CACHE_SLOTS 4096

void engine_fwd_params_default(const engine_model_t *model, engine_fwd_params_t *params)
{
    memset(params, 0, sizeof(*params));
    params->max_chunk_tokens = DEFAULT_CHUNK_TOKENS;
    params->n_threads = model != NULL ? engine_model_n_threads(model) : 1;
}

int fwd_index_ordinal(const engine_fwd_t *fwd, int layer)
{
    for (int i = 0; i < fwd->n_index_sources; i++) {
        if (fwd->index_source_layer[i] == layer) {
            return i;
        }
    }
    return -1;
}

void *fwd_alloc(engine_fwd_t *fwd, size_t n_bytes)
{
    return tdm_arena_alloc(&fwd->layer_arena, n_bytes, 64);
}

void *fwd_host_alloc(engine_fwd_t *fwd, size_t n_bytes)
{
    return tdm_arena_alloc(&fwd->host_arena, n_bytes, 64);
}

void fwd_layer_reset(engine_fwd_t *fwd)
{
    tdm_arena_reset(&fwd->layer_arena);
    tdm_arena_reset(&fwd->host_arena);
}

tdm_status_t fwd_grow_rows(engine_fwd_t *fwd, float **buf, int64_t *cap_rows, int64_t n,
                           int64_t dim)
{
    int64_t cap;
    void *grown = NULL;
    tdm_status_t st;

    if (n <= *cap_rows) {
        return TDM_OK;
    }
    cap = *cap_rows == 0 ? 1024 : *cap_rows;
    while (cap < n) {
        cap *= 2;
    }
    st = fwd->ops->mem_alloc(&fwd->kctx, FLOAT_BYTES(cap * dim), &grown);
    if (st != TDM_OK) {
        return st;
    }
    fwd->ops->mem_free(&fwd->kctx, *buf);
    *buf = grown;
    *cap_rows = cap;
    return TDM_OK;
}

/* An arena of capacity bytes: malloc memory when host code may read backend memory, else over
 * ops->mem_alloc memory kept in *mem (freed by engine_fwd_destroy). */
static tdm_status_t backend_arena(engine_fwd_t *fwd, tdm_arena_t *arena, void **mem,
                                  size_t capacity)
{
    tdm_status_t st;

    if (fwd->ops->host_memory) {
        return tdm_arena_init(arena, capacity);
    }
    st = fwd->ops->mem_alloc(&fwd->kctx, capacity, mem);
    if (st == TDM_OK) {
        st = tdm_arena_init_over(arena, *mem, capacity);
    }
    return st;
}

int64_t fwd_max_rows(const engine_fwd_t *fwd)
{
    int64_t n = fwd->params.max_chunk_tokens;
    return n > ENGINE_FWD_MAX_BATCH ? n : ENGINE_FWD_MAX_BATCH;
}

/* Bytes of per-row layer temporaries (generous; see forward_layer.c / forward_attn.c). */
static size_t layer_row_bytes(const engine_config_t *c, int expert_parallel)
{
    int64_t m = c->hc_mult, H = c->hidden_size, d = c->head_dim;
    int64_t n_mix = (2 + m) * m;
    int64_t E = c->n_routed_experts > c->dspark_n_routed_experts ? c->n_routed_experts
                                                                 : c->dspark_n_routed_experts;
    int64_t n_e = (c->engram_max_ngram_size - 1) * c->engram_n_heads * c->engram_head_dim;
    int64_t floats = 2 * m * H + 2 * n_mix + 6 * m + 2 * m * m + 2 * H + 2 * H +
                     3 * c->q_lora_rank + 2 * c->num_attention_heads * d + 8 * d +
                     c->o_groups * c->o_lora_rank + 2 * c->index_n_heads * c->index_head_dim +
                     c->index_n_heads + 4 * c->index_head_dim + E + 2 * c->num_experts_per_tok +
                     5 * H + 3 * c->moe_intermediate_size +
                     3 * (c->num_experts_per_tok + c->dspark_num_experts_per_tok) + /* grouping */
                     4 * (c->engram_max_ngram_size - 1) * c->engram_n_heads + /* row pointers */
                     2 * n_e + (m + 1) * H + c->index_topk + 64 +
                     4; /* a window row's two pointers (forward_attn.c batch_windows) */
    if (expert_parallel) {
        /* the expert-sorted rows and their outputs [N*K, H] each (forward_ep.c) */
        int64_t K = c->num_experts_per_tok > c->dspark_num_experts_per_tok
                        ? c->num_experts_per_tok
                        : c->dspark_num_experts_per_tok;
        floats += 2 * K * H + 2 * K;
    }
    return (size_t)floats * sizeof(float) * ARENA_SAFETY + 16 * 64;
}

/* Bytes of the per-call batch arrays per row. */
static size_t batch_row_bytes(const engine_config_t *c, int n_index_sources)
{
    int64_t m = c->hc_mult, H = c->hidden_size;
    int64_t floats = m * H + m + (int64_t)n_index_sources * c->index_topk +
                     c->candidate_topk_blocks + 1 + c->num_experts_per_tok +
                     c->dspark_num_experts_per_tok + (int64_t)c->n_dspark_target_layer_ids * H + 8;
    return (size_t)floats * 4 + 16 * 64;
}

tdm_status_t engine_fwd_create(const engine_model_t *model, engine_kv_pool_t *pool,
                               const engine_fwd_params_t *params, engine_fwd_t **fwd_out)
{
    engine_fwd_t *fwd;
    const engine_config_t *c;
    size_t fixed;
    tdm_status_t st;

    if (model == NULL || pool == NULL || params == NULL || fwd_out == NULL ||
        params->max_chunk_tokens < 1 || params->n_threads < 1) {
        return TDM_ERR_INVALID_ARG;
    }
    if (engine_kv_pool_fingerprint(pool) != engine_model_fingerprint(model)) {
        return TDM_ERR_INVALID_ARG;
    }
    {
        /* the comm must be the model's expert shard: rank and size both (engine/model.h) */
        int e0, e1, rank, size;
        if (engine_model_expert_shard(model, 0, &e0, &e1, &rank, &size) != TDM_OK ||
            (params->ep_data_parallel && params->comm == NULL) ||
            (params->comm == NULL
                 ? size != 1
                 : kern_comm_size(params->comm) != size || kern_comm_rank(params->comm) != rank)) {
            tdm_log(TDM_LOG_ERROR, "engine",
                    "forward context: expert-parallel comm (rank %d of %d) does not match the "
                    "model's shard (rank %d of %d)",
                    kern_comm_rank(params->comm), kern_comm_size(params->comm), rank, size);
            return TDM_ERR_INVALID_ARG;
        }
    }
    fwd = calloc(1, sizeof(*fwd));
    if (fwd == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    c = engine_model_config(model);
    fwd->model = model;
    fwd->cfg = c;
    fwd->pool = pool;
    fwd->ops = engine_model_ops(model);
    fwd->params = *params;
    /* the kernel context of the table's backend: CUDA on the calling thread's current device
     * and its default stream (kernels/backend.h); every other table runs on the CPU */
    fwd->kctx.backend = strcmp(fwd->ops->name, "cuda") == 0 ? KERN_BACKEND_CUDA : KERN_BACKEND_CPU;
    fwd->kctx.n_threads = params->n_threads;
    if (params->n_threads > 1) {
        st = kern_pool_create(params->n_threads, &fwd->kctx.pool); /* joined in fwd_destroy */
        if (st != TDM_OK) {
            free(fwd);
            return st;
        }
    }
    /* cos/sin rows shared by every RoPE call of a pass (freed in engine_fwd_destroy) */
    st = kern_rope_cache_create(ROPE_CACHE_SLOTS, &fwd->kctx.rope_cache);
    if (st != TDM_OK) {
        engine_fwd_destroy(fwd);
        return st;
    }
    fwd->n_index_sources = c->n_index_source_layer_ids;
    for (int i = 0; i < c->n_index_source_layer_ids; i++) {
        fwd->index_source_layer[i] = (int)c->index_source_layer_ids[i];
    }
    fixed =
        ARENA_FIXED_BYTES +
        (size_t)ENGINE_FWD_MAX_BATCH * (size_t)(c->sliding_window + 2) * (size_t)c->head_dim *
            sizeof(float) +
        (size_t)(c->index_topk + 16) * (size_t)c->head_dim * sizeof(float) * (2 + FWD_SEL_GROUP) +
        (size_t)(2 * FWD_SEL_GROUP * c->index_topk) * sizeof(void *) +
        (size_t)ENGINE_FWD_MAX_BATCH * (size_t)(c->sliding_window + 2) * 2 * sizeof(void *);
    st =
        backend_arena(fwd, &fwd->layer_arena, &fwd->layer_mem,
                      layer_row_bytes(c, params->comm != NULL) * (size_t)fwd_max_rows(fwd) + fixed);
    if (st == TDM_OK) {
        /* host staging: per-row metadata and pointer arrays (a few hundred bytes per row), and
         * the windows' ring-entry pointers (forward_attn.c batch_windows) */
        st = tdm_arena_init(&fwd->host_arena,
                            (size_t)fwd_max_rows(fwd) * (size_t)(c->index_topk + 256) * 16 +
                                (size_t)ENGINE_FWD_MAX_BATCH * (size_t)(c->sliding_window + 2) * 2 *
                                    sizeof(void *) +
                                ARENA_FIXED_BYTES);
    }
    if (st == TDM_OK && params->comm != NULL) {
        st = fwd_ep_init(fwd); /* the round headers, both forms */
    }
    if (st == TDM_OK) {
        size_t n_bytes;
        fwd->moe_e_max = c->n_routed_experts > c->dspark_n_routed_experts
                             ? c->n_routed_experts
                             : c->dspark_n_routed_experts;
        n_bytes = (size_t)(c->n_layers + c->n_blocks) * (size_t)fwd->moe_e_max * sizeof(int64_t);
        st = fwd->ops->mem_alloc(&fwd->kctx, n_bytes, (void **)&fwd->moe_active);
        if (st == TDM_OK) {
            st = fwd->ops->mem_set(&fwd->kctx, fwd->moe_active, 0, n_bytes);
        }
    }
    if (st == TDM_OK) {
        st = fwd->ops->mem_alloc(&fwd->kctx, sizeof(int32_t), (void **)&fwd->status_word);
    }
    if (st == TDM_OK && c->n_engram_layer_ids > 0) { /* fwd_engram_ahead's buffers */
        size_t rows = (size_t)c->n_engram_layer_ids * ENGINE_FWD_MAX_BATCH *
                      (size_t)model->engram_layout.n_cols;
        st = fwd->ops->mem_alloc(&fwd->kctx, rows * (size_t)c->engram_head_dim * sizeof(float),
                                 (void **)&fwd->engram_rows);
        if (st == TDM_OK) {
            st = fwd->ops->mem_alloc(&fwd->kctx, 2 * rows * sizeof(*fwd->engram_ptrs),
                                     (void **)&fwd->engram_ptrs);
        }
    }
    if (st == TDM_OK) {
        st =
            backend_arena(fwd, &fwd->batch_arena, &fwd->batch_mem,
                          batch_row_bytes(c, fwd->n_index_sources) * (size_t)fwd_max_rows(fwd) * 2 +
                              ARENA_FIXED_BYTES);
    }
    if (st == TDM_OK) { /* the batches' host selections: two live batches (CED upper rows) */
        st = tdm_arena_init(
            &fwd->batch_host_arena,
            (size_t)fwd_max_rows(fwd) * 2 *
                    ((size_t)(fwd->n_index_sources * c->index_topk + 1) * sizeof(int32_t) + 64) +
                ARENA_FIXED_BYTES);
    }
    if (st != TDM_OK) {
        engine_fwd_destroy(fwd);
        return st;
    }
    *fwd_out = fwd;
    return TDM_OK;
}

void engine_fwd_destroy(engine_fwd_t *fwd)
{
    if (fwd == NULL) {
        return;
    }
    tdm_arena_fini(&fwd->layer_arena);
    tdm_arena_fini(&fwd->host_arena);
    tdm_arena_fini(&fwd->batch_arena);
    tdm_arena_fini(&fwd->batch_host_arena);
    for (int i = 0; i < ENGINE_CONFIG_MAX_ENGRAM_LAYERS; i++) {
        fwd->ops->ahead_free(&fwd->kctx, &fwd->engram_ahead[i]); /* before its buffers */
    }
    fwd->ops->mem_free(&fwd->kctx, fwd->engram_rows);
    fwd->ops->mem_free(&fwd->kctx, (void *)fwd->engram_ptrs);
    fwd->ops->mem_free(&fwd->kctx, fwd->layer_mem);
    fwd->ops->mem_free(&fwd->kctx, fwd->batch_mem);
    fwd->ops->mem_free(&fwd->kctx, fwd->ikey_cache);
    fwd->ops->mem_free(&fwd->kctx, fwd->ckv_cache);
    fwd->ops->mem_free(&fwd->kctx, fwd->head_scratch);
    fwd->ops->mem_free(&fwd->kctx, fwd->moe_active);
    fwd->ops->mem_free(&fwd->kctx, fwd->status_word);
    fwd_ep_fini(fwd);
    kern_pool_destroy(fwd->kctx.pool);
    kern_rope_cache_destroy(fwd->kctx.rope_cache);
    free(fwd);
}

void engine_fwd_set_dump(engine_fwd_t *fwd, const engine_dump_sink_t *sink)
{
    if (sink == NULL) {
        fwd->have_sink = 0;
        memset(&fwd->sink, 0, sizeof(fwd->sink));
    } else {
        fwd->sink = *sink;
        fwd->have_sink = 1;
    }
}

/* ---- batches -------------------------------------------------------------------------- */

/* Allocate the per-row arrays of a batch of N rows from the batch arena (backend memory). */
tdm_status_t fwd_batch_alloc(engine_fwd_t *fwd, fwd_batch_t *b, int64_t N)
{
    const engine_config_t *c = fwd->cfg;
    tdm_arena_t *a = &fwd->batch_arena;
    int64_t m = c->hc_mult, H = c->hidden_size;
    int K = (int)(c->num_experts_per_tok > c->dspark_num_experts_per_tok
                      ? c->num_experts_per_tok
                      : c->dspark_num_experts_per_tok);

    b->N = N;
    b->X = tdm_arena_alloc(a, FLOAT_BYTES(N * m * H), 64);
    b->pre = tdm_arena_alloc(a, FLOAT_BYTES(N * m), 64);
    b->pool = tdm_arena_alloc(a, (size_t)(N * c->candidate_topk_blocks) * sizeof(int32_t), 64);
    b->n_pool_h = tdm_arena_alloc(&fwd->batch_host_arena, (size_t)N * sizeof(int32_t), 64);
    b->experts = tdm_arena_alloc(a, (size_t)(N * K) * sizeof(int32_t), 64);
    b->engram_ready = 0;
    b->taps = c->n_blocks > 0
                  ? tdm_arena_alloc(a, FLOAT_BYTES(N * c->n_dspark_target_layer_ids * H), 64)
                  : NULL;
    if (b->X == NULL || b->pre == NULL || b->pool == NULL || b->n_pool_h == NULL ||
        b->experts == NULL || (c->n_blocks > 0 && b->taps == NULL)) {
        return TDM_ERR_NO_MEMORY;
    }
    for (int i = 0; i < fwd->n_index_sources; i++) {
        size_t n_bytes = (size_t)(N * c->index_topk) * sizeof(int32_t);
        b->sel[i] = tdm_arena_alloc(a, n_bytes, 64);
        b->sel_h[i] = tdm_arena_alloc(&fwd->batch_host_arena, n_bytes, 64);
        if (b->sel[i] == NULL || b->sel_h[i] == NULL) {
            return TDM_ERR_NO_MEMORY;
        }
    }
    for (int64_t r = 0; r < N; r++) {
        b->n_pool_h[r] = -1;
    }
    return TDM_OK;
}

void fwd_batch_reset(engine_fwd_t *fwd)
{
    tdm_arena_reset(&fwd->batch_arena);
    tdm_arena_reset(&fwd->batch_host_arena);
}

/* X = m copies of embed[id] (R1), pre = e0: the batch's ids gathered into host staging and
 * copied to backend memory once, then ops->embed once per segment (its rows are contiguous). */
tdm_status_t fwd_batch_embed(engine_fwd_t *fwd, fwd_batch_t *b)
{
    const engine_config_t *c = fwd->cfg;
    int64_t m = c->hc_mult, H = c->hidden_size, N = b->N;
    int32_t *ids_h, *ids_d;
    tdm_status_t st = TDM_OK;

    fwd_layer_reset(fwd);
    ids_h = fwd_host_alloc(fwd, (size_t)N * sizeof(int32_t));
    ids_d = fwd_alloc(fwd, (size_t)N * sizeof(int32_t));
    if (ids_h == NULL || ids_d == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    memset(ids_h, 0, (size_t)N * sizeof(int32_t));
    for (int s = 0; s < b->n_segs; s++) {
        const fwd_seg_t *seg = &b->segs[s];
        if (seg->draft) { /* the anchor, then the noise token (MODEL.md 8) */
            ids_h[seg->row0] = seg->ids[0];
            for (int64_t k = 1; k < seg->n; k++) {
                ids_h[seg->row0 + k] = (int32_t)c->dspark_noise_token_id;
            }
        } else {
            memcpy(ids_h + seg->row0, seg->ids, (size_t)seg->n * sizeof(int32_t));
        }
    }
    st = fwd->ops->mem_copy(&fwd->kctx, ids_d, ids_h, (size_t)N * sizeof(int32_t), KERN_COPY_H2D);
    for (int s = 0; s < b->n_segs && st == TDM_OK; s++) {
        const fwd_seg_t *seg = &b->segs[s];
        fwd->read_weight_bytes += (uint64_t)seg->n * (uint64_t)H * sizeof(uint16_t);
        st = fwd->ops->embed(&fwd->kctx, fwd->model->embed, c->vocab_size, ids_d + seg->row0,
                             seg->n, H, (int)m, b->X + seg->row0 * m * H, b->pre + seg->row0 * m);
    }
    return st;
}

/* Grow fwd->head_scratch (backend memory, contents not kept) to n rows of logits; unchanged
 * when the allocation fails. */
static tdm_status_t head_scratch(engine_fwd_t *fwd, int64_t n)
{
    void *grown = NULL;
    tdm_status_t st;

    if (n <= fwd->head_cap_rows) {
        return TDM_OK;
    }
    st = fwd->ops->mem_alloc(&fwd->kctx, FLOAT_BYTES(n * fwd->cfg->vocab_size), &grown);
    if (st != TDM_OK) {
        return st;
    }
    fwd->ops->mem_free(&fwd->kctx, fwd->head_scratch);
    fwd->head_scratch = grown;
    fwd->head_cap_rows = n;
    return TDM_OK;
}

tdm_status_t fwd_head_logits(engine_fwd_t *fwd, const fwd_batch_t *b, int64_t r0, int64_t n,
                             const float **logits_out)
{
    const engine_config_t *c = fwd->cfg;
    int64_t m = c->hc_mult, H = c->hidden_size;
    float *h;
    tdm_status_t st;

    fwd_layer_reset(fwd);
    st = head_scratch(fwd, n);
    if (st != TDM_OK) {
        return st;
    }
    h = fwd_alloc(fwd, FLOAT_BYTES(n * H));
    if (h == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    st = fwd->ops->mhc_collapse(&fwd->kctx, b->pre + r0 * m, b->X + r0 * m * H, n, (int)m, H, h);
    if (st == TDM_OK) {
        st = fwd->ops->rmsnorm(&fwd->kctx, h, H, n, H, fwd->model->norm, (float)c->rms_norm_eps, h,
                               H);
    }
    if (st == TDM_OK) {
        st = fwd_gemm(fwd, &fwd->model->head, h, H, n, KERN_GEMM_OUT_F32, fwd->head_scratch,
                      c->vocab_size);
    }
    if (st == TDM_OK) {
        *logits_out = fwd->head_scratch;
    }
    return st;
}

/* logits [rows, V] of batch rows [r0, r0 + n) into the caller's host buffer: the head into
 * head_scratch, one device-to-host copy. */
tdm_status_t fwd_head_rows(engine_fwd_t *fwd, const fwd_batch_t *b, int64_t r0, int64_t n,
                           float *logits_out)
{
    const float *logits = NULL;
    tdm_status_t st = fwd_head_logits(fwd, b, r0, n, &logits);

    if (st == TDM_OK) {
        st = fwd->ops->mem_copy(&fwd->kctx, logits_out, logits,
                                FLOAT_BYTES(n * fwd->cfg->vocab_size), KERN_COPY_D2H);
    }
    return st;
}

/* DSpark context rings of every block for the batch's rows (MODEL.md 8, taps). */
tdm_status_t fwd_dspark_rings(engine_fwd_t *fwd, const fwd_batch_t *b)
{
    const engine_config_t *c = fwd->cfg;
    const engine_model_t *model = fwd->model;
    int64_t N = b->N, H = c->hidden_size, d = c->head_dim;
    int64_t n_t = c->n_dspark_target_layer_ids;
    float *cat, *mx, *kv;
    uint8_t *kc, *ks;
    int64_t *pos, *pos_h;
    tdm_status_t st;

    if (c->n_blocks == 0 || b->taps == NULL || N == 0) {
        return TDM_OK;
    }
    fwd_layer_reset(fwd);
    cat = fwd_alloc(fwd, FLOAT_BYTES(N * n_t * H));
    mx = fwd_alloc(fwd, FLOAT_BYTES(N * H));
    kv = fwd_alloc(fwd, FLOAT_BYTES(N * d));
    kc = fwd_alloc(fwd, (size_t)(N * d));
    ks = fwd_alloc(fwd, (size_t)(N * d / 32));
    pos = fwd_alloc(fwd, (size_t)N * sizeof(int64_t));
    pos_h = fwd_host_alloc(fwd, (size_t)N * sizeof(int64_t));
    if (cat == NULL || mx == NULL || kv == NULL || kc == NULL || ks == NULL || pos == NULL ||
        pos_h == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    memset(pos_h, 0, (size_t)N * sizeof(int64_t));
    for (int s = 0; s < b->n_segs; s++) {
        for (int64_t i = 0; i < b->segs[s].n; i++) {
            pos_h[b->segs[s].row0 + i] = b->segs[s].pos0 + i;
        }
    }
    /* the rows' positions built on the host, one copy to backend memory */
    st = fwd->ops->mem_copy(&fwd->kctx, pos, pos_h, (size_t)N * sizeof(int64_t), KERN_COPY_H2D);
    if (st == TDM_OK) {
        st = fwd->ops->bf16_round(&fwd->kctx, b->taps, N * n_t * H, cat);
    }
    if (st == TDM_OK) {
        st = fwd->ops->qdq_act8(&fwd->kctx, cat, N, n_t * H, cat);
    }
    if (st == TDM_OK) {
        st = fwd_gemm(fwd, &model->main_proj, cat, n_t * H, N, KERN_GEMM_OUT_BF16, mx, H);
    }
    if (st == TDM_OK) {
        st = fwd->ops->rmsnorm(&fwd->kctx, mx, H, N, H, model->main_norm, (float)c->rms_norm_eps,
                               mx, H);
    }
    if (st == TDM_OK) {
        st = fwd->ops->qdq_act8(&fwd->kctx, mx, N, H, mx);
    }
    for (int k = 0; k < c->n_blocks && st == TDM_OK; k++) {
        int l = c->n_layers + k;
        const engine_layer_weights_t *lw = &model->layers[l];
        st = fwd_gemm(fwd, &lw->wkv, mx, H, N, KERN_GEMM_OUT_BF16, kv, d);
        if (st == TDM_OK) {
            st = fwd->ops->rmsnorm(&fwd->kctx, kv, d, N, d, lw->kv_norm, (float)c->rms_norm_eps, kv,
                                   d);
        }
        if (st == TDM_OK) {
            st = fwd->ops->rope(&fwd->kctx, kv, N, 1, d, (int)c->qk_rope_head_dim, pos,
                                model->rope_freqs[l], KERN_ROPE_FORWARD);
        }
        if (st == TDM_OK) {
            st = fwd->ops->quant_act8(&fwd->kctx, kv, N, d, kc, ks);
        }
        for (int s = 0; s < b->n_segs && st == TDM_OK; s++) {
            st = fwd_ring_write(fwd, &b->segs[s], l, kc, ks);
        }
    }
    return st;
}

/* ---- checks and page reservation -------------------------------------------------------- */

tdm_status_t fwd_check_ids(const engine_config_t *c, const int32_t *ids, int64_t n)
{
    if (ids == NULL || n <= 0) {
        return TDM_ERR_INVALID_ARG;
    }
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= c->vocab_size) {
            tdm_log(TDM_LOG_WARN, "engine", "token id rejected: id=%d vocab=%lld", ids[i],
                    (long long)c->vocab_size);
            return TDM_ERR_INVALID_ARG;
        }
    }
    return TDM_OK;
}

/* Reserve the pages every sequence needs at its new length; all or nothing. */
tdm_status_t fwd_reserve_pages(engine_fwd_t *fwd, engine_seq_t *const *seqs, const int64_t *new_len,
                               int n)
{
    uint32_t need = 0;
    tdm_status_t st = TDM_OK;
    int done = 0;

    for (int i = 0; i < n; i++) {
        for (int s = 0; s < seqs[i]->n_sources; s++) {
            const engine_kv_table_t *t = &seqs[i]->tables[s];
            need += engine_kv_table_pages_needed(
                t, engine_config_n_c(fwd->cfg, t->source_layer, new_len[i] - 1));
        }
    }
    if (need > engine_kv_pool_n_free(fwd->pool)) {
        tdm_log(TDM_LOG_DEBUG, "engine", "kv pool exhausted: need=%u free=%u", need,
                engine_kv_pool_n_free(fwd->pool));
        return TDM_ERR_NO_PAGES;
    }
    for (done = 0; done < n && st == TDM_OK; done++) {
        for (int s = 0; s < seqs[done]->n_sources && st == TDM_OK; s++) {
            engine_kv_table_t *t = &seqs[done]->tables[s];
            st = engine_kv_table_reserve(
                fwd->pool, t, engine_config_n_c(fwd->cfg, t->source_layer, new_len[done] - 1));
        }
    }
    if (st != TDM_OK) {
        for (int i = 0; i < n; i++) {
            for (int s = 0; s < seqs[i]->n_sources; s++) {
                engine_kv_table_truncate(fwd->pool, &seqs[i]->tables[s], seqs[i]->tables[s].n_rows);
            }
        }
    }
    return st;
}

/* Commit the ids of segment rows to the sequence history and its length. */
void fwd_commit_rows(const fwd_seg_t *seg)
{
    for (int64_t i = 0; i < seg->n; i++) {
        engine_seq_set_id(seg->seq, seg->pos0 + i, seg->ids[i]);
    }
    if (seg->pos0 + seg->n > seg->seq->length) {
        seg->seq->length = seg->pos0 + seg->n;
    }
}

/*
 * Run a batch: layers [0, lower_end) on every row, then (all_layers) layers [lower_end, L) on
 * every row with window floor upper_lo, DSpark rings, and the head on the requested rows.
 * logit_rows: for each segment, how many of its last rows get logits (0 = none); logits_out
 * holds them in segment order. (The CED split of a prefill, with the layers above the cut on
 * the tail rows only, is forward_batch.c's.)
 */
/* Greedy tokens of batch rows [r0, r0 + n) into tokens_out (host): the head into head_scratch,
 * ops->argmax on the backend, one device-to-host copy of n ids (no logits leave the backend). */
static tdm_status_t head_tokens(engine_fwd_t *fwd, const fwd_batch_t *b, int64_t r0, int64_t n,
                                int32_t *tokens_out)
{
    const float *logits = NULL;
    int64_t V = fwd->cfg->vocab_size;
    int32_t *ids_dev;
    tdm_status_t st = fwd_head_logits(fwd, b, r0, n, &logits);

    if (st != TDM_OK) {
        return st;
    }
    ids_dev = fwd_alloc(fwd, (size_t)n * sizeof(int32_t));
    if (ids_dev == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    st = fwd->ops->argmax(&fwd->kctx, logits, V, n, V, ids_dev);
    if (st == TDM_OK || st == TDM_ERR_INTERNAL) {
        /* a row with a NaN, +inf or no finite logit comes back as -1 and fails alone (its
         * caller fails that sequence's request, as the sampler refuses such a row of logits);
         * an error that left no -1, or an id out of range, is the whole call's */
        int bad_rows = st == TDM_ERR_INTERNAL;
        tdm_status_t cp = fwd->ops->mem_copy(&fwd->kctx, tokens_out, ids_dev,
                                             (size_t)n * sizeof(int32_t), KERN_COPY_D2H);
        int n_bad = 0;

        st = cp;
        for (int64_t i = 0; i < n && st == TDM_OK; i++) {
            n_bad += tokens_out[i] == -1;
            if (tokens_out[i] < -1 || tokens_out[i] >= V) {
                st = TDM_ERR_INTERNAL;
            }
        }
        if (st == TDM_OK && bad_rows && n_bad == 0) {
            st = TDM_ERR_INTERNAL;
        }
    }
    return st;
}

/* Layers, DSpark rings and head of a batch: logits of the logit_rows[s] last rows of each
 * segment into logits_out (host, [rows, V]) or, with logits_out NULL and tokens_out set, their
 * greedy tokens into tokens_out (host, [rows]); neither: no head. */
static tdm_status_t run_batch(engine_fwd_t *fwd, fwd_batch_t *b, int lower_end, int64_t upper_lo,
                              const int64_t *logit_rows, int all_layers, float *logits_out,
                              int32_t *tokens_out)
{
    const engine_config_t *c = fwd->cfg;
    tdm_status_t st = TDM_OK;
    int64_t V = c->vocab_size;
    int64_t out_row = 0;

    st = fwd_batch_embed(fwd, b);
    if (st == TDM_OK) { /* Engram rows of this batch, gathered while the layers before run */
        st = fwd_engram_ahead(fwd, b, all_layers ? c->n_layers : lower_end);
    }
    for (int l = 0; l < lower_end && st == TDM_OK; l++) {
        st = fwd_layer_run(fwd, b, l);
    }
    if (st != TDM_OK || !all_layers) {
        return st;
    }
    for (int s = 0; s < b->n_segs; s++) {
        b->segs[s].lo = upper_lo; /* window floor of layers above the cut (6(b) step 3) */
    }
    for (int l = lower_end; l < c->n_layers && st == TDM_OK; l++) {
        st = fwd_layer_run(fwd, b, l);
    }
    if (st == TDM_OK) {
        st = fwd_dspark_rings(fwd, b);
    }
    /* the head once over each run of adjacent logit rows (a decode batch: one call, the head
     * read once per step; rows are independent in the GEMM, so the bits do not change) */
    int64_t run0 = 0, run_n = 0;
    for (int s = 0; s <= b->n_segs && st == TDM_OK && (logits_out != NULL || tokens_out != NULL);
         s++) {
        const fwd_seg_t *seg = s < b->n_segs ? &b->segs[s] : NULL;
        int64_t n = seg == NULL ? 0 : (logit_rows[s] < seg->n ? logit_rows[s] : seg->n);
        int64_t first = seg == NULL ? 0 : seg->row0 + seg->n - n;
        if (n > 0 && run_n > 0 && first == run0 + run_n) {
            run_n += n;
            continue;
        }
        if (run_n > 0) {
            st = logits_out != NULL ? fwd_head_rows(fwd, b, run0, run_n, logits_out + out_row * V)
                                    : head_tokens(fwd, b, run0, run_n, tokens_out + out_row);
            out_row += run_n;
        }
        run0 = first;
        run_n = n;
    }
    return st;
}

/* run_batch of a decode batch or a verify (every layer, a head) with the deferred status word
 * on (one device): the router reports a NaN row through the word instead of waiting for the stream
 * in every MoE layer, and new KV rows mark their page headers on the backend (ops->page_mark)
 * instead of a copy to the host and back; the word is read once, after the head's copy to the
 * host has waited anyway.
 * A set word fails the whole call with TDM_ERR_INTERNAL, as the router's own status did. */
static tdm_status_t run_batch_deferred(engine_fwd_t *fwd, fwd_batch_t *b, const int64_t *logit_rows,
                                       float *logits_out, int32_t *tokens_out)
{
    int32_t word = 0;
    int deferred = fwd->params.comm == NULL && fwd->status_word != NULL;
    tdm_status_t st = TDM_OK;

    if (deferred) {
        st = fwd->ops->mem_set(&fwd->kctx, fwd->status_word, 0, sizeof(int32_t));
        fwd->kctx.status_word = fwd->status_word;
    }
    if (st == TDM_OK) {
        st = run_batch(fwd, b, fwd->cfg->n_layers, 0, logit_rows, 1, logits_out, tokens_out);
    }
    fwd->kctx.status_word = NULL;
    if (deferred && st == TDM_OK) {
        st = fwd->ops->mem_copy(&fwd->kctx, &word, fwd->status_word, sizeof(word), KERN_COPY_D2H);
        if (st == TDM_OK && word != 0) {
            tdm_log(TDM_LOG_ERROR, "engine", "decode or verify step failed on the backend:%s%s%s",
                    (word & KERN_STATUS_ROUTE_NAN) != 0 ? " nan reached the expert top-k" : "",
                    (word & KERN_STATUS_TOPK_NAN) != 0 ? " nan reached the index top-k" : "",
                    (word & KERN_STATUS_PAGE_HEADER) != 0 ? " a KV page without a valid header"
                                                          : "");
            st = TDM_ERR_INTERNAL;
        }
    }
    return st;
}

/* ---- schedules -------------------------------------------------------------------------- */

tdm_status_t engine_fwd_prefill(engine_fwd_t *fwd, engine_seq_t *seq, const int32_t *ids,
                                int64_t n_ids, uint32_t flags, float *logits_out,
                                int64_t *tail_start_out)
{
    engine_prefill_part_t part;
    int64_t H, T;
    tdm_status_t st;

    if (fwd == NULL || seq == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    st = fwd_check_ids(fwd->cfg, ids, n_ids);
    if (st != TDM_OK) {
        return st;
    }
    H = seq->length;
    T = H + n_ids;
    part = (engine_prefill_part_t){seq, H, T, ids, n_ids, flags, logits_out, 0};
    st = engine_fwd_prefill_parts(fwd, &part, 1);
    if (st == TDM_OK && tail_start_out != NULL) {
        *tail_start_out = fwd_tail_start(fwd->cfg, H, T, flags);
    }
    return st;
}

tdm_status_t engine_fwd_oracle(engine_fwd_t *fwd, const int32_t *ids, int64_t n_ids,
                               float *logits_out)
{
    engine_seq_t *seq = NULL;
    tdm_status_t st;

    if (fwd == NULL || logits_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    st = engine_seq_create(fwd->model, fwd->pool, &seq);
    if (st != TDM_OK) {
        return st;
    }
    st = engine_fwd_prefill(fwd, seq, ids, n_ids,
                            ENGINE_PREFILL_TAIL_FROM_H | ENGINE_PREFILL_ALL_LOGITS, logits_out,
                            NULL);
    engine_seq_destroy(seq);
    return st;
}

tdm_status_t engine_fwd_decode(engine_fwd_t *fwd, engine_seq_t *const *seqs, const int32_t *ids,
                               int n_seqs, float *logits_out)
{
    int64_t n_ids[ENGINE_FWD_MAX_BATCH];

    if (n_seqs < 1 || n_seqs > ENGINE_FWD_MAX_BATCH) {
        return TDM_ERR_INVALID_ARG;
    }
    for (int i = 0; i < n_seqs; i++) {
        n_ids[i] = 1;
    }
    return engine_fwd_decode_multi(fwd, seqs, ids, n_ids, n_seqs, logits_out);
}

/* engine_fwd_decode_multi's work: logits into logits_out or (logits_out NULL) greedy tokens
 * into tokens_out. */
static tdm_status_t decode_rows(engine_fwd_t *fwd, engine_seq_t *const *seqs, const int32_t *ids,
                                const int64_t *n_ids, int n_seqs, float *logits_out,
                                int32_t *tokens_out)
{
    fwd_seg_t segs[ENGINE_FWD_MAX_BATCH];
    int64_t new_len[ENGINE_FWD_MAX_BATCH];
    fwd_batch_t b;
    int64_t n_rows = 0;
    tdm_status_t st;

    if (fwd == NULL || seqs == NULL || ids == NULL || n_ids == NULL ||
        (logits_out == NULL) == (tokens_out == NULL) || n_seqs < 1 ||
        n_seqs > ENGINE_FWD_MAX_BATCH) {
        return TDM_ERR_INVALID_ARG;
    }
    for (int i = 0; i < n_seqs; i++) {
        if (seqs[i] == NULL || n_ids[i] < 1 || n_ids[i] > fwd->cfg->sliding_window ||
            seqs[i]->length + n_ids[i] > fwd->cfg->max_position_embeddings) {
            return TDM_ERR_INVALID_ARG;
        }
        for (int j = 0; j < i; j++) {
            if (seqs[j] == seqs[i]) {
                return TDM_ERR_INVALID_ARG;
            }
        }
        new_len[i] = seqs[i]->length + n_ids[i];
        segs[i] = (fwd_seg_t){seqs[i], i, seqs[i]->length, n_ids[i], n_rows, 0, 1, ids + n_rows, 0};
        n_rows += n_ids[i];
    }
    if (n_rows > fwd_max_rows(fwd)) {
        return TDM_ERR_INVALID_ARG;
    }
    st = fwd_check_ids(fwd->cfg, ids, n_rows);
    if (st != TDM_OK) {
        return st;
    }
    st = fwd_reserve_pages(fwd, seqs, new_len, n_seqs);
    if (st != TDM_OK) {
        return st;
    }
    memset(&b, 0, sizeof(b));
    fwd_batch_reset(fwd);
    b.segs = segs;
    b.n_segs = n_seqs;
    st = fwd_batch_alloc(fwd, &b, n_rows);
    if (st == TDM_OK) {
        st = run_batch_deferred(fwd, &b, n_ids, logits_out, tokens_out);
    }
    for (int i = 0; i < n_seqs && st == TDM_OK; i++) {
        fwd_commit_rows(&segs[i]);
    }
    return st;
}

tdm_status_t engine_fwd_decode_multi(engine_fwd_t *fwd, engine_seq_t *const *seqs,
                                     const int32_t *ids, const int64_t *n_ids, int n_seqs,
                                     float *logits_out)
{
    if (logits_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    return decode_rows(fwd, seqs, ids, n_ids, n_seqs, logits_out, NULL);
}

tdm_status_t engine_fwd_decode_greedy(engine_fwd_t *fwd, engine_seq_t *const *seqs,
                                      const int32_t *ids, int n_seqs, int32_t *tokens_out)
{
    int64_t n_ids[ENGINE_FWD_MAX_BATCH];

    if (tokens_out == NULL || n_seqs < 1 || n_seqs > ENGINE_FWD_MAX_BATCH) {
        return TDM_ERR_INVALID_ARG;
    }
    for (int i = 0; i < n_seqs; i++) {
        n_ids[i] = 1;
    }
    return decode_rows(fwd, seqs, ids, n_ids, n_seqs, NULL, tokens_out);
}

/* The DSpark draft forward (engine_fwd_dspark_draft): the collapse into x_dev (backend memory),
 * or, with x_dev NULL, into the layer arena and from there into x_host (host memory). */
static tdm_status_t dspark_draft(engine_fwd_t *fwd, engine_seq_t *const *seqs,
                                 const int32_t *anchors, int n_seqs, float *x_dev, float *x_host)
{
    const engine_config_t *c;
    fwd_seg_t segs[ENGINE_FWD_MAX_BATCH];
    fwd_batch_t b;
    int64_t B, N;
    tdm_status_t st;

    if (fwd == NULL || seqs == NULL || anchors == NULL || (x_dev == NULL && x_host == NULL) ||
        n_seqs < 1 || n_seqs > ENGINE_FWD_MAX_BATCH || fwd->cfg->n_blocks == 0) {
        return TDM_ERR_INVALID_ARG;
    }
    c = fwd->cfg;
    B = c->dspark_block_size;
    N = B * n_seqs;
    if (N > fwd_max_rows(fwd)) {
        return TDM_ERR_INVALID_ARG;
    }
    st = fwd_check_ids(c, anchors, n_seqs);
    if (st != TDM_OK) {
        return st;
    }
    memset(&b, 0, sizeof(b));
    fwd_batch_reset(fwd);
    for (int i = 0; i < n_seqs; i++) {
        if (seqs[i] == NULL || seqs[i]->length < 1) {
            return TDM_ERR_INVALID_ARG;
        }
        /* a draft segment's ids are its anchor; fwd_batch_embed adds the noise tokens */
        segs[i] = (fwd_seg_t){seqs[i], i, seqs[i]->length, B, i * B, 0, 0, anchors + i, 1};
    }
    b.segs = segs;
    b.n_segs = n_seqs;
    st = fwd_batch_alloc(fwd, &b, N);
    if (st != TDM_OK) {
        return st;
    }
    st = fwd_batch_embed(fwd, &b); /* X = m copies of the block tokens' embeddings, pre = e0 */
    for (int k = 0; k < c->n_blocks && st == TDM_OK; k++) {
        st = fwd_layer_run(fwd, &b, c->n_layers + k);
    }
    if (st == TDM_OK && x_dev == NULL) {
        fwd_layer_reset(fwd);
        x_dev = fwd_alloc(fwd, FLOAT_BYTES(N * c->hidden_size));
        st = x_dev == NULL ? TDM_ERR_NO_MEMORY : TDM_OK;
    }
    if (st == TDM_OK) {
        st = fwd->ops->mhc_collapse(&fwd->kctx, b.pre, b.X, N, (int)c->hc_mult, c->hidden_size,
                                    x_dev);
    }
    if (st == TDM_OK && x_host != NULL) {
        st = fwd->ops->mem_copy(&fwd->kctx, x_host, x_dev, FLOAT_BYTES(N * c->hidden_size),
                                KERN_COPY_D2H);
    }
    return st;
}

tdm_status_t engine_fwd_dspark_draft(engine_fwd_t *fwd, engine_seq_t *const *seqs,
                                     const int32_t *anchors, int n_seqs, float *x_out)
{
    if (x_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    return dspark_draft(fwd, seqs, anchors, n_seqs, NULL, x_out);
}

tdm_status_t fwd_dspark_draft_backend(engine_fwd_t *fwd, engine_seq_t *const *seqs,
                                      const int32_t *anchors, int n_seqs, float *x_out)
{
    if (x_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    return dspark_draft(fwd, seqs, anchors, n_seqs, x_out, NULL);
}

tdm_status_t engine_fwd_verify(engine_fwd_t *fwd, engine_seq_t *seq, const int32_t *ids,
                               int64_t n_ids, float *logits_out)
{
    fwd_seg_t seg;
    fwd_batch_t b;
    int64_t new_len, want;
    tdm_status_t st;

    if (fwd == NULL || seq == NULL || logits_out == NULL || n_ids < 1 ||
        n_ids > fwd->cfg->sliding_window || n_ids > fwd->params.max_chunk_tokens) {
        return TDM_ERR_INVALID_ARG;
    }
    st = fwd_check_ids(fwd->cfg, ids, n_ids);
    if (st != TDM_OK) {
        return st;
    }
    new_len = seq->length + n_ids;
    if (new_len > fwd->cfg->max_position_embeddings) {
        return TDM_ERR_INVALID_ARG;
    }
    st = fwd_reserve_pages(fwd, &seq, &new_len, 1);
    if (st != TDM_OK) {
        return st;
    }
    seg = (fwd_seg_t){seq, 0, seq->length, n_ids, 0, 0, 1, ids, 0};
    want = n_ids;
    memset(&b, 0, sizeof(b));
    fwd_batch_reset(fwd);
    b.segs = &seg;
    b.n_segs = 1;
    st = fwd_batch_alloc(fwd, &b, n_ids);
    if (st == TDM_OK) {
        st = run_batch_deferred(fwd, &b, &want, logits_out, NULL);
    }
    if (st == TDM_OK) {
        fwd_commit_rows(&seg);
    }
    return st;
}

tdm_status_t engine_fwd_replay(engine_fwd_t *fwd, engine_seq_t *seq, const int32_t *ids,
                               int64_t n_ids, engine_replay_mode_t mode, float *logits_out)
{
    const engine_config_t *c;
    int64_t H, Wp, need_ids, want;
    fwd_seg_t seg;
    fwd_batch_t b;
    int recovery = mode == ENGINE_REPLAY_RECOVERY;
    tdm_status_t st;

    if (fwd == NULL || seq == NULL || ids == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    c = fwd->cfg;
    H = seq->length;
    Wp = H < c->sliding_window ? H : c->sliding_window;
    need_ids = H - Wp < c->engram_max_ngram_size - 1 ? H : Wp + c->engram_max_ngram_size - 1;
    if (H == 0 || n_ids < need_ids || n_ids > H || Wp > fwd->params.max_chunk_tokens) {
        return TDM_ERR_INVALID_ARG;
    }
    st = fwd_check_ids(c, ids, n_ids);
    if (st != TDM_OK) {
        return st;
    }
    for (int64_t i = 0; i < n_ids && i < seq->n_ids_cap; i++) {
        int64_t p = H - 1 - i;
        engine_seq_set_id(seq, p, ids[n_ids - 1 - i]);
    }
    seg = (fwd_seg_t){seq, 0, H - Wp, Wp, 0, H - Wp, 0, ids + (n_ids - Wp), 0};
    want = recovery && logits_out != NULL ? 1 : 0;
    memset(&b, 0, sizeof(b));
    fwd_batch_reset(fwd);
    b.segs = &seg;
    b.n_segs = 1;
    st = fwd_batch_alloc(fwd, &b, Wp);
    if (st == TDM_OK) {
        st = run_batch(fwd, &b, recovery ? c->n_layers : c->ced_cut + 1, H - Wp, &want, recovery,
                       logits_out, NULL);
    }
    return st;
}
