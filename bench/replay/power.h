/* power.h - measured energy of the host during a benchmark level: RAPL and NVML, never guessed.
 *
 * RAPL: every readable /sys/class/powercap/intel-rapl:N package zone and its "dram" subzones
 * (energy_uj counters, wrap-around handled with max_energy_range_uj). NVML: libnvidia-ml.so.1
 * loaded with dlopen when present, each GPU's total-energy counter, or its power reading
 * integrated over ticks when the counter is unsupported. With neither, nothing is measured
 * and callers report throughput per core instead. Owns the dlopen handle and zone list. One
 * thread uses a bench_power_t at a time.
 */
#ifndef TANDEM_BENCH_POWER_H
#define TANDEM_BENCH_POWER_H

#include "common/status.h"

#define BENCH_POWER_SOURCES_BYTES 256

/* Energy over one measured span. Plain data. */
typedef struct {
    int measured;     /* 0: no source could be read; the other fields are 0 */
    double energy_j;  /* summed over every source */
    double seconds;   /* span between begin and end */
    double average_w; /* energy_j / seconds */
} bench_power_reading_t;

typedef struct bench_power bench_power_t;

/*
 * bench_power_create - find the readable sources (may be none). `powercap_root` is normally
 * "/sys/class/powercap" (tests point it elsewhere); `nvml_library` normally "libnvidia-ml.so.1",
 * or NULL to skip NVML. Returns TDM_OK or TDM_ERR_NO_MEMORY.
 */
tdm_status_t bench_power_create(const char *powercap_root, const char *nvml_library,
                                bench_power_t **power_out);

/* bench_power_available - 1 when at least one source is readable. */
int bench_power_available(const bench_power_t *power);

/* bench_power_sources - e.g. "rapl:package-0,dram + nvml:8 gpus", or "none". Owned by power. */
const char *bench_power_sources(const bench_power_t *power);

/* bench_power_begin - start a span (reads every counter). */
void bench_power_begin(bench_power_t *power);

/* bench_power_tick - read counters (call every few hundred ms: catches wrap-around and samples
 * NVML power where there is no energy counter). */
void bench_power_tick(bench_power_t *power);

/* bench_power_end - close the span and return what was measured since begin. */
bench_power_reading_t bench_power_end(bench_power_t *power);

/* bench_power_destroy - unload NVML and free; accepts NULL. */
void bench_power_destroy(bench_power_t *power);

#endif
