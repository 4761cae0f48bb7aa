/* test_sim_perf.c - tandem-sim's cost model (sim/perf.h; issue 18 items 5 and 6): the GPU table,
 * costs monotone in tokens, batch and context, batch-1 decode bound by the bytes a step reads,
 * the FP4 and FP8 expert paths, calibration files (fits, parse errors with line numbers,
 * gpu-check logs), transfers and the power formula.
 */
#include <math.h>
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
#include "sim/perf.h"

static const char *const gpu_names[] = {"h200", "b200", "b300", "gb200", "gb300"};
#define N_GPUS (sizeof(gpu_names) / sizeof(gpu_names[0]))

static sim_perf_t *make(const char *gpu, sim_role_t role, uint32_t draft_len)
{
    sim_perf_params_t p;
    sim_perf_t *perf = NULL;
    char err[256] = "";

    sim_perf_params_default(&p);
    p.gpu = sim_gpu_find(gpu);
    assert_non_null(p.gpu);
    p.dspark_draft_len = draft_len;
    p.dspark_acceptance = draft_len > 0 ? 1.5 : 0.0;
    assert_int_equal(sim_perf_create(role, &p, &perf, err, sizeof(err)), TDM_OK);
    assert_non_null(perf);
    return perf;
}

static void test_gpu_table(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_GPUS; i++) {
        const sim_gpu_t *g = sim_gpu_find(gpu_names[i]);
        assert_non_null(g);
        assert_string_equal(g->name, gpu_names[i]);
        assert_non_null(strstr(sim_gpu_names(), gpu_names[i]));
        assert_true(g->hbm_bytes >= 141e9 && g->hbm_bytes <= 288e9);
        assert_true(g->hbm_bytes_per_s >= 4.8e12 && g->hbm_bytes_per_s <= 8e12);
        assert_true(g->fp8_flops > 1e15 && g->fp4_flops >= g->fp8_flops);
        assert_true(g->nvlink_bytes_per_s > g->rdma_bytes_per_s);
        assert_true(g->host_bytes_per_s > 0);
        assert_true(g->power_idle_w > 0 && g->power_idle_w < g->power_busy_w);
        assert_true(g->domain_gpus == 8 || g->domain_gpus == 72);
    }
    assert_true(sim_gpu_find("h200")->fp4_flops == sim_gpu_find("h200")->fp8_flops);
    assert_true(sim_gpu_find("b300")->fp4_flops > 2.5 * sim_gpu_find("b300")->fp8_flops);
    assert_int_equal(sim_gpu_find("gb300")->domain_gpus, 72);
    assert_int_equal(sim_gpu_find("b200")->domain_gpus, 8);
    assert_null(sim_gpu_find("a100"));
    assert_null(sim_gpu_find(NULL));
    assert_null(sim_gpu_find("GB300")); /* case-sensitive, as the plan's --gpu */
}

static void test_create_sizes_and_errors(void **state)
{
    sim_perf_params_t p;
    sim_perf_t *perf = NULL;
    char err[256];

    (void)state;
    for (size_t i = 0; i < N_GPUS; i++) {
        perf = make(gpu_names[i], SIM_ROLE_DECODE, 3);
        uint32_t g = sim_perf_group_gpus(perf);
        /* 307.5 GB of weights: at least 2 GPUs of 288 GB, 3 of 141 GB */
        assert_true(g >= 2 && g <= 8);
        assert_true(g * sim_gpu_find(gpu_names[i])->hbm_bytes > 307e9);
        /* KV: at most the free HBM over 890 B/token, and at least one 131072-token session */
        assert_true(sim_perf_kv_tokens(perf) >= 131072);
        assert_true((double)sim_perf_kv_tokens(perf) * 890.0 <
                    g * sim_gpu_find(gpu_names[i])->hbm_bytes);
        sim_perf_destroy(perf);
    }
    /* a bigger group holds more KV */
    sim_perf_params_default(&p);
    p.gpu = sim_gpu_find("gb300");
    p.group_gpus = 4;
    assert_int_equal(sim_perf_create(SIM_ROLE_DECODE, &p, &perf, err, sizeof(err)), TDM_OK);
    uint64_t kv4 = sim_perf_kv_tokens(perf);
    sim_perf_destroy(perf);
    p.group_gpus = 8;
    assert_int_equal(sim_perf_create(SIM_ROLE_DECODE, &p, &perf, err, sizeof(err)), TDM_OK);
    assert_true(sim_perf_kv_tokens(perf) > kv4 + kv4 / 2);
    assert_int_equal(sim_perf_group_gpus(perf), 8);
    sim_perf_destroy(perf);
    /* one H200 cannot hold the model: refused with the smallest group */
    p.gpu = sim_gpu_find("h200");
    p.group_gpus = 1;
    perf = NULL;
    assert_int_equal(sim_perf_create(SIM_ROLE_DECODE, &p, &perf, err, sizeof(err)),
                     TDM_ERR_UNSUPPORTED);
    assert_null(perf);
    assert_non_null(strstr(err, "smallest group"));
    /* invalid parameters */
    sim_perf_params_default(&p);
    assert_int_equal(sim_perf_create(SIM_ROLE_DECODE, &p, &perf, err, sizeof(err)),
                     TDM_ERR_INVALID_ARG); /* no gpu */
    p.gpu = sim_gpu_find("b200");
    p.dspark_acceptance = 3.5; /* > draft_len 3 */
    assert_int_equal(sim_perf_create(SIM_ROLE_DECODE, &p, &perf, err, sizeof(err)),
                     TDM_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "acceptance"));
    p.dspark_acceptance = 1.0;
    p.max_batch_seqs = 0;
    assert_int_equal(sim_perf_create(SIM_ROLE_DECODE, &p, &perf, err, sizeof(err)),
                     TDM_ERR_INVALID_ARG);
    p.max_batch_seqs = 64;
    p.efficiency = 0.0;
    assert_int_equal(sim_perf_create(SIM_ROLE_DECODE, &p, &perf, err, sizeof(err)),
                     TDM_ERR_INVALID_ARG);
    assert_null(perf);
}

static void test_tokens_per_step(void **state)
{
    (void)state;
    sim_perf_t *spec = make("b300", SIM_ROLE_DECODE, 3);
    sim_perf_t *plain = make("b300", SIM_ROLE_DECODE, 0);
    assert_true(fabs(sim_perf_tokens_per_step(spec) - 2.5) < 1e-12);
    assert_true(sim_perf_tokens_per_step(plain) == 1.0);
    /* a verify step of 4 tokens per sequence costs more than a plain step, less than 2.5 x */
    double s_spec = sim_perf_decode_step_s(spec, 1, 4096);
    double s_plain = sim_perf_decode_step_s(plain, 1, 4096);
    assert_true(s_spec > s_plain && s_spec < 2.5 * s_plain);
    sim_perf_destroy(spec);
    sim_perf_destroy(plain);
}

static void test_costs_monotone(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_GPUS; i++) {
        sim_perf_t *d = make(gpu_names[i], SIM_ROLE_DECODE, 3);
        sim_perf_t *pf = make(gpu_names[i], SIM_ROLE_PREFILL, 3);
        double prev = 0;
        for (uint32_t n = 1; n <= 64; n++) {
            double s = sim_perf_decode_step_s(d, n, (uint64_t)n * 8192);
            assert_true(s >= prev * (1 - 1e-12));
            assert_true(s > 0 && isfinite(s));
            prev = s;
        }
        prev = 0;
        for (uint64_t ctx = 1; ctx <= (1u << 20); ctx *= 2) {
            double s = sim_perf_decode_step_s(d, 8, 8 * ctx);
            assert_true(s >= prev * (1 - 1e-12));
            prev = s;
        }
        /* tokens per second grows with batch (weights shared), per sequence it falls */
        double t1 = sim_perf_decode_step_s(d, 1, 8192);
        double t64 = sim_perf_decode_step_s(d, 64, 64 * 8192);
        assert_true(64.0 / t64 > 4.0 / t1);
        prev = 0;
        for (uint64_t n = 1; n <= 200000; n = n * 3 + 1) {
            double s = sim_perf_prefill_s(pf, n, 0);
            assert_true(s > prev);
            prev = s;
        }
        /* the same new tokens after a longer cached context cost at least as much */
        prev = 0;
        for (uint64_t c = 0; c <= (1u << 20); c = c * 4 + 1024) {
            double s = sim_perf_prefill_s(pf, 2048, c);
            assert_true(s >= prev * (1 - 1e-12));
            prev = s;
        }
        assert_true(sim_perf_prefill_s(pf, 0, 100) == 0.0);
        sim_perf_destroy(d);
        sim_perf_destroy(pf);
    }
}

/* Bytes a plain batch-1 decode step reads on the GPU that runs the sequence, counted here from
 * the inventory on its own: every non-expert backbone tensor but the embedding table (a gather)
 * and the Engram tables (host), plus K routed experts per layer, shared over the EP group. */
static double batch1_bytes(uint32_t group)
{
    engine_config_t *cfg = calloc(1, sizeof(*cfg));
    engine_tensor_spec_t *specs = NULL;
    size_t n = 0;
    double rep = 0, experts = 0;

    assert_non_null(cfg);
    assert_int_equal(engine_config_preset("full", cfg), TDM_OK);
    assert_int_equal(engine_inventory_build(cfg, &specs, &n), TDM_OK);
    for (size_t i = 0; i < n; i++) {
        double b = (double)engine_dtype_size_bytes(specs[i].dtype);
        for (int k = 0; k < specs[i].n_dims; k++) {
            b *= (double)specs[i].shape[k];
        }
        if (specs[i].part != ENGINE_PART_BACKBONE || strcmp(specs[i].name, "embed.weight") == 0) {
            continue;
        }
        if (strstr(specs[i].name, ".ffn.experts.") != NULL) {
            experts += b;
        } else {
            rep += b;
        }
    }
    double k_over_e = (double)cfg->num_experts_per_tok / (double)cfg->n_routed_experts;
    free(specs);
    free(cfg);
    return rep + experts * k_over_e / group;
}

static void test_batch1_bandwidth_bound(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_GPUS; i++) {
        sim_perf_t *d = make(gpu_names[i], SIM_ROLE_DECODE, 0);
        const sim_gpu_t *g = sim_gpu_find(gpu_names[i]);
        double bytes = batch1_bytes(sim_perf_group_gpus(d));
        double expect = bytes / (g->hbm_bytes_per_s * 0.6);
        double s = sim_perf_decode_step_s(d, 1, 128);
        /* 14-17 GB read per step; the rest (KV of 128 tokens, Engram, EP, overhead) is small */
        assert_true(bytes > 5e9 && bytes < 20e9);
        assert_true(s >= expect);
        assert_true(s < expect * 1.15);
        /* FLOPs are far below the compute roofline at batch 1 */
        double flop_s = 2.0 * 16.13e9 / (g->fp8_flops * 0.6);
        assert_true(flop_s < 0.05 * s);
        sim_perf_destroy(d);
    }
}

static void test_fp4_fp8_paths(void **state)
{
    (void)state;
    sim_perf_t *b = make("b300", SIM_ROLE_PREFILL, 3);
    sim_perf_t *h = make("h200", SIM_ROLE_PREFILL, 3);
    double b8 = sim_perf_prefill_s(b, 65536, 0), h8 = sim_perf_prefill_s(h, 65536, 0);
    double b8_dec = sim_perf_decode_step_s(b, 1, 4096);

    assert_int_equal(sim_perf_set_expert_math(b, SIM_MATH_FP4), TDM_OK);
    assert_int_equal(sim_perf_set_expert_math(h, SIM_MATH_FP4), TDM_OK);
    assert_int_equal(sim_perf_set_expert_math(NULL, SIM_MATH_FP4), TDM_ERR_INVALID_ARG);
    assert_int_equal(sim_perf_set_expert_math(b, (sim_math_t)7), TDM_ERR_INVALID_ARG);
    double b4 = sim_perf_prefill_s(b, 65536, 0), h4 = sim_perf_prefill_s(h, 65536, 0);
    /* a long prefill is compute-bound, over half of it expert GEMMs: B300's FP4 rate is 3 x FP8 */
    assert_true(b4 < 0.85 * b8);
    /* H200 has no FP4: the same rate */
    assert_true(fabs(h4 - h8) < 1e-12 * h8);
    /* batch-1 decode is bandwidth-bound: the math does not matter */
    assert_true(fabs(sim_perf_decode_step_s(b, 1, 4096) - b8_dec) < 1e-9 * b8_dec);
    sim_perf_destroy(b);
    sim_perf_destroy(h);
}

static void test_transfer_and_power(void **state)
{
    (void)state;
    sim_perf_t *d = make("gb300", SIM_ROLE_DECODE, 3);
    const sim_gpu_t *g = sim_gpu_find("gb300");
    uint32_t n = sim_perf_group_gpus(d);
    double nv = sim_perf_transfer_s(d, 100000, 1), rd = sim_perf_transfer_s(d, 100000, 0);
    assert_true(nv > 0 && rd > nv);
    /* 890 B/token + 2.92 MB state: doubling the tokens adds 89 MB over the link */
    double dt = sim_perf_transfer_s(d, 200000, 0) - rd;
    assert_true(fabs(dt - 100000 * 890.0 / (g->rdma_bytes_per_s * 0.6)) < 1e-9);
    assert_true(sim_perf_transfer_s(d, 0, 1) > 2.9e6 / (g->nvlink_bytes_per_s));
    /* power: group x (idle + busy x (busy - idle)), busy clamped to [0, 1] */
    assert_true(fabs(sim_perf_power_w(d, 0.0) - n * g->power_idle_w) < 1e-9);
    assert_true(fabs(sim_perf_power_w(d, 1.0) - n * g->power_busy_w) < 1e-9);
    assert_true(fabs(sim_perf_power_w(d, 0.5) - n * (g->power_idle_w + g->power_busy_w) / 2) <
                1e-9);
    assert_true(sim_perf_power_w(d, 7.0) == sim_perf_power_w(d, 1.0));
    assert_true(sim_perf_power_w(d, -1.0) == sim_perf_power_w(d, 0.0));
    assert_true(sim_perf_power_w(d, NAN) == sim_perf_power_w(d, 0.0));
    sim_perf_destroy(d);
}

/* Write `text` to a scratch file; returns its path (static buffer). */
static const char *scratch(const char *name, const char *text)
{
    static char path[512];
    const char *dir = getenv("TANDEM_TEST_TMP");
    snprintf(path, sizeof(path), "%s/sim-perf-%s", dir != NULL ? dir : "/tmp", name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

static void expect_format_error(sim_perf_t *perf, const char *name, const char *text,
                                const char *where)
{
    char err[512] = "";
    const char *path = scratch(name, text);
    assert_int_equal(sim_perf_calibrate(perf, path, err, sizeof(err)), TDM_ERR_FORMAT);
    if (strstr(err, where) == NULL) {
        fail_msg("error `%s` does not name `%s`", err, where);
    }
}

static void test_calibration_errors(void **state)
{
    (void)state;
    sim_perf_t *d = make("b200", SIM_ROLE_DECODE, 0);
    double before = sim_perf_decode_step_s(d, 4, 4096);
    char err[512];

    assert_int_equal(sim_perf_calibrate(d, "/nonexistent/calib.txt", err, sizeof(err)),
                     TDM_ERR_NOT_FOUND);
    assert_int_equal(sim_perf_calibrate(d, NULL, err, sizeof(err)), TDM_ERR_INVALID_ARG);
    expect_format_error(d, "v2", "tandem-calib 2\ndecode 1 128 0.01\n", "sim-perf-v2:1: ");
    expect_format_error(d, "kw", "# c\ntandem-calib 1\nsource x\ndecoded 1 128 0.01\n",
                        "sim-perf-kw:4: unknown record");
    expect_format_error(d, "few", "tandem-calib 1\ndecode 1 128 0.01\n\ndecode 2 128\n",
                        "sim-perf-few:4: expected `decode");
    expect_format_error(d, "neg", "tandem-calib 1\nprefill 0 512 -1\n", "sim-perf-neg:2: ");
    expect_format_error(d, "zero", "tandem-calib 1\ndecode 0 128 0.01\n",
                        "sim-perf-zero:2: N_SEQS must be >= 1");
    expect_format_error(d, "text", "tandem-calib 1\nprefill 0 5x12 0.5\n", "sim-perf-text:2: ");
    expect_format_error(d, "extra", "tandem-calib 1\ndecode 1 2 3 4\n", "sim-perf-extra:2: ");
    expect_format_error(d, "empty", "tandem-calib 1\n# nothing\n", "no prefill or decode");
    expect_format_error(d, "other", "hello\nworld\n", "neither");
    expect_format_error(d, "nocuda",
                        "summary: cases=3 cuda=no gemm_decode_best_GBps=0.0 "
                        "gemm_prefill_best_TFLOPs=0.00\n",
                        "sim-perf-nocuda:1: gpu-check summary");
    /* nothing changed by the failures */
    assert_false(sim_perf_calibrated(d));
    assert_true(sim_perf_decode_step_s(d, 4, 4096) == before);
    sim_perf_destroy(d);
}

static void test_calibration_fit(void **state)
{
    (void)state;
    sim_perf_t *d = make("b200", SIM_ROLE_DECODE, 0);
    char text[4096];
    size_t off = 0;
    char err[512] = "";
    double coef[3], rms;

    /* exact data: decode = 2 ms + 0.5 ms x n + 1e-8 s x sum_ctx; prefill = 1 ms + 0.1 ms x new +
     * 1e-9 x new x (cached + new / 2) */
    off += (size_t)snprintf(text + off, sizeof(text) - off,
                            "# tandem-bench-engine --calib\ntandem-calib 1\nsource test\n");
    for (int n = 1; n <= 16; n *= 2) {
        for (int ctx = 128; ctx <= 4096; ctx *= 4) {
            off += (size_t)snprintf(text + off, sizeof(text) - off, "decode %d %d %.12g\n", n, ctx,
                                    2e-3 + 0.5e-3 * n + 1e-8 * n * ctx);
        }
    }
    for (int c = 0; c <= 4096; c += 2048) {
        for (int nw = 64; nw <= 1024; nw *= 4) {
            off += (size_t)snprintf(text + off, sizeof(text) - off, "prefill %d %d %.12g\n", c, nw,
                                    1e-3 + 1e-4 * nw + 1e-9 * nw * (c + nw / 2.0));
        }
    }
    assert_int_equal(sim_perf_calibrate(d, scratch("fit", text), err, sizeof(err)), TDM_OK);
    assert_true(sim_perf_calibrated(d));
    assert_int_equal(sim_perf_calibration_fit(d, SIM_ROLE_DECODE, coef, &rms), TDM_OK);
    assert_true(fabs(coef[0] - 2e-3) < 1e-9 && fabs(coef[1] - 0.5e-3) < 1e-9);
    assert_true(fabs(coef[2] - 1e-8) < 1e-13 && rms < 1e-9);
    assert_true(fabs(sim_perf_decode_step_s(d, 3, 3000) - (2e-3 + 1.5e-3 + 3e-5)) < 1e-9);
    assert_int_equal(sim_perf_calibration_fit(d, SIM_ROLE_PREFILL, coef, NULL), TDM_OK);
    assert_true(fabs(coef[0] - 1e-3) < 1e-9 && fabs(coef[1] - 1e-4) < 1e-10);
    assert_true(fabs(sim_perf_prefill_s(d, 100, 1000) - (1e-3 + 1e-2 + 1e-9 * 100 * 1050)) < 1e-9);
    /* the capacity is the plan's, not the calibration's */
    assert_true(sim_perf_kv_tokens(d) > 131072);
    sim_perf_destroy(d);

    /* decode records only: prefill stays analytic; a noisy decreasing record cannot make a
     * coefficient negative */
    d = make("b200", SIM_ROLE_DECODE, 0);
    double analytic = sim_perf_prefill_s(d, 1000, 0);
    assert_int_equal(
        sim_perf_calibrate(d,
                           scratch("noisy", "tandem-calib 1\ndecode 1 128 0.010\n"
                                            "decode 2 128 0.009\ndecode 4 128 0.011\n"),
                           err, sizeof(err)),
        TDM_OK);
    assert_int_equal(sim_perf_calibration_fit(d, SIM_ROLE_DECODE, coef, &rms), TDM_OK);
    assert_true(coef[0] >= 0 && coef[1] >= 0 && coef[2] >= 0 && rms < 0.2);
    assert_int_equal(sim_perf_calibration_fit(d, SIM_ROLE_PREFILL, coef, NULL), TDM_ERR_NOT_FOUND);
    assert_true(sim_perf_prefill_s(d, 1000, 0) == analytic);
    sim_perf_destroy(d);
}

static void test_continue_cost(void **state)
{
    (void)state;
    sim_perf_t *d = make("gb300", SIM_ROLE_DECODE, 0);
    char err[512] = "";

    /* analytic: a continuing turn replays the window first, so it costs more than the plain
     * prefill of its new tokens, and exactly the prefill of new + 128 after cached - 128 */
    assert_true(sim_perf_continue_s(d, 64, 4096) > sim_perf_prefill_s(d, 64, 4096));
    assert_true(fabs(sim_perf_continue_s(d, 64, 4096) - sim_perf_prefill_s(d, 192, 3968)) < 1e-15);
    assert_true(fabs(sim_perf_continue_s(d, 64, 50) - sim_perf_prefill_s(d, 114, 0)) < 1e-15);
    assert_true(sim_perf_continue_s(d, 0, 4096) == 0.0);
    /* calibrated: continue records replace it (prefill records do not); exact data of
     * 0.2 s + 1 ms x new + 1e-7 s x new x (cached + new / 2) */
    assert_int_equal(sim_perf_calibrate(d,
                                        scratch("cont", "tandem-calib 1\n"
                                                        "continue 512 64 0.2674816\n"
                                                        "continue 512 256 0.472384\n"
                                                        "continue 2048 64 0.277312\n"
                                                        "continue 2048 256 0.5117056\n"),
                                        err, sizeof(err)),
                     TDM_OK);
    double c = sim_perf_continue_s(d, 64, 512);
    assert_true(fabs(c - 0.2674816) < 1e-6); /* 0.2 + 1e-3 new + 1e-7 new (cached + new / 2) */
    assert_true(sim_perf_continue_s(d, 256, 2048) > sim_perf_continue_s(d, 64, 2048));
    assert_int_equal(sim_perf_calibration_fit(d, SIM_ROLE_PREFILL, (double[3]){0}, NULL),
                     TDM_ERR_NOT_FOUND);
    expect_format_error(d, "contbad", "tandem-calib 1\ncontinue 512 0 0.3\n",
                        "sim-perf-contbad:2: NEW must be >= 1");
    sim_perf_destroy(d);
}

static void test_calibration_gpu_check(void **state)
{
    (void)state;
    sim_perf_t *d = make("h200", SIM_ROLE_DECODE, 0);
    char err[512] = "";
    double before = sim_perf_decode_step_s(d, 1, 128);
    /* the measured HBM rate is half the model's 0.6 x 4.8 TB/s: the bandwidth-bound step
     * nearly doubles */
    const char *log = "gpu-check: nvcc=/usr/local/cuda/bin/nvcc; gpu=NVIDIA H200, 570.1\n"
                      "gemm: ...\n"
                      "summary: cases=12 cuda=yes best_cuda_over_cpu=80.0x "
                      "cuda_vs_cpu_mismatches=0 gemm_cases=8 gemm_decode_best_GBps=1440.0 "
                      "gemm_prefill_best_TFLOPs=400.00 gemm_best_cuda_over_cpu=90.0x "
                      "gemm_cuda_vs_cpu_mismatches=0\n"
                      "==== gpu-check summary ====\ngpu-check: OK\n";
    assert_int_equal(sim_perf_calibrate(d, scratch("gpucheck", log), err, sizeof(err)), TDM_OK);
    double after = sim_perf_decode_step_s(d, 1, 128);
    assert_true(after > 1.8 * before && after < 2.05 * before);
    assert_false(sim_perf_calibrated(d)); /* rates, not step costs */
    sim_perf_destroy(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_table),
        cmocka_unit_test(test_create_sizes_and_errors),
        cmocka_unit_test(test_tokens_per_step),
        cmocka_unit_test(test_costs_monotone),
        cmocka_unit_test(test_batch1_bandwidth_bound),
        cmocka_unit_test(test_fp4_fp8_paths),
        cmocka_unit_test(test_transfer_and_power),
        cmocka_unit_test(test_calibration_errors),
        cmocka_unit_test(test_calibration_fit),
        cmocka_unit_test(test_continue_cost),
        cmocka_unit_test(test_calibration_gpu_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
