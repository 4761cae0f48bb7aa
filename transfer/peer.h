/* peer.h - a remote page pool of one peer incarnation, reached through a cached endpoint.
 *
 * Owns the UCX endpoint (peer error handling mode) and the unpacked remote key for one
 * (worker name, incarnation, pool) triple, cached in the context across jobs. A peer fails
 * alone: when UCX reports its endpoint lost, only that peer's batches fail (TDM_ERR_PEER_LOST),
 * its incarnation is retired, and the survivor carries on. A descriptor from a newer incarnation
 * of the same worker name retires the old one (its endpoint is force-closed, its batches fail);
 * descriptors and peer handles of retired incarnations are refused, never executed.
 * Knows nothing of jobs or page ownership.
 */
#ifndef TANDEM_TRANSFER_PEER_H
#define TANDEM_TRANSFER_PEER_H

#include <stdint.h>

#include "common/status.h"
#include "transfer/context.h"
#include "transfer/desc.h"
#include "transfer/lane.h"

typedef struct xfer_peer xfer_peer_t;

/*
 * xfer_peer_connect - the peer for a descriptor (from xfer_desc_parse), with one reference for
 * the caller.
 *
 * The cached peer is returned when (name, incarnation, pool id) matches a live one. Otherwise a
 * new endpoint is created from the worker address and the rkey unpacked; if the name was known
 * under another incarnation, that incarnation is retired first. Returns TDM_OK, or:
 *   TDM_ERR_PEER_LOST    the descriptor's incarnation was retired (restarted or failed): refused
 *   TDM_ERR_UNSUPPORTED  memory type this build cannot reach, or UCX finds no transport to the
 *                        peer under this context's transports (UCX's reason logged)
 *   TDM_ERR_INVALID_ARG  the descriptor names this very incarnation, or is inconsistent
 *   TDM_ERR_NO_MEMORY
 * *peer_out written only on success. Borrows desc only during the call.
 */
tdm_status_t xfer_peer_connect(xfer_context_t *ctx, const xfer_desc_t *desc,
                               xfer_peer_t **peer_out);

/*
 * xfer_peer_close - drop the caller's reference. A live peer stays cached in the context (its
 * endpoint reused by the next connect); a failed or retired one is freed once unreferenced and
 * idle. Accepts NULL.
 */
void xfer_peer_close(xfer_peer_t *peer);

/*
 * xfer_peer_status - TDM_OK while usable; TDM_ERR_PEER_LOST once its incarnation failed or was
 * retired; TDM_ERR_UNSUPPORTED after UCX chose a lane outside the transport requirement.
 */
tdm_status_t xfer_peer_status(const xfer_peer_t *peer);

/* xfer_peer_name - the worker name from the descriptor (owned by the peer). */
const char *xfer_peer_name(const xfer_peer_t *peer);

/* xfer_peer_incarnation_id - the incarnation the peer was connected to. */
uint64_t xfer_peer_incarnation_id(const xfer_peer_t *peer);

/* xfer_peer_n_pages / xfer_peer_page_size - the remote pool's geometry. */
uint32_t xfer_peer_n_pages(const xfer_peer_t *peer);
uint32_t xfer_peer_page_size(const xfer_peer_t *peer);

/*
 * xfer_peer_lane - the lane of the peer's most recent batch (XFER_LANE_UNKNOWN before the
 * first), into *lane_out.
 */
void xfer_peer_lane(const xfer_peer_t *peer, xfer_lane_t *lane_out);

#endif
