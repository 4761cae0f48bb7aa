/* plan.c - tandem-convert's resident memory plan (see plan.h). */
#include "plan.h"

#include <string.h>

#include "kernels/kv_page.h"

#define PLAN_GB 1e9

tdm_status_t plan_init(const engine_config_t *cfg, const engine_param_counts_t *counts,
                       uint32_t n_pages, plan_t *plan_out)
{
    kern_kv_geometry_t geometry;
    plan_t plan;
    tdm_status_t status;

    status = kern_kv_geometry((uint32_t)cfg->head_dim, (uint32_t)cfg->index_head_dim,
                              engine_config_max_kv_ratio(cfg), &geometry);
    if (status != TDM_OK) {
        return status;
    }
    memset(&plan, 0, sizeof(plan));
    plan.text.fp8 = counts->fp8_bytes;
    plan.text.fp4 = counts->fp4_bytes;
    plan.text.scale = counts->scale_bytes;
    plan.text.bf16 = counts->bf16_bytes;
    plan.text.f32 = counts->f32_bytes;
    plan.engram_table_bytes = counts->engram_table_bytes;
    plan.dspark_bytes = counts->dspark_bytes;
    plan.page_bytes = geometry.page_bytes;
    plan.n_pages = n_pages;
    *plan_out = plan;
    return TDM_OK;
}

void plan_formats_add(plan_formats_t *formats, engine_dtype_t dtype, int64_t n_bytes)
{
    switch (dtype) {
    case ENGINE_DTYPE_F8_E4M3:
        formats->fp8 += n_bytes;
        break;
    case ENGINE_DTYPE_I8:
    case ENGINE_DTYPE_U8:
        formats->fp4 += n_bytes;
        break;
    case ENGINE_DTYPE_F8_E8M0:
        formats->scale += n_bytes;
        break;
    case ENGINE_DTYPE_BF16:
        formats->bf16 += n_bytes;
        break;
    case ENGINE_DTYPE_F32:
        formats->f32 += n_bytes;
        break;
    default:
        formats->other += n_bytes;
        break;
    }
}

void plan_add_skipped_bytes(plan_t *plan, engine_dtype_t dtype, int64_t n_bytes, int64_t n_tensors)
{
    plan_formats_add(&plan->skipped, dtype, n_bytes);
    plan->n_skipped += n_tensors;
}

void plan_add_skipped(plan_t *plan, const engine_st_tensor_t *tensor)
{
    plan_add_skipped_bytes(plan, tensor->dtype, (int64_t)tensor->n_bytes, 1);
}

int64_t plan_formats_total(const plan_formats_t *f)
{
    return f->fp8 + f->fp4 + f->scale + f->bf16 + f->f32 + f->other;
}

void plan_print_bytes(FILE *out, const char *label, int64_t n_bytes)
{
    fprintf(out, "  %-34s %16lld B %10.2f GB\n", label, (long long)n_bytes,
            (double)n_bytes / PLAN_GB);
}

void plan_print_formats(FILE *out, const char *prefix, const plan_formats_t *f)
{
    char label[64];

    snprintf(label, sizeof(label), "%s FP8 E4M3 codes", prefix);
    plan_print_bytes(out, label, f->fp8);
    snprintf(label, sizeof(label), "%s FP4 experts (packed E2M1)", prefix);
    plan_print_bytes(out, label, f->fp4);
    snprintf(label, sizeof(label), "%s E8M0 scales", prefix);
    plan_print_bytes(out, label, f->scale);
    snprintf(label, sizeof(label), "%s BF16", prefix);
    plan_print_bytes(out, label, f->bf16);
    snprintf(label, sizeof(label), "%s F32", prefix);
    plan_print_bytes(out, label, f->f32);
    if (f->other != 0) {
        snprintf(label, sizeof(label), "%s other dtypes", prefix);
        plan_print_bytes(out, label, f->other);
    }
}

void plan_print(const plan_t *plan, FILE *out)
{
    plan_formats_t release;
    uint64_t pool_bytes = plan->page_bytes * plan->n_pages;

    release.fp8 = plan->text.fp8 + plan->skipped.fp8;
    release.fp4 = plan->text.fp4 + plan->skipped.fp4;
    release.scale = plan->text.scale + plan->skipped.scale;
    release.bf16 = plan->text.bf16 + plan->skipped.bf16;
    release.f32 = plan->text.f32 + plan->skipped.f32;
    release.other = plan->text.other + plan->skipped.other;

    fprintf(out, "resident memory plan (stored formats; MODEL.md section 10):\n");
    plan_print_formats(out, "loaded", &plan->text);
    plan_print_bytes(out, "loaded weights total", plan_formats_total(&plan->text));
    plan_print_bytes(out, "  of which DSpark blocks", plan->dspark_bytes);
    fprintf(out, "  skipped tensors (vision, bias_vl)  %16lld\n", (long long)plan->n_skipped);
    plan_print_bytes(out, "skipped bytes", plan_formats_total(&plan->skipped));
    plan_print_formats(out, "release", &release);
    plan_print_bytes(out, "release weights total", plan_formats_total(&release));
    plan_print_bytes(out, "Engram tables (host memory)", plan->engram_table_bytes);
    fprintf(out, "  KV page bytes                      %16llu\n",
            (unsigned long long)plan->page_bytes);
    fprintf(out, "  KV pages                           %16u\n", plan->n_pages);
    plan_print_bytes(out, "KV pool", (int64_t)pool_bytes);
}
