/* internal.h - layouts and helpers shared by the .c files of transfer/; never included outside.
 *
 * The public headers keep every object opaque; the context, pool, peer and batch code need each
 * other's fields (the context's queues, the peer's endpoint), so the layouts live here.
 */
#ifndef TANDEM_TRANSFER_INTERNAL_H
#define TANDEM_TRANSFER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <ucp/api/ucp.h>

#include "common/status.h"
#include "transfer/batch.h"
#include "transfer/context.h"
#include "transfer/desc.h"
#include "transfer/lane.h"
#include "transfer/metrics.h"
#include "transfer/notice.h"
#include "transfer/peer.h"
#include "transfer/pool.h"
#include "transfer/proc.h"

#define XFER_AM_NOTICE_ID 0x7d1 /* UCX active-message id of completion notices */
#define XFER_LOG_MODULE   "xfer"

typedef enum {
    PEER_CONNECTED = 0, /* usable */
    PEER_FAILED = 1,    /* UCX reported the endpoint lost */
    PEER_RETIRED = 2,   /* a newer incarnation of the name was connected */
} peer_state_t;

struct xfer_peer {
    xfer_context_t *ctx;
    xfer_peer_t *prev, *next; /* ctx->peers list */
    char name[XFER_NAME_MAX_BYTES];
    uint64_t incarnation_id;
    uint32_t pool_id;
    xfer_mem_type_t mem_type;
    uint64_t base_addr;
    uint32_t page_size_bytes;
    uint32_t n_pages;
    ucp_ep_h ep;           /* NULL once closed */
    ucp_rkey_h rkey;       /* NULL once destroyed */
    void *close_req;       /* in-flight ucp_ep_close_nbx request */
    void *flush_req;       /* in-flight ucp_ep_flush_nbx request (shutdown only) */
    void *wireup_req;      /* flush posted at connect: completes once UCX wired the endpoint up */
    uint64_t t_connect_ns; /* when the connect started (wireup deadline) */
    peer_state_t state;
    tdm_status_t lane_status;          /* TDM_OK, or TDM_ERR_UNSUPPORTED after a refused lane */
    uint32_t n_refs;                   /* caller references */
    uint32_t n_inflight;               /* batches posted on it whose callback has not run */
    int close_wanted;                  /* endpoint to be force-closed from progress */
    xfer_lane_t lane;                  /* lane of the most recent batch */
    xfer_lane_t lane_cache[XFER_OP_N]; /* lane UCX chose for each op (from a probe) */
    xfer_proc_id_t owner;              /* the peer process, from its descriptor */
    int proc_checked;                  /* same host and pid namespace: checked by xfer_proc_check */
    int lane_known[XFER_OP_N];
    uint64_t rkey_md_map;  /* memory domains the peer's packed rkey has keys for (v1 lanes) */
    int rkey_md_map_known; /* 0: the rkey's packed form was not recognised */
};

struct xfer_pool {
    xfer_context_t *ctx;
    xfer_pool_t *prev, *next; /* ctx->pools list */
    uint32_t pool_id;
    uint32_t page_size_bytes;
    uint32_t n_pages;
    xfer_mem_type_t mem_type;
    uint8_t *base;
    size_t n_bytes;
    ucp_mem_h memh;
    void *owned_device; /* device memory the pool allocated (cudaFree at destroy) */
    uint8_t *desc_bytes;
    size_t desc_n_bytes;
};

typedef enum {
    BATCH_FREE = 0,
    BATCH_POSTING,  /* operations being posted */
    BATCH_FLUSHING, /* put: waiting for the endpoint flush */
    BATCH_NOTICE,   /* put: waiting for the notice send */
    BATCH_DONE,     /* queued for its callback */
} batch_stage_t;

typedef struct xfer_batch xfer_batch_t;
struct xfer_batch {
    xfer_context_t *ctx;
    xfer_batch_t *next; /* free list or done queue */
    xfer_peer_t *peer;
    batch_stage_t stage;
    uint32_t n_outstanding; /* UCX requests whose callback has not run */
    int posting;            /* inside xfer_batch_post's loop: callbacks must not advance */
    tdm_status_t status;    /* first error, else TDM_OK */
    xfer_op_t op;
    uint32_t flags;
    uint64_t job_id;
    uint32_t n_pages;
    uint64_t n_bytes;
    uint64_t t_start_ns;
    uint64_t latency_ns;
    xfer_lane_t lane;
    uint8_t *notice; /* encoded notice frame (malloc), sent after the flush */
    size_t notice_n_bytes;
    xfer_batch_done_fn *done;
    void *done_arg;
};

/* A received notice waiting for delivery from progress. */
typedef struct rx_notice rx_notice_t;
struct rx_notice {
    rx_notice_t *next;
    uint8_t *bytes; /* the frame */
    size_t n_bytes;
    void *ucx_data; /* non-NULL: bytes are UCX's, release with ucp_am_data_release */
    int receiving;  /* rendezvous data still arriving */
    ucs_status_t recv_status;
};

typedef struct {
    char name[XFER_NAME_MAX_BYTES];
    uint64_t incarnation_id;
} retired_t;

struct xfer_context {
    ucp_context_h ucp;
    ucp_worker_h worker;
    int efd;
    char name[XFER_NAME_MAX_BYTES];
    uint64_t incarnation_id;
    xfer_proc_id_t self;          /* this process on its host (descriptors carry it) */
    uint64_t t_liveness_ns;       /* last same-host liveness round */
    uint32_t n_progress_calls;    /* busy progress calls (the liveness clock is read every 256) */
    xfer_context_params_t params; /* name/transports pointers cleared after create */
    xfer_metrics_t *metrics;
    xfer_peer_t *peers;
    uint32_t n_peers;
    retired_t *retired;
    uint32_t n_retired, cap_retired;
    xfer_pool_t *pools;
    uint32_t next_pool_id;
    xfer_batch_t *batches; /* [params.max_batches] */
    xfer_batch_t *free_batches;
    xfer_batch_t *done_head, *done_tail;
    uint32_t n_inflight;
    rx_notice_t *rx_head, *rx_tail;
    uint32_t n_rx_receiving; /* rendezvous notices still arriving */
    uint32_t n_wiring;       /* peers whose wireup flush has not completed */
    int peers_dirty;         /* some peer wants closing or freeing */
};

/* map_ucs_status - the Tandem status for a UCX failure of an operation on a peer. */
tdm_status_t xfer_map_ucs_status(ucs_status_t status);

/* Peer internals (peer.c). */
void xfer_peer_mark_failed(xfer_peer_t *peer, const char *cause); /* logs the cause once */
int xfer_peer_incarnation_retired(const xfer_context_t *ctx, const char *name,
                                  uint64_t incarnation_id);
void xfer_peer_collect(xfer_context_t *ctx);      /* close wanted endpoints, free idle dead peers */
void xfer_peer_check_wireup(xfer_context_t *ctx); /* finish or time out endpoint wireups */
void xfer_peer_check_liveness(xfer_context_t *ctx); /* same-host peers: is the process alive */
void xfer_peer_release_all(xfer_context_t *ctx, uint32_t timeout_ms);

/* Batch internals (batch.c). */
void xfer_batch_deliver(xfer_context_t *ctx, xfer_batch_t *batch); /* run callback, free slot */

/* Pool internals (pool.c). */
xfer_pool_t *xfer_pool_find(const xfer_context_t *ctx, uint32_t pool_id);
/* page bytes readable on the host: the page itself, or a copy in `staging` (page_size bytes)
 * for device pools; NULL if the copy failed (logged). */
const uint8_t *xfer_pool_host_page(const xfer_pool_t *pool, uint32_t page, uint8_t *staging);

/* Notice receive internals (context.c). */
void xfer_notice_deliver(xfer_context_t *ctx, rx_notice_t *rx);

#endif
