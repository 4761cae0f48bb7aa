/* node_pages.c - a worker's KV page pool and its transfer pages (node_pages.h). */
#include "node/node_pages.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/kv_page.h"

struct node_pages {
    engine_kv_pool_t *kv;
    xfer_pool_t *xpool; /* NULL without a transfer context */
    uint8_t *staging;   /* staged layout: the host copies (xpool's memory, or own_staging) */
    uint8_t *own_staging;
    uint64_t n_downloaded; /* node_pages_n_downloaded */
    size_t page_bytes;
    uint32_t n_pages;
};

tdm_status_t node_pages_create(const engine_model_t *model, uint32_t n_pages, xfer_context_t *xfer,
                               node_pages_t **out)
{
    const engine_config_t *cfg;
    const kern_ops_t *ops;
    kern_kv_geometry_t geometry;
    node_pages_t *p;
    tdm_status_t status;

    if (model == NULL || out == NULL || n_pages == 0) {
        return TDM_ERR_INVALID_ARG;
    }
    cfg = engine_model_config(model);
    ops = engine_model_ops(model);
    status = kern_kv_geometry((uint32_t)cfg->head_dim, (uint32_t)cfg->index_head_dim,
                              engine_config_max_kv_ratio(cfg), &geometry);
    if (status != TDM_OK) {
        return status;
    }
    p = calloc(1, sizeof(*p));
    if (p == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    p->page_bytes = geometry.page_bytes;
    p->n_pages = n_pages;
    if (xfer != NULL) {
        /* UCX allocates the host pages (shared memory a peer on the host reaches with one-sided
         * copies): the engine's pages, or their staging copies */
        xfer_pool_params_t xp = {
            .page_size_bytes = geometry.page_bytes,
            .n_pages = n_pages,
            .mem_type = XFER_MEM_HOST,
            .base = NULL,
        };
        status = xfer_pool_create(xfer, &xp, &p->xpool);
        if (status != TDM_OK) {
            goto fail_xpool;
        }
    }
    if (ops != NULL && !ops->host_memory) {
        if (p->xpool != NULL) {
            p->staging = xfer_pool_page(p->xpool, 0);
        } else {
            p->own_staging = calloc(n_pages, geometry.page_bytes);
            p->staging = p->own_staging;
            if (p->staging == NULL) {
                status = TDM_ERR_NO_MEMORY;
                goto fail_staging;
            }
        }
        status =
            engine_kv_pool_create_ops(cfg, engine_model_fingerprint(model), n_pages, ops, &p->kv);
    } else {
        status =
            engine_kv_pool_create_in(cfg, engine_model_fingerprint(model), n_pages,
                                     p->xpool != NULL ? xfer_pool_page(p->xpool, 0) : NULL, &p->kv);
    }
    if (status != TDM_OK) {
        goto fail_kv;
    }
    *out = p;
    return TDM_OK;

fail_kv:
    free(p->own_staging);
fail_staging:
    xfer_pool_destroy(p->xpool);
fail_xpool:
    free(p);
    return status;
}

void node_pages_destroy(node_pages_t *p)
{
    if (p == NULL) {
        return;
    }
    engine_kv_pool_destroy(p->kv); /* before the memory it may lie in */
    xfer_pool_destroy(p->xpool);
    free(p->own_staging);
    free(p);
}

engine_kv_pool_t *node_pages_engine(const node_pages_t *p)
{
    return p->kv;
}

xfer_pool_t *node_pages_xfer(const node_pages_t *p)
{
    return p->xpool;
}

int node_pages_staged(const node_pages_t *p)
{
    return p->staging != NULL;
}

uint8_t *node_pages_host(const node_pages_t *p, uint32_t page_id)
{
    if (page_id >= p->n_pages) {
        return NULL;
    }
    if (p->staging != NULL) {
        return p->staging + (size_t)page_id * p->page_bytes;
    }
    return engine_kv_pool_page(p->kv, page_id);
}

uint8_t *node_pages_host_base(const node_pages_t *p)
{
    return node_pages_host(p, 0);
}

tdm_status_t node_pages_download(node_pages_t *p, const uint32_t *ids, uint32_t n)
{
    if (p->staging == NULL) {
        return TDM_OK;
    }
    for (uint32_t i = 0; i < n; i++) {
        tdm_status_t status;

        if (ids[i] >= p->n_pages) {
            return TDM_ERR_INVALID_ARG;
        }
        status =
            engine_kv_pool_read_page(p->kv, ids[i], p->staging + (size_t)ids[i] * p->page_bytes);
        if (status != TDM_OK) {
            return status;
        }
        p->n_downloaded++;
    }
    return TDM_OK;
}

uint64_t node_pages_n_downloaded(const node_pages_t *p)
{
    return p->n_downloaded;
}

tdm_status_t node_pages_seal(node_pages_t *p, const uint32_t *ids, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        /* host layout: in place (node_pages_host is the engine's page); staged: into the staging
         * copy, with the sealed header copied back to the engine */
        tdm_status_t status =
            ids[i] < p->n_pages
                ? engine_kv_pool_seal_page(p->kv, ids[i], node_pages_host(p, ids[i]))
                : TDM_ERR_INVALID_ARG;
        if (status != TDM_OK) {
            return status;
        }
        p->n_downloaded += p->staging != NULL;
    }
    return TDM_OK;
}
