/* isa.c - run-time choice of the CPU kernels' instruction set (kernels/cpu_isa.h). */
#include "kernels/cpu_isa.h"

#include "common/log.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

static const char *const g_names[KERN_ISA_COUNT] = {"scalar", "avx2", "avx512", "neon"};

/* -1: not chosen yet (read TANDEM_CPU_ISA on first use). */
static atomic_int g_isa = -1;

#if defined(__x86_64__) && defined(__GNUC__)
/* F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does not know "f16c". */
static int cpu_has_f16c(void)
{
    unsigned int eax, ebx, ecx, edx;

    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
}
#endif

const char *kern_cpu_isa_name(kern_cpu_isa_t isa)
{
    return (int)isa >= 0 && isa < KERN_ISA_COUNT ? g_names[isa] : "?";
}

int kern_cpu_isa_supported(kern_cpu_isa_t isa)
{
    switch (isa) {
    case KERN_ISA_SCALAR:
        return 1;
#if defined(__x86_64__) && defined(__GNUC__)
    case KERN_ISA_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
    case KERN_ISA_AVX512:
        return __builtin_cpu_supports("avx512f");
#endif
#if defined(__aarch64__)
    case KERN_ISA_NEON:
        return 1; /* Advanced SIMD is part of the aarch64 base ISA */
#endif
    default:
        return 0;
    }
}

tdm_status_t kern_cpu_isa_parse(const char *name, kern_cpu_isa_t *isa_out)
{
    if (name == NULL || isa_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    for (int i = 0; i < KERN_ISA_COUNT; i++) {
        if (strcmp(name, g_names[i]) == 0) {
            *isa_out = (kern_cpu_isa_t)i;
            return TDM_OK;
        }
    }
    return TDM_ERR_INVALID_ARG;
}

static kern_cpu_isa_t widest_supported(void)
{
    static const kern_cpu_isa_t order[] = {KERN_ISA_AVX512, KERN_ISA_AVX2, KERN_ISA_NEON};
    for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
        if (kern_cpu_isa_supported(order[i])) {
            return order[i];
        }
    }
    return KERN_ISA_SCALAR;
}

/* The default: TANDEM_CPU_ISA when it names a supported set, else the widest. */
static kern_cpu_isa_t initial_choice(void)
{
    const char *env = getenv("TANDEM_CPU_ISA");
    kern_cpu_isa_t isa;
    if (env == NULL || env[0] == '\0') {
        return widest_supported();
    }
    if (kern_cpu_isa_parse(env, &isa) != TDM_OK) {
        tdm_log(TDM_LOG_WARN, "kernels",
                "TANDEM_CPU_ISA=%s: expected scalar, avx2, avx512 or neon; using %s", env,
                g_names[widest_supported()]);
        return widest_supported();
    }
    if (!kern_cpu_isa_supported(isa)) {
        tdm_log(TDM_LOG_WARN, "kernels", "TANDEM_CPU_ISA=%s: this CPU or build lacks it; using %s",
                env, g_names[widest_supported()]);
        return widest_supported();
    }
    return isa;
}

kern_cpu_isa_t kern_cpu_isa(void)
{
    int isa = atomic_load_explicit(&g_isa, memory_order_relaxed);
    if (isa < 0) {
        int expected = -1;
        int chosen = (int)initial_choice();
        /* Two first callers agree (same environment); the first store wins either way. */
        if (!atomic_compare_exchange_strong(&g_isa, &expected, chosen)) {
            chosen = expected;
        }
        isa = chosen;
    }
    return (kern_cpu_isa_t)isa;
}

tdm_status_t kern_cpu_isa_set(kern_cpu_isa_t isa)
{
    if (!kern_cpu_isa_supported(isa)) {
        return TDM_ERR_UNSUPPORTED;
    }
    atomic_store(&g_isa, (int)isa);
    return TDM_OK;
}
