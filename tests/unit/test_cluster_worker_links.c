/* test_cluster_worker_links.c - a real tandem-decode given two router endpoints, one of them dead
 * (issue 18 item 3, node/node_link.h): it registers with the live tandem-router all the same,
 * serves two turns of a session through it (the second continues the KV it holds: no state
 * lost), and its /metrics say it links to two routers of which one accepts it. Processes on
 * loopback (tiny preset); no tandem local, so the worker's --router list is the test's. */
#define T_MODEL_PREFIX "wlinks"
#include "test_cluster_harness.h"

#define WL_DEADLINE_MS 60000u

static pid_t g_pids[2];

/* A loopback TCP port nothing listens on right now (bound once, then closed). */
static unsigned unused_port(void)
{
    struct sockaddr_in a;
    socklen_t n = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    unsigned port = 0;

    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &n) == 0) {
        port = ntohs(a.sin_port);
    }
    if (fd >= 0) {
        close(fd);
    }
    assert_true(port > 0);
    return port;
}

static pid_t spawn(char *const argv[])
{
    char exe[T_PATH + 32];
    pid_t pid;

    snprintf(exe, sizeof(exe), "%s/%s", g_bin, argv[0]);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (freopen("/dev/null", "w", stdout) == NULL) {
            _exit(126);
        }
        execv(exe, argv);
        _exit(127);
    }
    return pid;
}

static int stop_all(void **state)
{
    (void)state;
    for (int i = 0; i < 2; i++) {
        if (g_pids[i] > 0) {
            int status = 0;

            kill(g_pids[i], SIGTERM);
            waitpid(g_pids[i], &status, 0);
            g_pids[i] = 0;
        }
    }
    return 0;
}

static void test_a_dead_router_endpoint_does_not_keep_the_worker_from_serving(void **state)
{
    unsigned http_port = unused_port(), control_port = unused_port();
    unsigned dead_port = unused_port(), worker_port = unused_port();
    char http[64], control[64], routers[128], whttp[64], lpt[16];
    char *resp = malloc(T_BODY);
    char *t1, *t2;

    (void)state;
    assert_non_null(resp);
    snprintf(http, sizeof(http), "127.0.0.1:%u", http_port);
    snprintf(control, sizeof(control), "tcp://127.0.0.1:%u", control_port);
    snprintf(routers, sizeof(routers), "tcp://127.0.0.1:%u,%s", dead_port, control);
    snprintf(whttp, sizeof(whttp), "127.0.0.1:%u", worker_port);
    snprintf(lpt, sizeof(lpt), "%d", T_THRESHOLD);
    {
        char *argv[] = {"tandem-router",
                        "--model",
                        g_model,
                        "--http",
                        http,
                        "--control",
                        control,
                        "--local-prefill-tokens",
                        lpt,
                        "--log-level",
                        "warn",
                        NULL};
        g_pids[0] = spawn(argv);
    }
    {
        char *argv[] = {"tandem-decode", "--model",     g_model,     "--router", routers,
                        "--http",        whttp,         "--threads", "1",        "--pages",
                        "1024",          "--log-level", "warn",      NULL};
        g_pids[1] = spawn(argv);
    }
    /* registered with the live router although the first endpoint never answers */
    assert_true(await_health(http_port, "\"decode\":1", WL_DEADLINE_MS, resp) >= 0);
    assert_true(await_metric(worker_port, "tandem_worker_routers", 2, 10000) == 2);
    assert_true(await_metric(worker_port, "tandem_worker_routers_registered", 1, 10000) == 1);

    /* it serves: two turns of one session, the second on the KV the first left */
    two_turns(http_port, "links-1", 20, 6, &t1, &t2);
    assert_true(strlen(t1) > 0);
    assert_true(strlen(t2) > 0);
    assert_true(metric(worker_port, "tandem_decode_state_lost_total") == 0);
    assert_true(metric(worker_port, "tandem_decode_requests_total") >= 2);
    assert_true(metric(worker_port, "tandem_worker_routers_registered") == 1);
    free(t1);
    free(t2);
    free(resp);
    stop_all(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_a_dead_router_endpoint_does_not_keep_the_worker_from_serving,
                                  stop_all),
    };

    return cmocka_run_group_tests(tests, setup_models, teardown_models) == 0 ? 0 : 1;
}
