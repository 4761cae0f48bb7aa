/* node_xfer.h - the KV-transfer context settings both workers take from their flags
 * (--transports, --ucx-protocols, --require-transport): one reading of them for tandem-decode and
 * tandem-prefill (library tandem_node). Owns nothing.
 */
#ifndef TANDEM_NODE_XFER_H
#define TANDEM_NODE_XFER_H

#include <stdint.h>

#include "common/status.h"
#include "transfer/context.h"
#include "transfer/lane.h"

/*
 * node_xfer_params - xfer_context_params_default into *params, then: transports = `transports`
 * (UCX_TLS syntax, borrowed; NULL: UCX decides), the v1 protocols unless `protocols` is "v2"
 * (transfer/README.md), and required_lanes from `require_transport` (xfer_lane_mask_parse:
 * NULL, "" or "any" require nothing). The caller sets params->name once its worker id exists.
 * Meant to run before the model loads, so a bad flag fails in milliseconds.
 *
 * Returns TDM_OK, or TDM_ERR_INVALID_ARG for an unknown lane class after printing
 * "<prog>: --require-transport=<text>: unknown lane class" on stderr.
 */
tdm_status_t node_xfer_params(const char *prog, const char *transports, const char *protocols,
                              const char *require_transport, xfer_context_params_t *params);

/* Most names node_xfer_transports declares. */
#define NODE_XFER_MAX_TRANSPORTS 16u
/* Longest declared name, bytes with the NUL. */
#define NODE_XFER_TRANSPORT_BYTES 33u

/* The transports a worker declares in Register.transports (plain data). */
typedef struct {
    char names[NODE_XFER_MAX_TRANSPORTS][NODE_XFER_TRANSPORT_BYTES];
    uint32_t n_names;
} node_xfer_transports_t;

/*
 * node_xfer_transports - the peer-to-peer lane classes this worker's endpoint can use, as the
 * router compares them (issue 16: a prefill node and a decode node that share none cannot move
 * pages, so the router never pairs them): from `transports` (--transports, UCX_TLS syntax;
 * NULL: the UCX_TLS environment variable; neither: every class), each UCX name or alias mapped
 * to its lane class (transfer/lane.h: "sysv", "posix", "cma", "sm", "shm" -> shm; "rc_mlx5",
 * "rc" -> rc; "ib" -> rc, ud, dc; "cuda" -> cuda_ipc; "all" -> every class; "^a,b" -> every
 * class but those), a name it does not know kept as written; then restricted to
 * `required_lanes` when that is not 0 (--require-transport). "self", "cuda_copy" and
 * "gdr_copy" are local staging, not a path to a peer, and never declared. Pure.
 */
void node_xfer_transports(const char *transports, xfer_lane_mask_t required_lanes,
                          node_xfer_transports_t *out);

#endif
