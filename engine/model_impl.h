/* model_impl.h - the layout of engine_model_t, shared by the engine's forward-pass files
 * (model.c, forward*.c, seq_state.c). Not a public header: other modules use engine/model.h.
 *
 * Every weight is in the kernel backend's compute layout (kern_mat_t, BF16 or FP32) or a widened
 * FP32 vector; the Engram tables stay in the checkpoint mapping (FP8 rows + UE8M0 scales) and are
 * gathered per row. Owned by the model; read-only after load.
 *
 * Where the pointers point: with a host_memory backend (CPU) into the mapped checkpoint or model
 * allocations. Otherwise (CUDA, the test-only guard table) every matrix's data and scales, every
 * vector, the embeddings and the RoPE tables are backend memory (uploaded once at load with
 * ops->mem_alloc + mem_copy, stored formats kept; host code must not dereference them), and
 * e_codes / e_scales are the backend's addresses of the host-resident Engram tables
 * (ops->host_register). The kern_mat_t descriptors themselves are host structs.
 */
#ifndef TANDEM_ENGINE_MODEL_IMPL_H
#define TANDEM_ENGINE_MODEL_IMPL_H

#include "engine/model.h"
#include "engine/weights.h"

/* The two mHC sites of a block. */
enum { ENGINE_SITE_ATTN = 0, ENGINE_SITE_FFN = 1, ENGINE_N_SITES = 2 };

/* Weights of one backbone layer or DSpark block. Unused members are zero. */
typedef struct {
    const float *attn_norm;  /* [H] */
    const float *ffn_norm;   /* [H] */
    kern_mat_t hc_fn[ENGINE_N_SITES];     /* F32 [(2+m)m, mH] */
    const float *hc_base[ENGINE_N_SITES]; /* [(2+m)m] */
    const float *hc_scale[ENGINE_N_SITES]; /* [3] */
    /* attention (5.2) */
    kern_mat_t wq_a;   /* [r_q, H] */
    kern_mat_t wq_b;   /* [n_h d, r_q] */
    kern_mat_t wkv;    /* [d, H] */
    kern_mat_t wo_a;   /* [G r_o, n_h d / G] (rows of group g: [g r_o, (g+1) r_o)) */
    kern_mat_t wo_b;   /* [H, G r_o] */
    const float *q_norm;    /* [r_q] */
    const float *kv_norm;   /* [d] */
    const float *attn_sink; /* [n_h] */
    /* compressor (5.3, KV sources) */
    kern_mat_t c_wkv;   /* [d, H] */
    kern_mat_t c_wgate; /* [d, H], ratio 2 */
    const float *c_norm; /* [d] */
    /* indexer (5.4) */
    kern_mat_t i_wq_b;    /* [H_I d_I, r_q], index sources */
    kern_mat_t i_wp;      /* [H_I, H], index sources */
    kern_mat_t i_wk;      /* [d_I, d], Full layers */
    const float *i_k_norm; /* [d_I] */
    /* MoE (5.5) */
    kern_mat_t gate;        /* [E, H] */
    const float *gate_bias; /* [E] */
    int n_experts;
    int e_begin, e_end;     /* routed experts this model holds (engine_model_params_t.ep_*);
                               w1/w3/w2 outside [e_begin, e_end) are zero (no data) */
    kern_mat_t *w1;         /* [n_experts] each [I, H] (gate) */
    kern_mat_t *w3;         /* [n_experts] each [I, H] (up) */
    kern_mat_t *w2;         /* [n_experts] each [H, I] */
    kern_moe_experts_t experts; /* w1, w3, w2 as ops->moe_ffn reads them (its table in backend
                                   memory when the host may not read that; NULL otherwise) */
    kern_mat_t s_w1;        /* shared expert [I, H] */
    kern_mat_t s_w3;        /* [I, H] */
    kern_mat_t s_w2;        /* [H, I] */
    /* Engram (5.6) */
    const uint8_t *e_codes;  /* [R_l, d_e] E4M3, in the checkpoint mapping */
    const uint8_t *e_scales; /* [R_l, d_e/32] UE8M0 */
    int64_t e_rows;
    kern_mat_t e_wkv;        /* [(m+1) H, (N-1) h_e d_e] */
    const float *e_qw;       /* [m, H] */
    const float *e_kw;       /* [m, H] */
} engine_layer_weights_t;

struct engine_model {
    engine_config_t cfg;
    engine_model_params_t params;
    engine_weights_t *weights;
    engine_engram_sidecar_t sidecar;
    engine_engram_layout_t engram_layout;
    uint64_t fingerprint;
    uint64_t weight_bytes;          /* every buffer the model allocated */
    engine_model_resident_t resident; /* weights by format (engine_model_resident) */
    /* globals */
    const uint16_t *embed; /* [V, H] BF16 bits */
    const float *norm;     /* [H] */
    kern_mat_t head;       /* [V, H] */
    /* DSpark taps (mtp.0) */
    kern_mat_t main_proj;    /* [H, n_t H] */
    const float *main_norm;  /* [H] */
    /* DSpark heads (last block mtp.{n_d-1}): norm, Markov head, confidence head (MODEL.md 8) */
    const float *mtp_norm;       /* [H] */
    const uint16_t *markov_embed; /* [V, r_m] BF16 bits (row gather) */
    kern_mat_t markov_head;      /* [V, r_m] */
    const float *conf_proj;      /* [H + r_m] */
    engine_layer_weights_t layers[ENGINE_CONFIG_MAX_LAYERS]; /* roles: L backbone + n_d blocks */
    const float *rope_freqs[ENGINE_CONFIG_MAX_LAYERS];       /* [d_r/2] per role */
    /* every buffer the model allocated, freed at destroy */
    void **allocs;
    size_t n_allocs;
    size_t cap_allocs;
    /* backend memory of the uploaded weights (ops->mem_alloc), freed with ops->mem_free */
    void **dev_allocs;
    size_t n_dev_allocs;
    size_t cap_dev_allocs;
    uint64_t dev_bytes;
    /* host ranges registered with ops->host_register (Engram tables), ended at destroy */
    const void **reg_ptrs;
    size_t *reg_bytes;
    size_t n_regs;
};

#endif
