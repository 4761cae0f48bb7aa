/* kv_cache.h - a node's pool of compressed-KV pages and the per-sequence block tables into it.
 *
 * Owns a fixed number of MODEL.md section-7 pages (kernels/kv_page.h layout, host memory), all
 * allocated at create. A page is free (owned by the pool) or linked into exactly one block table
 * (owned by that table, STYLE.md 4). A block table (engine_kv_table_t) maps the rows of one KV
 * source of one sequence to pages: row j lives in page ids[j / 64], slot j % 64. Failed calls
 * change nothing; free-page counts return to baseline when every table is released. Knows
 * nothing of sequences' other state (engine/seq_state.h), of transport or of the math that fills
 * the rows. Not thread-safe: one pool per engine thread, or external locking.
 */
#ifndef TANDEM_ENGINE_KV_CACHE_H
#define TANDEM_ENGINE_KV_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "engine/config.h"
#include "kernels/kv_page.h"

/* A page pool; opaque. */
typedef struct engine_kv_pool engine_kv_pool_t;

/*
 * engine_kv_table_t - one KV source's rows of one sequence. Plain data owned by the caller's
 * struct; the pages it lists are owned by the table between reserve and release.
 *
 * source_layer: the KV source layer; ratio: its compression ratio (1 or 2).
 * n_rows:       rows written so far (published rows, MODEL.md 5.3).
 * page_ids:     [n_pages] pool page ids, page i holds rows [64 i, 64 i + 64).
 * capacity:     entries allocated in page_ids (grows in engine_kv_table_reserve).
 */
typedef struct {
    int source_layer;
    int ratio;
    int64_t n_rows;
    uint32_t *page_ids;
    uint32_t n_pages;
    uint32_t capacity;
} engine_kv_table_t;

/*
 * engine_kv_pool_create - a pool of n_pages pages for the model described by cfg (d = head_dim,
 * d_I = index_head_dim, page layout of MODEL.md 7) stamped with `fingerprint`.
 *
 * Returns TDM_OK and *pool_out (engine_kv_pool_destroy frees it), TDM_ERR_INVALID_ARG for NULL
 * or n_pages 0, or TDM_ERR_NO_MEMORY. Borrows cfg for the call only.
 */
tdm_status_t engine_kv_pool_create(const engine_config_t *cfg, uint64_t fingerprint,
                                   uint32_t n_pages, engine_kv_pool_t **pool_out);

/*
 * engine_kv_pool_create_in - as engine_kv_pool_create, but the pages live in caller memory
 * `pages_mem` of n_pages * page bytes (kern_kv_page_layout of cfg), e.g. memory registered for
 * remote access (transfer/pool.h). Borrows pages_mem: it must outlive the pool, which never frees
 * it. Same returns, plus TDM_ERR_INVALID_ARG for pages_mem NULL.
 */
tdm_status_t engine_kv_pool_create_in(const engine_config_t *cfg, uint64_t fingerprint,
                                      uint32_t n_pages, void *pages_mem,
                                      engine_kv_pool_t **pool_out);

/* engine_kv_pool_destroy - free the pool and all its pages; accepts NULL. Tables still holding
 * pages must not be used afterwards. */
void engine_kv_pool_destroy(engine_kv_pool_t *pool);

/* engine_kv_pool_n_pages / n_free - pages in the pool / pages currently free. */
uint32_t engine_kv_pool_n_pages(const engine_kv_pool_t *pool);
uint32_t engine_kv_pool_n_free(const engine_kv_pool_t *pool);

/* engine_kv_pool_page_bytes - bytes of one page (22848 at full size). */
size_t engine_kv_pool_page_bytes(const engine_kv_pool_t *pool);

/* engine_kv_pool_fingerprint - the model fingerprint every page is stamped with. */
uint64_t engine_kv_pool_fingerprint(const engine_kv_pool_t *pool);

/* engine_kv_pool_page - the bytes of page `page_id` (< n_pages), owned by the pool; NULL when
 * out of range. */
void *engine_kv_pool_page(engine_kv_pool_t *pool, uint32_t page_id);
const void *engine_kv_pool_page_const(const engine_kv_pool_t *pool, uint32_t page_id);

/*
 * engine_kv_table_init - an empty table for `source_layer` at `ratio` (no pages). Cannot fail
 * for a valid ratio; returns TDM_ERR_INVALID_ARG for NULL or ratio outside 1..2.
 */
tdm_status_t engine_kv_table_init(engine_kv_table_t *table, int source_layer, int ratio);

/*
 * engine_kv_table_pages_needed - pages `table` still needs to hold n_rows rows (0 if it has
 * them).
 */
uint32_t engine_kv_table_pages_needed(const engine_kv_table_t *table, int64_t n_rows);

/*
 * engine_kv_table_reserve - take pages from the pool until the table can hold n_rows rows; each
 * new page is initialised empty (kern_kv_page_init) with the table's identity and the pool's
 * fingerprint. n_rows (the row count written so far) is unchanged.
 *
 * Returns TDM_OK, TDM_ERR_NO_PAGES (not enough free pages: nothing changed), TDM_ERR_NO_MEMORY
 * (nothing changed) or TDM_ERR_INVALID_ARG.
 */
tdm_status_t engine_kv_table_reserve(engine_kv_pool_t *pool, engine_kv_table_t *table,
                                     int64_t n_rows);

/*
 * engine_kv_table_truncate - drop rows >= n_rows (n_rows <= table->n_rows; equal gives back
 * only reserved pages beyond the rows) and give back pages no longer needed to hold them.
 * Dropped slots of a kept page are zeroed so that the page's checksum covers only live rows.
 */
void engine_kv_table_truncate(engine_kv_pool_t *pool, engine_kv_table_t *table, int64_t n_rows);

/* engine_kv_table_release - give every page back and free the id array; the table is left empty
 * (source and ratio kept). Accepts a zeroed table. */
void engine_kv_table_release(engine_kv_pool_t *pool, engine_kv_table_t *table);

/* engine_kv_table_row_page - the page holding row j (< pages * 64) and its slot; NULL when out of
 * range. */
void *engine_kv_table_row_page(engine_kv_pool_t *pool, const engine_kv_table_t *table, int64_t j,
                               uint32_t *slot_out);

/* engine_kv_table_seal - seal (checksum) every page of the table (kern_kv_page_seal). */
tdm_status_t engine_kv_table_seal(engine_kv_pool_t *pool, engine_kv_table_t *table);

#endif
