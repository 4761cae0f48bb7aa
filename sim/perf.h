/* perf.h - tandem-sim's performance model of one serving instance of the FULL-size model
 * (issue 18 items 5 and 6; docs/SIM.md).
 *
 * Contract between the simulator's event loop (sim/sim.c, which owns time, queues, batching and
 * links the router's placement and session code) and the cost model (sim/perf.c, which owns every
 * number). The event loop never computes a cost itself: it asks this header how long a step takes,
 * how many tokens it yields, how many KV tokens an instance holds and how many watts it draws.
 *
 * An instance is one expert-parallel group of GPUs of one kind serving one model replica (the
 * plan of tools/tandem-convert/plan_gpu.h): a prefill instance runs CED prefill jobs, a decode
 * instance runs continuous batching with DSpark verify steps. Costs come from one of two sources:
 *   - analytic: roofline of MODEL.md 10 (bytes and FLOPs per prefilled and decoded token, KV
 *     890 B/token, Engram 12,672 B/token read from host memory, the CED schedule of MODEL.md 6,
 *     DSpark acceptance as a parameter) over the GPU's datasheet figures (sim_gpu_t, each with
 *     its source in docs/SIM.md);
 *   - measured: a calibration file (sim_perf_calibrate) of per-step times measured by
 *     tandem-bench-engine (CPU, any preset) or scripts/gpu-check, which replaces the analytic
 *     step costs (the instance then models that machine and preset).
 * Pure functions of their inputs after creation; thread-compatible (no shared state).
 */
#ifndef TANDEM_SIM_PERF_H
#define TANDEM_SIM_PERF_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* One GPU kind: public datasheet figures per GPU (static data; docs/SIM.md cites each). */
typedef struct {
    const char *name;          /* "h200", "b200", "b300", "gb200", "gb300" */
    const char *description;   /* e.g. "NVIDIA GB300 NVL72 (Blackwell Ultra)" */
    double hbm_bytes;          /* HBM capacity, bytes (decimal) */
    double hbm_bytes_per_s;    /* peak HBM bandwidth, bytes/s */
    double fp8_flops;          /* dense FP8 tensor FLOP/s (no sparsity) */
    double fp4_flops;          /* dense FP4 tensor FLOP/s (H200: none, FP4 runs at the FP8 rate) */
    double nvlink_bytes_per_s; /* NVLink bandwidth per GPU, one direction, bytes/s */
    double rdma_bytes_per_s;   /* scale-out NIC bandwidth per GPU, bytes/s */
    double host_bytes_per_s;   /* GPU <- host memory (Engram reads): C2C or PCIe, bytes/s */
    double power_idle_w;       /* per GPU, watts, idle (module or board share, docs/SIM.md) */
    double power_busy_w;       /* per GPU, watts, at full load (TDP / TGP) */
    uint32_t domain_gpus;      /* GPUs of one NVLink domain: 8 (HGX) or 72 (NVL72) */
} sim_gpu_t;

/* sim_gpu_find - the kind named `name` (e.g. "gb300"), or NULL. Static. */
const sim_gpu_t *sim_gpu_find(const char *name);

/* sim_gpu_names - "h200, b200, b300, gb200 or gb300", for messages. Static. */
const char *sim_gpu_names(void);

/* Roles of an instance. */
typedef enum {
    SIM_ROLE_PREFILL = 0,
    SIM_ROLE_DECODE = 1,
} sim_role_t;

/* What to model (plain data; sim_perf_params_default fills the defaults). */
typedef struct {
    const sim_gpu_t *gpu;      /* borrowed (sim_gpu_find) */
    uint32_t group_gpus;       /* GPUs of one instance (EP group); 0: the smallest that fits */
    double dspark_acceptance;  /* mean draft tokens accepted per verify step, [0, draft_len] */
    uint32_t dspark_draft_len; /* draft tokens proposed per verify step (MODEL.md 8); 0: no spec */
    uint32_t max_batch_seqs;   /* decode: most sequences per step (the engine's batch limit) */
    uint32_t max_batch_tokens; /* prefill: most new tokens per step */
    int64_t context_tokens;    /* session length the KV pool is sized for (plan_gpu) */
    double efficiency;         /* fraction of the roofline reached, (0, 1]; default 0.6 */
} sim_perf_params_t;

/* sim_perf_params_default - defaults documented in docs/SIM.md. Cannot fail. */
void sim_perf_params_default(sim_perf_params_t *params);

/* One instance's model; opaque, immutable after creation. */
typedef struct sim_perf sim_perf_t;

/*
 * sim_perf_create - the model of one instance of `role` with *params (copied). Sizes the group
 * and its KV capacity with the plan arithmetic (plan_gpu_build on the full preset). Returns
 * TDM_OK with *perf_out, TDM_ERR_INVALID_ARG (NULL gpu, acceptance out of range, zero batch
 * limits; reason in err), TDM_ERR_UNSUPPORTED when the model does not fit in group_gpus GPUs of
 * the kind (err names the smallest group that does), or TDM_ERR_NO_MEMORY. err: err_bytes, may
 * be 0. A calibration (sim_perf_calibrate) later replaces the step costs, not the capacity.
 */
tdm_status_t sim_perf_create(sim_role_t role, const sim_perf_params_t *params,
                             sim_perf_t **perf_out, char *err, size_t err_bytes);

/* sim_perf_destroy - free. Accepts NULL. */
void sim_perf_destroy(sim_perf_t *perf);

/*
 * sim_perf_calibrate - replace the analytic step costs of `perf` by the measured ones in the file
 * at `path` (the format docs/SIM.md gives: tandem-bench-engine or gpu-check output). Returns
 * TDM_OK, TDM_ERR_NOT_FOUND (no file), TDM_ERR_FORMAT (line and reason in err) or
 * TDM_ERR_INVALID_ARG; perf unchanged on error.
 */
tdm_status_t sim_perf_calibrate(sim_perf_t *perf, const char *path, char *err, size_t err_bytes);

/*
 * sim_perf_decode_step_s - seconds of one decode (DSpark verify) step of `n_seqs` sequences
 * (1..max_batch_seqs) whose contexts sum to `context_tokens` (attention reads their KV). Every
 * sequence gains sim_perf_tokens_per_step tokens from it.
 */
double sim_perf_decode_step_s(const sim_perf_t *perf, uint32_t n_seqs, uint64_t context_tokens);

/* sim_perf_tokens_per_step - expected output tokens per sequence per decode step
 * (1 + dspark_acceptance; 1 without speculation). */
double sim_perf_tokens_per_step(const sim_perf_t *perf);

/*
 * sim_perf_prefill_s - seconds to CED-prefill `new_tokens` (> 0) tokens of one sequence after
 * `cached_tokens` already cached (MODEL.md 6: layers 0-20 on every new token, 21-39 on the last
 * 128; attention over cached + new).
 */
double sim_perf_prefill_s(const sim_perf_t *perf, uint64_t new_tokens, uint64_t cached_tokens);

/*
 * sim_perf_transfer_s - seconds to move the KV of `tokens` tokens (890 B each) plus one handoff
 * state (2.92 MB) from a prefill instance to a decode instance: over NVLink when same_domain,
 * else over RDMA.
 */
double sim_perf_transfer_s(const sim_perf_t *perf, uint64_t tokens, int same_domain);

/* sim_perf_kv_tokens - KV tokens one instance holds (all its GPUs; plan arithmetic). */
uint64_t sim_perf_kv_tokens(const sim_perf_t *perf);

/* sim_perf_group_gpus - GPUs of one instance. */
uint32_t sim_perf_group_gpus(const sim_perf_t *perf);

/* sim_perf_power_w - watts of the whole instance busy a fraction `busy` ([0, 1]) of the time:
 * group_gpus x (idle + busy x (busy_w - idle_w)). */
double sim_perf_power_w(const sim_perf_t *perf, double busy);

/* ---- Added by the simperf branch (issue 18 items 5-6); the functions above are unchanged. ---- */

/* Math of the routed-expert GEMMs (FP4 weights). MODEL.md 4 R4 feeds them E4M3 activations, and
 * an FP8 x FP4 tensor-core MMA runs at the FP8 rate on Blackwell, so SIM_MATH_FP8 is the default;
 * SIM_MATH_FP4 models FP4 activations (the datasheet's FP4 rate; on H200 both are the FP8 rate). */
typedef enum {
    SIM_MATH_FP8 = 0,
    SIM_MATH_FP4 = 1,
} sim_math_t;

/* sim_perf_set_expert_math - choose the expert GEMM rate (default SIM_MATH_FP8). Returns TDM_OK or
 * TDM_ERR_INVALID_ARG (NULL perf, unknown math). Call before sharing perf between threads. */
tdm_status_t sim_perf_set_expert_math(sim_perf_t *perf, sim_math_t math);

/*
 * sim_perf_continue_s - seconds to prefill `new_tokens` (> 0) of a continuing turn after
 * `cached_tokens` that the instance holds but must first rewind to (its reply is not in the new
 * prompt) and whose window it replays (MODEL.md 6(d)): a calibration's `continue` records when
 * present, else sim_perf_prefill_s of the new tokens plus min(W, cached) replayed ones.
 */
double sim_perf_continue_s(const sim_perf_t *perf, uint64_t new_tokens, uint64_t cached_tokens);

/* sim_perf_calibrated - 1 when a step-cost calibration replaced a decode or prefill cost. */
int sim_perf_calibrated(const sim_perf_t *perf);

/*
 * sim_perf_calibration_fit - the fitted step-cost model of `role` (SIM_ROLE_DECODE: seconds =
 * coef[0] + coef[1] n_seqs + coef[2] sum_context; SIM_ROLE_PREFILL: coef[0] + coef[1] new +
 * coef[2] new (cached + new / 2)) and its root mean square relative residual over the file's
 * records (rms_rel may be NULL). TDM_OK, TDM_ERR_NOT_FOUND (that cost is not calibrated) or
 * TDM_ERR_INVALID_ARG.
 */
tdm_status_t sim_perf_calibration_fit(const sim_perf_t *perf, sim_role_t role, double coef[3],
                                      double *rms_rel);

#endif
