#include "transfer/batch.h"

#include "common/clock.h"
#include "common/hash.h"
#include "common/log.h"
#include "transfer/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LANE_INFO_BYTES 256

static void batch_advance(xfer_batch_t *batch);

static void batch_fail(xfer_batch_t *batch, tdm_status_t status)
{
    if (batch->status == TDM_OK) {
        batch->status = status;
    }
}

/* The status for a UCX failure on this batch's peer: a peer that is no longer connected means
 * the operation died with it. */
static tdm_status_t op_failure_status(const xfer_batch_t *batch, ucs_status_t ucs)
{
    if (batch->peer->state != PEER_CONNECTED) {
        return TDM_ERR_PEER_LOST;
    }
    return xfer_map_ucs_status(ucs);
}

static void op_done_cb(void *request, ucs_status_t status, void *user_data)
{
    xfer_batch_t *batch = user_data;

    if (status != UCS_OK) {
        if (batch->status == TDM_OK && batch->peer->state == PEER_CONNECTED &&
            xfer_map_ucs_status(status) == TDM_ERR_IO) {
            tdm_log(TDM_LOG_ERROR, XFER_LOG_MODULE, "transfer failed: peer=%s job=%llu ucx=\"%s\"",
                    batch->peer->name, (unsigned long long)batch->job_id,
                    ucs_status_string(status));
        }
        batch_fail(batch, op_failure_status(batch, status));
    }
    ucp_request_free(request);
    batch->n_outstanding--;
    if (batch->n_outstanding == 0 && !batch->posting) {
        batch_advance(batch);
    }
}

static void batch_finish(xfer_batch_t *batch)
{
    xfer_context_t *ctx = batch->ctx;

    batch->stage = BATCH_DONE;
    batch->latency_ns = tdm_clock_now_ns() - batch->t_start_ns;
    free(batch->notice);
    batch->notice = NULL;
    batch->next = NULL;
    if (ctx->done_tail != NULL) {
        ctx->done_tail->next = batch;
    } else {
        ctx->done_head = batch;
    }
    ctx->done_tail = batch;
}

static void op_param_init(ucp_request_param_t *param, xfer_batch_t *batch)
{
    memset(param, 0, sizeof(*param));
    param->op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param->cb.send = op_done_cb;
    param->user_data = batch;
}

/* Account for a just-posted request: 1 when the batch must wait for it. */
static int track_request(xfer_batch_t *batch, void *request)
{
    if (request == NULL) {
        return 0;
    }
    if (UCS_PTR_IS_ERR(request)) {
        batch_fail(batch, op_failure_status(batch, UCS_PTR_STATUS(request)));
        return 0;
    }
    batch->n_outstanding++;
    return 1;
}

/* Move a batch whose outstanding requests are all done to its next stage. */
static void batch_advance(xfer_batch_t *batch)
{
    xfer_peer_t *peer = batch->peer;
    ucp_request_param_t param;

    for (;;) {
        int usable = peer->state == PEER_CONNECTED && peer->ep != NULL;

        if (batch->status == TDM_OK && !usable) {
            batch_fail(batch, TDM_ERR_PEER_LOST);
        }
        switch (batch->stage) {
        case BATCH_POSTING:
            if (batch->status != TDM_OK || batch->op == XFER_OP_GET) {
                batch_finish(batch);
                return;
            }
            /* Remote completion: after the flush the bytes are in the peer's memory. */
            batch->stage = BATCH_FLUSHING;
            op_param_init(&param, batch);
            if (track_request(batch, ucp_ep_flush_nbx(peer->ep, &param))) {
                return;
            }
            break;
        case BATCH_FLUSHING:
            if (batch->status != TDM_OK || (batch->flags & XFER_BATCH_NOTICE) == 0) {
                batch_finish(batch);
                return;
            }
            batch->stage = BATCH_NOTICE;
            op_param_init(&param, batch);
            if (track_request(batch,
                              ucp_am_send_nbx(peer->ep, XFER_AM_NOTICE_ID, NULL, 0, batch->notice,
                                              batch->notice_n_bytes, &param))) {
                return;
            }
            break;
        case BATCH_NOTICE:
            if (batch->status == TDM_OK) {
                xfer_metrics_event(batch->ctx->metrics, XFER_EVENT_NOTICE_SENT);
            }
            batch_finish(batch);
            return;
        default:
            return;
        }
    }
}

/* Read the lane out of the request UCX kept for a probe. */
static void query_lane(void *request, xfer_lane_t *lane_out)
{
    char info[LANE_INFO_BYTES];
    ucp_request_attr_t attr;

    memset(lane_out, 0, sizeof(*lane_out));
    if (!UCS_PTR_IS_PTR(request)) {
        return;
    }
    memset(&attr, 0, sizeof(attr));
    attr.field_mask = UCP_REQUEST_ATTR_FIELD_INFO_STRING | UCP_REQUEST_ATTR_FIELD_INFO_STRING_SIZE;
    attr.debug_string = info;
    attr.debug_string_size = sizeof(info);
    info[0] = '\0';
    if (ucp_request_query(request, &attr) != UCS_OK) {
        return;
    }
    info[sizeof(info) - 1] = '\0';
    (void)xfer_lane_parse_info(info, lane_out);
}

/* Under the v1 protocols (which describe no request): read the lane out of the endpoint's
 * configuration as UCX prints it (lane.h, xfer_lane_parse_ep_info). Returns 1 when a lane was
 * found. */
static int ep_info_lane(const xfer_peer_t *peer, xfer_op_t op, xfer_lane_t *lane_out)
{
    char *text = NULL;
    size_t n_chars = 0;
    FILE *stream = open_memstream(&text, &n_chars);
    tdm_status_t status = TDM_ERR_IO;

    memset(lane_out, 0, sizeof(*lane_out));
    if (stream == NULL) {
        return 0;
    }
    ucp_ep_print_info(peer->ep, stream);
    if (fclose(stream) == 0 && text != NULL) {
        status =
            xfer_lane_parse_ep_info(text, op == XFER_OP_GET, peer->page_size_bytes,
                                    peer->rkey_md_map_known ? &peer->rkey_md_map : NULL, lane_out);
    }
    if (status != TDM_OK) {
        tdm_log(TDM_LOG_WARN, XFER_LOG_MODULE,
                "lane unknown: peer=%s op=%s reason=\"endpoint configuration names no known "
                "lane\"",
                peer->name, op == XFER_OP_GET ? "get" : "put");
    }
    free(text);
    return status == TDM_OK;
}

static tdm_status_t validate(const xfer_peer_t *peer, const xfer_batch_params_t *params)
{
    const xfer_pool_t *pool = params->local_pool;
    int notice = (params->flags & XFER_BATCH_NOTICE) != 0;

    if (params->done == NULL || (unsigned)params->op >= XFER_OP_N ||
        (params->flags & ~(uint32_t)XFER_BATCH_NOTICE) != 0 ||
        (notice && params->op != XFER_OP_PUT) || pool == NULL || pool->ctx != peer->ctx ||
        params->n_pages > XFER_NOTICE_MAX_PAGES || (params->n_pages == 0 && !notice) ||
        (params->n_pages > 0 && (params->local_pages == NULL || params->remote_pages == NULL)) ||
        params->payload_bytes > XFER_NOTICE_MAX_PAYLOAD_BYTES ||
        (params->payload_bytes > 0 && params->payload == NULL)) {
        return TDM_ERR_INVALID_ARG;
    }
    if (pool->page_size_bytes != peer->page_size_bytes) {
        return TDM_ERR_MISMATCH;
    }
    for (uint32_t i = 0; i < params->n_pages; i++) {
        if (params->local_pages[i] >= pool->n_pages || params->remote_pages[i] >= peer->n_pages) {
            return TDM_ERR_INVALID_ARG;
        }
    }
    return TDM_OK;
}

/* Encode the notice the batch sends after its flush (checksums from the local pages unless
 * the caller gave them). */
static tdm_status_t build_notice(xfer_batch_t *batch, const xfer_peer_t *peer,
                                 const xfer_batch_params_t *params)
{
    const xfer_pool_t *pool = params->local_pool;
    xfer_notice_frame_t frame;
    uint64_t *checksums = NULL;
    uint8_t *staging = NULL;
    tdm_status_t status;

    if (params->checksums == NULL && params->n_pages > 0) {
        checksums = malloc((size_t)params->n_pages * sizeof(*checksums));
        if (checksums == NULL) {
            return TDM_ERR_NO_MEMORY;
        }
        if (pool->mem_type != XFER_MEM_HOST) {
            staging = malloc(pool->page_size_bytes);
            if (staging == NULL) {
                free(checksums);
                return TDM_ERR_NO_MEMORY;
            }
        }
        for (uint32_t i = 0; i < params->n_pages; i++) {
            const uint8_t *page = xfer_pool_host_page(pool, params->local_pages[i], staging);

            if (page == NULL) {
                free(staging);
                free(checksums);
                return TDM_ERR_IO;
            }
            checksums[i] = tdm_hash_xxh3_64(page, pool->page_size_bytes);
        }
        free(staging);
    }

    memset(&frame, 0, sizeof(frame));
    frame.job_id = params->job_id;
    frame.sender_name = batch->ctx->name;
    frame.sender_incarnation_id = batch->ctx->incarnation_id;
    frame.receiver_incarnation_id = peer->incarnation_id;
    frame.receiver_pool_id = peer->pool_id;
    frame.n_pages = params->n_pages;
    frame.pages = params->remote_pages;
    frame.checksums = checksums != NULL ? checksums : params->checksums;
    frame.payload = params->payload;
    frame.payload_bytes = params->payload_bytes;
    batch->notice_n_bytes = xfer_notice_encoded_bytes(params->n_pages, params->payload_bytes);
    batch->notice = malloc(batch->notice_n_bytes);
    if (batch->notice == NULL) {
        free(checksums);
        return TDM_ERR_NO_MEMORY;
    }
    status =
        xfer_notice_encode(&frame, batch->notice, batch->notice_n_bytes, &batch->notice_n_bytes);
    free(checksums);
    if (status != TDM_OK) {
        free(batch->notice);
        batch->notice = NULL;
    }
    return status;
}

/* How post_run asks UCX for an operation. */
typedef enum {
    RUN_PROBE = 1u << 0, /* keep a request (UCP_OP_ATTR_FLAG_NO_IMM_CMPL) so UCX describes the
                            protocol and lane it chose; UCX 1.13's v2 shm "short" put drops the
                            data of such a request, so a probe only ever repeats a page that the
                            batch also moves normally */
    RUN_MULTI = 1u << 1, /* one of several operations in flight (UCP_OP_ATTR_FLAG_MULTI_SEND) */
    RUN_FAST = 1u << 2,  /* put over a shm lane: UCP_OP_ATTR_FLAG_FAST_CMPL keeps UCX 1.13's v2
                            protocols on the direct copy at every size (without it, puts above
                            ~32 KB are emulated over active messages: two copies, and only when
                            the receiver progresses) */
} run_flags_t;

/* Post one UCX operation for `n_pages` pages consecutive on both sides. */
static void *post_run(xfer_batch_t *batch, const xfer_pool_t *pool, uint32_t local_page,
                      uint32_t remote_page, uint32_t n_pages, uint32_t run_flags)
{
    xfer_peer_t *peer = batch->peer;
    ucp_request_param_t param;
    size_t n_bytes = (size_t)n_pages * pool->page_size_bytes;
    uint8_t *local = pool->base + (size_t)local_page * pool->page_size_bytes;
    uint64_t remote = peer->base_addr + (uint64_t)remote_page * peer->page_size_bytes;

    op_param_init(&param, batch);
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE | UCP_OP_ATTR_FIELD_MEMH;
    param.memory_type =
        pool->mem_type == XFER_MEM_CUDA ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
    param.memh = pool->memh;
    if (run_flags & RUN_PROBE) {
        param.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    }
    if (run_flags & RUN_MULTI) {
        param.op_attr_mask |= UCP_OP_ATTR_FLAG_MULTI_SEND;
    }
    if (run_flags & RUN_FAST) {
        param.op_attr_mask |= UCP_OP_ATTR_FLAG_FAST_CMPL;
    }
    if (batch->op == XFER_OP_PUT) {
        return ucp_put_nbx(peer->ep, local, n_bytes, remote, peer->rkey, &param);
    }
    return ucp_get_nbx(peer->ep, local, n_bytes, remote, peer->rkey, &param);
}

static void refuse_lane(xfer_batch_t *batch)
{
    xfer_peer_t *peer = batch->peer;
    xfer_context_t *ctx = batch->ctx;
    char required[128] = "";

    for (unsigned cls = 0; cls < XFER_LANE_N_CLASSES; cls++) {
        if ((ctx->params.required_lanes & XFER_LANE_BIT(cls)) != 0) {
            size_t used = strlen(required);

            snprintf(required + used, sizeof(required) - used, "%s%s", used > 0 ? "," : "",
                     xfer_lane_class_name((xfer_lane_class_t)cls));
        }
    }
    batch_fail(batch, TDM_ERR_UNSUPPORTED);
    peer->lane_status = TDM_ERR_UNSUPPORTED;
    xfer_metrics_event(ctx->metrics, XFER_EVENT_LANE_REFUSAL);
    tdm_log(TDM_LOG_ERROR, XFER_LOG_MODULE,
            "transport refused: peer=%s op=%s lane=%s ucx_protocol=\"%s\" required=%s", peer->name,
            batch->op == XFER_OP_PUT ? "put" : "get", xfer_lane_class_name(batch->lane.cls),
            batch->lane.text, required);
}

tdm_status_t xfer_batch_post(xfer_peer_t *peer, const xfer_batch_params_t *params)
{
    xfer_context_t *ctx = peer->ctx;
    const xfer_pool_t *pool = params->local_pool;
    xfer_batch_t *batch;
    tdm_status_t status;
    uint32_t run_flags = 0;
    uint32_t i = 0;

    status = validate(peer, params);
    if (status != TDM_OK) {
        return status;
    }
    if (peer->state != PEER_CONNECTED || peer->ep == NULL) {
        xfer_metrics_event(ctx->metrics, XFER_EVENT_PEER_REFUSED);
        return TDM_ERR_PEER_LOST;
    }
    if (peer->lane_status != TDM_OK) {
        return peer->lane_status;
    }
    batch = ctx->free_batches;
    if (batch == NULL) {
        return TDM_ERR_BUSY;
    }

    batch->peer = peer;
    batch->stage = BATCH_POSTING;
    batch->n_outstanding = 0;
    batch->status = TDM_OK;
    batch->op = params->op;
    batch->flags = params->flags;
    batch->job_id = params->job_id;
    batch->n_pages = params->n_pages;
    batch->n_bytes = (uint64_t)params->n_pages * pool->page_size_bytes;
    batch->latency_ns = 0;
    memset(&batch->lane, 0, sizeof(batch->lane));
    batch->notice = NULL;
    batch->notice_n_bytes = 0;
    batch->done = params->done;
    batch->done_arg = params->done_arg;
    if ((params->flags & XFER_BATCH_NOTICE) != 0) {
        status = build_notice(batch, peer, params);
        if (status != TDM_OK) {
            return status;
        }
    }
    ctx->free_batches = batch->next;
    batch->next = NULL;
    batch->t_start_ns = tdm_clock_now_ns();
    batch->posting = 1;
    ctx->n_inflight++;
    peer->n_inflight++;

    if (params->n_pages > 0) {
        if (!peer->lane_known[params->op] && (ctx->params.flags & XFER_CONTEXT_PROTO_V1)) {
            /* v1: the endpoint's configuration and the peer's rkey decide the lane. */
            peer->lane_known[params->op] =
                ep_info_lane(peer, params->op, &peer->lane_cache[params->op]);
        } else if (!peer->lane_known[params->op]) {
            /* v2, first batch of this op to this peer: probe one page to learn the lane. */
            void *request = post_run(batch, pool, params->local_pages[0], params->remote_pages[0],
                                     1, RUN_PROBE);

            query_lane(request, &peer->lane_cache[params->op]);
            peer->lane_known[params->op] = UCS_PTR_IS_PTR(request);
            track_request(batch, request);
        }
        batch->lane = peer->lane_cache[params->op];
        peer->lane = batch->lane;
        if (batch->status == TDM_OK &&
            !xfer_lane_accepted(&batch->lane, ctx->params.required_lanes)) {
            refuse_lane(batch);
        }
    }
    if (params->n_pages > 1) {
        run_flags |= RUN_MULTI;
    }
    if (params->op == XFER_OP_PUT && batch->lane.cls == XFER_LANE_SHM) {
        run_flags |= RUN_FAST;
    }
    while (i < params->n_pages && batch->status == TDM_OK) {
        uint32_t run = 1;

        while (i + run < params->n_pages && run < ctx->params.max_run_pages &&
               params->local_pages[i + run] == params->local_pages[i] + run &&
               params->remote_pages[i + run] == params->remote_pages[i] + run) {
            run++;
        }
        track_request(batch, post_run(batch, pool, params->local_pages[i], params->remote_pages[i],
                                      run, run_flags));
        i += run;
    }
    batch->posting = 0;
    if (batch->n_outstanding == 0) {
        batch_advance(batch);
    }
    return TDM_IN_PROGRESS;
}

void xfer_batch_deliver(xfer_context_t *ctx, xfer_batch_t *batch)
{
    xfer_peer_t *peer = batch->peer;
    xfer_batch_done_fn *done = batch->done;
    void *done_arg = batch->done_arg;
    xfer_batch_result_t result;

    memset(&result, 0, sizeof(result));
    result.status = batch->status;
    result.op = batch->op;
    result.job_id = batch->job_id;
    result.n_pages = batch->n_pages;
    result.n_bytes = batch->n_bytes;
    result.latency_ns = batch->latency_ns;
    result.lane = batch->lane;
    xfer_metrics_batch(ctx->metrics, batch->op, batch->status, batch->n_pages, batch->n_bytes,
                       batch->lane.cls, batch->latency_ns);
    if (batch->status != TDM_OK) {
        tdm_log(TDM_LOG_DEBUG, XFER_LOG_MODULE,
                "batch failed: peer=%s op=%s job=%llu pages=%u status=%s", peer->name,
                batch->op == XFER_OP_PUT ? "put" : "get", (unsigned long long)batch->job_id,
                batch->n_pages, tdm_status_name(batch->status));
    }
    peer->n_inflight--;
    ctx->n_inflight--;
    if (peer->state != PEER_CONNECTED) {
        ctx->peers_dirty = 1;
    }
    batch->stage = BATCH_FREE;
    batch->peer = NULL;
    batch->next = ctx->free_batches;
    ctx->free_batches = batch;
    done(done_arg, &result);
}
