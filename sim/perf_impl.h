/* perf_impl.h - the inside of sim_perf_t, shared by sim/perf.c (analytic model) and sim/calib.c
 * (calibration files). Not a public header: the event loop includes sim/perf.h only.
 */
#ifndef TANDEM_SIM_PERF_IMPL_H
#define TANDEM_SIM_PERF_IMPL_H

#include <stdint.h>

#include "sim/perf.h"

/* Most backbone layers the model handles (the full model has 40). */
#define SIM_PERF_MAX_LAYERS 64

/* What the analytic model knows of the model (from the full preset's config and inventory). */
typedef struct {
    int n_layers;     /* L */
    int ced_cut;      /* c */
    double n_experts; /* E per backbone layer */
    double k_experts; /* K per token */
    double hidden;    /* H */
    double window;    /* W */
    double index_topk;
    double pool_rows; /* candidate pool: n_B x B_c rows */
    double n_heads, head_dim, index_heads, index_dim;
    double main_row_bytes;  /* compressed main row: d/2 + d/16 */
    double index_row_bytes; /* index key: d_I/2 + d_I/32 */
    double ring_entry_bytes;
    /* per backbone layer l: bytes and params of the replicated (non-expert) weights */
    double layer_rep_bytes[SIM_PERF_MAX_LAYERS];
    double layer_rep_params[SIM_PERF_MAX_LAYERS];
    int layer_ratio[SIM_PERF_MAX_LAYERS];
    int layer_kind[SIM_PERF_MAX_LAYERS]; /* engine_layer_kind_t */
    double expert_bytes;                 /* one routed expert of one layer (w1, w3, w2, scales) */
    double expert_params;
    double head_bytes, head_params; /* head + final norm (read by every step) */
    double embed_row_bytes;         /* one embedding row (a gather per token) */
    double dspark_rep_bytes;        /* every mtp.k non-expert tensor */
    double dspark_rep_params;
    double dspark_expert_bytes; /* one DSpark routed expert */
    double dspark_expert_params;
    double dspark_n_experts, dspark_k_experts, dspark_blocks, dspark_block_size;
} sim_perf_model_t;

/* Measured step costs (sim/calib.c): seconds = c0 + c1 x a + c2 x b, least squares, c >= 0. */
typedef struct {
    int have;       /* 1: these replace the analytic cost */
    double coef[3]; /* decode: c0 + c1 n_seqs + c2 sum_context; prefill: c0 + c1 new +
                       c2 new x (cached + new / 2) */
    int n_points;   /* lines fitted */
    double rms_rel; /* root mean square relative residual of the fit */
} sim_perf_fit_t;

struct sim_perf {
    sim_role_t role;
    sim_perf_params_t params;
    sim_gpu_t gpu;      /* copy of *params.gpu (rates may be replaced by a gpu-check log) */
    uint32_t group;     /* GPUs of the instance */
    uint64_t kv_tokens; /* plan arithmetic, whole group */
    int expert_fp4;     /* 1: routed-expert GEMMs at the FP4 rate (sim_perf_set_expert_math) */
    sim_perf_model_t m;
    sim_perf_fit_t decode_fit;
    sim_perf_fit_t prefill_fit;
    sim_perf_fit_t continue_fit; /* same form as prefill_fit, for continuing turns */
    /* achieved rates measured by scripts/gpu-check (0: datasheet x efficiency) */
    double measured_hbm_bytes_per_s;
    double measured_flops;
};

/* Achieved HBM read rate, bytes/s: a gpu-check measurement or datasheet x efficiency. */
static inline double sim_perf_hbm_rate(const struct sim_perf *perf)
{
    return perf->measured_hbm_bytes_per_s > 0 ? perf->measured_hbm_bytes_per_s
                                              : perf->gpu.hbm_bytes_per_s * perf->params.efficiency;
}

/* Achieved GEMM rate, FLOP/s, of FP8 (fp4 = 0) or FP4 (fp4 = 1) math. */
static inline double sim_perf_flop_rate(const struct sim_perf *perf, int fp4)
{
    if (perf->measured_flops > 0) {
        return perf->measured_flops;
    }
    return (fp4 ? perf->gpu.fp4_flops : perf->gpu.fp8_flops) * perf->params.efficiency;
}

#endif
