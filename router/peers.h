/* peers.h - the other routers of one fleet and the session replicas sent to them (issue 18
 * item 3).
 *
 * Owns the consistent-hash ring of router ids (this router and its --peers, router/ring.h) and
 * one ZeroMQ DEALER per peer, connected to that peer's control endpoint with the routing id
 * "peer:<own id>" (ZMQ_IMMEDIATE: nothing queues for a peer that is down; every send is
 * non-blocking, so a dead peer costs a failed send, never a stall). After each turn the router
 * that served it sends a SessionReplica to the session's owner and to the owner's successor on
 * the ring (the replica), skipping itself: whichever router a client reaches next holds the
 * session's history and its decode node, so it continues without asking. Peers never answer
 * replicas. Knows nothing of HTTP or dispatch. Not thread-safe: the control thread only.
 */
#ifndef TANDEM_ROUTER_PEERS_H
#define TANDEM_ROUTER_PEERS_H

#include <stddef.h>
#include <stdint.h>

#include "common/curve.h"
#include "common/status.h"
#include "proto/proto.h"

/* Longest --peers list, bytes. */
#define ROUTER_PEERS_SPEC_BYTES 4096
/* Routing-id prefix of a peer router on the control socket. */
#define ROUTER_PEERS_ID_PREFIX "peer:"

/* The peer set; opaque. */
typedef struct router_peers router_peers_t;

/*
 * router_peers_create - the ring of `self_id` and the peers of `spec`, a comma-separated list of
 * ID=ENDPOINT (e.g. "router-1=tcp://10.0.0.2:5557,router-2=tcp://10.0.0.3:5557"; an entry naming
 * self_id is skipped, so every router can take the same list), each connected through a DEALER
 * of `zctx`. With `curve` (the router's key pair, borrowed; NULL: plain TCP) each link is a
 * CURVE client presenting that key pair to a server of the same public key: the routers of one
 * fleet share one key pair and each admits it (router/control.c adds it to its allow-list).
 * spec NULL or "" is a ring of one (no peers). Returns TDM_OK, TDM_ERR_INVALID_ARG (a
 * malformed entry or id, with the reason in err) or TDM_ERR_NO_MEMORY / TDM_ERR_IO (socket).
 */
tdm_status_t router_peers_create(void *zctx, const char *self_id, const char *spec,
                                 const tdm_curve_keypair_t *curve, router_peers_t **peers_out,
                                 char *err, size_t err_bytes);

/* router_peers_destroy - close the sockets and free. Accepts NULL. */
void router_peers_destroy(router_peers_t *peers);

/* router_peers_count - peers (routers other than this one). */
size_t router_peers_count(const router_peers_t *peers);

/*
 * router_peers_owner - the session's owner router id (borrowed), and whether it is this one in
 * *is_self_out (may be NULL).
 */
const char *router_peers_owner(const router_peers_t *peers, const char *session_id,
                               int *is_self_out);

/*
 * router_peers_replicate - send `replica` to the session's owner and replica routers other than
 * this one. Returns how many sends were queued (0..2); a peer that is down is skipped and counted
 * in router_peers_send_failures.
 */
size_t router_peers_replicate(router_peers_t *peers, const Tandem__SessionReplica *replica);

/* router_peers_send_failures - replica sends that found their peer unreachable, since start. */
uint64_t router_peers_send_failures(const router_peers_t *peers);

/* router_peers_drain - read and drop anything the peers sent back (none expected). */
void router_peers_drain(router_peers_t *peers);

#endif
