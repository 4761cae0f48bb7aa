/* test_node_link.c - a worker's control links to several routers (node/node_link.h, issue 18
 * item 3), against fake routers (ZeroMQ ROUTER sockets in this process): a dead router endpoint
 * does not keep the worker from registering with, serving and beating to the live one; answers
 * go back to the router that asked (request_id, query_id) and the rest to every router; a router
 * that comes up late is registered with (backoff) without counting as a re-registration; a
 * router that forgets the worker voids only its own work (per-router lease epochs); the held
 * sessions the owner publishes ride the heartbeats in order, cut at the cap; a PageReservation
 * dropped unsent comes back to the owner as an Abort with writer_fenced. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <zmq.h>

#include "common/clock.h"
#include "node/node_link.h"
#include "proto/proto.h"

#define DEADLINE_MS  10000u
#define MAX_RECORDED 512
#define MAX_PENDING  16
#define WORKER_ID    "decode-test-links"

/* ---- a fake router ---------------------------------------------------------------------- */

typedef struct {
    Tandem__Envelope__BodyCase body;
    uint64_t key; /* request_id / query_id (0: none) */
} recorded_t;

typedef struct {
    void *zctx;
    void *sock;
    char endpoint[64];
    pthread_t thread;
    atomic_int stop;
    pthread_mutex_t lock;
    int n_registers;
    int n_heartbeats;
    atomic_int forget; /* answer the next heartbeat with ERROR_NOT_REGISTERED */
    atomic_int deaf;   /* leave Register unanswered (the worker stays unregistered) */
    recorded_t recorded[MAX_RECORDED];
    int n_recorded;
    uint64_t *last_keys; /* the last heartbeat's Load.resident_session_keys */
    uint64_t *last_lens;
    size_t n_last_keys;
    uint8_t *pending[MAX_PENDING]; /* packed envelopes for the worker */
    size_t n_pending_bytes[MAX_PENDING];
    int n_pending;
} fake_router_t;

static uint64_t key_of(const Tandem__Envelope *env)
{
    switch (env->body_case) {
    case TANDEM__ENVELOPE__BODY_ABORT_ACK:
        return env->abort_ack->request_id;
    case TANDEM__ENVELOPE__BODY_TOKEN_CHUNK:
        return env->token_chunk->request_id;
    case TANDEM__ENVELOPE__BODY_ERROR:
        return env->error->request_id;
    case TANDEM__ENVELOPE__BODY_SESSION_HISTORY:
        return env->session_history->query_id;
    case TANDEM__ENVELOPE__BODY_PAGE_RESERVATION:
        return env->page_reservation->request_id;
    default:
        return 0;
    }
}

static void reply(fake_router_t *r, zmq_msg_t *id, const Tandem__Envelope *out)
{
    uint8_t *buf = NULL;
    size_t n = 0;

    if (proto_pack(out, &buf, &n) == TDM_OK) {
        zmq_send(r->sock, zmq_msg_data(id), zmq_msg_size(id), ZMQ_SNDMORE);
        zmq_send(r->sock, buf, n, 0);
        free(buf);
    }
}

static void on_envelope(fake_router_t *r, zmq_msg_t *id, const Tandem__Envelope *env)
{
    if (env->body_case == TANDEM__ENVELOPE__BODY_REGISTER && atomic_load(&r->deaf)) {
        pthread_mutex_lock(&r->lock);
        r->n_registers++;
        pthread_mutex_unlock(&r->lock);
    } else if (env->body_case == TANDEM__ENVELOPE__BODY_REGISTER) {
        Tandem__Envelope out = TANDEM__ENVELOPE__INIT;
        Tandem__RegisterAck ack = TANDEM__REGISTER_ACK__INIT;

        pthread_mutex_lock(&r->lock);
        r->n_registers++;
        pthread_mutex_unlock(&r->lock);
        ack.accepted = 1;
        ack.heartbeat_interval_ms = 20;
        ack.heartbeat_timeout_ms = 2000;
        ack.router_id = (char *)"fake";
        out.body_case = TANDEM__ENVELOPE__BODY_REGISTER_ACK;
        out.register_ack = &ack;
        reply(r, id, &out);
    } else if (env->body_case == TANDEM__ENVELOPE__BODY_HEARTBEAT &&
               atomic_exchange(&r->forget, 0)) {
        Tandem__Envelope out = TANDEM__ENVELOPE__INIT;
        Tandem__Error e = TANDEM__ERROR__INIT;

        e.code = TANDEM__ERROR_CODE__ERROR_NOT_REGISTERED;
        e.message = (char *)"unknown worker";
        out.body_case = TANDEM__ENVELOPE__BODY_ERROR;
        out.error = &e;
        reply(r, id, &out);
    } else if (env->body_case == TANDEM__ENVELOPE__BODY_HEARTBEAT) {
        const Tandem__Load *load = env->heartbeat->load;

        pthread_mutex_lock(&r->lock);
        r->n_heartbeats++;
        if (load != NULL) {
            free(r->last_keys);
            free(r->last_lens);
            r->n_last_keys = load->n_resident_session_keys;
            r->last_keys = calloc(r->n_last_keys + 1, sizeof(uint64_t));
            r->last_lens = calloc(r->n_last_keys + 1, sizeof(uint64_t));
            if (r->last_keys != NULL && r->last_lens != NULL && r->n_last_keys > 0) {
                memcpy(r->last_keys, load->resident_session_keys,
                       r->n_last_keys * sizeof(uint64_t));
                memcpy(r->last_lens, load->resident_cached_lens, r->n_last_keys * sizeof(uint64_t));
            }
        }
        pthread_mutex_unlock(&r->lock);
    } else {
        pthread_mutex_lock(&r->lock);
        if (r->n_recorded < MAX_RECORDED) {
            r->recorded[r->n_recorded].body = env->body_case;
            r->recorded[r->n_recorded].key = key_of(env);
            r->n_recorded++;
        }
        pthread_mutex_unlock(&r->lock);
    }
}

static void *router_main(void *arg)
{
    fake_router_t *r = arg;

    while (!atomic_load(&r->stop)) {
        zmq_pollitem_t item = {r->sock, 0, ZMQ_POLLIN, 0};
        zmq_msg_t id, body;
        Tandem__Envelope *env = NULL;

        pthread_mutex_lock(&r->lock);
        for (int i = 0; i < r->n_pending; i++) {
            zmq_send(r->sock, WORKER_ID, strlen(WORKER_ID), ZMQ_SNDMORE);
            zmq_send(r->sock, r->pending[i], r->n_pending_bytes[i], 0);
            free(r->pending[i]);
        }
        r->n_pending = 0;
        pthread_mutex_unlock(&r->lock);
        if (zmq_poll(&item, 1, 10) <= 0) {
            continue;
        }
        zmq_msg_init(&id);
        zmq_msg_init(&body);
        if (zmq_msg_recv(&id, r->sock, 0) >= 0 && zmq_msg_recv(&body, r->sock, 0) >= 0 &&
            proto_unpack(zmq_msg_data(&body), zmq_msg_size(&body), 0, &env, NULL, 0) == TDM_OK) {
            on_envelope(r, &id, env);
            proto_envelope_free(env);
        }
        zmq_msg_close(&id);
        zmq_msg_close(&body);
    }
    return NULL;
}

/* Start a fake router on `endpoint` (tcp://127.0.0.1:* for any port). */
static void router_start(fake_router_t *r, const char *endpoint)
{
    size_t n = sizeof(r->endpoint);
    int zero = 0;

    memset(r, 0, sizeof(*r));
    pthread_mutex_init(&r->lock, NULL);
    r->zctx = zmq_ctx_new();
    r->sock = zmq_socket(r->zctx, ZMQ_ROUTER);
    assert_non_null(r->sock);
    assert_int_equal(zmq_setsockopt(r->sock, ZMQ_LINGER, &zero, sizeof(zero)), 0);
    assert_int_equal(zmq_bind(r->sock, endpoint), 0);
    assert_int_equal(zmq_getsockopt(r->sock, ZMQ_LAST_ENDPOINT, r->endpoint, &n), 0);
    assert_int_equal(pthread_create(&r->thread, NULL, router_main, r), 0);
}

static void router_stop(fake_router_t *r)
{
    atomic_store(&r->stop, 1);
    pthread_join(r->thread, NULL);
    zmq_close(r->sock);
    zmq_ctx_term(r->zctx);
    for (int i = 0; i < r->n_pending; i++) {
        free(r->pending[i]);
    }
    free(r->last_keys);
    free(r->last_lens);
    pthread_mutex_destroy(&r->lock);
}

/* Queue `env` for the worker (the router thread sends it). */
static void router_send(fake_router_t *r, const Tandem__Envelope *env)
{
    pthread_mutex_lock(&r->lock);
    assert_true(r->n_pending < MAX_PENDING);
    assert_int_equal(proto_pack(env, &r->pending[r->n_pending], &r->n_pending_bytes[r->n_pending]),
                     TDM_OK);
    r->n_pending++;
    pthread_mutex_unlock(&r->lock);
}

/* How many messages of `body` with `key` the router got. */
static int router_count(fake_router_t *r, Tandem__Envelope__BodyCase body, uint64_t key)
{
    int n = 0;

    pthread_mutex_lock(&r->lock);
    for (int i = 0; i < r->n_recorded; i++) {
        n += r->recorded[i].body == body && r->recorded[i].key == key;
    }
    pthread_mutex_unlock(&r->lock);
    return n;
}

static int router_field(fake_router_t *r, const int *field)
{
    int v;

    pthread_mutex_lock(&r->lock);
    v = *field;
    pthread_mutex_unlock(&r->lock);
    return v;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000 * 1000};
    nanosleep(&ts, NULL);
}

/* Wait until router r got `want` messages of `body` with `key`. */
static int await_count(fake_router_t *r, Tandem__Envelope__BodyCase body, uint64_t key, int want)
{
    uint64_t t0 = tdm_clock_now_ns();

    while (tdm_clock_elapsed_ms(t0) < DEADLINE_MS) {
        if (router_count(r, body, key) >= want) {
            return 1;
        }
        sleep_ms(5);
    }
    return 0;
}

/* A tcp endpoint on 127.0.0.1 that nothing listens on (bound once, then closed). */
static void free_endpoint(char *endpoint, size_t n_bytes)
{
    void *ctx = zmq_ctx_new();
    void *sock = zmq_socket(ctx, ZMQ_ROUTER);
    size_t n = n_bytes;
    int zero = 0;

    assert_non_null(sock);
    assert_int_equal(zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof(zero)), 0);
    assert_int_equal(zmq_bind(sock, "tcp://127.0.0.1:*"), 0);
    assert_int_equal(zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, endpoint, &n), 0);
    zmq_close(sock);
    zmq_ctx_term(ctx);
}

static tdm_status_t open_link(const char *endpoints, node_link_t **link_out)
{
    node_link_params_t lp;
    char err[256] = "";
    tdm_status_t status;

    memset(&lp, 0, sizeof(lp));
    lp.router_endpoint = endpoints;
    lp.role = TANDEM__ROLE__ROLE_DECODE;
    lp.incarnation_id = WORKER_ID;
    lp.rack = "rack0";
    lp.node = "127.0.0.1";
    lp.http_endpoint = "127.0.0.1:1";
    lp.register_timeout_ms = 5000;
    status = node_link_create(&lp, link_out, err, sizeof(err));
    if (status != TDM_OK) {
        print_message("node_link_create: %s\n", err);
    }
    return status;
}

/* The next envelope from any router (fails the test after the deadline). */
static Tandem__Envelope *recv_one(node_link_t *link)
{
    Tandem__Envelope *env = NULL;

    assert_int_equal(node_link_recv(link, DEADLINE_MS, &env), TDM_OK);
    return env;
}

static int await_registered(node_link_t *link, uint32_t want)
{
    uint64_t t0 = tdm_clock_now_ns();

    while (tdm_clock_elapsed_ms(t0) < DEADLINE_MS) {
        if (node_link_n_registered(link) == want) {
            return 1;
        }
        sleep_ms(5);
    }
    return 0;
}

static void send_abort(fake_router_t *r, uint64_t request_id)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__Abort a = TANDEM__ABORT__INIT;

    a.request_id = request_id;
    a.reason = (char *)"test";
    env.body_case = TANDEM__ENVELOPE__BODY_ABORT;
    env.abort = &a;
    router_send(r, &env);
}

static void answer_abort(node_link_t *link, uint64_t request_id)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__AbortAck ack = TANDEM__ABORT_ACK__INIT;

    ack.request_id = request_id;
    env.body_case = TANDEM__ENVELOPE__BODY_ABORT_ACK;
    env.abort_ack = &ack;
    assert_int_equal(node_link_send(link, &env), TDM_OK);
}

/* ---- tests ------------------------------------------------------------------------------- */

static void test_a_bad_endpoint_list_is_refused(void **state)
{
    node_link_t *link = NULL;
    char many[NODE_LINK_MAX_ROUTERS * 24 + 32] = "";

    (void)state;
    assert_int_equal(open_link("", &link), TDM_ERR_INVALID_ARG);
    assert_int_equal(open_link(",,", &link), TDM_ERR_INVALID_ARG);
    for (uint32_t i = 0; i <= NODE_LINK_MAX_ROUTERS; i++) {
        char one[32];
        snprintf(one, sizeof(one), "%stcp://127.0.0.1:%u", i > 0 ? "," : "", 1000 + i);
        strcat(many, one);
    }
    assert_int_equal(open_link(many, &link), TDM_ERR_INVALID_ARG);
    assert_null(link);
}

/* The first endpoint is dead: the worker registers with the second at once, beats to it and
 * serves what it sends; what the worker answers goes there. */
static void test_a_dead_router_does_not_stop_the_node(void **state)
{
    fake_router_t live;
    char dead[64], endpoints[160];
    node_link_t *link = NULL;
    Tandem__Envelope query = TANDEM__ENVELOPE__INIT;
    Tandem__SessionQuery q = TANDEM__SESSION_QUERY__INIT;
    Tandem__Envelope answer = TANDEM__ENVELOPE__INIT;
    Tandem__SessionHistory h = TANDEM__SESSION_HISTORY__INIT;
    Tandem__Envelope *env;
    uint64_t t0;

    (void)state;
    free_endpoint(dead, sizeof(dead));
    router_start(&live, "tcp://127.0.0.1:*");
    snprintf(endpoints, sizeof(endpoints), "%s,%s", dead, live.endpoint);
    t0 = tdm_clock_now_ns();
    assert_int_equal(open_link(endpoints, &link), TDM_OK);
    assert_true(tdm_clock_elapsed_ms(t0) < 3000); /* not held up by the dead one */
    assert_int_equal(node_link_n_routers(link), 2);
    assert_int_equal(node_link_n_registered(link), 1);

    /* heartbeats flow to the live router (20 ms apart) */
    t0 = tdm_clock_now_ns();
    while (router_field(&live, &live.n_heartbeats) < 3 && tdm_clock_elapsed_ms(t0) < DEADLINE_MS) {
        sleep_ms(5);
    }
    assert_true(router_field(&live, &live.n_heartbeats) >= 3);

    /* work from the live router is served, and answered on its link */
    q.query_id = 77;
    q.session_id = (char *)"s1";
    query.body_case = TANDEM__ENVELOPE__BODY_SESSION_QUERY;
    query.session_query = &q;
    router_send(&live, &query);
    env = recv_one(link);
    assert_int_equal(env->body_case, TANDEM__ENVELOPE__BODY_SESSION_QUERY);
    assert_int_equal(node_link_recv_router(link), 1);
    assert_int_equal(node_link_request_router(link, 77), 1);
    assert_true(node_link_lease_valid(link, node_link_recv_epoch(link)));
    assert_int_equal(node_link_recv_epoch(link) >> 48, 1); /* the epoch names its router */
    proto_envelope_free(env);
    h.query_id = 77;
    h.session_id = (char *)"s1";
    answer.body_case = TANDEM__ENVELOPE__BODY_SESSION_HISTORY;
    answer.session_history = &h;
    assert_int_equal(node_link_send(link, &answer), TDM_OK);
    assert_true(await_count(&live, TANDEM__ENVELOPE__BODY_SESSION_HISTORY, 77, 1));

    /* an answer to a request the link never saw goes to every router: the live one gets it */
    answer_abort(link, 999);
    assert_true(await_count(&live, TANDEM__ENVELOPE__BODY_ABORT_ACK, 999, 1));
    assert_int_equal(node_link_request_router(link, 999), -1);

    node_link_destroy(link, "test done");
    router_stop(&live);
}

/* Two live routers: each one's requests are answered on its own link; the rest reaches both. */
static void test_answers_go_back_to_the_router_that_asked(void **state)
{
    fake_router_t a, b;
    char endpoints[160];
    node_link_t *link = NULL;
    Tandem__Envelope err_env = TANDEM__ENVELOPE__INIT;
    Tandem__Error e = TANDEM__ERROR__INIT;

    (void)state;
    router_start(&a, "tcp://127.0.0.1:*");
    router_start(&b, "tcp://127.0.0.1:*");
    snprintf(endpoints, sizeof(endpoints), "%s,%s", a.endpoint, b.endpoint);
    assert_int_equal(open_link(endpoints, &link), TDM_OK);
    assert_true(await_registered(link, 2));
    assert_int_equal(router_field(&a, &a.n_registers), 1);
    assert_int_equal(router_field(&b, &b.n_registers), 1);

    send_abort(&a, 11);
    send_abort(&b, 22);
    for (int i = 0; i < 2; i++) {
        Tandem__Envelope *env = recv_one(link);
        uint64_t id = env->abort->request_id;

        assert_int_equal(env->body_case, TANDEM__ENVELOPE__BODY_ABORT);
        assert_int_equal(node_link_recv_router(link), id == 11 ? 0 : 1);
        proto_envelope_free(env);
    }
    answer_abort(link, 22);
    answer_abort(link, 11);
    e.code = TANDEM__ERROR_CODE__ERROR_INTERNAL;
    e.message = (char *)"for everyone";
    err_env.body_case = TANDEM__ENVELOPE__BODY_ERROR;
    err_env.error = &e;
    assert_int_equal(node_link_send(link, &err_env), TDM_OK);
    assert_true(await_count(&a, TANDEM__ENVELOPE__BODY_ABORT_ACK, 11, 1));
    assert_true(await_count(&b, TANDEM__ENVELOPE__BODY_ABORT_ACK, 22, 1));
    assert_true(await_count(&a, TANDEM__ENVELOPE__BODY_ERROR, 0, 1));
    assert_true(await_count(&b, TANDEM__ENVELOPE__BODY_ERROR, 0, 1));
    sleep_ms(50); /* nothing crossed over */
    assert_int_equal(router_count(&a, TANDEM__ENVELOPE__BODY_ABORT_ACK, 22), 0);
    assert_int_equal(router_count(&b, TANDEM__ENVELOPE__BODY_ABORT_ACK, 11), 0);

    node_link_destroy(link, "test done");
    router_stop(&a);
    router_stop(&b);
}

/* A router that comes up after the worker started is registered with (Register re-sent with
 * backoff, TCP reconnects): a first registration, not a re-registration. */
static void test_a_late_router_is_registered_with(void **state)
{
    fake_router_t a, late;
    char later[64], endpoints[160];
    node_link_t *link = NULL;
    uint64_t t0;

    (void)state;
    router_start(&a, "tcp://127.0.0.1:*");
    free_endpoint(later, sizeof(later));
    snprintf(endpoints, sizeof(endpoints), "%s,%s", a.endpoint, later);
    assert_int_equal(open_link(endpoints, &link), TDM_OK);
    assert_int_equal(node_link_n_registered(link), 1);
    sleep_ms(300); /* a few backoff rounds against nothing */

    router_start(&late, later);
    assert_true(await_registered(link, 2));
    t0 = tdm_clock_now_ns();
    while (router_field(&late, &late.n_heartbeats) < 2 && tdm_clock_elapsed_ms(t0) < DEADLINE_MS) {
        sleep_ms(5);
    }
    assert_true(router_field(&late, &late.n_heartbeats) >= 2);
    assert_int_equal(node_link_registrations(link), 0);
    assert_int_equal(node_link_router_registrations(link, 1), 0);

    node_link_destroy(link, "test done");
    router_stop(&a);
    router_stop(&late);
}

/* Router B forgets the worker: the link registers with B again and voids B's work only. */
static void test_a_forgetful_router_voids_only_its_own_work(void **state)
{
    fake_router_t a, b;
    char endpoints[160];
    node_link_t *link = NULL;
    uint64_t epoch_a = 0, epoch_b = 0;
    uint64_t t0;

    (void)state;
    router_start(&a, "tcp://127.0.0.1:*");
    router_start(&b, "tcp://127.0.0.1:*");
    snprintf(endpoints, sizeof(endpoints), "%s,%s", a.endpoint, b.endpoint);
    assert_int_equal(open_link(endpoints, &link), TDM_OK);
    assert_true(await_registered(link, 2));
    send_abort(&a, 1);
    send_abort(&b, 2);
    for (int i = 0; i < 2; i++) {
        Tandem__Envelope *env = recv_one(link);

        if (env->abort->request_id == 1) {
            epoch_a = node_link_recv_epoch(link);
        } else {
            epoch_b = node_link_recv_epoch(link);
        }
        proto_envelope_free(env);
    }
    assert_true(node_link_lease_valid(link, epoch_a));
    assert_true(node_link_lease_valid(link, epoch_b));

    atomic_store(&b.forget, 1);
    t0 = tdm_clock_now_ns();
    while ((node_link_router_registrations(link, 1) == 0 || router_field(&b, &b.n_registers) < 2 ||
            node_link_n_registered(link) < 2) &&
           tdm_clock_elapsed_ms(t0) < DEADLINE_MS) {
        sleep_ms(5);
    }
    assert_int_equal(node_link_router_registrations(link, 1), 1);
    assert_int_equal(node_link_router_registrations(link, 0), 0);
    assert_int_equal(node_link_registrations(link), 1);
    assert_int_equal(router_field(&b, &b.n_registers), 2);
    assert_false(node_link_lease_valid(link, epoch_b)); /* B's old work is void */
    assert_true(node_link_lease_valid(link, epoch_a));  /* A's goes on */
    assert_false(node_link_lease_valid(link, NODE_LINK_EPOCH_VOID));

    node_link_destroy(link, "test done");
    router_stop(&a);
    router_stop(&b);
}

/* Router B dies (its socket closes): past its heartbeat timeout the link counts it as having
 * declared the worker lost (B's work void, A's not); when B comes back on its endpoint the link
 * registers with it again. */
static void test_an_unreachable_router_voids_its_work_and_is_rejoined(void **state)
{
    fake_router_t a, b;
    char endpoints[160], b_endpoint[64];
    node_link_t *link = NULL;
    uint64_t epoch_a = 0, epoch_b = 0;
    uint64_t t0;
    double lost_ms;

    (void)state;
    router_start(&a, "tcp://127.0.0.1:*");
    router_start(&b, "tcp://127.0.0.1:*");
    snprintf(b_endpoint, sizeof(b_endpoint), "%s", b.endpoint);
    snprintf(endpoints, sizeof(endpoints), "%s,%s", a.endpoint, b.endpoint);
    assert_int_equal(open_link(endpoints, &link), TDM_OK);
    assert_true(await_registered(link, 2));
    send_abort(&a, 5);
    send_abort(&b, 6);
    for (int i = 0; i < 2; i++) {
        Tandem__Envelope *env = recv_one(link);

        if (env->abort->request_id == 5) {
            epoch_a = node_link_recv_epoch(link);
        } else {
            epoch_b = node_link_recv_epoch(link);
        }
        proto_envelope_free(env);
    }

    router_stop(&b); /* like kill -9: the connection drops */
    t0 = tdm_clock_now_ns();
    while (node_link_router_registrations(link, 1) == 0 && tdm_clock_elapsed_ms(t0) < DEADLINE_MS) {
        sleep_ms(5);
    }
    lost_ms = (double)tdm_clock_elapsed_ms(t0);
    print_message("router B unreachable: its work void after %.0f ms (heartbeat timeout 2000)\n",
                  lost_ms);
    assert_int_equal(node_link_router_registrations(link, 1), 1);
    assert_true(lost_ms >= 1900); /* not before the router itself would have declared us lost */
    assert_int_equal(node_link_n_registered(link), 1);
    assert_false(node_link_lease_valid(link, epoch_b));
    assert_true(node_link_lease_valid(link, epoch_a));
    assert_int_equal(node_link_router_registrations(link, 0), 0);

    router_start(&b, b_endpoint); /* a restarted router on the same endpoint */
    assert_true(await_registered(link, 2));
    assert_int_equal(router_field(&b, &b.n_registers), 1);
    assert_int_equal(node_link_router_registrations(link, 1), 1); /* not counted twice */

    node_link_destroy(link, "test done");
    router_stop(&a);
    router_stop(&b);
}

/* The held sessions the owner publishes ride every router's heartbeats, in order, cut at the
 * cap (and pass proto's checks: the router unpacked them). */
static void test_held_sessions_ride_the_heartbeats(void **state)
{
    fake_router_t a, b;
    char endpoints[160];
    node_link_t *link = NULL;
    const uint32_t n_over = NODE_MAX_RESIDENT_SESSIONS + 5;
    uint64_t *keys = calloc(n_over, sizeof(uint64_t));
    uint64_t *lens = calloc(n_over, sizeof(uint64_t));
    uint64_t t0;

    (void)state;
    assert_non_null(keys);
    assert_non_null(lens);
    router_start(&a, "tcp://127.0.0.1:*");
    router_start(&b, "tcp://127.0.0.1:*");
    snprintf(endpoints, sizeof(endpoints), "%s,%s", a.endpoint, b.endpoint);
    assert_int_equal(open_link(endpoints, &link), TDM_OK);
    assert_true(await_registered(link, 2));
    for (uint32_t i = 0; i < n_over; i++) {
        keys[i] = 1000u + i;
        lens[i] = 64u + i;
    }
    node_link_set_resident_sessions(link, keys, lens, 3);
    for (fake_router_t *r = &a; r != NULL; r = r == &a ? &b : NULL) {
        int ok = 0;

        t0 = tdm_clock_now_ns();
        while (!ok && tdm_clock_elapsed_ms(t0) < DEADLINE_MS) {
            pthread_mutex_lock(&r->lock);
            ok = r->n_last_keys == 3 && r->last_keys[0] == 1000 && r->last_keys[2] == 1002 &&
                 r->last_lens[1] == 65;
            pthread_mutex_unlock(&r->lock);
            sleep_ms(5);
        }
        assert_true(ok);
    }
    node_link_set_resident_sessions(link, keys, lens, n_over);
    {
        int ok = 0;

        t0 = tdm_clock_now_ns();
        while (!ok && tdm_clock_elapsed_ms(t0) < DEADLINE_MS) {
            pthread_mutex_lock(&a.lock);
            ok = a.n_last_keys == NODE_MAX_RESIDENT_SESSIONS &&
                 a.last_keys[NODE_MAX_RESIDENT_SESSIONS - 1] ==
                     1000u + NODE_MAX_RESIDENT_SESSIONS - 1u;
            pthread_mutex_unlock(&a.lock);
            sleep_ms(5);
        }
        assert_true(ok);
    }
    node_link_set_resident_sessions(link, NULL, NULL, 0);
    {
        int ok = 0;

        t0 = tdm_clock_now_ns();
        while (!ok && tdm_clock_elapsed_ms(t0) < DEADLINE_MS) {
            pthread_mutex_lock(&b.lock);
            ok = b.n_last_keys == 0;
            pthread_mutex_unlock(&b.lock);
            sleep_ms(5);
        }
        assert_true(ok);
    }

    node_link_destroy(link, "test done");
    router_stop(&a);
    router_stop(&b);
    free(keys);
    free(lens);
}

/* The router forgets the worker and then leaves its Register unanswered: a PageReservation
 * the owner sends meanwhile is dropped unsent (the router no longer accepts us), so nobody ever
 * saw the reservation; the link hands the owner an Abort of it with writer_fenced (its pages go
 * back at once, as the router would answer a late one) and no request_id (a retry of the request
 * is not touched). Before the fix the reservation waited for its timeout and then its fence. */
static void test_a_reservation_dropped_unsent_is_released(void **state)
{
    fake_router_t a;
    node_link_t *link = NULL;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__PageReservation pr = TANDEM__PAGE_RESERVATION__INIT;
    Tandem__Envelope *got;
    uint64_t t0;

    (void)state;
    router_start(&a, "tcp://127.0.0.1:*");
    assert_int_equal(open_link(a.endpoint, &link), TDM_OK);
    assert_true(await_registered(link, 1));

    atomic_store(&a.deaf, 1);
    atomic_store(&a.forget, 1);
    t0 = tdm_clock_now_ns();
    while ((node_link_router_registrations(link, 0) == 0 || node_link_n_registered(link) != 0) &&
           tdm_clock_elapsed_ms(t0) < DEADLINE_MS) {
        sleep_ms(5);
    }
    assert_int_equal(node_link_router_registrations(link, 0), 1);
    assert_int_equal(node_link_n_registered(link), 0);

    pr.request_id = 7;
    pr.reservation_id = 99;
    pr.n_pages = 36;
    env.body_case = TANDEM__ENVELOPE__BODY_PAGE_RESERVATION;
    env.page_reservation = &pr;
    assert_int_equal(node_link_send(link, &env), TDM_OK);
    got = recv_one(link);
    assert_int_equal(got->body_case, TANDEM__ENVELOPE__BODY_ABORT);
    assert_int_equal(got->abort->reservation_id, 99);
    assert_int_equal(got->abort->request_id, 0);
    assert_true(got->abort->writer_fenced);
    assert_int_equal(node_link_recv_router(link), 0);
    proto_envelope_free(got);
    assert_int_equal(router_count(&a, TANDEM__ENVELOPE__BODY_PAGE_RESERVATION, 7), 0);

    /* registered again, a PageReservation goes out and nothing is released */
    atomic_store(&a.deaf, 0);
    assert_true(await_registered(link, 1));
    pr.reservation_id = 100;
    assert_int_equal(node_link_send(link, &env), TDM_OK);
    assert_true(await_count(&a, TANDEM__ENVELOPE__BODY_PAGE_RESERVATION, 7, 1));
    assert_int_equal(node_link_recv(link, 50, &got), TDM_ERR_TIMEOUT);

    node_link_destroy(link, "test done");
    router_stop(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_bad_endpoint_list_is_refused),
        cmocka_unit_test(test_a_dead_router_does_not_stop_the_node),
        cmocka_unit_test(test_answers_go_back_to_the_router_that_asked),
        cmocka_unit_test(test_a_late_router_is_registered_with),
        cmocka_unit_test(test_a_forgetful_router_voids_only_its_own_work),
        cmocka_unit_test(test_an_unreachable_router_voids_its_work_and_is_rejoined),
        cmocka_unit_test(test_held_sessions_ride_the_heartbeats),
        cmocka_unit_test(test_a_reservation_dropped_unsent_is_released),
    };

    return cmocka_run_group_tests(tests, NULL, NULL) == 0 ? 0 : 1;
}
