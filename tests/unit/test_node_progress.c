/* test_node_progress.c - liveness from progress (node/node_progress.h, issue 16 item 4): the
 * stall rule on explicit clock values, then a worker whose compute thread wedges with work
 * pending while its link's I/O thread keeps heart-beating: the heartbeats' Load says stalled (a
 * fake router on loopback receives them) and /health answers 503 with the reason; once the
 * thread moves again both clear. Waits are polls against deadlines, never sleeps. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <zmq.h>

#include "common/clock.h"
#include "common/http_status.h"
#include "node/node_link.h"
#include "node/node_progress.h"
#include "node/node_worker.h"
#include "proto/proto.h"

#define STALL_MS    200u
#define DEADLINE_MS 20000u

static void test_stall_needs_pending_work_and_no_step_for_the_limit(void **state)
{
    node_progress_t p;
    node_progress_view_t v;
    uint64_t t0;

    (void)state;
    node_progress_init(&p, STALL_MS);
    t0 = atomic_load(&p.last_step_ns);
    node_progress_read(&p, t0 + 3600 * TDM_NS_PER_S, &v);
    assert_false(v.stalled); /* idle for an hour: no work, no stall */
    assert_int_equal(v.steps_completed, 0);

    node_progress_step(&p, 2);
    t0 = atomic_load(&p.last_step_ns);
    node_progress_read(&p, t0 + (STALL_MS - 1) * TDM_NS_PER_MS, &v);
    assert_int_equal(v.steps_completed, 1);
    assert_int_equal(v.pending_work, 2);
    assert_false(v.stalled);
    node_progress_read(&p, t0 + STALL_MS * TDM_NS_PER_MS, &v);
    assert_true(v.stalled);
    assert_int_equal(v.since_step_ms, STALL_MS);

    /* messages the compute thread has not taken are pending work too */
    node_progress_step(&p, 0);
    t0 = atomic_load(&p.last_step_ns);
    node_progress_inbox(&p, 1);
    node_progress_read(&p, t0 + STALL_MS * TDM_NS_PER_MS, &v);
    assert_int_equal(v.pending_work, 1);
    assert_true(v.stalled);
    node_progress_inbox(&p, -1);
    node_progress_read(&p, t0 + STALL_MS * TDM_NS_PER_MS, &v);
    assert_false(v.stalled);

    /* a tick inside a long step counts as progress and keeps the pending work */
    node_progress_step(&p, 3);
    t0 = atomic_load(&p.last_step_ns);
    node_progress_read(&p, t0 + STALL_MS * TDM_NS_PER_MS, &v);
    assert_true(v.stalled);
    node_progress_tick(&p);
    node_progress_tick(NULL);
    assert_true(atomic_load(&p.last_step_ns) >= t0);
    node_progress_read(&p, atomic_load(&p.last_step_ns), &v);
    assert_false(v.stalled);
    assert_int_equal(v.pending_work, 3);
    assert_int_equal(v.steps_completed, 4);

    /* a clock read before the last step never underflows; 0 turns the check off */
    node_progress_step(&p, 5);
    node_progress_read(&p, 0, &v);
    assert_int_equal(v.since_step_ms, 0);
    node_progress_init(&p, 0);
    node_progress_step(&p, 5);
    node_progress_read(&p, UINT64_MAX, &v);
    assert_false(v.stalled);
    assert_false(v.draining);
    node_progress_set_draining(&p);
    node_progress_read(&p, 0, &v);
    assert_true(v.draining);
}

/* ---- a fake router that acknowledges the registration and keeps the last Load ------------- */

typedef struct {
    void *zctx;
    void *sock;
    char endpoint[128];
    pthread_t thread;
    pthread_mutex_t lock;
    atomic_int stop;
    int n_heartbeats;
    int n_registers;
    atomic_int forget; /* answer the next heartbeat with ERROR_NOT_REGISTERED (a restart) */
    Tandem__Load last; /* scalars only */
} fake_router_t;

static void *router_main(void *arg)
{
    fake_router_t *r = arg;

    while (!atomic_load(&r->stop)) {
        zmq_pollitem_t item = {r->sock, 0, ZMQ_POLLIN, 0};
        zmq_msg_t id, body;
        Tandem__Envelope *env = NULL;

        if (zmq_poll(&item, 1, 20) <= 0) {
            continue;
        }
        zmq_msg_init(&id);
        zmq_msg_init(&body);
        if (zmq_msg_recv(&id, r->sock, 0) < 0 || zmq_msg_recv(&body, r->sock, 0) < 0) {
            zmq_msg_close(&id);
            zmq_msg_close(&body);
            continue;
        }
        if (proto_unpack(zmq_msg_data(&body), zmq_msg_size(&body), 0, &env, NULL, 0) == TDM_OK) {
            if (env->body_case == TANDEM__ENVELOPE__BODY_HEARTBEAT &&
                atomic_exchange(&r->forget, 0)) {
                Tandem__Envelope out = TANDEM__ENVELOPE__INIT;
                Tandem__Error e = TANDEM__ERROR__INIT;
                uint8_t *buf = NULL;
                size_t n = 0;

                e.code = TANDEM__ERROR_CODE__ERROR_NOT_REGISTERED;
                e.message = (char *)"unknown worker";
                out.body_case = TANDEM__ENVELOPE__BODY_ERROR;
                out.error = &e;
                if (proto_pack(&out, &buf, &n) == TDM_OK) {
                    zmq_send(r->sock, zmq_msg_data(&id), zmq_msg_size(&id), ZMQ_SNDMORE);
                    zmq_send(r->sock, buf, n, 0);
                    free(buf);
                }
            } else if (env->body_case == TANDEM__ENVELOPE__BODY_REGISTER) {
                Tandem__Envelope out = TANDEM__ENVELOPE__INIT;
                Tandem__RegisterAck ack = TANDEM__REGISTER_ACK__INIT;
                uint8_t *buf = NULL;
                size_t n = 0;

                pthread_mutex_lock(&r->lock);
                r->n_registers++;
                pthread_mutex_unlock(&r->lock);
                ack.accepted = 1;
                ack.heartbeat_interval_ms = 20;
                ack.heartbeat_timeout_ms = 1000;
                ack.router_id = (char *)"fake";
                out.body_case = TANDEM__ENVELOPE__BODY_REGISTER_ACK;
                out.register_ack = &ack;
                if (proto_pack(&out, &buf, &n) == TDM_OK) {
                    zmq_send(r->sock, zmq_msg_data(&id), zmq_msg_size(&id), ZMQ_SNDMORE);
                    zmq_send(r->sock, buf, n, 0);
                    free(buf);
                }
            } else if (env->body_case == TANDEM__ENVELOPE__BODY_HEARTBEAT &&
                       env->heartbeat->load != NULL) {
                pthread_mutex_lock(&r->lock);
                r->last = *env->heartbeat->load;
                r->n_heartbeats++;
                pthread_mutex_unlock(&r->lock);
            }
            proto_envelope_free(env);
        }
        zmq_msg_close(&id);
        zmq_msg_close(&body);
    }
    return NULL;
}

static void router_start(fake_router_t *r)
{
    size_t n = sizeof(r->endpoint);
    int zero = 0;

    memset(r, 0, sizeof(*r));
    pthread_mutex_init(&r->lock, NULL);
    r->zctx = zmq_ctx_new();
    r->sock = zmq_socket(r->zctx, ZMQ_ROUTER);
    assert_non_null(r->sock);
    assert_int_equal(zmq_setsockopt(r->sock, ZMQ_LINGER, &zero, sizeof(zero)), 0);
    assert_int_equal(zmq_bind(r->sock, "tcp://127.0.0.1:*"), 0);
    assert_int_equal(zmq_getsockopt(r->sock, ZMQ_LAST_ENDPOINT, r->endpoint, &n), 0);
    assert_int_equal(pthread_create(&r->thread, NULL, router_main, r), 0);
}

static void router_stop(fake_router_t *r)
{
    atomic_store(&r->stop, 1);
    pthread_join(r->thread, NULL);
    zmq_close(r->sock);
    zmq_ctx_term(r->zctx);
    pthread_mutex_destroy(&r->lock);
}

/* ---- a compute thread that wedges on request ------------------------------------------------ */

typedef struct {
    node_progress_t *progress;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int wedge; /* set: take one unit of work and block until cleared */
    int stop;
} compute_t;

static void *compute_main(void *arg)
{
    compute_t *c = arg;

    pthread_mutex_lock(&c->lock);
    while (!c->stop) {
        struct timespec ts;

        if (c->wedge) {
            node_progress_step(c->progress, 1); /* took a request ... */
            while (c->wedge && !c->stop) {      /* ... and its step never ends */
                pthread_cond_wait(&c->cond, &c->lock);
            }
            continue;
        }
        pthread_mutex_unlock(&c->lock);
        node_progress_step(c->progress, 0); /* an idle pass */
        ts.tv_sec = 0;
        ts.tv_nsec = 5 * 1000 * 1000;
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&c->lock);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

static void set_wedge(compute_t *c, int wedge)
{
    pthread_mutex_lock(&c->lock);
    c->wedge = wedge;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
}

/* The last heartbeat's stalled flag, once `want` shows up after `after` heartbeats. */
static int await_load_stalled(fake_router_t *r, int want, Tandem__Load *load_out)
{
    uint64_t t0 = tdm_clock_now_ns();

    while (tdm_clock_elapsed_ms(t0) < DEADLINE_MS) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        int ok;

        pthread_mutex_lock(&r->lock);
        ok = r->n_heartbeats > 0 && (r->last.stalled != 0) == want;
        *load_out = r->last;
        pthread_mutex_unlock(&r->lock);
        if (ok) {
            return 1;
        }
        nanosleep(&ts, NULL);
    }
    return 0;
}

/* A worker's own /metrics families: none here. */
static void no_families(void *arg, tdm_prom_t *p)
{
    (void)arg;
    (void)p;
}

/* Wait for a heartbeat whose Load says draining. */
static int await_load_draining(fake_router_t *r)
{
    uint64_t t0 = tdm_clock_now_ns();

    while (tdm_clock_elapsed_ms(t0) < DEADLINE_MS) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        int draining;

        pthread_mutex_lock(&r->lock);
        draining = r->last.draining != 0;
        pthread_mutex_unlock(&r->lock);
        if (draining) {
            return 1;
        }
        nanosleep(&ts, NULL);
    }
    return 0;
}

/* Poll /health's page (node_worker_render) until it answers `want`; returns its body. */
static char *await_health(const node_worker_t *w, int want)
{
    uint64_t t0 = tdm_clock_now_ns();
    char *body = NULL;

    while (tdm_clock_elapsed_ms(t0) < DEADLINE_MS) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        int code;

        free(body);
        body = NULL;
        code = node_worker_render(w, NODE_HTTP_HEALTH, 1, "\"x\":1", NULL, NULL, &body);
        if (code == want) {
            return body;
        }
        nanosleep(&ts, NULL);
    }
    free(body);
    fail_msg("/health never answered %d", want);
    return NULL;
}

static void test_wedged_compute_thread_is_stalled_in_heartbeats_and_health(void **state)
{
    static node_worker_cfg_t cfg;
    static node_worker_t w;
    fake_router_t router;
    compute_t compute;
    pthread_t thread;
    node_link_params_t lp;
    node_link_t *link = NULL;
    Tandem__Load load;
    char err[256] = "";
    char *body;

    (void)state;
    router_start(&router);
    memset(&cfg, 0, sizeof(cfg));
    cfg.stall_timeout_ms = STALL_MS;
    memset(&w, 0, sizeof(w));
    w.cfg = &cfg;
    w.role = "decode";
    snprintf(w.id, sizeof(w.id), "decode-test-progress");
    node_progress_init(&w.progress, cfg.stall_timeout_ms);

    memset(&lp, 0, sizeof(lp));
    lp.router_endpoint = router.endpoint;
    lp.role = TANDEM__ROLE__ROLE_DECODE;
    lp.incarnation_id = w.id;
    lp.rack = "rack0";
    lp.node = "127.0.0.1";
    lp.http_endpoint = "127.0.0.1:1";
    lp.register_timeout_ms = 5000;
    lp.progress = &w.progress;
    assert_int_equal(node_link_create(&lp, &link, err, sizeof(err)), TDM_OK);

    memset(&compute, 0, sizeof(compute));
    compute.progress = &w.progress;
    pthread_mutex_init(&compute.lock, NULL);
    pthread_cond_init(&compute.cond, NULL);
    assert_int_equal(pthread_create(&thread, NULL, compute_main, &compute), 0);

    /* a live thread: healthy, not stalled, steps counting */
    body = await_health(&w, TDM_HTTP_OK);
    assert_non_null(strstr(body, "\"status\":\"ok\""));
    free(body);
    assert_true(await_load_stalled(&router, 0, &load));

    /* wedged with work pending: the I/O thread still beats, and says so */
    set_wedge(&compute, 1);
    assert_true(await_load_stalled(&router, 1, &load));
    assert_true(load.pending_work >= 1);
    assert_true(load.steps_completed >= 1);
    body = await_health(&w, TDM_HTTP_UNAVAILABLE);
    assert_non_null(strstr(body, "\"status\":\"stalled\""));
    free(body);
    assert_int_equal(node_worker_render(&w, NODE_HTTP_METRICS, 1, "", no_families, NULL, &body),
                     TDM_HTTP_OK);
    assert_non_null(strstr(body, "\ntandem_worker_stalled 1\n"));
    assert_non_null(strstr(body, "\ntandem_worker_pending_work 1\n"));
    assert_non_null(strstr(body, "# TYPE tandem_worker_compute_steps_total counter\n"));
    free(body);
    body = await_health(&w, TDM_HTTP_UNAVAILABLE);
    assert_non_null(strstr(body, "no compute step for"));
    assert_non_null(strstr(body, "\"x\":1"));
    free(body);

    /* moving again: both clear */
    set_wedge(&compute, 0);
    body = await_health(&w, TDM_HTTP_OK);
    free(body);
    assert_true(await_load_stalled(&router, 0, &load));

    /* draining: heartbeats say so; /health stays 200 (alive, finishing) and says "draining" */
    node_progress_set_draining(&w.progress);
    body = await_health(&w, TDM_HTTP_OK);
    assert_non_null(strstr(body, "\"status\":\"draining\""));
    free(body);
    assert_true(await_load_draining(&router));

    pthread_mutex_lock(&compute.lock);
    compute.stop = 1;
    pthread_cond_broadcast(&compute.cond);
    pthread_mutex_unlock(&compute.lock);
    pthread_join(thread, NULL);
    pthread_mutex_destroy(&compute.lock);
    pthread_cond_destroy(&compute.cond);
    node_link_destroy(link, "test done");
    router_stop(&router);
}

/* A router that forgets the worker (restarted, or declared it lost): the link registers again,
 * counts it, and voids the work of the old registration (its lease epoch ends), so a decode node
 * lapses the reservations the old router made and a prefill node's jobs stop putting. */
static void test_router_restart_registers_again_and_voids_old_work(void **state)
{
    static node_worker_cfg_t cfg;
    static node_worker_t w;
    fake_router_t router;
    node_link_params_t lp;
    node_link_t *link = NULL;
    char err[256] = "";
    int n_registers = 0;

    (void)state;
    router_start(&router);
    memset(&cfg, 0, sizeof(cfg));
    memset(&w, 0, sizeof(w));
    w.cfg = &cfg;
    node_progress_init(&w.progress, 0);
    memset(&lp, 0, sizeof(lp));
    lp.router_endpoint = router.endpoint;
    lp.role = TANDEM__ROLE__ROLE_PREFILL;
    lp.incarnation_id = "prefill-test-restart";
    lp.rack = "rack0";
    lp.node = "127.0.0.1";
    lp.http_endpoint = "127.0.0.1:1";
    lp.register_timeout_ms = 5000;
    lp.progress = &w.progress;
    assert_int_equal(node_link_create(&lp, &link, err, sizeof(err)), TDM_OK);
    assert_int_equal(node_link_registrations(link), 0);
    assert_true(node_link_lease_valid(link, 0)); /* work of the first registration may go on */

    atomic_store(&router.forget, 1);
    for (int i = 0; i < 500 && (node_link_registrations(link) == 0 || n_registers < 2); i++) {
        nanosleep(&(struct timespec){0, 10000000}, NULL);
        pthread_mutex_lock(&router.lock);
        n_registers = router.n_registers;
        pthread_mutex_unlock(&router.lock);
    }
    assert_int_equal(node_link_registrations(link), 1);
    assert_int_equal(n_registers, 2);             /* it registered again */
    assert_false(node_link_lease_valid(link, 0)); /* the old registration's work is void */

    node_link_destroy(link, "test done");
    router_stop(&router);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stall_needs_pending_work_and_no_step_for_the_limit),
        cmocka_unit_test(test_wedged_compute_thread_is_stalled_in_heartbeats_and_health),
        cmocka_unit_test(test_router_restart_registers_again_and_voids_old_work),
    };

    return cmocka_run_group_tests(tests, NULL, NULL) == 0 ? 0 : 1;
}
