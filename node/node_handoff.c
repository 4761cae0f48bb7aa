/* node_handoff.c - reservation descriptors and sequence blobs (node_handoff.h). */
#include "node/node_handoff.h"

#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "common/hash.h"
#include "engine/seq_state.h"

#define RESV_MAGIC              "TDRV"
#define RESV_VERSION            2u
#define RESV_VERSION_NO_DIGESTS 1u
#define RESV_VERSION_STAGED     3u /* the record at H in staged pages (issue 18 item 4) */
#define RESV_MAX_PAGES          (1u << 24)

static void write_desc(const node_resv_desc_t *d, tdm_bytes_writer_t *w)
{
    tdm_bytes_put(w, RESV_MAGIC, 4);
    tdm_bytes_put_u32(w, d->n_stage > 0 ? RESV_VERSION_STAGED : RESV_VERSION);
    tdm_bytes_put_u64(w, d->reservation_id);
    tdm_bytes_put_u64(w, d->cached_len);
    tdm_bytes_put_u64(w, d->total_len);
    tdm_bytes_put_u32(w, d->n_sources);
    for (uint32_t s = 0; s < d->n_sources; s++) {
        const node_resv_source_t *src = &d->src[s];
        tdm_bytes_put_u32(w, (uint32_t)src->layer);
        tdm_bytes_put_u32(w, src->n_history);
        tdm_bytes_put_u32(w, src->first_target);
        tdm_bytes_put_u32(w, src->n_targets);
        for (uint32_t i = 0; i < src->n_history; i++) {
            tdm_bytes_put_u32(w, src->history[i]);
        }
        for (uint32_t i = 0; i < src->n_history; i++) {
            tdm_bytes_put_u64(w, src->history_digests != NULL ? src->history_digests[i] : 0);
        }
        for (uint32_t i = 0; i < src->n_targets; i++) {
            tdm_bytes_put_u32(w, src->targets[i]);
        }
    }
    tdm_bytes_put_u64(w, d->n_record);
    if (d->n_stage > 0) { /* version 3: the record lies in the decode node's staged pages */
        tdm_bytes_put_u64(w, d->record_checksum);
        tdm_bytes_put_u32(w, d->n_stage);
        for (uint32_t i = 0; i < d->n_stage; i++) {
            tdm_bytes_put_u32(w, d->stage[i]);
        }
        return;
    }
    tdm_bytes_put(w, d->record, d->n_record);
}

tdm_status_t node_resv_desc_encode(const node_resv_desc_t *desc, uint8_t **buf_out,
                                   size_t *n_bytes_out)
{
    tdm_bytes_writer_t w = {NULL, 0, 0};
    uint8_t *buf;
    uint64_t sum;

    if (desc == NULL || buf_out == NULL || n_bytes_out == NULL ||
        desc->n_sources > NODE_MAX_SOURCES) {
        return TDM_ERR_INVALID_ARG;
    }
    write_desc(desc, &w);
    buf = malloc(w.used + 8);
    if (buf == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    w.p = buf;
    w.cap = w.used + 8;
    w.used = 0;
    write_desc(desc, &w);
    sum = tdm_hash_xxh3_64(buf, w.used);
    tdm_bytes_put_u64(&w, sum);
    *buf_out = buf;
    *n_bytes_out = w.used;
    return TDM_OK;
}

uint64_t node_page_digest(const void *page)
{
    uint64_t h = tdm_hash_xxh3_64(page, NODE_PAGE_DIGEST_BYTES);

    return h != 0 ? h : 1;
}

/* n digests into a malloc'ed *out; NULL when every one is 0 (none known). */
static tdm_status_t read_digests(tdm_bytes_reader_t *r, uint32_t n, uint64_t **out)
{
    uint64_t *d;
    int any = 0;

    *out = NULL;
    if ((size_t)n * 8 > r->n - r->at) {
        r->bad = 1;
        return TDM_ERR_FORMAT;
    }
    d = malloc((size_t)(n > 0 ? n : 1) * sizeof(uint64_t));
    if (d == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    for (uint32_t i = 0; i < n; i++) {
        d[i] = tdm_bytes_get_u64(r);
        any |= d[i] != 0;
    }
    if (!any) {
        free(d);
        d = NULL;
    }
    *out = d;
    return TDM_OK;
}

static tdm_status_t read_ids(tdm_bytes_reader_t *r, uint32_t n, uint32_t **ids_out)
{
    uint32_t *ids;

    if (n > RESV_MAX_PAGES || (size_t)n * 4 > r->n - r->at) {
        r->bad = 1;
        return TDM_ERR_FORMAT;
    }
    ids = malloc((size_t)(n > 0 ? n : 1) * sizeof(uint32_t));
    if (ids == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    for (uint32_t i = 0; i < n; i++) {
        ids[i] = tdm_bytes_get_u32(r);
    }
    *ids_out = ids;
    return TDM_OK;
}

tdm_status_t node_resv_desc_parse(const uint8_t *bytes, size_t n_bytes, node_resv_desc_t *desc_out)
{
    tdm_bytes_reader_t r = {bytes, n_bytes, 0, 0};
    node_resv_desc_t d;
    const uint8_t *magic;
    const uint8_t *rec;
    tdm_status_t status = TDM_OK;
    uint64_t n_record;
    uint32_t version;

    memset(&d, 0, sizeof(d));
    memset(desc_out, 0, sizeof(*desc_out));
    if (bytes == NULL || n_bytes < 8) {
        return TDM_ERR_FORMAT;
    }
    {
        tdm_bytes_reader_t t = {bytes + n_bytes - 8, 8, 0, 0};
        if (tdm_bytes_get_u64(&t) != tdm_hash_xxh3_64(bytes, n_bytes - 8)) {
            return TDM_ERR_FORMAT;
        }
        r.n = n_bytes - 8;
    }
    magic = tdm_bytes_get(&r, 4);
    version = tdm_bytes_get_u32(&r);
    if (magic == NULL || memcmp(magic, RESV_MAGIC, 4) != 0 ||
        (version != RESV_VERSION && version != RESV_VERSION_NO_DIGESTS &&
         version != RESV_VERSION_STAGED)) {
        return TDM_ERR_FORMAT;
    }
    d.reservation_id = tdm_bytes_get_u64(&r);
    d.cached_len = tdm_bytes_get_u64(&r);
    d.total_len = tdm_bytes_get_u64(&r);
    d.n_sources = tdm_bytes_get_u32(&r);
    if (r.bad || d.n_sources > NODE_MAX_SOURCES || d.cached_len >= d.total_len) {
        return TDM_ERR_FORMAT;
    }
    for (uint32_t s = 0; s < d.n_sources && status == TDM_OK; s++) {
        node_resv_source_t *src = &d.src[s];
        src->layer = (int32_t)tdm_bytes_get_u32(&r);
        src->n_history = tdm_bytes_get_u32(&r);
        src->first_target = tdm_bytes_get_u32(&r);
        src->n_targets = tdm_bytes_get_u32(&r);
        status = r.bad ? TDM_ERR_FORMAT : read_ids(&r, src->n_history, &src->history);
        if (status == TDM_OK && version != RESV_VERSION_NO_DIGESTS) {
            status = read_digests(&r, src->n_history, &src->history_digests);
        }
        if (status == TDM_OK) {
            status = read_ids(&r, src->n_targets, &src->targets);
        }
    }
    n_record = tdm_bytes_get_u64(&r);
    if (status == TDM_OK && version == RESV_VERSION_STAGED) {
        d.record_checksum = tdm_bytes_get_u64(&r);
        d.n_stage = tdm_bytes_get_u32(&r);
        status = r.bad || d.n_stage == 0 || n_record == 0 ? TDM_ERR_FORMAT
                                                          : read_ids(&r, d.n_stage, &d.stage);
        d.n_record = (size_t)n_record; /* the bytes the staged pages hold; d.record stays NULL */
        n_record = 0;
    }
    rec = status == TDM_OK ? tdm_bytes_get(&r, (size_t)n_record) : NULL;
    if (status == TDM_OK && (r.bad || r.at != r.n)) {
        status = TDM_ERR_FORMAT;
    }
    if (status == TDM_OK && n_record > 0) {
        d.record = malloc((size_t)n_record);
        if (d.record == NULL) {
            status = TDM_ERR_NO_MEMORY;
        } else {
            memcpy(d.record, rec, (size_t)n_record);
            d.n_record = (size_t)n_record;
        }
    }
    if (status != TDM_OK) {
        node_resv_desc_fini(&d);
        return status;
    }
    *desc_out = d;
    return TDM_OK;
}

void node_resv_desc_fini(node_resv_desc_t *desc)
{
    if (desc == NULL) {
        return;
    }
    for (uint32_t s = 0; s < desc->n_sources && s < NODE_MAX_SOURCES; s++) {
        free(desc->src[s].history);
        free(desc->src[s].history_digests);
        free(desc->src[s].targets);
    }
    free(desc->record);
    free(desc->stage);
    memset(desc, 0, sizeof(*desc));
}

tdm_status_t node_blob_with_pages(const uint8_t *record, size_t n_record, uint32_t n_sources,
                                  const int64_t *n_rows, const uint32_t *n_pages,
                                  const void *const *pages, size_t page_bytes, uint8_t **blob_out,
                                  size_t *n_blob_out)
{
    return engine_seq_blob_add_pages(record, n_record, n_sources, n_rows, n_pages, pages,
                                     page_bytes, blob_out, n_blob_out);
}
