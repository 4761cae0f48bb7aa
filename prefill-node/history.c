/* history.c - the prefill node's history page cache (history.h). */
#include "prefill-node/history.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "kernels/kv_page.h"
#include "proto/proto_hash.h"

/* One session's pages after its last job here. */
typedef struct entry {
    struct entry *prev, *next; /* recency list: head is the most recently used */
    uint64_t key;              /* proto_session_hash(session_id) */
    char *session_id;          /* owned */
    uint32_t n_sources;
    int32_t layers[NODE_MAX_SOURCES];
    uint32_t base[NODE_MAX_SOURCES]; /* index of source s's first page in pages[] */
    uint32_t n_pages[NODE_MAX_SOURCES];
    uint32_t n_all;
    uint8_t **pages; /* [n_all] owned copies, page_bytes each */
} entry_t;

struct prefill_history {
    const engine_config_t *cfg;
    uint64_t fingerprint;
    size_t page_bytes;
    uint64_t max_bytes;
    entry_t *head, *tail;
    prefill_history_stats_t stats;
};

tdm_status_t prefill_history_create(const engine_config_t *cfg, uint64_t fingerprint,
                                    size_t page_bytes, uint64_t max_bytes, prefill_history_t **out)
{
    prefill_history_t *h;

    if (cfg == NULL || out == NULL || page_bytes < KERN_KV_PAGE_HEADER_BYTES) {
        return TDM_ERR_INVALID_ARG;
    }
    h = calloc(1, sizeof(*h));
    if (h == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    h->cfg = cfg;
    h->fingerprint = fingerprint;
    h->page_bytes = page_bytes;
    h->max_bytes = max_bytes;
    h->stats.max_bytes = max_bytes;
    *out = h;
    return TDM_OK;
}

static uint64_t entry_bytes(const prefill_history_t *h, const entry_t *e)
{
    return (uint64_t)e->n_all * h->page_bytes;
}

static void entry_free(entry_t *e)
{
    if (e == NULL) {
        return;
    }
    for (uint32_t k = 0; e->pages != NULL && k < e->n_all; k++) {
        free(e->pages[k]);
    }
    free(e->pages);
    free(e->session_id);
    free(e);
}

static void unlink_entry(prefill_history_t *h, entry_t *e)
{
    if (e->prev != NULL) {
        e->prev->next = e->next;
    } else {
        h->head = e->next;
    }
    if (e->next != NULL) {
        e->next->prev = e->prev;
    } else {
        h->tail = e->prev;
    }
    e->prev = e->next = NULL;
    h->stats.bytes -= entry_bytes(h, e);
    h->stats.sessions--;
}

static void push_front(prefill_history_t *h, entry_t *e)
{
    e->prev = NULL;
    e->next = h->head;
    if (h->head != NULL) {
        h->head->prev = e;
    }
    h->head = e;
    if (h->tail == NULL) {
        h->tail = e;
    }
    h->stats.bytes += entry_bytes(h, e);
    h->stats.sessions++;
}

void prefill_history_destroy(prefill_history_t *h)
{
    if (h == NULL) {
        return;
    }
    while (h->head != NULL) {
        entry_t *e = h->head;
        unlink_entry(h, e);
        entry_free(e);
    }
    free(h);
}

static entry_t *find(const prefill_history_t *h, const char *session_id)
{
    uint64_t key = proto_session_hash(session_id);

    for (entry_t *e = h->head; e != NULL; e = e->next) {
        if (e->key == key && strcmp(e->session_id, session_id) == 0) {
            return e;
        }
    }
    return NULL;
}

/* The cached copy of page j of descriptor source s, when it is the page the decode node holds. */
static const void *usable(const prefill_history_t *h, const entry_t *e,
                          const node_resv_source_t *src, uint32_t s, uint32_t j)
{
    kern_kv_page_params_t want;
    const uint8_t *page;

    if (e == NULL || src->history_digests == NULL || s >= e->n_sources ||
        e->layers[s] != src->layer || j >= e->n_pages[s] || src->layer < 0 ||
        src->layer >= ENGINE_CONFIG_MAX_LAYERS) {
        return NULL;
    }
    page = e->pages[e->base[s] + j];
    if (node_page_digest(page) != src->history_digests[j]) {
        return NULL; /* the decode node's page changed (appended, rewound, rebuilt) */
    }
    memset(&want, 0, sizeof(want));
    want.source_layer = (uint16_t)src->layer;
    want.first_row = (uint64_t)j * KERN_KV_PAGE_ROWS;
    want.ratio = (uint8_t)h->cfg->roles[src->layer].ratio;
    want.d = (uint16_t)h->cfg->head_dim;
    want.d_I = (uint16_t)h->cfg->index_head_dim;
    want.fingerprint = h->fingerprint;
    if (kern_kv_page_check(page, h->page_bytes, &want, KERN_KV_PAGE_CHECK_CHECKSUM) != TDM_OK) {
        tdm_log(TDM_LOG_WARN, "history",
                "cached page failed its check, pulled instead: layer=%d page=%u", src->layer, j);
        return NULL;
    }
    return page;
}

uint32_t prefill_history_lookup(prefill_history_t *h, const char *session_id,
                                const node_resv_desc_t *rd, const void **pages_out)
{
    entry_t *e = NULL;
    uint32_t k = 0, n_hits = 0;

    if (h == NULL || rd == NULL || pages_out == NULL) {
        return 0;
    }
    if (session_id != NULL && h->max_bytes > 0) {
        e = find(h, session_id);
    }
    if (e != NULL && e != h->head) {
        unlink_entry(h, e);
        push_front(h, e);
    }
    for (uint32_t s = 0; s < rd->n_sources; s++) {
        for (uint32_t j = 0; j < rd->src[s].n_history; j++) {
            pages_out[k] = usable(h, e, &rd->src[s], s, j);
            n_hits += pages_out[k] != NULL;
            k++;
        }
    }
    h->stats.hit_pages_total += n_hits;
    h->stats.miss_pages_total += k - n_hits;
    return n_hits;
}

void prefill_history_drop(prefill_history_t *h, const char *session_id)
{
    entry_t *e;

    if (h == NULL || session_id == NULL) {
        return;
    }
    e = find(h, session_id);
    if (e != NULL) {
        unlink_entry(h, e);
        entry_free(e);
    }
}

/* Evict least recently used entries (never `keep`) until `need` more bytes and one more session
 * fit. */
static void make_room(prefill_history_t *h, uint64_t need)
{
    while (h->tail != NULL && (h->stats.bytes + need > h->max_bytes ||
                               h->stats.sessions + 1 > PREFILL_HISTORY_MAX_SESSIONS)) {
        entry_t *e = h->tail;
        tdm_log(TDM_LOG_DEBUG, "history", "evicted: session=%s pages=%u", e->session_id, e->n_all);
        unlink_entry(h, e);
        entry_free(e);
        h->stats.evictions_total++;
    }
}

tdm_status_t prefill_history_keep(prefill_history_t *h, const char *session_id, uint32_t n_sources,
                                  const int32_t *layers, const uint32_t *n_pages,
                                  const void *const *pages)
{
    entry_t *old, *e;
    uint64_t n_all = 0;

    if (h == NULL || session_id == NULL || n_sources > NODE_MAX_SOURCES ||
        (n_sources > 0 && (layers == NULL || n_pages == NULL))) {
        return TDM_ERR_INVALID_ARG;
    }
    for (uint32_t s = 0; s < n_sources; s++) {
        n_all += n_pages[s];
    }
    if (n_all > 0 && pages == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    if (h->max_bytes == 0) {
        return TDM_OK;
    }
    old = find(h, session_id);
    if (old != NULL) {
        unlink_entry(h, old); /* out of the accounting while the new entry is built */
    }
    if (n_all == 0 || n_all * h->page_bytes > h->max_bytes) {
        entry_free(old);
        return TDM_OK;
    }
    e = calloc(1, sizeof(*e));
    if (e != NULL) {
        e->session_id = strdup(session_id);
        e->pages = calloc((size_t)n_all, sizeof(uint8_t *));
    }
    if (e == NULL || e->session_id == NULL || e->pages == NULL) {
        entry_free(e);
        entry_free(old);
        return TDM_ERR_NO_MEMORY;
    }
    e->key = proto_session_hash(session_id);
    e->n_sources = n_sources;
    e->n_all = (uint32_t)n_all;
    for (uint32_t s = 0, k = 0; s < n_sources; s++) {
        e->layers[s] = layers[s];
        e->base[s] = k;
        e->n_pages[s] = n_pages[s];
        for (uint32_t j = 0; j < n_pages[s]; j++, k++) {
            uint8_t **prev = NULL;
            if (old != NULL && s < old->n_sources && old->layers[s] == layers[s] &&
                j < old->n_pages[s]) {
                prev = &old->pages[old->base[s] + j];
            }
            if (prev != NULL && *prev != NULL &&
                memcmp(*prev, pages[k], KERN_KV_PAGE_HEADER_BYTES) == 0 &&
                memcmp(*prev, pages[k], h->page_bytes) == 0) {
                e->pages[k] = *prev; /* unchanged since the last turn: keep the copy */
                *prev = NULL;
                continue;
            }
            e->pages[k] = malloc(h->page_bytes);
            if (e->pages[k] == NULL) {
                entry_free(e);
                entry_free(old);
                return TDM_ERR_NO_MEMORY;
            }
            memcpy(e->pages[k], pages[k], h->page_bytes);
        }
    }
    entry_free(old);
    make_room(h, entry_bytes(h, e));
    push_front(h, e);
    return TDM_OK;
}

tdm_status_t prefill_history_keep_seq(prefill_history_t *h, const char *session_id,
                                      node_pages_t *pages_of, const engine_seq_t *seq)
{
    int32_t layers[NODE_MAX_SOURCES];
    uint32_t n_pages[NODE_MAX_SOURCES];
    const void **pages;
    uint32_t n_sources, n_all = 0, k = 0;
    tdm_status_t status = TDM_OK;

    if (h == NULL || pages_of == NULL || seq == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    if (h->max_bytes == 0) {
        return TDM_OK;
    }
    n_sources = (uint32_t)h->cfg->n_kv_source_layer_ids;
    if (n_sources > NODE_MAX_SOURCES) {
        return TDM_ERR_INVALID_ARG;
    }
    for (uint32_t s = 0; s < n_sources; s++) {
        const engine_kv_table_t *t = engine_seq_table(seq, (int)h->cfg->kv_source_layer_ids[s]);
        layers[s] = (int32_t)h->cfg->kv_source_layer_ids[s];
        n_pages[s] = t != NULL ? (uint32_t)kern_kv_page_count(t->n_rows) : 0;
        n_all += n_pages[s];
    }
    pages = malloc((size_t)(n_all + 1) * sizeof(void *));
    if (pages == NULL) {
        prefill_history_drop(h, session_id);
        return TDM_ERR_NO_MEMORY;
    }
    for (uint32_t s = 0; s < n_sources && status == TDM_OK; s++) {
        const engine_kv_table_t *t = engine_seq_table(seq, layers[s]);
        if (n_pages[s] > 0) {
            status = node_pages_download(pages_of, t->page_ids, n_pages[s]);
        }
        for (uint32_t j = 0; j < n_pages[s] && status == TDM_OK; j++) {
            pages[k++] = node_pages_host(pages_of, t->page_ids[j]);
        }
    }
    if (status == TDM_OK) {
        status = prefill_history_keep(h, session_id, n_sources, layers, n_pages,
                                      (const void *const *)pages);
    } else {
        prefill_history_drop(h, session_id);
    }
    free(pages);
    return status;
}

void prefill_history_stats(const prefill_history_t *h, prefill_history_stats_t *out)
{
    if (h == NULL) {
        memset(out, 0, sizeof(*out));
        return;
    }
    *out = h->stats;
}

uint32_t prefill_history_sessions(const prefill_history_t *h, uint64_t *keys_out, uint32_t max)
{
    uint32_t n = 0;

    for (const entry_t *e = h != NULL ? h->head : NULL; e != NULL && n < max; e = e->next) {
        keys_out[n++] = e->key;
    }
    return n;
}
