/* node_xfer.h - the KV-transfer context settings both workers take from their flags
 * (--transports, --ucx-protocols, --require-transport): one reading of them for tandem-decode and
 * tandem-prefill (library tandem_node). Owns nothing.
 */
#ifndef TANDEM_NODE_XFER_H
#define TANDEM_NODE_XFER_H

#include "common/status.h"
#include "transfer/context.h"

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

#endif
