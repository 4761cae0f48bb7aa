/* cuda_test_util.h - what the CUDA tests share: the CUDA kernel table, or a skip naming why there
 * is none (a CUDA test never passes without running). */
#ifndef TANDEM_TESTS_CUDA_TEST_UTIL_H
#define TANDEM_TESTS_CUDA_TEST_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kernels/backend.h"
#include "kernels/ops.h"

/* The CUDA table (kern_ops_cuda()), or print kern_cuda_available()'s reason and skip() the
 * calling test when there is no usable device. */
static inline const kern_ops_t *ctu_require_cuda(void)
{
    const char *reason = "unknown";
    const kern_ops_t *cuda;

    if (kern_cuda_available(&reason) == 0) {
        print_message("no CUDA device: skipping (%s)\n", reason);
        skip();
    }
    cuda = kern_ops_cuda();
    assert_non_null(cuda);
    return cuda;
}

#endif
