#include "kernels/backend.h"

#include <stddef.h>

#ifdef TANDEM_HAVE_CUDA
/* Defined in kernels/cuda/backend.cu. */
int kern_cuda_probe(const char **reason);
#endif

int kern_cuda_available(const char **reason)
{
#ifdef TANDEM_HAVE_CUDA
    return kern_cuda_probe(reason);
#else
    if (reason != NULL) {
        *reason = "built without CUDA (nvcc not found at configure time)";
    }
    return 0;
#endif
}
