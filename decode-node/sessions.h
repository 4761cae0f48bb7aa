/* sessions.h - the sessions resident on a decode node.
 *
 * Owns each session's engine sequence (its rings, pending halves, ids and the block tables that
 * own its pages) and its bookkeeping: busy (a turn or a reservation uses it), last use, turns
 * and mean pause, for session-aware eviction of idle sessions under page pressure
 * (decode_tier_score: idle time, size, how often it returns). An evicted session's state either
 * goes down a tier (decode-node/tier.h, moved by sched_tier.c; tier_home says where) or is
 * dropped (the router rebuilds it from its token history: the next turn gets ERROR_STATE_LOST).
 * Knows nothing of requests or the network.
 */
#ifndef TANDEM_DECODE_SESSIONS_H
#define TANDEM_DECODE_SESSIONS_H

#include <stdint.h>

#include "common/status.h"
#include "decode-node/tier.h"
#include "engine/seq_state.h"

/* One session (owned by the table). seq NULL: known but holding no state.
 * ids: the session's token ids of positions [0, n_ids) as far as the node saw them (deltas and
 * emitted tokens; a remote handoff without its delta's ids stops n_ids at its H), for a rewind
 * (engine_seq_truncate + replay, MODEL.md 6(d)(2)) to any p <= n_ids; malloc'ed, ids_cap
 * entries.
 * n_turns, gap_mean_ns: turns started here and the mean pause between them (the eviction score).
 * tier_home: non-NULL while the state is demoted (seq NULL, ids moved with it): the tiers that
 * hold it, until the next turn promotes it (sched_tier.c) or the state is dropped.
 * tenant, prompt_len: DecodeRequest.tenant and total_len (T, the prompt; the ids after it were
 * generated) of the session's latest turn, what SessionHistory reports (issue 18 item 3).
 * tier_len: while demoted, the positions of the state the tiers hold; ids then keep a copy of
 * the recorded ids (the tier has its own) so that routers can still be told the history
 * (decode-node/report.h). */
typedef struct {
    char id[129];
    engine_seq_t *seq;
    int busy;
    uint64_t last_used_ns;
    int32_t *ids;
    int64_t n_ids;
    int64_t ids_cap;
    uint32_t n_turns;
    uint64_t gap_mean_ns;
    decode_tier_t *tier_home;
    uint32_t tenant;
    uint64_t prompt_len;
    int64_t tier_len;
} decode_session_t;

typedef struct decode_sessions decode_sessions_t;

/* decode_sessions_create - an empty table of at most max_sessions. */
tdm_status_t decode_sessions_create(uint32_t max_sessions, decode_sessions_t **sessions_out);

/* decode_sessions_destroy - destroy every sequence (pages back to the pool). Accepts NULL. */
void decode_sessions_destroy(decode_sessions_t *sessions);

/* decode_sessions_find - the session `id`, or NULL. */
decode_session_t *decode_sessions_find(decode_sessions_t *sessions, const char *id);

/* decode_sessions_get - the session `id`, created empty when absent (evicting the least recently
 * used idle one when the table is full). Returns NULL when full of busy sessions or no memory. */
decode_session_t *decode_sessions_get(decode_sessions_t *sessions, const char *id);

/* decode_sessions_note_ids - record the ids of positions [pos, pos + n) of the session's history:
 * when pos <= n_ids they replace what was there and n_ids becomes pos + n (positions after them
 * are forgotten); when pos > n_ids (a gap the node never saw) nothing is recorded. Returns TDM_OK,
 * or TDM_ERR_NO_MEMORY (n_ids cut to pos: the history stays a true prefix). */
tdm_status_t decode_sessions_note_ids(decode_session_t *session, int64_t pos, const int32_t *ids,
                                      int64_t n);

/*
 * decode_sessions_last_ids - the ids of the last min(n_max, length) positions of the session's
 * sequence (length = engine_seq_length), oldest first, into ids_out; returns how many (0 without
 * a sequence). They come from the recorded history when it covers the sequence (n_ids >= length):
 * an imported sequence (a handoff's state record, a promotion from a tier) holds only the
 * record's last N - 1 ids, not the W + N - 1 a canonical-start replay (MODEL.md 6(d)(1)) or an
 * n-gram history reads. Else from the sequence (engine_seq_last_ids: right for a sequence that
 * ran every position here).
 */
int64_t decode_sessions_last_ids(const decode_session_t *session, int32_t *ids_out, int64_t n_max);

/* decode_sessions_forget_ids_from - cut the recorded history to positions [0, min(n_ids, pos)). */
void decode_sessions_forget_ids_from(decode_session_t *session, int64_t pos);

/* decode_sessions_drop_state - destroy the session's sequence (pages back) and forget its ids,
 * keep the entry; a demoted state is dropped from its tier too. */
void decode_sessions_drop_state(decode_session_t *session);

/* decode_sessions_remove - destroy the session and its entry. */
void decode_sessions_remove(decode_sessions_t *sessions, decode_session_t *session);

/* decode_sessions_victim - the idle session holding pages with the highest eviction score
 * (decode_tier_score of its idle time, pages and turns at now_ns; the least recently used among
 * equals), or NULL. */
decode_session_t *decode_sessions_victim(decode_sessions_t *sessions, uint64_t now_ns);

/* decode_sessions_note_turn - a turn of the session starts at now_ns: count it and fold the
 * pause since its last use into gap_mean_ns. */
void decode_sessions_note_turn(decode_session_t *session, uint64_t now_ns);

/* decode_sessions_evict_lru - drop the state of decode_sessions_victim (no tiers: the next turn
 * is rebuilt from history). Returns 1 when one was evicted, 0 when none could be. */
int decode_sessions_evict_lru(decode_sessions_t *sessions);

/* decode_sessions_count - entries in the table (with or without state); with decode_sessions_at
 * (i < count) the table can be walked, in no particular order, between two changes of it. */
uint32_t decode_sessions_count(const decode_sessions_t *sessions);
decode_session_t *decode_sessions_at(const decode_sessions_t *sessions, uint32_t i);

/* decode_sessions_n_resident - sessions holding a sequence. */
uint32_t decode_sessions_n_resident(const decode_sessions_t *sessions);

/* decode_sessions_n_pages - KV pages held by every resident session's block tables. */
uint32_t decode_sessions_n_pages(const decode_sessions_t *sessions);

#endif
