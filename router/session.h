/* session.h - the router's session table: token history, placement and the prefix index.
 *
 * Owns every session: its id (the client's X-Session-Id or one the router made), its token
 * history (prompt plus generated ids of the latest turn, what a lost decode node's cache is
 * rebuilt from), the decode worker it is placed on (slot + generation, so a lost worker's
 * sessions are recognisably unplaced), how many history tokens that worker is known to hold
 * (cached_len) and the block-hash chain over the history's full prefix-cache blocks, indexed so
 * a request without a session id finds the session with the longest cached prefix. A hash hit is
 * only a hint: matches are confirmed on tokens. Every session belongs to one tenant (the API key
 * that created it; 0 when the router runs without keys) and the prefix index never matches
 * across tenants. A match is a page-sharing hint for a new session, never a reason to attach a
 * request to the matched session (docs/PROTOCOL.md 3c). Idle sessions past the table's limit are
 * evicted least recently used first (a heap on last_used_ns: O(log N)); lookups by id and by
 * block hash use tables that grow with the sessions, so neither scans the table (issue 18). Knows
 * nothing of sockets, HTTP or placement policy. Not thread-safe: the caller serialises access (the
 * router's control state lock).
 */
#ifndef TANDEM_ROUTER_SESSION_H
#define TANDEM_ROUTER_SESSION_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* Longest session id, bytes (no NUL): PROTO_MAX_ID_BYTES. */
#define ROUTER_SESSION_ID_BYTES 128

/*
 * One session (owned by the table; fields readable by the caller, history changed only through
 * router_sessions_* so the index stays right).
 */
typedef struct router_session {
    char id[ROUTER_SESSION_ID_BYTES + 1];
    uint32_t tenant; /* owner: the API key's tenant id (0: keys off); fixed at creation */
    int32_t *tokens; /* [n_tokens] history */
    size_t n_tokens;
    size_t cap_tokens;
    size_t cached_len; /* history tokens the placed worker holds (a lower bound) */
    size_t prompt_len; /* prompt tokens of the latest turn (the rest was generated) */
    int worker_slot;   /* registry slot of the decode worker, -1 when unplaced */
    uint64_t worker_generation;
    uint64_t active_request; /* request id streaming on this session, 0 when idle */
    uint64_t last_used_ns;   /* monotonic */
    uint64_t *block_hashes;  /* [n_blocks] chain over history (proto_block_hashes) */
    size_t n_blocks;
    struct router_session *next_by_id; /* table internals */
} router_session_t;

/* The table; opaque. */
typedef struct router_sessions router_sessions_t;

/*
 * router_sessions_create - an empty table of at most max_sessions (>= 1) sessions, indexing
 * blocks of tokens_per_block (>= 1) tokens. Returns TDM_OK, TDM_ERR_INVALID_ARG or
 * TDM_ERR_NO_MEMORY.
 */
tdm_status_t router_sessions_create(uint32_t max_sessions, uint32_t tokens_per_block,
                                    router_sessions_t **table_out);

/* router_sessions_destroy - free every session. Accepts NULL. */
void router_sessions_destroy(router_sessions_t *table);

/* router_sessions_get - the session named `id`, or NULL. */
router_session_t *router_sessions_get(router_sessions_t *table, const char *id);

/*
 * router_sessions_add - a new empty, unplaced session named `id` (1..ROUTER_SESSION_ID_BYTES
 * bytes, not yet in the table) owned by `tenant`. When the table is full the least recently used
 * idle session is evicted first. Returns TDM_OK with *session_out (owned by the table),
 * TDM_ERR_INVALID_ARG (bad or duplicate id), TDM_ERR_BUSY (full and every session active) or
 * TDM_ERR_NO_MEMORY.
 */
tdm_status_t router_sessions_add(router_sessions_t *table, const char *id, uint32_t tenant,
                                 uint64_t now_ns, router_session_t **session_out);

/*
 * router_sessions_match_prefix - among the sessions of `tenant` only, the one whose history
 * shares the longest prefix of whole blocks with `tokens` [n_tokens], found through the
 * block-hash index and confirmed on tokens (among equally long matches, one of them, usually the
 * session that indexed that block last; the cost does not grow with the sessions that share the
 * prefix). Returns the session and its matched length in *matched_out (a multiple of
 * tokens_per_block), or NULL (and 0) when no full block matches.
 */
router_session_t *router_sessions_match_prefix(router_sessions_t *table, uint32_t tenant,
                                               const int32_t *tokens, size_t n_tokens,
                                               size_t *matched_out);

/*
 * router_sessions_set_history - replace the session's history with `tokens` [n_tokens]
 * (copied) and reindex its blocks; cached_len is clipped to the common prefix of the old and new
 * histories. Returns TDM_OK or TDM_ERR_NO_MEMORY (session unchanged).
 */
tdm_status_t router_sessions_set_history(router_sessions_t *table, router_session_t *session,
                                         const int32_t *tokens, size_t n_tokens);

/*
 * router_sessions_append - append generated ids to the history (indexing blocks that become
 * full). Returns TDM_OK or TDM_ERR_NO_MEMORY (session unchanged).
 */
tdm_status_t router_sessions_append(router_sessions_t *table, router_session_t *session,
                                    const int32_t *tokens, size_t n_tokens);

/*
 * router_sessions_unplace_worker - every session placed on (slot, generation) becomes unplaced
 * with cached_len 0 (its history stays: the next turn rebuilds it elsewhere). Returns how many.
 */
size_t router_sessions_unplace_worker(router_sessions_t *table, int slot, uint64_t generation);

/* router_sessions_count - sessions in the table. */
size_t router_sessions_count(const router_sessions_t *table);

/* router_common_prefix - length of the common prefix of two id arrays. */
size_t router_common_prefix(const int32_t *a, size_t n_a, const int32_t *b, size_t n_b);

#endif
