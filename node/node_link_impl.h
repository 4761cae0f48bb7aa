/* node_link_impl.h - the control link's state, shared by node/node_link.c (the owner's API:
 * create, send, receive, the lease) and node/node_link_io.c (the I/O thread: one DEALER socket
 * per router, registration with backoff, heartbeats, received frames). Private to those two.
 *
 * Threads: the I/O thread alone touches the sockets and the per-router fields marked (io); the
 * queues, the load, the route table and the fields marked (lock) are guarded by `lock`; the
 * atomics are read by any thread.
 */
#ifndef TANDEM_NODE_LINK_IMPL_H
#define TANDEM_NODE_LINK_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "node/node_link.h"

/* Bits of a lease epoch that count the epochs of one router; the bits above say which router
 * (node_link.h NODE_LINK_EPOCH_VOID aside). */
#define LINK_EPOCH_ROUTER_SHIFT 48u
#define LINK_EPOCH_COUNT_MASK   ((1ull << LINK_EPOCH_ROUTER_SHIFT) - 1u)

/* Slots of the route table (request or query id -> router it came from); a power of two. */
#define LINK_ROUTE_SLOTS 16384u

/* Most envelopes waiting for one router; past it the oldest is dropped (the router is gone or
 * not reading, and what it would get is stale). */
#define LINK_MAX_OUTBOX 65536u

/* Re-sending Register to a router that has not accepted us: first after this, doubling up to
 * LINK_REGISTER_BACKOFF_MAX_MS. */
#define LINK_REGISTER_BACKOFF_MIN_MS 100u
#define LINK_REGISTER_BACKOFF_MAX_MS 5000u

/* One packed frame waiting in an outbox, or one envelope waiting in the inbox. */
typedef struct link_item {
    uint8_t *buf;
    size_t n_bytes;
    Tandem__Envelope *env;
    uint64_t epoch; /* inbox: the lease epoch it arrived in (NODE_LINK_EPOCH_VOID: after a pause) */
    uint32_t router; /* inbox: the router it came from */
    /* outbox: the reservation id of a PageReservation queued for this router alone (0: none);
     * dropped unsent, it is released as its router would have (link_release_unsent) */
    uint64_t unsent_resv;
    struct link_item *next;
} link_item_t;

/* One router's end of the link. */
typedef struct {
    char *endpoint;            /* tcp://HOST:PORT (malloc'ed) */
    void *sock;                /* DEALER, routing id = the incarnation id (io) */
    void *monitor;             /* PAIR reading sock's connection events (io) */
    uint64_t down_since_ns;    /* the connection dropped then and has not come back; 0: up (io) */
    int registered;            /* it accepted our Register and has not forgotten us since (io) */
    int refused;               /* its last RegisterAck refused us (io) */
    uint64_t next_register_ns; /* not registered: when Register goes out again (io) */
    uint32_t backoff_ms;       /* the wait after that one (io) */
    uint32_t heartbeat_interval_ms;
    uint32_t heartbeat_timeout_ms;    /* the router's (RegisterAck): silence it declares us lost */
    uint64_t next_heartbeat_ns;       /* (io) */
    uint64_t heartbeat_seq;           /* (io) */
    uint64_t suspect_until_ns;        /* frames read before then may predate a pause (io) */
    _Atomic uint64_t epoch;           /* this router's lease epoch count */
    _Atomic uint64_t registrations;   /* re-registrations after ERROR_NOT_REGISTERED */
    atomic_int up;                    /* = registered, for other threads */
    link_item_t *out_head, *out_tail; /* (lock) */
    uint32_t n_out;                   /* (lock) */
} link_router_t;

/* One route: the router that sent the message carrying `key` (0: free slot). */
typedef struct {
    uint64_t key;
    uint32_t router;
} link_route_t;

struct node_link {
    void *zctx;
    int curve; /* the links are CURVE clients */
    int wake_fd;
    pthread_t thread;
    int thread_started;
    atomic_int stop;
    uint8_t *register_buf; /* packed Register, sent to every router */
    size_t n_register;
    link_router_t *routers; /* [n_routers] */
    uint32_t n_routers;
    /* The lease (node_link_lease_valid): when the I/O thread last ran. */
    _Atomic uint64_t last_wake_ns;
    uint64_t recv_epoch;  /* epoch of the envelope the last node_link_recv returned (lock) */
    uint32_t recv_router; /* its router (lock) */
    pthread_mutex_t lock; /* guards the queues, load, routes and wake flag */
    pthread_cond_t cond;
    link_item_t *in_head, *in_tail;
    node_load_t load;
    uint64_t history_sessions[NODE_MAX_HISTORY_SESSIONS]; /* Load.history_sessions */
    uint32_t n_history_sessions;
    uint64_t *resident_keys; /* [NODE_MAX_RESIDENT_SESSIONS] Load.resident_session_keys */
    uint64_t *resident_lens; /* [NODE_MAX_RESIDENT_SESSIONS] Load.resident_cached_lens */
    uint32_t n_resident;
    link_route_t *routes; /* [LINK_ROUTE_SLOTS]; only with more than one router */
    int woken;
    node_progress_t *progress; /* borrowed; NULL: none */
};

/* ---- node_link.c ------------------------------------------------------------------------- */

/* link_release_unsent - a PageReservation for router r alone (reservation `resv_id`) is dropped
 * before it left this node (r no longer accepts us, its outbox was full, the send failed): no
 * router and no writer ever saw the reservation, so an Abort{reservation_id, writer_fenced} goes
 * into the inbox as if r had answered it (router/control.c answers a late one so): the owner frees
 * its pages at once instead of holding them for its fence. No request_id: a retry of the request
 * under a new registration is not touched. Takes `lock`; call without it. Out of memory: logged,
 * the reservation then waits for its timeout and fence. */
void link_release_unsent(node_link_t *link, uint32_t r, uint64_t resv_id);

/* link_epoch - the lease epoch value of router r at count `count`. */
static inline uint64_t link_epoch(uint32_t r, uint64_t count)
{
    return ((uint64_t)r << LINK_EPOCH_ROUTER_SHIFT) | (count & LINK_EPOCH_COUNT_MASK);
}

/* link_route_key - the id that pairs a message with its answers: the request_id of the request
 * and reply bodies, SessionQuery/SessionHistory's query_id; 0 for the rest (heartbeats, Goodbye,
 * link errors). */
uint64_t link_route_key(const Tandem__Envelope *env);

/* link_route_note - remember that `key` (non-zero) came from router r. Caller holds lock. */
void link_route_note(node_link_t *link, uint64_t key, uint32_t r);

/* link_push - append item to a queue. */
void link_push(link_item_t **head, link_item_t **tail, link_item_t *item);

/* link_lease_ns - how long router r's lease lasts past the I/O thread's last run. */
uint64_t link_lease_ns(const link_router_t *router);

/* ---- node_link_io.c ---------------------------------------------------------------------- */

/* link_io_open - make router r's DEALER socket (CURVE client when params ask; ZMQ_IMMEDIATE, so
 * that nothing queues for a router that is not connected) and connect it. err as node_link_create.
 */
tdm_status_t link_io_open(node_link_t *link, uint32_t r, const node_link_params_t *params,
                          char *err, size_t err_bytes);

/* link_io_pack_register - pack the Register every router gets into link->register_buf. */
tdm_status_t link_io_pack_register(node_link_t *link, const node_link_params_t *params);

/* link_io_await_first - send Register to every router and wait (on the caller's thread) until
 * one accepts (TDM_OK), every one refused (TDM_ERR_MISMATCH, the reason in err) or timeout_ms
 * passed (TDM_ERR_TIMEOUT). The others keep being asked by the I/O thread. */
tdm_status_t link_io_await_first(node_link_t *link, uint32_t timeout_ms, char *err,
                                 size_t err_bytes);

/* link_io_main - the I/O thread (arg: the link). */
void *link_io_main(void *arg);

#endif
