/* ops.h - kern_ops_t: one function table per kernel backend (STYLE.md section 6).
 *
 * Engine code picks a table once (kern_ops_cpu() or kern_ops_cuda()) and calls ops->quant_act8
 * etc., never a backend by name. Owns no state: the tables are static constants. To add an op,
 * declare its kern_<op>_fn type with _cpu and _cuda in its module header, append a member here
 * and fill it in both tables in kernels/ops.c (a backend that lacks the op sets NULL and says
 * so in the member's comment).
 */
#ifndef TANDEM_KERNELS_OPS_H
#define TANDEM_KERNELS_OPS_H

#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/codec.h"

/*
 * kern_ops_t - the kernels of one backend. Pointers in argument lists are host memory for
 * "cpu" and device memory for "cuda"; every member follows its function type's contract
 * (kernels/codec.h). Returned by kern_ops_cpu() / kern_ops_cuda(); never freed.
 */
typedef struct {
    const char *name;                   /* "cpu" or "cuda" */
    kern_quant_act8_fn *quant_act8;     /* Q_act8 = Q_swa (MODEL.md 4) */
    kern_quant_ckv_fn *quant_ckv;       /* Q_ckv */
    kern_quant_mx4_fn *quant_mx4;       /* Q_mx4 */
    kern_dequant_act8_fn *dequant_act8; /* codes * scale of Q_act8 */
    kern_dequant_ckv_fn *dequant_ckv;   /* codes * scale of Q_ckv */
    kern_dequant_mx4_fn *dequant_mx4;   /* codes * scale of Q_mx4 */
} kern_ops_t;

/* kern_ops_cpu - the CPU reference table; never NULL. Thread-safe. */
const kern_ops_t *kern_ops_cpu(void);

/*
 * kern_ops_cuda - the CUDA table, or NULL when this build has no CUDA backend or no device is
 * usable (kern_cuda_available() says why). Thread-safe; probes the driver on each call, so
 * callers look it up once at startup.
 */
const kern_ops_t *kern_ops_cuda(void);

#ifdef __cplusplus
}
#endif

#endif
