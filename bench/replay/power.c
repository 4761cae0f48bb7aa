/* power.c - RAPL powercap and NVML energy readers; see power.h. */
#include "bench/replay/power.h"

#include "common/clock.h"
#include "common/log.h"

#include <dirent.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define POWER_MAX_ZONES    32
#define POWER_MAX_GPUS     64
#define POWER_PATH_BYTES   512
#define POWER_UJ_PER_J     1e6
#define POWER_MJ_PER_J     1e3
#define POWER_MW_PER_W     1e3
#define POWER_NVML_SUCCESS 0

/* NVML's ABI, declared here so the build needs no NVIDIA headers. */
typedef struct nvml_device *nvml_device_t;
typedef int nvml_init_fn(void);
typedef int nvml_shutdown_fn(void);
typedef int nvml_count_fn(unsigned int *count);
typedef int nvml_handle_fn(unsigned int index, nvml_device_t *device);
typedef int nvml_energy_fn(nvml_device_t device, unsigned long long *energy_mj);
typedef int nvml_power_fn(nvml_device_t device, unsigned int *power_mw);

typedef struct {
    char path[POWER_PATH_BYTES]; /* .../energy_uj */
    double max_uj;               /* wrap range */
    double last_uj;
    double total_uj; /* accumulated since begin */
} rapl_zone_t;

typedef struct {
    nvml_device_t device;
    int has_energy;
    unsigned long long last_mj;
    double total_j;
} nvml_gpu_t;

struct bench_power {
    rapl_zone_t zones[POWER_MAX_ZONES];
    size_t n_zones;
    void *nvml_lib;
    nvml_shutdown_fn *nvml_shutdown;
    nvml_energy_fn *nvml_energy;
    nvml_power_fn *nvml_power;
    nvml_gpu_t gpus[POWER_MAX_GPUS];
    size_t n_gpus;
    uint64_t t_begin_ns;
    uint64_t t_last_ns;
    char sources[BENCH_POWER_SOURCES_BYTES];
};

/* out = dir + "/" + name; 0 when it does not fit. */
static int path_join(char *out, size_t out_bytes, const char *dir, const char *name)
{
    int n = snprintf(out, out_bytes, "%s/%s", dir, name);
    return n >= 0 && (size_t)n < out_bytes;
}

static int read_double(const char *path, double *value_out)
{
    FILE *file = fopen(path, "r");
    double value;
    int ok;

    if (file == NULL) {
        return 0;
    }
    ok = fscanf(file, "%lf", &value) == 1;
    fclose(file);
    if (ok) {
        *value_out = value;
    }
    return ok;
}

static void read_name(const char *dir, char *name, size_t name_bytes)
{
    char path[POWER_PATH_BYTES];
    FILE *file;

    name[0] = '\0';
    if (!path_join(path, sizeof(path), dir, "name")) {
        return;
    }
    file = fopen(path, "r");
    if (file == NULL) {
        return;
    }
    if (fgets(name, (int)name_bytes, file) != NULL) {
        name[strcspn(name, "\n")] = '\0';
    }
    fclose(file);
}

/* Adds the zone at `dir` when its counter is readable. */
static void add_zone(bench_power_t *power, const char *dir)
{
    rapl_zone_t *zone;
    char name[64];
    char path[POWER_PATH_BYTES];
    double value;

    if (power->n_zones == POWER_MAX_ZONES) {
        return;
    }
    zone = &power->zones[power->n_zones];
    if (!path_join(zone->path, sizeof(zone->path), dir, "energy_uj") ||
        !read_double(zone->path, &value)) {
        return;
    }
    if (!path_join(path, sizeof(path), dir, "max_energy_range_uj") ||
        !read_double(path, &zone->max_uj)) {
        zone->max_uj = 0.0;
    }
    zone->last_uj = value;
    power->n_zones++;
    read_name(dir, name, sizeof(name));
    snprintf(power->sources + strlen(power->sources),
             sizeof(power->sources) - strlen(power->sources), "%s%s",
             power->n_zones == 1 ? "rapl:" : ",", name[0] != '\0' ? name : "zone");
}

static void find_rapl(bench_power_t *power, const char *root)
{
    DIR *dir = opendir(root);
    struct dirent *ent;

    if (dir == NULL) {
        return;
    }
    while ((ent = readdir(dir)) != NULL) {
        char zone_dir[POWER_PATH_BYTES];
        int package;
        char tail;
        DIR *sub;
        struct dirent *sub_ent;

        /* Top-level package zones only: "intel-rapl:N" (subzones have a second colon). */
        if (sscanf(ent->d_name, "intel-rapl:%d%c", &package, &tail) != 1) {
            continue;
        }
        if (!path_join(zone_dir, sizeof(zone_dir), root, ent->d_name)) {
            continue;
        }
        add_zone(power, zone_dir);
        sub = opendir(zone_dir);
        if (sub == NULL) {
            continue;
        }
        /* DRAM is a subzone outside the package counter; core/uncore are inside it. */
        while ((sub_ent = readdir(sub)) != NULL) {
            char sub_dir[POWER_PATH_BYTES];
            char name[64];
            if (strncmp(sub_ent->d_name, "intel-rapl:", 11) != 0) {
                continue;
            }
            if (!path_join(sub_dir, sizeof(sub_dir), zone_dir, sub_ent->d_name)) {
                continue;
            }
            read_name(sub_dir, name, sizeof(name));
            if (strcmp(name, "dram") == 0) {
                add_zone(power, sub_dir);
            }
        }
        closedir(sub);
    }
    closedir(dir);
}

static void find_nvml(bench_power_t *power, const char *library)
{
    nvml_init_fn *init;
    nvml_count_fn *count;
    nvml_handle_fn *handle;
    unsigned int n = 0;

    power->nvml_lib = dlopen(library, RTLD_NOW | RTLD_LOCAL);
    if (power->nvml_lib == NULL) {
        return;
    }
    *(void **)&init = dlsym(power->nvml_lib, "nvmlInit_v2");
    *(void **)&count = dlsym(power->nvml_lib, "nvmlDeviceGetCount_v2");
    *(void **)&handle = dlsym(power->nvml_lib, "nvmlDeviceGetHandleByIndex_v2");
    *(void **)&power->nvml_shutdown = dlsym(power->nvml_lib, "nvmlShutdown");
    *(void **)&power->nvml_energy = dlsym(power->nvml_lib, "nvmlDeviceGetTotalEnergyConsumption");
    *(void **)&power->nvml_power = dlsym(power->nvml_lib, "nvmlDeviceGetPowerUsage");
    if (init == NULL || count == NULL || handle == NULL || power->nvml_shutdown == NULL ||
        init() != POWER_NVML_SUCCESS) {
        dlclose(power->nvml_lib);
        power->nvml_lib = NULL;
        return;
    }
    if (count(&n) != POWER_NVML_SUCCESS) {
        n = 0;
    }
    for (unsigned int i = 0; i < n && power->n_gpus < POWER_MAX_GPUS; i++) {
        nvml_gpu_t *gpu = &power->gpus[power->n_gpus];
        unsigned int mw;
        if (handle(i, &gpu->device) != POWER_NVML_SUCCESS) {
            continue;
        }
        gpu->has_energy = power->nvml_energy != NULL &&
                          power->nvml_energy(gpu->device, &gpu->last_mj) == POWER_NVML_SUCCESS;
        if (!gpu->has_energy && (power->nvml_power == NULL ||
                                 power->nvml_power(gpu->device, &mw) != POWER_NVML_SUCCESS)) {
            continue;
        }
        power->n_gpus++;
    }
    if (power->n_gpus == 0) {
        power->nvml_shutdown();
        dlclose(power->nvml_lib);
        power->nvml_lib = NULL;
        return;
    }
    snprintf(power->sources + strlen(power->sources),
             sizeof(power->sources) - strlen(power->sources), "%snvml:%zu gpu%s",
             power->sources[0] != '\0' ? " + " : "", power->n_gpus, power->n_gpus == 1 ? "" : "s");
}

tdm_status_t bench_power_create(const char *powercap_root, const char *nvml_library,
                                bench_power_t **power_out)
{
    bench_power_t *power = calloc(1, sizeof(*power));

    if (power == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    if (powercap_root != NULL) {
        find_rapl(power, powercap_root);
    }
    if (nvml_library != NULL) {
        find_nvml(power, nvml_library);
    }
    if (power->sources[0] == '\0') {
        snprintf(power->sources, sizeof(power->sources), "none");
    }
    tdm_log(TDM_LOG_INFO, "bench", "power sources: %s", power->sources);
    *power_out = power;
    return TDM_OK;
}

int bench_power_available(const bench_power_t *power)
{
    return power->n_zones > 0 || power->n_gpus > 0;
}

const char *bench_power_sources(const bench_power_t *power)
{
    return power->sources;
}

void bench_power_tick(bench_power_t *power)
{
    uint64_t now = tdm_clock_now_ns();
    double dt_s = (double)(now - power->t_last_ns) / TDM_NS_PER_S;

    for (size_t z = 0; z < power->n_zones; z++) {
        rapl_zone_t *zone = &power->zones[z];
        double value;
        if (!read_double(zone->path, &value)) {
            continue;
        }
        if (value >= zone->last_uj) {
            zone->total_uj += value - zone->last_uj;
        } else if (zone->max_uj > 0.0) {
            zone->total_uj += zone->max_uj - zone->last_uj + value;
        }
        zone->last_uj = value;
    }
    for (size_t g = 0; g < power->n_gpus; g++) {
        nvml_gpu_t *gpu = &power->gpus[g];
        if (gpu->has_energy) {
            unsigned long long mj;
            if (power->nvml_energy(gpu->device, &mj) == POWER_NVML_SUCCESS && mj >= gpu->last_mj) {
                gpu->total_j += (double)(mj - gpu->last_mj) / POWER_MJ_PER_J;
                gpu->last_mj = mj;
            }
        } else {
            unsigned int mw;
            if (power->nvml_power(gpu->device, &mw) == POWER_NVML_SUCCESS) {
                gpu->total_j += (double)mw / POWER_MW_PER_W * dt_s;
            }
        }
    }
    power->t_last_ns = now;
}

void bench_power_begin(bench_power_t *power)
{
    power->t_last_ns = tdm_clock_now_ns();
    bench_power_tick(power);
    for (size_t z = 0; z < power->n_zones; z++) {
        power->zones[z].total_uj = 0.0;
    }
    for (size_t g = 0; g < power->n_gpus; g++) {
        power->gpus[g].total_j = 0.0;
    }
    power->t_begin_ns = power->t_last_ns;
}

bench_power_reading_t bench_power_end(bench_power_t *power)
{
    bench_power_reading_t reading;

    memset(&reading, 0, sizeof(reading));
    if (!bench_power_available(power)) {
        return reading;
    }
    bench_power_tick(power);
    for (size_t z = 0; z < power->n_zones; z++) {
        reading.energy_j += power->zones[z].total_uj / POWER_UJ_PER_J;
    }
    for (size_t g = 0; g < power->n_gpus; g++) {
        reading.energy_j += power->gpus[g].total_j;
    }
    reading.seconds = (double)(power->t_last_ns - power->t_begin_ns) / TDM_NS_PER_S;
    reading.average_w = reading.seconds > 0.0 ? reading.energy_j / reading.seconds : 0.0;
    reading.measured = 1;
    return reading;
}

void bench_power_destroy(bench_power_t *power)
{
    if (power == NULL) {
        return;
    }
    if (power->nvml_lib != NULL) {
        power->nvml_shutdown();
        dlclose(power->nvml_lib);
    }
    free(power);
}
