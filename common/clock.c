#include "common/clock.h"

#include <time.h>

uint64_t tdm_clock_now_ns(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000000ULL + (uint64_t)now.tv_nsec;
}

double tdm_clock_elapsed_ms(uint64_t t_start_ns)
{
    return (double)(tdm_clock_now_ns() - t_start_ns) / 1e6;
}
