/* seq_state_impl.h - the layout of engine_seq_t, shared by seq_state.c and the forward pass.
 * Not a public header: other modules use engine/seq_state.h.
 */
#ifndef TANDEM_ENGINE_SEQ_STATE_IMPL_H
#define TANDEM_ENGINE_SEQ_STATE_IMPL_H

#include "engine/seq_state.h"

/* Most KV sources a config may have (each is a layer). */
#define ENGINE_SEQ_MAX_SOURCES ENGINE_CONFIG_MAX_LAYERS

/*
 * struct engine_seq - see engine/seq_state.h.
 *
 * Memory: ring_codes, ring_scales, pend_a/b and keep_a/b are the memory of the model's kernel
 * table (ops->mem_alloc: device memory on CUDA; host code moves them with
 * engine_seq_copy_state, never memcpy); ids and keep_pos are host metadata.
 *
 * ring_codes:  [n_rings, C, d] E4M3 Q_swa codes; ring_scales [n_rings, C, d/32] UE8M0; the entry
 *              of position p lives in slot p mod C (valid for p in [length - C, length)).
 * tables:      one block table per KV source, in kv_source_layer_ids order.
 * pend_a/b:    [n_sources, d] FP32 pending half-group of each ratio-2 source; has_pend[s].
 * ids:         ring of the last n_ids_cap committed ids, id of position p in slot p mod cap.
 */
struct engine_seq {
    const engine_model_t *model;
    engine_kv_pool_t *pool;
    int64_t length;
    int n_rings;
    int64_t C;
    int64_t d;
    uint8_t *ring_codes;
    uint8_t *ring_scales;
    int n_sources;
    int source_layer[ENGINE_SEQ_MAX_SOURCES];
    engine_kv_table_t tables[ENGINE_SEQ_MAX_SOURCES];
    float *pend_a;
    float *pend_b;
    int has_pend[ENGINE_SEQ_MAX_SOURCES];
    int32_t *ids;
    int64_t n_ids_cap;
    /* verify scratch (MODEL.md 7): the (a, b) half of the last n_keep even positions of each
     * ratio-2 source, slot (p / 2) mod n_keep, keep_pos[s * n_keep + slot] = p (-1: empty) */
    int64_t n_keep;
    float *keep_a;
    float *keep_b;
    int64_t *keep_pos;
};

/* seq_source_slot - index of KV source `layer` in seq->tables, or -1. */
int engine_seq_source_slot(const engine_seq_t *seq, int layer);

/* engine_seq_ring_codes / scales - the slot of position p in ring r (no range check). */
uint8_t *engine_seq_ring_codes_at(engine_seq_t *seq, int r, int64_t p);
uint8_t *engine_seq_ring_scales_at(engine_seq_t *seq, int r, int64_t p);

/* engine_seq_id_at - the committed id at position p (p within the last n_ids_cap). */
int32_t engine_seq_id_at(const engine_seq_t *seq, int64_t p);

/* engine_seq_set_id - store the id of position p. */
void engine_seq_set_id(engine_seq_t *seq, int64_t p, int32_t id);

/* engine_seq_keep_pending - copy the pending half of source slot `slot`, just set by the even
 * position p, into the verify scratch (engine_seq_rollback restores it from there): two
 * backend-to-backend copies. TDM_OK or the backend's copy error (keep_pos then unchanged). */
tdm_status_t engine_seq_keep_pending(engine_seq_t *seq, int slot, int64_t p);

/* engine_seq_clear_pending - source slot s has no pending half: has_pend[s] = 0 and both
 * halves zeroed (the model's ops->mem_set; a fill that fails only on a broken device). */
void engine_seq_clear_pending(engine_seq_t *seq, int s);

/* engine_seq_copy_state - n_bytes between the sequence's state buffers (rings, pending halves,
 * keep buffers) and host memory or each other, through the model's ops->mem_copy in direction
 * kind (memmove on the CPU). Returns what mem_copy returns. */
tdm_status_t engine_seq_copy_state(const engine_seq_t *seq, void *dst, const void *src,
                                   size_t n_bytes, kern_copy_kind_t kind);

#endif
