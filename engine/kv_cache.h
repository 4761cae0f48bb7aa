/* kv_cache.h - a node's pool of compressed-KV pages and the per-sequence block tables into it.
 *
 * Owns a fixed number of MODEL.md section-7 pages (kernels/kv_page.h layout), all allocated at
 * create: host memory, or a kernel backend's memory (engine_kv_pool_create_ops with a table whose
 * host_memory is 0: CUDA device memory, the test-only guard table). On a backend pool the pool
 * reaches page bytes only through that table's mem_copy / mem_set (headers, copy-on-write,
 * sealing and comparisons go through a host staging page), never by dereferencing them. A block
 * table (engine_kv_table_t) maps the rows of one KV source of one sequence to pages: row j lives in
 * page ids[j / 64], slot j % 64.
 *
 * Ownership (reference-counted pages, issue 17): a page is free (owned by the pool, 0
 * references) or linked into one or more block tables, each link one reference (STYLE.md 4: the
 * tables own the page together). engine_kv_table_reserve links fresh pages (1 reference);
 * engine_kv_table_share links another table's full pages (one more reference each: a shared
 * prefix, MODEL.md 7 prefix cache); engine_kv_table_truncate and engine_kv_table_release drop
 * references, and a page goes back to the pool when its last reference goes. Shared pages are
 * read-only: every write path copies a shared page into a private one first (copy-on-write):
 * engine_kv_table_truncate zeroing the dropped slots of a shared last page, and
 * engine_kv_table_row_page_mut, which the forward pass uses to write a row. Sealing
 * (engine_kv_table_seal) writes only the checksum of bytes every owner shares, so it never copies.
 * Rows are appended at n_rows and engine_kv_table_share links full pages only, so in practice a
 * shared page is copied only when a table is cut back into it. Failed calls change nothing;
 * free-page counts return to baseline when every table is released. Knows
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
#include "kernels/ops.h"

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

/*
 * engine_kv_pool_create_ops - as engine_kv_pool_create, with the pages in the memory of kernel
 * table `ops` (its mem_alloc; NULL or a host_memory table: host memory exactly as
 * engine_kv_pool_create). ops must outlive the pool. Same returns.
 */
tdm_status_t engine_kv_pool_create_ops(const engine_config_t *cfg, uint64_t fingerprint,
                                       uint32_t n_pages, const kern_ops_t *ops,
                                       engine_kv_pool_t **pool_out);

/* engine_kv_pool_ops - the kernel table whose memory holds the pages (kern_ops_cpu() for a host
 * pool). */
const kern_ops_t *engine_kv_pool_ops(const engine_kv_pool_t *pool);

/* engine_kv_pool_host_pages - 1 when host code may read and write the page bytes directly (a
 * host pool), 0 for a backend pool (use engine_kv_pool_read_page / write_page). */
int engine_kv_pool_host_pages(const engine_kv_pool_t *pool);

/*
 * engine_kv_pool_read_page / write_page - copy page `page_id` (< n_pages) out to / in from host
 * memory host [page_bytes] (memcpy on a host pool, mem_copy D2H / H2D on a backend pool).
 * Returns TDM_OK, TDM_ERR_INVALID_ARG (NULL, page out of range) or the backend's copy error.
 */
tdm_status_t engine_kv_pool_read_page(const engine_kv_pool_t *pool, uint32_t page_id, void *host);
tdm_status_t engine_kv_pool_write_page(engine_kv_pool_t *pool, uint32_t page_id, const void *host);

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
 * out of range. Backend memory for a backend pool (host code must not dereference it). */
void *engine_kv_pool_page(engine_kv_pool_t *pool, uint32_t page_id);
const void *engine_kv_pool_page_const(const engine_kv_pool_t *pool, uint32_t page_id);

/* engine_kv_pool_n_shared - pages currently linked into two or more block tables. */
uint32_t engine_kv_pool_n_shared(const engine_kv_pool_t *pool);

/* engine_kv_pool_n_extra_refs - links beyond the first of every page (sum of references minus
 * pages in use): pages summed over every table minus this = distinct pages in use. */
uint64_t engine_kv_pool_n_extra_refs(const engine_kv_pool_t *pool);

/* engine_kv_pool_page_refs - block tables linking page `page_id` (0: free or out of range). */
uint32_t engine_kv_pool_page_refs(const engine_kv_pool_t *pool, uint32_t page_id);

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
 * only reserved pages beyond the rows) and drop the table's reference to pages no longer needed
 * to hold them (freed when it was the last). Dropped slots of a kept page are zeroed so that the
 * page's checksum covers only live rows; a shared kept page is first copied into a private one
 * (copy-on-write: the other tables keep the original).
 *
 * Returns TDM_OK, TDM_ERR_INVALID_ARG (NULL, n_rows out of range) or TDM_ERR_NO_PAGES (the copy
 * needs a free page and there is none); nothing changed on error.
 * engine_kv_table_truncate_pages_needed says beforehand how many free pages it needs (0 or 1).
 */
tdm_status_t engine_kv_table_truncate(engine_kv_pool_t *pool, engine_kv_table_t *table,
                                      int64_t n_rows);

/* engine_kv_table_truncate_pages_needed - free pages engine_kv_table_truncate(pool, table, n_rows)
 * takes for its copy-on-write: 1 when the kept last page is partly cut and shared, else 0. */
uint32_t engine_kv_table_truncate_pages_needed(const engine_kv_pool_t *pool,
                                               const engine_kv_table_t *table, int64_t n_rows);

/*
 * engine_kv_table_share - link the first n_rows rows of `src` into the empty table `dst` (same
 * source layer and ratio): dst takes one more reference to each of src's pages holding them, and
 * holds n_rows rows. n_rows must be a multiple of 64 (whole pages: neither table ever writes into
 * a shared page afterwards without copying it first) and <= src->n_rows. Takes no free page.
 *
 * Returns TDM_OK, TDM_ERR_INVALID_ARG (NULL, dst not empty, other layer or ratio, n_rows not a
 * multiple of 64 or beyond src's rows) or TDM_ERR_NO_MEMORY; nothing changed on error.
 */
tdm_status_t engine_kv_table_share(engine_kv_pool_t *pool, engine_kv_table_t *dst,
                                   const engine_kv_table_t *src, int64_t n_rows);

/*
 * engine_kv_table_relink - let page i of `table` be page `page_id` (a page in use by other tables,
 * byte for byte equal to the table's page i): the table takes a reference to page_id and drops
 * its reference to its own page (freed when it was the last). For a holder of a private copy of
 * a shared page (an import) to share the original again.
 *
 * Returns TDM_OK, TDM_ERR_INVALID_ARG (NULL, i or page_id out of range, page_id free) or
 * TDM_ERR_MISMATCH (the bytes differ); nothing changed on error.
 */
tdm_status_t engine_kv_table_relink(engine_kv_pool_t *pool, engine_kv_table_t *table, uint32_t i,
                                    uint32_t page_id);

/* engine_kv_table_release - drop the table's reference to every page (a page goes back to the
 * pool with its last reference) and free the id array; the table is left empty
 * (source and ratio kept). Accepts a zeroed table. */
void engine_kv_table_release(engine_kv_pool_t *pool, engine_kv_table_t *table);

/* engine_kv_table_row_page - the page holding row j (< pages * 64) and its slot; NULL when out of
 * range. For reading: the page may be shared (write through engine_kv_table_row_page_mut). */
void *engine_kv_table_row_page(engine_kv_pool_t *pool, const engine_kv_table_t *table, int64_t j,
                               uint32_t *slot_out);

/* engine_kv_table_row_page_mut - as engine_kv_table_row_page, for writing row j: a shared page
 * is first copied into a private one (copy-on-write). NULL when out of range or when that copy
 * finds no free page (nothing changed). */
void *engine_kv_table_row_page_mut(engine_kv_pool_t *pool, engine_kv_table_t *table, int64_t j,
                                   uint32_t *slot_out);

/*
 * engine_kv_pool_seal_page - seal page `page_id` (kern_kv_page_seal: the XXH3-64 of bytes
 * [64, page end) into its header) where it lives, and leave its sealed bytes in host_copy
 * [page_bytes] when that is not NULL. A host pool seals in place (and copies out unless host_copy
 * is the page itself); a backend pool reads the page into host_copy (or the pool's own staging
 * when NULL), seals it there and copies the 64-byte header back, so both hold the same sealed
 * bytes. Returns TDM_OK, TDM_ERR_INVALID_ARG (NULL pool, page out of range, or a page without a
 * valid header: nothing written back) or the backend's copy error.
 */
tdm_status_t engine_kv_pool_seal_page(engine_kv_pool_t *pool, uint32_t page_id, void *host_copy);

/* engine_kv_table_seal - seal (checksum) every page of the table (engine_kv_pool_seal_page). A
 * shared page is sealed in place: its bytes are every owner's, so the checksum is the same for
 * all. */
tdm_status_t engine_kv_table_seal(engine_kv_pool_t *pool, engine_kv_table_t *table);

#endif
