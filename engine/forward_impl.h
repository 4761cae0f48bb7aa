/* forward_impl.h - what the forward pass's files share (forward.c: schedules and batching;
 * forward_batch.c: the CED prefill of several parts in one batch; forward_layer.c: one layer on a
 * batch of rows; forward_attn.c: attention, compressor and selection). Not a public header: other
 * modules use engine/forward.h.
 */
#ifndef TANDEM_ENGINE_FORWARD_IMPL_H
#define TANDEM_ENGINE_FORWARD_IMPL_H

#include "common/arena.h"
#include "engine/forward.h"
#include "engine/model_impl.h"
#include "engine/seq_state_impl.h"

/* Query rows whose selected rows fwd_attention gathers with one pointer copy and one
 * dequant_rows (decode batches: one or a few groups per layer instead of one per row). */
#define FWD_SEL_GROUP 16

/* Most index-source layers a config may have. */
#define FWD_MAX_INDEX_SOURCES ENGINE_CONFIG_MAX_LAYERS

/*
 * fwd_seg_t - the rows of one sequence in a batch: positions [pos0, pos0 + n), batch rows
 * [row0, row0 + n), window floor lo. write_rows = 0 in a replay (rows and index keys below H
 * are never rewritten) and a draft. ids: [n] the rows' token ids (host memory); for a draft
 * segment [1], the anchor (its other n - 1 rows are the noise token).
 */
typedef struct {
    engine_seq_t *seq;
    int seq_index;
    int64_t pos0;
    int64_t n;
    int64_t row0;
    int64_t lo;
    int write_rows;
    const int32_t *ids;
    int draft; /* DSpark block tokens: non-causal over ring [max(pos0 - W, 0), pos0) plus all n
                  rows, never written to a ring (MODEL.md 8, draft forward) */
} fwd_seg_t;

/*
 * fwd_batch_t - per-row arrays of a batch of N rows (all from the context's arena).
 *
 * X:        [N, m, H] residual streams (BF16 values).
 * pre:      [N, m] pre of the previous FFN site (e0 before layer 0).
 * sel:      per index-source ordinal s: [N, k_I] selection S(t), ascending, -1 padded.
 * sel_h:    the same selections in host memory (fwd->batch_host_arena): what the host needs of
 *           them (the selected rows' page pointers) without a copy back per layer.
 * pool:     [N, n_B] block ids of the candidate pool P(t).
 * n_pool_h: [N] host: the pool's size per row (-1: no pool computed).
 * experts:  [N, K] routed experts of the last layer run (ascending), for dumps.
 * taps:     [N, n_t, H] FP32 stream means entering each tap layer (DSpark).
 */
typedef struct {
    int64_t N;
    fwd_seg_t *segs;
    int n_segs;
    float *X;
    float *pre;
    int32_t *sel[FWD_MAX_INDEX_SOURCES];
    int32_t *sel_h[FWD_MAX_INDEX_SOURCES];
    int32_t *pool;
    int32_t *n_pool_h;
    int32_t *experts;
    float *taps;
    int have_taps;
    /* bit s: the rows of Engram slot s were gathered ahead for this batch (fwd_engram_ahead) and
     * wait in fwd->engram_rows under ticket fwd->engram_ahead[s]; 0: gathered in the layer */
    uint32_t engram_ready;
} fwd_batch_t;

struct engine_fwd {
    const engine_model_t *model;
    const engine_config_t *cfg;
    engine_kv_pool_t *pool;
    const kern_ops_t *ops;
    kern_ctx_t kctx;
    engine_fwd_params_t params;
    engine_dump_sink_t sink;
    int have_sink;
    tdm_arena_t batch_arena;      /* per-call arrays of fwd_batch_t */
    tdm_arena_t batch_host_arena; /* their host arrays (sel_h, n_pool_h), reset with it */
    tdm_arena_t layer_arena; /* per-layer temporaries, reset every layer (backend memory) */
    tdm_arena_t host_arena;  /* per-layer host staging (metadata, D2H/H2D copies), reset with it */
    float *ikey_cache;       /* dequantized index keys of one source, grown on demand */
    int64_t ikey_cap_rows;
    float *ckv_cache; /* dequantized compressed rows of one table (prefill chunks) */
    int64_t ckv_cap_rows;
    float *head_scratch; /* [head_cap_rows, V] head logits (backend memory) before they are
                            copied to the caller, grown on demand (ops->mem_alloc) */
    int64_t head_cap_rows;
    /* ops->mem_alloc memory under the layer and batch arenas (NULL: arenas own malloc memory,
     * the host_memory = 1 backends) */
    void *layer_mem;
    void *batch_mem;
    int n_index_sources;
    int index_source_layer[FWD_MAX_INDEX_SOURCES];
    /* data-parallel expert parallel (forward_ep.c): every rank's round header, device and host
     * copies [n_ranks, ep_hdr_words] int64, and the served rows' buffers (grown on demand) */
    int64_t *ep_hdr_dev;
    int64_t *ep_hdr_host;
    int64_t ep_hdr_words;
    float *ep_buf;
    int64_t ep_buf_rows;
    uint64_t read_weight_bytes; /* engine_fwd_read_bytes counters */
    uint64_t read_kv_bytes;
    uint64_t attn_flops; /* engine_fwd_attn_flops */
    /* runs of each expert of each MoE layer slot ([n_layers + n_blocks][moe_e_max] int64,
     * backend memory), counted by ops->moe_ffn on the backend and read only by
     * engine_fwd_read_bytes */
    int64_t *moe_active;
    int64_t moe_e_max;
    /* the deferred status word of decode steps (kern_ctx_t.status_word; backend int32) */
    int32_t *status_word;
    /* Engram rows gathered ahead (issue 14 item 4; fwd_engram_ahead): per Engram slot s, its
     * rows [ENGINE_FWD_MAX_BATCH, n_cols * d_e] f32 at engram_rows + s * that, and their codes
     * then scales pointers [2 * ENGINE_FWD_MAX_BATCH * n_cols] at engram_ptrs + s * that
     * (backend memory; NULL without Engram layers); the ticket of each slot's gather */
    float *engram_rows;
    const uint8_t **engram_ptrs;
    kern_ahead_t engram_ahead[ENGINE_CONFIG_MAX_ENGRAM_LAYERS];
};

/* fwd_gemm - ops->gemm on the context's kernel context, counting the matrix's resident bytes
 * (kern_mat_bytes: its format's bytes, scales included) into read_weight_bytes. */
static inline tdm_status_t fwd_gemm(engine_fwd_t *fwd, const kern_mat_t *w, const float *x,
                                    int64_t ldx, int64_t n_rows, uint32_t flags, float *y_out,
                                    int64_t ldy)
{
    fwd->read_weight_bytes += (uint64_t)kern_mat_bytes(w);
    return fwd->ops->gemm(&fwd->kctx, w, x, ldx, n_rows, flags, y_out, ldy);
}

/* fwd_copy - n_bytes from src to dst, both the backend's memory (activations, rings, pending
 * halves, selections), through ops->mem_copy: memmove on the CPU, a device copy on CUDA. */
static inline tdm_status_t fwd_copy(engine_fwd_t *fwd, void *dst, const void *src, size_t n_bytes)
{
    return fwd->ops->mem_copy(&fwd->kctx, dst, src, n_bytes, KERN_COPY_D2D);
}

/* fwd_to_host - n_bytes of backend memory src into host memory dst (KERN_COPY_D2H: complete when
 * it returns, so host code may read dst at once; on CUDA it waits for the stream). */
static inline tdm_status_t fwd_to_host(engine_fwd_t *fwd, void *dst, const void *src,
                                       size_t n_bytes)
{
    return fwd->ops->mem_copy(&fwd->kctx, dst, src, n_bytes, KERN_COPY_D2H);
}

/* fwd_to_backend - n_bytes of host memory src (e.g. fwd_host_alloc staging) into backend memory
 * dst (KERN_COPY_H2D; src may be reused as soon as it returns). */
static inline tdm_status_t fwd_to_backend(engine_fwd_t *fwd, void *dst, const void *src,
                                          size_t n_bytes)
{
    return fwd->ops->mem_copy(&fwd->kctx, dst, src, n_bytes, KERN_COPY_H2D);
}

/* fwd_index_ordinal - ordinal of index-source `layer` among index_source_layer_ids, or -1. */
int fwd_index_ordinal(const engine_fwd_t *fwd, int layer);

/*
 * fwd_layer_run - backbone layer or DSpark block `l` on every row of the batch (MODEL.md 5.1 to
 * 5.6): Engram, attention site (window ring read and written, compressor rows and index keys
 * published into the sequences' pages when the segment writes rows, selections into b->sel),
 * FFN site. Updates b->X and b->pre in place; calls the dump sink.
 */
tdm_status_t fwd_layer_run(engine_fwd_t *fwd, fwd_batch_t *b, int l);

/*
 * fwd_attention - the attention sublayer of layer l on normed input xn [N, H] (BF16 values):
 * writes out [N, H]. Reads and writes rings, pages, pending halves, selections.
 */
tdm_status_t fwd_attention(engine_fwd_t *fwd, fwd_batch_t *b, int l, const float *xn,
                           int32_t *sel_used, float *out);

/* fwd_ring_run - how many positions from p (< end) have consecutive slots in a window ring of
 * seq (up to the ring's wrap): min(C - p % C, end - p). */
int64_t fwd_ring_run(const engine_seq_t *seq, int64_t p, int64_t end);

/*
 * fwd_ring_write - the window ring entries of segment rows [0, seg->n) of layer (or DSpark
 * block) l from the batch's Q_act8 rows kc [N, d] / ks [N, d / 32]: one ops->mem_copy per
 * contiguous run of ring slots (at most two per ring). Nothing for a draft segment.
 */
tdm_status_t fwd_ring_write(engine_fwd_t *fwd, const fwd_seg_t *seg, int l, const uint8_t *kc,
                            const uint8_t *ks);

/*
 * fwd_engram_ahead - start, on the backend's side queue (ops->rows_ahead), the Engram table-row
 * gathers of every Engram layer below n_layers_run for a batch of at most ENGINE_FWD_MAX_BATCH
 * rows, right after fwd_batch_embed (run_batch: decode steps, verifies, replays): the rows
 * depend only on token ids, so on a GPU their reads from pinned host memory overlap the layers
 * before each Engram layer; fwd_layer_run's Engram step waits for its slot (ops->ahead_wait)
 * instead of gathering. Larger batches and the paths that do not call this (prefill passes,
 * multi-sequence replay, the DSpark draft) gather in the layer, as before. Same rows, same bits
 * either way. A slot still pending from a batch that failed before its Engram layer is waited
 * for here before its buffers are rewritten. Sets b->engram_ready. TDM_OK, TDM_ERR_NO_MEMORY,
 * or the ops' errors (b->engram_ready then has only the started slots).
 */
tdm_status_t fwd_engram_ahead(engine_fwd_t *fwd, fwd_batch_t *b, int n_layers_run);

/* fwd_alloc - n_bytes of backend memory (what ops read and write: device memory on CUDA) from
 * the layer arena, 64-byte aligned; NULL when it is full. Host code never dereferences it: it
 * moves such bytes with ops->mem_copy (KERN_COPY_D2H / H2D) through fwd_host_alloc staging. */
void *fwd_alloc(engine_fwd_t *fwd, size_t n_bytes);

/* fwd_host_alloc - n_bytes of host memory (row metadata, positions, pointer arrays, staging of
 * small D2H/H2D copies) from the host arena, 64-byte aligned; NULL when it is full. Valid until
 * the next fwd_layer_reset. */
void *fwd_host_alloc(engine_fwd_t *fwd, size_t n_bytes);

/* fwd_layer_reset - release everything fwd_alloc and fwd_host_alloc handed out (both arenas). */
void fwd_layer_reset(engine_fwd_t *fwd);

/* fwd_grow_rows - *buf [*cap_rows, dim] FP32 backend memory (ops->mem_alloc) grown, doubling
 * from 1024 rows, to hold n rows; the contents are NOT kept across a growth (callers rewrite
 * the rows they use). Freed by engine_fwd_destroy with ops->mem_free. TDM_OK or
 * TDM_ERR_NO_MEMORY (buffer unchanged). */
tdm_status_t fwd_grow_rows(engine_fwd_t *fwd, float **buf, int64_t *cap_rows, int64_t n,
                           int64_t dim);

/* fwd_max_rows - most rows of one batch: max(max_chunk_tokens, ENGINE_FWD_MAX_BATCH). */
int64_t fwd_max_rows(const engine_fwd_t *fwd);

/* fwd_batch_alloc - the per-row arrays of a batch of N rows from the batch arenas (b->segs and
 * n_segs are the caller's); n_pool_h all -1. TDM_OK or TDM_ERR_NO_MEMORY (arena full). */
tdm_status_t fwd_batch_alloc(engine_fwd_t *fwd, fwd_batch_t *b, int64_t N);

/* fwd_batch_reset - release every batch fwd_batch_alloc handed out (both batch arenas). */
void fwd_batch_reset(engine_fwd_t *fwd);

/* fwd_batch_embed - X = m copies of each row's embedding (R1), pre = e0: the segments' ids
 * staged on the host and copied to backend memory once, one ops->embed per segment. Resets the
 * layer arenas. TDM_OK, TDM_ERR_NO_MEMORY, or the ops' errors. */
tdm_status_t fwd_batch_embed(engine_fwd_t *fwd, fwd_batch_t *b);

/* fwd_head_logits - the head on batch rows [r0, r0 + n) (collapse with the last FFN pre, final
 * norm, head GEMM) into fwd->head_scratch (grown to n rows): *logits_out = that [n, V] f32
 * backend memory, valid until the next head call. Resets the layer arenas. TDM_OK,
 * TDM_ERR_NO_MEMORY (nothing else changed), or the ops' errors. */
tdm_status_t fwd_head_logits(engine_fwd_t *fwd, const fwd_batch_t *b, int64_t r0, int64_t n,
                             const float **logits_out);

/* fwd_head_rows - logits_out [n, V] (the caller's host memory) of batch rows [r0, r0 + n):
 * fwd_head_logits, then one device-to-host copy. */
tdm_status_t fwd_head_rows(engine_fwd_t *fwd, const fwd_batch_t *b, int64_t r0, int64_t n,
                           float *logits_out);

/* fwd_dspark_rings - the DSpark context rings of every block for the batch's rows (MODEL.md 8,
 * from b->taps); nothing for a model without blocks. Resets the layer arena. */
tdm_status_t fwd_dspark_rings(engine_fwd_t *fwd, const fwd_batch_t *b);

/* fwd_dspark_draft_backend - engine_fwd_dspark_draft with x_out [n_seqs, B, H] in the model's
 * backend memory (ops->mem_alloc: device memory on CUDA), where the DSpark heads' ops read it
 * (engine/spec.c); the public call's x_out is host memory (one device-to-host copy). */
tdm_status_t fwd_dspark_draft_backend(engine_fwd_t *fwd, engine_seq_t *const *seqs,
                                      const int32_t *anchors, int n_seqs, float *x_out);

/* fwd_tail_start - the tail start R of a CED prefill of [start, end) (MODEL.md 6(b) step 2):
 * max(start, end - W), or start with the test-only ENGINE_PREFILL_TAIL_FROM_H in flags. */
static inline int64_t fwd_tail_start(const engine_config_t *c, int64_t start, int64_t end,
                                     uint32_t flags)
{
    int64_t from_window = end - c->sliding_window;

    if ((flags & ENGINE_PREFILL_TAIL_FROM_H) != 0) {
        return start;
    }
    return from_window > start ? from_window : start;
}

/* fwd_check_ids - TDM_OK when ids [n] (n > 0) all lie in the vocabulary, else
 * TDM_ERR_INVALID_ARG (logged). */
tdm_status_t fwd_check_ids(const engine_config_t *c, const int32_t *ids, int64_t n);

/* fwd_reserve_pages - reserve the pages each of seqs [n] needs at length new_len[i]; all or
 * nothing: TDM_OK, or TDM_ERR_NO_PAGES with every table as it was. */
tdm_status_t fwd_reserve_pages(engine_fwd_t *fwd, engine_seq_t *const *seqs, const int64_t *new_len,
                               int n);

/* fwd_commit_rows - write the segment's ids into its sequence's history and extend its length
 * to pos0 + n. */
void fwd_commit_rows(const fwd_seg_t *seg);

/* forward_ep.c: the expert-parallel MoE (engine_fwd_params_t.comm). fwd_ep_init / fini make and
 * free the round headers (data-parallel only). fwd_ep_routed adds the routed experts' outputs
 * into acc [N, H] for the expert-sorted rows of layer `layer` (rows, we, host offsets off [E+1],
 * N*K = NK rows, xq [N, H]): all-gather (replicated) or all-to-all (data-parallel) between the
 * ranks, the additions in ascending expert order either way. xe, gu, h: [N, H], [N, 2I],
 * [N, I] scratch. */
tdm_status_t fwd_ep_init(engine_fwd_t *fwd);
void fwd_ep_fini(engine_fwd_t *fwd);
tdm_status_t fwd_ep_routed(engine_fwd_t *fwd, int layer, const float *xq, const int64_t *rows,
                           const float *we, const int64_t *off, int64_t NK, float *xe, float *gu,
                           float *h, float *acc);

/* forward_layer.c: routed expert e of layer lw on ne rows xe [ne, H] (already gathered) with
 * routing weights we [ne]: SwiGLU(w1, w3), Q_act8, w2 into y [ne, H] (R8); gu [ne, 2I] and
 * h [ne, I] scratch. */
tdm_status_t fwd_expert_ffn(engine_fwd_t *fwd, const engine_layer_weights_t *lw, int64_t e,
                            const float *xe, const float *we, int64_t ne, float *gu, float *h,
                            float *y);

#endif
