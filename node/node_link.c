/* node_link.c - the worker's control links (node_link.h): the owner's side (create, send,
 * receive, the lease, the published load); the sockets are node_link_io.c's. */
#include "node/node_link.h"
#include "node/node_link_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "common/clock.h"
#include "common/hash.h"
#include "common/log.h"

#define LINK_HOST_BYTES 64

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

void link_push(link_item_t **head, link_item_t **tail, link_item_t *item)
{
    item->next = NULL;
    if (*tail != NULL) {
        (*tail)->next = item;
    } else {
        *head = item;
    }
    *tail = item;
}

void link_release_unsent(node_link_t *link, uint32_t r, uint64_t resv_id)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__Abort a = TANDEM__ABORT__INIT;
    char why[128];
    uint8_t *buf = NULL;
    size_t n_bytes = 0;
    link_item_t *item = calloc(1, sizeof(*item));
    tdm_status_t status;

    a.reservation_id = resv_id;
    a.reason = "reservation never sent: its router no longer had us";
    a.writer_fenced = 1;
    env.body_case = TANDEM__ENVELOPE__BODY_ABORT;
    env.abort = &a;
    /* packed and read back: the inbox holds envelopes the owner frees with proto_envelope_free */
    status = item == NULL ? TDM_ERR_NO_MEMORY : proto_pack(&env, &buf, &n_bytes);
    if (status == TDM_OK) {
        status = proto_unpack(buf, n_bytes, 0, &item->env, why, sizeof(why));
    }
    free(buf);
    if (status != TDM_OK) {
        tdm_log(TDM_LOG_ERROR, "link",
                "reservation=%llu was never sent and cannot be released now (%s): its pages "
                "wait for its timeout and fence",
                (unsigned long long)resv_id, tdm_status_name(status));
        free(item);
        return;
    }
    tdm_log(TDM_LOG_WARN, "link",
            "reservation=%llu dropped unsent for router %s: released (no writer has it)",
            (unsigned long long)resv_id, link->routers[r].endpoint);
    item->router = r;
    item->epoch = link_epoch(r, atomic_load(&link->routers[r].epoch));
    node_progress_inbox(link->progress, 1);
    pthread_mutex_lock(&link->lock);
    link_push(&link->in_head, &link->in_tail, item);
    pthread_cond_signal(&link->cond);
    pthread_mutex_unlock(&link->lock);
}

/* How long the lease lasts past the I/O thread's last run: the router's heartbeat timeout less
 * one interval (our last heartbeat may have left up to an interval before that run). */
uint64_t link_lease_ns(const link_router_t *rt)
{
    uint32_t ms = rt->heartbeat_timeout_ms > rt->heartbeat_interval_ms
                      ? rt->heartbeat_timeout_ms - rt->heartbeat_interval_ms
                      : rt->heartbeat_timeout_ms / 2;

    return (uint64_t)ms * TDM_NS_PER_MS;
}

uint64_t link_route_key(const Tandem__Envelope *env)
{
    switch (env->body_case) {
    case TANDEM__ENVELOPE__BODY_RESERVE_PAGES:
        return env->reserve_pages->request_id;
    case TANDEM__ENVELOPE__BODY_PAGE_RESERVATION:
        return env->page_reservation->request_id;
    case TANDEM__ENVELOPE__BODY_PREFILL_JOB:
        return env->prefill_job->request_id;
    case TANDEM__ENVELOPE__BODY_COMPLETION:
        return env->completion->request_id;
    case TANDEM__ENVELOPE__BODY_DECODE_REQUEST:
        return env->decode_request->request_id;
    case TANDEM__ENVELOPE__BODY_TOKEN_CHUNK:
        return env->token_chunk->request_id;
    case TANDEM__ENVELOPE__BODY_FINISH:
        return env->finish->request_id;
    case TANDEM__ENVELOPE__BODY_ABORT:
        return env->abort->request_id;
    case TANDEM__ENVELOPE__BODY_ERROR:
        return env->error->request_id;
    case TANDEM__ENVELOPE__BODY_ABORT_ACK:
        return env->abort_ack->request_id;
    case TANDEM__ENVELOPE__BODY_SESSION_QUERY:
        return env->session_query->query_id;
    case TANDEM__ENVELOPE__BODY_SESSION_HISTORY:
        return env->session_history->query_id;
    default:
        return 0;
    }
}

static uint32_t route_slot(uint64_t key)
{
    return (uint32_t)(tdm_hash_splitmix64(key) & (LINK_ROUTE_SLOTS - 1u));
}

void link_route_note(node_link_t *link, uint64_t key, uint32_t r)
{
    if (key != 0) {
        /* a collision overwrites: the older id is then unknown and its answers go to every
         * router (node_link_send), which still reaches the right one */
        link->routes[route_slot(key)].key = key;
        link->routes[route_slot(key)].router = r;
    }
}

/* The router `key` came from, or -1 (caller holds lock). */
static int route_find(const node_link_t *link, uint64_t key)
{
    if (link->n_routers == 1) {
        return 0;
    }
    if (key == 0 || link->routes[route_slot(key)].key != key) {
        return -1;
    }
    return (int)link->routes[route_slot(key)].router;
}

/* Split the comma list `endpoints` into link->routers (empty entries skipped). */
static tdm_status_t split_endpoints(node_link_t *link, const char *endpoints, char *err,
                                    size_t err_bytes)
{
    const char *p = endpoints;

    link->routers = calloc(NODE_LINK_MAX_ROUTERS, sizeof(*link->routers));
    if (link->routers == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    while (*p != '\0') {
        size_t n = strcspn(p, ",");

        if (n > 0) {
            char *ep;

            if (link->n_routers == NODE_LINK_MAX_ROUTERS) {
                snprintf(err, err_bytes, "more than %u router endpoints in \"%s\"",
                         NODE_LINK_MAX_ROUTERS, endpoints);
                return TDM_ERR_INVALID_ARG;
            }
            ep = strndup(p, n);
            if (ep == NULL) {
                return TDM_ERR_NO_MEMORY;
            }
            link->routers[link->n_routers++].endpoint = ep;
        }
        p += n + (p[n] == ',');
    }
    if (link->n_routers == 0) {
        snprintf(err, err_bytes, "no router endpoint in \"%s\"", endpoints);
        return TDM_ERR_INVALID_ARG;
    }
    return TDM_OK;
}

tdm_status_t node_link_create(const node_link_params_t *params, node_link_t **link_out, char *err,
                              size_t err_bytes)
{
    node_link_t *link;
    pthread_condattr_t cond_attr;
    tdm_status_t status;
    char scratch[8];

    if (err == NULL || err_bytes == 0) {
        err = scratch;
        err_bytes = sizeof(scratch);
    }
    err[0] = '\0';
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
    link->progress = params->progress;
    link->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    link->zctx = zmq_ctx_new();
    link->resident_keys = calloc(NODE_MAX_RESIDENT_SESSIONS, sizeof(uint64_t));
    link->resident_lens = calloc(NODE_MAX_RESIDENT_SESSIONS, sizeof(uint64_t));
    if (link->wake_fd < 0 || link->zctx == NULL) {
        snprintf(err, err_bytes, "cannot create the control link: %s", strerror(errno));
        status = TDM_ERR_IO;
        goto err_free;
    }
    status = split_endpoints(link, params->router_endpoint, err, err_bytes);
    if (status == TDM_OK && (link->resident_keys == NULL || link->resident_lens == NULL)) {
        status = TDM_ERR_NO_MEMORY;
    }
    if (status == TDM_OK && link->n_routers > 1) {
        link->routes = calloc(LINK_ROUTE_SLOTS, sizeof(*link->routes));
        status = link->routes == NULL ? TDM_ERR_NO_MEMORY : TDM_OK;
    }
    if (status != TDM_OK) {
        goto err_free;
    }
    if (params->curve_key == NULL && params->curve_router_key == NULL) {
        tdm_log(TDM_LOG_WARN, "link",
                "control link without CurveZMQ: unencrypted and unauthenticated "
                "(--curve-key, --curve-router-key; docs/DEPLOY.md Security)");
    }
    link->curve = params->curve_key != NULL;
    for (uint32_t r = 0; r < link->n_routers; r++) {
        status = link_io_open(link, r, params, err, err_bytes);
        if (status != TDM_OK) {
            goto err_free;
        }
    }
    status = link_io_pack_register(link, params);
    if (status != TDM_OK) {
        snprintf(err, err_bytes, "cannot pack Register");
        goto err_free;
    }
    status = link_io_await_first(link, params->register_timeout_ms, err, err_bytes);
    if (status != TDM_OK) {
        goto err_free;
    }
    atomic_store(&link->last_wake_ns, tdm_clock_now_ns());
    if (pthread_create(&link->thread, NULL, link_io_main, link) != 0) {
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

static void free_items(link_item_t *item)
{
    while (item != NULL) {
        link_item_t *next = item->next;
        free(item->buf);
        if (item->env != NULL) {
            proto_envelope_free(item->env);
        }
        free(item);
        item = next;
    }
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
        node_link_send(link, &env); /* to every router */
    }
    atomic_store(&link->stop, 1);
    if (link->thread_started) {
        uint64_t one = 1;
        if (write(link->wake_fd, &one, sizeof(one)) < 0) {
            /* the thread still wakes within a second */
        }
        pthread_join(link->thread, NULL);
    }
    free_items(link->in_head);
    for (uint32_t r = 0; link->routers != NULL && r < NODE_LINK_MAX_ROUTERS; r++) {
        free_items(link->routers[r].out_head);
        if (link->routers[r].sock != NULL) {
            zmq_socket_monitor(link->routers[r].sock, NULL, 0);
            zmq_close(link->routers[r].sock);
        }
        if (link->routers[r].monitor != NULL) {
            zmq_close(link->routers[r].monitor);
        }
        free(link->routers[r].endpoint);
    }
    if (link->zctx != NULL) {
        zmq_ctx_term(link->zctx);
    }
    if (link->wake_fd >= 0) {
        close(link->wake_fd);
    }
    free(link->routers);
    free(link->routes);
    free(link->resident_keys);
    free(link->resident_lens);
    free(link->register_buf);
    pthread_cond_destroy(&link->cond);
    pthread_mutex_destroy(&link->lock);
    free(link);
}

/* Queue a copy of `buf` for router r (caller holds lock); unsent_resv: link_item_t's. Returns 0
 * when the outbox is full. */
static int queue_for(node_link_t *link, uint32_t r, const uint8_t *buf, size_t n_bytes,
                     uint64_t unsent_resv)
{
    link_router_t *rt = &link->routers[r];
    link_item_t *item;

    if (rt->n_out >= LINK_MAX_OUTBOX) {
        return 0;
    }
    item = calloc(1, sizeof(*item));
    if (item == NULL || (item->buf = malloc(n_bytes > 0 ? n_bytes : 1)) == NULL) {
        free(item);
        return 0;
    }
    memcpy(item->buf, buf, n_bytes);
    item->n_bytes = n_bytes;
    item->unsent_resv = unsent_resv;
    link_push(&rt->out_head, &rt->out_tail, item);
    rt->n_out++;
    return 1;
}

tdm_status_t node_link_send(node_link_t *link, const Tandem__Envelope *env)
{
    uint8_t *buf = NULL;
    size_t n_bytes = 0;
    uint64_t one = 1;
    uint32_t n_queued = 0, n_full = 0;
    uint64_t resv = 0;
    int r;
    tdm_status_t status = proto_pack(env, &buf, &n_bytes);

    if (status != TDM_OK) {
        return status;
    }
    pthread_mutex_lock(&link->lock);
    r = route_find(link, link_route_key(env));
    if (r >= 0 && env->body_case == TANDEM__ENVELOPE__BODY_PAGE_RESERVATION) {
        /* for its router alone: dropped unsent, nobody saw it (link_release_unsent). A copy
         * to every router is not: another one may have relayed it to a writer. */
        resv = env->page_reservation->reservation_id;
    }
    for (uint32_t i = 0; i < link->n_routers; i++) {
        if (r >= 0 && (uint32_t)r != i) {
            continue;
        }
        /* an answer goes where its request came from; the rest (Goodbye, an answer whose
         * request is not known here) to every router, which ignores what is not its own */
        if (queue_for(link, i, buf, n_bytes, resv)) {
            n_queued++;
        } else {
            n_full++;
        }
    }
    pthread_mutex_unlock(&link->lock);
    free(buf);
    if (n_queued == 0 && resv != 0) {
        link_release_unsent(link, (uint32_t)r, resv);
    }
    if (n_full > 0) {
        tdm_log(TDM_LOG_WARN, "link",
                "a message dropped for %u router(s): outbox full (%u) or out of memory", n_full,
                LINK_MAX_OUTBOX);
    }
    if (write(link->wake_fd, &one, sizeof(one)) < 0) {
        /* counter saturated: the thread is already due to wake */
    }
    return n_queued > 0 ? TDM_OK : TDM_ERR_NO_MEMORY;
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
        link->recv_epoch = item->epoch;
        link->recv_router = item->router;
    }
    pthread_mutex_unlock(&link->lock);
    if (item == NULL) {
        return TDM_ERR_TIMEOUT;
    }
    node_progress_inbox(link->progress, -1);
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

uint32_t node_link_recv_router(node_link_t *link)
{
    uint32_t r;

    pthread_mutex_lock(&link->lock);
    r = link->recv_router;
    pthread_mutex_unlock(&link->lock);
    return r;
}

int node_link_request_router(node_link_t *link, uint64_t request_id)
{
    int r;

    pthread_mutex_lock(&link->lock);
    r = route_find(link, request_id);
    pthread_mutex_unlock(&link->lock);
    return r;
}

uint64_t node_link_registrations(node_link_t *link)
{
    uint64_t n = 0;

    for (uint32_t r = 0; r < link->n_routers; r++) {
        n += atomic_load(&link->routers[r].registrations);
    }
    return n;
}

uint32_t node_link_n_routers(const node_link_t *link)
{
    return link->n_routers;
}

uint64_t node_link_router_registrations(node_link_t *link, uint32_t router)
{
    return router < link->n_routers ? atomic_load(&link->routers[router].registrations) : 0;
}

uint32_t node_link_n_registered(node_link_t *link)
{
    uint32_t n = 0;

    for (uint32_t r = 0; r < link->n_routers; r++) {
        n += atomic_load(&link->routers[r].up) != 0;
    }
    return n;
}

int node_link_lease_valid(node_link_t *link, uint64_t epoch)
{
    uint64_t last = atomic_load(&link->last_wake_ns);
    uint64_t now = tdm_clock_now_ns();
    uint64_t r = epoch >> LINK_EPOCH_ROUTER_SHIFT;
    const link_router_t *rt;

    if (epoch == NODE_LINK_EPOCH_VOID || r >= link->n_routers) {
        return 0;
    }
    rt = &link->routers[r];
    if (now > last && now - last >= link_lease_ns(rt)) {
        return 0; /* the I/O thread has not run for a lease: we may be lost already */
    }
    return epoch == link_epoch((uint32_t)r, atomic_load(&rt->epoch));
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

void node_link_set_resident_sessions(node_link_t *link, const uint64_t *keys,
                                     const uint64_t *cached_lens, uint32_t n)
{
    if (n > NODE_MAX_RESIDENT_SESSIONS) {
        n = NODE_MAX_RESIDENT_SESSIONS;
    }
    pthread_mutex_lock(&link->lock);
    if (n > 0) {
        memcpy(link->resident_keys, keys, n * sizeof(uint64_t));
        memcpy(link->resident_lens, cached_lens, n * sizeof(uint64_t));
    }
    link->n_resident = n;
    pthread_mutex_unlock(&link->lock);
}
