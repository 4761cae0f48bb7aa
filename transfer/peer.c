#include "transfer/peer.h"

#include "common/buf.h"
#include "common/clock.h"
#include "common/log.h"
#include "transfer/internal.h"

#include <stdlib.h>
#include <string.h>

static void peer_link(xfer_context_t *ctx, xfer_peer_t *peer)
{
    peer->prev = NULL;
    peer->next = ctx->peers;
    if (ctx->peers != NULL) {
        ctx->peers->prev = peer;
    }
    ctx->peers = peer;
    ctx->n_peers++;
}

static void peer_unlink(xfer_context_t *ctx, xfer_peer_t *peer)
{
    if (peer->prev != NULL) {
        peer->prev->next = peer->next;
    } else {
        ctx->peers = peer->next;
    }
    if (peer->next != NULL) {
        peer->next->prev = peer->prev;
    }
    ctx->n_peers--;
}

int xfer_peer_incarnation_retired(const xfer_context_t *ctx, const char *name,
                                  uint64_t incarnation_id)
{
    for (uint32_t i = 0; i < ctx->n_retired; i++) {
        if (ctx->retired[i].incarnation_id == incarnation_id &&
            strcmp(ctx->retired[i].name, name) == 0) {
            return 1;
        }
    }
    return 0;
}

/* Remember (name, incarnation) as retired. On allocation failure the peer object itself still
 * refuses operations; only a later connect with the same descriptor could slip through, so the
 * failure is logged. */
static void retire_incarnation(xfer_context_t *ctx, const char *name, uint64_t incarnation_id)
{
    if (xfer_peer_incarnation_retired(ctx, name, incarnation_id)) {
        return;
    }
    if (ctx->n_retired == ctx->cap_retired) {
        size_t cap = ctx->cap_retired;
        retired_t *grown =
            tdm_array_grow(ctx->retired, sizeof(*grown), (size_t)ctx->n_retired + 1, 16, &cap);

        if (grown == NULL) {
            tdm_log(
                TDM_LOG_ERROR, XFER_LOG_MODULE,
                "retired incarnation not recorded: peer=%s incarnation=%016llx reason=no memory",
                name, (unsigned long long)incarnation_id);
            return;
        }
        ctx->retired = grown;
        ctx->cap_retired = cap > UINT32_MAX ? UINT32_MAX : (uint32_t)cap; /* less is safe */
    }
    memset(&ctx->retired[ctx->n_retired], 0, sizeof(ctx->retired[0]));
    memcpy(ctx->retired[ctx->n_retired].name, name, strnlen(name, XFER_NAME_MAX_BYTES - 1));
    ctx->retired[ctx->n_retired].incarnation_id = incarnation_id;
    ctx->n_retired++;
}

void xfer_peer_mark_failed(xfer_peer_t *peer, const char *cause)
{
    xfer_context_t *ctx = peer->ctx;

    if (peer->state != PEER_CONNECTED) {
        return;
    }
    peer->state = PEER_FAILED;
    peer->close_wanted = 1;
    ctx->peers_dirty = 1;
    retire_incarnation(ctx, peer->name, peer->incarnation_id);
    xfer_metrics_event(ctx->metrics, XFER_EVENT_PEER_FAILURE);
    tdm_log(TDM_LOG_ERROR, XFER_LOG_MODULE,
            "peer lost: peer=%s incarnation=%016llx pool_id=%u inflight_batches=%u cause=\"%s\"",
            peer->name, (unsigned long long)peer->incarnation_id, peer->pool_id, peer->n_inflight,
            cause);
    /* The incarnation is gone: its other pools go with it. */
    for (xfer_peer_t *other = ctx->peers; other != NULL; other = other->next) {
        if (other != peer && other->state == PEER_CONNECTED &&
            other->incarnation_id == peer->incarnation_id && strcmp(other->name, peer->name) == 0) {
            xfer_peer_mark_failed(other, "another pool of the same incarnation was lost");
        }
    }
}

static void retire_peer(xfer_peer_t *peer, uint64_t new_incarnation_id)
{
    xfer_context_t *ctx = peer->ctx;

    peer->state = PEER_RETIRED;
    peer->close_wanted = 1;
    ctx->peers_dirty = 1;
    retire_incarnation(ctx, peer->name, peer->incarnation_id);
    tdm_log(TDM_LOG_INFO, XFER_LOG_MODULE,
            "peer restarted: peer=%s old_incarnation=%016llx new_incarnation=%016llx "
            "inflight_batches=%u",
            peer->name, (unsigned long long)peer->incarnation_id,
            (unsigned long long)new_incarnation_id, peer->n_inflight);
}

static void ep_error_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    xfer_peer_t *peer = arg;

    (void)ep;
    xfer_peer_mark_failed(peer, ucs_status_string(status));
}

/* Start closing the endpoint (forced: the peer is gone or replaced). Outstanding requests
 * complete with UCS_ERR_CANCELED. */
static void start_close(xfer_peer_t *peer)
{
    ucp_request_param_t param;
    void *request;

    if (peer->rkey != NULL) {
        ucp_rkey_destroy(peer->rkey);
        peer->rkey = NULL;
    }
    if (peer->ep == NULL) {
        return;
    }
    memset(&param, 0, sizeof(param));
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    request = ucp_ep_close_nbx(peer->ep, &param);
    peer->ep = NULL;
    if (UCS_PTR_IS_PTR(request)) {
        peer->close_req = request;
    }
}

/* Whether the close request finished (and was released). */
static int close_finished(xfer_peer_t *peer)
{
    if (peer->close_req == NULL) {
        return 1;
    }
    if (ucp_request_check_status(peer->close_req) == UCS_INPROGRESS) {
        return 0;
    }
    ucp_request_free(peer->close_req);
    peer->close_req = NULL;
    return 1;
}

/* Whether the wireup flush finished (and was released); 1 also when there was none. */
static int wireup_finished(xfer_peer_t *peer, ucs_status_t *status_out)
{
    ucs_status_t status;

    *status_out = UCS_OK;
    if (peer->wireup_req == NULL) {
        return 1;
    }
    status = ucp_request_check_status(peer->wireup_req);
    if (status == UCS_INPROGRESS) {
        return 0;
    }
    ucp_request_free(peer->wireup_req);
    peer->wireup_req = NULL;
    peer->ctx->n_wiring--;
    *status_out = status;
    return 1;
}

void xfer_peer_check_wireup(xfer_context_t *ctx)
{
    for (xfer_peer_t *peer = ctx->peers; peer != NULL; peer = peer->next) {
        ucs_status_t status;

        if (peer->wireup_req == NULL) {
            continue;
        }
        if (wireup_finished(peer, &status)) {
            if (status != UCS_OK) {
                xfer_peer_mark_failed(peer, ucs_status_string(status));
            }
        } else if (peer->state == PEER_CONNECTED && tdm_clock_elapsed_ms(peer->t_connect_ns) >=
                                                        (double)ctx->params.connect_timeout_ms) {
            xfer_peer_mark_failed(peer, "wireup not finished within connect_timeout_ms");
        }
    }
}

void xfer_peer_check_liveness(xfer_context_t *ctx)
{
    for (xfer_peer_t *peer = ctx->peers; peer != NULL; peer = peer->next) {
        if (peer->state == PEER_CONNECTED && peer->proc_checked &&
            xfer_proc_check(&peer->owner) == TDM_ERR_PEER_LOST) {
            xfer_peer_mark_failed(peer, "process gone (same-host check)");
        }
    }
}

void xfer_peer_collect(xfer_context_t *ctx)
{
    xfer_peer_t *peer = ctx->peers;
    int still_dirty = 0;

    ctx->peers_dirty = 0;
    while (peer != NULL) {
        xfer_peer_t *next = peer->next;

        if (peer->close_wanted) {
            peer->close_wanted = 0;
            start_close(peer);
        }
        if (peer->state != PEER_CONNECTED) {
            ucs_status_t wireup_status;

            if (!close_finished(peer) || !wireup_finished(peer, &wireup_status)) {
                still_dirty = 1;
            } else if (peer->n_refs == 0 && peer->n_inflight == 0 && peer->flush_req == NULL) {
                peer_unlink(ctx, peer);
                free(peer);
            }
        }
        peer = next;
    }
    ctx->peers_dirty |= still_dirty;
}

tdm_status_t xfer_peer_connect(xfer_context_t *ctx, const xfer_desc_t *desc, xfer_peer_t **peer_out)
{
    xfer_peer_t *peer;
    ucp_ep_params_t ep_params;
    ucs_status_t ucs;
    tdm_status_t status;

    if (desc->name[0] == '\0' || memchr(desc->name, '\0', XFER_NAME_MAX_BYTES) == NULL ||
        desc->incarnation_id == 0 || desc->page_size_bytes == 0 || desc->n_pages == 0 ||
        desc->worker_address == NULL || desc->worker_address_bytes == 0 || desc->rkey == NULL ||
        desc->rkey_bytes == 0 || desc->incarnation_id == ctx->incarnation_id) {
        return TDM_ERR_INVALID_ARG;
    }
    if (xfer_peer_incarnation_retired(ctx, desc->name, desc->incarnation_id)) {
        xfer_metrics_event(ctx->metrics, XFER_EVENT_PEER_REFUSED);
        tdm_log(TDM_LOG_WARN, XFER_LOG_MODULE,
                "connect refused: peer=%s incarnation=%016llx reason=retired incarnation",
                desc->name, (unsigned long long)desc->incarnation_id);
        return TDM_ERR_PEER_LOST;
    }

    for (peer = ctx->peers; peer != NULL; peer = peer->next) {
        if (peer->state != PEER_CONNECTED || strcmp(peer->name, desc->name) != 0) {
            continue;
        }
        if (peer->incarnation_id == desc->incarnation_id) {
            if (peer->pool_id == desc->pool_id) {
                peer->n_refs++;
                *peer_out = peer;
                return TDM_OK;
            }
        } else {
            retire_peer(peer, desc->incarnation_id);
        }
    }

    peer = calloc(1, sizeof(*peer));
    if (peer == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    peer->ctx = ctx;
    memcpy(peer->name, desc->name, sizeof(peer->name));
    peer->incarnation_id = desc->incarnation_id;
    peer->pool_id = desc->pool_id;
    peer->mem_type = desc->mem_type;
    peer->base_addr = desc->base_addr;
    peer->page_size_bytes = desc->page_size_bytes;
    peer->n_pages = desc->n_pages;
    peer->state = PEER_CONNECTED;
    peer->lane_status = TDM_OK;
    peer->owner = desc->owner;
    peer->proc_checked = xfer_proc_id_comparable(&ctx->self, &desc->owner);
    peer->rkey_md_map_known =
        xfer_lane_rkey_md_map(desc->rkey, desc->rkey_bytes, &peer->rkey_md_map) == TDM_OK;

    memset(&ep_params, 0, sizeof(ep_params));
    ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                           UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                           UCP_EP_PARAM_FIELD_NAME;
    ep_params.address = (const ucp_address_t *)desc->worker_address;
    ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep_params.err_handler.cb = ep_error_cb;
    ep_params.err_handler.arg = peer;
    ep_params.name = peer->name;
    ucs = ucp_ep_create(ctx->worker, &ep_params, &peer->ep);
    if (ucs != UCS_OK) {
        tdm_log(TDM_LOG_ERROR, XFER_LOG_MODULE,
                "connect failed: peer=%s incarnation=%016llx ucx=\"%s\" (no usable transport "
                "with peer error handling?)",
                desc->name, (unsigned long long)desc->incarnation_id, ucs_status_string(ucs));
        status = ucs == UCS_ERR_NO_MEMORY ? TDM_ERR_NO_MEMORY : TDM_ERR_UNSUPPORTED;
        goto err_free_peer;
    }
    ucs = ucp_ep_rkey_unpack(peer->ep, desc->rkey, &peer->rkey);
    if (ucs != UCS_OK) {
        tdm_log(TDM_LOG_ERROR, XFER_LOG_MODULE,
                "rkey unpack failed: peer=%s incarnation=%016llx pool_id=%u ucx=\"%s\"", desc->name,
                (unsigned long long)desc->incarnation_id, desc->pool_id, ucs_status_string(ucs));
        status = ucs == UCS_ERR_NO_MEMORY ? TDM_ERR_NO_MEMORY : TDM_ERR_UNSUPPORTED;
        goto err_close_ep;
    }

    /* A flush completes once UCX has wired the endpoint up (the peer answered); until then a
     * peer that died is noticed only by the connect deadline (xfer_peer_check_wireup). */
    {
        ucp_request_param_t flush_param;
        void *request;

        memset(&flush_param, 0, sizeof(flush_param));
        request = ucp_ep_flush_nbx(peer->ep, &flush_param);
        if (UCS_PTR_IS_PTR(request)) {
            peer->wireup_req = request;
            peer->t_connect_ns = tdm_clock_now_ns();
            ctx->n_wiring++;
        }
    }
    peer->n_refs = 1;
    peer_link(ctx, peer);
    tdm_log(TDM_LOG_INFO, XFER_LOG_MODULE,
            "peer connected: peer=%s incarnation=%016llx pool_id=%u pages=%u page_bytes=%u",
            peer->name, (unsigned long long)peer->incarnation_id, peer->pool_id, peer->n_pages,
            peer->page_size_bytes);
    *peer_out = peer;
    return TDM_OK;

err_close_ep:
    start_close(peer);
    while (!close_finished(peer)) {
        ucp_worker_progress(ctx->worker);
    }
err_free_peer:
    free(peer);
    return status;
}

void xfer_peer_close(xfer_peer_t *peer)
{
    if (peer == NULL) {
        return;
    }
    if (peer->n_refs > 0) {
        peer->n_refs--;
    }
    if (peer->state != PEER_CONNECTED) {
        peer->ctx->peers_dirty = 1;
    }
}

tdm_status_t xfer_peer_status(const xfer_peer_t *peer)
{
    if (peer->state != PEER_CONNECTED) {
        return TDM_ERR_PEER_LOST;
    }
    return peer->lane_status;
}

const char *xfer_peer_name(const xfer_peer_t *peer)
{
    return peer->name;
}

uint64_t xfer_peer_incarnation_id(const xfer_peer_t *peer)
{
    return peer->incarnation_id;
}

uint32_t xfer_peer_n_pages(const xfer_peer_t *peer)
{
    return peer->n_pages;
}

uint32_t xfer_peer_page_size(const xfer_peer_t *peer)
{
    return peer->page_size_bytes;
}

void xfer_peer_lane(const xfer_peer_t *peer, xfer_lane_t *lane_out)
{
    *lane_out = peer->lane;
}

void xfer_peer_release_all(xfer_context_t *ctx, uint32_t timeout_ms)
{
    uint64_t t_start_ns = tdm_clock_now_ns();
    int pending;

    /* 1. Let what was posted land: flush every live endpoint, within the budget. */
    for (xfer_peer_t *peer = ctx->peers; peer != NULL; peer = peer->next) {
        if (peer->state == PEER_CONNECTED && peer->ep != NULL) {
            ucp_request_param_t param;
            void *request;

            memset(&param, 0, sizeof(param));
            request = ucp_ep_flush_nbx(peer->ep, &param);
            peer->flush_req = UCS_PTR_IS_PTR(request) ? request : NULL;
        }
    }
    do {
        pending = 0;
        xfer_context_progress(ctx);
        for (xfer_peer_t *peer = ctx->peers; peer != NULL; peer = peer->next) {
            if (peer->flush_req != NULL &&
                ucp_request_check_status(peer->flush_req) == UCS_INPROGRESS) {
                pending = 1;
            }
        }
    } while (pending && tdm_clock_elapsed_ms(t_start_ns) < (double)timeout_ms);
    if (pending) {
        tdm_log(TDM_LOG_WARN, XFER_LOG_MODULE,
                "flush at shutdown timed out: timeout_ms=%u (closing anyway)", timeout_ms);
    }

    /* 2. Close every endpoint. Forced: a flush-mode close waits on peers that may be dead, and
     * the peers run in error handling mode, so they see us go. Outstanding requests are
     * cancelled, which completes their batches. */
    for (xfer_peer_t *peer = ctx->peers; peer != NULL; peer = peer->next) {
        if (peer->state == PEER_CONNECTED) {
            peer->state = PEER_RETIRED; /* refuse batches posted from callbacks */
        }
        peer->close_wanted = 0;
        start_close(peer);
    }

    /* 3. Deliver the callbacks and free the peers (caller handles become invalid). */
    for (int round = 0; round < 1000 && ctx->peers != NULL; round++) {
        xfer_context_progress(ctx);
        for (xfer_peer_t *peer = ctx->peers; peer != NULL;) {
            xfer_peer_t *next = peer->next;

            if (peer->flush_req != NULL &&
                ucp_request_check_status(peer->flush_req) != UCS_INPROGRESS) {
                ucp_request_free(peer->flush_req);
                peer->flush_req = NULL;
            }
            ucs_status_t wireup_status;

            if (close_finished(peer) && wireup_finished(peer, &wireup_status) &&
                peer->flush_req == NULL && peer->n_inflight == 0) {
                peer_unlink(ctx, peer);
                free(peer);
            }
            peer = next;
        }
    }
    if (ctx->n_inflight > 0 || ctx->peers != NULL) {
        tdm_log(TDM_LOG_ERROR, XFER_LOG_MODULE,
                "shutdown left work behind: inflight_batches=%u peers=%u", ctx->n_inflight,
                ctx->n_peers);
    }
}
