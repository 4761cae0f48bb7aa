/* report.c - the decode node's reports on its sessions (report.h). */
#include "decode-node/report.h"

#include <stdlib.h>

#include "engine/seq_state.h"
#include "proto/proto_hash.h"

uint64_t decode_report_held(const decode_session_t *session)
{
    int64_t length;

    if (session->seq != NULL) {
        length = engine_seq_length(session->seq);
    } else if (session->tier_home != NULL && decode_tier_holds(session->tier_home, session->id)) {
        length = session->tier_len; /* demoted: its next turn brings it back first */
    } else {
        return 0;
    }
    if (session->n_ids < length) {
        length = session->n_ids;
    }
    return length > 0 ? (uint64_t)length : 0;
}

/* One held session while the list is sorted. */
typedef struct {
    uint64_t last_used_ns;
    uint64_t key;
    uint64_t held;
} report_entry_t;

/* Newest first; equal times by key, so the order does not depend on the table's. */
static int newest_first(const void *a, const void *b)
{
    const report_entry_t *x = a, *y = b;

    if (x->last_used_ns != y->last_used_ns) {
        return x->last_used_ns > y->last_used_ns ? -1 : 1;
    }
    return x->key < y->key ? -1 : x->key > y->key;
}

uint32_t decode_report_resident(const decode_sessions_t *sessions, uint64_t *keys_out,
                                uint64_t *lens_out, uint32_t max)
{
    uint32_t n_entries = decode_sessions_count(sessions);
    report_entry_t *entries;
    uint32_t n = 0;

    if (max == 0 || n_entries == 0) {
        return 0;
    }
    entries = malloc(n_entries * sizeof(*entries));
    if (entries == NULL) {
        return 0; /* out of memory: this report goes without the list (a hint only) */
    }
    for (uint32_t i = 0; i < n_entries; i++) {
        const decode_session_t *s = decode_sessions_at(sessions, i);
        uint64_t held = decode_report_held(s);

        if (held > 0) {
            entries[n].last_used_ns = s->last_used_ns;
            entries[n].key = proto_session_hash(s->id);
            entries[n].held = held;
            n++;
        }
    }
    qsort(entries, n, sizeof(*entries), newest_first);
    if (n > max) {
        n = max;
    }
    for (uint32_t i = 0; i < n; i++) {
        keys_out[i] = entries[i].key;
        lens_out[i] = entries[i].held;
    }
    free(entries);
    return n;
}

void decode_report_history(decode_sessions_t *sessions, const Tandem__SessionQuery *query,
                           Tandem__SessionHistory *history_out)
{
    Tandem__SessionHistory h = TANDEM__SESSION_HISTORY__INIT;
    const decode_session_t *s = decode_sessions_find(sessions, query->session_id);
    uint64_t held = s != NULL ? decode_report_held(s) : 0;

    h.query_id = query->query_id;
    h.session_id = query->session_id;
    if (held > 0) {
        h.found = 1;
        h.cached_len = held;
        h.n_tokens = (size_t)held;
        h.tokens = s->ids;
        h.tenant = s->tenant;
        h.prompt_len = (uint32_t)(s->prompt_len < held ? s->prompt_len : held);
    }
    *history_out = h;
}
