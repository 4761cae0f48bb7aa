/* forward.h - the forward pass of MODEL.md section 5 under the schedules of section 6.
 *
 * An engine_fwd_t is one forward context: it borrows a model (engine/model.h) and a page pool
 * (engine/kv_cache.h), owns its scratch arenas (sized at create, reset every call: no malloc in
 * the decode loop) and an optional dump sink. Schedules:
 *   (a) engine_fwd_oracle   - a fresh sequence, every token through every layer, window floor 0;
 *   (b) engine_fwd_prefill  - CED prefill of [H, T) continuing a sequence at H: layers 0..c on
 *                             every token (chunked), layers c+1..L-1 on the tail [R, T),
 *                             R = max(H, T - W) (ENGINE_PREFILL_TAIL_FROM_H: R = H, tests only);
 *   (c) engine_fwd_decode   - one token for each of a batch of sequences (bit-identical to each
 *                             sequence alone: every reduction is per row, in a fixed order);
 *       engine_fwd_verify   - a few tokens of one sequence, exact (multi-token decode);
 *   (d) engine_fwd_replay   - SWA bounded replay of the rings at H (canonical: layers 0..c;
 *                             recovery: every layer).
 * Logits are FP32 [rows, V]. Only one call at a time per context (the context is not
 * thread-safe); distinct contexts may share a model and, with external locking, a pool.
 * Knows nothing of sampling, tokenization or transport.
 */
#ifndef TANDEM_ENGINE_FORWARD_H
#define TANDEM_ENGINE_FORWARD_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "engine/kv_cache.h"
#include "engine/model.h"
#include "engine/seq_state.h"
#include "kernels/comm.h"

/* Most sequences one engine_fwd_decode call takes. */
#define ENGINE_FWD_MAX_BATCH 64

/* engine_fwd_prefill flags. */
typedef enum {
    ENGINE_PREFILL_DEFAULT = 0,
    ENGINE_PREFILL_TAIL_FROM_H = 1u << 0, /* test-only override R = H (every layer, every token) */
    ENGINE_PREFILL_ALL_LOGITS = 1u << 1,  /* logits for every tail row [R, T), not just T-1 */
} engine_prefill_flags_t;

/* engine_fwd_replay modes (MODEL.md 6(d)). */
typedef enum {
    ENGINE_REPLAY_CANONICAL = 0, /* rings of layers 0..c (start of a large delta) */
    ENGINE_REPLAY_RECOVERY = 1,  /* rings of every layer and the DSpark taps */
} engine_replay_mode_t;

/*
 * engine_dump_layer_t - what one layer produced for rows [first_position, first_position +
 * n_rows) of one sequence (MODEL.md 12.10 plus the l.pre extension). Borrowed for the duration
 * of the callback only.
 *
 * x_in:    [n_rows, m, H] FP32 residual streams entering the layer (before its Engram update).
 * x_out:   [n_rows, m, H] leaving it.
 * pre:     [n_rows, m] the previous FFN site's pre that the attention collapse used (e0 at 0).
 * sel:     [n_rows, k_I] rows the attention used, ascending, -1 padded (all -1 for ratio 0).
 * experts: [n_rows, K] routed experts, ascending.
 */
typedef struct {
    int layer;
    int seq_index; /* index of the sequence (or prefill part) within the call (0 for a one-part
                      prefill or the oracle) */
    int64_t first_position;
    int64_t n_rows;
    int m;
    int64_t H;
    int64_t k_I;
    int64_t K;
    const float *x_in;
    const float *x_out;
    const float *pre;
    const int32_t *sel;
    const int32_t *experts;
} engine_dump_layer_t;

/*
 * engine_dump_sink_t - a tool's hook for --dump-layers (MODEL.md 12.10). `layer` is called once
 * per backbone layer per chunk of rows, in position order for each layer (a chunked prefill
 * calls it per chunk; layers above c are called for the tail rows only). NULL fields are not
 * called. The callback must not call back into the context.
 */
typedef struct {
    void *user;
    void (*layer)(void *user, const engine_dump_layer_t *rec);
} engine_dump_sink_t;

/*
 * engine_fwd_params_t - sizing of a forward context. engine_fwd_params_default() fills it.
 *
 * max_chunk_tokens: most tokens one layer pass processes at once (prefill chunks; >= 1). Also
 *                   the largest total of a decode/verify batch.
 * n_threads:        kernel threads (kern_ctx_t), default the model's; 1..KERN_POOL_MAX_THREADS.
 *                   Above 1 the context starts its own worker pool (n_threads - 1 threads,
 *                   kernels/backend.h), which engine_fwd_destroy joins.
 * comm:             this rank's handle in its expert-parallel group (kernels/comm.h; borrowed,
 *                   must outlive the context), NULL for a model that holds every expert. Must
 *                   match the model's ep_rank / ep_size (engine_model_params_t), else
 *                   engine_fwd_create refuses. Every rank of the group then runs the same calls
 *                   with the same arguments at the same time (engine/ep.h does): each MoE layer
 *                   computes its own experts and all-gathers the others' outputs.
 * ep_data_parallel: 0 (default) = the ranks hold the same sequences (replicated attention, the
 *                   all-gather above); 1 = each rank its own sequences and batches (data-parallel
 *                   attention): each MoE layer sends the tokens routed to other ranks' experts
 *                   there and gets their outputs back (all-to-all), and a rank without work of
 *                   its own serves the others in engine_fwd_ep_serve. Needs comm.
 */
typedef struct {
    int64_t max_chunk_tokens;
    int n_threads;
    kern_comm_t *comm;
    int ep_data_parallel;
} engine_fwd_params_t;

/* engine_fwd_params_default - max_chunk_tokens 256, n_threads = the model's. */
void engine_fwd_params_default(const engine_model_t *model, engine_fwd_params_t *params);

/* A forward context; opaque. */
typedef struct engine_fwd engine_fwd_t;

/*
 * engine_fwd_create - a forward context for `model` using `pool`; both borrowed (must outlive
 * it). Sizes its scratch arenas from params and starts its kernel worker pool (params.n_threads).
 *
 * Returns TDM_OK and *fwd_out (engine_fwd_destroy frees it), TDM_ERR_INVALID_ARG (NULL, bad
 * params, a pool of another model, a comm whose rank or size is not the model's expert shard),
 * or TDM_ERR_NO_MEMORY.
 */
tdm_status_t engine_fwd_create(const engine_model_t *model, engine_kv_pool_t *pool,
                               const engine_fwd_params_t *params, engine_fwd_t **fwd_out);

/*
 * engine_fwd_ep_serve - data-parallel expert parallel (ep_data_parallel): compute the other
 * ranks' tokens routed to this rank's experts, round after round, until every rank of the group
 * is serving too (no tokens anywhere); what each rank does when its own calls are done
 * (engine/ep.h calls it after every run's function, so ranks may make different calls with
 * different batches and lengths). Returns TDM_OK, TDM_ERR_INVALID_ARG (no comm, or not
 * data-parallel), or the collectives' status (TDM_ERR_PEER_LOST when the group was aborted).
 */
tdm_status_t engine_fwd_ep_serve(engine_fwd_t *fwd);

/* engine_fwd_ep_warmup - kern_comm_warmup on the context's comm and stream: collective, once per
 * rank after the group is made (engine/ep.h does). TDM_OK, TDM_ERR_INVALID_ARG (no comm), or the
 * collective's status. */
tdm_status_t engine_fwd_ep_warmup(engine_fwd_t *fwd);

/* engine_fwd_destroy - free the context and join its kernel workers; accepts NULL. */
void engine_fwd_destroy(engine_fwd_t *fwd);

/* engine_fwd_set_dump - install (sink != NULL, copied) or remove (NULL) the dump sink. */
void engine_fwd_set_dump(engine_fwd_t *fwd, const engine_dump_sink_t *sink);

/*
 * engine_fwd_read_bytes - bytes the context's forward calls read since it was created or last
 * reset, for rooflines (bench/engine_bench.c). weight_bytes_out: every GEMM's matrix in compute
 * layout (BF16 2 B, FP32 4 B per element; a matrix used by a batch counts once per call, an
 * expert once per call that runs it), embedding rows (BF16) and Engram table rows (codes and
 * scales); norm and bias vectors are not counted (under 0.5 % of a small-preset step).
 * kv_bytes_out: window-ring entries (Q_swa codes and scales), index keys (Q_mx4) and selected
 * compressed rows (Q_ckv) read from the sequences' state. Either pointer may be NULL. The
 * routed experts are counted on the backend (ops->moe_ffn) and read here with one copy to the
 * host (a wait on a device): call it between steps, not inside a timed one.
 */
void engine_fwd_read_bytes(engine_fwd_t *fwd, uint64_t *weight_bytes_out, uint64_t *kv_bytes_out);

/*
 * engine_fwd_attn_flops - the attention's multiply-add FLOPs since the context was created or
 * its counters last reset, for the compute roofline (bench/engine_bench.c), which counts the
 * GEMMs from the parameter count: per query row, head and key it attends, 2 d for q . k and 2 d
 * for p . v (MODEL.md 5.2: the window's keys and the selected compressed rows), and per scored
 * compressed row and index head 2 d_I (the indexer, MODEL.md 5.4). Softmax, sink and top-k work
 * is not counted (no multiply-adds of this size). Counted on the host as the calls are made;
 * 0 for a NULL fwd.
 */
uint64_t engine_fwd_attn_flops(const engine_fwd_t *fwd);

/* engine_fwd_reset_read_bytes - zero the engine_fwd_read_bytes and engine_fwd_attn_flops
 * counters. */
void engine_fwd_reset_read_bytes(engine_fwd_t *fwd);

/*
 * engine_fwd_oracle - schedule 6(a) on a fresh sequence: ids [n_ids] (each < V) through every
 * layer, window floor 0; logits_out [n_ids, V] FP32 for every position. The temporary sequence's
 * pages are returned before the call returns.
 *
 * Returns TDM_OK, TDM_ERR_INVALID_ARG (NULL, n_ids <= 0, an id >= V), TDM_ERR_NO_PAGES (pool too
 * small; nothing changed), TDM_ERR_NO_MEMORY, TDM_ERR_INTERNAL (NaN reached a top-k).
 */
tdm_status_t engine_fwd_oracle(engine_fwd_t *fwd, const int32_t *ids, int64_t n_ids,
                               float *logits_out);

/*
 * engine_fwd_prefill - schedule 6(b): CED prefill of ids [n_ids] = tokens [H, T), H =
 * engine_seq_length(seq), T = H + n_ids, continuing seq; seq has length T afterwards.
 *
 * logits_out: [1, V] the first-token logits at T-1, or with ENGINE_PREFILL_ALL_LOGITS [T - R, V]
 *             for every tail row; may be NULL.
 * tail_start_out: R (may be NULL).
 * Returns TDM_OK; TDM_ERR_INVALID_ARG (NULL, n_ids <= 0, id >= V, T beyond
 * max_position_embeddings; seq unchanged); TDM_ERR_NO_PAGES (seq unchanged);
 * TDM_ERR_INTERNAL (NaN reached a top-k; seq is then invalid and must be destroyed).
 */
tdm_status_t engine_fwd_prefill(engine_fwd_t *fwd, engine_seq_t *seq, const int32_t *ids,
                                int64_t n_ids, uint32_t flags, float *logits_out,
                                int64_t *tail_start_out);

/*
 * engine_prefill_part_t - one piece of a CED prefill (schedule 6(b)) of tokens [start, end) of
 * `seq`: the tokens [L, L + n_ids) with L = engine_seq_length(seq) at the call (start <= L,
 * L + n_ids <= end). A prefill may be split into any number of parts, called in order with the
 * same seq, start, end and flags, with anything else (decode steps of other sequences) in between:
 * the tail start R = max(start, end - W) depends only on start and end, so the parts give, bit for
 * bit, the rows, state and logits of one engine_fwd_prefill of [start, end) (the CED rule chunks
 * layers 0..c freely; the layers above the cut see the same rings either way). Until the last
 * part has run the sequence is mid-prefill: its length is L + n_ids but the layers above the cut
 * have not run on the tail yet, so it must not be decoded, exported or prefilled otherwise.
 *
 * seq:        the sequence (borrowed; distinct across the parts of one call).
 * start, end: H and T of the whole prefill.
 * ids:        [n_ids] token ids (each < V), borrowed for the call.
 * flags:      engine_prefill_flags_t.
 * logits_out: FP32 rows [n_logits, V] (may be NULL): the first-token logits at end - 1 when this
 *             part ends at `end`, or with ENGINE_PREFILL_ALL_LOGITS one row per tail row [R, end)
 *             this part covers, in position order.
 * n_logits:   out: rows written to logits_out (0 when none).
 */
typedef struct {
    engine_seq_t *seq;
    int64_t start;
    int64_t end;
    const int32_t *ids;
    int64_t n_ids;
    uint32_t flags;
    float *logits_out;
    int64_t n_logits;
} engine_prefill_part_t;

/*
 * engine_fwd_prefill_parts - run n_parts parts (1 <= n_parts <= ENGINE_FWD_MAX_BATCH), each of a
 * different sequence, in one call (a prefill node batching several jobs, a decode node advancing
 * a prompt between decode steps), as one batch: passes of at most max_chunk_tokens rows, parts
 * taken in order (a part that does not fit what is left of a pass continues in the next), each
 * pass's rows through layers 0..c together and their tail rows through the layers above the cut
 * together (forward_batch.c). Every part gets, bit for bit, the rows, state and logits it gets
 * alone. Each part's pages are reserved before anything runs (all of the part's rows), in part
 * order. The dump sink sees each part's rows with seq_index = the part's index.
 * Returns TDM_OK; TDM_ERR_INVALID_ARG (NULL, n_parts out of range, a part outside its
 * prefill or beyond max_position_embeddings, an id >= V, a sequence twice: nothing changed);
 * TDM_ERR_NO_PAGES (the parts before the first one whose pages did not fit ran; it and those
 * after did not: their sequences are unchanged and may be run again); TDM_ERR_INTERNAL (NaN
 * reached a top-k: the rows of a pass are one batch, so the sequence of every part not yet
 * finished when it happened is invalid and must be destroyed) or TDM_ERR_NO_MEMORY (likewise).
 */
tdm_status_t engine_fwd_prefill_parts(engine_fwd_t *fwd, engine_prefill_part_t *parts, int n_parts);

/*
 * engine_fwd_decode - schedule 6(c): token ids[i] at position engine_seq_length(seqs[i]) for each
 * of n_seqs distinct sequences (1 <= n_seqs <= ENGINE_FWD_MAX_BATCH), all layers, exact;
 * logits_out [n_seqs, V]. Each row is bit-identical to decoding that sequence alone.
 *
 * Errors as engine_fwd_prefill (TDM_ERR_NO_PAGES and TDM_ERR_INVALID_ARG change no sequence;
 * the same sequence twice is TDM_ERR_INVALID_ARG).
 */
tdm_status_t engine_fwd_decode(engine_fwd_t *fwd, engine_seq_t *const *seqs, const int32_t *ids,
                               int n_seqs, float *logits_out);

/*
 * engine_fwd_decode_greedy - engine_fwd_decode, but only the greedy token of each sequence leaves
 * the backend: tokens_out[i] = the lowest id with the largest finite logit of row i (ops->argmax:
 * engine_sampler_sample's token at temperature 0 without stop suppression, MODEL.md 8), the
 * logits staying in the backend's memory (on CUDA one device-to-host copy of n_seqs ids instead
 * of n_seqs x V floats). The same step, state and bits as engine_fwd_decode followed by that
 * argmax on its logits. A row that holds a NaN or +inf (or no finite logit) gets
 * tokens_out[i] = -1 and the call still returns TDM_OK with every sequence stepped, as
 * engine_fwd_decode returns such a row for the caller's sampler to refuse: the caller fails that
 * sequence's request alone. Errors as engine_fwd_decode, plus TDM_ERR_INVALID_ARG for tokens_out
 * NULL and TDM_ERR_INTERNAL when the backend's argmax failed otherwise.
 */
tdm_status_t engine_fwd_decode_greedy(engine_fwd_t *fwd, engine_seq_t *const *seqs,
                                      const int32_t *ids, int n_seqs, int32_t *tokens_out);

/*
 * engine_fwd_decode_multi - the batched multi-token decode of MODEL.md 8 (verify inside a decode
 * batch): for each of n_seqs distinct sequences, n_ids[i] (1 <= n_ids[i] <= W) consecutive
 * tokens at positions engine_seq_length(seqs[i]) ..; ids holds them concatenated in sequence
 * order, logits_out [sum n_ids, V] one row per token in the same order (row of token k gives the
 * distribution of the position after it). All layers, exact: each row is bit-identical to
 * decoding its sequence's tokens one at a time alone, whatever else is in the batch. Rows,
 * index keys, pending halves, rings, DSpark context and ids are written as for a commit; a
 * partial accept shrinks the sequence with engine_seq_rollback. Total rows <= max(
 * max_chunk_tokens, ENGINE_FWD_MAX_BATCH). Errors as engine_fwd_decode.
 */
tdm_status_t engine_fwd_decode_multi(engine_fwd_t *fwd, engine_seq_t *const *seqs,
                                     const int32_t *ids, const int64_t *n_ids, int n_seqs,
                                     float *logits_out);

/*
 * engine_fwd_dspark_draft - the DSpark draft forward (MODEL.md 8) for each sequence i of length
 * a_i >= 1 with anchor anchors[i] (sampled for position a_i, not yet run): block tokens
 * [anchor, noise x (B - 1)] at a_i .. a_i + B - 1 run blocks mtp.0 .. mtp.{n_d-1} (5.1, 5.2,
 * 5.5; ratio 0, E_d/K_d experts, no Engram, first pre e0), every block query attending its
 * block's context ring entries max(a_i - W, 0) .. a_i - 1 and all B block tokens (non-causal).
 * Nothing is written to the sequences. x_out [n_seqs, B, H] FP32 holding BF16 values: the
 * collapse x = BF16(sum_j pre_j X_j) with the last block's FFN pre, the input of the heads.
 * n_seqs * B <= max(max_chunk_tokens, ENGINE_FWD_MAX_BATCH).
 *
 * Returns TDM_OK, TDM_ERR_INVALID_ARG (NULL, a sequence of length 0, an id >= V, a model without
 * DSpark blocks, too many rows), TDM_ERR_NO_MEMORY, TDM_ERR_INTERNAL.
 */
tdm_status_t engine_fwd_dspark_draft(engine_fwd_t *fwd, engine_seq_t *const *seqs,
                                     const int32_t *anchors, int n_seqs, float *x_out);

/*
 * engine_fwd_verify - exact multi-token decode of ids [n_ids] at positions n .. n + n_ids - 1 of
 * one sequence (MODEL.md 8 verify; every layer, full rings); logits_out [n_ids, V]. Equals n_ids
 * successive engine_fwd_decode calls bit for bit.
 */
tdm_status_t engine_fwd_verify(engine_fwd_t *fwd, engine_seq_t *seq, const int32_t *ids,
                               int64_t n_ids, float *logits_out);

/*
 * engine_fwd_replay - schedule 6(d): rebuild the rings of seq at its length H from its pages and
 * the token ids [H - n_ids, H) (ids, n_ids >= min(W, H) + N - 1 or all H): runs tokens
 * [H - W', H), W' = min(W, H), from empty rings with window floor H - W', writing no row or index
 * key; pending halves are kept (rebuilt when absent and H is odd). CANONICAL replays layers
 * 0..c, RECOVERY every layer. logits_out (may be NULL): [1, V] the logits at H - 1 (RECOVERY
 * only).
 *
 * Returns TDM_OK, TDM_ERR_INVALID_ARG (NULL, too few ids, H = 0), TDM_ERR_INTERNAL.
 */
tdm_status_t engine_fwd_replay(engine_fwd_t *fwd, engine_seq_t *seq, const int32_t *ids,
                               int64_t n_ids, engine_replay_mode_t mode, float *logits_out);

/*
 * engine_fwd_replay_batch - the CANONICAL engine_fwd_replay of n_seqs distinct sequences (1 <=
 * n_seqs <= ENGINE_FWD_MAX_BATCH) in batches: as many whole replays per layer pass as fit in
 * max_chunk_tokens rows (a prefill node starting several jobs). ids[i] [n_ids[i]] as
 * engine_fwd_replay's for seqs[i]. Each sequence's rings, pending halves and ids are
 * bit-identical to its engine_fwd_replay alone (forward_batch.c).
 * Returns TDM_OK, TDM_ERR_INVALID_ARG (as engine_fwd_replay's, for any sequence, or one twice:
 * nothing changed), TDM_ERR_INTERNAL or TDM_ERR_NO_MEMORY (the sequences' rings are then
 * invalid).
 */
tdm_status_t engine_fwd_replay_batch(engine_fwd_t *fwd, engine_seq_t *const *seqs,
                                     const int32_t *const *ids, const int64_t *n_ids, int n_seqs);

#endif
