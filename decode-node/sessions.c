/* sessions.c - resident sessions of the decode node (sessions.h). */
#include "decode-node/sessions.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/log.h"

struct decode_sessions {
    decode_session_t **items;
    uint32_t n;
    uint32_t cap;
};

tdm_status_t decode_sessions_create(uint32_t max_sessions, decode_sessions_t **sessions_out)
{
    decode_sessions_t *t = calloc(1, sizeof(*t));

    if (t == NULL || max_sessions == 0) {
        free(t);
        return t == NULL ? TDM_ERR_NO_MEMORY : TDM_ERR_INVALID_ARG;
    }
    t->items = calloc(max_sessions, sizeof(*t->items));
    if (t->items == NULL) {
        free(t);
        return TDM_ERR_NO_MEMORY;
    }
    t->cap = max_sessions;
    *sessions_out = t;
    return TDM_OK;
}

void decode_sessions_destroy(decode_sessions_t *sessions)
{
    if (sessions == NULL) {
        return;
    }
    for (uint32_t i = 0; i < sessions->n; i++) {
        engine_seq_destroy(sessions->items[i]->seq);
        decode_tier_drop(sessions->items[i]->tier_home, sessions->items[i]->id);
        free(sessions->items[i]->ids);
        free(sessions->items[i]);
    }
    free(sessions->items);
    free(sessions);
}

decode_session_t *decode_sessions_find(decode_sessions_t *sessions, const char *id)
{
    for (uint32_t i = 0; i < sessions->n; i++) {
        if (strcmp(sessions->items[i]->id, id) == 0) {
            return sessions->items[i];
        }
    }
    return NULL;
}

/* Index of the least recently used idle session, or -1. */
static int lru_idle(const decode_sessions_t *sessions)
{
    int best = -1;

    for (uint32_t i = 0; i < sessions->n; i++) {
        const decode_session_t *s = sessions->items[i];
        if (s->busy) {
            continue;
        }
        if (best < 0 || s->last_used_ns < sessions->items[best]->last_used_ns) {
            best = (int)i;
        }
    }
    return best;
}

decode_session_t *decode_sessions_get(decode_sessions_t *sessions, const char *id)
{
    decode_session_t *s = decode_sessions_find(sessions, id);

    if (s != NULL) {
        return s;
    }
    if (sessions->n == sessions->cap) {
        int victim = lru_idle(sessions);
        if (victim < 0) {
            return NULL;
        }
        decode_sessions_remove(sessions, sessions->items[victim]);
    }
    s = calloc(1, sizeof(*s));
    if (s == NULL) {
        return NULL;
    }
    snprintf(s->id, sizeof(s->id), "%s", id);
    s->last_used_ns = tdm_clock_now_ns();
    sessions->items[sessions->n++] = s;
    return s;
}

tdm_status_t decode_sessions_note_ids(decode_session_t *session, int64_t pos, const int32_t *ids,
                                      int64_t n)
{
    if (pos > session->n_ids || n < 0) {
        return TDM_OK; /* a gap: the history past n_ids is unknown here */
    }
    if (pos + n > session->ids_cap) {
        size_t cap = (size_t)session->ids_cap;
        int32_t *grown = tdm_array_grow(session->ids, sizeof(*grown), (size_t)(pos + n), 256, &cap);
        if (grown == NULL) {
            session->n_ids = pos;
            return TDM_ERR_NO_MEMORY;
        }
        session->ids = grown;
        session->ids_cap = (int64_t)cap;
    }
    if (n > 0) {
        memcpy(session->ids + pos, ids, (size_t)n * sizeof(int32_t));
    }
    session->n_ids = pos + n;
    return TDM_OK;
}

int64_t decode_sessions_last_ids(const decode_session_t *session, int32_t *ids_out, int64_t n_max)
{
    int64_t length, n;

    if (session->seq == NULL || n_max <= 0) {
        return 0;
    }
    length = engine_seq_length(session->seq);
    if (session->n_ids < length) {
        return engine_seq_last_ids(session->seq, ids_out, n_max);
    }
    n = length < n_max ? length : n_max;
    if (n > 0) {
        memcpy(ids_out, session->ids + (length - n), (size_t)n * sizeof(int32_t));
    }
    return n;
}

void decode_sessions_forget_ids_from(decode_session_t *session, int64_t pos)
{
    if (pos < session->n_ids) {
        session->n_ids = pos > 0 ? pos : 0;
    }
}

void decode_sessions_drop_state(decode_session_t *session)
{
    engine_seq_destroy(session->seq);
    session->seq = NULL;
    session->n_ids = 0;
    decode_tier_drop(session->tier_home, session->id);
    session->tier_home = NULL;
}

void decode_sessions_remove(decode_sessions_t *sessions, decode_session_t *session)
{
    for (uint32_t i = 0; i < sessions->n; i++) {
        if (sessions->items[i] == session) {
            sessions->items[i] = sessions->items[--sessions->n];
            engine_seq_destroy(session->seq);
            decode_tier_drop(session->tier_home, session->id);
            free(session->ids);
            free(session);
            return;
        }
    }
}

decode_session_t *decode_sessions_victim(decode_sessions_t *sessions, uint64_t now_ns)
{
    decode_session_t *best = NULL;
    double best_score = 0;

    for (uint32_t i = 0; i < sessions->n; i++) {
        decode_session_t *s = sessions->items[i];
        decode_tier_usage_t u;
        double score;

        if (s->busy || s->seq == NULL) {
            continue;
        }
        u.last_used_ns = s->last_used_ns;
        u.n_turns = s->n_turns;
        u.gap_mean_ns = s->gap_mean_ns;
        u.size = engine_seq_n_pages(s->seq);
        score = decode_tier_score(&u, now_ns);
        if (best == NULL || score > best_score ||
            (score == best_score && s->last_used_ns < best->last_used_ns)) {
            best = s;
            best_score = score;
        }
    }
    return best;
}

void decode_sessions_note_turn(decode_session_t *session, uint64_t now_ns)
{
    if (session->n_turns > 0 && now_ns > session->last_used_ns) {
        uint64_t gap = now_ns - session->last_used_ns;
        uint64_t n_gaps = session->n_turns; /* gaps seen so far, this one included */
        session->gap_mean_ns =
            (uint64_t)(((double)session->gap_mean_ns * (double)(n_gaps - 1) + (double)gap) /
                       (double)n_gaps);
    }
    session->n_turns++;
}

int decode_sessions_evict_lru(decode_sessions_t *sessions)
{
    decode_session_t *victim = decode_sessions_victim(sessions, tdm_clock_now_ns());

    if (victim == NULL) {
        return 0;
    }
    tdm_log(TDM_LOG_INFO, "sessions", "idle session evicted under page pressure: session=%s",
            victim->id);
    decode_sessions_drop_state(victim);
    return 1;
}

uint32_t decode_sessions_n_resident(const decode_sessions_t *sessions)
{
    uint32_t n = 0;

    for (uint32_t i = 0; i < sessions->n; i++) {
        n += sessions->items[i]->seq != NULL;
    }
    return n;
}

uint32_t decode_sessions_n_pages(const decode_sessions_t *sessions)
{
    uint32_t n = 0;

    for (uint32_t i = 0; i < sessions->n; i++) {
        if (sessions->items[i]->seq != NULL) {
            n += engine_seq_n_pages(sessions->items[i]->seq);
        }
    }
    return n;
}

uint32_t decode_sessions_count(const decode_sessions_t *sessions)
{
    return sessions->n;
}

decode_session_t *decode_sessions_at(const decode_sessions_t *sessions, uint32_t i)
{
    return i < sessions->n ? sessions->items[i] : NULL;
}
