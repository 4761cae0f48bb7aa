/* test_router_fake.h - a fake prefill or decode worker for router tests: a thread with a
 * ZeroMQ DEALER socket (routing id = incarnation id) that speaks tandem.proto like a real node:
 * registers, heartbeats, answers ReservePages with a PageReservation, PrefillJob with a
 * CompletionNotice, and DecodeRequest by streaming a canned token script in chunks, then Finish.
 * It records what it was asked, so tests can check placement, deltas and stickiness. "Killing"
 * it stops the thread without a Goodbye, as a SIGKILL would. Header-only (static functions) so
 * each router test can include it. */
#ifndef TANDEM_TESTS_ROUTER_FAKE_H
#define TANDEM_TESTS_ROUTER_FAKE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/clock.h"
#include "kernels/kv_page.h"
#include "proto/proto.h"
#include "proto/proto_hash.h"

#define FAKE_MAX_RECORDS  64
#define FAKE_MAX_SCRIPT   256
#define FAKE_HEARTBEAT_MS 50
#define FAKE_POLL_MS      5

/* What a fake worker was asked to do (one DecodeRequest, ReservePages or PrefillJob). */
typedef struct {
    Tandem__Envelope__BodyCase type;
    uint64_t request_id;
    char session_id[PROTO_MAX_ID_BYTES + 1];
    uint64_t cached_len;
    uint64_t total_len;
    uint64_t n_delta;
    int mode; /* DecodeRequest: PREFILL_LOCAL / PREFILL_REMOTE */
    int canonical_start;
    uint32_t max_tokens;
    uint64_t seed;
    char spec[16];           /* DecodeRequest.spec ("" = the node's default drafter) */
    uint64_t reservation_id; /* PrefillJob, Abort */
    uint32_t attempt;        /* PrefillJob, Abort */
    int writer_fenced;       /* Abort */
} fake_record_t;

typedef struct {
    /* configuration (set before fake_start) */
    char id[64];
    Tandem__Role role;
    char rack[32];
    uint64_t fingerprint;
    uint64_t weights_digest;   /* from the router's compat (fake_init) */
    char kv_layout[128];       /* from the router's compat (fake_init) */
    const char *transports[4]; /* Register.transports; none: not declared */
    size_t n_transports;
    uint64_t max_tokens; /* Capacity.max_tokens; 0: not declared */
    atomic_int stalled;  /* reported in Load.stalled */
    int error_jobs;      /* prefill: answer every job with this ErrorCode (0: off) */
    uint32_t page_bytes;
    uint32_t tokens_per_block;
    uint32_t max_context;
    char endpoint[256];
    int32_t script[FAKE_MAX_SCRIPT]; /* tokens streamed for every DecodeRequest */
    size_t n_script;
    size_t chunk_tokens; /* tokens per TokenChunk */
    int hang_jobs;       /* prefill: accept jobs, never complete them */
    int ack_aborts;      /* prefill: answer an Abort of a job with AbortAck (a real node's way) */
    int late_first_reservation; /* decode: answer the first ReservePages only just before the
                                   next one's answer (a node that was slow to reserve) */
    size_t hold_after;          /* decode: stream this many tokens, then wait for Abort (0: all) */
    uint32_t decode_delay_ms; /* decode: wait this long before the first token (blocks the fake) */
    /* decode (issue 18 item 3): one session this node reports holding in
     * Load.resident_session_keys and answers SessionQuery for (resident_session "" = none) */
    char resident_session[PROTO_MAX_ID_BYTES + 1];
    int32_t resident_tokens[FAKE_MAX_SCRIPT]; /* the ids it holds KV of: [0, n_resident) */
    size_t n_resident;
    uint32_t resident_tenant;
    int ignore_queries;    /* leave SessionQuery unanswered */
    atomic_int n_queries;  /* SessionQuery received */
    uint64_t resident_key; /* heartbeat scratch (the fake's thread only) */
    uint64_t resident_len;
    char curve_server[41]; /* CurveZMQ: the router's public key (Z85); "" = plain TCP */
    char curve_public[41]; /* CurveZMQ: this fake's key pair (Z85) */
    char curve_secret[41];
    /* state */
    pthread_t thread;
    atomic_int stop;
    atomic_int registered; /* 0 waiting, 1 accepted, -1 refused */
    atomic_int draining;   /* decode: answer DecodeRequest/ReservePages with ERROR_DRAINING
                              (recorded first); its heartbeats do not say so */
    char refuse_reason[512];
    pthread_mutex_t lock;
    fake_record_t records[FAKE_MAX_RECORDS];
    int n_records;
    int n_aborts;
    uint64_t next_reservation;
    Tandem__PageReservation held; /* late_first_reservation: the answer held back */
    int holding;
} fake_worker_t;

static void fake_send(void *sock, const Tandem__Envelope *env)
{
    uint8_t *buf;
    size_t n;

    if (proto_pack(env, &buf, &n) == TDM_OK) {
        zmq_send(sock, buf, n, 0);
        free(buf);
    }
}

static void fake_register(fake_worker_t *w, void *sock)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__Register reg = TANDEM__REGISTER__INIT;
    Tandem__PageFormat pf = TANDEM__PAGE_FORMAT__INIT;
    Tandem__Capacity cap = TANDEM__CAPACITY__INIT;
    char *kv[2] = {PROTO_KV_FORMAT_MAIN, PROTO_KV_FORMAT_INDEX};

    pf.version = KERN_KV_PAGE_VERSION;
    pf.rows_per_page = KERN_KV_PAGE_ROWS;
    pf.page_bytes = w->page_bytes;
    pf.tokens_per_block = w->tokens_per_block;
    cap.total_pages = w->role == TANDEM__ROLE__ROLE_DECODE ? 1000 : 0;
    cap.max_sequences = 8;
    cap.max_tokens = w->max_tokens;
    reg.weights_digest = w->weights_digest;
    reg.kv_layout = w->kv_layout;
    reg.transports = (char **)w->transports;
    reg.n_transports = w->n_transports;
    reg.role = w->role;
    reg.incarnation_id = w->id;
    reg.rack = w->rack;
    reg.node = "localhost";
    reg.model_fingerprint = w->fingerprint;
    reg.page_format = &pf;
    reg.kv_formats = kv;
    reg.n_kv_formats = 2;
    reg.max_context = w->max_context;
    reg.protocol_version = PROTO_VERSION;
    reg.capacity = &cap;
    env.body_case = TANDEM__ENVELOPE__BODY_REGISTER;
    env.register_ = &reg;
    fake_send(sock, &env);
}

static void fake_heartbeat(fake_worker_t *w, void *sock, uint64_t seq)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__Heartbeat hb = TANDEM__HEARTBEAT__INIT;
    Tandem__Load load = TANDEM__LOAD__INIT;

    load.free_pages = w->role == TANDEM__ROLE__ROLE_DECODE ? 900 : 0;
    load.total_pages = w->role == TANDEM__ROLE__ROLE_DECODE ? 1000 : 0;
    load.recent_tokens_per_s = 1000.0;
    load.stalled = atomic_load(&w->stalled) != 0;
    if (w->resident_session[0] != '\0') {
        w->resident_key = proto_session_hash(w->resident_session);
        w->resident_len = w->n_resident;
        load.resident_session_keys = &w->resident_key;
        load.n_resident_session_keys = 1;
        load.resident_cached_lens = &w->resident_len;
        load.n_resident_cached_lens = 1;
    }
    hb.seq = seq;
    hb.load = &load;
    env.body_case = TANDEM__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    fake_send(sock, &env);
}

static void fake_record(fake_worker_t *w, const fake_record_t *r)
{
    pthread_mutex_lock(&w->lock);
    if (w->n_records < FAKE_MAX_RECORDS) {
        w->records[w->n_records++] = *r;
    }
    pthread_mutex_unlock(&w->lock);
}

/* Stream the script (up to max_tokens) in chunks, then Finish. */
/* Error{ERROR_DRAINING} for request_id (a draining decode node's answer to new work). */
static void fake_refuse_draining(void *sock, uint64_t request_id)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__Error e = TANDEM__ERROR__INIT;

    e.request_id = request_id;
    e.code = TANDEM__ERROR_CODE__ERROR_DRAINING;
    e.message = (char *)"fake draining";
    env.body_case = TANDEM__ENVELOPE__BODY_ERROR;
    env.error = &e;
    fake_send(sock, &env);
}

static void fake_decode(fake_worker_t *w, void *sock, const Tandem__DecodeRequest *dr)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__TokenChunk tc = TANDEM__TOKEN_CHUNK__INIT;
    Tandem__Finish fin = TANDEM__FINISH__INIT;
    size_t n = w->n_script < dr->max_tokens ? w->n_script : dr->max_tokens;
    size_t chunk = w->chunk_tokens > 0 ? w->chunk_tokens : 1;
    int stop_token = 0;

    if (w->hold_after > 0) {
        n = w->hold_after < n ? w->hold_after : n;
    }
    if (w->decode_delay_ms > 0) {
        zmq_poll(NULL, 0, (long)w->decode_delay_ms);
    }
    for (size_t i = 0; i < n; i++) {
        for (size_t k = 0; k < dr->sampling->n_stop_token_ids; k++) {
            if (w->script[i] == dr->sampling->stop_token_ids[k]) {
                n = i + 1;
                stop_token = 1;
            }
        }
    }
    for (size_t at = 0; at < n; at += chunk) {
        tc.request_id = dr->request_id;
        tc.first_position = dr->total_len + at;
        tc.tokens = w->script + at;
        tc.n_tokens = at + chunk <= n ? chunk : n - at;
        env.body_case = TANDEM__ENVELOPE__BODY_TOKEN_CHUNK;
        env.token_chunk = &tc;
        fake_send(sock, &env);
    }
    if (w->hold_after > 0) {
        return; /* the turn stays open until the router aborts it */
    }
    fin.request_id = dr->request_id;
    fin.reason = stop_token ? TANDEM__FINISH_REASON__FINISH_STOP_TOKEN
                            : TANDEM__FINISH_REASON__FINISH_LENGTH;
    fin.n_generated = n;
    fin.cached_len = dr->total_len + (n > 0 ? n - 1 : 0);
    fin.n_prefilled = dr->mode == TANDEM__PREFILL_MODE__PREFILL_LOCAL ? dr->n_delta_tokens : 0;
    env.body_case = TANDEM__ENVELOPE__BODY_FINISH;
    env.finish = &fin;
    fake_send(sock, &env);
}

static void fake_handle(fake_worker_t *w, void *sock, const Tandem__Envelope *env)
{
    Tandem__Envelope reply = TANDEM__ENVELOPE__INIT;
    fake_record_t r;

    memset(&r, 0, sizeof(r));
    r.type = env->body_case;
    switch (env->body_case) {
    case TANDEM__ENVELOPE__BODY_REGISTER_ACK:
        if (!env->register_ack->accepted) {
            snprintf(w->refuse_reason, sizeof(w->refuse_reason), "%s", env->register_ack->reason);
        }
        atomic_store(&w->registered, env->register_ack->accepted ? 1 : -1);
        break;
    case TANDEM__ENVELOPE__BODY_ERROR:
        if (env->error->code == TANDEM__ERROR_CODE__ERROR_NOT_REGISTERED &&
            atomic_load(&w->registered) == 1) {
            fake_register(w, sock);
        }
        break;
    case TANDEM__ENVELOPE__BODY_DECODE_REQUEST: {
        const Tandem__DecodeRequest *dr = env->decode_request;
        r.request_id = dr->request_id;
        snprintf(r.session_id, sizeof(r.session_id), "%s", dr->session_id);
        r.cached_len = dr->cached_len;
        r.total_len = dr->total_len;
        r.n_delta = dr->n_delta_tokens;
        r.mode = dr->mode;
        r.canonical_start = dr->canonical_start;
        r.max_tokens = dr->max_tokens;
        r.seed = dr->sampling->seed;
        snprintf(r.spec, sizeof(r.spec), "%s", dr->spec != NULL ? dr->spec : "");
        fake_record(w, &r);
        if (atomic_load(&w->draining)) {
            fake_refuse_draining(sock, dr->request_id);
            break;
        }
        fake_decode(w, sock, dr);
        break;
    }
    case TANDEM__ENVELOPE__BODY_RESERVE_PAGES: {
        Tandem__PageReservation pr = TANDEM__PAGE_RESERVATION__INIT;
        r.request_id = env->reserve_pages->request_id;
        r.cached_len = env->reserve_pages->cached_len;
        r.total_len = env->reserve_pages->total_len;
        fake_record(w, &r);
        pr.request_id = env->reserve_pages->request_id;
        pr.reservation_id = ++w->next_reservation;
        pr.attempt = env->reserve_pages->attempt;
        pr.cached_len = env->reserve_pages->cached_len;
        pr.n_pages = 4;
        pr.descriptor.data = (uint8_t *)"fake-rkeys";
        pr.descriptor.len = 10;
        reply.body_case = TANDEM__ENVELOPE__BODY_PAGE_RESERVATION;
        if (w->late_first_reservation && w->next_reservation == 1) {
            w->held = pr; /* answered with the next one, late */
            w->holding = 1;
            break;
        }
        if (w->holding) {
            reply.page_reservation = &w->held;
            fake_send(sock, &reply);
            w->holding = 0;
        }
        reply.page_reservation = &pr;
        fake_send(sock, &reply);
        break;
    }
    case TANDEM__ENVELOPE__BODY_PREFILL_JOB: {
        const Tandem__PrefillJob *job = env->prefill_job;
        Tandem__CompletionNotice cn = TANDEM__COMPLETION_NOTICE__INIT;
        r.request_id = job->request_id;
        snprintf(r.session_id, sizeof(r.session_id), "%s", job->session_id);
        r.cached_len = job->cached_len;
        r.total_len = job->cached_len + job->n_delta_tokens;
        r.n_delta = job->n_delta_tokens;
        r.canonical_start = job->canonical_start;
        r.reservation_id = job->reservation_id;
        r.attempt = job->attempt;
        fake_record(w, &r);
        if (w->hang_jobs) {
            break;
        }
        if (w->error_jobs != 0) {
            Tandem__Error e = TANDEM__ERROR__INIT;
            e.request_id = job->request_id;
            e.code = (Tandem__ErrorCode)w->error_jobs;
            e.message = "fake prefill worker refuses the job";
            reply.body_case = TANDEM__ENVELOPE__BODY_ERROR;
            reply.error = &e;
            fake_send(sock, &reply);
            break;
        }
        cn.request_id = job->request_id;
        cn.reservation_id = job->reservation_id;
        cn.cached_len = job->cached_len;
        cn.total_len = job->cached_len + job->n_delta_tokens;
        cn.first_token = w->n_script > 0 ? w->script[0] : 0;
        reply.body_case = TANDEM__ENVELOPE__BODY_COMPLETION;
        reply.completion = &cn;
        fake_send(sock, &reply);
        break;
    }
    case TANDEM__ENVELOPE__BODY_SESSION_QUERY: {
        Tandem__SessionHistory h = TANDEM__SESSION_HISTORY__INIT;
        atomic_fetch_add(&w->n_queries, 1);
        if (w->ignore_queries) {
            break;
        }
        h.query_id = env->session_query->query_id;
        h.session_id = env->session_query->session_id;
        h.found = strcmp(w->resident_session, env->session_query->session_id) == 0;
        if (h.found) {
            h.cached_len = w->n_resident;
            h.tokens = w->resident_tokens;
            h.n_tokens = w->n_resident;
            h.tenant = w->resident_tenant;
        }
        reply.body_case = TANDEM__ENVELOPE__BODY_SESSION_HISTORY;
        reply.session_history = &h;
        fake_send(sock, &reply);
        break;
    }
    case TANDEM__ENVELOPE__BODY_ABORT: {
        Tandem__Finish fin = TANDEM__FINISH__INIT;
        r.request_id = env->abort->request_id;
        r.reservation_id = env->abort->reservation_id;
        r.attempt = env->abort->attempt;
        r.writer_fenced = env->abort->writer_fenced;
        fake_record(w, &r);
        pthread_mutex_lock(&w->lock);
        w->n_aborts++;
        pthread_mutex_unlock(&w->lock);
        if (w->ack_aborts && w->role == TANDEM__ROLE__ROLE_PREFILL) {
            Tandem__AbortAck ack = TANDEM__ABORT_ACK__INIT;
            ack.request_id = env->abort->request_id;
            ack.reservation_id = env->abort->reservation_id;
            ack.attempt = env->abort->attempt;
            reply.body_case = TANDEM__ENVELOPE__BODY_ABORT_ACK;
            reply.abort_ack = &ack;
            fake_send(sock, &reply);
            break;
        }
        fin.request_id = env->abort->request_id;
        fin.reason = TANDEM__FINISH_REASON__FINISH_ABORTED;
        reply.body_case = TANDEM__ENVELOPE__BODY_FINISH;
        reply.finish = &fin;
        fake_send(sock, &reply);
        break;
    }
    default:
        break;
    }
}

static void *fake_main(void *arg)
{
    fake_worker_t *w = arg;
    void *ctx = zmq_ctx_new();
    void *sock = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    uint64_t seq = 0;
    uint64_t next_hb_ns;

    zmq_setsockopt(sock, ZMQ_ROUTING_ID, w->id, strlen(w->id));
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof(zero));
    if (w->curve_server[0] != '\0') {
        zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, w->curve_server, 41);
        zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, w->curve_public, 41);
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, w->curve_secret, 41);
    }
    zmq_connect(sock, w->endpoint);
    fake_register(w, sock);
    next_hb_ns = tdm_clock_now_ns() + FAKE_HEARTBEAT_MS * TDM_NS_PER_MS;
    while (!atomic_load(&w->stop)) {
        zmq_pollitem_t item = {sock, 0, ZMQ_POLLIN, 0};
        zmq_poll(&item, 1, FAKE_POLL_MS);
        while (1) {
            zmq_msg_t msg;
            Tandem__Envelope *env = NULL;
            zmq_msg_init(&msg);
            if (zmq_msg_recv(&msg, sock, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&msg);
                break;
            }
            if (proto_unpack(zmq_msg_data(&msg), zmq_msg_size(&msg), 0, &env, NULL, 0) == TDM_OK) {
                fake_handle(w, sock, env);
                proto_envelope_free(env);
            }
            zmq_msg_close(&msg);
        }
        if (tdm_clock_now_ns() >= next_hb_ns && atomic_load(&w->registered) == 1) {
            fake_heartbeat(w, sock, ++seq);
            next_hb_ns = tdm_clock_now_ns() + FAKE_HEARTBEAT_MS * TDM_NS_PER_MS;
        }
    }
    zmq_close(sock);
    zmq_ctx_term(ctx);
    return NULL;
}

/* Fill a worker's identity and compatibility from the router's model. */
static void fake_init(fake_worker_t *w, const char *id, Tandem__Role role, const char *rack,
                      const proto_compat_t *compat, const char *endpoint)
{
    memset(w, 0, sizeof(*w));
    snprintf(w->id, sizeof(w->id), "%s", id);
    w->role = role;
    snprintf(w->rack, sizeof(w->rack), "%s", rack);
    w->fingerprint = compat->model_fingerprint;
    w->weights_digest = compat->weights_digest;
    snprintf(w->kv_layout, sizeof(w->kv_layout), "%s",
             compat->kv_layout != NULL ? compat->kv_layout : "");
    w->page_bytes = compat->page_bytes;
    w->tokens_per_block = compat->tokens_per_block;
    w->max_context = compat->max_context;
    snprintf(w->endpoint, sizeof(w->endpoint), "%s", endpoint);
    w->chunk_tokens = 1;
    pthread_mutex_init(&w->lock, NULL);
}

static void fake_start(fake_worker_t *w)
{
    atomic_store(&w->stop, 0);
    atomic_store(&w->registered, 0);
    pthread_create(&w->thread, NULL, fake_main, w);
}

/* Stop the thread without a goodbye (as SIGKILL would). */
static void fake_kill(fake_worker_t *w)
{
    atomic_store(&w->stop, 1);
    pthread_join(w->thread, NULL);
}

/* Poll until the router answered the registration or deadline_ms passed. */
static int fake_wait_registered(fake_worker_t *w, uint32_t deadline_ms)
{
    uint64_t end = tdm_clock_now_ns() + (uint64_t)deadline_ms * TDM_NS_PER_MS;

    while (atomic_load(&w->registered) == 0 && tdm_clock_now_ns() < end) {
        zmq_poll(NULL, 0, 2);
    }
    return atomic_load(&w->registered);
}

static int fake_n_records(fake_worker_t *w, Tandem__Envelope__BodyCase type)
{
    int n = 0;

    pthread_mutex_lock(&w->lock);
    for (int i = 0; i < w->n_records; i++) {
        n += w->records[i].type == type;
    }
    pthread_mutex_unlock(&w->lock);
    return n;
}

/* The i-th record (0: the oldest) of `type` into *out; 0 when there is none (inline: not every
 * test that includes this header uses it). */
static inline int fake_nth(fake_worker_t *w, Tandem__Envelope__BodyCase type, int i,
                           fake_record_t *out)
{
    int found = 0;

    pthread_mutex_lock(&w->lock);
    for (int k = 0; k < w->n_records && !found; k++) {
        if (w->records[k].type == type && i-- == 0) {
            *out = w->records[k];
            found = 1;
        }
    }
    pthread_mutex_unlock(&w->lock);
    return found;
}

/* The last record of `type`; 0 when there is none. */
static int fake_last(fake_worker_t *w, Tandem__Envelope__BodyCase type, fake_record_t *out)
{
    int found = 0;

    pthread_mutex_lock(&w->lock);
    for (int i = w->n_records - 1; i >= 0; i--) {
        if (w->records[i].type == type) {
            *out = w->records[i];
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&w->lock);
    return found;
}

static int fake_n_aborts(fake_worker_t *w)
{
    int n;

    pthread_mutex_lock(&w->lock);
    n = w->n_aborts;
    pthread_mutex_unlock(&w->lock);
    return n;
}

static void fake_fini(fake_worker_t *w)
{
    pthread_mutex_destroy(&w->lock);
}

#endif
