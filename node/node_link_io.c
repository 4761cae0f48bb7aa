/* node_link_io.c - the control link's I/O (node_link_impl.h): one DEALER socket per router, the
 * registration with each (re-sent with backoff until it is accepted), heartbeats, the outboxes,
 * the frames received, and a monitor of each connection (a router unreachable past its heartbeat
 * timeout has declared the worker lost). One thread serves every router; nothing here blocks on one
 * of them, so a dead router stalls neither the node nor the other links. */
#include "node/node_link_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "common/clock.h"
#include "common/curve.h"
#include "common/log.h"
#include "kernels/kv_page.h"

#define IO_REASON_BYTES     512
#define IO_MAX_FRAMES       256   /* frames read from one router per loop */
#define IO_MAX_WAIT_MS      1000u /* the loop runs at least this often */
#define IO_RECONNECT_MS     100   /* ZeroMQ's TCP reconnect: first retry ... */
#define IO_RECONNECT_MAX_MS 5000  /* ... doubling up to this */
#define IO_ZMTP_PING_MS     1000  /* ZMTP heartbeats: a silent peer's connection is dropped ... */
#define IO_ZMTP_TIMEOUT_MS  10000 /* ... after this, and reconnected (a paused router lives) */

static void set_err(char *err, size_t err_bytes, const char *fmt, const char *a, const char *b)
{
    if (err != NULL && err_bytes > 0) {
        snprintf(err, err_bytes, fmt, a, b);
    }
}

tdm_status_t link_io_pack_register(node_link_t *link, const node_link_params_t *p)
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

/* Make `sock` a CURVE client of the router when both key files are given (before connect). */
static tdm_status_t secure_link(void *sock, const node_link_params_t *params, char *err,
                                size_t err_bytes)
{
    tdm_curve_keypair_t mine;
    tdm_curve_keypair_t router;
    char why[256] = "";
    tdm_status_t status;

    if (params->curve_key == NULL && params->curve_router_key == NULL) {
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

/* Watch router r's socket: its connection events (connected, disconnected) arrive on a PAIR
 * socket the I/O thread polls (handle_monitor). */
static tdm_status_t open_monitor(node_link_t *link, uint32_t r)
{
    link_router_t *rt = &link->routers[r];
    char addr[96];
    const int zero = 0;

    snprintf(addr, sizeof(addr), "inproc://tandem-link-%p-%u", (void *)link, r);
    if (zmq_socket_monitor(rt->sock, addr, ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED) != 0) {
        return TDM_ERR_IO;
    }
    rt->monitor = zmq_socket(link->zctx, ZMQ_PAIR);
    if (rt->monitor == NULL || zmq_setsockopt(rt->monitor, ZMQ_LINGER, &zero, sizeof(zero)) != 0 ||
        zmq_connect(rt->monitor, addr) != 0) {
        return TDM_ERR_IO;
    }
    return TDM_OK;
}

tdm_status_t link_io_open(node_link_t *link, uint32_t r, const node_link_params_t *params,
                          char *err, size_t err_bytes)
{
    link_router_t *rt = &link->routers[r];
    const int zero = 0, one = 1, reconnect = IO_RECONNECT_MS, reconnect_max = IO_RECONNECT_MAX_MS;
    const int ping = IO_ZMTP_PING_MS, ping_timeout = IO_ZMTP_TIMEOUT_MS;
    tdm_status_t status;

    rt->sock = zmq_socket(link->zctx, ZMQ_DEALER);
    if (rt->sock == NULL) {
        set_err(err, err_bytes, "cannot create a socket for %s: %s", rt->endpoint,
                zmq_strerror(errno));
        return TDM_ERR_IO;
    }
    status = secure_link(rt->sock, params, err, err_bytes);
    if (status != TDM_OK) {
        return status;
    }
    /* ZMQ_IMMEDIATE: a message for a router that is not connected fails at once instead of
     * queueing behind it; the ZMTP pings drop a connection whose router went silent */
    if (zmq_setsockopt(rt->sock, ZMQ_ROUTING_ID, params->incarnation_id,
                       strlen(params->incarnation_id)) != 0 ||
        zmq_setsockopt(rt->sock, ZMQ_LINGER, &zero, sizeof(zero)) != 0 ||
        zmq_setsockopt(rt->sock, ZMQ_IMMEDIATE, &one, sizeof(one)) != 0 ||
        zmq_setsockopt(rt->sock, ZMQ_RECONNECT_IVL, &reconnect, sizeof(reconnect)) != 0 ||
        zmq_setsockopt(rt->sock, ZMQ_RECONNECT_IVL_MAX, &reconnect_max, sizeof(reconnect_max)) !=
            0 ||
        zmq_setsockopt(rt->sock, ZMQ_HEARTBEAT_IVL, &ping, sizeof(ping)) != 0 ||
        zmq_setsockopt(rt->sock, ZMQ_HEARTBEAT_TIMEOUT, &ping_timeout, sizeof(ping_timeout)) != 0 ||
        zmq_connect(rt->sock, rt->endpoint) != 0) {
        set_err(err, err_bytes, "cannot connect to %s: %s", rt->endpoint, zmq_strerror(errno));
        return TDM_ERR_IO;
    }
    if (open_monitor(link, r) != TDM_OK) {
        set_err(err, err_bytes, "cannot watch the connection to %s: %s", rt->endpoint,
                zmq_strerror(errno));
        return TDM_ERR_IO;
    }
    rt->heartbeat_interval_ms = PROTO_HEARTBEAT_INTERVAL_MS;
    rt->heartbeat_timeout_ms = PROTO_HEARTBEAT_TIMEOUT_MS;
    rt->backoff_ms = LINK_REGISTER_BACKOFF_MIN_MS;
    rt->next_register_ns = 0; /* at once */
    return TDM_OK;
}

/* Send Register to router r if it is due and the socket takes it; schedule the next one. */
static void maybe_register(node_link_t *link, uint32_t r, uint64_t now)
{
    link_router_t *rt = &link->routers[r];

    if (rt->registered || now < rt->next_register_ns) {
        return;
    }
    if (zmq_send(rt->sock, link->register_buf, link->n_register, ZMQ_DONTWAIT) < 0) {
        return; /* not connected yet: POLLOUT says when */
    }
    rt->next_register_ns = now + (uint64_t)rt->backoff_ms * TDM_NS_PER_MS;
    rt->backoff_ms = rt->backoff_ms * 2u > LINK_REGISTER_BACKOFF_MAX_MS
                         ? LINK_REGISTER_BACKOFF_MAX_MS
                         : rt->backoff_ms * 2u;
}

/* A RegisterAck from router r: registered, or refused (then asked again after the longest
 * backoff: it may be reconfigured). Returns 1 when accepted. */
static int on_ack(node_link_t *link, uint32_t r, const Tandem__RegisterAck *ack, uint64_t now,
                  char *err, size_t err_bytes)
{
    link_router_t *rt = &link->routers[r];

    if (!ack->accepted) {
        if (!rt->refused) {
            tdm_log(TDM_LOG_ERROR, "link", "registration refused by router %s (%s): %s",
                    ack->router_id, rt->endpoint, ack->reason);
        }
        set_err(err, err_bytes, "registration refused by router %s: %s", ack->router_id,
                ack->reason);
        rt->refused = 1;
        rt->registered = 0;
        atomic_store(&rt->up, 0);
        rt->next_register_ns = now + (uint64_t)LINK_REGISTER_BACKOFF_MAX_MS * TDM_NS_PER_MS;
        return 0;
    }
    if (rt->registered) {
        return 1; /* a duplicate (a Register re-sent before the first ack came) */
    }
    rt->heartbeat_interval_ms =
        ack->heartbeat_interval_ms > 0 ? ack->heartbeat_interval_ms : PROTO_HEARTBEAT_INTERVAL_MS;
    rt->heartbeat_timeout_ms =
        ack->heartbeat_timeout_ms > 0 ? ack->heartbeat_timeout_ms : PROTO_HEARTBEAT_TIMEOUT_MS;
    rt->registered = 1;
    rt->refused = 0;
    rt->backoff_ms = LINK_REGISTER_BACKOFF_MIN_MS;
    rt->next_heartbeat_ns = now;
    atomic_store(&rt->up, 1);
    tdm_log(TDM_LOG_INFO, "link",
            "registered: router=%s endpoint=%s (%u of %u) heartbeat_interval_ms=%u", ack->router_id,
            rt->endpoint, r + 1, link->n_routers, rt->heartbeat_interval_ms);
    return 1;
}

tdm_status_t link_io_await_first(node_link_t *link, uint32_t timeout_ms, char *err,
                                 size_t err_bytes)
{
    uint64_t deadline = tdm_clock_now_ns() + (uint64_t)timeout_ms * TDM_NS_PER_MS;
    zmq_pollitem_t items[NODE_LINK_MAX_ROUTERS];

    for (;;) {
        uint64_t now = tdm_clock_now_ns();
        uint64_t wake = deadline;
        uint32_t n_refused = 0;

        for (uint32_t r = 0; r < link->n_routers; r++) {
            link_router_t *rt = &link->routers[r];

            n_refused += rt->refused;
            maybe_register(link, r, now);
            items[r].socket = rt->sock;
            items[r].fd = 0;
            items[r].events = ZMQ_POLLIN;
            items[r].revents = 0;
            if (now >= rt->next_register_ns) {
                items[r].events |= ZMQ_POLLOUT; /* due, waiting for the connection */
            } else if (rt->next_register_ns < wake) {
                wake = rt->next_register_ns;
            }
        }
        if (n_refused == link->n_routers) {
            return TDM_ERR_MISMATCH; /* err: the last refusal's reason */
        }
        if (now >= deadline) {
            set_err(err, err_bytes, "no RegisterAck from any router within the deadline%s%s",
                    link->curve ? " (with CurveZMQ: is this worker's public key on the router's "
                                  "--curve-workers list, and --curve-router-key the router's?)"
                                : "",
                    link->n_routers > 1 ? " (every --router endpoint was asked)" : "");
            return TDM_ERR_TIMEOUT;
        }
        if (zmq_poll(items, (int)link->n_routers, (long)((wake - now) / TDM_NS_PER_MS) + 1) <= 0) {
            continue;
        }
        now = tdm_clock_now_ns();
        for (uint32_t r = 0; r < link->n_routers; r++) {
            if ((items[r].revents & ZMQ_POLLIN) == 0) {
                continue;
            }
            for (int i = 0; i < IO_MAX_FRAMES; i++) {
                Tandem__Envelope *env = NULL;
                char why[IO_REASON_BYTES];
                zmq_msg_t msg;
                int accepted = 0;

                zmq_msg_init(&msg);
                if (zmq_msg_recv(&msg, link->routers[r].sock, ZMQ_DONTWAIT) < 0) {
                    zmq_msg_close(&msg);
                    break;
                }
                if (proto_unpack(zmq_msg_data(&msg), zmq_msg_size(&msg), 0, &env, why,
                                 sizeof(why)) != TDM_OK) {
                    tdm_log(TDM_LOG_WARN, "link", "bad frame from router %s: %s",
                            link->routers[r].endpoint, why);
                } else if (env->body_case == TANDEM__ENVELOPE__BODY_REGISTER_ACK) {
                    accepted = on_ack(link, r, env->register_ack, now, err, err_bytes);
                }
                proto_envelope_free(env);
                zmq_msg_close(&msg);
                if (accepted) {
                    return TDM_OK;
                }
            }
        }
    }
}

/* The Load every router's next heartbeat carries (what the owner published last). Arrays are
 * malloc'ed into *history_out / *keys_out / *lens_out (NULL when empty or out of memory: that
 * heartbeat goes without them); the caller frees them. */
static void snapshot_load(node_link_t *link, Tandem__Load *load, uint64_t **history_out,
                          uint64_t **keys_out, uint64_t **lens_out)
{
    uint64_t *history = NULL, *keys = NULL, *lens = NULL;

    pthread_mutex_lock(&link->lock);
    if (link->n_history_sessions > 0) {
        history = malloc(link->n_history_sessions * sizeof(uint64_t));
        if (history != NULL) {
            memcpy(history, link->history_sessions, link->n_history_sessions * sizeof(uint64_t));
            load->history_sessions = history;
            load->n_history_sessions = link->n_history_sessions;
        }
    }
    if (link->n_resident > 0) {
        keys = malloc(link->n_resident * sizeof(uint64_t));
        lens = malloc(link->n_resident * sizeof(uint64_t));
        if (keys != NULL && lens != NULL) {
            memcpy(keys, link->resident_keys, link->n_resident * sizeof(uint64_t));
            memcpy(lens, link->resident_lens, link->n_resident * sizeof(uint64_t));
            load->resident_session_keys = keys;
            load->n_resident_session_keys = link->n_resident;
            load->resident_cached_lens = lens;
            load->n_resident_cached_lens = link->n_resident;
        }
    }
    load->queued_prefill_tokens = link->load.queued_prefill_tokens;
    load->running_sequences = link->load.running_sequences;
    load->free_pages = link->load.free_pages;
    load->total_pages = link->load.total_pages;
    load->reserved_pages = link->load.reserved_pages;
    load->resident_sessions = link->load.resident_sessions;
    load->recent_tokens_per_s = link->load.recent_tokens_per_s;
    pthread_mutex_unlock(&link->lock);
    if (link->progress != NULL) {
        /* read here, on the I/O thread: a wedged compute thread cannot hide behind heartbeats */
        node_progress_view_t v;

        node_progress_read(link->progress, tdm_clock_now_ns(), &v);
        load->steps_completed = v.steps_completed;
        load->pending_work = v.pending_work;
        load->stalled = v.stalled != 0;
        load->draining = v.draining != 0;
    }
    *history_out = history;
    *keys_out = keys;
    *lens_out = lens;
}

/* One heartbeat to router r (dropped when its connection is down: the next one goes out). */
static void send_heartbeat(node_link_t *link, uint32_t r)
{
    link_router_t *rt = &link->routers[r];
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__Heartbeat hb = TANDEM__HEARTBEAT__INIT;
    Tandem__Load load = TANDEM__LOAD__INIT;
    uint64_t *history, *keys, *lens;
    uint8_t *buf;
    size_t n;

    snapshot_load(link, &load, &history, &keys, &lens);
    hb.seq = ++rt->heartbeat_seq;
    hb.load = &load;
    env.body_case = TANDEM__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    if (proto_pack(&env, &buf, &n) == TDM_OK) {
        zmq_send(rt->sock, buf, n, ZMQ_DONTWAIT);
        free(buf);
    }
    free(history);
    free(keys);
    free(lens);
}

/* Drop what waits for router r (its registration ended: the old one's answers are void). */
static void clear_outbox(node_link_t *link, uint32_t r)
{
    link_router_t *rt = &link->routers[r];
    link_item_t *item;

    pthread_mutex_lock(&link->lock);
    item = rt->out_head;
    rt->out_head = rt->out_tail = NULL;
    rt->n_out = 0;
    pthread_mutex_unlock(&link->lock);
    while (item != NULL) {
        link_item_t *next = item->next;
        if (item->unsent_resv != 0) {
            link_release_unsent(link, r, item->unsent_resv); /* nobody saw it */
        }
        free(item->buf);
        free(item);
        item = next;
    }
}

/* Router r no longer counts us as registered (it said so, or it was unreachable past its
 * heartbeat timeout: it declared us lost if it lives): its registration's work is void (a new
 * lease epoch with it, counted as a re-registration), what waited for it is dropped, and
 * Register goes to it again as soon as it is reachable. */
static void router_lost(node_link_t *link, uint32_t r)
{
    link_router_t *rt = &link->routers[r];

    rt->registered = 0;
    atomic_store(&rt->up, 0);
    rt->suspect_until_ns = 0;
    atomic_fetch_add(&rt->epoch, 1);
    atomic_fetch_add(&rt->registrations, 1);
    clear_outbox(link, r);
    rt->backoff_ms = LINK_REGISTER_BACKOFF_MIN_MS;
    rt->next_register_ns = 0;
}

/* Read router r's connection events; a connection down longer than the router's heartbeat
 * timeout plus one interval (it has declared us lost by then, if it runs at all) loses the
 * registration. Returns when router r's link is next due a look (UINT64_MAX: not before the
 * next event). */
static uint64_t handle_monitor(node_link_t *link, uint32_t r, uint64_t now)
{
    link_router_t *rt = &link->routers[r];
    uint64_t limit_ns;

    for (int i = 0; i < IO_MAX_FRAMES; i++) {
        zmq_msg_t event, addr;
        uint16_t id = 0;

        zmq_msg_init(&event);
        if (zmq_msg_recv(&event, rt->monitor, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&event);
            break;
        }
        if (zmq_msg_size(&event) >= sizeof(id)) {
            memcpy(&id, zmq_msg_data(&event), sizeof(id));
        }
        zmq_msg_close(&event);
        zmq_msg_init(&addr);
        zmq_msg_recv(&addr, rt->monitor, 0); /* the endpoint: always sent with the event */
        zmq_msg_close(&addr);
        if (id == ZMQ_EVENT_DISCONNECTED && rt->down_since_ns == 0) {
            rt->down_since_ns = now;
            tdm_log(TDM_LOG_WARN, "link", "connection to router %s dropped", rt->endpoint);
        } else if (id == ZMQ_EVENT_CONNECTED) {
            if (rt->down_since_ns != 0) {
                tdm_log(TDM_LOG_INFO, "link", "connection to router %s back after %.0f ms",
                        rt->endpoint, (double)(now - rt->down_since_ns) / TDM_NS_PER_MS);
            }
            rt->down_since_ns = 0;
        }
    }
    if (!rt->registered || rt->down_since_ns == 0) {
        return UINT64_MAX;
    }
    limit_ns = (uint64_t)(rt->heartbeat_timeout_ms + rt->heartbeat_interval_ms) * TDM_NS_PER_MS;
    if (now - rt->down_since_ns < limit_ns) {
        return rt->down_since_ns + limit_ns;
    }
    tdm_log(TDM_LOG_WARN, "link",
            "router %s unreachable for %.0f ms (its heartbeat timeout %u ms): its work is void, "
            "registering again when it is back",
            rt->endpoint, (double)(now - rt->down_since_ns) / TDM_NS_PER_MS,
            rt->heartbeat_timeout_ms);
    router_lost(link, r);
    return UINT64_MAX;
}

/* Hand one frame from router r to the owner, or handle link-level messages here. */
static void on_frame(node_link_t *link, uint32_t r, const void *data, size_t n_bytes)
{
    link_router_t *rt = &link->routers[r];
    Tandem__Envelope *env = NULL;
    char why[IO_REASON_BYTES];
    uint64_t now = tdm_clock_now_ns();
    link_item_t *item;

    if (proto_unpack(data, n_bytes, 0, &env, why, sizeof(why)) != TDM_OK) {
        tdm_log(TDM_LOG_WARN, "link", "bad frame from router %s dropped: %s", rt->endpoint, why);
        return;
    }
    if (env->body_case == TANDEM__ENVELOPE__BODY_REGISTER_ACK) {
        on_ack(link, r, env->register_ack, now, NULL, 0);
        proto_envelope_free(env);
        return;
    }
    if (env->body_case == TANDEM__ENVELOPE__BODY_ERROR && env->error->request_id == 0 &&
        env->error->code == TANDEM__ERROR_CODE__ERROR_NOT_REGISTERED) {
        if (rt->registered) {
            tdm_log(TDM_LOG_WARN, "link", "router %s does not know us: registering again",
                    rt->endpoint);
            /* it declared us lost: what it sent before this came first (void); what follows
             * belongs to the new registration */
            router_lost(link, r);
            maybe_register(link, r, now);
        }
        proto_envelope_free(env);
        return;
    }
    item = calloc(1, sizeof(*item));
    if (item == NULL) {
        tdm_log(TDM_LOG_ERROR, "link", "out of memory: a message from router %s dropped",
                rt->endpoint);
        proto_envelope_free(env);
        return;
    }
    item->env = env;
    item->router = r;
    node_progress_inbox(link->progress, 1);
    item->epoch =
        now < rt->suspect_until_ns ? NODE_LINK_EPOCH_VOID : link_epoch(r, atomic_load(&rt->epoch));
    pthread_mutex_lock(&link->lock);
    if (link->routes != NULL) {
        link_route_note(link, link_route_key(env), r);
    }
    link_push(&link->in_head, &link->in_tail, item);
    pthread_cond_signal(&link->cond);
    pthread_mutex_unlock(&link->lock);
}

/* Send what waits for router r until its socket would block (the rest waits for POLLOUT); a
 * router that does not accept us gets nothing (what waited is dropped: it is void). */
static void flush_outbox(node_link_t *link, uint32_t r)
{
    link_router_t *rt = &link->routers[r];

    if (!rt->registered) {
        clear_outbox(link, r);
        return;
    }
    for (;;) {
        link_item_t *item;

        pthread_mutex_lock(&link->lock);
        item = rt->out_head;
        pthread_mutex_unlock(&link->lock);
        if (item == NULL) {
            return;
        }
        if (zmq_send(rt->sock, item->buf, item->n_bytes, ZMQ_DONTWAIT) < 0) {
            if (errno != EAGAIN) {
                tdm_log(TDM_LOG_WARN, "link", "send to router %s failed: %s", rt->endpoint,
                        zmq_strerror(errno));
                if (item->unsent_resv != 0) {
                    link_release_unsent(link, r, item->unsent_resv);
                }
            } else {
                return; /* not connected, or its queue is full: later */
            }
        }
        pthread_mutex_lock(&link->lock);
        rt->out_head = item->next; /* only this thread removes from an outbox */
        if (rt->out_head == NULL) {
            rt->out_tail = NULL;
        }
        rt->n_out--;
        pthread_mutex_unlock(&link->lock);
        free(item->buf);
        free(item);
    }
}

/* The I/O thread runs at least once per heartbeat interval; a longer gap means the process (or
 * this thread) stood still long enough that a router may have declared us lost: a new lease
 * epoch with that router, and the frames read from it in the next lease length predate it. */
static void lease_tick(node_link_t *link, uint64_t now)
{
    uint64_t prev = atomic_load(&link->last_wake_ns);

    for (uint32_t r = 0; prev != 0 && now > prev && r < link->n_routers; r++) {
        link_router_t *rt = &link->routers[r];

        if (now - prev >= link_lease_ns(rt)) {
            atomic_fetch_add(&rt->epoch, 1);
            rt->suspect_until_ns = now + link_lease_ns(rt);
            tdm_log(TDM_LOG_WARN, "link",
                    "stood still for %.0f ms (router %s heartbeat timeout %u ms): work received "
                    "before is void",
                    (double)(now - prev) / TDM_NS_PER_MS, rt->endpoint, rt->heartbeat_timeout_ms);
        }
    }
    atomic_store(&link->last_wake_ns, now);
}

void *link_io_main(void *arg)
{
    node_link_t *link = arg;
    zmq_pollitem_t items[2 * NODE_LINK_MAX_ROUTERS + 1];
    uint32_t n = link->n_routers;

    while (!atomic_load(&link->stop)) {
        uint64_t now = tdm_clock_now_ns();
        uint64_t wake = now + (uint64_t)IO_MAX_WAIT_MS * TDM_NS_PER_MS;

        lease_tick(link, now);
        for (uint32_t r = 0; r < n; r++) {
            link_router_t *rt = &link->routers[r];
            uint64_t due = handle_monitor(link, r, now);
            int has_out;

            if (due < wake) {
                wake = due;
            }
            items[n + 1 + r].socket = rt->monitor;
            items[n + 1 + r].fd = 0;
            items[n + 1 + r].events = ZMQ_POLLIN;
            items[n + 1 + r].revents = 0;

            items[r].socket = rt->sock;
            items[r].fd = 0;
            items[r].events = ZMQ_POLLIN;
            items[r].revents = 0;
            if (rt->registered) {
                if (now >= rt->next_heartbeat_ns) {
                    send_heartbeat(link, r);
                    rt->next_heartbeat_ns =
                        now + (uint64_t)rt->heartbeat_interval_ms * TDM_NS_PER_MS;
                }
                if (rt->next_heartbeat_ns < wake) {
                    wake = rt->next_heartbeat_ns;
                }
                pthread_mutex_lock(&link->lock);
                has_out = rt->out_head != NULL;
                pthread_mutex_unlock(&link->lock);
                if (has_out) {
                    items[r].events |= ZMQ_POLLOUT;
                }
            } else {
                maybe_register(link, r, now);
                if (now >= rt->next_register_ns) {
                    items[r].events |= ZMQ_POLLOUT; /* due, waiting for the connection */
                } else if (rt->next_register_ns < wake) {
                    wake = rt->next_register_ns;
                }
            }
        }
        items[n].socket = NULL;
        items[n].fd = link->wake_fd;
        items[n].events = ZMQ_POLLIN;
        items[n].revents = 0;
        if (zmq_poll(items, 2 * (int)n + 1, (long)((wake - now) / TDM_NS_PER_MS) + 1) < 0) {
            continue;
        }
        lease_tick(link, tdm_clock_now_ns()); /* a pause in the poll shows before its frames */
        if ((items[n].revents & ZMQ_POLLIN) != 0) {
            uint64_t v;
            if (read(link->wake_fd, &v, sizeof(v)) < 0) {
                /* nothing: the counter is reset either way */
            }
        }
        for (uint32_t r = 0; r < n; r++) {
            if (!link->routers[r].registered && (items[r].revents & ZMQ_POLLOUT) != 0) {
                maybe_register(link, r, tdm_clock_now_ns());
            }
            flush_outbox(link, r);
            for (int i = 0; i < IO_MAX_FRAMES && (items[r].revents & ZMQ_POLLIN) != 0; i++) {
                zmq_msg_t msg;
                zmq_msg_init(&msg);
                if (zmq_msg_recv(&msg, link->routers[r].sock, ZMQ_DONTWAIT) < 0) {
                    zmq_msg_close(&msg);
                    break;
                }
                on_frame(link, r, zmq_msg_data(&msg), zmq_msg_size(&msg));
                zmq_msg_close(&msg);
            }
        }
    }
    for (uint32_t r = 0; r < n; r++) {
        flush_outbox(link, r); /* the Goodbye */
    }
    return NULL;
}
