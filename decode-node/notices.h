/* notices.h - the decode node's half of "sequence state off the router" (issue 18 item 4,
 * docs/PROTOCOL.md 3b): the state records and page checksums that prefill nodes send straight
 * here in transfer notices (node/node_state.h), joined with the router's small CompletionNotice
 * (state_direct) of the same reservation, whichever of the two arrives first.
 *
 * Two tables keyed by reservation id:
 *   arrived notices  - a transfer notice came in (decode_notices_on_xfer, the transfer context's
 *                      notice callback) before the router's DecodeRequest: kept until the
 *                      DecodeRequest takes it (decode_notices_take), its reservation is aborted
 *                      (decode_notices_drop) or keep_ms pass (decode_notices_next drops it);
 *   waiting requests - a DecodeRequest (PREFILL_REMOTE, handoff.state_direct) came in before its
 *                      notice: a copy waits (decode_notices_park) until the notice arrives
 *                      (decode_notices_next hands both back: READY) or wait_ms pass (TIMEOUT: the
 *                      scheduler fails that request alone and frees its reservation's pages).
 * Owns the copies it keeps. Not thread-safe: everything runs on the decode node's main thread
 * (the transfer context delivers notices from xfer_context_progress, called there).
 */
#ifndef TANDEM_DECODE_NODE_NOTICES_H
#define TANDEM_DECODE_NODE_NOTICES_H

#include <stdint.h>

#include "common/status.h"
#include "proto/proto.h"
#include "transfer/notice.h"

#define DECODE_NOTICES_WAIT_MS_DEFAULT 5000u  /* a DecodeRequest waits this long for its state */
#define DECODE_NOTICES_KEEP_MS_DEFAULT 60000u /* an unclaimed notice is kept this long */
#define DECODE_NOTICES_MAX_DEFAULT     1024u  /* most notices and requests kept at once, each */

/* How the tables behave (plain data, copied at create; 0 fields take the defaults). */
typedef struct {
    uint32_t wait_ms; /* DecodeRequest -> its notice */
    uint32_t keep_ms; /* notice -> its DecodeRequest (or its reservation's end) */
    uint32_t max_entries;
} decode_notices_params_t;

/* Counters (plain data, for /metrics and tests). */
typedef struct {
    uint64_t arrived_total;       /* well-formed state notices received */
    uint64_t bad_total;           /* notices refused: payload not a state, checksum, page check */
    uint64_t notice_first_total;  /* joins where the notice was there before the DecodeRequest */
    uint64_t request_first_total; /* joins where the DecodeRequest waited for the notice */
    uint64_t timeouts_total;      /* DecodeRequests whose notice did not come within wait_ms */
    uint64_t expired_total;       /* notices dropped unclaimed (keep_ms, full table, released) */
    uint64_t state_bytes_total;   /* payload bytes of the arrived notices */
    uint32_t held;                /* notices kept now */
    uint32_t waiting;             /* DecodeRequests waiting now */
} decode_notices_stats_t;

typedef struct decode_notices decode_notices_t;

/* decode_notices_create - empty tables. params may be NULL (defaults). TDM_OK or
 * TDM_ERR_NO_MEMORY. */
tdm_status_t decode_notices_create(const decode_notices_params_t *params, decode_notices_t **out);

/* decode_notices_destroy - free everything kept. Accepts NULL. */
void decode_notices_destroy(decode_notices_t *n);

/*
 * decode_notices_on_xfer - an xfer_notice_fn (transfer/notice.h; arg: the tables): a notice
 * with a good verdict whose payload unpacks (node_state_unpack) is kept by its reservation id
 * (one already kept for that id is replaced); anything else is counted in bad_total and logged.
 */
void decode_notices_on_xfer(void *arg, const xfer_notice_t *notice);

/*
 * decode_notices_put - keep `state` (ownership passes here; node_state_unpack's form) as arrived
 * at now_ns: what decode_notices_on_xfer does after unpacking (tests call it directly). When
 * the table is full the oldest notice is dropped (counted as expired). TDM_OK or
 * TDM_ERR_INVALID_ARG (NULL).
 */
tdm_status_t decode_notices_put(decode_notices_t *n, Tandem__CompletionNotice *state,
                                uint64_t now_ns);

/* decode_notices_take - the arrived notice of reservation_id, taken out (the caller frees it
 * with node_state_free), or NULL when none arrived (yet). Counts a notice-first join. */
Tandem__CompletionNotice *decode_notices_take(decode_notices_t *n, uint64_t reservation_id);

/*
 * decode_notices_park - keep a copy of DecodeRequest `dr` (borrowed; REMOTE, with a handoff)
 * until its reservation's notice arrives or wait_ms from now_ns pass. Returns TDM_OK,
 * TDM_ERR_BUSY (max_entries requests wait already), TDM_ERR_INVALID_ARG or TDM_ERR_NO_MEMORY.
 */
tdm_status_t decode_notices_park(decode_notices_t *n, const Tandem__DecodeRequest *dr,
                                 uint64_t now_ns);

/* What decode_notices_next hands back. */
typedef enum {
    DECODE_NOTICES_NONE = 0,    /* nothing to do now */
    DECODE_NOTICES_READY = 1,   /* a waiting request's notice arrived: *dr_out and *state_out */
    DECODE_NOTICES_TIMEOUT = 2, /* a waiting request's notice did not come: *dr_out only */
} decode_notices_event_t;

/*
 * decode_notices_next - one event at now_ns: a waiting request whose notice arrived (READY), or
 * one past its wait (TIMEOUT); first drops notices kept past keep_ms. *dr_out (free with
 * tandem__decode_request__free_unpacked(.., NULL)) and *state_out (node_state_free) are the
 * caller's. Call until NONE.
 */
decode_notices_event_t decode_notices_next(decode_notices_t *n, uint64_t now_ns,
                                           Tandem__DecodeRequest **dr_out,
                                           Tandem__CompletionNotice **state_out);

/* decode_notices_drop - reservation_id was aborted: forget its notice and its waiting request
 * (no answer: the router aborted the turn). Returns 1 when a request was waiting. */
int decode_notices_drop(decode_notices_t *n, uint64_t reservation_id);

/* decode_notices_drop_request - forget the waiting request request_id (an Abort). Returns the
 * reservation id it waited with, or 0 when none was waiting. */
uint64_t decode_notices_drop_request(decode_notices_t *n, uint64_t request_id);

/* decode_notices_wait_ms - the wait a DecodeRequest gets for its notice (params.wait_ms). */
uint32_t decode_notices_wait_ms(const decode_notices_t *n);

/* decode_notices_stats - the counters now. */
void decode_notices_stats(const decode_notices_t *n, decode_notices_stats_t *out);

#endif
