/* test_node_security.c - a worker's side of issue 16's security: its HTTP port serves only
 * GET /health and GET /metrics (any other path 404, whatever the method; another method on those
 * two 405) and closes a silent connection after its timeout; its control link joins a router
 * that runs CurveZMQ only with an allowed key pair and the router's public key (node_link_create
 * against an in-process router). Waits are polls with deadlines. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <zmq.h>

#include "common/clock.h"
#include "common/curve.h"
#include "common/log.h"
#include "node/node_http.h"
#include "node/node_link.h"
#include "router/router.h"

#define PATH_BYTES 2048

static int render(void *arg, node_http_page_t page, char **body_out)
{
    (void)arg;
    *body_out = strdup(page == NODE_HTTP_HEALTH ? "{\"status\":\"ok\"}" : "# metrics\n");
    return 200;
}

static int connect_raw(uint16_t port)
{
    struct sockaddr_in addr;
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    assert_true(fd >= 0);
    memset(&addr, 0, sizeof(addr));
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    return fd;
}

/* Send `request`, read until the server closes or limit_ms; the status code (0: none). */
static int exchange(uint16_t port, const char *request, long limit_ms)
{
    char reply[4096];
    size_t n = 0;
    uint64_t end = tdm_clock_now_ns() + (uint64_t)limit_ms * TDM_NS_PER_MS;
    int fd = connect_raw(port);
    int status = 0;

    assert_int_equal(send(fd, request, strlen(request), MSG_NOSIGNAL), (ssize_t)strlen(request));
    while (tdm_clock_now_ns() < end && n + 1 < sizeof(reply)) {
        struct pollfd pfd = {fd, POLLIN, 0};
        ssize_t got;
        if (poll(&pfd, 1, 20) <= 0) {
            continue;
        }
        got = recv(fd, reply + n, sizeof(reply) - 1 - n, 0);
        if (got <= 0) {
            break;
        }
        n += (size_t)got;
    }
    reply[n] = '\0';
    close(fd);
    if (strncmp(reply, "HTTP/1.1 ", 9) == 0) {
        status = atoi(reply + 9);
    }
    return status;
}

static void test_worker_http_serves_only_health_and_metrics(void **state)
{
    node_http_t *http = NULL;
    uint16_t port;

    (void)state;
    assert_int_equal(node_http_create("127.0.0.1", 0, 0, render, NULL, &http), TDM_ERR_INVALID_ARG);
    assert_int_equal(node_http_create("127.0.0.1", 0, 5, render, NULL, &http), TDM_OK);
    port = node_http_port(http);
    assert_int_equal(
        exchange(port, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 3000), 200);
    assert_int_equal(
        exchange(port, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 3000), 200);
    /* The old endpoint answered 405 to any POST: now every other path is simply not there. */
    assert_int_equal(exchange(port,
                              "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                              "Connection: close\r\nContent-Length: 2\r\n\r\n{}",
                              3000),
                     404);
    assert_int_equal(
        exchange(port, "DELETE /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 3000),
        404);
    assert_int_equal(
        exchange(port, "GET /debug HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 3000), 404);
    assert_int_equal(exchange(port,
                              "POST /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                              "Content-Length: 0\r\n\r\n",
                              3000),
                     405);
    node_http_destroy(http);
}

static void test_worker_http_closes_a_silent_connection(void **state)
{
    node_http_t *http = NULL;
    uint64_t t0;
    long ms = -1;
    int fd;

    (void)state;
    assert_int_equal(node_http_create("127.0.0.1", 0, 1, render, NULL, &http), TDM_OK);
    fd = connect_raw(node_http_port(http));
    assert_int_equal(send(fd, "GET /hea", 8, MSG_NOSIGNAL), 8);
    t0 = tdm_clock_now_ns();
    while (tdm_clock_now_ns() - t0 < 6000 * TDM_NS_PER_MS) {
        struct pollfd pfd = {fd, POLLIN, 0};
        char buf[256];
        if (poll(&pfd, 1, 20) > 0 && recv(fd, buf, sizeof(buf), 0) <= 0) {
            ms = (long)((tdm_clock_now_ns() - t0) / TDM_NS_PER_MS);
            break;
        }
    }
    close(fd);
    print_message("worker http: silent connection closed after %ld ms\n", ms);
    assert_true(ms >= 0);
    node_http_destroy(http);
}

/* ---- CurveZMQ on the control link ------------------------------------------------------- */

static void write_pair(const char *dir, const char *name, tdm_curve_keypair_t *keys)
{
    char path[PATH_BYTES];

    memset(keys, 0, sizeof(*keys));
    assert_int_equal(zmq_curve_keypair(keys->public_z85, keys->secret_z85), 0);
    snprintf(path, sizeof(path), "%s/%s.key", dir, name);
    assert_int_equal(tdm_curve_keyfile_write(path, keys, 1), TDM_OK);
    snprintf(path, sizeof(path), "%s/%s.pub", dir, name);
    assert_int_equal(tdm_curve_keyfile_write(path, keys, 0), TDM_OK);
}

static tdm_status_t join(const router_t *router, const char *id, const char *key,
                         const char *router_key, char *err, size_t err_bytes)
{
    const proto_compat_t *compat = router_model_compat(router_model(router));
    node_link_params_t lp;
    node_link_t *link = NULL;
    tdm_status_t status;

    memset(&lp, 0, sizeof(lp));
    lp.router_endpoint = router_control_endpoint_bound(router);
    lp.role = TANDEM__ROLE__ROLE_DECODE;
    lp.incarnation_id = id;
    lp.rack = "rack0";
    lp.node = "localhost";
    lp.model_fingerprint = compat->model_fingerprint;
    lp.weights_digest = compat->weights_digest; /* the handshake checks both (issue 16) */
    lp.kv_layout = compat->kv_layout;
    lp.page_bytes = compat->page_bytes;
    lp.tokens_per_block = compat->tokens_per_block;
    lp.max_context = compat->max_context;
    lp.total_pages = 64;
    lp.max_sequences = 4;
    lp.max_batch_tokens = 64;
    lp.http_endpoint = "127.0.0.1:1";
    lp.register_timeout_ms = 1500;
    lp.curve_key = key;
    lp.curve_router_key = router_key;
    status = node_link_create(&lp, &link, err, err_bytes);
    node_link_destroy(link, "test over");
    return status;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");

    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_curve_key_files_parse_and_refuse_malformed_ones(void **state)
{
    const char *tmp = getenv("TANDEM_TEST_TMP");
    static const char K1[] = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7";
    static const char K2[] = "#q:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"; /* starts with '#' */
    char path[PATH_BYTES];
    char text[512];
    char err[256];
    char(*keys)[TDM_CURVE_Z85_CHARS + 1] = NULL;
    size_t n = 0;
    tdm_curve_keypair_t kp;

    (void)state;
    if (tmp == NULL) {
        skip();
    }
    assert_true(tdm_curve_key_ok(K1));
    assert_false(tdm_curve_key_ok("short"));
    assert_false(tdm_curve_key_ok("rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf\""));
    snprintf(path, sizeof(path), "%s/curve-list", tmp);
    snprintf(text, sizeof(text),
             "# workers of rack 0\n\n%s\r\ncurve\n    public-key = \"%s\"\n"
             "    secret-key = \"%s\"\n",
             K1, K2, K1);
    write_text(path, text);
    assert_int_equal(tdm_curve_allowlist_load(path, &keys, &n, err, sizeof(err)), TDM_OK);
    assert_int_equal(n, 2);
    assert_string_equal(keys[0], K1);
    assert_string_equal(keys[1], K2);
    free(keys);
    write_text(path, "# nothing here\n");
    assert_int_equal(tdm_curve_allowlist_load(path, &keys, &n, err, sizeof(err)), TDM_ERR_FORMAT);
    snprintf(text, sizeof(text), "%s\nnot a key\n", K1);
    write_text(path, text);
    assert_int_equal(tdm_curve_allowlist_load(path, &keys, &n, err, sizeof(err)), TDM_ERR_FORMAT);
    assert_non_null(strstr(err, "line 2"));
    snprintf(path, sizeof(path), "%s/curve-key", tmp);
    write_text(path, "curve\n    secret-key = \"rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7\"\n");
    assert_int_equal(tdm_curve_keyfile_load(path, &kp, err, sizeof(err)), TDM_ERR_FORMAT);
    write_text(path, "curve\n    public-key = \"tooshort\"\n");
    assert_int_equal(tdm_curve_keyfile_load(path, &kp, err, sizeof(err)), TDM_ERR_FORMAT);
    snprintf(path, sizeof(path), "%s/curve-none", tmp);
    unlink(path);
    assert_int_equal(tdm_curve_keyfile_load(path, &kp, err, sizeof(err)), TDM_ERR_NOT_FOUND);
    memset(&kp, 0, sizeof(kp));
    snprintf(kp.public_z85, sizeof(kp.public_z85), "%s", K1);
    assert_int_equal(tdm_curve_keyfile_write(path, &kp, 1), TDM_ERR_INVALID_ARG); /* no secret */
}

static void test_control_link_joins_a_curve_router_only_with_an_allowed_key(void **state)
{
    const char *bin = getenv("TANDEM_BIN_DIR");
    const char *tmp = getenv("TANDEM_TEST_TMP");
    char model_dir[PATH_BYTES];
    char command[PATH_BYTES * 3];
    char router_key[PATH_BYTES];
    char router_pub[PATH_BYTES];
    char good_key[PATH_BYTES];
    char bad_key[PATH_BYTES];
    char list_path[PATH_BYTES];
    char err[512] = "";
    tdm_curve_keypair_t r_keys;
    tdm_curve_keypair_t good;
    tdm_curve_keypair_t bad;
    router_params_t params;
    router_t *router = NULL;
    FILE *list;
    int rc;

    (void)state;
    if (bin == NULL || tmp == NULL) {
        skip();
    }
    if (!zmq_has("curve")) {
        skip(); /* libzmq without libsodium */
    }
    snprintf(model_dir, sizeof(model_dir), "%s/router-model", tmp);
    snprintf(command, sizeof(command),
             "[ %s/config.json -nt %s/tandem-mkmodel ] || %s/tandem-mkmodel --log-level warn "
             "--preset tiny --seed 1 --out %s >/dev/null",
             model_dir, bin, bin, model_dir);
    rc = system(command);
    assert_true(WIFEXITED(rc) && WEXITSTATUS(rc) == 0);
    write_pair(tmp, "link-router", &r_keys);
    write_pair(tmp, "link-good", &good);
    write_pair(tmp, "link-bad", &bad);
    snprintf(router_key, sizeof(router_key), "%s/link-router.key", tmp);
    snprintf(router_pub, sizeof(router_pub), "%s/link-router.pub", tmp);
    snprintf(good_key, sizeof(good_key), "%s/link-good.key", tmp);
    snprintf(bad_key, sizeof(bad_key), "%s/link-bad.key", tmp);
    snprintf(list_path, sizeof(list_path), "%s/link-workers", tmp);
    list = fopen(list_path, "w");
    assert_non_null(list);
    fprintf(list, "curve\n    public-key = \"%s\"\n", good.public_z85);
    fclose(list);

    router_params_default(&params);
    params.model.model_dir = model_dir;
    params.http.host = "127.0.0.1";
    params.http.port = 0;
    params.control.endpoint = "tcp://127.0.0.1:*";
    params.control.curve_secret_key = router_key;
    params.control.curve_workers = list_path;
    assert_int_equal(router_create(&params, &router, err, sizeof(err)), TDM_OK);

    assert_int_equal(join(router, "decode-good", good_key, router_pub, err, sizeof(err)), TDM_OK);
    assert_int_equal(join(router, "decode-bad", bad_key, router_pub, err, sizeof(err)),
                     TDM_ERR_TIMEOUT);
    assert_non_null(strstr(err, "CurveZMQ"));
    assert_int_equal(join(router, "decode-plain", NULL, NULL, err, sizeof(err)), TDM_ERR_TIMEOUT);
    /* Right key pair, wrong router key: the handshake cannot complete either. */
    assert_int_equal(join(router, "decode-wrong-server", good_key, good_key, err, sizeof(err)),
                     TDM_ERR_TIMEOUT);
    assert_int_equal(join(router, "decode-half", good_key, NULL, err, sizeof(err)),
                     TDM_ERR_INVALID_ARG);
    assert_int_equal(join(router, "decode-pub-only", router_pub, router_pub, err, sizeof(err)),
                     TDM_ERR_FORMAT);
    router_destroy(router);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worker_http_serves_only_health_and_metrics),
        cmocka_unit_test(test_worker_http_closes_a_silent_connection),
        cmocka_unit_test(test_curve_key_files_parse_and_refuse_malformed_ones),
        cmocka_unit_test(test_control_link_joins_a_curve_router_only_with_an_allowed_key),
    };

    tdm_log_set_level(TDM_LOG_ERROR);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
