/* test_router_peers.c - two routers of one fleet in process (router/peers.h, issue 18 item 3),
 * their control planes secured with CurveZMQ (one key pair shared by both, a fake decode worker
 * on the allow-list): after a turn served by router A, router B holds the session's replica
 * (tandem_router_replicas_applied_total, its session count), sent over a CURVE link; a plain
 * (unauthenticated) client that claims to be a peer is not heard. */
#include <arpa/inet.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/curve.h"
#include "router/peers.h"
#include "router_http_util.h"
#include "router_test_util.h"
#include "test_router_fake.h"

static long http(int port, const char *path, const char *body, const char *session, char *out)
{
    return rhu_http(port, path, body, session, 30000, out);
}

static double metric(int port, const char *name)
{
    return rhu_metric(port, name);
}

static int free_port(void)
{
    struct sockaddr_in a;
    socklen_t n = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int port = 0;

    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &n) == 0) {
        port = ntohs(a.sin_port);
    }
    close(fd);
    return port;
}

static router_t *start_router(const char *model_dir, const char *id, const char *control,
                              const char *peers, const char *key_file, const char *allow_file)
{
    router_params_t params;
    router_t *r = NULL;
    char err[512] = "";

    router_params_default(&params);
    params.model.model_dir = model_dir;
    params.model.served_name = "tiny";
    params.http.host = "127.0.0.1";
    params.http.port = 0;
    params.http.turn.timeout_ms = 10000;
    params.control.endpoint = control;
    params.control.heartbeat_interval_ms = 50;
    params.control.heartbeat_timeout_ms = 1000;
    params.control.router_id = id;
    params.control.peers = peers;
    params.control.curve_secret_key = key_file;
    params.control.curve_workers = allow_file;
    if (router_create(&params, &r, err, sizeof(err)) != TDM_OK) {
        print_message("router %s: %s\n", id, err);
        return NULL;
    }
    return r;
}

static void test_replica_reaches_the_peer_over_curve(void **state)
{
    const char *bin = getenv("TANDEM_BIN_DIR");
    const char *tmp = getenv("TANDEM_TEST_TMP");
    char model_dir[1024], key_file[1100], allow_file[1100], command[4096];
    char ctl_a[64], ctl_b[64], peers[256];
    static char resp[65536];
    tdm_curve_keypair_t router_keys, worker_keys;
    fake_worker_t w;
    router_t *a;
    router_t *b;
    int port_a;
    int port_b;
    FILE *f;
    double applied = 0;

    (void)state;
    assert_non_null(bin);
    assert_non_null(tmp);
    snprintf(model_dir, sizeof(model_dir), "%s/router-peers", tmp);
    snprintf(command, sizeof(command),
             "[ %s/config.json -nt %s/tandem-mkmodel ] || %s/tandem-mkmodel --log-level warn "
             "--preset tiny --seed 1 --out %s >/dev/null",
             model_dir, bin, bin, model_dir);
    assert_int_equal(rtu_run_shell(command), 0);
    assert_int_equal(zmq_curve_keypair(router_keys.public_z85, router_keys.secret_z85), 0);
    assert_int_equal(zmq_curve_keypair(worker_keys.public_z85, worker_keys.secret_z85), 0);
    snprintf(key_file, sizeof(key_file), "%s/router-peers.key", tmp);
    snprintf(allow_file, sizeof(allow_file), "%s/router-peers.workers", tmp);
    assert_int_equal(tdm_curve_keyfile_write(key_file, &router_keys, 1), TDM_OK);
    f = fopen(allow_file, "w");
    assert_non_null(f);
    fprintf(f, "%s\n", worker_keys.public_z85);
    fclose(f);
    /* the two control ports are picked before either router binds (each lists the other):
     * another test may take one meanwhile, so a failed start picks again */
    a = NULL;
    b = NULL;
    for (int attempt = 0; attempt < 5 && (a == NULL || b == NULL); attempt++) {
        router_destroy(a);
        a = NULL;
        snprintf(ctl_a, sizeof(ctl_a), "tcp://127.0.0.1:%d", free_port());
        snprintf(ctl_b, sizeof(ctl_b), "tcp://127.0.0.1:%d", free_port());
        snprintf(peers, sizeof(peers), "ra=%s,rb=%s", ctl_a, ctl_b);
        a = start_router(model_dir, "ra", ctl_a, peers, key_file, allow_file);
        b = a != NULL ? start_router(model_dir, "rb", ctl_b, peers, key_file, allow_file) : NULL;
    }
    assert_non_null(a);
    assert_non_null(b);
    port_a = router_http_port_bound(a);
    port_b = router_http_port_bound(b);

    fake_init(&w, "decode-peers", TANDEM__ROLE__ROLE_DECODE, "",
              router_model_compat(router_model(a)), router_control_endpoint_bound(a));
    memcpy(w.curve_server, router_keys.public_z85, sizeof(w.curve_server));
    memcpy(w.curve_public, worker_keys.public_z85, sizeof(w.curve_public));
    memcpy(w.curve_secret, worker_keys.secret_z85, sizeof(w.curve_secret));
    w.script[0] = 40;
    w.script[1] = 41;
    w.n_script = 2;
    fake_start(&w);
    assert_int_equal(fake_wait_registered(&w, 5000), 1);
    zmq_poll(NULL, 0, 200);

    assert_int_equal(http(port_a, "/v1/completions",
                          "{\"model\":\"tiny\",\"prompt\":[5,6,7,8,9],\"max_tokens\":2}", "shared",
                          resp),
                     200);
    for (int i = 0; i < 150 && applied < 1; i++) {
        applied = metric(port_b, "tandem_router_replicas_applied_total");
        zmq_poll(NULL, 0, 20);
    }
    print_message("router B applied %.0f replicas; router A sent %.0f, failed %.0f\n", applied,
                  metric(port_a, "tandem_router_replicas_sent_total"),
                  metric(port_a, "tandem_router_replica_send_failures_total"));
    assert_true(applied == 1);
    {
        fake_record_t r;
        assert_int_equal(fake_n_records(&w, TANDEM__ENVELOPE__BODY_DECODE_REQUEST), 1);
        assert_true(fake_last(&w, TANDEM__ENVELOPE__BODY_DECODE_REQUEST, &r));
        assert_string_equal(r.session_id, "shared");
        /* at most the release's own abort: when the client's response completes before the
         * dispatcher has seen the worker's Finish, router_dispatch_release aborts the worker
         * with "output complete" (a benign race; test_router_relearn says the same) */
        assert_true(fake_n_aborts(&w) <= 1);
    }
    assert_true(metric(port_a, "tandem_router_replicas_sent_total") == 1);
    assert_int_equal(http(port_b, "/health", NULL, NULL, resp), 503); /* no worker on B */
    assert_non_null(strstr(resp, "\"sessions\":1"));

    {
        /* a plain client claiming to be a peer never completes the CURVE handshake */
        Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
        Tandem__SessionReplica rep = TANDEM__SESSION_REPLICA__INIT;
        int32_t ids[2] = {5, 6};
        void *ctx = zmq_ctx_new();
        void *sock = zmq_socket(ctx, ZMQ_DEALER);
        int zero = 0;
        uint8_t *buf;
        size_t n;
        rep.session_id = "forged";
        rep.tokens = ids;
        rep.n_tokens = 2;
        env.body_case = TANDEM__ENVELOPE__BODY_SESSION_REPLICA;
        env.session_replica = &rep;
        assert_int_equal(proto_pack(&env, &buf, &n), TDM_OK);
        zmq_setsockopt(sock, ZMQ_ROUTING_ID, "peer:ra", 7);
        zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof(zero));
        assert_int_equal(zmq_connect(sock, ctl_b), 0);
        zmq_send(sock, buf, n, ZMQ_DONTWAIT);
        free(buf);
        zmq_poll(NULL, 0, 300);
        assert_true(metric(port_b, "tandem_router_replicas_applied_total") == 1);
        zmq_close(sock);
        zmq_ctx_term(ctx);
    }
    fake_kill(&w);
    fake_fini(&w);
    router_destroy(a);
    router_destroy(b);
    memset(&router_keys, 0, sizeof(router_keys));
    memset(&worker_keys, 0, sizeof(worker_keys));
}

static void test_peers_list_is_checked(void **state)
{
    void *ctx = zmq_ctx_new();
    router_peers_t *p = NULL;
    char err[512];
    int self = -1;
    const char *owner;

    (void)state;
    /* this router's own entry is skipped: every router takes the same list */
    assert_int_equal(router_peers_create(ctx, "r0", "r0=tcp://127.0.0.1:1,r1=tcp://127.0.0.1:2",
                                         NULL, &p, err, sizeof(err)),
                     TDM_OK);
    assert_int_equal(router_peers_count(p), 1);
    owner = router_peers_owner(p, "some-session", &self);
    assert_true(strcmp(owner, "r0") == 0 || strcmp(owner, "r1") == 0);
    assert_int_equal(self, strcmp(owner, "r0") == 0);
    router_peers_destroy(p);
    assert_int_equal(router_peers_create(ctx, "r0", NULL, NULL, &p, err, sizeof(err)), TDM_OK);
    assert_int_equal(router_peers_count(p), 0);
    router_peers_destroy(p);
    assert_int_equal(router_peers_create(ctx, "r0", "r1", NULL, &p, err, sizeof(err)),
                     TDM_ERR_INVALID_ARG);
    print_message("bad entry: %s\n", err);
    assert_non_null(strstr(err, "ID=ENDPOINT"));
    assert_int_equal(router_peers_create(ctx, "r0", "r1=tcp://127.0.0.1:2,r1=tcp://127.0.0.1:3",
                                         NULL, &p, err, sizeof(err)),
                     TDM_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "repeated"));
    assert_int_equal(router_peers_create(ctx, "r0", "r1=nonsense://x", NULL, &p, err, sizeof(err)),
                     TDM_ERR_INVALID_ARG);
    print_message("bad endpoint: %s\n", err);
    zmq_ctx_term(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_peers_list_is_checked),
        cmocka_unit_test(test_replica_reaches_the_peer_over_curve),
    };
    curl_global_init(CURL_GLOBAL_DEFAULT);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
