/* report.h - what a decode node tells routers about the sessions it holds (issue 18 item 3: no
 * single point of failure).
 *
 * A session's token history lives where it survives a router: on the decode node that holds its
 * KV (sessions.h records the ids of [0, n_ids), the tenant and the latest turn's prompt length).
 * This module reads that record for routers: the heartbeat's list of held sessions
 * (Load.resident_session_keys / resident_cached_lens: proto_session_hash keys, most recently used
 * first) and the answer to a SessionQuery (SessionHistory). A session counts while its state is
 * in the page pool or in a tier that still holds it (decode_tier_holds: its next turn promotes
 * it first; a state the tier dropped since is not reported). Knows nothing of sockets; builds no
 * envelope. Runs on the decode node's compute thread (it reads the session table).
 */
#ifndef TANDEM_DECODE_REPORT_H
#define TANDEM_DECODE_REPORT_H

#include <stdint.h>

#include "decode-node/sessions.h"
#include "proto/proto.h"

/*
 * decode_report_held - the positions of `session` a router can continue from with the ids this
 * node recorded: min(positions of its state, n_ids) (a handoff without its delta's ids holds more
 * KV than ids: a router then continues at the shorter length and the node rewinds to it); the
 * state is its sequence in the pool, or while demoted the one its tier holds (tier_len); 0 when
 * it has neither.
 */
uint64_t decode_report_held(const decode_session_t *session);

/*
 * decode_report_resident - the sessions with decode_report_held > 0, most recently used first
 * (last_used_ns, newest first), at most `max`: keys_out[i] = proto_session_hash(id) and
 * lens_out[i] = decode_report_held (both [max], caller's). Returns how many were written.
 * O(n log n) in the table's entries.
 */
uint32_t decode_report_resident(const decode_sessions_t *sessions, uint64_t *keys_out,
                                uint64_t *lens_out, uint32_t max);

/*
 * decode_report_history - the answer to `query` (borrowed): *history_out gets query_id and
 * session_id (borrowed from the query), and, when the table holds the session with
 * decode_report_held > 0, found, cached_len = that, tokens = its recorded ids of [0, cached_len)
 * (borrowed from the session: valid until the table or the session changes), tenant and
 * prompt_len (at most cached_len); else found = false and nothing more. history_out is
 * initialised here (TANDEM__SESSION_HISTORY__INIT first).
 */
void decode_report_history(decode_sessions_t *sessions, const Tandem__SessionQuery *query,
                           Tandem__SessionHistory *history_out);

#endif
