/* pool.c - page pool and reservations of the decode node (pool.h). */
#include "decode-node/pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/hash.h"
#include "common/log.h"
#include "kernels/kv_page.h"

struct decode_pool {
    const engine_model_t *model;
    node_pages_t *pages;  /* the engine pool and its transfer pages (node/node_pages.h) */
    engine_kv_pool_t *kv; /* node_pages_engine(pages) */
    xfer_pool_t *xpool;   /* node_pages_xfer(pages): NULL without UCX */
    decode_resv_t *resvs;
    uint32_t n_reserved;
    uint64_t next_id;
};

tdm_status_t decode_pool_create(const engine_model_t *model, uint32_t n_pages, xfer_context_t *xfer,
                                decode_pool_t **pool_out)
{
    decode_pool_t *pool = calloc(1, sizeof(*pool));
    tdm_status_t status;

    if (pool == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    pool->model = model;
    pool->next_id = tdm_hash_splitmix64(tdm_clock_now_ns()) | 1u;
    /* page i of the engine pool is page i of the xfer pool: in place over UCX's memory on the
     * CPU, a staging copy of it when the engine's pages live on a device (node_pages.h) */
    status = node_pages_create(model, n_pages, xfer, &pool->pages);
    if (status != TDM_OK) {
        free(pool);
        return status;
    }
    pool->kv = node_pages_engine(pool->pages);
    pool->xpool = node_pages_xfer(pool->pages);
    *pool_out = pool;
    return TDM_OK;
}

static void free_resv(decode_pool_t *pool, decode_resv_t *resv)
{
    decode_resv_t **link = &pool->resvs;

    while (*link != NULL && *link != resv) {
        link = &(*link)->next;
    }
    if (*link == resv) {
        *link = resv->next;
    }
    for (uint32_t s = 0; s < resv->n_sources; s++) {
        engine_kv_table_release(pool->kv, &resv->tables[s]);
    }
    pool->n_reserved -= resv->n_pages + resv->stage.n_pages;
    engine_kv_table_release(pool->kv, &resv->stage);
    free(resv);
}

void decode_pool_destroy(decode_pool_t *pool)
{
    if (pool == NULL) {
        return;
    }
    while (pool->resvs != NULL) {
        free_resv(pool, pool->resvs);
    }
    node_pages_destroy(pool->pages);
    free(pool);
}

engine_kv_pool_t *decode_pool_engine(decode_pool_t *pool)
{
    return pool->kv;
}

node_pages_t *decode_pool_pages(decode_pool_t *pool)
{
    return pool->pages;
}

void decode_pool_descriptor(const decode_pool_t *pool, const uint8_t **bytes_out, size_t *n_out)
{
    if (pool->xpool == NULL) {
        *bytes_out = NULL;
        *n_out = 0;
        return;
    }
    xfer_pool_descriptor(pool->xpool, bytes_out, n_out);
}

uint32_t decode_pool_n_total(const decode_pool_t *pool)
{
    return engine_kv_pool_n_pages(pool->kv);
}

uint32_t decode_pool_n_free(const decode_pool_t *pool)
{
    return engine_kv_pool_n_free(pool->kv);
}

uint32_t decode_pool_n_reserved(const decode_pool_t *pool)
{
    return pool->n_reserved;
}

tdm_status_t decode_pool_reserve(decode_pool_t *pool, uint64_t request_id, const char *session_id,
                                 uint64_t cached_len, uint64_t total_len,
                                 const uint32_t *first_target, const uint32_t *pages_per_source,
                                 uint32_t timeout_ms, decode_resv_t **resv_out)
{
    const engine_config_t *cfg = engine_model_config(pool->model);
    uint32_t need = 0;
    decode_resv_t *resv;
    tdm_status_t status = TDM_OK;

    for (int s = 0; s < cfg->n_kv_source_layer_ids; s++) {
        need += pages_per_source[s];
    }
    if (need > engine_kv_pool_n_free(pool->kv)) {
        return TDM_ERR_NO_PAGES;
    }
    resv = calloc(1, sizeof(*resv));
    if (resv == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    resv->id = pool->next_id;
    pool->next_id = tdm_hash_splitmix64(pool->next_id) | 1u;
    resv->request_id = request_id;
    snprintf(resv->session_id, sizeof(resv->session_id), "%s", session_id);
    resv->cached_len = cached_len;
    resv->total_len = total_len;
    resv->deadline_ns = tdm_clock_now_ns() + (uint64_t)timeout_ms * TDM_NS_PER_MS;
    resv->n_sources = (uint32_t)cfg->n_kv_source_layer_ids;
    for (uint32_t s = 0; s < resv->n_sources && status == TDM_OK; s++) {
        int layer = (int)cfg->kv_source_layer_ids[s];
        int ratio = (int)cfg->compress_ratios[layer];
        resv->first_target[s] = first_target[s];
        status = engine_kv_table_init(&resv->tables[s], layer, ratio);
        if (status == TDM_OK) {
            status = engine_kv_table_reserve(pool->kv, &resv->tables[s],
                                             (int64_t)pages_per_source[s] * KERN_KV_PAGE_ROWS);
        }
    }
    if (status != TDM_OK) {
        for (uint32_t s = 0; s < resv->n_sources; s++) {
            engine_kv_table_release(pool->kv, &resv->tables[s]);
        }
        free(resv);
        return status;
    }
    resv->n_pages = need;
    pool->n_reserved += need;
    resv->next = pool->resvs;
    pool->resvs = resv;
    *resv_out = resv;
    return TDM_OK;
}

decode_resv_t *decode_pool_find(decode_pool_t *pool, uint64_t id)
{
    for (decode_resv_t *r = pool->resvs; r != NULL; r = r->next) {
        if (r->id == id) {
            return r;
        }
    }
    return NULL;
}

decode_resv_t *decode_pool_find_request(decode_pool_t *pool, uint64_t request_id, int active_only)
{
    for (decode_resv_t *r = pool->resvs; r != NULL && request_id != 0; r = r->next) {
        if (r->request_id == request_id && (!active_only || r->state == DECODE_RESV_ACTIVE)) {
            return r;
        }
    }
    return NULL;
}

void decode_pool_fence(decode_pool_t *pool, decode_resv_t *resv, uint32_t fence_ms)
{
    (void)pool;
    if (resv->state == DECODE_RESV_ACTIVE) {
        resv->state = DECODE_RESV_FENCED;
        resv->deadline_ns = tdm_clock_now_ns() + (uint64_t)fence_ms * TDM_NS_PER_MS;
    }
}

uint32_t decode_pool_lapse_all(decode_pool_t *pool, uint64_t now_ns)
{
    return decode_pool_lapse_if(pool, now_ns, NULL, NULL);
}

uint32_t decode_pool_lapse_if(decode_pool_t *pool, uint64_t now_ns,
                              int (*pick)(void *arg, const decode_resv_t *resv), void *arg)
{
    uint32_t n = 0;

    for (decode_resv_t *r = pool->resvs; r != NULL; r = r->next) {
        if (r->state == DECODE_RESV_ACTIVE && r->deadline_ns > now_ns &&
            (pick == NULL || pick(arg, r))) {
            r->deadline_ns = now_ns;
            n++;
        }
    }
    return n;
}

void decode_pool_release(decode_pool_t *pool, decode_resv_t *resv)
{
    free_resv(pool, resv);
}

uint64_t decode_pool_expire(decode_pool_t *pool, uint64_t now_ns, uint32_t fence_ms,
                            void (*on_lapse)(void *arg, decode_resv_t *resv), void *arg)
{
    uint64_t next = UINT64_MAX;
    decode_resv_t *r = pool->resvs;

    while (r != NULL) {
        decode_resv_t *after = r->next;
        if (r->deadline_ns <= now_ns) {
            if (r->state == DECODE_RESV_ACTIVE) {
                tdm_log(TDM_LOG_WARN, "pool", "reservation timed out: reservation=%llu pages=%u",
                        (unsigned long long)r->id, r->n_pages);
                decode_pool_fence(pool, r, fence_ms);
                if (on_lapse != NULL) {
                    on_lapse(arg, r);
                }
            } else {
                tdm_log(TDM_LOG_DEBUG, "pool", "reservation fenced and freed: reservation=%llu",
                        (unsigned long long)r->id);
                free_resv(pool, r);
                r = after;
                continue;
            }
        }
        if (r->deadline_ns - (r->deadline_ns > now_ns ? now_ns : r->deadline_ns) < next) {
            next = r->deadline_ns > now_ns ? r->deadline_ns - now_ns : 0;
        }
        r = after;
    }
    return next;
}

tdm_status_t decode_pool_stage(decode_pool_t *pool, decode_resv_t *resv, const uint8_t *bytes,
                               size_t n_bytes)
{
    const engine_config_t *cfg = engine_model_config(pool->model);
    size_t page_bytes = engine_kv_pool_page_bytes(pool->kv);
    size_t n_pages = (n_bytes + page_bytes - 1) / page_bytes;
    int layer = (int)cfg->kv_source_layer_ids[0];
    tdm_status_t status;

    if (resv->stage.n_pages > 0 || n_bytes == 0 || bytes == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    if (n_pages > engine_kv_pool_n_free(pool->kv)) {
        return TDM_ERR_NO_PAGES;
    }
    status = engine_kv_table_init(&resv->stage, layer, (int)cfg->compress_ratios[layer]);
    if (status == TDM_OK) {
        status =
            engine_kv_table_reserve(pool->kv, &resv->stage, (int64_t)n_pages * KERN_KV_PAGE_ROWS);
    }
    if (status != TDM_OK) {
        engine_kv_table_release(pool->kv, &resv->stage);
        return status;
    }
    for (size_t i = 0; i < n_pages; i++) {
        /* raw bytes where the prefill node gets them (the staging copy when the engine's pages
         * are on a device: the engine never reads these); the pages' headers are rewritten when
         * the pool hands them out again */
        size_t n = n_bytes - i * page_bytes < page_bytes ? n_bytes - i * page_bytes : page_bytes;
        memcpy(node_pages_host(pool->pages, resv->stage.page_ids[i]), bytes + i * page_bytes, n);
    }
    pool->n_reserved += resv->stage.n_pages;
    return TDM_OK;
}
