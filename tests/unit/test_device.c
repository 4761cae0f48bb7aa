/* test_device.c - the --device value (kernels/device.h): every accepted and refused form of
 * kern_device_parse, names, and kern_device_ops' table or refusal on this build and machine
 * (CUDA cases check what the driver says: with a device they get the "cuda" table, without one
 * a TDM_ERR_UNSUPPORTED naming the reason), and the guard checking backend. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/status.h"
#include "kernels/device.h"
#include "kernels/guard.h"
#include "kernels/ops.h"

static void test_parse_accepts(void **state)
{
    kern_device_t d;
    char name[KERN_DEVICE_TEXT_MAX];
    (void)state;

    assert_int_equal(kern_device_parse("cpu", &d, NULL, 0), TDM_OK);
    assert_int_equal(d.backend, KERN_BACKEND_CPU);
    assert_string_equal(kern_device_name(&d, name, sizeof(name)), "cpu");
    assert_int_equal(kern_device_parse("cuda", &d, NULL, 0), TDM_OK);
    assert_int_equal(d.backend, KERN_BACKEND_CUDA);
    assert_int_equal(d.ordinal, 0);
    assert_string_equal(kern_device_name(&d, name, sizeof(name)), "cuda:0");
    assert_int_equal(kern_device_parse("cuda:7", &d, NULL, 0), TDM_OK);
    assert_int_equal(d.ordinal, 7);
    assert_string_equal(kern_device_name(&d, name, sizeof(name)), "cuda:7");
    assert_int_equal(kern_device_parse("cuda:1023", &d, NULL, 0), TDM_OK);
    assert_int_equal(d.ordinal, 1023);
}

static void test_parse_refuses(void **state)
{
    static const char *bad[] = {"",        "CPU",        "gpu",     "cuda:",     "cuda:-1",
                                "cuda:+1", "cuda: 1",    "cuda:1x", "cuda:1024", "cuda0",
                                "cudax",   "cuda:99999", "cpu:0",   " cpu"};
    kern_device_t d = {KERN_BACKEND_CUDA, 42};
    char err[160];
    (void)state;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        assert_int_equal(kern_device_parse(bad[i], &d, err, sizeof(err)), TDM_ERR_INVALID_ARG);
        /* the message names the value and the accepted forms; the output is untouched */
        assert_non_null(strstr(err, "cuda:N"));
        assert_int_equal(d.backend, KERN_BACKEND_CUDA);
        assert_int_equal(d.ordinal, 42);
    }
    assert_int_equal(kern_device_parse("cuda:x", &d, err, sizeof(err)), TDM_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "'cuda:x'"));
    assert_int_equal(kern_device_parse(NULL, &d, err, sizeof(err)), TDM_ERR_INVALID_ARG);
    assert_int_equal(kern_device_parse("cpu", NULL, err, sizeof(err)), TDM_ERR_INVALID_ARG);
}

static void test_parse_list(void **state)
{
    kern_device_t d[4];
    int n = -1;
    char err[256];
    (void)state;

    assert_int_equal(kern_device_parse_list("0,1", d, 4, &n, err, sizeof(err)), TDM_OK);
    assert_int_equal(n, 2);
    assert_int_equal(d[0].backend, KERN_BACKEND_CUDA);
    assert_int_equal(d[1].ordinal, 1);
    assert_int_equal(kern_device_parse_list("cuda:3,cuda:0,2", d, 4, &n, err, sizeof(err)), TDM_OK);
    assert_int_equal(n, 3);
    assert_int_equal(d[0].ordinal, 3);
    assert_int_equal(d[2].ordinal, 2);
    assert_int_equal(kern_device_parse_list("cpu,cpu", d, 4, &n, err, sizeof(err)), TDM_OK);
    assert_int_equal(n, 2);
    assert_int_equal(d[1].backend, KERN_BACKEND_CPU);
    static const char *const bad[] = {"",         ",0",  "0,",        "0,,1",      "0,0",
                                      "cuda:1,1", "gpu", "0,1,2,3,4", "cuda:99999"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        n = -1;
        err[0] = '\0';
        assert_int_equal(kern_device_parse_list(bad[i], d, 4, &n, err, sizeof(err)),
                         TDM_ERR_INVALID_ARG);
        assert_int_equal(n, -1);
        assert_true(strlen(err) > 0);
    }
}

static void test_ops_cpu(void **state)
{
    kern_device_t d = {KERN_BACKEND_CPU, 0};
    const kern_ops_t *ops = NULL;
    (void)state;

    assert_int_equal(kern_device_ops(&d, &ops, NULL, 0), TDM_OK);
    assert_ptr_equal(ops, kern_ops_cpu());
    assert_int_equal(ops->host_memory, 1);
    assert_int_equal(kern_device_ops(NULL, &ops, NULL, 0), TDM_ERR_INVALID_ARG);
    assert_int_equal(kern_device_ops(&d, NULL, NULL, 0), TDM_ERR_INVALID_ARG);
}

static void test_ops_cuda_on_this_machine(void **state)
{
    kern_device_t d = {KERN_BACKEND_CUDA, 0};
    const kern_ops_t *ops = kern_ops_cpu();
    const char *reason = NULL;
    char err[200] = "";
    int count = kern_cuda_device_count(&reason);
    tdm_status_t st;
    (void)state;

    assert_non_null(reason);
    st = kern_device_ops(&d, &ops, err, sizeof(err));
    if (count == 0) {
        /* no CUDA here: refused with the driver's (or the build's) reason, table untouched */
        assert_int_equal(st, TDM_ERR_UNSUPPORTED);
        assert_non_null(strstr(err, "cuda:0"));
        assert_non_null(strstr(err, reason));
        assert_ptr_equal(ops, kern_ops_cpu());
        print_message("note: no CUDA device (%s): the cuda table itself is not exercised\n",
                      reason);
        return;
    }
    assert_int_equal(st, TDM_OK);
    assert_non_null(ops);
    assert_string_equal(ops->name, "cuda");
    assert_int_equal(ops->host_memory, 0);
    /* one past the last device is refused, naming the count */
    d.ordinal = count;
    ops = NULL;
    assert_int_equal(kern_device_ops(&d, &ops, err, sizeof(err)), TDM_ERR_NOT_FOUND);
    assert_null(ops);
    assert_non_null(strstr(err, "not found"));
}

/* "guard": parsed and named, refused in a --devices list, one table per process (a second open
 * gives the same table; kern_guard_create then finds it taken), its region size from
 * TANDEM_GUARD_BYTES checked before anything is mapped. */
static void test_guard(void **state)
{
    kern_device_t d, list[4];
    const kern_ops_t *ops = NULL, *again = NULL, *other = NULL;
    char err[256] = "", name[KERN_DEVICE_TEXT_MAX];
    int n = 0;

    (void)state;
    assert_int_equal(kern_device_parse("guard", &d, NULL, 0), TDM_OK);
    assert_int_equal(d.backend, KERN_BACKEND_GUARD);
    assert_string_equal(kern_device_name(&d, name, sizeof(name)), "guard");
    assert_int_equal(kern_device_parse("Guard", &d, err, sizeof(err)), TDM_ERR_INVALID_ARG);
    assert_int_equal(kern_device_parse_list("guard,cpu", list, 4, &n, err, sizeof(err)),
                     TDM_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "guard"));

    assert_int_equal(setenv("TANDEM_GUARD_BYTES", "lots", 1), 0);
    assert_int_equal(kern_device_open("guard", NULL, &ops, err, sizeof(err)), TDM_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "TANDEM_GUARD_BYTES"));
    assert_null(ops);
    assert_int_equal(setenv("TANDEM_GUARD_BYTES", "16777216", 1), 0);
    assert_int_equal(kern_device_open("guard", NULL, &ops, err, sizeof(err)), TDM_OK);
    assert_non_null(ops);
    assert_int_equal(ops->host_memory, 0);
    assert_int_equal(kern_device_open("guard", NULL, &again, err, sizeof(err)), TDM_OK);
    assert_ptr_equal(again, ops);
    assert_int_equal(kern_guard_create(4096, &other), TDM_ERR_BUSY);
    assert_null(other);
    unsetenv("TANDEM_GUARD_BYTES");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_accepts),
        cmocka_unit_test(test_parse_refuses),
        cmocka_unit_test(test_parse_list),
        cmocka_unit_test(test_ops_cpu),
        cmocka_unit_test(test_ops_cuda_on_this_machine),
        cmocka_unit_test(test_guard),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
