/* test_node_worker.c - the workers' shared start-up (node/node_worker.h), in process: one flag
 * table of the shared flags plus a worker's own (values land in the worker's config struct at the
 * right offsets, defaults apply, a bad flag is a usage error), the flag checks that run before
 * the model load (--http, the transports, --device), and the /health and /metrics pages both workers serve. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/http_status.h"
#include "kernels/ops.h"
#include "node/node_worker.h"

/* A worker's config struct: the shared flags in the middle, to check the offsets. */
typedef struct {
    uint32_t before;
    node_worker_cfg_t worker;
    uint32_t pages;
} test_cfg_t;

static const tdm_flag_t own_flags[] = {
    {"pages", TDM_FLAG_U32, "4096", offsetof(test_cfg_t, pages), "KV pages", 16, 65536, 0},
};

static const node_worker_main_t spec = {"test-worker", "a worker under test", own_flags, 1,
                                        offsetof(test_cfg_t, worker)};

static int start(int argc, char **argv, test_cfg_t *cfg, tdm_flags_action_t *action)
{
    memset(cfg, 0, sizeof(*cfg));
    return node_worker_main_start(&spec, argc, argv, cfg, action);
}

static void test_shared_and_own_flags_land_in_the_worker_config(void **state)
{
    char *argv[] = {"test-worker", "--model", "/models/m", "--pages",     "20",  "--threads",
                    "3",           "--rack",  "rack7",     "--log-level", "warn"};
    char *mapped[] = {"test-worker", "--model", "/models/m", "--map-weights"};
    test_cfg_t cfg;
    tdm_flags_action_t action;

    (void)state;
    assert_int_equal(start(4, mapped, &cfg, &action), NODE_EXIT_OK);
    assert_int_equal(cfg.worker.map_weights, 1);
    assert_int_equal(start(11, argv, &cfg, &action), NODE_EXIT_OK);
    assert_int_equal(action, TDM_FLAGS_RUN);
    assert_int_equal(cfg.before, 0);
    assert_string_equal(cfg.worker.model_dir, "/models/m");
    assert_int_equal(cfg.pages, 20);
    assert_int_equal(cfg.worker.threads, 3);
    assert_string_equal(cfg.worker.rack, "rack7");
    assert_string_equal(cfg.worker.log_level, "warn");
    /* defaults */
    assert_string_equal(cfg.worker.router, "tcp://127.0.0.1:5557");
    assert_string_equal(cfg.worker.http, "127.0.0.1:0");
    assert_int_equal(cfg.worker.chunk_tokens, 256);
    assert_int_equal(cfg.worker.register_timeout_ms, 10000);
    assert_string_equal(cfg.worker.ucx_protocols, "v1");
    assert_null(cfg.worker.transports);
    assert_null(cfg.worker.require_transport);
    assert_int_equal(cfg.worker.map_weights, 0); /* the copy in 2 MiB pages by default */
    assert_int_equal(node_worker_stop_signal(), 0);
}

static void test_bad_or_missing_flags_are_usage_errors(void **state)
{
    char *no_model[] = {"test-worker", "--pages", "20"};
    char *out_of_range[] = {"test-worker", "--model", "/m", "--pages", "2"};
    char *unknown[] = {"test-worker", "--model", "/m", "--spec", "ngram"};
    char *help[] = {"test-worker", "--help"};
    test_cfg_t cfg;
    tdm_flags_action_t action;

    (void)state;
    assert_int_equal(start(3, no_model, &cfg, &action), NODE_EXIT_USAGE);
    assert_int_equal(start(5, out_of_range, &cfg, &action), NODE_EXIT_USAGE);
    assert_int_equal(start(5, unknown, &cfg, &action), NODE_EXIT_USAGE);
    assert_int_equal(start(2, help, &cfg, &action), NODE_EXIT_OK);
    assert_int_equal(action, TDM_FLAGS_HELP);
}

static void test_too_many_own_flags_is_a_usage_error(void **state)
{
    tdm_flag_t many[NODE_WORKER_MAX_OWN_FLAGS + 1];
    node_worker_main_t big = spec;
    char *argv[] = {"test-worker", "--model", "/m"};
    test_cfg_t cfg;
    tdm_flags_action_t action = TDM_FLAGS_RUN;

    (void)state;
    for (size_t i = 0; i < NODE_WORKER_MAX_OWN_FLAGS + 1; i++) {
        many[i] = own_flags[0];
    }
    big.flags = many;
    big.n_flags = NODE_WORKER_MAX_OWN_FLAGS + 1;
    memset(&cfg, 0, sizeof(cfg));
    assert_int_equal(node_worker_main_start(&big, 3, argv, &cfg, &action), NODE_EXIT_USAGE);
    assert_null(cfg.worker.model_dir); /* nothing parsed */
}

static void test_open_checks_http_and_transport_before_the_model(void **state)
{
    node_worker_cfg_t cfg;
    node_worker_t w;

    (void)state;
    memset(&cfg, 0, sizeof(cfg));
    cfg.model_dir = "/nonexistent";
    cfg.http = "no-port";
    assert_int_equal(node_worker_open(&w, &cfg, "test-worker", "decode", TANDEM__ROLE__ROLE_DECODE),
                     NODE_EXIT_USAGE);
    cfg.http = "127.0.0.1:0";
    cfg.require_transport = "carrier-pigeon";
    assert_int_equal(node_worker_open(&w, &cfg, "test-worker", "decode", TANDEM__ROLE__ROLE_DECODE),
                     NODE_EXIT_USAGE);
    cfg.require_transport = NULL;
    /* --device: opened before the model; a bad value or a device that is not there (no machine
     * has 1024 GPUs; a build without CUDA has none) is a usage error */
    cfg.device = "gpu";
    assert_int_equal(node_worker_open(&w, &cfg, "test-worker", "decode", TANDEM__ROLE__ROLE_DECODE),
                     NODE_EXIT_USAGE);
    cfg.device = "cuda:1023";
    assert_int_equal(node_worker_open(&w, &cfg, "test-worker", "decode", TANDEM__ROLE__ROLE_DECODE),
                     NODE_EXIT_USAGE);
    cfg.device = NULL; /* the default: cpu */
    cfg.threads = 5;
    assert_int_equal(
        node_worker_open(&w, &cfg, "test-worker", "prefill", TANDEM__ROLE__ROLE_PREFILL),
        NODE_EXIT_OK);
    assert_int_equal(w.n_threads, 5);
    assert_ptr_equal(w.ops, kern_ops_cpu());
    assert_string_equal(w.host, "127.0.0.1");
    assert_int_equal(w.port, 0);
    assert_int_equal(strncmp(w.id, "prefill-", 8), 0);
    assert_null(w.model); /* nothing loaded yet */
    node_worker_close(&w);
}

static void families(void *arg, tdm_prom_t *p)
{
    int *calls = arg;

    (*calls)++;
    tdm_prom_counter(p, "tandem_test_things_total", "things", 7);
}

static void test_pages_carry_the_role_id_fields_and_families(void **state)
{
    node_worker_t w;
    char *body = NULL;
    int calls = 0;

    (void)state;
    memset(&w, 0, sizeof(w));
    w.role = "prefill";
    strcpy(w.id, "prefill-h-1-2");

    assert_int_equal(
        node_worker_render(&w, NODE_HTTP_HEALTH, 0, "\"queued_jobs\":3", families, &calls, &body),
        TDM_HTTP_UNAVAILABLE);
    assert_string_equal(body,
                        "{\"status\":\"starting\",\"role\":\"prefill\",\"id\":\"prefill-h-1-2\","
                        "\"steps_completed\":0,\"pending_work\":0,\"queued_jobs\":3}\n");
    free(body);
    assert_int_equal(
        node_worker_render(&w, NODE_HTTP_HEALTH, 1, "\"queued_jobs\":3", families, &calls, &body),
        TDM_HTTP_OK);
    assert_non_null(strstr(body, "{\"status\":\"ok\","));
    free(body);
    assert_int_equal(calls, 0); /* /health renders no families */

    assert_int_equal(node_worker_render(&w, NODE_HTTP_METRICS, 0, "", families, &calls, &body),
                     TDM_HTTP_OK);
    assert_int_equal(calls, 1);
    assert_non_null(strstr(body, "# TYPE tandem_test_things_total counter\n"));
    assert_non_null(strstr(body, "tandem_test_things_total 7\n"));
    free(body);
}

/* Register.transports (issue 16): the lane classes of --transports / UCX_TLS, limited by
 * --require-transport; never self or local staging copies. */
static int declares(const node_xfer_transports_t *t, const char *name)
{
    for (uint32_t i = 0; i < t->n_names; i++) {
        if (strcmp(t->names[i], name) == 0) {
            return 1;
        }
    }
    return 0;
}

static void test_transports_declared_from_the_transfer_flags(void **state)
{
    node_xfer_transports_t t;
    xfer_lane_mask_t rc_only = XFER_LANE_BIT(XFER_LANE_RC);

    (void)state;
    node_xfer_transports("tcp", 0, &t);
    assert_int_equal(t.n_names, 1);
    assert_true(declares(&t, "tcp"));
    node_xfer_transports("sysv,posix,cma,self", 0, &t);
    assert_int_equal(t.n_names, 1);
    assert_true(declares(&t, "shm"));
    node_xfer_transports("rc_mlx5,cuda_copy,cuda_ipc,gdr_copy", 0, &t);
    assert_int_equal(t.n_names, 2);
    assert_true(declares(&t, "rc") && declares(&t, "cuda_ipc"));
    node_xfer_transports("^tcp", 0, &t);
    assert_false(declares(&t, "tcp"));
    assert_true(declares(&t, "shm") && declares(&t, "rc"));
    node_xfer_transports("sm,ib", 0, &t);
    assert_true(declares(&t, "shm") && declares(&t, "rc") && declares(&t, "ud"));
    node_xfer_transports("tcp,some_future_tl", 0, &t); /* kept as written */
    assert_true(declares(&t, "tcp") && declares(&t, "some_future_tl"));
    node_xfer_transports("all", rc_only, &t);
    assert_int_equal(t.n_names, 1);
    assert_true(declares(&t, "rc"));
    unsetenv("UCX_TLS");
    node_xfer_transports(NULL, 0, &t); /* UCX's choice: every peer class */
    assert_true(declares(&t, "tcp") && declares(&t, "shm"));
    assert_false(declares(&t, "self"));
    setenv("UCX_TLS", "shm", 1);
    node_xfer_transports(NULL, 0, &t);
    assert_int_equal(t.n_names, 1);
    assert_true(declares(&t, "shm"));
    unsetenv("UCX_TLS");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_transports_declared_from_the_transfer_flags),
        cmocka_unit_test(test_shared_and_own_flags_land_in_the_worker_config),
        cmocka_unit_test(test_bad_or_missing_flags_are_usage_errors),
        cmocka_unit_test(test_too_many_own_flags_is_a_usage_error),
        cmocka_unit_test(test_open_checks_http_and_transport_before_the_model),
        cmocka_unit_test(test_pages_carry_the_role_id_fields_and_families),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
