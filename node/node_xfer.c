/* node_xfer.c - the workers' KV-transfer flags (node_xfer.h). */
#include "node/node_xfer.h"

#include <stdio.h>
#include <string.h>

#include "transfer/lane.h"

tdm_status_t node_xfer_params(const char *prog, const char *transports, const char *protocols,
                              const char *require_transport, xfer_context_params_t *params)
{
    xfer_context_params_default(params);
    if (xfer_lane_mask_parse(require_transport, &params->required_lanes) != TDM_OK) {
        fprintf(stderr, "%s: --require-transport=%s: unknown lane class\n", prog,
                require_transport);
        return TDM_ERR_INVALID_ARG;
    }
    params->transports = transports;
    if (protocols == NULL || strcmp(protocols, "v2") != 0) {
        params->flags |= XFER_CONTEXT_PROTO_V1;
    }
    return TDM_OK;
}
