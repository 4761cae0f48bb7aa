/* ops.c - the per-backend kernel tables of kernels/ops.h. */
#include "kernels/ops.h"

#include "kernels/backend.h"

#include <stddef.h>

static const kern_ops_t ops_cpu = {
    .name = "cpu",
    .quant_act8 = kern_quant_act8_cpu,
    .quant_ckv = kern_quant_ckv_cpu,
    .quant_mx4 = kern_quant_mx4_cpu,
    .dequant_act8 = kern_dequant_act8_cpu,
    .dequant_ckv = kern_dequant_ckv_cpu,
    .dequant_mx4 = kern_dequant_mx4_cpu,
};

#ifdef TANDEM_HAVE_CUDA
static const kern_ops_t ops_cuda = {
    .name = "cuda",
    .quant_act8 = kern_quant_act8_cuda,
    .quant_ckv = kern_quant_ckv_cuda,
    .quant_mx4 = kern_quant_mx4_cuda,
    .dequant_act8 = kern_dequant_act8_cuda,
    .dequant_ckv = kern_dequant_ckv_cuda,
    .dequant_mx4 = kern_dequant_mx4_cuda,
};
#endif

const kern_ops_t *kern_ops_cpu(void)
{
    return &ops_cpu;
}

const kern_ops_t *kern_ops_cuda(void)
{
#ifdef TANDEM_HAVE_CUDA
    if (kern_cuda_available(NULL) != 0) {
        return &ops_cuda;
    }
#endif
    return NULL;
}
