/* ring.h - consistent hashing of session ids onto the routers of one fleet (issue 18 item 3).
 *
 * Owns a sorted ring of virtual nodes: each router (a short text id, e.g. "router-0") is placed
 * ROUTER_RING_VNODES times at XXH3-64 of "<id>#<i>". A session id hashes (XXH3-64) to a point; its
 * owner is the first virtual node at or after that point (wrapping), its replica the next
 * virtual node of a different router. With V virtual nodes per router the share of each router
 * stays near 1/N and removing one router moves only the keys it owned (about 1/N of them) to the
 * others. Membership is fixed at build time (the --peers list); a router's liveness is the
 * caller's business (router/peers.h skips routers it cannot reach). Knows nothing of sockets.
 * Not thread-safe for writes; lookups on a built ring are read-only.
 */
#ifndef TANDEM_ROUTER_RING_H
#define TANDEM_ROUTER_RING_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* Virtual nodes per router (balance within about +-5 % for a handful of routers; 1024 x 64
 * members = 64 Ki points, 1 MiB). */
#define ROUTER_RING_VNODES 1024
/* Most routers on one ring. */
#define ROUTER_RING_MAX_MEMBERS 64
/* Longest router id, bytes (no NUL). */
#define ROUTER_RING_ID_BYTES 63

/* The ring; opaque. */
typedef struct router_ring router_ring_t;

/* router_ring_create - an empty ring. Returns TDM_OK or TDM_ERR_NO_MEMORY. */
tdm_status_t router_ring_create(router_ring_t **ring_out);

/* router_ring_destroy - free the ring. Accepts NULL. */
void router_ring_destroy(router_ring_t *ring);

/*
 * router_ring_add - add router `id` (1..ROUTER_RING_ID_BYTES printable bytes). Returns TDM_OK,
 * TDM_ERR_INVALID_ARG (bad or duplicate id, or ROUTER_RING_MAX_MEMBERS already) or
 * TDM_ERR_NO_MEMORY (ring unchanged).
 */
tdm_status_t router_ring_add(router_ring_t *ring, const char *id);

/* router_ring_remove - remove router `id`. Returns TDM_OK or TDM_ERR_NOT_FOUND. */
tdm_status_t router_ring_remove(router_ring_t *ring, const char *id);

/* router_ring_size - routers on the ring. */
size_t router_ring_size(const router_ring_t *ring);

/* router_ring_key - the ring point of a session id (XXH3-64 of its bytes). */
uint64_t router_ring_key(const char *session_id);

/*
 * router_ring_owners - the first n_out distinct routers clockwise from `key`: owners_out[0] is
 * the owner, [1] the replica, ... Each entry is the router's id (borrowed from the ring, valid
 * until it is removed). Returns how many were written (min(n_out, size)); 0 on an empty ring.
 */
size_t router_ring_owners(const router_ring_t *ring, uint64_t key, const char **owners_out,
                          size_t n_out);

#endif
