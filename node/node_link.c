/* node_link.c - the worker's control link (node_link.h). */
#include "node/node_link.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "common/clock.h"
#include "common/curve.h"
#include "common/hash.h"
#include "common/log.h"
#include "kernels/kv_page.h"

#define LINK_HOST_BYTES   64
#define LINK_REASON_BYTES 512

/* One packed frame waiting in the outbox, or one envelope waiting in the inbox. */
typedef struct link_item {
    uint8_t *buf;
    size_t n_bytes;
    Tandem__Envelope *env;
    uint64_t epoch; /* inbox: the lease epoch it arrived in (NODE_LINK_EPOCH_VOID: after a pause) */
    struct link_item *next;
} link_item_t;

struct node_link {
    void *zctx;
    void *sock;
    int curve; /* the link is a CURVE client */
    int wake_fd;
    pthread_t thread;
    int thread_started;
    atomic_int stop;
    uint8_t *register_buf; /* packed Register, re-sent after ERROR_NOT_REGISTERED */
    size_t n_register;
    uint32_t heartbeat_interval_ms;
    uint32_t heartbeat_timeout_ms; /* the router's (RegisterAck): silence it declares us lost */
    /* The lease (node_link_lease_valid): when the I/O thread last ran, and how many pauses it
     * has seen; suspect_until_ns (I/O thread only): frames read before then may predate one. */
    _Atomic uint64_t last_wake_ns;
    _Atomic uint64_t lease_epoch;
    _Atomic uint64_t registrations; /* re-registrations after ERROR_NOT_REGISTERED */
    uint64_t suspect_until_ns;
    uint64_t recv_epoch;  /* epoch of the envelope the last node_link_recv returned (lock) */
    pthread_mutex_t lock; /* guards the queues, load and wake flag */
    pthread_cond_t cond;
    link_item_t *out_head, *out_tail;
    link_item_t *in_head, *in_tail;
    node_load_t load;
    uint64_t history_sessions[NODE_MAX_HISTORY_SESSIONS]; /* Load.history_sessions */
    uint32_t n_history_sessions;
    int woken;
    node_progress_t *progress; /* borrowed; NULL: none */
};

static void set_err(char *err, size_t err_bytes, const char *fmt, const char *a, const char *b)
{
    if (err != NULL && err_bytes > 0) {
        snprintf(err, err_bytes, fmt, a, b);
    }
}

void node_link_make_id(const char *role, char *id, size_t id_bytes)
{
    char host[LINK_HOST_BYTES] = "localhost";
    uint64_t r = tdm_hash_splitmix64(tdm_clock_now_ns() ^ ((uint64_t)getpid() << 32));

    gethostname(host, sizeof(host) - 1);
    host[sizeof(host) - 1] = '\0';
    for (char *p = host; *p != '\0'; p++) {
        if (*p <= ' ' || *p > '~') {
            *p = '_';
        }
    }
    snprintf(id, id_bytes, "%s-%s-%d-%08llx", role, host, (int)getpid(),
             (unsigned long long)(r & 0xffffffffull));
}

static tdm_status_t pack_register(node_link_t *link, const node_link_params_t *p)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__Register reg = TANDEM__REGISTER__INIT;
    Tandem__PageFormat pf = TANDEM__PAGE_FORMAT__INIT;
    Tandem__Capacity cap = TANDEM__CAPACITY__INIT;
    char *formats[2] = {PROTO_KV_FORMAT_MAIN, PROTO_KV_FORMAT_INDEX};

    pf.version = KERN_KV_PAGE_VERSION;
    pf.rows_per_page = KERN_KV_PAGE_ROWS;
    pf.page_bytes = p->page_bytes;
    pf.tokens_per_block = p->tokens_per_block;
    cap.total_pages = p->total_pages;
    cap.max_sequences = p->max_sequences;
    cap.max_batch_tokens = p->max_batch_tokens;
    cap.max_tokens = p->max_tokens;
    reg.role = p->role;
    reg.incarnation_id = (char *)p->incarnation_id;
    reg.rack = (char *)(p->rack != NULL ? p->rack : "");
    reg.node = (char *)(p->node != NULL ? p->node : "");
    reg.model_fingerprint = p->model_fingerprint;
    reg.weights_digest = p->weights_digest;
    reg.kv_layout = (char *)(p->kv_layout != NULL ? p->kv_layout : "");
    reg.transports = (char **)p->transports;
    reg.n_transports = p->n_transports;
    reg.page_format = &pf;
    reg.n_kv_formats = 2;
    reg.kv_formats = formats;
    reg.max_context = p->max_context;
    reg.protocol_version = PROTO_VERSION;
    reg.transfer_descriptor.data = (uint8_t *)p->transfer_descriptor;
    reg.transfer_descriptor.len = p->n_transfer_descriptor;
    reg.capacity = &cap;
    reg.http_endpoint = (char *)(p->http_endpoint != NULL ? p->http_endpoint : "");
    env.body_case = TANDEM__ENVELOPE__BODY_REGISTER;
    env.register_ = &reg;
    return proto_pack(&env, &link->register_buf, &link->n_register);
}

/* Wait for the RegisterAck of the first registration (on the caller's thread). */
static tdm_status_t await_ack(node_link_t *link, uint32_t timeout_ms, char *err, size_t err_bytes)
{
    uint64_t deadline = tdm_clock_now_ns() + (uint64_t)timeout_ms * TDM_NS_PER_MS;

    for (;;) {
        uint64_t now = tdm_clock_now_ns();
        zmq_pollitem_t item = {link->sock, 0, ZMQ_POLLIN, 0};
        Tandem__Envelope *env = NULL;
        zmq_msg_t msg;
        char why[LINK_REASON_BYTES];
        tdm_status_t status;

        if (now >= deadline) {
            set_err(err, err_bytes, "no RegisterAck from the router within the deadline%s%s",
                    link->curve ? " (with CurveZMQ: is this worker's public key on the router's "
                                  "--curve-workers list, and --curve-router-key the router's?)"
                                : "",
                    "");
            return TDM_ERR_TIMEOUT;
        }
        if (zmq_poll(&item, 1, (long)((deadline - now) / TDM_NS_PER_MS) + 1) <= 0) {
            continue;
        }
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, link->sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&msg);
            continue;
        }
        status = proto_unpack(zmq_msg_data(&msg), zmq_msg_size(&msg), 0, &env, why, sizeof(why));
        zmq_msg_close(&msg);
        if (status != TDM_OK) {
            tdm_log(TDM_LOG_WARN, "link", "bad frame from router: %s", why);
            continue;
        }
        if (env->body_case == TANDEM__ENVELOPE__BODY_REGISTER_ACK) {
            Tandem__RegisterAck *ack = env->register_ack;
            if (!ack->accepted) {
                set_err(err, err_bytes, "registration refused by router %s: %s", ack->router_id,
                        ack->reason);
                proto_envelope_free(env);
                return TDM_ERR_MISMATCH;
            }
            link->heartbeat_interval_ms = ack->heartbeat_interval_ms > 0
                                              ? ack->heartbeat_interval_ms
                                              : PROTO_HEARTBEAT_INTERVAL_MS;
            link->heartbeat_timeout_ms = ack->heartbeat_timeout_ms > 0 ? ack->heartbeat_timeout_ms
                                                                       : PROTO_HEARTBEAT_TIMEOUT_MS;
            tdm_log(TDM_LOG_INFO, "link", "registered: router=%s heartbeat_interval_ms=%u",
                    ack->router_id, link->heartbeat_interval_ms);
            proto_envelope_free(env);
            return TDM_OK;
        }
        proto_envelope_free(env);
    }
}

static void push(link_item_t **head, link_item_t **tail, link_item_t *item)
{
    item->next = NULL;
    if (*tail != NULL) {
        (*tail)->next = item;
    } else {
        *head = item;
    }
    *tail = item;
}

static void send_heartbeat(node_link_t *link, uint64_t seq)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__Heartbeat hb = TANDEM__HEARTBEAT__INIT;
    Tandem__Load load = TANDEM__LOAD__INIT;
    uint64_t *history = NULL;
    uint8_t *buf;
    size_t n;

    pthread_mutex_lock(&link->lock);
    if (link->n_history_sessions > 0) {
        history = malloc(link->n_history_sessions * sizeof(uint64_t));
        if (history != NULL) { /* out of memory: this heartbeat goes without the hint */
            memcpy(history, link->history_sessions, link->n_history_sessions * sizeof(uint64_t));
            load.history_sessions = history;
            load.n_history_sessions = link->n_history_sessions;
        }
    }
    load.queued_prefill_tokens = link->load.queued_prefill_tokens;
    load.running_sequences = link->load.running_sequences;
    load.free_pages = link->load.free_pages;
    load.total_pages = link->load.total_pages;
    load.reserved_pages = link->load.reserved_pages;
    load.resident_sessions = link->load.resident_sessions;
    load.recent_tokens_per_s = link->load.recent_tokens_per_s;
    pthread_mutex_unlock(&link->lock);
    if (link->progress != NULL) {
        /* read here, on the I/O thread: a wedged compute thread cannot hide behind heartbeats */
        node_progress_view_t v;

        node_progress_read(link->progress, tdm_clock_now_ns(), &v);
        load.steps_completed = v.steps_completed;
        load.pending_work = v.pending_work;
        load.stalled = v.stalled != 0;
        load.draining = v.draining != 0;
    }
    hb.seq = seq;
    hb.load = &load;
    env.body_case = TANDEM__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    if (proto_pack(&env, &buf, &n) == TDM_OK) {
        zmq_send(link->sock, buf, n, ZMQ_DONTWAIT);
        free(buf);
    }
    free(history);
}

/* Hand one received frame to the owner, or handle link-level messages here. */
static void on_frame(node_link_t *link, const void *data, size_t n_bytes)
{
    Tandem__Envelope *env = NULL;
    char why[LINK_REASON_BYTES];
    link_item_t *item;

    if (proto_unpack(data, n_bytes, 0, &env, why, sizeof(why)) != TDM_OK) {
        tdm_log(TDM_LOG_WARN, "link", "bad frame from router dropped: %s", why);
        return;
    }
    if (env->body_case == TANDEM__ENVELOPE__BODY_REGISTER_ACK) {
        if (!env->register_ack->accepted) {
            tdm_log(TDM_LOG_ERROR, "link", "re-registration refused: %s",
                    env->register_ack->reason);
        }
        proto_envelope_free(env);
        return;
    }
    if (env->body_case == TANDEM__ENVELOPE__BODY_ERROR && env->error->request_id == 0 &&
        env->error->code == TANDEM__ERROR_CODE__ERROR_NOT_REGISTERED) {
        tdm_log(TDM_LOG_WARN, "link", "router does not know us: registering again");
        /* the router declared us lost: what it sent before this came first (void); what follows
         * belongs to the new registration */
        link->suspect_until_ns = 0;
        atomic_fetch_add(&link->lease_epoch, 1); /* the old registration's work is void */
        atomic_fetch_add(&link->registrations, 1);
        zmq_send(link->sock, link->register_buf, link->n_register, ZMQ_DONTWAIT);
        proto_envelope_free(env);
        return;
    }
    item = calloc(1, sizeof(*item));
    if (item == NULL) {
        proto_envelope_free(env);
        return;
    }
    item->env = env;
    node_progress_inbox(link->progress, 1);
    item->epoch = tdm_clock_now_ns() < link->suspect_until_ns ? NODE_LINK_EPOCH_VOID
                                                              : atomic_load(&link->lease_epoch);
    pthread_mutex_lock(&link->lock);
    push(&link->in_head, &link->in_tail, item);
    pthread_cond_signal(&link->cond);
    pthread_mutex_unlock(&link->lock);
}

static void flush_outbox(node_link_t *link)
{
    for (;;) {
        link_item_t *item;

        pthread_mutex_lock(&link->lock);
        item = link->out_head;
        if (item != NULL) {
            link->out_head = item->next;
            if (link->out_head == NULL) {
                link->out_tail = NULL;
            }
        }
        pthread_mutex_unlock(&link->lock);
        if (item == NULL) {
            return;
        }
        if (zmq_send(link->sock, item->buf, item->n_bytes, 0) < 0) {
            tdm_log(TDM_LOG_WARN, "link", "send to router failed: %s", zmq_strerror(errno));
        }
        free(item->buf);
        free(item);
    }
}

/* How long the lease lasts past the I/O thread's last run: the router's heartbeat timeout less
 * one interval (our last heartbeat may have left up to an interval before that run). */
static uint64_t lease_ns(const node_link_t *link)
{
    uint32_t ms = link->heartbeat_timeout_ms > link->heartbeat_interval_ms
                      ? link->heartbeat_timeout_ms - link->heartbeat_interval_ms
                      : link->heartbeat_timeout_ms / 2;

    return (uint64_t)ms * TDM_NS_PER_MS;
}

/* The I/O thread runs at least once per heartbeat interval; a longer gap means the process (or
 * this thread) stood still long enough that the router may have declared us lost: a new lease
 * epoch, and the frames read in the next lease length predate it (void). */
static void lease_tick(node_link_t *link, uint64_t now)
{
    uint64_t prev = atomic_load(&link->last_wake_ns);

    if (prev != 0 && now > prev && now - prev >= lease_ns(link)) {
        atomic_fetch_add(&link->lease_epoch, 1);
        link->suspect_until_ns = now + lease_ns(link);
        tdm_log(TDM_LOG_WARN, "link",
                "stood still for %.0f ms (router heartbeat timeout %u ms): work received before "
                "is void",
                (double)(now - prev) / TDM_NS_PER_MS, link->heartbeat_timeout_ms);
    }
    atomic_store(&link->last_wake_ns, now);
}

static void *io_main(void *arg)
{
    node_link_t *link = arg;
    uint64_t next_hb = tdm_clock_now_ns();
    uint64_t seq = 0;

    while (!atomic_load(&link->stop)) {
        zmq_pollitem_t items[2] = {{link->sock, 0, ZMQ_POLLIN, 0},
                                   {NULL, link->wake_fd, ZMQ_POLLIN, 0}};
        uint64_t now = tdm_clock_now_ns();
        long wait_ms = now >= next_hb ? 0 : (long)((next_hb - now) / TDM_NS_PER_MS) + 1;

        lease_tick(link, now);
        if (now >= next_hb) {
            send_heartbeat(link, ++seq);
            next_hb = now + (uint64_t)link->heartbeat_interval_ms * TDM_NS_PER_MS;
            continue;
        }
        if (zmq_poll(items, 2, wait_ms) < 0) {
            continue;
        }
        lease_tick(link, tdm_clock_now_ns()); /* a pause in the poll shows before its frames */
        if ((items[1].revents & ZMQ_POLLIN) != 0) {
            uint64_t v;
            if (read(link->wake_fd, &v, sizeof(v)) < 0) {
                /* nothing: the counter is reset either way */
            }
        }
        flush_outbox(link);
        for (int i = 0; i < 256; i++) {
            zmq_msg_t msg;
            zmq_msg_init(&msg);
            if (zmq_msg_recv(&msg, link->sock, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&msg);
                break;
            }
            on_frame(link, zmq_msg_data(&msg), zmq_msg_size(&msg));
            zmq_msg_close(&msg);
        }
    }
    flush_outbox(link);
    return NULL;
}

/* Make `sock` a CURVE client of the router when both key files are given (before connect). */
static tdm_status_t secure_link(void *sock, const node_link_params_t *params, char *err,
                                size_t err_bytes)
{
    tdm_curve_keypair_t mine;
    tdm_curve_keypair_t router;
    char why[256] = "";
    tdm_status_t status;

    if (params->curve_key == NULL && params->curve_router_key == NULL) {
        tdm_log(TDM_LOG_WARN, "link",
                "control link without CurveZMQ: unencrypted and unauthenticated "
                "(--curve-key, --curve-router-key; docs/DEPLOY.md Security)");
        return TDM_OK;
    }
    if (params->curve_key == NULL || params->curve_router_key == NULL) {
        set_err(err, err_bytes, "CurveZMQ needs both --curve-key and --curve-router-key%s%s", "",
                "");
        return TDM_ERR_INVALID_ARG;
    }
    status = tdm_curve_keyfile_load(params->curve_key, &mine, why, sizeof(why));
    if (status == TDM_OK && mine.secret_z85[0] == '\0') {
        snprintf(why, sizeof(why), "%s holds no secret-key", params->curve_key);
        status = TDM_ERR_FORMAT;
    }
    if (status == TDM_OK) {
        status = tdm_curve_keyfile_load(params->curve_router_key, &router, why, sizeof(why));
    }
    if (status == TDM_OK &&
        (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, router.public_z85, TDM_CURVE_Z85_CHARS + 1) !=
             0 ||
         zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, mine.public_z85, TDM_CURVE_Z85_CHARS + 1) != 0 ||
         zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, mine.secret_z85, TDM_CURVE_Z85_CHARS + 1) !=
             0)) {
        snprintf(why, sizeof(why), "cannot enable CURVE: %s", zmq_strerror(errno));
        status = TDM_ERR_IO;
    }
    memset(&mine, 0, sizeof(mine));
    if (status != TDM_OK) {
        set_err(err, err_bytes, "%s%s", why, "");
    }
    return status;
}

tdm_status_t node_link_create(const node_link_params_t *params, node_link_t **link_out, char *err,
                              size_t err_bytes)
{
    node_link_t *link;
    pthread_condattr_t cond_attr;
    int zero = 0;
    tdm_status_t status;

    if (params == NULL || link_out == NULL || params->router_endpoint == NULL ||
        params->incarnation_id == NULL || strlen(params->incarnation_id) > NODE_ID_BYTES) {
        return TDM_ERR_INVALID_ARG;
    }
    link = calloc(1, sizeof(*link));
    if (link == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    pthread_mutex_init(&link->lock, NULL);
    /* node_link_recv's deadline is on CLOCK_MONOTONIC: a wall-clock step must not stretch or cut
     * the wait */
    pthread_condattr_init(&cond_attr);
    pthread_condattr_setclock(&cond_attr, CLOCK_MONOTONIC);
    pthread_cond_init(&link->cond, &cond_attr);
    pthread_condattr_destroy(&cond_attr);
    link->heartbeat_interval_ms = PROTO_HEARTBEAT_INTERVAL_MS;
    link->progress = params->progress;
    link->heartbeat_timeout_ms = PROTO_HEARTBEAT_TIMEOUT_MS;
    link->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    link->zctx = zmq_ctx_new();
    if (link->wake_fd < 0 || link->zctx == NULL) {
        set_err(err, err_bytes, "cannot create the control link: %s%s", strerror(errno), "");
        status = TDM_ERR_IO;
        goto err_free;
    }
    link->sock = zmq_socket(link->zctx, ZMQ_DEALER);
    status = link->sock != NULL ? secure_link(link->sock, params, err, err_bytes) : TDM_OK;
    if (status != TDM_OK) {
        goto err_free;
    }
    link->curve = params->curve_key != NULL;
    if (link->sock == NULL ||
        zmq_setsockopt(link->sock, ZMQ_ROUTING_ID, params->incarnation_id,
                       strlen(params->incarnation_id)) != 0 ||
        zmq_setsockopt(link->sock, ZMQ_LINGER, &zero, sizeof(zero)) != 0 ||
        zmq_connect(link->sock, params->router_endpoint) != 0) {
        set_err(err, err_bytes, "cannot connect to %s: %s", params->router_endpoint,
                zmq_strerror(errno));
        status = TDM_ERR_IO;
        goto err_free;
    }
    status = pack_register(link, params);
    if (status != TDM_OK) {
        set_err(err, err_bytes, "cannot pack Register%s%s", "", "");
        goto err_free;
    }
    zmq_send(link->sock, link->register_buf, link->n_register, 0);
    status = await_ack(link, params->register_timeout_ms, err, err_bytes);
    if (status != TDM_OK) {
        goto err_free;
    }
    atomic_store(&link->last_wake_ns, tdm_clock_now_ns());
    if (pthread_create(&link->thread, NULL, io_main, link) != 0) {
        status = TDM_ERR_NO_MEMORY;
        goto err_free;
    }
    link->thread_started = 1;
    *link_out = link;
    return TDM_OK;

err_free:
    node_link_destroy(link, NULL);
    return status;
}

void node_link_destroy(node_link_t *link, const char *reason)
{
    if (link == NULL) {
        return;
    }
    if (link->thread_started && reason != NULL) {
        Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
        Tandem__Goodbye bye = TANDEM__GOODBYE__INIT;
        bye.reason = (char *)reason;
        env.body_case = TANDEM__ENVELOPE__BODY_GOODBYE;
        env.goodbye = &bye;
        node_link_send(link, &env);
    }
    atomic_store(&link->stop, 1);
    if (link->thread_started) {
        uint64_t one = 1;
        if (write(link->wake_fd, &one, sizeof(one)) < 0) {
            /* the thread still wakes within one heartbeat interval */
        }
        pthread_join(link->thread, NULL);
    }
    while (link->out_head != NULL) {
        link_item_t *item = link->out_head;
        link->out_head = item->next;
        free(item->buf);
        free(item);
    }
    while (link->in_head != NULL) {
        link_item_t *item = link->in_head;
        link->in_head = item->next;
        proto_envelope_free(item->env);
        free(item);
    }
    if (link->sock != NULL) {
        zmq_close(link->sock);
    }
    if (link->zctx != NULL) {
        zmq_ctx_term(link->zctx);
    }
    if (link->wake_fd >= 0) {
        close(link->wake_fd);
    }
    free(link->register_buf);
    pthread_cond_destroy(&link->cond);
    pthread_mutex_destroy(&link->lock);
    free(link);
}

tdm_status_t node_link_send(node_link_t *link, const Tandem__Envelope *env)
{
    link_item_t *item = calloc(1, sizeof(*item));
    uint64_t one = 1;
    tdm_status_t status;

    if (item == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    status = proto_pack(env, &item->buf, &item->n_bytes);
    if (status != TDM_OK) {
        free(item);
        return status;
    }
    pthread_mutex_lock(&link->lock);
    push(&link->out_head, &link->out_tail, item);
    pthread_mutex_unlock(&link->lock);
    if (write(link->wake_fd, &one, sizeof(one)) < 0) {
        /* counter saturated: the thread is already due to wake */
    }
    return TDM_OK;
}

tdm_status_t node_link_recv(node_link_t *link, uint32_t timeout_ms, Tandem__Envelope **env_out)
{
    link_item_t *item;
    struct timespec until;

    clock_gettime(CLOCK_MONOTONIC, &until); /* the condvar's clock (node_link_create) */
    until.tv_sec += timeout_ms / 1000u;
    until.tv_nsec += (long)(timeout_ms % 1000u) * (long)TDM_NS_PER_MS;
    if (until.tv_nsec >= (long)TDM_NS_PER_S) {
        until.tv_sec++;
        until.tv_nsec -= (long)TDM_NS_PER_S;
    }
    pthread_mutex_lock(&link->lock);
    while (link->in_head == NULL && timeout_ms > 0 && !link->woken) {
        if (pthread_cond_timedwait(&link->cond, &link->lock, &until) != 0) {
            break;
        }
    }
    link->woken = 0;
    item = link->in_head;
    if (item != NULL) {
        link->in_head = item->next;
        if (link->in_head == NULL) {
            link->in_tail = NULL;
        }
    }
    pthread_mutex_unlock(&link->lock);
    if (item == NULL) {
        return TDM_ERR_TIMEOUT;
    }
    node_progress_inbox(link->progress, -1);
    pthread_mutex_lock(&link->lock);
    link->recv_epoch = item->epoch;
    pthread_mutex_unlock(&link->lock);
    *env_out = item->env;
    free(item);
    return TDM_OK;
}

uint64_t node_link_recv_epoch(node_link_t *link)
{
    uint64_t epoch;

    pthread_mutex_lock(&link->lock);
    epoch = link->recv_epoch;
    pthread_mutex_unlock(&link->lock);
    return epoch;
}

uint64_t node_link_registrations(node_link_t *link)
{
    return atomic_load(&link->registrations);
}

int node_link_lease_valid(node_link_t *link, uint64_t epoch)
{
    uint64_t last = atomic_load(&link->last_wake_ns);
    uint64_t now = tdm_clock_now_ns();

    if (now > last && now - last >= lease_ns(link)) {
        return 0; /* the I/O thread has not run for a lease: we may be lost already */
    }
    return epoch != NODE_LINK_EPOCH_VOID && epoch == atomic_load(&link->lease_epoch);
}

void node_link_wake(node_link_t *link)
{
    pthread_mutex_lock(&link->lock);
    link->woken = 1;
    pthread_cond_signal(&link->cond);
    pthread_mutex_unlock(&link->lock);
}

void node_link_set_load(node_link_t *link, const node_load_t *load)
{
    pthread_mutex_lock(&link->lock);
    link->load = *load;
    pthread_mutex_unlock(&link->lock);
}

void node_link_set_history_sessions(node_link_t *link, const uint64_t *keys, uint32_t n)
{
    if (n > NODE_MAX_HISTORY_SESSIONS) {
        n = NODE_MAX_HISTORY_SESSIONS;
    }
    pthread_mutex_lock(&link->lock);
    if (n > 0) {
        memcpy(link->history_sessions, keys, n * sizeof(uint64_t));
    }
    link->n_history_sessions = n;
    pthread_mutex_unlock(&link->lock);
}
