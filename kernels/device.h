/* device.h - where a process runs its kernels: the `--device cpu|cuda[:N]|guard` value of the
 * tools and nodes (issue 14 item 1), parsed once and turned into a kernel table (kernels/ops.h).
 *
 * Owns nothing. A kern_device_t is plain data; kern_device_ops returns one of the static tables
 * of kern_ops_cpu() / kern_ops_cuda() after making the chosen GPU the calling thread's current
 * CUDA device. Every refusal is a status with one line naming the value and the reason, so a
 * tool can print it and exit 2 without having loaded anything.
 */
#ifndef TANDEM_KERNELS_DEVICE_H
#define TANDEM_KERNELS_DEVICE_H

#include <stddef.h>

#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Longest device text kern_device_parse accepts ("cuda:" plus a decimal ordinal). */
#define KERN_DEVICE_TEXT_MAX 32

/* Most items kern_device_parse_list reads (the ranks of one expert-parallel group). */
#define KERN_DEVICE_LIST_MAX 72

/*
 * kern_device_t - one place to run kernels. backend KERN_BACKEND_CPU or KERN_BACKEND_GUARD
 * (ordinal 0), or KERN_BACKEND_CUDA with the CUDA device ordinal (0-based, as cudaSetDevice and
 * CUDA_VISIBLE_DEVICES number them).
 */
typedef struct {
    kern_backend_t backend;
    int ordinal;
} kern_device_t;

/*
 * kern_device_parse - read "cpu", "cuda" (= "cuda:0"), "cuda:N" (N a decimal 0..1023 without
 * sign or spaces) or "guard" (KERN_BACKEND_GUARD: the checking backend of kernels/guard.h, which
 * runs the CPU kernels over memory the host may touch only through the table). Case-sensitive,
 * as the flag values are documented.
 * Returns TDM_OK with *out filled, or TDM_ERR_INVALID_ARG with one line in err (err_bytes may
 * be 0) naming the text and the accepted forms; *out untouched on error. Checks no hardware.
 */
tdm_status_t kern_device_parse(const char *text, kern_device_t *out, char *err, size_t err_bytes);

/*
 * kern_device_parse_list - read a `--devices` value: comma-separated items, each "cpu", "cuda",
 * "cuda:N" or a bare ordinal N (= "cuda:N"), e.g. "0,1", "cuda:0,cuda:1", "cpu,cpu" (CPU ranks
 * in one process: the tests and a CPU rehearsal of expert parallel). At most max_devices items,
 * no empty item, no CUDA ordinal twice, no "guard" (one per process, not a group). Kinds may
 * mix here; engine/ep.h refuses that by name.
 * Returns TDM_OK with devices[0..*n_out) filled, or TDM_ERR_INVALID_ARG with one line in err
 * naming the item and the rule (outputs untouched). Checks no hardware.
 */
tdm_status_t kern_device_parse_list(const char *text, kern_device_t *devices, int max_devices,
                                    int *n_out, char *err, size_t err_bytes);

/*
 * kern_device_name - "cpu" or "cuda:N" into buf (bytes >= KERN_DEVICE_TEXT_MAX); returns buf.
 */
const char *kern_device_name(const kern_device_t *dev, char *buf, size_t bytes);

/*
 * kern_device_ops - the kernel table for dev, ready to use on the calling thread: for CUDA the
 * device is made the thread's current device (cudaSetDevice; other threads that run the
 * table's kernels must call this too); for guard the process's one guard table, made at the
 * first call over a region of TANDEM_GUARD_BYTES (default 4 GiB, reserved, not committed) and
 * kept until exit (kernels/guard.h: one thread at a time).
 * Returns TDM_OK with *ops_out, or with *ops_out untouched and one line in err:
 *   TDM_ERR_INVALID_ARG  dev or ops_out NULL, unknown backend, a bad TANDEM_GUARD_BYTES;
 *   TDM_ERR_BUSY / TDM_ERR_NO_MEMORY  guard: a table made by kern_guard_create already exists,
 *                        or the region cannot be mapped;
 *   TDM_ERR_UNSUPPORTED  CUDA asked of a build without the CUDA backend (nvcc absent at
 *                        configure time), or no usable CUDA device (the driver's reason);
 *   TDM_ERR_NOT_FOUND    ordinal >= the number of CUDA devices (the count is named).
 */
tdm_status_t kern_device_ops(const kern_device_t *dev, const kern_ops_t **ops_out, char *err,
                             size_t err_bytes);

/*
 * kern_device_open - kern_device_parse(text) then kern_device_ops: what a tool does with its
 * --device value. Returns TDM_OK with *dev_out (may be NULL) and *ops_out, or the first step's
 * status and message (outputs untouched).
 */
tdm_status_t kern_device_open(const char *text, kern_device_t *dev_out, const kern_ops_t **ops_out,
                              char *err, size_t err_bytes);

/*
 * kern_device_info_t - what a benchmark needs to state a GPU's rooflines.
 * name:           the driver's device name ("" when unknown)
 * mem_bytes:      device memory, bytes
 * n_sms, clock_khz, cc_major, cc_minor: streaming multiprocessors, SM clock (kHz), compute
 *                 capability
 * hbm_peak_bps:   peak memory bandwidth, bytes/s = 2 (double data rate) x memory clock x bus
 *                 width / 8, from the driver's cudaDevAttrMemoryClockRate and
 *                 cudaDevAttrGlobalMemoryBusWidth (the CUDA Runtime API's attribute list)
 * bf16_peak_flops: dense BF16 tensor-core peak, FLOP/s = SMs x SM clock x dense BF16 FLOP per
 *                 clock per SM (4096 for sm_90, Hopper whitepaper: 989 TFLOP/s on 132 SMs at
 *                 1.83 GHz; 8192 for sm_100/sm_103, Blackwell datasheets); 0 for other parts
 */
typedef struct {
    char name[128];
    unsigned long long mem_bytes;
    int n_sms;
    int clock_khz;
    int cc_major;
    int cc_minor;
    double hbm_peak_bps;
    double bf16_peak_flops;
} kern_device_info_t;

/*
 * kern_device_info - the CUDA device `ordinal`'s figures. Returns TDM_OK with *out filled, or
 * TDM_ERR_UNSUPPORTED (no CUDA backend or device; reason in err) / TDM_ERR_INVALID_ARG (out
 * NULL); *out untouched on error.
 */
tdm_status_t kern_device_info(int ordinal, kern_device_info_t *out, char *err, size_t err_bytes);

/*
 * kern_cuda_device_count - CUDA devices the driver reports; 0 without the CUDA backend or a
 * driver (reason, may be NULL, then gets a static string as for kern_cuda_available).
 */
int kern_cuda_device_count(const char **reason);

#ifdef __cplusplus
}
#endif

#endif
