/* test_cluster_worker_links.c - a real tandem-decode given two router endpoints, one of them dead
 * (issue 18 item 3, node/node_link.h): it registers with the live tandem-router all the same,
 * serves two turns of a session through it (the second continues the KV it holds: no state
 * lost), and its /metrics say it links to two routers of which one accepts it. Processes on
 * loopback (tiny preset); no tandem local, so the worker's --router list is the test's. */
#define T_MODEL_PREFIX "wlinks"
#include "test_cluster_harness.h"

#define WL_DEADLINE_MS 60000u

#define WL_LONG_TOKENS 8000 /* a turn long enough to be cut by the router's death */

static pid_t g_pids[3];

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
    for (int i = 0; i < 3; i++) {
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

static pid_t spawn_router(unsigned http_port, unsigned control_port)
{
    char http[64], control[64], lpt[16];
    char *argv[] = {
        "tandem-router",          "--model", g_model,       "--http", http, "--control", control,
        "--local-prefill-tokens", lpt,       "--log-level", "error",  NULL};

    snprintf(http, sizeof(http), "127.0.0.1:%u", http_port);
    snprintf(control, sizeof(control), "tcp://127.0.0.1:%u", control_port);
    snprintf(lpt, sizeof(lpt), "%d", T_THRESHOLD);
    return spawn(argv);
}

/* Router A is SIGKILLed while the decode node generates a long turn A sent: the node ends that
 * turn (nobody reads it) once A's connection has been down past A's heartbeat timeout, so the
 * session is free for router B's next turn within seconds, not when the orphan turn would have
 * run out. */
static void test_a_dead_routers_running_turn_ends_and_frees_its_session(void **state)
{
    unsigned http_a = unused_port(), control_a = unused_port();
    unsigned http_b = unused_port(), control_b = unused_port(), worker_port = unused_port();
    char routers[128], whttp[64], ids[256];
    char *resp = malloc(T_BODY), *body_long, *body_next;
    cluster_t via_a;
    uint64_t t_kill;
    double freed_ms, aborts;
    long status = 0;
    int fd, status_a = 0;

    (void)state;
    assert_non_null(resp);
    snprintf(routers, sizeof(routers), "tcp://127.0.0.1:%u,tcp://127.0.0.1:%u", control_a,
             control_b);
    snprintf(whttp, sizeof(whttp), "127.0.0.1:%u", worker_port);
    g_pids[0] = spawn_router(http_a, control_a);
    g_pids[2] = spawn_router(http_b, control_b);
    {
        char *argv[] = {"tandem-decode", "--model",     g_model,     "--router", routers,
                        "--http",        whttp,         "--threads", "1",        "--pages",
                        "1024",          "--log-level", "error",     NULL};
        g_pids[1] = spawn(argv);
    }
    assert_true(await_health(http_a, "\"decode\":1", WL_DEADLINE_MS, resp) >= 0);
    assert_true(await_health(http_b, "\"decode\":1", WL_DEADLINE_MS, resp) >= 0);
    assert_true(await_metric(worker_port, "tandem_worker_routers_registered", 2, 10000) == 2);

    /* a long turn through A, running on the node */
    make_ids(ids, sizeof(ids), 16, 5, 3);
    body_long = completion_body(ids, WL_LONG_TOKENS);
    memset(&via_a, 0, sizeof(via_a));
    via_a.http_port = http_a;
    fd = cluster_leaving_client(&via_a, "mid-turn", body_long);
    assert_true(await_metric(worker_port, "tandem_decode_running_sequences", 1, 20000) == 1);

    assert_int_equal(kill(g_pids[0], SIGKILL), 0);
    waitpid(g_pids[0], &status_a, 0);
    g_pids[0] = 0;
    t_kill = tdm_clock_now_ns();
    close(fd);

    /* B's turn of the same session: refused "busy" while the orphan runs, then served */
    body_next = completion_body(ids, 4);
    while (tdm_clock_elapsed_ms(t_kill) < 30000) {
        status = http(http_b, "/v1/completions", body_next, "mid-turn", 0, 30000, resp);
        if (status == 200) {
            break;
        }
    }
    freed_ms = (double)tdm_clock_elapsed_ms(t_kill);
    aborts = metric(worker_port, "tandem_decode_aborts_total");
    print_message("router A killed mid-turn: session served by B after %.0f ms; decode node "
                  "aborts %.0f; generated %.0f tokens\n",
                  freed_ms, aborts, metric(worker_port, "tandem_decode_generated_tokens_total"));
    assert_int_equal(status, 200);
    assert_true(aborts >= 1); /* the orphan turn was ended, not run out */
    assert_true(metric(worker_port, "tandem_decode_generated_tokens_total") < WL_LONG_TOKENS);
    assert_true(metric(worker_port, "tandem_worker_routers_registered") == 1);
    free(body_long);
    free(body_next);
    free(resp);
    stop_all(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_a_dead_router_endpoint_does_not_keep_the_worker_from_serving,
                                  stop_all),
        cmocka_unit_test_teardown(test_a_dead_routers_running_turn_ends_and_frees_its_session,
                                  stop_all),
    };

    return cmocka_run_group_tests(tests, setup_models, teardown_models) == 0 ? 0 : 1;
}
