/* plan_gpu.h - the GPU layout part of tandem-convert's memory plan: how the model's resident
 * weights spread over an expert-parallel group of GPUs, what each GPU has left for the KV page
 * pool after the weights and the reserves, and how many KV pages, tokens and sessions that is
 * (issue 14 item 6; MODEL.md sections 7 and 10; docs/DEPLOY.md section 10).
 *
 * Layout: the routed experts of every MoE layer (E per backbone layer, E_d per DSpark block) are
 * sharded over the GPUs of a group in contiguous ranges (expert parallel, EP); everything else
 * (attention, mHC, router, shared expert, compressors, indexers, Engram projections, embed,
 * head, norms, DSpark non-expert weights) is replicated on every GPU. Attention is data parallel,
 * not split by heads: the model has one shared latent KV head (MODEL.md 2), so a head split would
 * replicate the KV anyway; each GPU runs attention for its own sequences and holds their KV pages
 * and window rings. The Engram tables stay in pinned host memory (never on a GPU).
 *
 * Works from the config's tensor inventory alone (engine/inventory.h): reads no checkpoint,
 * allocates nothing large, owns nothing. Page bytes come from kern_kv_page_layout (the one page
 * geometry, kernels/kv_page.h).
 */
#ifndef TANDEM_TOOLS_CONVERT_PLAN_GPU_H
#define TANDEM_TOOLS_CONVERT_PLAN_GPU_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/status.h"
#include "engine/config.h"
#include "engine/tensor.h"
#include "plan.h"

/* Most GPUs of one expert-parallel group: one NVLink domain (a GB300 NVL72 rack). */
#define PLAN_GPU_MAX_GROUP 72u
/* Most GPUs of a plan (--gpus): 64 NVL72 racks. */
#define PLAN_GPU_MAX_GPUS 4608u

/* Defaults of the reserves (per GPU, bytes; --reserve-gb, --cuda-reserve-gb). */
#define PLAN_GPU_DEFAULT_RESERVE_BYTES      8000000000LL /* activations and workspace */
#define PLAN_GPU_DEFAULT_CUDA_RESERVE_BYTES 2000000000LL /* CUDA context, NCCL, cuBLASLt */
/* The --pages maximum of tandem-decode and tandem-prefill (their flag tables): the plan caps the
 * pool it suggests there and says so. */
#define PLAN_GPU_MAX_FLAG_PAGES 16777216LL
/* Default session length to size for (--context), tokens. */
#define PLAN_GPU_DEFAULT_CONTEXT_TOKENS 131072

/*
 * One GPU kind the plan knows by name. Capacities are NVIDIA's per-GPU figures read as decimal
 * bytes (1 GB = 1e9 B); docs/DEPLOY.md section 10 cites them. Static data.
 */
typedef struct {
    const char *name;        /* the --gpu value: "h200", "b200", "b300", "gb200", "gb300" */
    const char *description; /* e.g. "NVIDIA H200 SXM (HGX H200)" */
    int64_t mem_bytes;       /* HBM3e per GPU, bytes */
    double hbm_tb_per_s;     /* peak HBM bandwidth per GPU, TB/s (printed, not used in sizing) */
    uint32_t domain_gpus;    /* GPUs of one NVLink domain: 8 (HGX board) or 72 (NVL72 rack) */
} plan_gpu_kind_t;

/*
 * plan_gpu_kind_find - the kind named `name` (case-sensitive, e.g. "b300"), or NULL when `name` is
 * NULL or not one of plan_gpu_kind_names(). The result is static.
 */
const plan_gpu_kind_t *plan_gpu_kind_find(const char *name);

/* plan_gpu_kind_names - the known names for messages: "h200, b200, b300, gb200 or gb300".
 * Static. */
const char *plan_gpu_kind_names(void);

/* What to plan for. Plain data; plan_gpu_params_default fills the defaults. */
typedef struct {
    const plan_gpu_kind_t *kind; /* borrowed (plan_gpu_kind_find) */
    uint32_t n_gpus;             /* every GPU of the deployment, 1..PLAN_GPU_MAX_GPUS */
    uint32_t group_gpus;         /* GPUs of one EP group = one serving instance (prefill or
                                    decode); divides n_gpus; 1..PLAN_GPU_MAX_GROUP */
    uint32_t n_prefill_groups;   /* groups serving as prefill instances (< n_gpus / group_gpus);
                                    the rest are decode instances and hold the sessions */
    int64_t context_tokens;      /* session length sized for, 1..max_position_embeddings */
    int64_t reserve_bytes;       /* per GPU: activations, workspace, transient verify scratch */
    int64_t cuda_reserve_bytes;  /* per GPU: CUDA context, NCCL buffers, cuBLASLt workspace */
} plan_gpu_params_t;

/*
 * plan_gpu_params_default - *params = no kind, 8 GPUs in one group, no prefill groups,
 * PLAN_GPU_DEFAULT_* context and reserves. Cannot fail.
 */
void plan_gpu_params_default(plan_gpu_params_t *params);

/* One GPU of a group (every group is laid out alike). Bytes unless named otherwise. */
typedef struct {
    int64_t first_expert;        /* first routed expert (of E per backbone layer) held here */
    int64_t n_experts;           /* routed experts held per backbone layer (may be 0) */
    int64_t first_dspark_expert; /* first DSpark routed expert (of E_d per block) */
    int64_t n_dspark_experts;    /* DSpark routed experts held per block */
    plan_formats_t weights;      /* replicated weights + this GPU's experts, by format */
    int64_t weight_bytes;        /* plan_formats_total(&weights) */
    int64_t dspark_bytes;        /* of weight_bytes: DSpark blocks (replicated part + experts) */
    int64_t free_bytes;          /* mem - weights - both reserves; negative when they do not fit */
    int64_t kv_pages;            /* floor(free / page bytes): KV pages that fit (0 if free < 0) */
    int64_t kv_tokens;           /* tokens of KV those pages hold: kv_pages x 64 / rows per token */
    int64_t n_sessions;          /* sessions of context_tokens that fit: each its pages + state */
    int64_t pool_pages;          /* --pages for this GPU: the free bytes less n_sessions states,
                                    in pages (>= n_sessions x session_pages) */
} plan_gpu_dev_t;

/*
 * The GPU plan (plan_gpu_build). Sizes are of one group; n_groups groups are alike.
 * resident_bytes = replicated + experts (the inventory's resident total, MODEL.md 10 "text-only":
 * the loader skips the vision tower); a group holds the replicated weights group_gpus times.
 */
typedef struct {
    plan_gpu_params_t params;
    uint32_t n_groups;               /* n_gpus / group_gpus */
    int64_t n_experts;               /* E (config n_routed_experts) */
    int64_t n_dspark_experts;        /* E_d (config dspark_n_routed_experts; 0 without blocks) */
    plan_formats_t replicated;       /* on every GPU */
    plan_formats_t experts;          /* every routed expert of every layer and block, once */
    int64_t resident_bytes;          /* replicated + experts */
    int64_t dspark_replicated_bytes; /* DSpark non-expert weights (replicated) */
    int64_t dspark_expert_bytes;     /* DSpark routed experts (sharded) */
    int64_t engram_host_bytes;       /* Engram tables + scales: pinned host memory per instance */
    int64_t page_bytes;              /* kern_kv_page_layout(d, d_I) page size */
    double kv_rows_per_token;        /* engine_config_kv_rows_per_token */
    int64_t session_pages;           /* pages of one context_tokens-long sequence, all sources */
    int64_t state_bytes;             /* per-sequence state (MODEL.md 7): rings + pending + ids */
    int64_t session_bytes;           /* session_pages x page_bytes + state_bytes */
    plan_gpu_dev_t gpus[PLAN_GPU_MAX_GROUP]; /* [group_gpus] used */
    int fits;                /* 1: every GPU of the group holds at least one session */
    uint32_t min_group_gpus; /* smallest group of this kind that fits (same reserves and
                                context); 0 when none of 1..PLAN_GPU_MAX_GROUP does */
} plan_gpu_t;

/*
 * plan_gpu_build - lay out the model of *cfg (borrowed) with inventory specs[0..n_specs) (from
 * engine_inventory_build for cfg) over params->group_gpus GPUs of params->kind, and size the KV
 * pool, tokens and sessions per GPU. A layout that does not fit is still a plan: fits = 0 and
 * min_group_gpus says the smallest group that would.
 *
 * Returns TDM_OK with *plan_out, or TDM_ERR_INVALID_ARG with *plan_out untouched: a NULL pointer
 * or kind, n_gpus outside 1..PLAN_GPU_MAX_GPUS, group_gpus outside 1..PLAN_GPU_MAX_GROUP or not
 * dividing n_gpus, n_prefill_groups not below the group count, context_tokens
 * outside 1..max_position_embeddings, a negative reserve, a config without routed experts, an
 * expert tensor whose index is outside its layer's count, or head dims the page format refuses.
 */
tdm_status_t plan_gpu_build(const engine_config_t *cfg, const engine_tensor_spec_t *specs,
                            size_t n_specs, const plan_gpu_params_t *params, plan_gpu_t *plan_out);

/*
 * plan_gpu_session_pages - KV pages one sequence of n_tokens holds: over every KV source, the
 * rows it publishes (engine_config_n_c at n_tokens - 1) in pages of 64 rows, rounded up
 * (MODEL.md 7). 0 for n_tokens <= 0. Full size, 131072 tokens: 3 x 1024 + 2048 = 5120.
 */
int64_t plan_gpu_session_pages(const engine_config_t *cfg, int64_t n_tokens);

/*
 * plan_gpu_state_bytes - per-sequence state outside the KV pages (MODEL.md 7): a window ring per
 * layer and DSpark block (C = W + B + 1 entries of d E4M3 + d/32 UE8M0), the pending half-group
 * (a, b) FP32 [d] of each ratio-2 source (counted as present), the N - 1 Engram lookback ids,
 * the DSpark anchor and the sampler counter (16 B). Full size: 3,042,336 + 12,288 + 28 =
 * 3,054,652 B.
 */
int64_t plan_gpu_state_bytes(const engine_config_t *cfg);

/*
 * plan_gpu_print - the plan as text: GPU kind and layout, the expert split, the reserves (with
 * their flags), per GPU (runs of identical GPUs as one block) the weight bytes by format and
 * total, free bytes, KV pages, tokens and sessions; then, when the layout fits, per group and
 * per deployment totals (prefill and decode instances), the Engram host memory and the flag
 * values it gives the workers and the router (--pages capped at PLAN_GPU_MAX_FLAG_PAGES, with
 * a note); when it does not fit, why and the minimum group. Byte lines use plan_print_bytes; labels
 * are fixed (tests parse them). preset: the config's name for the header ("full"; may be NULL).
 */
void plan_gpu_print(const plan_gpu_t *plan, const char *preset, FILE *out);

#endif
