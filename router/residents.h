/* residents.h - which decode node holds which session, as the nodes report it (issue 18 item 3).
 *
 * Owns an index from a session key (proto_session_hash of its id) to the decode nodes that listed
 * it in Load.resident_session_keys, with the positions each holds (resident_cached_lens). Each
 * heartbeat replaces that node's whole list. Nodes are named by their incarnation id (the
 * ZeroMQ routing id), never by registry slot, so the index survives any registry layout; the
 * caller says which of them are still live when it looks a key up. This is what a router that
 * has no record of a session (restarted, or a peer served it) uses to find the node to ask
 * (SessionQuery). Knows nothing of sockets or sessions. Not thread-safe: the caller serialises
 * (the control state lock).
 */
#ifndef TANDEM_ROUTER_RESIDENTS_H
#define TANDEM_ROUTER_RESIDENTS_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* Longest node id, bytes (no NUL): PROTO_MAX_ID_BYTES. */
#define ROUTER_RESIDENTS_ID_BYTES 128

/* The index; opaque. */
typedef struct router_residents router_residents_t;

/* router_residents_create - an empty index. Returns TDM_OK or TDM_ERR_NO_MEMORY. */
tdm_status_t router_residents_create(router_residents_t **residents_out);

/* router_residents_destroy - free it. Accepts NULL. */
void router_residents_destroy(router_residents_t *residents);

/*
 * router_residents_update - node `node_id` now holds exactly the sessions keys[n] with
 * cached_lens[n] positions each (cached_lens may be NULL or shorter: missing lengths count as
 * 0). An identical list is a no-op. Returns TDM_OK, TDM_ERR_INVALID_ARG (bad id) or
 * TDM_ERR_NO_MEMORY (the node's old list is dropped: a missed report, not a wrong one).
 */
tdm_status_t router_residents_update(router_residents_t *residents, const char *node_id,
                                     const uint64_t *keys, size_t n_keys,
                                     const uint64_t *cached_lens, size_t n_cached_lens);

/* router_residents_forget - drop everything node `node_id` reported (it left). */
void router_residents_forget(router_residents_t *residents, const char *node_id);

/* Whether node `node_id` may be asked (live in the caller's registry): nonzero yes. */
typedef int router_residents_live_fn(void *ctx, const char *node_id);

/*
 * router_residents_lookup - among the live nodes (live(ctx, id) nonzero; live NULL: all) that
 * reported `key`, the one holding the most positions. Returns 1 with its id copied into
 * node_id_out (ROUTER_RESIDENTS_ID_BYTES + 1 bytes) and its length in *cached_len_out, or 0.
 */
int router_residents_lookup(const router_residents_t *residents, uint64_t key,
                            router_residents_live_fn *live, void *ctx, char *node_id_out,
                            uint64_t *cached_len_out);

/* router_residents_count - (key, node) pairs indexed. */
size_t router_residents_count(const router_residents_t *residents);

#endif
