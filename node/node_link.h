/* node_link.h - a worker's control links to the routers of its fleet (docs/PROTOCOL.md sections
 * 1-2; several routers: issue 18 item 3, docs/DEPLOY.md "Several routers").
 *
 * Owns one ZeroMQ DEALER socket per router (routing id = the incarnation id, the same on every
 * router) and the one I/O thread that alone touches them: registration with each router (re-sent
 * with backoff until it accepts; again after its ERROR_NOT_REGISTERED), heartbeats with the load
 * the owner last published, one outbox per router and one inbox of what any router sent. Each
 * router's link lives on its own: a dead or unreachable router stalls neither the node nor the
 * other links (nothing is queued for a router that is not connected). An answer goes back on the
 * link its request came in on (the request_id, or a SessionQuery's query_id, names it; the link
 * remembers which router sent each); anything else goes to every router. The owner's compute
 * thread never blocks on the network: node_link_send queues, node_link_recv pops. Knows nothing
 * of the engine, pages or what the messages mean beyond their ids. Shared by tandem-decode and
 * tandem-prefill (library tandem_node; the sockets are node_link_io.c's).
 */
#ifndef TANDEM_NODE_LINK_H
#define TANDEM_NODE_LINK_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "node/node_progress.h"
#include "proto/proto.h"

/* Longest incarnation id, bytes without NUL (PROTO_MAX_ID_BYTES). */
#define NODE_ID_BYTES 128u

/* A worker's load as published for heartbeats (plain data; mirrors tandem.Load). */
typedef struct {
    uint64_t queued_prefill_tokens;
    uint32_t running_sequences;
    uint32_t free_pages;
    uint32_t total_pages;
    uint32_t reserved_pages;
    uint32_t resident_sessions;
    double recent_tokens_per_s;
} node_load_t;

/* What the worker registers with (plain data; strings and bytes borrowed for the call). */
typedef struct {
    const char *router_endpoint; /* tcp://HOST:PORT of the router's control socket, or a comma
                                    list of 1..NODE_LINK_MAX_ROUTERS of them (every router of
                                    the fleet: one link each) */
    Tandem__Role role;
    const char *incarnation_id; /* unique per process start; printable, no spaces */
    const char *rack;
    const char *node;
    uint64_t model_fingerprint;
    uint64_t weights_digest;       /* tdm_weights_digest of the checkpoint */
    const char *kv_layout;         /* engine_config_kv_layout, or NULL */
    const char *const *transports; /* [n_transports] lane classes (node_xfer_transports) */
    uint32_t n_transports;
    uint64_t max_tokens; /* Capacity.max_tokens: longest sequence it can hold */
    uint32_t page_bytes;
    uint32_t tokens_per_block;
    uint32_t max_context;
    const uint8_t *transfer_descriptor; /* xfer_pool_descriptor bytes, or NULL */
    size_t n_transfer_descriptor;
    uint32_t total_pages;
    uint32_t max_sequences;
    uint32_t max_batch_tokens;
    const char *http_endpoint; /* HOST:PORT of /health and /metrics */
    uint32_t register_timeout_ms;
    const char *curve_key;        /* this worker's CurveZMQ key file (common/curve.h), or NULL */
    const char *curve_router_key; /* the routers' public key file (every router of the fleet
                                     serves with the same key pair); set with curve_key */
    node_progress_t *progress;    /* optional (NULL: none): the link counts received messages not
                                     yet taken into it, and every heartbeat's Load carries its
                                     steps_completed, pending_work, stalled and draining; borrowed,
                                     must outlive the link */
} node_link_params_t;

typedef struct node_link node_link_t;

/* Most routers one link serves (the comma list of router_endpoint). */
#define NODE_LINK_MAX_ROUTERS 16u

/*
 * node_link_create - connect to every router, register and wait until one of them accepts (its
 * RegisterAck, up to register_timeout_ms), then start the I/O thread (heartbeats at the interval
 * each router announced). The routers that did not answer yet are asked again by the I/O thread
 * (Register re-sent after 100 ms, doubling up to 5 s; TCP reconnects likewise), independently.
 *
 * With curve_key and curve_router_key the link is a CURVE client (encrypted; the router lets it
 * in only when this worker's public key is on its allow-list, else the handshake fails and no
 * RegisterAck comes: TDM_ERR_TIMEOUT).
 *
 * Returns TDM_OK with *link_out; TDM_ERR_MISMATCH when the router refused the registration (its
 * reason in err); TDM_ERR_TIMEOUT (no answer); TDM_ERR_IO (ZeroMQ failure, errno text in err);
 * TDM_ERR_FORMAT / TDM_ERR_NOT_FOUND (a CURVE key file malformed or missing, reason in err);
 * TDM_ERR_INVALID_ARG (only one of the CURVE files); TDM_ERR_NO_MEMORY. err: err_bytes, may be 0.
 * Copies what it keeps.
 */
tdm_status_t node_link_create(const node_link_params_t *params, node_link_t **link_out, char *err,
                              size_t err_bytes);
/* (With several routers: TDM_ERR_MISMATCH only when every router refused; TDM_ERR_TIMEOUT when
 * none accepted in time; TDM_ERR_INVALID_ARG also for an empty list or more than
 * NODE_LINK_MAX_ROUTERS endpoints. A router that refuses while another accepted is logged and
 * asked again every 5 s.) */

/* node_link_destroy - send Goodbye{reason} to every router, stop the thread, close the sockets.
 * Accepts NULL. */
void node_link_destroy(node_link_t *link, const char *reason);

/*
 * node_link_send - pack `env` (borrowed) and queue it for the router its request came from
 * (link_route_key: request_id, or query_id; with one router: that one), or for every router when
 * that is not known (Goodbye, an Error without a request, a request forgotten by the route
 * table). A router that does not accept us (not registered) gets nothing. Thread-safe. Returns
 * TDM_OK, proto_pack's error (the message is dropped, logged by proto_pack) or TDM_ERR_NO_MEMORY
 * (no outbox took it: full, or out of memory; logged).
 * A PageReservation queued for its request's router alone that never leaves this node (that
 * router forgot us or became unreachable first, its outbox was full, the send failed) comes back
 * through node_link_recv as Abort{reservation_id, writer_fenced, request_id 0} from that router,
 * as the router answers a late one: nobody saw the reservation, so its pages can go back at once.
 */
tdm_status_t node_link_send(node_link_t *link, const Tandem__Envelope *env);

/*
 * node_link_recv - the next message from any router, waiting up to timeout_ms (0: do not wait).
 * Returns TDM_OK with *env_out (caller frees with proto_envelope_free) or TDM_ERR_TIMEOUT.
 * RegisterAck and ERROR_NOT_REGISTERED are handled by the link and never returned. Thread-safe.
 */
tdm_status_t node_link_recv(node_link_t *link, uint32_t timeout_ms, Tandem__Envelope **env_out);

/*
 * The lease (docs/PROTOCOL.md 4), kept per router: a worker that stood still (SIGSTOP, a stalled
 * host) past the router's heartbeat timeout may have been declared lost, its work retried elsewhere
 * and the pages it was writing reused; on resume it must write nothing more for that work. The I/O
 * thread runs at least once per heartbeat interval; a gap of a lease (heartbeat timeout less one
 * interval) between two runs starts a new lease epoch, and frames read after such a gap may
 * predate it (NODE_LINK_EPOCH_VOID) until the router's ERROR_NOT_REGISTERED arrives (it declared
 * us lost; what it sent before came first) or one lease has passed. A writer remembers the epoch of
 * the message that gave it its work and checks node_link_lease_valid right before each write.
 */
#define NODE_LINK_EPOCH_VOID UINT64_MAX
/* An epoch names its router: the bits from 48 up are the router's index in router_endpoint's
 * list, the low 48 count that router's epochs (with one router: 0, 1, 2, ...). A router that
 * declares this worker lost voids only its own work. */

/* node_link_recv_epoch - the lease epoch of the envelope the last successful node_link_recv
 * returned (NODE_LINK_EPOCH_VOID: it arrived right after a pause). Call from the thread that
 * receives. */
uint64_t node_link_recv_epoch(node_link_t *link);

/* node_link_lease_valid - nonzero while work received in `epoch` may still be done: no pause
 * since, and the I/O thread ran less than a lease ago. Thread-safe, lock-free. */
int node_link_lease_valid(node_link_t *link, uint64_t epoch);

/* node_link_registrations - how many times the link registered again after a router answered
 * ERROR_NOT_REGISTERED (a restarted router, or one that declared this worker lost), summed over
 * the routers; 0 after node_link_create. Each one also starts a new lease epoch with that router:
 * the work it sent before is void. A router's first registration (one that came up after
 * node_link_create) is not counted. Thread-safe, lock-free. */
uint64_t node_link_registrations(node_link_t *link);

/* node_link_router_registrations - node_link_registrations of router `router` alone (an index
 * into router_endpoint's list; 0 when out of range). Thread-safe, lock-free. */
uint64_t node_link_router_registrations(node_link_t *link, uint32_t router);

/* node_link_n_routers - how many routers the link serves (router_endpoint's list). */
uint32_t node_link_n_routers(const node_link_t *link);

/* node_link_n_registered - how many routers accept this worker now (registered, not forgotten
 * since). Thread-safe, lock-free. */
uint32_t node_link_n_registered(node_link_t *link);

/* node_link_recv_router - the router index of the envelope the last successful node_link_recv
 * returned. Call from the thread that receives. */
uint32_t node_link_recv_router(node_link_t *link);

/* node_link_request_router - the router index that sent the request (or query) `request_id`, or
 * -1 when not known (0 with one router). Thread-safe. */
int node_link_request_router(node_link_t *link, uint64_t request_id);

/* node_link_wake - make a waiting node_link_recv return early (signal handlers may not call
 * it; the owner's other threads may). */
void node_link_wake(node_link_t *link);

/* node_link_set_load - publish the load the next heartbeats carry. Thread-safe. */
void node_link_set_load(node_link_t *link, const node_load_t *load);

/* Most session keys a heartbeat carries in Load.history_sessions. */
#define NODE_MAX_HISTORY_SESSIONS PROTO_MAX_HISTORY_SESSIONS

/*
 * node_link_set_history_sessions - the session keys (proto_session_hash) whose history pages the
 * worker keeps, most recently used first, that the next heartbeats carry in
 * Load.history_sessions (keys[n], borrowed for the call; beyond NODE_MAX_HISTORY_SESSIONS cut).
 * Thread-safe.
 */
void node_link_set_history_sessions(node_link_t *link, const uint64_t *keys, uint32_t n);

/* Most session keys a heartbeat carries in Load.resident_session_keys. */
#define NODE_MAX_RESIDENT_SESSIONS PROTO_MAX_RESIDENT_SESSIONS

/*
 * node_link_set_resident_sessions - the sessions whose KV state a decode node holds, as
 * proto_session_hash(session_id) keys[n] with the positions held cached_lens[n], most recently
 * used first, that the next heartbeats carry in Load.resident_session_keys and
 * resident_cached_lens (borrowed for the call; beyond NODE_MAX_RESIDENT_SESSIONS cut). A
 * restarted or second router learns from them where each session lives (issue 18 item 3).
 * Thread-safe.
 */
void node_link_set_resident_sessions(node_link_t *link, const uint64_t *keys,
                                     const uint64_t *cached_lens, uint32_t n);

/* node_link_make_id - "ROLE-HOST-PID-RANDOM" into id (NODE_ID_BYTES + 1 bytes). */
void node_link_make_id(const char *role, char *id, size_t id_bytes);

#endif
