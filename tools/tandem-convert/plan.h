/* plan.h - tandem-convert's resident memory plan: what serving a checkpoint will hold, by stored
 * format, printed before anything large is allocated (MODEL.md section 10).
 *
 * Sums the text model's tensors from the inventory (engine_inventory_count), the tensors the
 * loader skips (vision tower, ffn.gate.bias_vl), the Engram tables and a KV pool of a given page
 * count (kernels/kv_page.h page size). Owns nothing; knows nothing of files beyond the tensors it
 * is handed.
 */
#ifndef TANDEM_TOOLS_CONVERT_PLAN_H
#define TANDEM_TOOLS_CONVERT_PLAN_H

#include <stdint.h>
#include <stdio.h>

#include "common/status.h"
#include "engine/config.h"
#include "engine/inventory.h"
#include "engine/safetensors.h"

/* Bytes per stored format (MODEL.md 3 and 10). other: any dtype outside the five. */
typedef struct {
    int64_t fp8;   /* F8_E4M3 codes outside the Engram tables */
    int64_t fp4;   /* packed E2M1 experts (I8 or U8) */
    int64_t scale; /* F8_E8M0 scales outside the Engram tables */
    int64_t bf16;
    int64_t f32;
    int64_t other;
} plan_formats_t;

/*
 * The plan. text: what the engine loads (the inventory's resident tensors); skipped: tensors of
 * the release files the loader skips (n_skipped of them); engram_table_bytes: host-memory tables
 * and their scales; page_bytes x n_pages: the KV pool.
 */
typedef struct {
    plan_formats_t text;
    plan_formats_t skipped;
    int64_t n_skipped;
    int64_t engram_table_bytes;
    int64_t dspark_bytes;
    uint64_t page_bytes;
    uint32_t n_pages;
} plan_t;

/*
 * plan_init - the text part of *plan_out from the inventory counts of *cfg, the KV page size for
 * (head_dim, index_head_dim) and n_pages; skipped starts at zero. Returns TDM_OK or
 * TDM_ERR_INVALID_ARG (a head size the page format refuses).
 */
tdm_status_t plan_init(const engine_config_t *cfg, const engine_param_counts_t *counts,
                       uint32_t n_pages, plan_t *plan_out);

/*
 * plan_formats_add - add n_bytes of a tensor of `dtype` to the format it is stored in: F8_E4M3 to
 * fp8, I8/U8 (packed E2M1) to fp4, F8_E8M0 to scale, BF16, F32, anything else to other. The
 * caller decides which tensors count (Engram tables are not weights of any GPU). Cannot fail.
 */
void plan_formats_add(plan_formats_t *formats, engine_dtype_t dtype, int64_t n_bytes);

/* plan_formats_total - the sum of every format's bytes in *formats. */
int64_t plan_formats_total(const plan_formats_t *formats);

/*
 * plan_print_bytes - one plan line "  <label>  <bytes> B  <GB> GB" (label padded to 34 columns,
 * GB = 1e9 bytes, two decimals), the layout every plan line with a byte count uses.
 */
void plan_print_bytes(FILE *out, const char *label, int64_t n_bytes);

/*
 * plan_print_formats - the five format lines of *formats (and "other dtypes" when non-zero), each
 * labelled "<prefix> FP8 E4M3 codes", "<prefix> FP4 experts (packed E2M1)", "<prefix> E8M0
 * scales", "<prefix> BF16", "<prefix> F32" (plan_print_bytes layout).
 */
void plan_print_formats(FILE *out, const char *prefix, const plan_formats_t *formats);

/* plan_add_skipped - count one skipped tensor's bytes under its dtype's format. */
void plan_add_skipped(plan_t *plan, const engine_st_tensor_t *tensor);

/* plan_add_skipped_bytes - count n_bytes of dtype under skipped (n_tensors tensors). */
void plan_add_skipped_bytes(plan_t *plan, engine_dtype_t dtype, int64_t n_bytes, int64_t n_tensors);

/*
 * plan_print - the plan as lines "  <label>  <bytes> B  <GB> GB" (GB = 1e9 bytes, two decimals):
 * text weights per format and total, skipped, release files per format and total (text +
 * skipped), Engram tables, KV pool. Labels are fixed (tests parse them).
 */
void plan_print(const plan_t *plan, FILE *out);

#endif
