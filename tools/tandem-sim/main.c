/* tandem-sim - discrete-event simulator of agents on racks of GPUs running the router's own
 * placement and session code (sim/sim.h, docs/SIM.md). Sweeps concurrency levels and writes the
 * curve (aggregate output tok/s per MW against per-agent output tok/s) as JSON and PNG. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sim/perf.h"
#include "sim/report.h"
#include "sim/sim.h"
#include "sim/workload.h"

#ifndef TANDEM_SIM_TRACE_DIR
#define TANDEM_SIM_TRACE_DIR "bench/traces"
#endif
#ifndef TANDEM_SIM_SHARED_DIR
#define TANDEM_SIM_SHARED_DIR "../shared/data"
#endif

#define MAX_LEVELS 32

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: tandem-sim [options]\n"
        "Simulate N concurrent coding agents on racks of GPUs serving the full-size model,\n"
        "through the router's placement and session code; write the curve of aggregate\n"
        "output tokens/s per MW against per-agent output tokens/s (docs/SIM.md).\n\n"
        "  --gpu KIND            %s (default gb300)\n"
        "  --racks N             NVLink domains, 1..%d (default 1)\n"
        "  --gpus-per-rack N     GPUs per domain (default: the kind's, 72 NVL72 / 8 HGX)\n"
        "  --agents LIST         concurrent agents, one level or a comma list to sweep\n"
        "                        (default 100,300,1000,3000)\n"
        "  --hours H             simulated hours per level (default 0.25)\n"
        "  --seconds S           simulated seconds per level (instead of --hours)\n"
        "  --warmup S            seconds left out of the rates (default 10%% of the run, <= 300)\n"
        "  --trace PATH|default|synthetic\n"
        "                        workload: a Mooncake JSONL or SWE-agent .traj file/folder,\n"
        "                        the bundled mix (default: ../shared/data when present, else\n"
        "                        bench/traces), or synthetic sessions\n"
        "  --acceptance A        DSpark mean accepted draft tokens per step (default: perf's)\n"
        "  --group-gpus N        GPUs per instance (default: smallest that fits the model)\n"
        "  --prefill-per-rack N  prefill instances per rack (default: chosen from the trace)\n"
        "  --max-batch N         decode sequences per step (default: perf's)\n"
        "  --calibration FILE    measured step costs (sim_perf_calibrate, docs/SIM.md)\n"
        "  --seed N              agent start times and session order (default 1)\n"
        "  --label TEXT          curve label (default: GPU and racks)\n"
        "  --out DIR             write DIR/sim.json and DIR/curve.png (default: print only)\n"
        "  --quiet               no progress lines\n"
        "  --help                this text\n",
        sim_gpu_names(), SIM_MAX_RACKS);
}

static int parse_u32(const char *text, uint32_t *out)
{
    char *end;
    unsigned long v;

    errno = 0;
    v = strtoul(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v > 0xFFFFFFFFul) {
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

static int parse_double(const char *text, double *out)
{
    char *end;

    errno = 0;
    *out = strtod(text, &end);
    return errno != 0 || end == text || *end != '\0' ? -1 : 0;
}

static int parse_levels(const char *text, uint32_t *levels, size_t *n_out)
{
    char buf[512], *save = NULL, *tok;
    size_t n = 0;

    snprintf(buf, sizeof(buf), "%s", text);
    for (tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        if (n == MAX_LEVELS || parse_u32(tok, &levels[n]) != 0 || levels[n] == 0) {
            return -1;
        }
        n++;
    }
    *n_out = n;
    return n > 0 ? 0 : -1;
}

typedef struct {
    const char *label;
    uint32_t agents;
    int quiet;
    int tty; /* stderr is a terminal: one line rewritten, else a line per 10 % */
    int last_pct;
    struct timespec t0;
} progress_t;

static void on_progress(void *ctx, double t_s, double duration_s, uint64_t events)
{
    progress_t *p = ctx;
    struct timespec now;
    int pct = (int)(100.0 * t_s / duration_s + 0.5);

    if (p->quiet || (!p->tty && pct % 10 != 0) || pct == p->last_pct) {
        return;
    }
    p->last_pct = pct;
    clock_gettime(CLOCK_MONOTONIC, &now);
    fprintf(stderr,
            "%s[tandem-sim] %s, %u agents: %3d%% of %.0f s simulated, %llu events, "
            "%.1f s wall%s",
            p->tty ? "\r" : "", p->label, p->agents, pct, duration_s, (unsigned long long)events,
            (double)(now.tv_sec - p->t0.tv_sec) + (double)(now.tv_nsec - p->t0.tv_nsec) / 1e9,
            p->tty ? "   " : "\n");
    fflush(stderr);
}

int main(int argc, char **argv)
{
    static const struct option options[] = {
        {"gpu", required_argument, NULL, 'g'},
        {"racks", required_argument, NULL, 'r'},
        {"gpus-per-rack", required_argument, NULL, 'G'},
        {"agents", required_argument, NULL, 'a'},
        {"hours", required_argument, NULL, 'H'},
        {"seconds", required_argument, NULL, 'S'},
        {"warmup", required_argument, NULL, 'w'},
        {"trace", required_argument, NULL, 't'},
        {"acceptance", required_argument, NULL, 'A'},
        {"group-gpus", required_argument, NULL, 'n'},
        {"prefill-per-rack", required_argument, NULL, 'p'},
        {"max-batch", required_argument, NULL, 'b'},
        {"calibration", required_argument, NULL, 'c'},
        {"seed", required_argument, NULL, 's'},
        {"label", required_argument, NULL, 'l'},
        {"out", required_argument, NULL, 'o'},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    sim_config_t cfg;
    sim_workload_opts_t wopts;
    sim_workload_t *wl = NULL;
    sim_result_t results[MAX_LEVELS];
    uint32_t levels[MAX_LEVELS] = {100, 300, 1000, 3000};
    size_t n_levels = 4;
    const char *gpu = "gb300", *trace = "default", *out_dir = NULL, *label = NULL;
    double duration_s = 900.0, warmup_s = -1.0, acceptance = -1.0;
    char err[512] = "", label_buf[128], path[1100];
    sim_batch1_t batch1[5];
    const char *kinds[5] = {"h200", "b200", "b300", "gb200", "gb300"};
    size_t n_batch1 = 0;
    progress_t prog;
    sim_curve_t curve;
    tdm_status_t status;
    int opt, quiet = 0, index = 0;

    sim_config_default(&cfg);
    sim_workload_opts_default(&wopts);
    while ((opt = getopt_long(argc, argv, "", options, &index)) != -1) {
        int bad = 0;
        double hours;

        switch (opt) {
        case 'g':
            gpu = optarg;
            break;
        case 'r':
            bad = parse_u32(optarg, &cfg.racks);
            break;
        case 'G':
            bad = parse_u32(optarg, &cfg.gpus_per_rack);
            break;
        case 'a':
            bad = parse_levels(optarg, levels, &n_levels);
            break;
        case 'H':
            bad = parse_double(optarg, &hours) != 0 || !(hours > 0.0);
            duration_s = hours * 3600.0;
            break;
        case 'S':
            bad = parse_double(optarg, &duration_s) != 0 || !(duration_s > 0.0);
            break;
        case 'w':
            bad = parse_double(optarg, &warmup_s) != 0 || warmup_s < 0.0;
            break;
        case 't':
            trace = optarg;
            break;
        case 'A':
            bad = parse_double(optarg, &acceptance) != 0 || acceptance < 0.0;
            break;
        case 'n':
            bad = parse_u32(optarg, &cfg.perf.group_gpus);
            break;
        case 'p':
            bad = parse_u32(optarg, &cfg.prefill_per_rack);
            break;
        case 'b':
            bad = parse_u32(optarg, &cfg.perf.max_batch_seqs) != 0 || cfg.perf.max_batch_seqs == 0;
            break;
        case 'c':
            cfg.calibration = optarg;
            break;
        case 's': {
            uint32_t seed;
            bad = parse_u32(optarg, &seed);
            cfg.seed = seed;
            break;
        }
        case 'l':
            label = optarg;
            break;
        case 'o':
            out_dir = optarg;
            break;
        case 'q':
            quiet = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "tandem-sim: bad value for --%s: '%s'\n", options[index].name,
                    optarg != NULL ? optarg : "");
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "tandem-sim: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    cfg.perf.gpu = sim_gpu_find(gpu);
    if (cfg.perf.gpu == NULL) {
        fprintf(stderr, "tandem-sim: unknown --gpu '%s' (%s)\n", gpu, sim_gpu_names());
        return 2;
    }
    if (acceptance >= 0.0) {
        cfg.perf.dspark_acceptance = acceptance;
    }
    cfg.duration_s = duration_s;
    cfg.warmup_s =
        warmup_s >= 0.0 ? warmup_s : (duration_s / 10.0 < 300.0 ? duration_s / 10.0 : 300.0);
    cfg.ramp_s = cfg.warmup_s / 2.0;

    if (strcmp(trace, "synthetic") == 0) {
        status = sim_workload_synthetic(cfg.seed, 256, &wopts, &wl);
    } else if (strcmp(trace, "default") == 0) {
        status = sim_workload_default(TANDEM_SIM_TRACE_DIR, TANDEM_SIM_SHARED_DIR, &wopts, &wl, err,
                                      sizeof(err));
    } else {
        status = sim_workload_load(trace, &wopts, &wl, err, sizeof(err));
    }
    if (status != TDM_OK) {
        fprintf(stderr, "tandem-sim: workload: %s (%s)\n", err, tdm_status_name(status));
        return 1;
    }
    fprintf(stderr, "[tandem-sim] workload %s\n", wl->source);

    if (label == NULL) {
        snprintf(label_buf, sizeof(label_buf), "%s x %u rack%s", cfg.perf.gpu->description,
                 cfg.racks, cfg.racks > 1 ? "s" : "");
        label = label_buf;
    }
    prog.label = label;
    prog.quiet = quiet;
    prog.tty = isatty(2);
    cfg.progress = on_progress;
    cfg.progress_ctx = &prog;
    printf("%-8s %5s %8s %6s %10s %10s %12s %9s %9s %8s %8s %7s %8s\n", "gpu", "racks", "agents",
           "P:D", "out_tok/s", "power_kW", "tok/s/MW", "agent_t/s", "e2e_t/s", "ttft50", "ttft99",
           "batch", "wall_s");
    for (size_t l = 0; l < n_levels; l++) {
        sim_result_t *r = &results[l];

        cfg.agents = levels[l];
        prog.agents = levels[l];
        prog.last_pct = -1;
        clock_gettime(CLOCK_MONOTONIC, &prog.t0);
        status = sim_run(&cfg, wl, r, err, sizeof(err));
        if (!quiet && prog.tty) {
            fprintf(stderr, "\n");
        }
        if (status != TDM_OK) {
            fprintf(stderr, "tandem-sim: %s (%s)\n", err, tdm_status_name(status));
            sim_workload_destroy(wl);
            return 1;
        }
        printf("%-8s %5u %8u %3u:%-3u %10.0f %10.1f %12.0f %9.1f %9.1f %8.2f %8.2f %7.1f "
               "%8.1f\n",
               r->gpu, r->racks, r->agents, r->prefill_per_rack, r->decode_per_rack,
               r->output_tok_s, r->power_w / 1e3, r->tok_s_per_mw, r->agent_tok_s,
               r->agent_e2e_tok_s, r->ttft_p50_s, r->ttft_p99_s, r->decode_batch_mean, r->wall_s);
        fflush(stdout);
    }
    for (size_t k = 0; k < 5; k++) {
        sim_perf_params_t params = cfg.perf;

        params.gpu = sim_gpu_find(kinds[k]);
        params.group_gpus = 0;
        batch1[n_batch1].gpu = kinds[k];
        batch1[n_batch1].context = 32768;
        batch1[n_batch1].tok_s = sim_batch1_tok_s(&params, 32768, err, sizeof(err));
        printf("batch-1 single agent, %s: %.1f tok/s (32k context)\n", kinds[k],
               batch1[n_batch1].tok_s);
        n_batch1++;
    }
    curve.label = label;
    curve.points = results;
    curve.n_points = n_levels;
    if (out_dir != NULL) {
        if (mkdir(out_dir, 0755) != 0 && errno != EEXIST) {
            fprintf(stderr, "tandem-sim: cannot create %s\n", out_dir);
            sim_workload_destroy(wl);
            return 1;
        }
        snprintf(path, sizeof(path), "%s/sim.json", out_dir);
        status = sim_report_json(path, wl->source, &curve, 1, batch1, n_batch1, err, sizeof(err));
        if (status == TDM_OK) {
            printf("wrote %s\n", path);
            snprintf(path, sizeof(path), "%s/curve.png", out_dir);
            status = sim_report_plot(path, label, &curve, 1, err, sizeof(err));
            if (status == TDM_OK) {
                printf("wrote %s\n", path);
            } else if (status == TDM_ERR_UNSUPPORTED) {
                fprintf(stderr, "tandem-sim: %s\n", err);
                status = TDM_OK;
            }
        }
        if (status != TDM_OK) {
            fprintf(stderr, "tandem-sim: %s (%s)\n", err, tdm_status_name(status));
            sim_workload_destroy(wl);
            return 1;
        }
    }
    sim_workload_destroy(wl);
    return 0;
}
