/* notices.c - state notices and the DecodeRequests waiting for them (notices.h). */
#include "decode-node/notices.h"

#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "node/node_state.h"

/* An arrived notice or a waiting request (one list each, oldest first). */
typedef struct entry {
    uint64_t reservation_id;
    uint64_t request_id;
    uint64_t t_ns;                   /* arrival (notice) or park time (request) */
    Tandem__CompletionNotice *state; /* notices */
    uint8_t *dr_bytes;               /* requests: the packed DecodeRequest */
    size_t n_dr_bytes;
    struct entry *next;
} entry_t;

struct decode_notices {
    decode_notices_params_t params;
    entry_t *notices;
    entry_t *requests;
    decode_notices_stats_t stats;
};

static void entry_free(entry_t *e)
{
    node_state_free(e->state);
    free(e->dr_bytes);
    free(e);
}

/* Unlink and return the first entry of *list for which key matches, or NULL. */
static entry_t *unlink_by(entry_t **list, uint64_t reservation_id, uint64_t request_id)
{
    for (entry_t **pp = list; *pp != NULL; pp = &(*pp)->next) {
        entry_t *e = *pp;
        if ((reservation_id != 0 && e->reservation_id == reservation_id) ||
            (request_id != 0 && e->request_id == request_id)) {
            *pp = e->next;
            e->next = NULL;
            return e;
        }
    }
    return NULL;
}

static void append(entry_t **list, entry_t *e)
{
    entry_t **pp = list;

    while (*pp != NULL) {
        pp = &(*pp)->next;
    }
    *pp = e;
}

tdm_status_t decode_notices_create(const decode_notices_params_t *params, decode_notices_t **out)
{
    decode_notices_t *n = calloc(1, sizeof(*n));

    if (n == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    if (params != NULL) {
        n->params = *params;
    }
    if (n->params.wait_ms == 0) {
        n->params.wait_ms = DECODE_NOTICES_WAIT_MS_DEFAULT;
    }
    if (n->params.keep_ms == 0) {
        n->params.keep_ms = DECODE_NOTICES_KEEP_MS_DEFAULT;
    }
    if (n->params.max_entries == 0) {
        n->params.max_entries = DECODE_NOTICES_MAX_DEFAULT;
    }
    *out = n;
    return TDM_OK;
}

void decode_notices_destroy(decode_notices_t *n)
{
    if (n == NULL) {
        return;
    }
    for (entry_t *list[2] = {n->notices, n->requests}, **l = list; l < list + 2; l++) {
        while (*l != NULL) {
            entry_t *next = (*l)->next;
            entry_free(*l);
            *l = next;
        }
    }
    free(n);
}

tdm_status_t decode_notices_put(decode_notices_t *n, Tandem__CompletionNotice *state,
                                uint64_t now_ns)
{
    entry_t *e, *old;

    if (n == NULL || state == NULL) {
        node_state_free(state);
        return TDM_ERR_INVALID_ARG;
    }
    e = calloc(1, sizeof(*e));
    if (e == NULL) {
        node_state_free(state);
        return TDM_ERR_NO_MEMORY;
    }
    old = unlink_by(&n->notices, state->reservation_id, 0);
    if (old != NULL) { /* a second notice for one reservation: the newer one counts */
        entry_free(old);
        n->stats.held--;
    }
    if (n->stats.held >= n->params.max_entries && n->notices != NULL) {
        old = n->notices;
        n->notices = old->next;
        tdm_log(TDM_LOG_WARN, "notices", "state notice dropped (table full): reservation=%llu",
                (unsigned long long)old->reservation_id);
        entry_free(old);
        n->stats.held--;
        n->stats.expired_total++;
    }
    e->reservation_id = state->reservation_id;
    e->request_id = state->request_id;
    e->t_ns = now_ns;
    e->state = state;
    append(&n->notices, e);
    n->stats.held++;
    n->stats.arrived_total++;
    n->stats.state_bytes_total += state->state_record.len + 8 * state->n_page_checksums;
    return TDM_OK;
}

void decode_notices_on_xfer(void *arg, const xfer_notice_t *notice)
{
    decode_notices_t *n = arg;
    Tandem__CompletionNotice *state = NULL;
    tdm_status_t status = notice->status;

    if (status == TDM_OK) {
        status = node_state_unpack(notice->payload, notice->payload_bytes, &state);
    }
    if (status != TDM_OK) {
        n->stats.bad_total++;
        tdm_log(TDM_LOG_WARN, "notices",
                "transfer notice refused: sender=%s job=%llu payload_bytes=%zu status=%s",
                notice->sender_name, (unsigned long long)notice->job_id, notice->payload_bytes,
                tdm_status_name(status));
        return;
    }
    tdm_log(TDM_LOG_DEBUG, "notices",
            "state notice: sender=%s request=%llu reservation=%llu record_bytes=%zu pages=%zu",
            notice->sender_name, (unsigned long long)state->request_id,
            (unsigned long long)state->reservation_id, state->state_record.len,
            state->n_page_checksums);
    (void)decode_notices_put(n, state, tdm_clock_now_ns());
}

Tandem__CompletionNotice *decode_notices_take(decode_notices_t *n, uint64_t reservation_id)
{
    entry_t *e = reservation_id != 0 ? unlink_by(&n->notices, reservation_id, 0) : NULL;
    Tandem__CompletionNotice *state;

    if (e == NULL) {
        return NULL;
    }
    state = e->state;
    e->state = NULL;
    entry_free(e);
    n->stats.held--;
    n->stats.notice_first_total++;
    return state;
}

tdm_status_t decode_notices_park(decode_notices_t *n, const Tandem__DecodeRequest *dr,
                                 uint64_t now_ns)
{
    entry_t *e;

    if (n == NULL || dr == NULL || dr->handoff == NULL || dr->handoff->reservation_id == 0) {
        return TDM_ERR_INVALID_ARG;
    }
    if (n->stats.waiting >= n->params.max_entries) {
        return TDM_ERR_BUSY;
    }
    e = calloc(1, sizeof(*e));
    if (e == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    e->n_dr_bytes = tandem__decode_request__get_packed_size(dr);
    e->dr_bytes = malloc(e->n_dr_bytes > 0 ? e->n_dr_bytes : 1);
    if (e->dr_bytes == NULL) {
        free(e);
        return TDM_ERR_NO_MEMORY;
    }
    e->n_dr_bytes = tandem__decode_request__pack(dr, e->dr_bytes);
    e->reservation_id = dr->handoff->reservation_id;
    e->request_id = dr->request_id;
    e->t_ns = now_ns;
    append(&n->requests, e);
    n->stats.waiting++;
    return TDM_OK;
}

decode_notices_event_t decode_notices_next(decode_notices_t *n, uint64_t now_ns,
                                           Tandem__DecodeRequest **dr_out,
                                           Tandem__CompletionNotice **state_out)
{
    uint64_t keep_ns = (uint64_t)n->params.keep_ms * TDM_NS_PER_MS;
    uint64_t wait_ns = (uint64_t)n->params.wait_ms * TDM_NS_PER_MS;

    while (n->notices != NULL && now_ns > n->notices->t_ns && now_ns - n->notices->t_ns > keep_ns) {
        entry_t *old = n->notices;
        n->notices = old->next;
        tdm_log(TDM_LOG_WARN, "notices",
                "state notice dropped unclaimed after %u ms: request=%llu reservation=%llu",
                n->params.keep_ms, (unsigned long long)old->request_id,
                (unsigned long long)old->reservation_id);
        entry_free(old);
        n->stats.held--;
        n->stats.expired_total++;
    }
    *dr_out = NULL;
    *state_out = NULL;
    for (entry_t **pp = &n->requests; *pp != NULL; pp = &(*pp)->next) {
        entry_t *e = *pp;
        entry_t *notice = NULL;
        decode_notices_event_t ev;

        for (entry_t *m = n->notices; m != NULL; m = m->next) {
            if (m->reservation_id == e->reservation_id) {
                notice = m;
                break;
            }
        }
        if (notice != NULL) {
            ev = DECODE_NOTICES_READY;
        } else if (now_ns > e->t_ns && now_ns - e->t_ns >= wait_ns) {
            ev = DECODE_NOTICES_TIMEOUT;
        } else {
            continue;
        }
        *pp = e->next;
        n->stats.waiting--;
        *dr_out = tandem__decode_request__unpack(NULL, e->n_dr_bytes, e->dr_bytes);
        if (ev == DECODE_NOTICES_READY) {
            notice = unlink_by(&n->notices, e->reservation_id, 0);
            *state_out = notice->state;
            notice->state = NULL;
            entry_free(notice);
            n->stats.held--;
            n->stats.request_first_total++;
        } else {
            n->stats.timeouts_total++;
        }
        entry_free(e);
        if (*dr_out == NULL) { /* out of memory: the copy packed from a checked message */
            node_state_free(*state_out);
            *state_out = NULL;
            return DECODE_NOTICES_NONE;
        }
        return ev;
    }
    return DECODE_NOTICES_NONE;
}

int decode_notices_drop(decode_notices_t *n, uint64_t reservation_id)
{
    entry_t *e;
    int waiting = 0;

    if (reservation_id == 0) {
        return 0;
    }
    while ((e = unlink_by(&n->notices, reservation_id, 0)) != NULL) {
        entry_free(e);
        n->stats.held--;
        n->stats.expired_total++;
    }
    while ((e = unlink_by(&n->requests, reservation_id, 0)) != NULL) {
        entry_free(e);
        n->stats.waiting--;
        waiting = 1;
    }
    return waiting;
}

uint64_t decode_notices_drop_request(decode_notices_t *n, uint64_t request_id)
{
    entry_t *e;
    uint64_t reservation_id = 0;

    if (request_id == 0) {
        return 0;
    }
    while ((e = unlink_by(&n->requests, 0, request_id)) != NULL) {
        reservation_id = e->reservation_id;
        entry_free(e);
        n->stats.waiting--;
    }
    return reservation_id;
}

void decode_notices_stats(const decode_notices_t *n, decode_notices_stats_t *out)
{
    *out = n->stats;
}

uint32_t decode_notices_wait_ms(const decode_notices_t *n)
{
    return n->params.wait_ms;
}
