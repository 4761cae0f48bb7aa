#include "common/clock.h"

#include <time.h>

uint64_t tdm_clock_now_ns(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * TDM_NS_PER_S + (uint64_t)now.tv_nsec;
}

uint64_t tdm_clock_process_cpu_ns(void)
{
    struct timespec now;
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now) != 0) {
        return 0;
    }
    return (uint64_t)now.tv_sec * TDM_NS_PER_S + (uint64_t)now.tv_nsec;
}

double tdm_clock_elapsed_ms(uint64_t t_start_ns)
{
    return (double)(tdm_clock_now_ns() - t_start_ns) / (double)TDM_NS_PER_MS;
}
