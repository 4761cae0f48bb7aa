/* test_inventory.c - engine/inventory: tensor list of MODEL.md section 3 (counts, exact specs,
 * unique names) and the parameter and byte figures of sections 9 and 10. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/config.h"
#include "engine/inventory.h"

/* Release figures of MODEL.md section 10 (and the checkpoint atlas it cites). */
#define FULL_BACKBONE_PARAMS     551880835184LL
#define FULL_ENGRAM_PARAMS       196613849600LL
#define FULL_DSPARK_PARAMS       14225362530LL
#define FULL_VISION_PARAMS       485268480LL
#define FULL_TOTAL_PARAMS        763205315794LL
#define FULL_VISION_BF16_BYTES   970536960LL /* 485,268,480 BF16 parameters */
#define FULL_TENSORS_WITH_VISION 96085

typedef struct {
    engine_config_t cfg;
    engine_tensor_spec_t *specs;
    size_t n_specs;
    engine_param_counts_t counts;
} model_t;

static void model_build(const char *name, model_t *m)
{
    assert_int_equal(engine_config_preset(name, &m->cfg), TDM_OK);
    assert_int_equal(engine_inventory_build(&m->cfg, &m->specs, &m->n_specs), TDM_OK);
    assert_int_equal(engine_inventory_count(&m->cfg, m->specs, m->n_specs, &m->counts), TDM_OK);
}

static void model_free(model_t *m)
{
    free(m->specs);
    m->specs = NULL;
}

static const engine_tensor_spec_t *find(const model_t *m, const char *name)
{
    for (size_t i = 0; i < m->n_specs; i++) {
        if (strcmp(m->specs[i].name, name) == 0) {
            return &m->specs[i];
        }
    }
    return NULL;
}

/* The spec `name` must exist with this dtype, 2-D (d1 >= 0) or 1-D shape, part, layer, flags. */
static void expect_spec(const model_t *m, const char *name, engine_dtype_t dtype, int64_t d0,
                        int64_t d1, engine_part_t part, int layer, uint32_t flags, int64_t n_params)
{
    const engine_tensor_spec_t *spec = find(m, name);

    if (spec == NULL) {
        fail_msg("missing tensor %s", name);
    }
    assert_string_equal(engine_dtype_name(spec->dtype), engine_dtype_name(dtype));
    assert_int_equal(spec->n_dims, d1 < 0 ? 1 : 2);
    assert_int_equal(spec->shape[0], d0);
    assert_int_equal(spec->shape[1], d1 < 0 ? 0 : d1);
    assert_int_equal(spec->part, part);
    assert_int_equal(spec->layer, layer);
    assert_int_equal(spec->flags, flags);
    assert_int_equal(spec->n_params, n_params);
}

static void expect_absent(const model_t *m, const char *name)
{
    if (find(m, name) != NULL) {
        fail_msg("unexpected tensor %s", name);
    }
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(((const engine_tensor_spec_t *)a)->name, ((const engine_tensor_spec_t *)b)->name);
}

/* Figures printed the way the MODEL.md tables round them. */
static void expect_rounded(double value, double unit, const char *format, const char *want)
{
    char got[32];

    snprintf(got, sizeof(got), format, value / unit);
    assert_string_equal(got, want);
}

/* ---- lists -------------------------------------------------------------------------------- */

static void test_tensor_counts(void **state)
{
    static const struct {
        const char *name;
        size_t n_tensors;
    } want[] = {{"tiny", 815}, {"small", 2207}, {"full", 95776}};
    (void)state;

    for (size_t i = 0; i < 3; i++) {
        model_t m;

        model_build(want[i].name, &m);
        assert_int_equal(m.n_specs, want[i].n_tensors);
        assert_int_equal(m.counts.n_tensors, (int64_t)want[i].n_tensors);
        model_free(&m);
    }
}

static void test_full_count_plus_skipped_tensors_is_the_release_count(void **state)
{
    model_t m;
    (void)state;

    /* 95,776 text tensors + one ffn.gate.bias_vl per layer and block (43) + 266 vision tensors
     * (vision.*, aligner.*, image delimiters; checkpoint atlas) = 96,085 (MODEL.md 3). */
    model_build("full", &m);
    assert_int_equal(m.n_specs + (size_t)(m.cfg.n_layers + m.cfg.n_blocks) + 266,
                     FULL_TENSORS_WITH_VISION);
    model_free(&m);
}

static void test_names_are_unique_and_bare(void **state)
{
    static const char *const names[] = {"tiny", "full"};
    (void)state;

    for (size_t k = 0; k < 2; k++) {
        model_t m;

        model_build(names[k], &m);
        for (size_t i = 0; i < m.n_specs; i++) {
            const engine_tensor_spec_t *spec = &m.specs[i];
            int layer = -1;
            int block = -1;

            assert_true(strncmp(spec->name, "model.", 6) != 0);
            assert_null(strstr(spec->name, "bias_vl"));
            if (sscanf(spec->name, "layers.%d.", &layer) == 1) {
                assert_int_equal(spec->layer, layer);
                assert_true(spec->part != ENGINE_PART_DSPARK);
            } else if (sscanf(spec->name, "mtp.%d.", &block) == 1) {
                assert_int_equal(spec->layer, m.cfg.n_layers + block);
                assert_int_equal(spec->part, ENGINE_PART_DSPARK);
            } else {
                assert_int_equal(spec->layer, -1);
                assert_int_equal(spec->part, ENGINE_PART_BACKBONE);
            }
            if ((spec->flags & ENGINE_SPEC_SCALE) != 0) {
                assert_int_equal(spec->n_params, 0);
                assert_int_equal(spec->dtype, ENGINE_DTYPE_F8_E8M0);
                assert_non_null(strstr(spec->name, ".scale"));
            }
        }
        qsort(m.specs, m.n_specs, sizeof(m.specs[0]), compare_names);
        for (size_t i = 1; i < m.n_specs; i++) {
            if (strcmp(m.specs[i - 1].name, m.specs[i].name) == 0) {
                fail_msg("duplicate tensor %s", m.specs[i].name);
            }
        }
        model_free(&m);
    }
}

static void test_full_specs_by_hand(void **state)
{
    const engine_part_t bb = ENGINE_PART_BACKBONE;
    const engine_part_t ds = ENGINE_PART_DSPARK;
    const engine_part_t tab = ENGINE_PART_ENGRAM_TABLE;
    const uint32_t scale = ENGINE_SPEC_SCALE;
    const uint32_t fp4 = ENGINE_SPEC_FP4_PACKED;
    model_t m;
    (void)state;

    model_build("full", &m);
    /* globals */
    expect_spec(&m, "embed.weight", ENGINE_DTYPE_BF16, 129280, 5120, bb, -1, 0, 661913600);
    expect_spec(&m, "head.weight", ENGINE_DTYPE_BF16, 129280, 5120, bb, -1, 0, 661913600);
    expect_spec(&m, "norm.weight", ENGINE_DTYPE_BF16, 5120, -1, bb, -1, 0, 5120);
    /* norms, mHC (no .weight) */
    expect_spec(&m, "layers.0.attn_norm.weight", ENGINE_DTYPE_BF16, 5120, -1, bb, 0, 0, 5120);
    expect_spec(&m, "layers.0.hc_attn_fn", ENGINE_DTYPE_F32, 24, 20480, bb, 0, 0, 491520);
    expect_spec(&m, "layers.0.hc_ffn_base", ENGINE_DTYPE_F32, 24, -1, bb, 0, 0, 24);
    expect_spec(&m, "layers.0.hc_ffn_scale", ENGINE_DTYPE_F32, 3, -1, bb, 0, 0, 3);
    /* attention: FP8 weight + .scale [ceil(out/32), ceil(in/32)] */
    expect_spec(&m, "layers.3.attn.wq_a.weight", ENGINE_DTYPE_F8_E4M3, 1280, 5120, bb, 3, 0,
                6553600);
    expect_spec(&m, "layers.3.attn.wq_a.scale", ENGINE_DTYPE_F8_E8M0, 40, 160, bb, 3, scale, 0);
    expect_spec(&m, "layers.3.attn.wq_b.weight", ENGINE_DTYPE_F8_E4M3, 32768, 1280, bb, 3, 0,
                41943040);
    expect_spec(&m, "layers.3.attn.wo_a.weight", ENGINE_DTYPE_F8_E4M3, 8192, 4096, bb, 3, 0,
                33554432);
    expect_spec(&m, "layers.3.attn.wo_a.scale", ENGINE_DTYPE_F8_E8M0, 256, 128, bb, 3, scale, 0);
    expect_spec(&m, "layers.3.attn.wo_b.weight", ENGINE_DTYPE_F8_E4M3, 5120, 8192, bb, 3, 0,
                41943040);
    expect_spec(&m, "layers.3.attn.wkv.weight", ENGINE_DTYPE_F8_E4M3, 512, 5120, bb, 3, 0, 2621440);
    expect_spec(&m, "layers.3.attn.q_norm.weight", ENGINE_DTYPE_BF16, 1280, -1, bb, 3, 0, 1280);
    expect_spec(&m, "layers.3.attn.kv_norm.weight", ENGINE_DTYPE_BF16, 512, -1, bb, 3, 0, 512);
    expect_spec(&m, "layers.39.attn.attn_sink", ENGINE_DTYPE_F32, 64, -1, bb, 39, 0, 64);
    /* compressors: KV sources only, wgate only at ratio 2 */
    expect_spec(&m, "layers.2.attn.compressor.wkv.weight", ENGINE_DTYPE_BF16, 512, 5120, bb, 2, 0,
                2621440);
    expect_spec(&m, "layers.2.attn.compressor.wgate.weight", ENGINE_DTYPE_BF16, 512, 5120, bb, 2, 0,
                2621440);
    expect_spec(&m, "layers.20.attn.compressor.norm.weight", ENGINE_DTYPE_BF16, 512, -1, bb, 20, 0,
                512);
    expect_absent(&m, "layers.20.attn.compressor.wgate.weight");
    expect_absent(&m, "layers.3.attn.compressor.wkv.weight");
    expect_absent(&m, "layers.24.attn.compressor.wkv.weight");
    /* indexers: wq_b/weights_proj at index sources, wk/k_norm at Full layers */
    expect_spec(&m, "layers.24.attn.indexer.wq_b.weight", ENGINE_DTYPE_F8_E4M3, 4096, 1280, bb, 24,
                0, 5242880);
    expect_spec(&m, "layers.24.attn.indexer.wq_b.scale", ENGINE_DTYPE_F8_E8M0, 128, 40, bb, 24,
                scale, 0);
    expect_spec(&m, "layers.24.attn.indexer.weights_proj.weight", ENGINE_DTYPE_BF16, 32, 5120, bb,
                24, 0, 163840);
    expect_absent(&m, "layers.24.attn.indexer.wk.weight");
    expect_spec(&m, "layers.20.attn.indexer.wk.weight", ENGINE_DTYPE_BF16, 128, 512, bb, 20, 0,
                65536);
    expect_spec(&m, "layers.20.attn.indexer.k_norm.weight", ENGINE_DTYPE_BF16, 128, -1, bb, 20, 0,
                128);
    expect_absent(&m, "layers.3.attn.indexer.wq_b.weight");
    /* router and experts */
    expect_spec(&m, "layers.3.ffn.gate.weight", ENGINE_DTYPE_BF16, 384, 5120, bb, 3, 0, 1966080);
    expect_spec(&m, "layers.3.ffn.gate.bias", ENGINE_DTYPE_F32, 384, -1, bb, 3, 0, 384);
    expect_spec(&m, "layers.3.ffn.experts.5.w1.weight", ENGINE_DTYPE_I8, 2304, 2560, bb, 3, fp4,
                11796480);
    expect_spec(&m, "layers.3.ffn.experts.5.w1.scale", ENGINE_DTYPE_F8_E8M0, 2304, 160, bb, 3,
                scale, 0);
    expect_spec(&m, "layers.3.ffn.experts.383.w2.weight", ENGINE_DTYPE_I8, 5120, 1152, bb, 3, fp4,
                11796480);
    expect_spec(&m, "layers.3.ffn.experts.383.w2.scale", ENGINE_DTYPE_F8_E8M0, 5120, 72, bb, 3,
                scale, 0);
    expect_absent(&m, "layers.3.ffn.experts.384.w1.weight");
    expect_spec(&m, "layers.3.ffn.shared_experts.w2.weight", ENGINE_DTYPE_F8_E4M3, 5120, 2304, bb,
                3, 0, 11796480);
    expect_spec(&m, "layers.3.ffn.shared_experts.w2.scale", ENGINE_DTYPE_F8_E8M0, 160, 72, bb, 3,
                scale, 0);
    /* Engram: table (host part) and projections */
    expect_spec(&m, "layers.1.engram.embed.weight", ENGINE_DTYPE_F8_E4M3, 384006168, 256, tab, 1, 0,
                98305579008);
    expect_spec(&m, "layers.1.engram.embed.scale", ENGINE_DTYPE_F8_E8M0, 384006168, 8, tab, 1,
                scale, 0);
    expect_spec(&m, "layers.14.engram.wkv.weight", ENGINE_DTYPE_F8_E4M3, 25600, 6144, bb, 14, 0,
                157286400);
    expect_spec(&m, "layers.14.engram.q_weight", ENGINE_DTYPE_BF16, 4, 5120, bb, 14, 0, 20480);
    expect_spec(&m, "layers.14.engram.k_weight", ENGINE_DTYPE_BF16, 4, 5120, bb, 14, 0, 20480);
    expect_absent(&m, "layers.2.engram.wkv.weight");
    /* DSpark */
    expect_spec(&m, "mtp.0.main_proj.weight", ENGINE_DTYPE_F8_E4M3, 5120, 15360, ds, 40, 0,
                78643200);
    expect_spec(&m, "mtp.0.main_norm.weight", ENGINE_DTYPE_BF16, 5120, -1, ds, 40, 0, 5120);
    expect_spec(&m, "mtp.1.ffn.gate.weight", ENGINE_DTYPE_BF16, 128, 5120, ds, 41, 0, 655360);
    expect_spec(&m, "mtp.1.ffn.experts.127.w2.weight", ENGINE_DTYPE_I8, 5120, 1152, ds, 41, fp4,
                11796480);
    expect_absent(&m, "mtp.1.ffn.experts.128.w1.weight");
    expect_spec(&m, "mtp.1.attn.wq_a.weight", ENGINE_DTYPE_F8_E4M3, 1280, 5120, ds, 41, 0, 6553600);
    expect_spec(&m, "mtp.2.norm.weight", ENGINE_DTYPE_BF16, 5120, -1, ds, 42, 0, 5120);
    expect_spec(&m, "mtp.2.markov_head.embed.weight", ENGINE_DTYPE_BF16, 129280, 256, ds, 42, 0,
                33095680);
    expect_spec(&m, "mtp.2.markov_head.head.weight", ENGINE_DTYPE_BF16, 129280, 256, ds, 42, 0,
                33095680);
    expect_spec(&m, "mtp.2.confidence_head.proj.weight", ENGINE_DTYPE_BF16, 1, 5376, ds, 42, 0,
                5376);
    expect_absent(&m, "mtp.1.norm.weight");
    expect_absent(&m, "mtp.1.main_proj.weight");
    expect_absent(&m, "mtp.0.attn.compressor.wkv.weight");
    expect_absent(&m, "mtp.0.attn.indexer.wq_b.weight");
    expect_absent(&m, "mtp.3.attn_norm.weight");
    expect_absent(&m, "layers.40.attn_norm.weight");
    model_free(&m);
}

static void test_tiny_specs_by_hand(void **state)
{
    const engine_part_t bb = ENGINE_PART_BACKBONE;
    const uint32_t scale = ENGINE_SPEC_SCALE;
    model_t m;
    (void)state;

    model_build("tiny", &m);
    /* wo_a [G*r_o, n_h*d/G] = [64, 128]; its scale [2, 4] */
    expect_spec(&m, "layers.0.attn.wo_a.weight", ENGINE_DTYPE_F8_E4M3, 64, 128, bb, 0, 0, 8192);
    expect_spec(&m, "layers.0.attn.wo_a.scale", ENGINE_DTYPE_F8_E8M0, 2, 4, bb, 0, scale, 0);
    /* Engram on the window layer 1 and the KV source 2 */
    expect_spec(&m, "layers.1.engram.embed.weight", ENGINE_DTYPE_F8_E4M3, 6126, 32,
                ENGINE_PART_ENGRAM_TABLE, 1, 0, 6126 * 32);
    expect_spec(&m, "layers.2.engram.embed.scale", ENGINE_DTYPE_F8_E8M0, 6332, 1,
                ENGINE_PART_ENGRAM_TABLE, 2, scale, 0);
    expect_spec(&m, "layers.2.engram.wkv.weight", ENGINE_DTYPE_F8_E4M3, 640, 192, bb, 2, 0, 122880);
    expect_spec(&m, "layers.2.attn.compressor.wgate.weight", ENGINE_DTYPE_BF16, 64, 128, bb, 2, 0,
                8192);
    expect_absent(&m, "layers.4.attn.compressor.wgate.weight");
    expect_spec(&m, "layers.6.attn.indexer.wq_b.weight", ENGINE_DTYPE_F8_E4M3, 128, 64, bb, 6, 0,
                8192);
    expect_absent(&m, "layers.6.attn.indexer.wk.weight");
    expect_absent(&m, "layers.7.attn.indexer.wq_b.weight");
    expect_spec(&m, "mtp.0.main_proj.weight", ENGINE_DTYPE_F8_E4M3, 128, 384, ENGINE_PART_DSPARK, 8,
                0, 49152);
    expect_spec(&m, "mtp.2.confidence_head.proj.weight", ENGINE_DTYPE_BF16, 1, 144,
                ENGINE_PART_DSPARK, 10, 0, 144);
    expect_spec(&m, "mtp.2.ffn.experts.3.w1.weight", ENGINE_DTYPE_I8, 32, 64, ENGINE_PART_DSPARK,
                10, ENGINE_SPEC_FP4_PACKED, 4096);
    expect_absent(&m, "mtp.2.ffn.experts.4.w1.weight");
    model_free(&m);
}

/* ---- figures ------------------------------------------------------------------------------ */

static void test_tiny_and_small_figures_match_section_9(void **state)
{
    /* MODEL.md 9's rounded millions (backbone, Engram tables, DSpark, total, active decode),
     * then the exact counts. */
    static const struct {
        const char *preset;
        const char *format;        /* the table's rounding */
        const char *active_format; /* active decode's rounding */
        const char *backbone_m, *engram_m, *dspark_m, *total_m, *active_m;
        uint64_t backbone, engram_table, dspark, active_decode;
    } want[] = {
        {"tiny", "%.2f", "%.1f", "2.05", "0.40", "0.49", "2.94", "1.3", 2051408, (6126 + 6332) * 32,
         490698, 1330512},
        {"small", "%.1f", "%.1f", "93.9", "6.4", "8.0", "108.3", "44.0", 93856032,
         (49796 + 50980) * 64, 7958374, 44048672},
    };
    (void)state;

    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        model_t m;

        model_build(want[i].preset, &m);
        expect_rounded((double)m.counts.backbone_params, 1e6, want[i].format, want[i].backbone_m);
        expect_rounded((double)m.counts.engram_table_params, 1e6, want[i].format, want[i].engram_m);
        expect_rounded((double)m.counts.dspark_params, 1e6, want[i].format, want[i].dspark_m);
        expect_rounded((double)m.counts.total_params, 1e6, want[i].format, want[i].total_m);
        expect_rounded((double)m.counts.active_decode_params, 1e6, want[i].active_format,
                       want[i].active_m);
        assert_int_equal(m.counts.backbone_params, want[i].backbone);
        assert_int_equal(m.counts.engram_table_params, want[i].engram_table);
        assert_int_equal(m.counts.dspark_params, want[i].dspark);
        assert_int_equal(m.counts.active_decode_params, want[i].active_decode);
        model_free(&m);
    }
}

static void test_full_parameters_match_section_10(void **state)
{
    model_t m;
    const engine_param_counts_t *c;
    (void)state;

    model_build("full", &m);
    c = &m.counts;
    /* The release counts ffn.gate.bias_vl [E] F32 of every layer and block under backbone and
     * DSpark (docs/MODEL-NOTES.md); the text inventory skips it. */
    assert_int_equal(c->bias_vl_backbone_params, 384 * 40);
    assert_int_equal(c->bias_vl_dspark_params, 128 * 3);
    assert_int_equal(c->backbone_params + c->bias_vl_backbone_params, FULL_BACKBONE_PARAMS);
    assert_int_equal(c->engram_table_params, FULL_ENGRAM_PARAMS);
    assert_int_equal(c->engram_table_params, 768022850LL * 256);
    assert_int_equal(c->dspark_params + c->bias_vl_dspark_params, FULL_DSPARK_PARAMS);
    assert_int_equal(c->total_params + c->bias_vl_backbone_params + c->bias_vl_dspark_params +
                         FULL_VISION_PARAMS,
                     FULL_TOTAL_PARAMS);
    assert_int_equal(c->backbone_params, 551880819824LL);
    assert_int_equal(c->dspark_params, 14225362146LL);
    /* 40 x 377.29 M + head 0.66 B + compressors/indexers 62 M + Engram 0.31 B ~ 16.13 B */
    expect_rounded((double)c->active_decode_params, 1e9, "%.2f", "16.13");
    assert_int_equal(c->active_decode_params, 16130573424LL);
    model_free(&m);
}

static void test_full_bytes_match_section_10(void **state)
{
    model_t m;
    const engine_param_counts_t *c;
    int64_t bias_vl_bytes;
    int64_t resident_release;
    (void)state;

    model_build("full", &m);
    c = &m.counts;
    bias_vl_bytes = 4 * (c->bias_vl_backbone_params + c->bias_vl_dspark_params);
    resident_release = c->resident_bytes + bias_vl_bytes;
    /* "306.56 GB text-only", "307.53 GB (286.4 GiB)" with vision */
    expect_rounded((double)c->resident_bytes, 1e9, "%.2f", "306.56");
    assert_int_equal(resident_release, 306557453640LL);
    expect_rounded((double)(resident_release + FULL_VISION_BF16_BYTES), 1e9, "%.2f", "307.53");
    expect_rounded((double)(resident_release + FULL_VISION_BF16_BYTES), 1073741824.0, "%.1f",
                   "286.4");
    assert_int_equal(c->fp8_bytes + c->fp4_bytes + c->scale_bytes + c->bf16_bytes + c->f32_bytes,
                     c->resident_bytes);
    /* FP8 7.40 + FP4 experts 278.59 + E8M0 scales 17.42 + BF16 3.95 + F32 0.17 GB */
    assert_int_equal(c->fp8_bytes, 7401373696LL);
    assert_int_equal(c->fp4_bytes, 278585671680LL);
    assert_int_equal(c->scale_bytes, 17418832384LL);
    expect_rounded((double)c->fp8_bytes, 1e9, "%.2f", "7.40");
    expect_rounded((double)c->fp4_bytes, 1e9, "%.2f", "278.59");
    expect_rounded((double)c->scale_bytes, 1e9, "%.2f", "17.42");
    expect_rounded((double)(c->bf16_bytes + FULL_VISION_BF16_BYTES), 1e9, "%.2f", "3.95");
    expect_rounded((double)(c->f32_bytes + bias_vl_bytes), 1e9, "%.2f", "0.17");
    assert_int_equal(c->f32_bytes + bias_vl_bytes, 169229128LL);
    /* DSpark 7.93 GB inside; Engram tables 202.76 GB = 768 M rows x 264 B */
    expect_rounded((double)c->dspark_bytes, 1e9, "%.2f", "7.93");
    assert_int_equal(c->dspark_bytes + 4 * c->bias_vl_dspark_params, 7932874632LL);
    assert_int_equal(c->engram_table_bytes, 768022850LL * 264);
    expect_rounded((double)c->engram_table_bytes, 1e9, "%.2f", "202.76");
    model_free(&m);
}

/* ---- errors ------------------------------------------------------------------------------- */

static void test_bad_arguments_change_nothing(void **state)
{
    engine_config_t cfg;
    engine_tensor_spec_t sentinel;
    engine_tensor_spec_t *specs = &sentinel;
    size_t n_specs = 7;
    engine_tensor_spec_t bad;
    engine_param_counts_t counts;
    engine_param_counts_t before;
    (void)state;

    assert_int_equal(engine_config_preset("tiny", &cfg), TDM_OK);
    assert_int_equal(engine_inventory_build(NULL, &specs, &n_specs), TDM_ERR_INVALID_ARG);
    assert_int_equal(engine_inventory_build(&cfg, NULL, &n_specs), TDM_ERR_INVALID_ARG);
    assert_ptr_equal(specs, &sentinel);
    assert_int_equal(n_specs, 7);

    memset(&before, 0x11, sizeof(before));
    counts = before;
    memset(&bad, 0, sizeof(bad));
    snprintf(bad.name, sizeof(bad.name), "x");
    bad.dtype = ENGINE_DTYPE_COUNT;
    bad.n_dims = 1;
    bad.shape[0] = 4;
    assert_int_equal(engine_inventory_count(&cfg, &bad, 1, &counts), TDM_ERR_INVALID_ARG);
    bad.dtype = ENGINE_DTYPE_BF16;
    bad.shape[0] = -4;
    assert_int_equal(engine_inventory_count(&cfg, &bad, 1, &counts), TDM_ERR_INVALID_ARG);
    assert_int_equal(engine_inventory_count(&cfg, NULL, 1, &counts), TDM_ERR_INVALID_ARG);
    assert_memory_equal(&counts, &before, sizeof(counts));
    assert_int_equal(engine_inventory_count(&cfg, NULL, 0, &counts), TDM_OK);
    assert_int_equal(counts.n_tensors, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tensor_counts),
        cmocka_unit_test(test_full_count_plus_skipped_tensors_is_the_release_count),
        cmocka_unit_test(test_names_are_unique_and_bare),
        cmocka_unit_test(test_full_specs_by_hand),
        cmocka_unit_test(test_tiny_specs_by_hand),
        cmocka_unit_test(test_tiny_and_small_figures_match_section_9),
        cmocka_unit_test(test_full_parameters_match_section_10),
        cmocka_unit_test(test_full_bytes_match_section_10),
        cmocka_unit_test(test_bad_arguments_change_nothing),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
