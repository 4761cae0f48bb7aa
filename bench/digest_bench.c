/* digest_bench.c - tandem-bench-digest: what the weights digest (common/fingerprint.h,
 * tdm_weights_digest: every shard byte through XXH3 once) costs at start, beside a plain read of
 * the same bytes in the same run (the floor: a worker's model load reads them too), and what the
 * cached digest costs (the key check only). Checkpoint: --model, or --mib MiB of synthetic
 * shards (--shards of them, hashed in parallel) written into --dir. Prints each pass's GiB/s and its ratio to the plain read. Results go
 * into docs/BENCHMARKS.md.
 */
#include "common/clock.h"
#include "common/fingerprint.h"
#include "common/flags.h"
#include "common/log.h"
#include "common/status.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BENCH_PATH_BYTES 4096
#define BENCH_READ_BYTES (4u << 20)

typedef struct {
    const char *model_dir;
    const char *dir;
    uint32_t mib;
    uint32_t shards;
    uint32_t reps;
} bench_cfg_t;

static const tdm_flag_t bench_flags[] = {
    {"model", TDM_FLAG_PATH, NULL, offsetof(bench_cfg_t, model_dir),
     "checkpoint directory to hash; none: a synthetic shard in --dir", 0, 0, 0},
    {"dir", TDM_FLAG_STRING, "/tmp/tandem-bench-digest", offsetof(bench_cfg_t, dir),
     "where the synthetic shard is written (removed at the end)", 0, 0, 0},
    {"mib", TDM_FLAG_U32, "512", offsetof(bench_cfg_t, mib), "synthetic shard size, MiB", 1,
     1u << 20, 0},
    {"shards", TDM_FLAG_U32, "8", offsetof(bench_cfg_t, shards),
     "synthetic shards the --mib are split into (hashed in parallel)", 1, 4096, 0},
    {"reps", TDM_FLAG_U32, "3", offsetof(bench_cfg_t, reps), "passes of each kind (best kept)", 1,
     100, 0},
};
#define N_BENCH_FLAGS (sizeof(bench_flags) / sizeof(bench_flags[0]))

/* Read every *.safetensors byte of dir (the baseline); bytes read into *n_out. */
static tdm_status_t plain_read(const char *dir, uint64_t *n_out)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    unsigned char *buf = malloc(BENCH_READ_BYTES);
    uint64_t n = 0;

    if (d == NULL || buf == NULL) {
        if (d != NULL) {
            closedir(d);
        }
        free(buf);
        return TDM_ERR_IO;
    }
    while ((e = readdir(d)) != NULL) {
        char path[BENCH_PATH_BYTES];
        size_t len = strlen(e->d_name);
        int fd;
        ssize_t got;
        if (len <= 12 || strcmp(e->d_name + len - 12, ".safetensors") != 0) {
            continue;
        }
        snprintf(path, sizeof(path), "%.3000s/%s", dir, e->d_name);
        fd = open(path, O_RDONLY);
        if (fd < 0) {
            continue;
        }
        while ((got = read(fd, buf, BENCH_READ_BYTES)) > 0) {
            n += (uint64_t)got;
        }
        close(fd);
    }
    closedir(d);
    free(buf);
    *n_out = n;
    return TDM_OK;
}

static int write_synthetic(const char *dir, uint32_t mib, uint32_t shards)
{
    char path[BENCH_PATH_BYTES];
    unsigned char *buf = malloc(1u << 20);
    FILE *f;
    uint64_t x = 0x9E3779B97F4A7C15ull;

    snprintf(path, sizeof(path), "mkdir -p %.3000s", dir);
    if (buf == NULL || system(path) != 0) {
        free(buf);
        return -1;
    }
    f = NULL;
    for (uint32_t m = 0; m < mib; m++) {
        if (m % ((mib + shards - 1) / shards) == 0) {
            if (f != NULL && fclose(f) != 0) {
                free(buf);
                return -1;
            }
            snprintf(path, sizeof(path), "%.3000s/model-%05u.safetensors", dir, m);
            f = fopen(path, "wb");
            if (f == NULL) {
                free(buf);
                return -1;
            }
        }
        for (size_t i = 0; i < (1u << 20); i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            buf[i] = (unsigned char)x;
        }
        if (fwrite(buf, 1, 1u << 20, f) != (1u << 20)) {
            fclose(f);
            free(buf);
            return -1;
        }
    }
    free(buf);
    return f == NULL || fclose(f) == 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    bench_cfg_t cfg;
    tdm_flags_action_t action;
    const char *dir;
    char err[512] = "";
    double best_read = 0.0;
    double best_digest = 0.0;
    double best_cached = 0.0;
    uint64_t n_bytes = 0;
    uint64_t digest = 0;
    char command[BENCH_PATH_BYTES];

    if (tdm_flags_parse(bench_flags, N_BENCH_FLAGS, argc, argv, "tandem-bench-digest",
                        "Weights digest cost beside a plain read of the same bytes.", &cfg, NULL,
                        NULL, &action) != TDM_OK) {
        return 2;
    }
    if (action == TDM_FLAGS_HELP) {
        return 0;
    }
    tdm_log_set_level(TDM_LOG_WARN); /* no progress lines between the table rows */
    dir = cfg.model_dir;
    if (dir == NULL) {
        if (write_synthetic(cfg.dir, cfg.mib, cfg.shards) != 0) {
            fprintf(stderr, "tandem-bench-digest: cannot write %s: %s\n", cfg.dir, strerror(errno));
            return 1;
        }
        dir = cfg.dir;
    }
    for (uint32_t r = 0; r < cfg.reps; r++) {
        uint64_t t0 = tdm_clock_now_ns();
        double s;
        if (plain_read(dir, &n_bytes) != TDM_OK) {
            fprintf(stderr, "tandem-bench-digest: cannot read %s\n", dir);
            return 1;
        }
        s = (double)(tdm_clock_now_ns() - t0) / TDM_NS_PER_S;
        best_read = best_read == 0.0 || s < best_read ? s : best_read;
        t0 = tdm_clock_now_ns();
        if (tdm_weights_digest(dir, TDM_WEIGHTS_DIGEST_NO_CACHE, &digest, err, sizeof(err)) !=
            TDM_OK) {
            fprintf(stderr, "tandem-bench-digest: %s\n", err);
            return 1;
        }
        s = (double)(tdm_clock_now_ns() - t0) / TDM_NS_PER_S;
        best_digest = best_digest == 0.0 || s < best_digest ? s : best_digest;
    }
    (void)tdm_weights_digest(dir, 0, &digest, err, sizeof(err)); /* writes the cache */
    for (uint32_t r = 0; r < cfg.reps; r++) {
        uint64_t t0 = tdm_clock_now_ns();
        double s;
        (void)tdm_weights_digest(dir, 0, &digest, err, sizeof(err));
        s = (double)(tdm_clock_now_ns() - t0) / TDM_NS_PER_S;
        best_cached = best_cached == 0.0 || s < best_cached ? s : best_cached;
    }
    printf("checkpoint: %s (%.2f GiB of shards, page cache warm after the first pass)\n", dir,
           (double)n_bytes / (double)(1ull << 30));
    printf("%-26s %10s %10s %10s\n", "pass", "seconds", "GiB/s", "vs read");
    printf("%-26s %10.3f %10.2f %10.2f\n", "plain read (baseline)", best_read,
           (double)n_bytes / (double)(1ull << 30) / best_read, 1.0);
    printf("%-26s %10.3f %10.2f %10.2f\n", "digest, every byte", best_digest,
           (double)n_bytes / (double)(1ull << 30) / best_digest, best_digest / best_read);
    printf("%-26s %10.6f %10s %10.4f\n", "digest, cached", best_cached, "-",
           best_cached / best_read);
    if (cfg.model_dir == NULL) {
        snprintf(command, sizeof(command), "rm -rf %.3000s", cfg.dir);
        if (system(command) != 0) {
            fprintf(stderr, "tandem-bench-digest: could not remove %s\n", cfg.dir);
        }
    }
    return 0;
}
