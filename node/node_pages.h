/* node_pages.h - a worker's KV page pool and the host bytes its page transfers use (issue 14
 * item 5; docs/GPU.md 7).
 *
 * Owns the engine's page pool (engine/kv_cache.h) and the UCX page pool (transfer/pool.h) peers
 * put into and get from, and keeps one rule for both nodes: page id i of the engine pool is page
 * i of the transfer pool, so a descriptor names pages by engine page id wherever they live.
 *
 * Two layouts, chosen by the model's kernel table (engine_model_ops):
 *   - host (the CPU table): UCX allocates the memory and the engine pool lies over it: one copy
 *     of every page, the transfer's bytes are the engine's (unchanged from before this module);
 *   - staged (a table with host_memory 0: CUDA): the engine pool lives in the table's memory
 *     (device memory), and the transfer pool is a host *staging* copy of the same page count,
 *     registered with UCX. Pages cross between the two only where a node hands them on: a worker
 *     downloads the pages it is about to seal, hash, put or offer for a get
 *     (node_pages_download), and pages that arrive (puts into a reservation, gets from a peer)
 *     are read from the staging copy into a sequence blob, which engine_seq_import copies into
 *     the engine pool. Device memory registered with UCX directly (cuda_ipc, GPUDirect RDMA) needs
 *     a UCX built with CUDA, which Debian's is not; that lane is not built yet (docs/GPU.md 5).
 *
 * Without a transfer context (in-process tests) the host layout is a plain engine pool and the
 * staged layout keeps its staging copy in ordinary memory.
 *
 * Single-threaded: the node's scheduler or compute thread. Borrows the model and the transfer
 * context (both outlive the pages).
 */
#ifndef TANDEM_NODE_PAGES_H
#define TANDEM_NODE_PAGES_H

#include <stdint.h>

#include "common/status.h"
#include "engine/kv_cache.h"
#include "engine/model.h"
#include "transfer/context.h"
#include "transfer/pool.h"

typedef struct node_pages node_pages_t;

/*
 * node_pages_create - n_pages (> 0) pages of `model`'s geometry in the layout its kernel table
 * asks for, registered with `xfer` when it is not NULL. Every page is MODEL.md 7's page_bytes.
 * Returns TDM_OK with *out, TDM_ERR_INVALID_ARG (NULL model or out, n_pages 0),
 * TDM_ERR_NO_MEMORY (host or device allocation) or the transfer layer's status; *out untouched
 * on errors and nothing left allocated.
 */
tdm_status_t node_pages_create(const engine_model_t *model, uint32_t n_pages, xfer_context_t *xfer,
                               node_pages_t **out);

/* node_pages_destroy - free both pools (the engine pool before the memory it may lie in); the
 * caller has released every table and no transfer is in flight. Accepts NULL. */
void node_pages_destroy(node_pages_t *p);

/* node_pages_engine - the engine pool (owned by p). */
engine_kv_pool_t *node_pages_engine(const node_pages_t *p);

/* node_pages_xfer - the UCX page pool (owned by p), NULL without a transfer context. */
xfer_pool_t *node_pages_xfer(const node_pages_t *p);

/* node_pages_staged - 1 for the staged layout (engine pages in backend memory), 0 for host. */
int node_pages_staged(const node_pages_t *p);

/*
 * node_pages_host - the host bytes (page_bytes) of page `page_id` that transfers read and write:
 * the engine's page itself in the host layout, its staging copy in the staged one (which holds
 * what was last downloaded or received there, not what the engine wrote since). NULL when
 * page_id is out of range.
 */
uint8_t *node_pages_host(const node_pages_t *p, uint32_t page_id);

/* node_pages_host_base - node_pages_host(p, 0): the pages are contiguous (xfer_notice_check_pages
 * addresses them by index from here). */
uint8_t *node_pages_host_base(const node_pages_t *p);

/*
 * node_pages_download - copy the engine's pages ids[0..n) into their staging copies (a no-op in
 * the host layout, where they are the same bytes). Only for pages that are final and sealed in
 * the engine (node_pages_seal), or that no peer can be reading: the copy overwrites what a peer's
 * get may be reading. Returns TDM_OK, TDM_ERR_INVALID_ARG (an id
 * out of range; pages before it copied) or the backend's copy error.
 */
tdm_status_t node_pages_download(node_pages_t *p, const uint32_t *ids, uint32_t n);

/*
 * node_pages_seal - seal the engine's pages ids[0..n) (kern_kv_page_seal: the XXH3-64 of each
 * page's bytes into its header) and leave the sealed bytes in their host copies, as they must be
 * before a peer reads them: in the host layout in place; in the staged one each page is
 * downloaded into its staging copy, sealed there, and its header copied back to the engine's
 * page, so the engine holds the same sealed bytes as on the CPU (a later download of a page
 * nothing wrote since gives the same bytes, which keeps a page that two sessions share readable
 * by one peer while another's reservation downloads it again; and an import's relink of shared
 * pages compares equal bytes). Returns TDM_OK, TDM_ERR_INVALID_ARG (an id out of range, or a
 * page without a valid header; pages before it sealed) or the backend's copy error.
 */
tdm_status_t node_pages_seal(node_pages_t *p, const uint32_t *ids, uint32_t n);

/* node_pages_n_downloaded - pages copied from the engine into their staging copies so far
 * (node_pages_download and node_pages_seal; always 0 in the host layout): the staged layout's
 * traffic, for the nodes' /metrics. */
uint64_t node_pages_n_downloaded(const node_pages_t *p);

#endif
