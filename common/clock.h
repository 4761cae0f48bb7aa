/* clock.h - monotonic time for latency, liveness and benchmarks.
 *
 * Only CLOCK_MONOTONIC: never wall time for durations or liveness (ARCHITECTURE.md contract).
 * Benchmarks also read the process CPU time (tdm_clock_process_cpu_ns).
 */
#ifndef TANDEM_COMMON_CLOCK_H
#define TANDEM_COMMON_CLOCK_H

#include <stdint.h>

/* Nanoseconds per second, millisecond and microsecond: the one definition (integers; divide a
 * double by them for fractional units). */
#define TDM_NS_PER_S  1000000000ull
#define TDM_NS_PER_MS 1000000ull
#define TDM_NS_PER_US 1000ull

/* tdm_clock_now_ns - CLOCK_MONOTONIC in nanoseconds since an arbitrary fixed point. */
uint64_t tdm_clock_now_ns(void);

/* tdm_clock_process_cpu_ns - CPU time of this process (all threads, CLOCK_PROCESS_CPUTIME_ID) in
 * nanoseconds; 0 when the clock is unavailable. */
uint64_t tdm_clock_process_cpu_ns(void);

/* tdm_clock_elapsed_ms - milliseconds (fractional) since t_start_ns, from tdm_clock_now_ns(). */
double tdm_clock_elapsed_ms(uint64_t t_start_ns);

#endif
