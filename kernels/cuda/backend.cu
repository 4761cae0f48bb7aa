/* backend.cu - CUDA device discovery for kern_cuda_available(). */
#include <cuda_runtime.h>

extern "C" int kern_cuda_probe(const char **reason)
{
    int n_devices = 0;
    cudaError_t err = cudaGetDeviceCount(&n_devices);

    if (err != cudaSuccess) {
        if (reason != NULL) {
            *reason = cudaGetErrorString(err);
        }
        return 0;
    }
    if (n_devices == 0) {
        if (reason != NULL) {
            *reason = "no CUDA device present";
        }
        return 0;
    }
    if (reason != NULL) {
        *reason = "ok";
    }
    return 1;
}

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
