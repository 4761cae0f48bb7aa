#include "kernels/backend.h"

#include "kernels/device.h"

/* One probe of the driver (kern_cuda_device_count, kernels/device.c) answers both questions. */
int kern_cuda_available(const char **reason)
{
    return kern_cuda_device_count(reason) > 0;
}
