/* node_xfer.c - the workers' KV-transfer flags (node_xfer.h). */
#include "node/node_xfer.h"

#include <stdio.h>
#include <stdlib.h>
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

/* The classes a worker can reach a peer over (never self or local staging copies). */
#define PEER_CLASSES                                                                              \
    (XFER_LANE_BIT(XFER_LANE_TCP) | XFER_LANE_BIT(XFER_LANE_SHM) | XFER_LANE_BIT(XFER_LANE_RC) |  \
     XFER_LANE_BIT(XFER_LANE_DC) | XFER_LANE_BIT(XFER_LANE_UD) |                                  \
     XFER_LANE_BIT(XFER_LANE_CUDA_IPC))

/* UCX_TLS aliases that name several transports (UCX 1.13 ucs/config aliases). */
static const struct {
    const char *alias;
    xfer_lane_mask_t classes;
} g_aliases[] = {
    {"all", PEER_CLASSES},
    {"sm", XFER_LANE_BIT(XFER_LANE_SHM)},
    {"shm", XFER_LANE_BIT(XFER_LANE_SHM)},
    {"mm", XFER_LANE_BIT(XFER_LANE_SHM)},
    {"ib", XFER_LANE_BIT(XFER_LANE_RC) | XFER_LANE_BIT(XFER_LANE_UD) | XFER_LANE_BIT(XFER_LANE_DC)},
    {"rc", XFER_LANE_BIT(XFER_LANE_RC)},
    {"rc_v", XFER_LANE_BIT(XFER_LANE_RC)},
    {"rc_x", XFER_LANE_BIT(XFER_LANE_RC)},
    {"ud", XFER_LANE_BIT(XFER_LANE_UD)},
    {"ud_v", XFER_LANE_BIT(XFER_LANE_UD)},
    {"ud_x", XFER_LANE_BIT(XFER_LANE_UD)},
    {"dc", XFER_LANE_BIT(XFER_LANE_DC)},
    {"dc_x", XFER_LANE_BIT(XFER_LANE_DC)},
    {"cuda", XFER_LANE_BIT(XFER_LANE_CUDA_IPC)},
};

static void add_name(node_xfer_transports_t *out, const char *name, size_t n_chars)
{
    if (n_chars == 0 || n_chars >= NODE_XFER_TRANSPORT_BYTES ||
        out->n_names == NODE_XFER_MAX_TRANSPORTS) {
        return;
    }
    for (uint32_t i = 0; i < out->n_names; i++) {
        if (strlen(out->names[i]) == n_chars && strncmp(out->names[i], name, n_chars) == 0) {
            return;
        }
    }
    for (size_t i = 0; i < n_chars; i++) {
        unsigned char c = (unsigned char)name[i];
        if (c <= 0x20 || c >= 0x7f) {
            return; /* not a name the protocol can carry */
        }
    }
    memcpy(out->names[out->n_names], name, n_chars);
    out->names[out->n_names][n_chars] = '\0';
    out->n_names++;
}

/* The classes of one UCX_TLS word; 0 with *unknown set when it names nothing Tandem knows. */
static xfer_lane_mask_t classes_of(const char *word, size_t n_chars, int *unknown)
{
    xfer_lane_class_t cls;

    *unknown = 0;
    for (size_t i = 0; i < sizeof(g_aliases) / sizeof(g_aliases[0]); i++) {
        if (strlen(g_aliases[i].alias) == n_chars &&
            strncmp(g_aliases[i].alias, word, n_chars) == 0) {
            return g_aliases[i].classes;
        }
    }
    cls = xfer_lane_class_of_transport(word, n_chars);
    if (cls == XFER_LANE_UNKNOWN) {
        *unknown = 1;
        return 0;
    }
    return XFER_LANE_BIT(cls) & PEER_CLASSES;
}

void node_xfer_transports(const char *transports, xfer_lane_mask_t required_lanes,
                          node_xfer_transports_t *out)
{
    const char *text = transports != NULL ? transports : getenv("UCX_TLS");
    xfer_lane_mask_t mask = 0;
    int negate = 0;
    const char *p;

    memset(out, 0, sizeof(*out));
    if (text == NULL || text[0] == '\0') {
        mask = PEER_CLASSES;
    } else {
        p = text;
        if (*p == '^') {
            negate = 1;
            p++;
        }
        while (*p != '\0') {
            const char *end = strchr(p, ',');
            size_t n = end != NULL ? (size_t)(end - p) : strlen(p);
            int unknown;
            xfer_lane_mask_t c = classes_of(p, n, &unknown);
            mask |= c;
            if (unknown && !negate && required_lanes == 0) {
                add_name(out, p, n);
            }
            p += n;
            if (*p == ',') {
                p++;
            }
        }
        if (negate) {
            mask = PEER_CLASSES & ~mask;
        }
    }
    if (required_lanes != 0) {
        mask &= required_lanes;
    }
    for (int c = 0; c < XFER_LANE_N_CLASSES; c++) {
        if (mask & XFER_LANE_BIT(c)) {
            const char *name = xfer_lane_class_name((xfer_lane_class_t)c);
            add_name(out, name, strlen(name));
        }
    }
}
