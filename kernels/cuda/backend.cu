/* backend.cu - CUDA device discovery, selection and figures for kernels/device.c (whose
 * kern_cuda_device_count also answers kern_cuda_available). */
#include <cuda_runtime.h>
#include <stdio.h>

#include "kernels/device.h"

/* kern_cuda_probe_count - the driver's device count, 0 with the reason on any error. */
extern "C" int kern_cuda_probe_count(const char **reason)
{
    int n_devices = 0;
    cudaError_t err = cudaGetDeviceCount(&n_devices);

    if (err != cudaSuccess) {
        if (reason != NULL) {
            *reason = cudaGetErrorString(err);
        }
        return 0;
    }
    if (reason != NULL) {
        *reason = n_devices > 0 ? "ok" : "no CUDA device present";
    }
    return n_devices;
}

/* kern_cuda_select - cudaSetDevice(ordinal) on the calling thread: 0, or -1 with the reason. */
extern "C" int kern_cuda_select(int ordinal, const char **reason)
{
    cudaError_t err = cudaSetDevice(ordinal);

    if (err != cudaSuccess) {
        if (reason != NULL) {
            *reason = cudaGetErrorString(err);
        }
        return -1;
    }
    if (reason != NULL) {
        *reason = "ok";
    }
    return 0;
}

/* kern_cuda_query - the figures of kern_device_info_t for `ordinal` (bf16_peak_flops is left to
 * kernels/device.c): 0, or -1 with the reason. */
extern "C" int kern_cuda_query(int ordinal, kern_device_info_t *out, const char **reason)
{
    cudaDeviceProp prop;
    int mem_khz = 0, bus_bits = 0, sm_khz = 0;
    cudaError_t err = cudaGetDeviceProperties(&prop, ordinal);

    if (err == cudaSuccess) {
        err = cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, ordinal);
    }
    if (err == cudaSuccess) {
        err = cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, ordinal);
    }
    if (err == cudaSuccess) {
        err = cudaDeviceGetAttribute(&sm_khz, cudaDevAttrClockRate, ordinal);
    }
    if (err != cudaSuccess) {
        if (reason != NULL) {
            *reason = cudaGetErrorString(err);
        }
        return -1;
    }
    snprintf(out->name, sizeof(out->name), "%s", prop.name);
    out->mem_bytes = (unsigned long long)prop.totalGlobalMem;
    out->n_sms = prop.multiProcessorCount;
    out->clock_khz = sm_khz;
    out->cc_major = prop.major;
    out->cc_minor = prop.minor;
    out->hbm_peak_bps = 2.0 * (double)mem_khz * 1e3 * (double)bus_bits / 8.0;
    out->bf16_peak_flops = 0.0;
    if (reason != NULL) {
        *reason = "ok";
    }
    return 0;
}
