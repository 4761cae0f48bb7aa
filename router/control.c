#include "router/control.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#include "common/clock.h"
#include "common/curve.h"
#include "common/hash.h"
#include "common/log.h"
#include "router/fleet.h"
#include "router/registry.h"
#include "router/session.h"
#include "router/zap.h"

#define CONTROL_POLL_MS             20
#define CONTROL_MAX_FRAMES_PER_TURN 512
#define CONTROL_HWM                 100000
#define CONTROL_ERR_BYTES           512
#define CONTROL_MAX_IDENTITY_BYTES  255

typedef enum {
    CMD_SUBMIT = 0,
    CMD_RELEASE = 1,
} cmd_type_t;

typedef struct cmd {
    cmd_type_t type;
    router_request_t *request; /* one reference */
    int client_gone;
    struct cmd *next;
} cmd_t;

struct router_control {
    router_control_params_t params;
    char endpoint[ROUTER_ENDPOINT_BYTES];
    char router_id[64];
    const router_model_t *model;
    router_metrics_t *metrics;
    void *zctx;
    void *sock;
    router_zap_t *zap; /* CURVE allow-list handler; NULL when the plane is unauthenticated */
    int wake_fd;
    pthread_t thread;
    int thread_started;
    atomic_int stop;

    pthread_mutex_t queue_lock; /* guards cmds_head/tail, closed */
    cmd_t *cmds_head;
    cmd_t *cmds_tail;
    int closed;

    pthread_mutex_t state_lock; /* guards registry, sessions, dispatch */
    router_registry_t *registry;
    router_sessions_t *sessions;
    router_dispatch_t *dispatch;
    router_fleet_t *fleet;          /* peers, replicas, relearning (issue 18 item 3: fleet.h) */
    tdm_curve_keypair_t curve_keys; /* the router's CURVE key pair (peers share it); zeroed at
                                       destroy */
    int curve_on;
};

void router_control_params_default(router_control_params_t *params)
{
    memset(params, 0, sizeof(*params));
    params->endpoint = "tcp://127.0.0.1:5557";
    params->heartbeat_interval_ms = PROTO_HEARTBEAT_INTERVAL_MS;
    params->heartbeat_timeout_ms = PROTO_HEARTBEAT_TIMEOUT_MS;
    params->max_sessions = 65536;
    params->stall_grace_ms = ROUTER_REGISTRY_STALL_GRACE_MS;
    router_dispatch_params_default(&params->dispatch);
}

/* ---- sending ---------------------------------------------------------------------------- */

static tdm_status_t send_raw(router_control_t *c, const void *identity, size_t n_identity,
                             const Tandem__Envelope *env)
{
    uint8_t *buf;
    size_t n_bytes;
    tdm_status_t status;

    status = proto_pack(env, &buf, &n_bytes);
    if (status != TDM_OK) {
        return status == TDM_ERR_NO_MEMORY ? status : TDM_ERR_INTERNAL;
    }
    if (zmq_send(c->sock, identity, n_identity, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(c->sock, buf, n_bytes, ZMQ_DONTWAIT) < 0) {
        int err = errno;
        tdm_log(TDM_LOG_WARN, "control", "send failed: worker=%.*s type=%s error=\"%s\"",
                (int)(n_identity < 128 ? n_identity : 128), (const char *)identity,
                proto_type_name(env->body_case), zmq_strerror(err));
        status = TDM_ERR_PEER_LOST;
    } else {
        router_metrics_count(c->metrics, ROUTER_METRIC_CONTROL_BYTES_OUT, n_identity + n_bytes);
    }
    free(buf);
    return status;
}

static tdm_status_t send_to_worker(void *ctx, const char *worker_id, const Tandem__Envelope *env)
{
    router_control_t *c = ctx;
    tdm_status_t status = send_raw(c, worker_id, strlen(worker_id), env);

    if (status == TDM_OK && env->body_case == TANDEM__ENVELOPE__BODY_DECODE_REQUEST) {
        router_metrics_decode_request(c->metrics, env->decode_request);
    }
    /* A message we could not pack is our bug, not the peer's: report it as lost anyway so the
     * turn is retried elsewhere rather than hanging. */
    return status == TDM_OK ? TDM_OK : TDM_ERR_PEER_LOST;
}

static void send_error(router_control_t *c, const void *identity, size_t n_identity,
                       uint64_t request_id, Tandem__ErrorCode code, const char *message)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__Error e = TANDEM__ERROR__INIT;

    e.request_id = request_id;
    e.code = code;
    e.message = (char *)message;
    env.body_case = TANDEM__ENVELOPE__BODY_ERROR;
    env.error = &e;
    send_raw(c, identity, n_identity, &env);
}

/* ---- receiving -------------------------------------------------------------------------- */

static int identity_is_text(const unsigned char *id, size_t n)
{
    if (n == 0 || n > PROTO_MAX_ID_BYTES) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (id[i] <= 0x20 || id[i] >= 0x7f) {
            return 0;
        }
    }
    return 1;
}

static void handle_register(router_control_t *c, const char *id, const Tandem__Envelope *env,
                            uint64_t now_ns)
{
    Tandem__Envelope reply = TANDEM__ENVELOPE__INIT;
    Tandem__RegisterAck ack = TANDEM__REGISTER_ACK__INIT;
    char reason[CONTROL_ERR_BYTES] = "";
    tdm_status_t status;
    int slot;

    if (env->protocol_version != PROTO_VERSION) {
        snprintf(reason, sizeof(reason), "protocol version mismatch: worker %u router %u",
                 env->protocol_version, PROTO_VERSION);
        tdm_log(TDM_LOG_WARN, "control", "registration refused: worker=%s reason=\"%s\"", id,
                reason);
        status = TDM_ERR_MISMATCH;
    } else {
        status = router_registry_register(c->registry, id, env->register_, now_ns, &slot, reason,
                                          sizeof(reason));
    }
    ack.accepted = status == TDM_OK;
    ack.reason = reason;
    ack.heartbeat_interval_ms = c->params.heartbeat_interval_ms;
    ack.heartbeat_timeout_ms = c->params.heartbeat_timeout_ms;
    ack.router_id = c->router_id;
    reply.body_case = TANDEM__ENVELOPE__BODY_REGISTER_ACK;
    reply.register_ack = &ack;
    if (send_raw(c, id, strlen(id), &reply) != TDM_OK && status == TDM_OK) {
        router_dispatch_worker_gone(c->dispatch, slot, ROUTER_REGISTRY_LOST,
                                    "unreachable: register ack failed", now_ns);
    }
}

/* A turn the fleet part parked (router/fleet.h) resumes. */
static void resume_submit(void *ctx, router_request_t *request, uint64_t now_ns)
{
    router_control_t *c = ctx;

    if (c->dispatch != NULL) {
        router_dispatch_submit(c->dispatch, request, now_ns);
    }
}

/* A PageReservation from a worker the registry does not know (declared lost while it was paused,
 * then resumed): its turn has moved on, and no writer ever saw the reservation, so its pages go
 * back at once (Abort with writer_fenced) instead of after the reservation's timeout. */
static void release_unknown_reservation(router_control_t *c, const void *identity,
                                        size_t n_identity, const char *id,
                                        const Tandem__PageReservation *r)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__Abort a = TANDEM__ABORT__INIT;

    tdm_log(TDM_LOG_INFO, "control",
            "late reservation from an unknown worker released: worker=%s request=%llu "
            "reservation=%llu pages=%u",
            id, (unsigned long long)r->request_id, (unsigned long long)r->reservation_id,
            r->n_pages);
    a.request_id = r->request_id;
    a.reservation_id = r->reservation_id;
    a.reason = "unwanted reservation";
    a.writer_fenced = 1;
    env.body_case = TANDEM__ENVELOPE__BODY_ABORT;
    env.abort = &a;
    send_raw(c, identity, n_identity, &env);
}

static void handle_frame(router_control_t *c, const unsigned char *identity, size_t n_identity,
                         const void *payload, size_t n_payload, uint64_t now_ns)
{
    char id[PROTO_MAX_ID_BYTES + 1];
    char err[CONTROL_ERR_BYTES];
    Tandem__Envelope *env = NULL;
    tdm_status_t status;
    int slot;

    if (!identity_is_text(identity, n_identity)) {
        tdm_log(TDM_LOG_WARN, "control",
                "frame dropped: the sender's routing id is not its incarnation id (set "
                "ZMQ_ROUTING_ID) bytes=%zu",
                n_identity);
        return;
    }
    memcpy(id, identity, n_identity);
    id[n_identity] = '\0';
    status = proto_unpack(payload, n_payload, PROTO_UNPACK_ANY_VERSION, &env, err, sizeof(err));
    if (status != TDM_OK) {
        tdm_log(TDM_LOG_WARN, "control", "bad frame: worker=%s bytes=%zu reason=\"%s\"", id,
                n_payload, err);
        send_error(c, identity, n_identity, 0, TANDEM__ERROR_CODE__ERROR_BAD_MESSAGE, err);
        return;
    }
    switch (env->body_case) {
    case TANDEM__ENVELOPE__BODY_REGISTER:
        handle_register(c, id, env, now_ns);
        break;
    case TANDEM__ENVELOPE__BODY_HEARTBEAT:
        if (router_registry_heartbeat(c->registry, id, env->heartbeat, now_ns) != TDM_OK) {
            send_error(c, identity, n_identity, 0, TANDEM__ERROR_CODE__ERROR_NOT_REGISTERED,
                       "unknown worker: register first");
        } else {
            router_fleet_on_heartbeat(c->fleet, id, env->heartbeat);
        }
        break;
    case TANDEM__ENVELOPE__BODY_SESSION_REPLICA: /* a peer router's */
    case TANDEM__ENVELOPE__BODY_SESSION_HISTORY: /* a decode node's answer to SessionQuery */
        router_fleet_on_message(c->fleet, id, env, now_ns);
        break;
    case TANDEM__ENVELOPE__BODY_GOODBYE:
        slot = router_registry_find(c->registry, id);
        if (slot >= 0) {
            router_dispatch_worker_gone(c->dispatch, slot, ROUTER_REGISTRY_LEFT,
                                        env->goodbye->reason, now_ns);
        }
        break;
    default:
        slot = router_registry_touch(c->registry, id, now_ns);
        if (slot < 0 && env->body_case == TANDEM__ENVELOPE__BODY_PAGE_RESERVATION) {
            release_unknown_reservation(c, identity, n_identity, id, env->page_reservation);
        }
        if (slot < 0) {
            send_error(c, identity, n_identity, 0, TANDEM__ERROR_CODE__ERROR_NOT_REGISTERED,
                       "unknown worker: register first");
        } else if (env->protocol_version != PROTO_VERSION) {
            send_error(c, identity, n_identity, 0, TANDEM__ERROR_CODE__ERROR_BAD_MESSAGE,
                       "protocol version mismatch");
        } else {
            router_metrics_worker_message(c->metrics, env, router_model_info(c->model)->page_bytes);
            router_dispatch_on_message(c->dispatch, slot, env, now_ns);
        }
        break;
    }
    proto_envelope_free(env);
}

/* Read one multipart message if one is waiting. Returns 1 when one was read. */
static int receive_one(router_control_t *c, uint64_t now_ns)
{
    zmq_msg_t identity;
    zmq_msg_t part;
    int more;
    int n_parts = 1;

    zmq_msg_init(&identity);
    if (zmq_msg_recv(&identity, c->sock, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&identity);
        return 0;
    }
    zmq_msg_init(&part);
    more = zmq_msg_more(&identity);
    /* Keep the last frame: a DEALER sends one; a REQ-style empty delimiter is skipped. */
    while (more) {
        zmq_msg_close(&part);
        zmq_msg_init(&part);
        if (zmq_msg_recv(&part, c->sock, 0) < 0) {
            break;
        }
        n_parts++;
        more = zmq_msg_more(&part);
    }
    router_metrics_count(c->metrics, ROUTER_METRIC_CONTROL_BYTES_IN,
                         zmq_msg_size(&identity) + zmq_msg_size(&part));
    if (n_parts >= 2) {
        handle_frame(c, zmq_msg_data(&identity), zmq_msg_size(&identity), zmq_msg_data(&part),
                     zmq_msg_size(&part), now_ns);
    }
    zmq_msg_close(&part);
    zmq_msg_close(&identity);
    return 1;
}

/* ---- commands --------------------------------------------------------------------------- */

static tdm_status_t enqueue(router_control_t *c, cmd_type_t type, router_request_t *request,
                            int client_gone)
{
    cmd_t *cmd = calloc(1, sizeof(*cmd));
    uint64_t one = 1;
    ssize_t n;

    if (cmd == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    cmd->type = type;
    cmd->request = router_request_ref(request);
    cmd->client_gone = client_gone;
    pthread_mutex_lock(&c->queue_lock);
    if (c->closed) {
        pthread_mutex_unlock(&c->queue_lock);
        router_request_unref(cmd->request);
        free(cmd);
        return TDM_ERR_UNSUPPORTED;
    }
    if (c->cmds_tail != NULL) {
        c->cmds_tail->next = cmd;
    } else {
        c->cmds_head = cmd;
    }
    c->cmds_tail = cmd;
    pthread_mutex_unlock(&c->queue_lock);
    n = write(c->wake_fd, &one, sizeof(one));
    (void)n; /* the counter cannot overflow in practice; a missed wake costs one poll period */
    return TDM_OK;
}

static void run_commands(router_control_t *c, uint64_t now_ns)
{
    cmd_t *cmd;

    pthread_mutex_lock(&c->queue_lock);
    cmd = c->cmds_head;
    c->cmds_head = NULL;
    c->cmds_tail = NULL;
    pthread_mutex_unlock(&c->queue_lock);
    while (cmd != NULL) {
        cmd_t *next = cmd->next;
        if (cmd->type == CMD_SUBMIT) {
            if (!router_fleet_submit(c->fleet, cmd->request, now_ns)) {
                router_dispatch_submit(c->dispatch, cmd->request, now_ns);
            }
        } else {
            router_dispatch_release(c->dispatch, cmd->request, cmd->client_gone, now_ns);
            router_fleet_release(c->fleet, cmd->request);
        }
        router_request_unref(cmd->request);
        free(cmd);
        cmd = next;
    }
}

static void expire_workers(router_control_t *c, uint64_t now_ns)
{
    const char *why = "heartbeat timeout";
    int slot;

    while ((slot = router_registry_expire(c->registry, now_ns, &why)) >= 0) {
        router_worker_t *w = router_registry_worker(c->registry, slot, 0);
        if (w != NULL) {
            router_fleet_worker_gone(c->fleet, w->id);
        }
        router_dispatch_worker_gone(c->dispatch, slot, ROUTER_REGISTRY_LOST, why, now_ns);
    }
}

static void *control_main(void *arg)
{
    router_control_t *c = arg;
    zmq_pollitem_t items[2];
    uint64_t counter;

    memset(items, 0, sizeof(items));
    items[0].socket = c->sock;
    items[0].events = ZMQ_POLLIN;
    items[1].fd = c->wake_fd;
    items[1].events = ZMQ_POLLIN;
    while (!atomic_load(&c->stop)) {
        uint64_t now_ns;
        int n_frames = 0;

        if (zmq_poll(items, 2, CONTROL_POLL_MS) < 0 && errno != EINTR) {
            tdm_log(TDM_LOG_ERROR, "control", "poll failed: error=\"%s\"", zmq_strerror(errno));
        }
        if (items[1].revents & ZMQ_POLLIN) {
            ssize_t n = read(c->wake_fd, &counter, sizeof(counter));
            (void)n;
        }
        pthread_mutex_lock(&c->state_lock);
        now_ns = tdm_clock_now_ns();
        /* a gap in this loop is the router's own stall, never its workers' silence */
        router_registry_tick(c->registry, now_ns);
        while (n_frames < CONTROL_MAX_FRAMES_PER_TURN && receive_one(c, now_ns)) {
            n_frames++;
        }
        run_commands(c, now_ns);
        expire_workers(c, now_ns);
        router_fleet_tick(c->fleet, now_ns);
        router_dispatch_tick(c->dispatch, now_ns);
        pthread_mutex_unlock(&c->state_lock);
    }
    return NULL;
}

/* ---- lifecycle -------------------------------------------------------------------------- */

/* Make the socket a CURVE server whose clients the ZAP handler checks (before bind). */
static tdm_status_t secure_socket(router_control_t *c)
{
    tdm_curve_keypair_t keys;
    char(*allowed)[TDM_CURVE_Z85_CHARS + 1] = NULL;
    size_t n_allowed = 0;
    char err[256] = "";
    int one = 1;
    tdm_status_t status;

    if (c->params.curve_secret_key == NULL && c->params.curve_workers == NULL) {
        tdm_log(TDM_LOG_WARN, "control",
                "control plane without CurveZMQ: any process that reaches %s can register as a "
                "worker (--curve-secret-key, --curve-workers; docs/DEPLOY.md Security)",
                c->params.endpoint);
        return TDM_OK;
    }
    if (c->params.curve_secret_key == NULL || c->params.curve_workers == NULL) {
        tdm_log(TDM_LOG_ERROR, "control", "CurveZMQ needs both the router key and the worker list");
        return TDM_ERR_INVALID_ARG;
    }
    status = tdm_curve_keyfile_load(c->params.curve_secret_key, &keys, err, sizeof(err));
    if (status == TDM_OK && keys.secret_z85[0] == '\0') {
        snprintf(err, sizeof(err), "%s holds no secret-key", c->params.curve_secret_key);
        status = TDM_ERR_FORMAT;
    }
    if (status == TDM_OK) {
        status = tdm_curve_allowlist_load(c->params.curve_workers, &allowed, &n_allowed, err,
                                          sizeof(err));
    }
    if (status == TDM_OK && c->params.peers != NULL && c->params.peers[0] != '\0') {
        /* peer routers share this key pair: their replica links present its public key */
        char(*grown)[TDM_CURVE_Z85_CHARS + 1] = realloc(allowed, (n_allowed + 1) * sizeof(*grown));
        if (grown == NULL) {
            status = TDM_ERR_NO_MEMORY;
            snprintf(err, sizeof(err), "out of memory");
        } else {
            allowed = grown;
            memcpy(allowed[n_allowed++], keys.public_z85, sizeof(allowed[0]));
        }
    }
    if (status == TDM_OK) {
        status = router_zap_start(c->zctx, (const char(*)[TDM_CURVE_Z85_CHARS + 1]) allowed,
                                  n_allowed, &c->zap);
    }
    if (status == TDM_OK && (zmq_setsockopt(c->sock, ZMQ_CURVE_SERVER, &one, sizeof(one)) != 0 ||
                             zmq_setsockopt(c->sock, ZMQ_CURVE_SECRETKEY, keys.secret_z85,
                                            TDM_CURVE_Z85_CHARS + 1) != 0 ||
                             zmq_setsockopt(c->sock, ZMQ_ZAP_DOMAIN, "tandem", 6) != 0)) {
        snprintf(err, sizeof(err), "cannot enable CURVE: %s", zmq_strerror(errno));
        status = TDM_ERR_IO;
    }
    if (status == TDM_OK) {
        c->curve_keys = keys;
        c->curve_on = 1;
    }
    memset(&keys, 0, sizeof(keys));
    free(allowed);
    if (status != TDM_OK) {
        tdm_log(TDM_LOG_ERROR, "control", "CurveZMQ refused: %s", err);
        return status;
    }
    tdm_log(TDM_LOG_INFO, "control", "control plane uses CurveZMQ: allowed_workers=%zu", n_allowed);
    return TDM_OK;
}

static tdm_status_t open_socket(router_control_t *c)
{
    int one = 1;
    int zero = 0;
    int hwm = CONTROL_HWM;
    int64_t max_bytes = PROTO_MAX_MESSAGE_BYTES;
    size_t n = sizeof(c->endpoint);
    tdm_status_t status;

    c->zctx = zmq_ctx_new();
    if (c->zctx == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    c->sock = zmq_socket(c->zctx, ZMQ_ROUTER);
    if (c->sock == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    zmq_setsockopt(c->sock, ZMQ_ROUTER_MANDATORY, &one, sizeof(one));
    zmq_setsockopt(c->sock, ZMQ_ROUTER_HANDOVER, &one, sizeof(one));
    zmq_setsockopt(c->sock, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(c->sock, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    zmq_setsockopt(c->sock, ZMQ_RCVHWM, &hwm, sizeof(hwm));
    zmq_setsockopt(c->sock, ZMQ_MAXMSGSIZE, &max_bytes, sizeof(max_bytes));
    status = secure_socket(c);
    if (status != TDM_OK) {
        return status;
    }
    if (zmq_bind(c->sock, c->params.endpoint) != 0) {
        tdm_log(TDM_LOG_ERROR, "control", "bind failed: endpoint=%s error=\"%s\"",
                c->params.endpoint, zmq_strerror(errno));
        return TDM_ERR_IO;
    }
    if (zmq_getsockopt(c->sock, ZMQ_LAST_ENDPOINT, c->endpoint, &n) != 0) {
        snprintf(c->endpoint, sizeof(c->endpoint), "%s", c->params.endpoint);
    }
    return TDM_OK;
}

/* The fleet part (after the socket: the peers' links share its ZeroMQ context). */
static tdm_status_t open_fleet(router_control_t *c)
{
    router_fleet_params_t fp;

    memset(&fp, 0, sizeof(fp));
    fp.zctx = c->zctx;
    fp.router_id = c->router_id;
    fp.peers = c->params.peers;
    fp.curve = c->curve_on ? &c->curve_keys : NULL;
    fp.warmup_ms = c->params.relearn_warmup_ms;
    fp.registry = c->registry;
    fp.sessions = c->sessions;
    fp.send = send_to_worker;
    fp.send_ctx = c;
    fp.submit = resume_submit;
    fp.submit_ctx = c;
    return router_fleet_create(&fp, &c->fleet);
}

tdm_status_t router_control_create(const router_control_params_t *params,
                                   const router_model_t *model, router_metrics_t *metrics,
                                   router_control_t **control_out)
{
    router_control_t *c;
    tdm_status_t status;

    if (params == NULL || params->endpoint == NULL || model == NULL || metrics == NULL ||
        control_out == NULL || params->heartbeat_timeout_ms == 0 ||
        params->heartbeat_interval_ms == 0 || params->max_sessions == 0) {
        return TDM_ERR_INVALID_ARG;
    }
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    c->params = *params;
    c->model = model;
    c->metrics = metrics;
    c->wake_fd = -1;
    pthread_mutex_init(&c->queue_lock, NULL);
    pthread_mutex_init(&c->state_lock, NULL);
    if (params->router_id != NULL && params->router_id[0] != '\0') {
        snprintf(c->router_id, sizeof(c->router_id), "%s", params->router_id);
    } else {
        snprintf(c->router_id, sizeof(c->router_id), "router-%d-%016llx", (int)getpid(),
                 (unsigned long long)tdm_hash_splitmix64(tdm_clock_now_ns()));
    }
    status = router_registry_create(router_model_compat(model), params->heartbeat_timeout_ms,
                                    &c->registry);
    if (status == TDM_OK) {
        router_registry_set_stall_grace(c->registry, params->stall_grace_ms);
    }
    if (status == TDM_OK) {
        status = router_sessions_create(params->max_sessions,
                                        router_model_info(model)->tokens_per_block, &c->sessions);
    }
    if (status == TDM_OK) {
        status = router_dispatch_create(&params->dispatch, model, c->registry, c->sessions, metrics,
                                        send_to_worker, c, &c->dispatch);
    }
    if (status == TDM_OK) {
        c->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (c->wake_fd < 0) {
            tdm_log(TDM_LOG_ERROR, "control", "eventfd failed: error=\"%s\"", strerror(errno));
            status = TDM_ERR_IO;
        }
    }
    if (status == TDM_OK) {
        status = open_socket(c);
    }
    if (status == TDM_OK) {
        status = open_fleet(c);
    }
    if (status == TDM_OK) {
        if (pthread_create(&c->thread, NULL, control_main, c) != 0) {
            status = TDM_ERR_NO_MEMORY;
        } else {
            c->thread_started = 1;
        }
    }
    if (status != TDM_OK) {
        router_control_destroy(c);
        return status;
    }
    tdm_log(TDM_LOG_INFO, "control", "control plane listening: endpoint=%s router=%s", c->endpoint,
            c->router_id);
    *control_out = c;
    return TDM_OK;
}

void router_control_stop(router_control_t *control)
{
    router_control_t *c = control;
    uint64_t one = 1;
    ssize_t n;

    pthread_mutex_lock(&c->queue_lock);
    c->closed = 1;
    pthread_mutex_unlock(&c->queue_lock);
    if (c->thread_started) {
        atomic_store(&c->stop, 1);
        n = write(c->wake_fd, &one, sizeof(one));
        (void)n;
        pthread_join(c->thread, NULL);
        c->thread_started = 0;
    }
    pthread_mutex_lock(&c->state_lock);
    if (c->dispatch != NULL) {
        /* Parked turns resume into the dispatcher, which fails them below with the rest. */
        router_fleet_stop(c->fleet, tdm_clock_now_ns());
        /* Commands still queued: releases need nothing more; submits are failed below. */
        run_commands(c, tdm_clock_now_ns());
        router_dispatch_destroy(c->dispatch);
        c->dispatch = NULL;
    }
    pthread_mutex_unlock(&c->state_lock);
}

void router_control_destroy(router_control_t *control)
{
    router_control_t *c = control;

    if (c == NULL) {
        return;
    }
    router_control_stop(c);
    router_fleet_destroy(c->fleet, tdm_clock_now_ns());
    memset(&c->curve_keys, 0, sizeof(c->curve_keys));
    router_sessions_destroy(c->sessions);
    router_registry_destroy(c->registry);
    if (c->sock != NULL) {
        zmq_close(c->sock);
    }
    router_zap_stop(c->zap);
    if (c->zctx != NULL) {
        zmq_ctx_term(c->zctx);
    }
    if (c->wake_fd >= 0) {
        close(c->wake_fd);
    }
    pthread_mutex_destroy(&c->state_lock);
    pthread_mutex_destroy(&c->queue_lock);
    free(c);
}

const char *router_control_endpoint(const router_control_t *control)
{
    return control->endpoint;
}

tdm_status_t router_control_submit(router_control_t *control, router_request_t *request)
{
    return enqueue(control, CMD_SUBMIT, request, 0);
}

void router_control_release(router_control_t *control, router_request_t *request, int client_gone)
{
    if (enqueue(control, CMD_RELEASE, request, client_gone) != TDM_OK) {
        tdm_log(TDM_LOG_DEBUG, "control", "release not queued: request=%llu",
                (unsigned long long)router_request_id(request));
    }
}

void router_control_snapshot(router_control_t *control, router_metrics_gauges_t *gauges_out)
{
    pthread_mutex_lock(&control->state_lock);
    router_registry_stats(control->registry, &gauges_out->workers);
    /* out of memory: no per-worker rows, the rest renders */
    (void)router_metrics_gauges_fill_workers(gauges_out, control->registry);
    gauges_out->n_sessions = router_sessions_count(control->sessions);
    gauges_out->n_inflight =
        control->dispatch != NULL ? router_dispatch_n_inflight(control->dispatch) : 0;
    if (control->fleet != NULL) {
        router_fleet_gauges(control->fleet, gauges_out);
    } else {
        gauges_out->n_session_queries = 0;
        gauges_out->n_sessions_learned = 0;
        gauges_out->n_session_query_timeouts = 0;
        gauges_out->n_replicas_applied = 0;
        gauges_out->n_replicas_sent = 0;
        gauges_out->n_replica_send_failures = 0;
        gauges_out->n_resident_indexed = 0;
    }
    pthread_mutex_unlock(&control->state_lock);
}
