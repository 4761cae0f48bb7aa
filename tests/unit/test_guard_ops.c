/* test_guard_ops.c - the test-only guard kernel table (kernels/guard.h) catches host reads of
 * backend memory: outside an op a read faults (SIGSEGV in a forked child), inside ops and
 * through mem_copy the same memory works; a host pointer handed to an op, or a copy in the wrong
 * direction, aborts; the allocator reuses and merges freed blocks. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "kernels/guard.h"
#include "kernels/ops.h"

#define POOL_BYTES (1u << 20)
#define SEGV_EXIT  77 /* the child's exit code when its SIGSEGV handler ran */

static void on_segv(int sig)
{
    (void)sig;
    _exit(SEGV_EXIT);
}

/* Run fn(arg) in a forked child; 1 when the child died of (or caught) SIGSEGV. A sanitizer
 * runtime may take SIGSEGV itself, so the child installs its own handler first. */
static int faults_in_child(void (*fn)(const void *), const void *arg)
{
    int status = 0;
    pid_t pid = fork();

    if (pid == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = on_segv;
        sigaction(SIGSEGV, &sa, NULL);
        fn(arg);
        _exit(0);
    }
    assert_true(pid > 0);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return (WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV) ||
           (WIFEXITED(status) && WEXITSTATUS(status) == SEGV_EXIT);
}

static void host_read(const void *p)
{
    volatile const float *f = p;
    float v = f[3];
    (void)v;
}

static void host_write(const void *p)
{
    volatile float *f = (float *)(uintptr_t)p;
    f[0] = 1.0f;
}

static void nothing(const void *p)
{
    (void)p;
}

static void test_host_access_outside_an_op_faults(void **state)
{
    const kern_ops_t *ops = NULL;
    float host[64];
    float *dev = NULL;
    kern_ctx_t ctx;

    (void)state;
    memset(&ctx, 0, sizeof(ctx));
    assert_int_equal(kern_guard_create(POOL_BYTES, &ops), TDM_OK);
    assert_string_equal(ops->name, "guard");
    assert_int_equal(ops->host_memory, 0);
    assert_int_equal(ops->mem_alloc(&ctx, sizeof(host), (void **)&dev), TDM_OK);
    assert_true(kern_guard_contains(dev, sizeof(host)));
    assert_false(kern_guard_contains(host, sizeof(host)));
    assert_false(faults_in_child(nothing, dev)); /* the harness itself does not fault */
    assert_true(faults_in_child(host_read, dev));
    assert_true(faults_in_child(host_write, dev));
    assert_false(faults_in_child(host_read, host)); /* host memory is never guarded */
    ops->mem_free(&ctx, dev);
    assert_int_equal(kern_guard_destroy(), 0);
}

static void test_ops_and_copies_work_inside(void **state)
{
    const kern_ops_t *ops = NULL;
    float host[64], back[64], sum[64];
    float *a = NULL, *b = NULL, *y = NULL;
    kern_ctx_t ctx;

    (void)state;
    memset(&ctx, 0, sizeof(ctx));
    assert_int_equal(kern_guard_create(POOL_BYTES, &ops), TDM_OK);
    for (int i = 0; i < 64; i++) {
        host[i] = (float)i * 0.5f;
    }
    assert_int_equal(ops->mem_alloc(&ctx, sizeof(host), (void **)&a), TDM_OK);
    assert_int_equal(ops->mem_alloc(&ctx, sizeof(host), (void **)&b), TDM_OK);
    assert_int_equal(ops->mem_alloc(&ctx, sizeof(host), (void **)&y), TDM_OK);
    assert_int_equal(ops->mem_copy(&ctx, a, host, sizeof(host), KERN_COPY_H2D), TDM_OK);
    assert_int_equal(ops->mem_copy(&ctx, b, a, sizeof(host), KERN_COPY_D2D), TDM_OK);
    assert_int_equal(ops->add(&ctx, a, b, 64, y), TDM_OK);
    assert_int_equal(ops->mem_copy(&ctx, sum, y, sizeof(sum), KERN_COPY_D2H), TDM_OK);
    assert_int_equal(ops->mem_set(&ctx, b, 0, sizeof(host)), TDM_OK);
    assert_int_equal(ops->mem_copy(&ctx, back, b, sizeof(back), KERN_COPY_D2H), TDM_OK);
    for (int i = 0; i < 64; i++) {
        assert_true(sum[i] == host[i] * 2.0f);
        assert_true(back[i] == 0.0f);
    }
    /* still guarded after all those calls */
    assert_true(faults_in_child(host_read, y));
    ops->mem_free(&ctx, a);
    ops->mem_free(&ctx, b);
    ops->mem_free(&ctx, y);
    assert_int_equal(kern_guard_destroy(), 0);
}

/* Run fn(arg) in a forked child; 1 when the child died of SIGABRT (the guard's verdict on a host
 * pointer handed to an op or a copy in the wrong direction). */
static int aborts_in_child(void (*fn)(const void *), const void *arg)
{
    int status = 0;
    pid_t pid = fork();

    if (pid == 0) {
        fn(arg);
        _exit(0);
    }
    assert_true(pid > 0);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
}

static const kern_ops_t *g_ops; /* the table the child helpers below call */

static void add_into_host(const void *dev)
{
    float host[4] = {0};
    (void)g_ops->add(NULL, dev, dev, 4, host); /* y_out is host memory */
}

static void add_on_device(const void *dev)
{
    (void)g_ops->add(NULL, dev, dev, 4, (float *)(uintptr_t)dev);
}

static void copy_wrong_way(const void *dev)
{
    float host[4] = {0};
    (void)g_ops->mem_copy(NULL, host, dev, sizeof(host), KERN_COPY_H2D); /* it is D2H */
}

static void test_host_pointers_to_ops_abort(void **state)
{
    float *dev = NULL;

    (void)state;
    assert_int_equal(kern_guard_create(POOL_BYTES, &g_ops), TDM_OK);
    assert_int_equal(g_ops->mem_alloc(NULL, 4 * sizeof(float), (void **)&dev), TDM_OK);
    assert_int_equal(g_ops->mem_set(NULL, dev, 0, 4 * sizeof(float)), TDM_OK);
    assert_false(aborts_in_child(add_on_device, dev));
    assert_true(aborts_in_child(add_into_host, dev));
    assert_true(aborts_in_child(copy_wrong_way, dev));
    g_ops->mem_free(NULL, dev);
    assert_int_equal(kern_guard_destroy(), 0);
}

static void test_allocator_reuses_and_merges(void **state)
{
    const kern_ops_t *ops = NULL;
    const kern_ops_t *again = NULL;
    void *p[4];
    void *big = NULL;
    kern_ctx_t ctx;

    (void)state;
    memset(&ctx, 0, sizeof(ctx));
    assert_int_equal(kern_guard_create(4096, &ops), TDM_OK);
    assert_int_equal(kern_guard_create(4096, &again), TDM_ERR_BUSY);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(ops->mem_alloc(&ctx, 1000, &p[i]), TDM_OK);
        assert_int_equal((uintptr_t)p[i] % 64, 0);
    }
    assert_int_equal(kern_guard_used(), 4 * 1024);
    assert_int_equal(ops->mem_alloc(&ctx, 1, &big), TDM_ERR_NO_MEMORY); /* full */
    assert_null(big);
    ops->mem_free(&ctx, p[1]);
    ops->mem_free(&ctx, p[2]); /* merges with p[1]'s block */
    assert_int_equal(ops->mem_alloc(&ctx, 2048, &big), TDM_OK);
    assert_ptr_equal(big, p[1]);
    ops->mem_free(&ctx, big);
    ops->mem_free(&ctx, p[0]);
    assert_int_equal(kern_guard_destroy(), 1024); /* p[3] still allocated */
    assert_int_equal(kern_guard_destroy(), 0);    /* nothing left to destroy */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_access_outside_an_op_faults),
        cmocka_unit_test(test_ops_and_copies_work_inside),
        cmocka_unit_test(test_host_pointers_to_ops_abort),
        cmocka_unit_test(test_allocator_reuses_and_merges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
