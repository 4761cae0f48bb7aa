/* gpus.c - tandem-sim's GPU table (sim/perf.h sim_gpu_t): NVIDIA's public per-GPU figures for
 * H200, B200, B300, GB200 and GB300 (docs/SIM.md "GPU figures" cites every number).
 *
 * Conventions: decimal units (1 GB = 1e9 B, 1 TB/s = 1e12 B/s); dense tensor FLOP/s (NVIDIA's
 * datasheets print sparse figures with a footnote: the dense rate is half); NVLink and NIC
 * bandwidths one direction per GPU; host link = what one GPU can read from host memory (PCIe
 * Gen5 x16 on HGX boards, half a Grace's NVLink-C2C on the superchips, which share one Grace per
 * two GPUs); busy power = the GPU's TDP/TGP; idle power ASSUMED at SIM_GPU_IDLE_FRACTION of it
 * (no datasheet gives idle power).
 */
#include <string.h>

#include "sim/perf.h"

#define TB 1e12
#define GB 1e9
#define PF 1e15
/* Idle power as a fraction of TDP (assumption, docs/SIM.md). */
#define SIM_GPU_IDLE_FRACTION 0.15
/* PCIe Gen5 x16, one direction: 32 GT/s x 16 lanes x 128/130 = 63 GB/s. */
#define PCIE5_X16 (63.0 * GB)
/* NVLink-C2C: 900 GB/s bidirectional per Grace = 450 GB/s per direction, shared by 2 GPUs. */
#define C2C_PER_GPU (225.0 * GB)

static const sim_gpu_t sim_gpus[] = {
    /* HGX H200: 141 GB HBM3e, 4.8 TB/s, FP8 3,958 TFLOPS sparse, no FP4, NVLink 4 900 GB/s
     * bidirectional, ConnectX-7 400 Gb/s per GPU, PCIe Gen5, up to 700 W. */
    {"h200", "NVIDIA H200 SXM (HGX H200)", 141.0 * GB, 4.8 * TB, 1.979 * PF, 1.979 * PF, 450.0 * GB,
     50.0 * GB, PCIE5_X16, SIM_GPU_IDLE_FRACTION * 700.0, 700.0, 8},
    /* HGX B200: 1.44 TB / 8 = 180 GB, 64 TB/s / 8 = 8 TB/s, FP8 72 PF sparse / 8 GPUs, FP4
     * 144 PF sparse / 8, NVLink 5 1.8 TB/s bidirectional, ConnectX-7 400 Gb/s, 1,000 W. */
    {"b200", "NVIDIA B200 SXM (HGX B200)", 180.0 * GB, 8.0 * TB, 4.5 * PF, 9.0 * PF, 900.0 * GB,
     50.0 * GB, PCIE5_X16, SIM_GPU_IDLE_FRACTION * 1000.0, 1000.0, 8},
    /* HGX B300: 2.3 TB / 8 = 288 GB, 8 TB/s, FP4 108 PF dense / 8, FP8 72 PF sparse / 8, NVLink 5
     * 1.8 TB/s, ConnectX-8 800 Gb/s per GPU, 1,100 W. */
    {"b300", "NVIDIA B300 SXM (HGX B300, Blackwell Ultra)", 288.0 * GB, 8.0 * TB, 4.5 * PF,
     13.5 * PF, 900.0 * GB, 100.0 * GB, PCIE5_X16, SIM_GPU_IDLE_FRACTION * 1100.0, 1100.0, 8},
    /* GB200 NVL72: 13.4 TB HBM3e / 72 = 186 GB, 576 TB/s / 72 = 8 TB/s, FP4 1,440 PF sparse / 72
     * (10 PF dense), FP8 720 PF sparse / 72 (5 PF dense), NVLink 130 TB/s / 72 = 1.8 TB/s
     * bidirectional, ConnectX-7 400 Gb/s per GPU, NVLink-C2C to Grace, 1,200 W per GPU. */
    {"gb200", "NVIDIA GB200 NVL72 (Blackwell)", 186.0 * GB, 8.0 * TB, 5.0 * PF, 10.0 * PF,
     900.0 * GB, 50.0 * GB, C2C_PER_GPU, SIM_GPU_IDLE_FRACTION * 1200.0, 1200.0, 72},
    /* GB300 NVL72: 20.7 TB HBM3e / 72 = 288 GB, 576 TB/s / 72 = 8 TB/s, FP4 1,080 PF dense / 72
     * (15 PF), FP8 720 PF sparse / 72 (5 PF dense), NVLink 130 TB/s / 72, ConnectX-8 800 Gb/s
     * per GPU, NVLink-C2C to Grace, 1,400 W per GPU. */
    {"gb300", "NVIDIA GB300 NVL72 (Blackwell Ultra)", 288.0 * GB, 8.0 * TB, 5.0 * PF, 15.0 * PF,
     900.0 * GB, 100.0 * GB, C2C_PER_GPU, SIM_GPU_IDLE_FRACTION * 1400.0, 1400.0, 72},
};

const sim_gpu_t *sim_gpu_find(const char *name)
{
    if (name == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < sizeof(sim_gpus) / sizeof(sim_gpus[0]); i++) {
        if (strcmp(sim_gpus[i].name, name) == 0) {
            return &sim_gpus[i];
        }
    }
    return NULL;
}

const char *sim_gpu_names(void)
{
    return "h200, b200, b300, gb200 or gb300";
}
