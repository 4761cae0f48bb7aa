#include "transfer/context.h"

#include "common/clock.h"
#include "common/hash.h"
#include "common/log.h"
#include "transfer/internal.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

/* ucp_worker_progress calls per xfer_context_progress before deferred work runs, so a peer that
 * floods us cannot starve callbacks. */
#define PROGRESS_BUDGET      4096u
#define LIVENESS_CLOCK_EVERY 256u

void xfer_context_params_default(xfer_context_params_t *params)
{
    memset(params, 0, sizeof(*params));
    params->name = "tandem";
    params->keepalive_interval_ms = XFER_DEFAULT_KEEPALIVE_MS;
    params->max_batches = XFER_DEFAULT_MAX_BATCHES;
    params->close_timeout_ms = XFER_DEFAULT_CLOSE_TIMEOUT_MS;
    params->connect_timeout_ms = XFER_DEFAULT_CONNECT_TIMEOUT_MS;
    params->max_run_pages = 1;
}

tdm_status_t xfer_map_ucs_status(ucs_status_t status)
{
    switch (status) {
    case UCS_OK:
        return TDM_OK;
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CANCELED:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
        return TDM_ERR_PEER_LOST;
    case UCS_ERR_NO_MEMORY:
        return TDM_ERR_NO_MEMORY;
    default:
        return TDM_ERR_IO;
    }
}

/* Whether a UCX_TLS-style list may enable the shared-memory ("mm") transports, whose peer
 * failure support UCX 1.13 only exposes on request (MM_ERROR_HANDLING). */
static int transports_may_use_mm(const char *transports)
{
    static const char *const mm_words[] = {"all", "sm", "shm", "mm", "posix", "sysv"};
    const char *p = transports;

    if (transports == NULL || transports[0] == '^') {
        return 1;
    }
    while (*p != '\0') {
        const char *word = p;
        size_t n_chars;

        while (*p != '\0' && *p != ',') {
            p++;
        }
        n_chars = (size_t)(p - word);
        for (size_t i = 0; i < sizeof(mm_words) / sizeof(mm_words[0]); i++) {
            if (strlen(mm_words[i]) == n_chars && strncmp(word, mm_words[i], n_chars) == 0) {
                return 1;
            }
        }
        if (*p == ',') {
            p++;
        }
    }
    return 0;
}

static tdm_status_t config_set(ucp_config_t *config, const char *key, const char *value)
{
    ucs_status_t status = ucp_config_modify(config, key, value);

    if (status != UCS_OK) {
        tdm_log(TDM_LOG_ERROR, XFER_LOG_MODULE, "ucx config rejected: key=%s value=%s ucx=\"%s\"",
                key, value, ucs_status_string(status));
        return TDM_ERR_UNSUPPORTED;
    }
    return TDM_OK;
}

static tdm_status_t build_config(const xfer_context_params_t *params, ucp_config_t **config_out)
{
    ucp_config_t *config;
    ucs_status_t ucs;
    tdm_status_t status = TDM_OK;
    char value[32];

    ucs = ucp_config_read(NULL, NULL, &config);
    if (ucs != UCS_OK) {
        tdm_log(TDM_LOG_ERROR, XFER_LOG_MODULE, "ucx config read failed: ucx=\"%s\"",
                ucs_status_string(ucs));
        return TDM_ERR_UNSUPPORTED;
    }
    if (params->transports != NULL) {
        status = config_set(config, "TLS", params->transports);
    }
    if (status == TDM_OK && (params->flags & XFER_CONTEXT_PROTO_V1) == 0) {
        /* The v2 protocols describe each request (ucp_request_query), which is how a batch
         * learns its lane. */
        status = config_set(config, "PROTO_ENABLE", "y");
    }
    if (status == TDM_OK && transports_may_use_mm(params->transports)) {
        /* Without it UCX 1.13 refuses shm lanes to endpoints in peer error handling mode. */
        status = config_set(config, "MM_ERROR_HANDLING", "y");
    }
    if (status == TDM_OK && params->keepalive_interval_ms > 0) {
        snprintf(value, sizeof(value), "%ums", params->keepalive_interval_ms);
        status = config_set(config, "KEEPALIVE_INTERVAL", value);
    }
    if (status != TDM_OK) {
        ucp_config_release(config);
        return status;
    }
    *config_out = config;
    return TDM_OK;
}

static ucs_status_t am_notice_cb(void *arg, const void *header, size_t header_length, void *data,
                                 size_t length, const ucp_am_recv_param_t *param);

static tdm_status_t draw_incarnation(uint64_t *id_out)
{
    uint64_t id = 0;

    while (id == 0) {
        ssize_t n = getrandom(&id, sizeof(id), 0);

        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n != (ssize_t)sizeof(id)) {
            tdm_log(TDM_LOG_ERROR, XFER_LOG_MODULE, "getrandom failed: %s", strerror(errno));
            return TDM_ERR_IO;
        }
    }
    *id_out = id;
    return TDM_OK;
}

static tdm_status_t start_ucx(xfer_context_t *ctx, const xfer_context_params_t *params)
{
    ucp_config_t *config = NULL;
    ucp_params_t ucp_params;
    ucp_worker_params_t worker_params;
    ucp_am_handler_param_t am_param;
    ucs_status_t ucs;
    tdm_status_t status;

    status = build_config(params, &config);
    if (status != TDM_OK) {
        return status;
    }
    memset(&ucp_params, 0, sizeof(ucp_params));
    ucp_params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
    ucp_params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    ucp_params.name = ctx->name;
    ucs = ucp_init(&ucp_params, config, &ctx->ucp);
    ucp_config_release(config);
    if (ucs != UCS_OK) {
        tdm_log(TDM_LOG_ERROR, XFER_LOG_MODULE, "ucx init failed: transports=%s ucx=\"%s\"",
                params->transports != NULL ? params->transports : "(default)",
                ucs_status_string(ucs));
        ctx->ucp = NULL;
        return TDM_ERR_UNSUPPORTED;
    }

    memset(&worker_params, 0, sizeof(worker_params));
    worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;
    ucs = ucp_worker_create(ctx->ucp, &worker_params, &ctx->worker);
    if (ucs != UCS_OK) {
        tdm_log(TDM_LOG_ERROR, XFER_LOG_MODULE, "ucx worker create failed: ucx=\"%s\"",
                ucs_status_string(ucs));
        ctx->worker = NULL;
        return ucs == UCS_ERR_NO_MEMORY ? TDM_ERR_NO_MEMORY : TDM_ERR_UNSUPPORTED;
    }
    ucs = ucp_worker_get_efd(ctx->worker, &ctx->efd);
    if (ucs != UCS_OK) {
        tdm_log(TDM_LOG_ERROR, XFER_LOG_MODULE, "ucx worker efd failed: ucx=\"%s\"",
                ucs_status_string(ucs));
        return TDM_ERR_UNSUPPORTED;
    }

    memset(&am_param, 0, sizeof(am_param));
    am_param.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                          UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    am_param.id = XFER_AM_NOTICE_ID;
    am_param.cb = am_notice_cb;
    am_param.arg = ctx;
    am_param.flags = UCP_AM_FLAG_WHOLE_MSG | UCP_AM_FLAG_PERSISTENT_DATA;
    ucs = ucp_worker_set_am_recv_handler(ctx->worker, &am_param);
    if (ucs != UCS_OK) {
        tdm_log(TDM_LOG_ERROR, XFER_LOG_MODULE, "ucx am handler failed: ucx=\"%s\"",
                ucs_status_string(ucs));
        return TDM_ERR_UNSUPPORTED;
    }
    return TDM_OK;
}

static void stop_ucx(xfer_context_t *ctx)
{
    if (ctx->worker != NULL) {
        ucp_worker_destroy(ctx->worker);
        ctx->worker = NULL;
    }
    if (ctx->ucp != NULL) {
        ucp_cleanup(ctx->ucp);
        ctx->ucp = NULL;
    }
}

tdm_status_t xfer_context_create(const xfer_context_params_t *params, xfer_context_t **ctx_out)
{
    xfer_context_t *ctx;
    size_t name_len;
    tdm_status_t status;

    name_len = params->name != NULL ? strnlen(params->name, XFER_NAME_MAX_BYTES) : 0;
    if (name_len == 0 || name_len >= XFER_NAME_MAX_BYTES || params->max_batches == 0) {
        tdm_log(TDM_LOG_ERROR, XFER_LOG_MODULE,
                "context rejected: name_len=%zu allowed=1..%d max_batches=%u allowed=1..", name_len,
                XFER_NAME_MAX_BYTES - 1, params->max_batches);
        return TDM_ERR_INVALID_ARG;
    }

    ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    memcpy(ctx->name, params->name, name_len);
    ctx->params = *params;
    ctx->params.name = NULL;
    ctx->params.transports = NULL;
    if (ctx->params.max_run_pages == 0) {
        ctx->params.max_run_pages = 1;
    }
    ctx->efd = -1;
    ctx->next_pool_id = 1;

    xfer_proc_id_self(&ctx->self);
    ctx->t_liveness_ns = tdm_clock_now_ns();
    status = draw_incarnation(&ctx->incarnation_id);
    if (status != TDM_OK) {
        goto err_free_ctx;
    }
    status = xfer_metrics_create(&ctx->metrics);
    if (status != TDM_OK) {
        goto err_free_ctx;
    }
    ctx->batches = calloc(params->max_batches, sizeof(*ctx->batches));
    if (ctx->batches == NULL) {
        status = TDM_ERR_NO_MEMORY;
        goto err_destroy_metrics;
    }
    for (uint32_t i = params->max_batches; i > 0; i--) {
        ctx->batches[i - 1].ctx = ctx;
        ctx->batches[i - 1].next = ctx->free_batches;
        ctx->free_batches = &ctx->batches[i - 1];
    }
    status = start_ucx(ctx, params);
    if (status != TDM_OK) {
        goto err_stop_ucx;
    }

    tdm_log(TDM_LOG_INFO, XFER_LOG_MODULE,
            "context started: name=%s incarnation=%016llx transports=%s keepalive_ms=%u", ctx->name,
            (unsigned long long)ctx->incarnation_id,
            params->transports != NULL ? params->transports : "(default)",
            params->keepalive_interval_ms);
    *ctx_out = ctx;
    return TDM_OK;

err_stop_ucx:
    stop_ucx(ctx);
    free(ctx->batches);
err_destroy_metrics:
    xfer_metrics_destroy(ctx->metrics);
err_free_ctx:
    free(ctx);
    return status;
}

static void rx_free(xfer_context_t *ctx, rx_notice_t *rx)
{
    if (rx->ucx_data != NULL) {
        ucp_am_data_release(ctx->worker, rx->ucx_data);
    } else {
        free(rx->bytes);
    }
    free(rx);
}

void xfer_context_destroy(xfer_context_t *ctx)
{
    uint64_t t_start_ns;

    if (ctx == NULL) {
        return;
    }
    while (ctx->pools != NULL) {
        xfer_pool_t *pool = ctx->pools;

        tdm_log(TDM_LOG_ERROR, XFER_LOG_MODULE,
                "pool outlived its context: pool_id=%u (unregistered here)", pool->pool_id);
        ctx->pools = pool->next;
        ucp_mem_unmap(ctx->ucp, pool->memh);
        pool->memh = NULL;
        pool->ctx = NULL;
        pool->base = NULL;
        pool->prev = pool->next = NULL;
    }

    xfer_peer_release_all(ctx, ctx->params.close_timeout_ms);

    /* Rendezvous notices still arriving: give them the same budget, then leave them. */
    t_start_ns = tdm_clock_now_ns();
    while (ctx->n_rx_receiving > 0 &&
           tdm_clock_elapsed_ms(t_start_ns) < (double)ctx->params.close_timeout_ms) {
        ucp_worker_progress(ctx->worker);
    }
    while (ctx->rx_head != NULL) {
        rx_notice_t *rx = ctx->rx_head;

        ctx->rx_head = rx->next;
        if (rx->receiving) {
            tdm_log(TDM_LOG_WARN, XFER_LOG_MODULE, "notice still arriving at shutdown: bytes=%zu",
                    rx->n_bytes);
            continue; /* its buffer stays with UCX's pending request */
        }
        rx_free(ctx, rx);
    }
    stop_ucx(ctx);
    tdm_log(TDM_LOG_INFO, XFER_LOG_MODULE, "context stopped: name=%s incarnation=%016llx",
            ctx->name, (unsigned long long)ctx->incarnation_id);
    free(ctx->retired);
    free(ctx->batches);
    xfer_metrics_destroy(ctx->metrics);
    free(ctx);
}

uint64_t xfer_context_incarnation_id(const xfer_context_t *ctx)
{
    return ctx->incarnation_id;
}

const char *xfer_context_name(const xfer_context_t *ctx)
{
    return ctx->name;
}

int xfer_context_efd(const xfer_context_t *ctx)
{
    return ctx->efd;
}

xfer_metrics_t *xfer_context_metrics(xfer_context_t *ctx)
{
    return ctx->metrics;
}

uint32_t xfer_context_n_peers(const xfer_context_t *ctx)
{
    return ctx->n_peers;
}

uint32_t xfer_context_n_inflight(const xfer_context_t *ctx)
{
    return ctx->n_inflight;
}

uint32_t xfer_context_max_sleep_ms(const xfer_context_t *ctx)
{
    uint32_t sleep_ms =
        ctx->params.keepalive_interval_ms > 0 ? ctx->params.keepalive_interval_ms : 20000u;

    /* A wireup deadline is checked from progress too. */
    if (ctx->n_wiring > 0 && sleep_ms > 100u) {
        sleep_ms = 100u;
    }
    return sleep_ms;
}

/* ---- received notices ---- */

static void rx_enqueue(xfer_context_t *ctx, rx_notice_t *rx)
{
    rx->next = NULL;
    if (ctx->rx_tail != NULL) {
        ctx->rx_tail->next = rx;
    } else {
        ctx->rx_head = rx;
    }
    ctx->rx_tail = rx;
}

static void rndv_done_cb(void *request, ucs_status_t status, size_t length, void *user_data)
{
    rx_notice_t *rx = user_data;

    rx->recv_status = status;
    rx->n_bytes = length;
    rx->receiving = 0;
    ucp_request_free(request);
}

static ucs_status_t am_notice_cb(void *arg, const void *header, size_t header_length, void *data,
                                 size_t length, const ucp_am_recv_param_t *param)
{
    xfer_context_t *ctx = arg;
    rx_notice_t *rx;
    size_t max_bytes =
        xfer_notice_encoded_bytes(XFER_NOTICE_MAX_PAGES, XFER_NOTICE_MAX_PAYLOAD_BYTES);

    (void)header;
    (void)header_length;
    rx = calloc(1, sizeof(*rx));
    if (rx == NULL || length > max_bytes) {
        tdm_log(TDM_LOG_ERROR, XFER_LOG_MODULE, "notice dropped: bytes=%zu reason=%s", length,
                rx == NULL ? "no memory" : "too long");
        xfer_metrics_event(ctx->metrics, XFER_EVENT_NOTICE_MALFORMED);
        free(rx);
        if ((param->recv_attr & (UCP_AM_RECV_ATTR_FLAG_RNDV | UCP_AM_RECV_ATTR_FLAG_DATA)) != 0) {
            ucp_am_data_release(ctx->worker, data);
        }
        return UCS_OK;
    }
    rx->n_bytes = length;
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) {
        ucp_request_param_t recv_param;
        void *request;

        rx->bytes = malloc(length > 0 ? length : 1);
        if (rx->bytes == NULL) {
            tdm_log(TDM_LOG_ERROR, XFER_LOG_MODULE, "notice dropped: bytes=%zu reason=no memory",
                    length);
            xfer_metrics_event(ctx->metrics, XFER_EVENT_NOTICE_MALFORMED);
            ucp_am_data_release(ctx->worker, data);
            free(rx);
            return UCS_OK;
        }
        memset(&recv_param, 0, sizeof(recv_param));
        recv_param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        recv_param.cb.recv_am = rndv_done_cb;
        recv_param.user_data = rx;
        rx->receiving = 1;
        request = ucp_am_recv_data_nbx(ctx->worker, data, rx->bytes, length, &recv_param);
        if (request == NULL) {
            rx->receiving = 0;
        } else if (UCS_PTR_IS_ERR(request)) {
            rx->receiving = 0;
            rx->recv_status = UCS_PTR_STATUS(request);
        }
        rx_enqueue(ctx, rx);
        return UCS_OK;
    }
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA) != 0) {
        rx->bytes = data;
        rx->ucx_data = data;
        rx_enqueue(ctx, rx);
        return UCS_INPROGRESS; /* released after delivery */
    }
    rx->bytes = malloc(length > 0 ? length : 1);
    if (rx->bytes == NULL) {
        tdm_log(TDM_LOG_ERROR, XFER_LOG_MODULE, "notice dropped: bytes=%zu reason=no memory",
                length);
        xfer_metrics_event(ctx->metrics, XFER_EVENT_NOTICE_MALFORMED);
        free(rx);
        return UCS_OK;
    }
    memcpy(rx->bytes, data, length);
    rx_enqueue(ctx, rx);
    return UCS_OK;
}

/* Check the pages a notice names against its checksums, for host or device pools. */
static tdm_status_t check_notice_pages(const xfer_pool_t *pool, const uint32_t *pages,
                                       const uint64_t *checksums, uint32_t n_pages,
                                       uint32_t *n_bad_out, uint32_t *first_bad_out)
{
    uint8_t *staging;
    uint32_t n_bad = 0;
    uint32_t first_bad = XFER_NOTICE_NO_BAD_PAGE;

    if (pool->mem_type == XFER_MEM_HOST) {
        return xfer_notice_check_pages(pool->base, pool->page_size_bytes, pool->n_pages, pages,
                                       checksums, n_pages, n_bad_out, first_bad_out);
    }
    *n_bad_out = 0;
    *first_bad_out = XFER_NOTICE_NO_BAD_PAGE;
    for (uint32_t i = 0; i < n_pages; i++) {
        if (pages[i] >= pool->n_pages) {
            return TDM_ERR_INVALID_ARG;
        }
    }
    staging = malloc(pool->page_size_bytes);
    if (staging == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    for (uint32_t i = 0; i < n_pages; i++) {
        const uint8_t *page = xfer_pool_host_page(pool, pages[i], staging);

        if (page == NULL || tdm_hash_xxh3_64(page, pool->page_size_bytes) != checksums[i]) {
            if (n_bad == 0) {
                first_bad = i;
            }
            n_bad++;
        }
    }
    free(staging);
    *n_bad_out = n_bad;
    *first_bad_out = first_bad;
    return n_bad == 0 ? TDM_OK : TDM_ERR_MISMATCH;
}

void xfer_notice_deliver(xfer_context_t *ctx, rx_notice_t *rx)
{
    xfer_notice_view_t view;
    xfer_notice_t notice;
    const xfer_pool_t *pool;
    uint32_t *pages = NULL;
    uint64_t *checksums = NULL;
    tdm_status_t status;

    if (rx->recv_status != UCS_OK) {
        tdm_log(TDM_LOG_ERROR, XFER_LOG_MODULE, "notice receive failed: bytes=%zu ucx=\"%s\"",
                rx->n_bytes, ucs_status_string(rx->recv_status));
        xfer_metrics_event(ctx->metrics, XFER_EVENT_NOTICE_MALFORMED);
        return;
    }
    status = xfer_notice_decode(rx->bytes, rx->n_bytes, &view);
    if (status == TDM_OK && view.receiver_incarnation_id != ctx->incarnation_id) {
        status = TDM_ERR_MISMATCH;
    }
    if (status != TDM_OK) {
        tdm_log(TDM_LOG_ERROR, XFER_LOG_MODULE,
                "notice dropped: bytes=%zu status=%s (frame or addressee wrong)", rx->n_bytes,
                tdm_status_name(status));
        xfer_metrics_event(ctx->metrics, XFER_EVENT_NOTICE_MALFORMED);
        return;
    }

    memset(&notice, 0, sizeof(notice));
    if (view.n_pages > 0) {
        pages = malloc((size_t)view.n_pages * sizeof(*pages));
        checksums = malloc((size_t)view.n_pages * sizeof(*checksums));
        if (pages == NULL || checksums == NULL) {
            tdm_log(TDM_LOG_ERROR, XFER_LOG_MODULE, "notice dropped: job=%llu reason=no memory",
                    (unsigned long long)view.job_id);
            xfer_metrics_event(ctx->metrics, XFER_EVENT_NOTICE_MALFORMED);
            free(pages);
            free(checksums);
            return;
        }
        for (uint32_t i = 0; i < view.n_pages; i++) {
            pages[i] = xfer_notice_frame_page(&view, i);
            checksums[i] = xfer_notice_frame_checksum(&view, i);
        }
    }
    notice.job_id = view.job_id;
    memcpy(notice.sender_name, view.sender_name, sizeof(notice.sender_name));
    notice.sender_incarnation_id = view.sender_incarnation_id;
    notice.pool_id = view.receiver_pool_id;
    notice.n_pages = view.n_pages;
    notice.pages = pages;
    notice.checksums = checksums;
    notice.payload = view.payload;
    notice.payload_bytes = view.payload_bytes;
    notice.first_bad_index = XFER_NOTICE_NO_BAD_PAGE;

    pool = xfer_pool_find(ctx, view.receiver_pool_id);
    if (pool == NULL) {
        notice.status = TDM_ERR_NOT_FOUND;
    } else {
        notice.status = check_notice_pages(pool, pages, checksums, view.n_pages,
                                           &notice.n_bad_pages, &notice.first_bad_index);
    }
    xfer_metrics_event(ctx->metrics, XFER_EVENT_NOTICE_RECEIVED);
    if (notice.status != TDM_OK) {
        xfer_metrics_event(ctx->metrics, XFER_EVENT_NOTICE_MISMATCH);
        tdm_log(TDM_LOG_ERROR, XFER_LOG_MODULE,
                "notice check failed: job=%llu sender=%s pool_id=%u pages=%u bad_pages=%u "
                "first_bad_page=%d status=%s",
                (unsigned long long)notice.job_id, notice.sender_name, notice.pool_id,
                notice.n_pages, notice.n_bad_pages,
                notice.first_bad_index == XFER_NOTICE_NO_BAD_PAGE
                    ? -1
                    : (int)pages[notice.first_bad_index],
                tdm_status_name(notice.status));
    }
    if (ctx->params.on_notice != NULL) {
        ctx->params.on_notice(ctx->params.on_notice_arg, &notice);
    }
    free(pages);
    free(checksums);
}

/* ---- progress ---- */

static int deferred_work_pending(const xfer_context_t *ctx)
{
    if (ctx->done_head != NULL || ctx->peers_dirty) {
        return 1;
    }
    for (const rx_notice_t *rx = ctx->rx_head; rx != NULL; rx = rx->next) {
        if (!rx->receiving) {
            return 1;
        }
    }
    return 0;
}

static void check_liveness_due(xfer_context_t *ctx)
{
    if (tdm_clock_elapsed_ms(ctx->t_liveness_ns) >= (double)xfer_context_max_sleep_ms(ctx)) {
        ctx->t_liveness_ns = tdm_clock_now_ns();
        xfer_peer_check_liveness(ctx);
    }
}

unsigned xfer_context_progress(xfer_context_t *ctx)
{
    unsigned n_events = 0;
    unsigned n;
    xfer_batch_t *done;
    rx_notice_t *rx;
    rx_notice_t **link;

    do {
        n = ucp_worker_progress(ctx->worker);
        n_events += n;
    } while (n != 0 && n_events < PROGRESS_BUDGET);

    if (ctx->n_wiring > 0) {
        xfer_peer_check_wireup(ctx);
    }
    /* Same-host liveness, once per keepalive interval. Busy callers get the clock read every
     * LIVENESS_CLOCK_EVERY calls (reads are not free in every VM); sleepers in arm. */
    if (++ctx->n_progress_calls % LIVENESS_CLOCK_EVERY == 0) {
        check_liveness_due(ctx);
    }
    if (ctx->peers_dirty) {
        xfer_peer_collect(ctx);
    }

    /* Callbacks may post batches that finish at once: deliver only what is queued now. */
    done = ctx->done_head;
    ctx->done_head = ctx->done_tail = NULL;
    while (done != NULL) {
        xfer_batch_t *next = done->next;

        xfer_batch_deliver(ctx, done);
        n_events++;
        done = next;
    }

    link = &ctx->rx_head;
    while ((rx = *link) != NULL) {
        if (rx->receiving) {
            link = &rx->next;
            continue;
        }
        *link = rx->next;
        if (ctx->rx_tail == rx) {
            ctx->rx_tail = NULL;
            for (rx_notice_t *last = ctx->rx_head; last != NULL; last = last->next) {
                ctx->rx_tail = last;
            }
        }
        xfer_notice_deliver(ctx, rx);
        rx_free(ctx, rx);
        n_events++;
    }

    if (ctx->peers_dirty) {
        xfer_peer_collect(ctx);
    }
    return n_events;
}

tdm_status_t xfer_context_arm(xfer_context_t *ctx)
{
    ucs_status_t ucs;

    check_liveness_due(ctx); /* a peer found dead here makes the arm report busy */
    if (deferred_work_pending(ctx)) {
        return TDM_ERR_BUSY;
    }
    ucs = ucp_worker_arm(ctx->worker);
    if (ucs == UCS_OK) {
        return TDM_OK;
    }
    if (ucs == UCS_ERR_BUSY) {
        return TDM_ERR_BUSY;
    }
    tdm_log(TDM_LOG_ERROR, XFER_LOG_MODULE, "ucx worker arm failed: ucx=\"%s\"",
            ucs_status_string(ucs));
    return TDM_ERR_INTERNAL;
}

tdm_status_t xfer_context_wait(xfer_context_t *ctx, uint32_t timeout_ms)
{
    uint64_t t_start_ns = tdm_clock_now_ns();

    for (;;) {
        struct pollfd pfd;
        double elapsed_ms;
        uint32_t sleep_ms;
        tdm_status_t status;
        int rc;

        if (xfer_context_progress(ctx) > 0) {
            return TDM_OK;
        }
        status = xfer_context_arm(ctx);
        if (status == TDM_ERR_BUSY) {
            continue;
        }
        if (status != TDM_OK) {
            return status;
        }
        elapsed_ms = tdm_clock_elapsed_ms(t_start_ns);
        if (elapsed_ms >= (double)timeout_ms) {
            return TDM_ERR_TIMEOUT;
        }
        sleep_ms = timeout_ms - (uint32_t)elapsed_ms;
        if (sleep_ms > xfer_context_max_sleep_ms(ctx)) {
            sleep_ms = xfer_context_max_sleep_ms(ctx);
        }
        pfd.fd = ctx->efd;
        pfd.events = POLLIN;
        pfd.revents = 0;
        rc = poll(&pfd, 1, (int)sleep_ms);
        if (rc < 0 && errno != EINTR) {
            tdm_log(TDM_LOG_ERROR, XFER_LOG_MODULE, "poll on ucx efd failed: %s", strerror(errno));
            return TDM_ERR_IO;
        }
    }
}
