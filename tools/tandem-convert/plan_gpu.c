/* plan_gpu.c - the GPU layout part of tandem-convert's memory plan (see plan_gpu.h). */
#include "plan_gpu.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/kv_page.h"

#define PLAN_GPU_GB 1e9
/* Bytes of one pending half-group element (a or b), FP32 (MODEL.md 7). */
#define PLAN_GPU_PENDING_ELEM_BYTES 4
/* Bytes of one Engram lookback id (int32) and of the DSpark anchor + sampler counter. */
#define PLAN_GPU_ID_BYTES       4
#define PLAN_GPU_COUNTERS_BYTES 16
#define PLAN_GPU_EXPERT_MARK    ".ffn.experts."

/*
 * NVIDIA's per-GPU memory figures (docs/DEPLOY.md section 10 cites each): H200 141 GB at 4.8 TB/s;
 * B200 180 GB (the HGX/DGX B200 part) at 8 TB/s; B300 288 GB at 8 TB/s; GB300 288 GB per GPU,
 * 72 GPUs in one NVL72 NVLink domain; GB200 186 GB per GPU (13.4 TB HBM3e per 72-GPU NVL72 rack)
 * at 8 TB/s, one NVL72 NVLink domain.
 */
static const plan_gpu_kind_t plan_gpu_kinds[] = {
    {"h200", "NVIDIA H200 SXM (HGX H200)", 141000000000LL, 4.8, 8},
    {"b200", "NVIDIA B200 SXM (HGX B200)", 180000000000LL, 8.0, 8},
    {"b300", "NVIDIA B300 SXM (HGX B300)", 288000000000LL, 8.0, 8},
    {"gb200", "NVIDIA GB200 NVL72 (18 trays x 4 GPUs)", 186000000000LL, 8.0, 72},
    {"gb300", "NVIDIA GB300 NVL72 (18 trays x 4 GPUs)", 288000000000LL, 8.0, 72},
};

const plan_gpu_kind_t *plan_gpu_kind_find(const char *name)
{
    if (name == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < sizeof(plan_gpu_kinds) / sizeof(plan_gpu_kinds[0]); i++) {
        if (strcmp(plan_gpu_kinds[i].name, name) == 0) {
            return &plan_gpu_kinds[i];
        }
    }
    return NULL;
}

const char *plan_gpu_kind_names(void)
{
    return "h200, b200, b300, gb200 or gb300";
}

void plan_gpu_params_default(plan_gpu_params_t *params)
{
    memset(params, 0, sizeof(*params));
    params->n_gpus = 8;
    params->group_gpus = 8;
    params->context_tokens = PLAN_GPU_DEFAULT_CONTEXT_TOKENS;
    params->reserve_bytes = PLAN_GPU_DEFAULT_RESERVE_BYTES;
    params->cuda_reserve_bytes = PLAN_GPU_DEFAULT_CUDA_RESERVE_BYTES;
}

int64_t plan_gpu_session_pages(const engine_config_t *cfg, int64_t n_tokens)
{
    int64_t n_pages = 0;

    if (n_tokens <= 0) {
        return 0;
    }
    for (int i = 0; i < cfg->n_kv_source_layer_ids; i++) {
        int64_t rows = engine_config_n_c(cfg, (int)cfg->kv_source_layer_ids[i], n_tokens - 1);
        n_pages += kern_kv_page_count(rows);
    }
    return n_pages;
}

int64_t plan_gpu_state_bytes(const engine_config_t *cfg)
{
    int64_t n_ratio2 = 0;

    for (int i = 0; i < cfg->n_kv_source_layer_ids; i++) {
        if (cfg->roles[cfg->kv_source_layer_ids[i]].ratio == 2) {
            n_ratio2++;
        }
    }
    return (int64_t)cfg->n_roles * engine_config_ring_entries(cfg) *
               engine_config_ring_entry_bytes(cfg) +
           n_ratio2 * 2 * cfg->head_dim * PLAN_GPU_PENDING_ELEM_BYTES +
           (cfg->engram_max_ngram_size - 1) * PLAN_GPU_ID_BYTES + PLAN_GPU_COUNTERS_BYTES;
}

/* Storage bytes of a spec (shape x dtype size), or -1 for an invalid dtype or dimension. */
static int64_t spec_bytes(const engine_tensor_spec_t *spec)
{
    int64_t n_bytes = (int64_t)engine_dtype_size_bytes(spec->dtype);

    if (n_bytes == 0 || spec->n_dims < 0 || spec->n_dims > ENGINE_TENSOR_MAX_DIMS) {
        return -1;
    }
    for (int k = 0; k < spec->n_dims; k++) {
        if (spec->shape[k] < 0) {
            return -1;
        }
        n_bytes *= spec->shape[k];
    }
    return n_bytes;
}

/* The routed-expert index in "<prefix>.ffn.experts.<e>.<module>", -1 for any other tensor, -2
 * for a malformed index. */
static int64_t expert_index(const char *name)
{
    const char *at = strstr(name, PLAN_GPU_EXPERT_MARK);
    char *end = NULL;
    long long e;

    if (at == NULL) {
        return -1;
    }
    at += strlen(PLAN_GPU_EXPERT_MARK);
    e = strtoll(at, &end, 10);
    if (end == at || *end != '.' || e < 0) {
        return -2;
    }
    return (int64_t)e;
}

/* GPU g of n_gpus holds experts [first, first + count) of n: contiguous, the first n mod n_gpus
 * GPUs one more. */
static void split(int64_t n, uint32_t n_gpus, uint32_t g, int64_t *first_out, int64_t *count_out)
{
    int64_t q = n / n_gpus;
    int64_t r = n % n_gpus;

    *count_out = q + ((int64_t)g < r ? 1 : 0);
    *first_out = (int64_t)g * q + ((int64_t)g < r ? (int64_t)g : r);
}

static void formats_sum(plan_formats_t *sum, const plan_formats_t *add)
{
    sum->fp8 += add->fp8;
    sum->fp4 += add->fp4;
    sum->scale += add->scale;
    sum->bf16 += add->bf16;
    sum->f32 += add->f32;
    sum->other += add->other;
}

/* Per-expert bytes summed over layers (backbone: [E]) and blocks (DSpark: [E_d]). */
typedef struct {
    plan_formats_t *backbone;
    plan_formats_t *dspark;
} expert_bytes_t;

/*
 * Lay out a group of n_gpus into gpus[0..n_gpus) from plan's model totals and the reserves of
 * params. Returns 1 when every GPU holds at least one session.
 */
static int layout(const plan_gpu_t *plan, const expert_bytes_t *eb, uint32_t n_gpus,
                  const plan_gpu_params_t *params, plan_gpu_dev_t *gpus)
{
    int fits = 1;

    for (uint32_t g = 0; g < n_gpus; g++) {
        plan_gpu_dev_t *dev = &gpus[g];

        memset(dev, 0, sizeof(*dev));
        split(plan->n_experts, n_gpus, g, &dev->first_expert, &dev->n_experts);
        split(plan->n_dspark_experts, n_gpus, g, &dev->first_dspark_expert, &dev->n_dspark_experts);
        dev->weights = plan->replicated;
        dev->dspark_bytes = plan->dspark_replicated_bytes;
        for (int64_t e = dev->first_expert; e < dev->first_expert + dev->n_experts; e++) {
            formats_sum(&dev->weights, &eb->backbone[e]);
        }
        for (int64_t e = dev->first_dspark_expert;
             e < dev->first_dspark_expert + dev->n_dspark_experts; e++) {
            formats_sum(&dev->weights, &eb->dspark[e]);
            dev->dspark_bytes += plan_formats_total(&eb->dspark[e]);
        }
        dev->weight_bytes = plan_formats_total(&dev->weights);
        dev->free_bytes = params->kind->mem_bytes - dev->weight_bytes - params->reserve_bytes -
                          params->cuda_reserve_bytes;
        if (dev->free_bytes > 0) {
            dev->kv_pages = dev->free_bytes / plan->page_bytes;
            dev->n_sessions = dev->free_bytes / plan->session_bytes;
            dev->pool_pages =
                (dev->free_bytes - dev->n_sessions * plan->state_bytes) / plan->page_bytes;
            if (plan->kv_rows_per_token > 0.0) {
                dev->kv_tokens =
                    (int64_t)((double)dev->kv_pages * KERN_KV_PAGE_ROWS / plan->kv_rows_per_token);
            }
        }
        if (dev->n_sessions < 1) {
            fits = 0;
        }
    }
    return fits;
}

static int params_valid(const engine_config_t *cfg, const plan_gpu_params_t *params)
{
    return params->kind != NULL && params->n_gpus >= 1 && params->n_gpus <= PLAN_GPU_MAX_GPUS &&
           params->group_gpus >= 1 && params->group_gpus <= PLAN_GPU_MAX_GROUP &&
           params->n_gpus % params->group_gpus == 0 &&
           params->n_prefill_groups < params->n_gpus / params->group_gpus &&
           params->context_tokens >= 1 && params->context_tokens <= cfg->max_position_embeddings &&
           params->reserve_bytes >= 0 && params->cuda_reserve_bytes >= 0 &&
           cfg->n_routed_experts >= 1 && cfg->dspark_n_routed_experts >= 0;
}

/* Model totals of the specs into *plan and per-expert bytes into *eb. */
static tdm_status_t sum_specs(const engine_tensor_spec_t *specs, size_t n_specs, plan_gpu_t *plan,
                              expert_bytes_t *eb)
{
    for (size_t i = 0; i < n_specs; i++) {
        const engine_tensor_spec_t *spec = &specs[i];
        int64_t n_bytes = spec_bytes(spec);
        int is_dspark = spec->part == ENGINE_PART_DSPARK;
        int64_t e;

        if (n_bytes < 0) {
            return TDM_ERR_INVALID_ARG;
        }
        if (spec->part == ENGINE_PART_ENGRAM_TABLE) {
            plan->engram_host_bytes += n_bytes;
            continue;
        }
        e = expert_index(spec->name);
        if (e == -1) {
            plan_formats_add(&plan->replicated, spec->dtype, n_bytes);
            plan->dspark_replicated_bytes += is_dspark ? n_bytes : 0;
            continue;
        }
        if (e < 0 || e >= (is_dspark ? plan->n_dspark_experts : plan->n_experts)) {
            return TDM_ERR_INVALID_ARG;
        }
        plan_formats_add(is_dspark ? &eb->dspark[e] : &eb->backbone[e], spec->dtype, n_bytes);
        plan_formats_add(&plan->experts, spec->dtype, n_bytes);
        plan->dspark_expert_bytes += is_dspark ? n_bytes : 0;
    }
    plan->resident_bytes =
        plan_formats_total(&plan->replicated) + plan_formats_total(&plan->experts);
    return TDM_OK;
}

tdm_status_t plan_gpu_build(const engine_config_t *cfg, const engine_tensor_spec_t *specs,
                            size_t n_specs, const plan_gpu_params_t *params, plan_gpu_t *plan_out)
{
    kern_kv_geometry_t geometry;
    expert_bytes_t eb;
    plan_gpu_dev_t scratch[PLAN_GPU_MAX_GROUP];
    plan_gpu_t *plan;
    tdm_status_t status;

    if (cfg == NULL || (specs == NULL && n_specs > 0) || params == NULL || plan_out == NULL ||
        !params_valid(cfg, params)) {
        return TDM_ERR_INVALID_ARG;
    }
    status = kern_kv_geometry((uint32_t)cfg->head_dim, (uint32_t)cfg->index_head_dim,
                              engine_config_max_kv_ratio(cfg), &geometry);
    if (status != TDM_OK) {
        return status;
    }
    plan = calloc(1, sizeof(*plan));
    eb.backbone = calloc((size_t)cfg->n_routed_experts, sizeof(plan_formats_t));
    eb.dspark = calloc((size_t)cfg->dspark_n_routed_experts + 1, sizeof(plan_formats_t));
    if (plan == NULL || eb.backbone == NULL || eb.dspark == NULL) {
        status = TDM_ERR_NO_MEMORY;
        goto out_free;
    }
    plan->params = *params;
    plan->n_groups = params->n_gpus / params->group_gpus;
    plan->n_experts = cfg->n_routed_experts;
    plan->n_dspark_experts = cfg->n_blocks > 0 ? cfg->dspark_n_routed_experts : 0;
    plan->page_bytes = (int64_t)geometry.page_bytes;
    plan->kv_rows_per_token = engine_config_kv_rows_per_token(cfg);
    plan->session_pages = plan_gpu_session_pages(cfg, params->context_tokens);
    plan->state_bytes = plan_gpu_state_bytes(cfg);
    plan->session_bytes = plan->session_pages * plan->page_bytes + plan->state_bytes;
    status = sum_specs(specs, n_specs, plan, &eb);
    if (status != TDM_OK) {
        goto out_free;
    }
    plan->fits = layout(plan, &eb, params->group_gpus, params, plan->gpus);
    for (uint32_t g = 1; g <= PLAN_GPU_MAX_GROUP && plan->min_group_gpus == 0; g++) {
        if (layout(plan, &eb, g, params, scratch)) {
            plan->min_group_gpus = g;
        }
    }
    *plan_out = *plan;
out_free:
    free(eb.dspark);
    free(eb.backbone);
    free(plan);
    return status;
}

static void print_count(FILE *out, const char *label, int64_t n)
{
    fprintf(out, "  %-34s %16lld\n", label, (long long)n);
}

/* A byte count small enough to read in MB (1e6 B). */
static void print_mb(FILE *out, const char *label, int64_t n_bytes)
{
    fprintf(out, "  %-34s %16lld B %10.2f MB\n", label, (long long)n_bytes, (double)n_bytes / 1e6);
}

static void print_split(FILE *out, const char *label, int64_t n, uint32_t n_gpus)
{
    int64_t q = n / n_gpus;
    int64_t r = n % n_gpus;

    if (r == 0) {
        fprintf(out, "  %-34s %lld over %u GPUs: %lld on each\n", label, (long long)n, n_gpus,
                (long long)q);
    } else {
        fprintf(out, "  %-34s %lld over %u GPUs: %lld on GPUs 0-%lld, %lld on GPUs %lld-%u\n",
                label, (long long)n, n_gpus, (long long)(q + 1), (long long)(r - 1), (long long)q,
                (long long)r, n_gpus - 1);
    }
}

/* "first-last", or "none" for an empty range. */
static void print_range(FILE *out, int64_t first, int64_t count)
{
    if (count == 0) {
        fprintf(out, "none");
    } else {
        fprintf(out, "%lld-%lld", (long long)first, (long long)(first + count - 1));
    }
}

/* GPUs first..last hold the same counts and bytes: print them once. */
static void print_gpu_block(const plan_gpu_t *plan, uint32_t first, uint32_t last, FILE *out)
{
    const plan_gpu_dev_t *dev = &plan->gpus[first];
    char label[96];

    if (first == last) {
        fprintf(out, "GPU %u: routed experts ", first);
        print_range(out, dev->first_expert, dev->n_experts);
        fprintf(out, ", DSpark experts ");
        print_range(out, dev->first_dspark_expert, dev->n_dspark_experts);
        fprintf(out, ":\n");
    } else {
        fprintf(out,
                "GPUs %u-%u, each: %lld routed experts per layer, %lld DSpark experts per "
                "block:\n",
                first, last, (long long)dev->n_experts, (long long)dev->n_dspark_experts);
    }
    plan_print_formats(out, "weights", &dev->weights);
    plan_print_bytes(out, "weights total", dev->weight_bytes);
    plan_print_bytes(out, "  of which DSpark blocks", dev->dspark_bytes);
    plan_print_bytes(out, "reserves (activations + CUDA)",
                     plan->params.reserve_bytes + plan->params.cuda_reserve_bytes);
    plan_print_bytes(out, "free for KV pages and state", dev->free_bytes);
    snprintf(label, sizeof(label), "KV pages (%lld B each)", (long long)plan->page_bytes);
    print_count(out, label, dev->kv_pages);
    print_count(out, "KV tokens in those pages", dev->kv_tokens);
    snprintf(label, sizeof(label), "sessions of %lld tokens",
             (long long)plan->params.context_tokens);
    print_count(out, label, dev->n_sessions);
    print_count(out, "pool pages (sessions' state aside)", dev->pool_pages);
}

/* Sums over the group's GPUs. */
typedef struct {
    int64_t weight_bytes;
    int64_t kv_pages;
    int64_t kv_tokens;
    int64_t n_sessions;
    int64_t min_pool_pages;
} group_sums_t;

static group_sums_t group_sums(const plan_gpu_t *plan)
{
    group_sums_t s;

    memset(&s, 0, sizeof(s));
    s.min_pool_pages = plan->gpus[0].pool_pages;
    for (uint32_t g = 0; g < plan->params.group_gpus; g++) {
        const plan_gpu_dev_t *dev = &plan->gpus[g];
        s.weight_bytes += dev->weight_bytes;
        s.kv_pages += dev->kv_pages;
        s.kv_tokens += dev->kv_tokens;
        s.n_sessions += dev->n_sessions;
        if (dev->pool_pages < s.min_pool_pages) {
            s.min_pool_pages = dev->pool_pages;
        }
    }
    return s;
}

static void print_header(const plan_gpu_t *plan, const char *preset, FILE *out)
{
    const plan_gpu_params_t *p = &plan->params;
    char label[96];

    fprintf(out,
            "GPU layout plan%s%s: %u x %s (config only: no checkpoint read, nothing "
            "allocated):\n",
            preset != NULL ? ", preset " : "", preset != NULL ? preset : "", p->n_gpus,
            p->kind->name);
    fprintf(out, "  %-34s %s, %.0f GB HBM3e, %.1f TB/s\n", "GPU kind", p->kind->description,
            (double)p->kind->mem_bytes / PLAN_GPU_GB, p->kind->hbm_tb_per_s);
    fprintf(out, "  %-34s %u expert-parallel group(s) of %u GPUs, one serving instance each\n",
            "groups", plan->n_groups, p->group_gpus);
    fprintf(out, "  %-34s routed experts sharded over a group (EP, contiguous ranges);\n",
            "layout");
    fprintf(out, "  %-34s attention data parallel (one latent KV head: not split by heads;\n", "");
    fprintf(out, "  %-34s each GPU holds its own sequences' KV pages and rings); shared\n", "");
    fprintf(out, "  %-34s expert, router, dense layers, embed/head, DSpark non-expert\n", "");
    fprintf(out, "  %-34s weights replicated on every GPU; Engram tables in host memory\n", "");
    print_split(out, "routed experts per layer", plan->n_experts, p->group_gpus);
    print_split(out, "DSpark experts per block", plan->n_dspark_experts, p->group_gpus);
    plan_print_bytes(out, "GPU memory", p->kind->mem_bytes);
    plan_print_bytes(out, "reserve: activations (--reserve-gb)", p->reserve_bytes);
    plan_print_bytes(out, "reserve: CUDA (--cuda-reserve-gb)", p->cuda_reserve_bytes);
    plan_print_bytes(out, "replicated weights (each GPU)", plan_formats_total(&plan->replicated));
    plan_print_bytes(out, "  of which DSpark non-expert", plan->dspark_replicated_bytes);
    plan_print_bytes(out, "routed experts (sharded)", plan_formats_total(&plan->experts));
    plan_print_bytes(out, "  of which DSpark experts", plan->dspark_expert_bytes);
    plan_print_bytes(out, "resident weights (one copy)", plan->resident_bytes);
    snprintf(label, sizeof(label), "KV pages of one %lld-token session",
             (long long)p->context_tokens);
    print_count(out, label, plan->session_pages);
    print_mb(out, "state per sequence (MODEL.md 7)", plan->state_bytes);
    print_mb(out, "one session (pages + state)", plan->session_bytes);
}

/* Totals of a layout that fits: per group, per deployment, and the flags they give. */
static void print_totals(const plan_gpu_t *plan, FILE *out)
{
    const plan_gpu_params_t *p = &plan->params;
    group_sums_t s = group_sums(plan);
    uint32_t n_decode = plan->n_groups - p->n_prefill_groups;
    int64_t flag_pages =
        s.min_pool_pages < PLAN_GPU_MAX_FLAG_PAGES ? s.min_pool_pages : PLAN_GPU_MAX_FLAG_PAGES;
    char sessions[96];

    snprintf(sessions, sizeof(sessions), "sessions of %lld tokens", (long long)p->context_tokens);
    fprintf(out, "per group (%u GPUs, one instance):\n", p->group_gpus);
    plan_print_bytes(out, "weights held (all its GPUs)", s.weight_bytes);
    print_count(out, "KV pages", s.kv_pages);
    print_count(out, "KV tokens", s.kv_tokens);
    print_count(out, sessions, s.n_sessions);
    plan_print_bytes(out, "Engram tables (pinned host RAM)", plan->engram_host_bytes);
    fprintf(out, "deployment (%u groups x %u GPUs = %u GPUs):\n", plan->n_groups, p->group_gpus,
            p->n_gpus);
    print_count(out, "prefill groups (--prefill-groups)", p->n_prefill_groups);
    print_count(out, "decode instances", n_decode);
    print_count(out, "KV tokens (decode instances)", s.kv_tokens * n_decode);
    snprintf(sessions, sizeof(sessions), "sessions of %lld tokens (decode)",
             (long long)p->context_tokens);
    print_count(out, sessions, s.n_sessions * n_decode);
    plan_print_bytes(out, "Engram tables, one per instance",
                     plan->engram_host_bytes * plan->n_groups);
    fprintf(out, "flags (one pod = one instance = one group):\n");
    print_count(out, "nvidia.com/gpu per pod", p->group_gpus);
    print_count(out, "--pages (per GPU pool, smallest)", flag_pages);
    if (flag_pages < s.min_pool_pages) {
        fprintf(out,
                "  (capped at the workers' --pages maximum %lld: the plan has room for %lld)\n",
                (long long)PLAN_GPU_MAX_FLAG_PAGES, (long long)s.min_pool_pages);
    }
    print_count(out, "decode --max-sessions (its group)", s.n_sessions);
    print_count(out, "router --max-sessions (all decode)", s.n_sessions * n_decode);
    fprintf(out,
            "fits: every GPU holds its weights, the reserves and >= 1 session of %lld "
            "tokens\n",
            (long long)p->context_tokens);
}

void plan_gpu_print(const plan_gpu_t *plan, const char *preset, FILE *out)
{
    const plan_gpu_params_t *p = &plan->params;
    uint32_t first = 0;

    print_header(plan, preset, out);
    for (uint32_t g = 1; g <= p->group_gpus; g++) {
        if (g == p->group_gpus || plan->gpus[g].n_experts != plan->gpus[first].n_experts ||
            plan->gpus[g].n_dspark_experts != plan->gpus[first].n_dspark_experts) {
            print_gpu_block(plan, first, g - 1, out);
            first = g;
        }
    }
    if (plan->fits) {
        print_totals(plan, out);
        return;
    }
    fprintf(out,
            "does not fit: a GPU needs %.2f GB of weights + %.2f GB of reserves + %.2f GB for "
            "one %lld-token session, and has %.2f GB\n",
            (double)plan->gpus[0].weight_bytes / PLAN_GPU_GB,
            (double)(p->reserve_bytes + p->cuda_reserve_bytes) / PLAN_GPU_GB,
            (double)plan->session_bytes / PLAN_GPU_GB, (long long)p->context_tokens,
            (double)p->kind->mem_bytes / PLAN_GPU_GB);
    if (plan->min_group_gpus != 0) {
        fprintf(out, "minimum: %u x %s per expert-parallel group (--gpus %u, or --group %u)\n",
                plan->min_group_gpus, p->kind->name, plan->min_group_gpus, plan->min_group_gpus);
    } else {
        fprintf(out, "minimum: no group of up to %u x %s fits\n", PLAN_GPU_MAX_GROUP,
                p->kind->name);
    }
}
