/* node_state.h - the sequence state of a remote prefill sent straight from the prefill node to
 * the decode node (issue 18 item 4; docs/PROTOCOL.md 3b "State off the router"), in the payload
 * of a transfer completion notice (transfer/notice.h) instead of inside the CompletionNotice the
 * router relays.
 *
 * The payload is a protobuf CompletionNotice (proto/tandem.proto) holding only what identifies
 * the job and what the router no longer relays: request_id, reservation_id, attempt, cached_len,
 * total_len, page_checksums (XXH3-64 of each page put, reservation order), state_record (MODEL.md
 * 7, the record at T) and state_checksum (XXH3-64 of the record). The router's message then has
 * state_direct set, n_pages, the same state_checksum and none of the large fields; the decode
 * node joins the two by reservation_id (decode-node/notices.h). Both nodes link this (library
 * tandem_node). Pure functions; nothing owned past the calls but what they return.
 */
#ifndef TANDEM_NODE_STATE_H
#define TANDEM_NODE_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "proto/proto.h"

/*
 * node_state_pack - the direct-state payload of notice `full` (the prefill node's whole notice,
 * borrowed): the fields above packed into a malloc'ed buffer (*bytes_out, free() it) of
 * *n_bytes_out bytes. Returns TDM_OK, TDM_ERR_INVALID_ARG (no state record, or a
 * state_checksum that is not the record's XXH3-64) or TDM_ERR_NO_MEMORY.
 */
tdm_status_t node_state_pack(const Tandem__CompletionNotice *full, uint8_t **bytes_out,
                             size_t *n_bytes_out);

/*
 * node_state_unpack - read a payload from a transfer notice (n_bytes at `bytes`, borrowed).
 * On TDM_OK *state_out is a new message (free with node_state_free) whose state record is
 * non-empty and hashes to its state_checksum, with total_len > cached_len and a nonzero
 * reservation_id. Returns TDM_ERR_FORMAT (not such a message), TDM_ERR_MISMATCH (record and
 * checksum disagree) or TDM_ERR_NO_MEMORY; *state_out untouched on error.
 */
tdm_status_t node_state_unpack(const uint8_t *bytes, size_t n_bytes,
                               Tandem__CompletionNotice **state_out);

/* node_state_free - free what node_state_unpack made. Accepts NULL. */
void node_state_free(Tandem__CompletionNotice *state);

#endif
