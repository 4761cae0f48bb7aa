/* lane.h - which transport ("lane") UCX moved a transfer's bytes over, and which lanes a
 * deployment accepts.
 *
 * Owns the lane classes Tandem reports (tcp, shm, rc, cuda_ipc, ...), the mapping from UCX
 * transport names to them, the parsing of UCX's per-request protocol description and of the
 * `--require-transport` list. Pure functions: knows nothing of endpoints, pools or metrics.
 */
#ifndef TANDEM_TRANSFER_LANE_H
#define TANDEM_TRANSFER_LANE_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* Lane classes. A class groups the UCX transports that share a data path. */
typedef enum {
    XFER_LANE_UNKNOWN = 0,   /* UCX did not say (or said something we do not recognise) */
    XFER_LANE_SELF = 1,      /* same process (UCX "self") */
    XFER_LANE_TCP = 2,       /* TCP sockets (UCX "tcp") */
    XFER_LANE_SHM = 3,       /* same host shared memory (UCX "sysv", "posix", "cma", "knem",
                                "xpmem") */
    XFER_LANE_RC = 4,        /* RDMA reliable connection (UCX "rc_verbs", "rc_mlx5") */
    XFER_LANE_DC = 5,        /* RDMA dynamically connected (UCX "dc_mlx5") */
    XFER_LANE_UD = 6,        /* RDMA unreliable datagram (UCX "ud_verbs", "ud_mlx5") */
    XFER_LANE_CUDA_IPC = 7,  /* GPU to GPU over NVLink/PCIe peer access (UCX "cuda_ipc") */
    XFER_LANE_CUDA_COPY = 8, /* staged through cudaMemcpy (UCX "cuda_copy") */
    XFER_LANE_GDR_COPY = 9,  /* GDRCopy mapping of GPU memory (UCX "gdr_copy") */
    XFER_LANE_N_CLASSES = 10,
} xfer_lane_class_t;

/* A set of lane classes: bit c is XFER_LANE_BIT(c). 0 means "no requirement" where accepted. */
typedef uint32_t xfer_lane_mask_t;
#define XFER_LANE_BIT(cls) ((xfer_lane_mask_t)1u << (unsigned)(cls))

/* Flags of xfer_lane_t. */
typedef enum {
    XFER_LANE_EMULATED = 1u << 0, /* UCX emulated the RMA operation over active messages on the
                                     lane (the receiver's progress moves the bytes) */
} xfer_lane_flags_t;

#define XFER_LANE_TEXT_BYTES 80

/*
 * What one transfer used. Plain data. `cls` is the first lane UCX named; `classes` holds every
 * lane it named (a multi-rail protocol may name several); `text` is a compact description for
 * logs, e.g. "short sysv/memory" or "software emulation tcp/lo" (NUL-terminated, may be
 * truncated).
 */
typedef struct {
    xfer_lane_class_t cls;
    xfer_lane_mask_t classes;
    uint32_t flags; /* xfer_lane_flags_t */
    char text[XFER_LANE_TEXT_BYTES];
} xfer_lane_t;

/* xfer_lane_class_name - "tcp", "shm", "rc", "cuda_ipc", ...; "unknown" for anything else.
 * Static string; never NULL. */
const char *xfer_lane_class_name(xfer_lane_class_t cls);

/*
 * xfer_lane_class_of_transport - the class of one UCX transport name ("sysv" -> SHM,
 * "rc_mlx5" -> RC, "tcp" -> TCP). XFER_LANE_UNKNOWN for a name not in the table.
 */
xfer_lane_class_t xfer_lane_class_of_transport(const char *tl_name, size_t n_chars);

/*
 * xfer_lane_parse_info - read the lane out of UCX's protocol description of one request
 * (ucp_request_query INFO_STRING, UCX >= 1.13 with the v2 protocols), e.g.
 * "put() from host memory length 0 short sysv/memory -0.0 MB/s -nan us".
 *
 * Every "<transport>/<device>" token counts; the words between the length and the first such
 * token become the protocol name in lane_out->text. Returns TDM_OK, or TDM_ERR_FORMAT when the
 * text names no transport Tandem knows (*lane_out then holds XFER_LANE_UNKNOWN and the text).
 * Never fails on NULL-free input of any length; `info` must be NUL-terminated.
 */
tdm_status_t xfer_lane_parse_info(const char *info, xfer_lane_t *lane_out);

/*
 * xfer_lane_mask_parse - the `--require-transport` value: a comma-separated list of class names
 * ("rc,cuda_ipc"), or "any" / "" for no requirement (mask 0). Returns TDM_OK, or
 * TDM_ERR_INVALID_ARG naming the bad word in the log (*mask_out untouched).
 */
tdm_status_t xfer_lane_mask_parse(const char *text, xfer_lane_mask_t *mask_out);

/*
 * xfer_lane_accepted - whether a transfer over `lane` may proceed under `required` (a mask from
 * xfer_lane_mask_parse): always with mask 0; otherwise every class the lane named must be in the
 * mask, and an unknown lane is never accepted (no silent fallback).
 */
int xfer_lane_accepted(const xfer_lane_t *lane, xfer_lane_mask_t required);

#endif
