/* lane.h - which transport ("lane") UCX moved a transfer's bytes over, and which lanes a
 * deployment accepts.
 *
 * Owns the lane classes Tandem reports (tcp, shm, rc, cuda_ipc, ...), the mapping from UCX
 * transport names to them, the parsing of the `--require-transport` list, of UCX's per-request
 * protocol description (v2 protocols) and of its endpoint configuration text with the peer's
 * packed rkey (v1). Pure functions: knows nothing of endpoints, pools or metrics.
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
 * xfer_lane_rkey_md_map - the set of UCX memory domains a packed rkey carries keys for (bit i:
 * the packer's md[i]), read from UCX 1.13's packed form: a little-endian 64-bit md map, one
 * memory-type byte, then for each set bit a size byte and that many key bytes. The walk must
 * end exactly at `n_bytes`; anything else returns TDM_ERR_FORMAT (another UCX version, or not
 * an rkey) and leaves *md_map_out untouched. Pure.
 */
tdm_status_t xfer_lane_rkey_md_map(const uint8_t *packed, size_t n_bytes, uint64_t *md_map_out);

/*
 * xfer_lane_parse_ep_info - the lane of a put (is_get 0) or get (is_get 1) of `msg_bytes` bytes,
 * read out of UCX's description of an endpoint's configuration (ucp_ep_print_info text, UCX
 * 1.13). This is how a batch learns its lane under the v1 protocols, which describe no request.
 *
 * The text lists the endpoint's lanes ("lane[0]:  0:sysv/memory.0 md[0] -> md[0]/sysv/... am
 * am_bw#0 keepalive") and, per RMA lane, the protocol thresholds ("put[0]: 0..<short>..
 * 4294967296..<bcopy>..(inf)"). UCX 1.13's v1 RMA uses the first RMA lane whose remote memory
 * domain holds a key in the peer's rkey (`rkey_md_map`, from xfer_lane_rkey_md_map), and
 * emulates the operation over the active-message lane when none does ("software emulation",
 * XFER_LANE_EMULATED). Lanes are taken in the order printed. With `rkey_md_map` NULL (unknown)
 * every RMA lane and the active-message lane count as possible: `classes` holds all of them, so
 * a transport requirement only passes when every possibility satisfies it. lane_out->text is
 * "<protocol> <transport>/<device>" with the protocol of the threshold range holding
 * msg_bytes, e.g. "short sysv/memory" or "software emulation tcp/lo".
 *
 * Returns TDM_OK, or TDM_ERR_FORMAT when the text names no lane Tandem knows for the operation
 * (*lane_out then holds XFER_LANE_UNKNOWN, classes 0, and the start of the text). `info` must
 * be NUL-terminated; any content is accepted.
 */
tdm_status_t xfer_lane_parse_ep_info(const char *info, int is_get, size_t msg_bytes,
                                     const uint64_t *rkey_md_map, xfer_lane_t *lane_out);

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
