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
