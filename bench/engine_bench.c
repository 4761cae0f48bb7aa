/* engine_bench.c - tandem-bench-engine: forward-pass throughput of a checkpoint (the small
 * preset is the 2-core benchmark model, MODEL.md 9): CED prefill tok/s of one prompt and decode
 * tok/s at several batch sizes, each printed beside a roofline measured in the same run
 * (decode: bytes one step reads / the higher of the memcpy rate and the read bandwidth of as
 * many reader threads as --threads, and the FMA peak times the threads over the step's GEMM
 * FLOPs plus the attention's multiply-adds the forward pass counts, engine_fwd_attn_flops; the
 * GEMM-only figure printed too; prefill: GEMM FLOPs per token / the kernel GEMM's FLOP rate).
 * Results go into docs/BENCHMARKS.md. With --device cuda the rooflines are the driver's HBM and
 * dense BF16 tensor peaks (kern_device_info) and each decode step brings back greedy token ids only
 * (engine_fwd_decode_greedy), as a GPU server's would.
 *
 * --calib FILE measures per-step costs instead and writes them in tandem-sim's calibration
 * format (docs/SIM.md "Calibration"; read by sim_perf_calibrate): CED prefill seconds for
 * several new-token counts after several cached lengths, and decode seconds per step for
 * several batch sizes and contexts (each the median of --repeat runs of --steps steps).
 */
#include "common/clock.h"
#include "common/flags.h"
#include "common/startup.h"
#include "common/status.h"
#include "kernels/cpu_isa.h"
#include "kernels/device.h"
#include "kernels/ops.h"
#include "engine/forward.h"
#include "engine/inventory.h"
#include "engine_bench_ep.h"
#include "bench_ids.h"
#include "engine/seq_state.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BENCH_MAX_BATCHES  8
#define BENCH_MEMCPY_BYTES (256u << 20)
#define BENCH_GEMM_DIM     512

typedef struct {
    const char *model_dir;
    uint32_t n_threads;
    const char *device;
    const char *devices;
    uint32_t prompt_tokens;
    uint32_t context_tokens;
    uint32_t decode_steps;
    const char *batches;
    int decode_only;
    uint32_t repeat;
    int expand_bf16;
    int map_weights;
    const char *calib_path;
    const char *log_level;
} bench_cfg_t;

static const tdm_flag_t bench_flags[] = {
    {"model", TDM_FLAG_PATH, NULL, offsetof(bench_cfg_t, model_dir), "checkpoint directory", 0, 0,
     1},
    {"threads", TDM_FLAG_U32, "2", offsetof(bench_cfg_t, n_threads), "kernel threads", 1, 256, 0},
    {"device", TDM_FLAG_STRING, "cpu", offsetof(bench_cfg_t, device),
     "where the kernels, weights and KV pages live: cpu, cuda or cuda:N (guard: the checking "
     "backend of kernels/guard.h; kernels/device.h)",
     0, 0, 0},
    {"devices", TDM_FLAG_STRING, NULL, offsetof(bench_cfg_t, devices),
     "expert parallel: decode on a group over these devices (0,1 or cpu,cpu; engine/ep.h) "
     "against the whole model on the first, same run (bench/engine_bench_ep.h); replaces --device",
     0, 0, 0},
    {"prompt", TDM_FLAG_U32, "512", offsetof(bench_cfg_t, prompt_tokens), "prefill prompt tokens",
     1, 65536, 0},
    {"context", TDM_FLAG_U32, "128", offsetof(bench_cfg_t, context_tokens),
     "tokens prefilled per sequence before decoding", 1, 65536, 0},
    {"steps", TDM_FLAG_U32, "16", offsetof(bench_cfg_t, decode_steps), "decode steps per batch", 1,
     100000, 0},
    {"batches", TDM_FLAG_STRING, "1,4,8,16", offsetof(bench_cfg_t, batches),
     "comma-separated decode batch sizes", 0, 0, 0},
    {"repeat", TDM_FLAG_U32, "1", offsetof(bench_cfg_t, repeat),
     "prefill runs, and decode runs of --steps per batch each after a memcpy measurement; the "
     "fastest run and the highest memcpy rate are printed (a shared box's load varies)",
     1, 1000, 0},
    {"decode-only", TDM_FLAG_BOOL, "false", offsetof(bench_cfg_t, decode_only),
     "skip the prefill measurement (profiling the decode loop)", 0, 0, 0},
    {"expand-bf16", TDM_FLAG_BOOL, "false", offsetof(bench_cfg_t, expand_bf16),
     "load FP8/MXFP4 weights expanded to BF16 (the reference layout, 2 B/param) instead of as "
     "stored: the baseline of the resident formats",
     0, 0, 0},
    {"map-weights", TDM_FLAG_BOOL, "false", offsetof(bench_cfg_t, map_weights),
     "CPU: leave the weights in the mapped checkpoint files (4 KiB pages) instead of copying "
     "them into 2 MiB pages (engine_model_params_t.map_weights): that copy's baseline",
     0, 0, 0},
    {"calib", TDM_FLAG_PATH, NULL, offsetof(bench_cfg_t, calib_path),
     "measure per-step costs (prefill vs cached length, decode vs batch and context) and write "
     "them to this file in tandem-sim's calibration format (docs/SIM.md), then exit",
     0, 0, 0},
    {"log-level", TDM_FLAG_STRING, "info", offsetof(bench_cfg_t, log_level),
     "trace, debug, info, warn, error or off (debug: the model load's steps and times)", 0, 0, 0},
};
#define N_BENCH_FLAGS (sizeof(bench_flags) / sizeof(bench_flags[0]))

/* Process CPU seconds (all threads). */
/* Copies the engine asks of its kernel table, by kind (kernels/mem.h), counted by a copy of the
 * table whose mem_copy counts before it calls the real one: on a device each KERN_COPY_D2H is a
 * wait for the stream and each KERN_COPY_H2D a host staging copy, so their count per decode
 * step is what a GPU pays in round trips whatever its speed (one thread: plain counters). */
static kern_mem_copy_fn *real_mem_copy;
static uint64_t n_copies[3];

static tdm_status_t counting_mem_copy(kern_ctx_t *ctx, void *dst, const void *src, size_t n_bytes,
                                      kern_copy_kind_t kind)
{
    if ((unsigned)kind < 3) {
        n_copies[kind]++;
    }
    return real_mem_copy(ctx, dst, src, n_bytes, kind);
}

static double cpu_seconds(void)
{
    return (double)tdm_clock_process_cpu_ns() / (double)TDM_NS_PER_S;
}

/* memcpy bandwidth, bytes/s (read + write counted as the bytes copied, i.e. read bandwidth). */
static double memcpy_rate(void)
{
    char *a = malloc(BENCH_MEMCPY_BYTES);
    char *b = malloc(BENCH_MEMCPY_BYTES);
    double best = 0;
    memset(a, 1, BENCH_MEMCPY_BYTES);
    memset(b, 2, BENCH_MEMCPY_BYTES);
    for (int rep = 0; rep < 5; rep++) {
        uint64_t t0 = tdm_clock_now_ns();
        memcpy(b, a, BENCH_MEMCPY_BYTES);
        double s = tdm_clock_elapsed_ms(t0) / 1e3;
        if (BENCH_MEMCPY_BYTES / s > best) {
            best = BENCH_MEMCPY_BYTES / s;
        }
    }
    free(a);
    free(b);
    return best;
}

/* FLOP/s of the kernel GEMM (BF16 weights, FP32 activations) on a square problem. */
static double gemm_rate(int n_threads)
{
    int64_t n = BENCH_GEMM_DIM;
    uint16_t *w = calloc((size_t)(n * n), 2);
    float *x = calloc((size_t)(n * n), 4);
    float *y = calloc((size_t)(n * n), 4);
    kern_mat_t m = {KERN_MAT_BF16, n, n, w, NULL, NULL};
    kern_ctx_t ctx = {.n_threads = n_threads};
    double best = 0;
    if (n_threads > 1 && kern_pool_create(n_threads, &ctx.pool) != TDM_OK) {
        ctx.n_threads = 1; /* the caller alone (logged by kern_pool_create) */
    }
    for (int64_t i = 0; i < n * n; i++) {
        w[i] = 0x3f80;
        x[i] = 0.5f;
    }
    for (int rep = 0; rep < 3; rep++) {
        uint64_t t0 = tdm_clock_now_ns();
        kern_gemm_cpu(&ctx, &m, x, n, n, 0, y, n);
        double s = tdm_clock_elapsed_ms(t0) / 1e3;
        if (2.0 * n * n * n / s > best) {
            best = 2.0 * n * n * n / s;
        }
    }
    kern_pool_destroy(ctx.pool);
    free(w);
    free(x);
    free(y);
    return best;
}

/* Calibration points (docs/SIM.md "Calibration"): cached x new for prefill, batch x context for
 * decode. Small enough for a 2-core box in about a minute on the small preset. */
static const int64_t calib_prefill_cached[] = {0, 512, 2048};
static const int64_t calib_prefill_new[] = {64, 256, 1024};
static const int calib_decode_batch[] = {1, 2, 4, 8};
static const int64_t calib_decode_ctx[] = {128, 1024};
/* Tokens of the reply a continuing turn's prompt does not repeat (rewound away). */
#define CALIB_OUTPUT_TOKENS 16

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of runs[0..n) (n > 0; sorts runs in place). */
static double calib_median(double *runs, uint32_t n)
{
    qsort(runs, n, sizeof(double), cmp_double);
    return runs[n / 2];
}

/* One prefill-kind record ("prefill" or "continue") of the calibration file, echoed. */
static void calib_prefill_record(FILE *out, const char *kind, int64_t cached, int64_t fresh,
                                 double seconds)
{
    fprintf(out, "%s %lld %lld %.6f\n", kind, (long long)cached, (long long)fresh, seconds);
    printf("calib: %s cached %lld new %lld: %.4f s\n", kind, (long long)cached, (long long)fresh,
           seconds);
}

/* Measure and write the calibration file; 0 on success. */
static int run_calib(const bench_cfg_t *cfg, engine_model_t *model, engine_kv_pool_t *pool,
                     engine_fwd_t *fwd)
{
    const engine_config_t *c = engine_model_config(model);
    int64_t V = c->vocab_size;
    FILE *out = fopen(cfg->calib_path, "w");
    int32_t *ids = malloc(sizeof(int32_t) * 8192);
    float *lg = malloc(sizeof(float) * (size_t)(ENGINE_FWD_MAX_BATCH * V));
    double runs[64];
    uint32_t n_runs = cfg->repeat < 64 ? cfg->repeat : 64;
    int rc = 0;
    double cpu_total = 0, wall_total = 0; /* over the timed sections: the CPU share we got */

    if (out == NULL || ids == NULL || lg == NULL) {
        fprintf(stderr, "tandem-bench-engine: --calib %s: cannot open or out of memory\n",
                cfg->calib_path);
        free(ids);
        free(lg);
        if (out != NULL) {
            fclose(out);
        }
        return 1;
    }
    fprintf(out, "# tandem-bench-engine --calib: measured per-step costs (docs/SIM.md)\n");
    fprintf(out, "tandem-calib 1\nsource tandem-bench-engine\nmodel %s\nthreads %u\n",
            cfg->model_dir, cfg->n_threads);
    fprintf(out, "cpu %s\n", kern_cpu_isa_name(kern_cpu_isa()));
    fprintf(out, "# prefill CACHED_TOKENS NEW_TOKENS SECONDS (CED, one sequence; median of %u)\n",
            n_runs);
    for (size_t ci = 0; ci < sizeof(calib_prefill_cached) / sizeof(calib_prefill_cached[0]); ci++) {
        for (size_t ni = 0; ni < sizeof(calib_prefill_new) / sizeof(calib_prefill_new[0]); ni++) {
            int64_t C = calib_prefill_cached[ci], N = calib_prefill_new[ni];
            for (uint32_t r = 0; r < n_runs && rc == 0; r++) {
                engine_seq_t *seq = NULL;
                bench_seeded_ids(100 + r, V, ids, C + N);
                if (engine_seq_create(model, pool, &seq) != TDM_OK ||
                    (C > 0 && engine_fwd_prefill(fwd, seq, ids, C, 0, NULL, NULL) != TDM_OK)) {
                    rc = 1;
                }
                uint64_t t0 = tdm_clock_now_ns();
                double c0 = cpu_seconds();
                if (rc == 0 && engine_fwd_prefill(fwd, seq, ids + C, N, 0, lg, NULL) != TDM_OK) {
                    rc = 1;
                }
                runs[r] = tdm_clock_elapsed_ms(t0) / 1e3;
                cpu_total += cpu_seconds() - c0;
                wall_total += runs[r];
                engine_seq_destroy(seq);
            }
            if (rc != 0) {
                break;
            }
            calib_prefill_record(out, "prefill", C, N, calib_median(runs, n_runs));
        }
    }
    fprintf(out,
            "# continue CACHED NEW SECONDS (a continuing turn: rewind to CACHED, recovery "
            "replay of the window, prefill NEW; median of %u)\n",
            n_runs);
    for (size_t ci = 1;
         ci < sizeof(calib_prefill_cached) / sizeof(calib_prefill_cached[0]) && rc == 0; ci++) {
        for (size_t ni = 0; ni < 2 && rc == 0; ni++) {
            int64_t C = calib_prefill_cached[ci], N = calib_prefill_new[ni];
            for (uint32_t r = 0; r < n_runs && rc == 0; r++) {
                engine_seq_t *seq = NULL;
                bench_seeded_ids(200 + r, V, ids, C + N + CALIB_OUTPUT_TOKENS);
                /* the session as the decode node holds it: prompt C plus a reply the next
                 * prompt does not repeat */
                if (engine_seq_create(model, pool, &seq) != TDM_OK ||
                    engine_fwd_prefill(fwd, seq, ids, C + CALIB_OUTPUT_TOKENS, 0, NULL, NULL) !=
                        TDM_OK) {
                    rc = 1;
                }
                uint64_t t0 = tdm_clock_now_ns();
                double c0 = cpu_seconds();
                if (rc == 0 && engine_seq_truncate(seq, C) != TDM_OK) {
                    rc = 1;
                }
                if (rc == 0) {
                    engine_seq_reset_rings(seq);
                    if (engine_fwd_replay(fwd, seq, ids, C, ENGINE_REPLAY_RECOVERY, NULL) !=
                            TDM_OK ||
                        engine_fwd_prefill(fwd, seq, ids + C, N, 0, lg, NULL) != TDM_OK) {
                        rc = 1;
                    }
                }
                runs[r] = tdm_clock_elapsed_ms(t0) / 1e3;
                cpu_total += cpu_seconds() - c0;
                wall_total += runs[r];
                engine_seq_destroy(seq);
            }
            if (rc != 0) {
                break;
            }
            calib_prefill_record(out, "continue", C, N, calib_median(runs, n_runs));
        }
    }
    fprintf(out,
            "# decode N_SEQS CONTEXT_PER_SEQ SECONDS_PER_STEP (plain decode; median of %u "
            "runs of %u steps)\n",
            n_runs, cfg->decode_steps);
    for (size_t bi = 0; bi < sizeof(calib_decode_batch) / sizeof(calib_decode_batch[0]) && rc == 0;
         bi++) {
        for (size_t xi = 0; xi < sizeof(calib_decode_ctx) / sizeof(calib_decode_ctx[0]) && rc == 0;
             xi++) {
            int B = calib_decode_batch[bi];
            int64_t ctx = calib_decode_ctx[xi];
            engine_seq_t *seqs[ENGINE_FWD_MAX_BATCH];
            int32_t toks[ENGINE_FWD_MAX_BATCH];
            int made = 0;
            for (int i = 0; i < B && rc == 0; i++) {
                bench_seeded_ids(10 + (uint64_t)i, V, ids, ctx);
                if (engine_seq_create(model, pool, &seqs[i]) != TDM_OK) {
                    rc = 1;
                    break;
                }
                made++;
                if (engine_fwd_prefill(fwd, seqs[i], ids, ctx, 0, NULL, NULL) != TDM_OK) {
                    rc = 1;
                }
                toks[i] = ids[ctx - 1];
            }
            for (uint32_t r = 0; r < n_runs && rc == 0; r++) {
                uint64_t t0 = tdm_clock_now_ns();
                double c0 = cpu_seconds();
                for (uint32_t step = 0; step < cfg->decode_steps && rc == 0; step++) {
                    if (engine_fwd_decode(fwd, seqs, toks, B, lg) != TDM_OK) {
                        rc = 1;
                    }
                    for (int i = 0; i < B; i++) {
                        toks[i] = (int32_t)((toks[i] * 7 + 13) % V);
                    }
                }
                double wall = tdm_clock_elapsed_ms(t0) / 1e3;
                cpu_total += cpu_seconds() - c0;
                wall_total += wall;
                runs[r] = wall / cfg->decode_steps;
            }
            for (int i = 0; i < made; i++) {
                engine_seq_destroy(seqs[i]);
            }
            if (rc != 0) {
                break;
            }
            double step_s = calib_median(runs, n_runs);
            /* the context in the middle of the measured steps */
            fprintf(out, "decode %d %lld %.6f\n", B,
                    (long long)(ctx + (int64_t)cfg->decode_steps * n_runs / 2), step_s);
            printf("calib: decode batch %d context %lld: %.2f ms/step\n", B, (long long)ctx,
                   step_s * 1e3);
        }
    }
    /* process CPU seconds per wall second of the timed sections: below 1 (one thread) when the
     * box is shared; a comment for the parser, read by bench/sim-calib/run */
    double share = wall_total > 0 ? cpu_total / wall_total : 0;
    fprintf(out, "# cpu_share %.4f (process CPU seconds / wall seconds while timed)\n", share);
    printf("calib: cpu share %.3f\n", share);
    if (fclose(out) != 0) {
        rc = 1;
    }
    free(ids);
    free(lg);
    if (rc != 0) {
        fprintf(stderr, "tandem-bench-engine: --calib: a forward pass failed\n");
    }
    return rc;
}

int main(int argc, char **argv)
{
    bench_cfg_t cfg;
    tdm_flags_action_t action;
    engine_model_params_t mp;
    engine_model_t *model = NULL;
    engine_kv_pool_t *pool = NULL;
    engine_fwd_t *fwd = NULL;
    engine_fwd_params_t fp;
    engine_tensor_spec_t *specs = NULL;
    size_t n_specs = 0;
    engine_param_counts_t counts;
    char err[512];
    int batches[BENCH_MAX_BATCHES];
    int n_batches = 0;

    memset(&cfg, 0, sizeof(cfg));
    {
        const tdm_main_spec_t spec = {"tandem-bench-engine",
                                      "Forward-pass throughput (prefill and batched decode) on the "
                                      "CPU or a GPU, with rooflines.",
                                      bench_flags, N_BENCH_FLAGS, offsetof(bench_cfg_t, log_level)};
        if (tdm_main_start(&spec, argc, argv, &cfg, &action) != TDM_OK) {
            return 2;
        }
    }
    if (action == TDM_FLAGS_HELP) {
        return 0;
    }
    for (const char *p = cfg.batches; *p != '\0' && n_batches < BENCH_MAX_BATCHES;) {
        int v = atoi(p);
        if (v < 1 || v > ENGINE_FWD_MAX_BATCH) {
            fprintf(stderr, "tandem-bench-engine: --batches: %d not in 1..%d\n", v,
                    ENGINE_FWD_MAX_BATCH);
            return 2;
        }
        batches[n_batches++] = v;
        while (*p != '\0' && *p != ',') {
            p++;
        }
        if (*p == ',') {
            p++;
        }
    }
    if (cfg.devices != NULL) {
        bench_ep_cfg_t ec = {cfg.model_dir,      cfg.devices,           (int)cfg.n_threads,
                             cfg.context_tokens, (int)cfg.decode_steps, batches,
                             n_batches,          (int)cfg.repeat};
        if (strcmp(cfg.device, "cpu") != 0 || cfg.calib_path != NULL || cfg.expand_bf16) {
            fprintf(stderr, "tandem-bench-engine: --devices runs alone: not with --device, "
                            "--calib or --expand-bf16\n");
            return 2;
        }
        return bench_ep_run(&ec);
    }
    engine_model_params_default(&mp);
    mp.n_threads = (int)cfg.n_threads;
    if (kern_device_open(cfg.device, NULL, &mp.ops, err, sizeof(err)) != TDM_OK) {
        fprintf(stderr, "tandem-bench-engine: --device: %s\n", err);
        return 2;
    }
    if (strcmp(mp.ops->name, "guard") == 0) {
        /* two mprotect calls per op: its times say nothing about a device */
        fprintf(stderr,
                "tandem-bench-engine: --device guard: a checking backend (kernels/guard.h), "
                "not benchmarked: use cpu or cuda\n");
        return 2;
    }
    mp.expand_bf16 = cfg.expand_bf16;
    mp.map_weights = cfg.map_weights;
    static kern_ops_t counted; /* outlives the model loaded with it */
    counted = *mp.ops;
    real_mem_copy = mp.ops->mem_copy;
    counted.mem_copy = counting_mem_copy;
    mp.ops = &counted;
    if (engine_model_load(cfg.model_dir, &mp, &model, err, sizeof(err)) != TDM_OK) {
        fprintf(stderr, "tandem-bench-engine: %s\n", err);
        return 1;
    }
    const engine_config_t *c = engine_model_config(model);
    int64_t V = c->vocab_size;
    engine_inventory_build(c, &specs, &n_specs);
    engine_inventory_count(c, specs, n_specs, &counts);
    free(specs);
    if (engine_kv_pool_create_ops(c, engine_model_fingerprint(model), 4096, engine_model_ops(model),
                                  &pool) != TDM_OK) {
        fprintf(stderr, "tandem-bench-engine: no memory for a 4096-page KV pool\n");
        engine_model_destroy(model);
        return 1;
    }
    engine_fwd_params_default(model, &fp);
    if (engine_fwd_create(model, pool, &fp, &fwd) != TDM_OK) {
        fprintf(stderr, "tandem-bench-engine: cannot create the forward context\n");
        engine_kv_pool_destroy(pool);
        engine_model_destroy(model);
        return 1;
    }
    if (cfg.calib_path != NULL) {
        int rc = run_calib(&cfg, model, pool, fwd);
        engine_fwd_destroy(fwd);
        engine_kv_pool_destroy(pool);
        engine_model_destroy(model);
        return rc;
    }

    /* A device backend (--device cuda): its rooflines are the driver's HBM and dense BF16
     * tensor peaks (kern_device_info); the CPU probes below would measure the host instead. */
    int on_device = !mp.ops->host_memory;
    kern_device_info_t dev_info;
    double bw, rbw, flops, peak;
    /* the kernel threads a pool can hold: the read roofline's readers (kern_read_bandwidth_cpu)
     * and the kernel GEMM's threads */
    int rd_threads =
        cfg.n_threads > KERN_POOL_MAX_THREADS ? KERN_POOL_MAX_THREADS : (int)cfg.n_threads;
    engine_model_resident_t res;
    engine_model_resident(model, &res);
    printf("model %s: layers %d, H %lld, V %lld, active decode params %.1f M, threads %u\n",
           cfg.model_dir, c->n_layers, (long long)c->hidden_size, (long long)V,
           counts.active_decode_params / 1e6, cfg.n_threads);
    if (on_device) {
        kern_device_t dev;
        if (kern_device_parse(cfg.device, &dev, err, sizeof(err)) != TDM_OK ||
            kern_device_info(dev.ordinal, &dev_info, err, sizeof(err)) != TDM_OK) {
            fprintf(stderr, "tandem-bench-engine: --device: %s\n", err);
            return 1;
        }
        bw = rbw = dev_info.hbm_peak_bps;
        peak = flops = dev_info.bf16_peak_flops > 0.0 ? dev_info.bf16_peak_flops : 1.0;
        printf("device %s: %s, sm_%d%d, %d SMs at %.0f MHz, %.1f GB; HBM peak %.0f GB/s; dense "
               "BF16 tensor peak %.1f TFLOP/s%s (kern_device_info: the driver's attributes)\n",
               cfg.device, dev_info.name, dev_info.cc_major, dev_info.cc_minor, dev_info.n_sms,
               dev_info.clock_khz / 1e3, dev_info.mem_bytes / 1e9, bw / 1e9, peak / 1e12,
               dev_info.bf16_peak_flops > 0.0 ? "" : " (unknown for this part: not a roofline)");
    } else {
        bw = memcpy_rate();
        rbw = kern_read_bandwidth_cpu(BENCH_MEMCPY_BYTES, 5, rd_threads);
        flops = gemm_rate(rd_threads);
        /* the FMA peak of all kernel threads (one thread measured, times the threads) */
        peak = kern_fma_peak_cpu(100.0) * cfg.n_threads;
        printf("cpu kernels: %s; FP32 FMA peak %.1f GFLOP/s (%u thread%s); read bandwidth %.2f "
               "GB/s (%d reader%s), memcpy %.2f GB/s (the memory roofline uses the higher)\n",
               kern_cpu_isa_name(kern_cpu_isa()), peak / 1e9, cfg.n_threads,
               cfg.n_threads == 1 ? "" : "s", rbw / 1e9, rd_threads, rd_threads == 1 ? "" : "s",
               bw / 1e9);
        printf("kernel GEMM %.2f GFLOP/s (BF16 weights, %dx%dx%d) = %.0f %% of the FMA peak\n",
               flops / 1e9, BENCH_GEMM_DIM, BENCH_GEMM_DIM, BENCH_GEMM_DIM, 100.0 * flops / peak);
    }
    printf("weights resident %.1f MB = %.3f B/param (fp8 %.1f + mxfp4 %.1f + scales %.1f + bf16 "
           "%.1f + f32 %.1f + expanded %.1f + vectors %.1f + engram %.1f MB)\n",
           engine_model_resident_total(&res) / 1e6,
           (double)engine_model_resident_total(&res) / (double)res.n_params, res.fp8 / 1e6,
           res.mxfp4 / 1e6, res.scales / 1e6, res.bf16 / 1e6, res.f32 / 1e6, res.expanded / 1e6,
           res.vectors / 1e6, res.engram / 1e6);
    bw = rbw > bw ? rbw : bw;

    /* prefill: CED over one prompt; per-token FLOPs ~ 2 x active params x (c+1)/L + tail */
    if (!cfg.decode_only) {
        int64_t T = cfg.prompt_tokens;
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)T);
        float *lg = malloc(sizeof(float) * (size_t)V);
        engine_seq_t *seq = NULL;
        bench_seeded_ids(1, V, ids, T);
        tdm_status_t st = TDM_OK;
        double s = 0.0;
        /* --repeat runs, each on a fresh sequence; the fastest is printed (as for decode) */
        for (uint32_t rep = 0; rep < cfg.repeat && st == TDM_OK; rep++) {
            engine_seq_destroy(seq);
            seq = NULL;
            engine_seq_create(model, pool, &seq);
            uint64_t t0 = tdm_clock_now_ns();
            st = engine_fwd_prefill(fwd, seq, ids, T, 0, lg, NULL);
            double t = tdm_clock_elapsed_ms(t0) / 1e3;
            s = (rep == 0 || t < s) ? t : s;
        }
        int64_t tail = T < c->sliding_window ? T : c->sliding_window;
        double frac = (double)(c->ced_cut + 1) / c->n_layers;
        double fl = 2.0 * (double)counts.active_decode_params *
                    (frac * (double)T + (1.0 - frac) * (double)tail) / (double)T;
        printf("prefill %lld tokens (CED): %s %.2f s, %.1f tok/s = %.1f GFLOP/s = %.0f %% of the "
               "%s (%.3f GFLOP/token; kernel-GEMM roofline %.1f tok/s)\n",
               (long long)T, tdm_status_name(st), s, T / s, T / s * fl / 1e9,
               100.0 * (T / s) * fl / peak, on_device ? "BF16 tensor peak" : "FMA peak", fl / 1e9,
               flops / fl);
        engine_seq_destroy(seq);
        free(ids);
        free(lg);
    }
    /* decode at each batch size */
    for (int bi = 0; bi < n_batches; bi++) {
        int B = batches[bi];
        engine_seq_t *seqs[ENGINE_FWD_MAX_BATCH];
        int32_t toks[ENGINE_FWD_MAX_BATCH];
        int32_t *ids = malloc(sizeof(int32_t) * cfg.context_tokens);
        float *lg = malloc(sizeof(float) * (size_t)(B * V));
        for (int i = 0; i < B; i++) {
            bench_seeded_ids(10 + (uint64_t)i, V, ids, cfg.context_tokens);
            engine_seq_create(model, pool, &seqs[i]);
            engine_fwd_prefill(fwd, seqs[i], ids, cfg.context_tokens, 0, NULL, NULL);
            toks[i] = ids[cfg.context_tokens - 1];
        }
        uint64_t wbytes = 0, kvbytes = 0;
        double steps_per_s = 0.0;
        double cpu_steps_per_s = 0.0; /* steps per process CPU second: an uncontended box */
        double bw_b = bw;
        tdm_status_t st = TDM_OK;
        engine_fwd_reset_read_bytes(fwd);
        for (uint32_t rep = 0; rep < cfg.repeat && st == TDM_OK; rep++) {
            double bw_r = (rep == 0 && bi == 0) || on_device ? bw : memcpy_rate();
            if ((rep > 0 || bi > 0) && !on_device) {
                double r = kern_read_bandwidth_cpu(BENCH_MEMCPY_BYTES, 2, rd_threads);
                bw_r = r > bw_r ? r : bw_r;
            }
            bw_b = bw_r > bw_b ? bw_r : bw_b;
            uint64_t t0 = tdm_clock_now_ns();
            double c0 = cpu_seconds();
            memset(n_copies, 0, sizeof(n_copies));
            for (uint32_t step = 0; step < cfg.decode_steps && st == TDM_OK; step++) {
                if (on_device) {
                    /* a device step: token ids in, greedy ids out, the logits stay there */
                    st = engine_fwd_decode_greedy(fwd, seqs, toks, B, toks);
                    continue;
                }
                st = engine_fwd_decode(fwd, seqs, toks, B, lg);
                for (int i = 0; i < B; i++) {
                    toks[i] = (int32_t)((toks[i] * 7 + 13) % V);
                }
            }
            double rate = cfg.decode_steps / (tdm_clock_elapsed_ms(t0) / 1e3);
            double cpu_rate = cfg.decode_steps / (cpu_seconds() - c0);
            steps_per_s = rate > steps_per_s ? rate : steps_per_s;
            cpu_steps_per_s = cpu_rate > cpu_steps_per_s ? cpu_rate : cpu_steps_per_s;
        }
        /* bytes one step reads, as the forward pass counted them (engine_fwd_read_bytes):
         * every GEMM matrix in its compute layout (BF16 2 B, mHC's FP32 4 B; each expert a
         * batch runs), embedding and Engram rows, and the KV state (ring entries, index keys,
         * selected compressed rows) of every sequence; the roofline uses the highest memcpy
         * rate measured so far in the run (one measurement before each decode run) */
        engine_fwd_read_bytes(fwd, &wbytes, &kvbytes);
        double n_steps = (double)cfg.decode_steps * cfg.repeat;
        double wstep = (double)wbytes / n_steps;
        double kvstep = (double)kvbytes / n_steps;
        double bytes = wstep + kvstep;
        bw = bw_b;
        /* The same read rate over a buffer as large as one step's bytes: a CPU whose last-level
         * cache holds the model (hundreds of MB on recent server parts) serves every step's
         * weights from cache, faster than the 256 MiB stream above measures, so the roofline
         * takes the higher of the two (never flattering the ratio). */
        double ws_bw = on_device ? 0.0 : kern_read_bandwidth_cpu((size_t)bytes, 3, rd_threads);
        if (ws_bw > bw) {
            bw = ws_bw;
        }
        /* compute roofline: 2 FLOPs per active parameter per token (the GEMMs) plus the
         * attention's multiply-adds the forward pass counted (engine_fwd_attn_flops: q . k and
         * p . v over each row's keys, the indexer's scores) */
        double gemm_flops = 2.0 * (double)counts.active_decode_params * B;
        double attn_flops = (double)engine_fwd_attn_flops(fwd) / n_steps;
        double step_flops = gemm_flops + attn_flops;
        double mem_roof = bw / bytes;
        double fma_roof = peak / step_flops;
        int mem_binds = mem_roof <= fma_roof;
        printf("decode batch %2d: %s %.1f tok/s (%.1f steps/s); roofline %.1f steps/s (%.1f MB "
               "weights + %.2f MB KV/step, read %.2f GB/s; %.2f over a step-sized buffer) = "
               "%.0f %%; %s roofline %.1f steps/s = %.0f %%; %s binds: %.0f %%\n",
               B, tdm_status_name(st), steps_per_s * B, steps_per_s, mem_roof, wstep / 1e6,
               kvstep / 1e6, bw / 1e9, ws_bw / 1e9, 100.0 * steps_per_s / mem_roof,
               on_device ? "BF16 tensor" : "FMA", fma_roof, 100.0 * steps_per_s / fma_roof,
               mem_binds ? "memory" : "compute",
               100.0 * steps_per_s / (mem_binds ? mem_roof : fma_roof));
        printf("                 %s roofline's FLOPs per step: GEMMs %.1f M + attention %.1f M "
               "(GEMMs alone: roofline %.1f steps/s = %.0f %%)\n",
               on_device ? "BF16 tensor" : "FMA", gemm_flops / 1e6, attn_flops / 1e6,
               peak / gemm_flops, 100.0 * steps_per_s / (peak / gemm_flops));
        printf("                 CPU-time rate %.1f steps/s (steps per process CPU second, all "
               "threads: near what an uncontended box reaches when this one is shared)\n",
               cpu_steps_per_s);
        printf("                 copies per step: %.1f to the host (each a wait for the stream "
               "on a device), %.1f from the host, %.1f on the backend\n",
               (double)n_copies[KERN_COPY_D2H] / cfg.decode_steps,
               (double)n_copies[KERN_COPY_H2D] / cfg.decode_steps,
               (double)n_copies[KERN_COPY_D2D] / cfg.decode_steps);
        for (int i = 0; i < B; i++) {
            engine_seq_destroy(seqs[i]);
        }
        free(ids);
        free(lg);
    }
    engine_fwd_destroy(fwd);
    engine_kv_pool_destroy(pool);
    engine_model_destroy(model);
    return 0;
}
