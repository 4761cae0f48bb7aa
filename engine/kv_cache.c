/* kv_cache.c - the page pool and block tables (engine/kv_cache.h). */
#include "engine/kv_cache.h"

#include "common/buf.h"
#include "common/log.h"

#include <stdlib.h>
#include <string.h>

struct engine_kv_pool {
    kern_kv_page_layout_t layout;
    uint64_t fingerprint;
    uint32_t n_pages;
    uint32_t n_free;
    uint32_t *free_ids; /* stack of free page ids, [n_free] valid */
    uint32_t *refs;     /* [n_pages] block tables linking each page (0: free) */
    uint32_t n_shared;  /* pages with refs >= 2 */
    uint64_t n_refs;    /* sum of refs */
    unsigned char *pages; /* n_pages * page_bytes */
    int external;         /* pages are the caller's memory (engine_kv_pool_create_in) */
    const kern_ops_t *ops; /* the table whose memory holds the pages (NULL: host, malloc) */
    int dev;               /* pages are backend memory: host code goes through ops */
    unsigned char *stage;  /* dev: two host pages of staging (headers, seal, compare) */
};

/* pool->ops's member calls take no context of their own (default stream). */
#define POOL_CTX NULL

tdm_status_t engine_kv_pool_create(const engine_config_t *cfg, uint64_t fingerprint,
                                   uint32_t n_pages, engine_kv_pool_t **pool_out)
{
    return engine_kv_pool_create_in(cfg, fingerprint, n_pages, NULL, pool_out);
}

tdm_status_t engine_kv_pool_create_ops(const engine_config_t *cfg, uint64_t fingerprint,
                                       uint32_t n_pages, const kern_ops_t *ops,
                                       engine_kv_pool_t **pool_out)
{
    engine_kv_pool_t *pool = NULL;
    kern_kv_page_layout_t ly;
    void *mem = NULL;
    tdm_status_t st;

    if (ops == NULL || ops->host_memory) {
        st = engine_kv_pool_create_in(cfg, fingerprint, n_pages, NULL, pool_out);
        if (st == TDM_OK && ops != NULL) {
            (*pool_out)->ops = ops;
        }
        return st;
    }
    if (cfg == NULL || pool_out == NULL || n_pages == 0) {
        return TDM_ERR_INVALID_ARG;
    }
    st = kern_kv_page_layout((uint32_t)cfg->head_dim, (uint32_t)cfg->index_head_dim, &ly);
    if (st != TDM_OK) {
        return st;
    }
    st = ops->mem_alloc(POOL_CTX, (size_t)n_pages * ly.page_bytes, &mem);
    if (st != TDM_OK) {
        return st;
    }
    st = engine_kv_pool_create_in(cfg, fingerprint, n_pages, mem, &pool);
    if (st == TDM_OK) {
        pool->stage = malloc(2 * ly.page_bytes);
        if (pool->stage == NULL) {
            engine_kv_pool_destroy(pool);
            ops->mem_free(POOL_CTX, mem);
            return TDM_ERR_NO_MEMORY;
        }
        pool->external = 0; /* the pool's own backend memory, freed with ops->mem_free */
        pool->ops = ops;
        pool->dev = 1;
        *pool_out = pool;
    } else {
        ops->mem_free(POOL_CTX, mem);
    }
    return st;
}

const kern_ops_t *engine_kv_pool_ops(const engine_kv_pool_t *pool)
{
    return pool->ops != NULL ? pool->ops : kern_ops_cpu();
}

int engine_kv_pool_host_pages(const engine_kv_pool_t *pool)
{
    return !pool->dev;
}

tdm_status_t engine_kv_pool_read_page(const engine_kv_pool_t *pool, uint32_t page_id, void *host)
{
    const void *page = engine_kv_pool_page_const(pool, page_id);
    if (page == NULL || host == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    if (!pool->dev) {
        memcpy(host, page, pool->layout.page_bytes);
        return TDM_OK;
    }
    return pool->ops->mem_copy(POOL_CTX, host, page, pool->layout.page_bytes, KERN_COPY_D2H);
}

tdm_status_t engine_kv_pool_write_page(engine_kv_pool_t *pool, uint32_t page_id, const void *host)
{
    void *page = engine_kv_pool_page(pool, page_id);
    if (page == NULL || host == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    if (!pool->dev) {
        memcpy(page, host, pool->layout.page_bytes);
        return TDM_OK;
    }
    return pool->ops->mem_copy(POOL_CTX, page, host, pool->layout.page_bytes, KERN_COPY_H2D);
}

tdm_status_t engine_kv_pool_create_in(const engine_config_t *cfg, uint64_t fingerprint,
                                      uint32_t n_pages, void *pages_mem,
                                      engine_kv_pool_t **pool_out)
{
    engine_kv_pool_t *pool;
    tdm_status_t st;

    if (cfg == NULL || pool_out == NULL || n_pages == 0) {
        return TDM_ERR_INVALID_ARG;
    }
    pool = calloc(1, sizeof(*pool));
    if (pool == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    st = kern_kv_page_layout((uint32_t)cfg->head_dim, (uint32_t)cfg->index_head_dim,
                             &pool->layout);
    if (st != TDM_OK) {
        free(pool);
        return st;
    }
    pool->fingerprint = fingerprint;
    pool->n_pages = n_pages;
    pool->free_ids = malloc((size_t)n_pages * sizeof(uint32_t));
    pool->refs = calloc((size_t)n_pages, sizeof(uint32_t));
    pool->external = pages_mem != NULL;
    pool->pages = pages_mem != NULL ? pages_mem : malloc((size_t)n_pages * pool->layout.page_bytes);
    if (pool->free_ids == NULL || pool->refs == NULL || pool->pages == NULL) {
        engine_kv_pool_destroy(pool);
        return TDM_ERR_NO_MEMORY;
    }
    for (uint32_t i = 0; i < n_pages; i++) {
        pool->free_ids[i] = n_pages - 1 - i; /* page 0 is handed out first */
    }
    pool->n_free = n_pages;
    *pool_out = pool;
    return TDM_OK;
}

void engine_kv_pool_destroy(engine_kv_pool_t *pool)
{
    if (pool == NULL) {
        return;
    }
    free(pool->free_ids);
    free(pool->refs);
    if (pool->dev) {
        pool->ops->mem_free(POOL_CTX, pool->pages);
    } else if (!pool->external) {
        free(pool->pages);
    }
    free(pool->stage);
    free(pool);
}

uint32_t engine_kv_pool_n_pages(const engine_kv_pool_t *pool)
{
    return pool->n_pages;
}

uint32_t engine_kv_pool_n_free(const engine_kv_pool_t *pool)
{
    return pool->n_free;
}

size_t engine_kv_pool_page_bytes(const engine_kv_pool_t *pool)
{
    return pool->layout.page_bytes;
}

uint64_t engine_kv_pool_fingerprint(const engine_kv_pool_t *pool)
{
    return pool->fingerprint;
}

void *engine_kv_pool_page(engine_kv_pool_t *pool, uint32_t page_id)
{
    if (pool == NULL || page_id >= pool->n_pages) {
        return NULL;
    }
    return pool->pages + (size_t)page_id * pool->layout.page_bytes;
}

const void *engine_kv_pool_page_const(const engine_kv_pool_t *pool, uint32_t page_id)
{
    if (pool == NULL || page_id >= pool->n_pages) {
        return NULL;
    }
    return pool->pages + (size_t)page_id * pool->layout.page_bytes;
}

uint32_t engine_kv_pool_n_shared(const engine_kv_pool_t *pool)
{
    return pool->n_shared;
}

uint64_t engine_kv_pool_n_extra_refs(const engine_kv_pool_t *pool)
{
    return pool->n_refs - (uint64_t)(pool->n_pages - pool->n_free);
}

uint32_t engine_kv_pool_page_refs(const engine_kv_pool_t *pool, uint32_t page_id)
{
    if (pool == NULL || page_id >= pool->n_pages) {
        return 0;
    }
    return pool->refs[page_id];
}

/* Take one reference to page id (a table links it). */
static void page_ref(engine_kv_pool_t *pool, uint32_t id)
{
    pool->n_refs++;
    if (++pool->refs[id] == 2) {
        pool->n_shared++;
    }
}

/* Drop one reference to page id; the last one gives the page back to the pool. */
static void page_unref(engine_kv_pool_t *pool, uint32_t id)
{
    if (pool->refs[id] == 0) {
        tdm_log(TDM_LOG_ERROR, "engine", "kv page %u released twice", id);
        return;
    }
    pool->n_refs--;
    if (pool->refs[id]-- == 2) {
        pool->n_shared--;
    }
    if (pool->refs[id] == 0) {
        pool->free_ids[pool->n_free++] = id;
    }
}

/* Copy-on-write: make page i of table private (a copy in a fresh page) when other tables link it
 * too. Returns TDM_OK, or TDM_ERR_NO_PAGES (no free page: nothing changed). */
static tdm_status_t page_make_private(engine_kv_pool_t *pool, engine_kv_table_t *table,
                                      uint32_t i)
{
    uint32_t old = table->page_ids[i];
    uint32_t id;

    if (pool->refs[old] < 2) {
        return TDM_OK;
    }
    if (pool->n_free == 0) {
        return TDM_ERR_NO_PAGES;
    }
    id = pool->free_ids[pool->n_free - 1];
    if (pool->dev) {
        tdm_status_t st = pool->ops->mem_copy(POOL_CTX, engine_kv_pool_page(pool, id),
                                              engine_kv_pool_page(pool, old),
                                              pool->layout.page_bytes, KERN_COPY_D2D);
        if (st != TDM_OK) {
            return st;
        }
    } else {
        memcpy(engine_kv_pool_page(pool, id), engine_kv_pool_page(pool, old),
               pool->layout.page_bytes);
    }
    pool->n_free--;
    pool->refs[id] = 1;
    pool->n_refs++;
    page_unref(pool, old);
    table->page_ids[i] = id;
    return TDM_OK;
}

/* Zero the slots >= live of page id (main and index regions), set its row_count to live and
 * mark it stale (header bytes 16..17 and 21, kernels/kv_page.h). A backend page: mem_set on the
 * regions and the 64-byte header through host staging. */
static tdm_status_t page_cut(engine_kv_pool_t *pool, uint32_t id, uint32_t live)
{
    unsigned char *page = engine_kv_pool_page(pool, id);
    const kern_kv_page_layout_t *ly = &pool->layout;
    uint32_t dead = KERN_KV_PAGE_ROWS - live;
    size_t off[4] = {ly->main_codes_offset + live * ly->main_codes_row_bytes,
                     ly->main_scales_offset + live * ly->main_scales_row_bytes,
                     ly->index_codes_offset + live * ly->index_codes_row_bytes,
                     ly->index_scales_offset + live * ly->index_scales_row_bytes};
    size_t len[4] = {dead * ly->main_codes_row_bytes, dead * ly->main_scales_row_bytes,
                     dead * ly->index_codes_row_bytes, dead * ly->index_scales_row_bytes};
    int n_regions = ly->d_I > 0 ? 4 : 2;
    unsigned char *hdr = page;
    tdm_status_t st = TDM_OK;

    for (int r = 0; r < n_regions && st == TDM_OK; r++) {
        if (pool->dev) {
            st = pool->ops->mem_set(POOL_CTX, page + off[r], 0, len[r]);
        } else {
            memset(page + off[r], 0, len[r]);
        }
    }
    if (st == TDM_OK && pool->dev) {
        hdr = pool->stage;
        st = pool->ops->mem_copy(POOL_CTX, hdr, page, KERN_KV_PAGE_HEADER_BYTES, KERN_COPY_D2H);
    }
    if (st != TDM_OK) {
        return st;
    }
    hdr[16] = (unsigned char)(live & 0xFF);
    hdr[17] = (unsigned char)(live >> 8);
    hdr[21] |= KERN_KV_PAGE_FLAG_STALE;
    if (pool->dev) {
        st = pool->ops->mem_copy(POOL_CTX, page, hdr, KERN_KV_PAGE_HEADER_BYTES, KERN_COPY_H2D);
    }
    return st;
}

tdm_status_t engine_kv_table_init(engine_kv_table_t *table, int source_layer, int ratio)
{
    if (table == NULL || ratio < 1 || ratio > 2) {
        return TDM_ERR_INVALID_ARG;
    }
    memset(table, 0, sizeof(*table));
    table->source_layer = source_layer;
    table->ratio = ratio;
    return TDM_OK;
}

uint32_t engine_kv_table_pages_needed(const engine_kv_table_t *table, int64_t n_rows)
{
    int64_t pages = kern_kv_page_count(n_rows);
    return pages > (int64_t)table->n_pages ? (uint32_t)(pages - table->n_pages) : 0;
}

tdm_status_t engine_kv_table_reserve(engine_kv_pool_t *pool, engine_kv_table_t *table,
                                     int64_t n_rows)
{
    uint32_t need;

    if (pool == NULL || table == NULL || n_rows < 0) {
        return TDM_ERR_INVALID_ARG;
    }
    need = engine_kv_table_pages_needed(table, n_rows);
    if (need == 0) {
        return TDM_OK;
    }
    if (need > pool->n_free) {
        return TDM_ERR_NO_PAGES;
    }
    if (table->n_pages + need > table->capacity) {
        size_t cap = table->capacity;
        uint32_t *grown =
            tdm_array_grow(table->page_ids, sizeof(*grown), (size_t)table->n_pages + need, 8, &cap);
        if (grown == NULL) {
            return TDM_ERR_NO_MEMORY;
        }
        table->page_ids = grown;
        table->capacity = cap > UINT32_MAX ? UINT32_MAX : (uint32_t)cap; /* less is safe */
    }
    for (uint32_t i = 0; i < need; i++) {
        uint32_t id = pool->free_ids[--pool->n_free];
        kern_kv_page_params_t params = {
            .source_layer = (uint16_t)table->source_layer,
            .first_row = (uint64_t)(table->n_pages) * KERN_KV_PAGE_ROWS,
            .ratio = (uint8_t)table->ratio,
            .d = (uint16_t)pool->layout.d,
            .d_I = (uint16_t)pool->layout.d_I,
            .fingerprint = pool->fingerprint,
        };
        tdm_status_t st;
        if (pool->dev) {
            /* built in host staging, then one copy into the backend page */
            st = kern_kv_page_init(pool->stage, pool->layout.page_bytes, &params);
            if (st == TDM_OK) {
                st = engine_kv_pool_write_page(pool, id, pool->stage);
            }
        } else {
            st = kern_kv_page_init(engine_kv_pool_page(pool, id), pool->layout.page_bytes, &params);
        }
        if (st != TDM_OK) {
            pool->n_free++; /* cannot happen for a valid layout; undo this page */
            return st;
        }
        pool->refs[id] = 1;
        pool->n_refs++;
        table->page_ids[table->n_pages++] = id;
    }
    return TDM_OK;
}

uint32_t engine_kv_table_truncate_pages_needed(const engine_kv_pool_t *pool,
                                               const engine_kv_table_t *table, int64_t n_rows)
{
    int64_t keep_pages;

    if (pool == NULL || table == NULL || n_rows < 0 || n_rows >= table->n_rows ||
        n_rows % KERN_KV_PAGE_ROWS == 0) {
        return 0;
    }
    keep_pages = kern_kv_page_count(n_rows);
    return pool->refs[table->page_ids[keep_pages - 1]] >= 2 ? 1u : 0u;
}

tdm_status_t engine_kv_table_truncate(engine_kv_pool_t *pool, engine_kv_table_t *table,
                                      int64_t n_rows)
{
    int64_t keep_pages;
    int64_t old_rows;

    if (pool == NULL || table == NULL || n_rows < 0 || n_rows > table->n_rows) {
        return TDM_ERR_INVALID_ARG;
    }
    old_rows = table->n_rows;
    keep_pages = kern_kv_page_count(n_rows);
    if (n_rows < old_rows && n_rows % KERN_KV_PAGE_ROWS != 0) {
        /* the last kept page gets its dropped slots zeroed: copy it first if it is shared */
        tdm_status_t st = page_make_private(pool, table, (uint32_t)(keep_pages - 1));
        if (st != TDM_OK) {
            return st;
        }
    }
    while ((int64_t)table->n_pages > keep_pages) {
        page_unref(pool, table->page_ids[--table->n_pages]);
    }
    if (n_rows < old_rows && n_rows % KERN_KV_PAGE_ROWS != 0) {
        /* zero the dropped slots of the last kept page and lower its row_count */
        tdm_status_t st = page_cut(pool, table->page_ids[table->n_pages - 1],
                                   (uint32_t)(n_rows % KERN_KV_PAGE_ROWS));
        if (st != TDM_OK) {
            return st; /* a backend copy failed (logged by the backend) */
        }
    }
    table->n_rows = n_rows;
    return TDM_OK;
}

void engine_kv_table_release(engine_kv_pool_t *pool, engine_kv_table_t *table)
{
    if (table == NULL) {
        return;
    }
    if (pool != NULL) {
        while (table->n_pages > 0) {
            page_unref(pool, table->page_ids[--table->n_pages]);
        }
    }
    free(table->page_ids);
    table->page_ids = NULL;
    table->n_pages = 0;
    table->capacity = 0;
    table->n_rows = 0;
}

void *engine_kv_table_row_page(engine_kv_pool_t *pool, const engine_kv_table_t *table, int64_t j,
                               uint32_t *slot_out)
{
    int64_t page = j / KERN_KV_PAGE_ROWS;
    if (j < 0 || page >= (int64_t)table->n_pages) {
        return NULL;
    }
    if (slot_out != NULL) {
        *slot_out = (uint32_t)(j % KERN_KV_PAGE_ROWS);
    }
    return engine_kv_pool_page(pool, table->page_ids[page]);
}

tdm_status_t engine_kv_pool_seal_page(engine_kv_pool_t *pool, uint32_t page_id, void *host_copy)
{
    unsigned char *copy;
    tdm_status_t st;

    if (pool == NULL || page_id >= pool->n_pages) {
        return TDM_ERR_INVALID_ARG;
    }
    if (!pool->dev) {
        st = kern_kv_page_seal(engine_kv_pool_page(pool, page_id));
        if (st == TDM_OK && host_copy != NULL && host_copy != engine_kv_pool_page(pool, page_id)) {
            memcpy(host_copy, engine_kv_pool_page(pool, page_id), pool->layout.page_bytes);
        }
        return st;
    }
    /* the page comes up to host memory, is sealed there, and its header goes back */
    copy = host_copy != NULL ? host_copy : pool->stage;
    st = engine_kv_pool_read_page(pool, page_id, copy);
    if (st == TDM_OK) {
        st = kern_kv_page_seal(copy);
    }
    if (st == TDM_OK) {
        st = pool->ops->mem_copy(POOL_CTX, engine_kv_pool_page(pool, page_id), copy,
                                 KERN_KV_PAGE_HEADER_BYTES, KERN_COPY_H2D);
    }
    return st;
}

tdm_status_t engine_kv_table_seal(engine_kv_pool_t *pool, engine_kv_table_t *table)
{
    for (uint32_t i = 0; i < table->n_pages; i++) {
        tdm_status_t st = engine_kv_pool_seal_page(pool, table->page_ids[i], NULL);
        if (st != TDM_OK) {
            return st;
        }
    }
    return TDM_OK;
}

void *engine_kv_table_row_page_mut(engine_kv_pool_t *pool, engine_kv_table_t *table, int64_t j,
                                   uint32_t *slot_out)
{
    int64_t page = j / KERN_KV_PAGE_ROWS;
    if (pool == NULL || table == NULL || j < 0 || page >= (int64_t)table->n_pages ||
        page_make_private(pool, table, (uint32_t)page) != TDM_OK) {
        return NULL;
    }
    return engine_kv_table_row_page(pool, table, j, slot_out);
}

tdm_status_t engine_kv_table_relink(engine_kv_pool_t *pool, engine_kv_table_t *table, uint32_t i,
                                    uint32_t page_id)
{
    uint32_t old;

    if (pool == NULL || table == NULL || i >= table->n_pages || page_id >= pool->n_pages ||
        pool->refs[page_id] == 0) {
        return TDM_ERR_INVALID_ARG;
    }
    old = table->page_ids[i];
    if (old == page_id) {
        return TDM_OK;
    }
    if (pool->dev) {
        unsigned char *a = pool->stage, *b = pool->stage + pool->layout.page_bytes;
        tdm_status_t st = engine_kv_pool_read_page(pool, old, a);
        if (st == TDM_OK) {
            st = engine_kv_pool_read_page(pool, page_id, b);
        }
        if (st != TDM_OK) {
            return st;
        }
        if (memcmp(a, b, pool->layout.page_bytes) != 0) {
            return TDM_ERR_MISMATCH;
        }
    } else if (memcmp(engine_kv_pool_page_const(pool, old),
                      engine_kv_pool_page_const(pool, page_id), pool->layout.page_bytes) != 0) {
        return TDM_ERR_MISMATCH;
    }
    page_ref(pool, page_id);
    page_unref(pool, old);
    table->page_ids[i] = page_id;
    return TDM_OK;
}

tdm_status_t engine_kv_table_share(engine_kv_pool_t *pool, engine_kv_table_t *dst,
                                   const engine_kv_table_t *src, int64_t n_rows)
{
    uint32_t n_pages;

    if (pool == NULL || dst == NULL || src == NULL || dst == src || dst->n_pages != 0 ||
        dst->n_rows != 0 || dst->ratio != src->ratio || dst->source_layer != src->source_layer ||
        n_rows < 0 || n_rows > src->n_rows || n_rows % KERN_KV_PAGE_ROWS != 0) {
        return TDM_ERR_INVALID_ARG;
    }
    n_pages = (uint32_t)(n_rows / KERN_KV_PAGE_ROWS);
    if (n_pages > dst->capacity) {
        size_t cap = dst->capacity;
        uint32_t *grown = tdm_array_grow(dst->page_ids, sizeof(*grown), n_pages, 8, &cap);
        if (grown == NULL) {
            return TDM_ERR_NO_MEMORY;
        }
        dst->page_ids = grown;
        dst->capacity = cap > UINT32_MAX ? UINT32_MAX : (uint32_t)cap;
    }
    for (uint32_t i = 0; i < n_pages; i++) {
        dst->page_ids[i] = src->page_ids[i];
        page_ref(pool, src->page_ids[i]);
    }
    dst->n_pages = n_pages;
    dst->n_rows = n_rows;
    return TDM_OK;
}
