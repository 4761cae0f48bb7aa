/* seq_state.c - per-sequence rings, block tables, pending halves, ids; export/import of the
 * section-7 state record (engine/seq_state.h). */
#include "engine/seq_state.h"

#include "common/hash.h"
#include "common/log.h"
#include "engine/model_impl.h"
#include "engine/seq_state_impl.h"

#include <stdlib.h>
#include <string.h>

#define BLOB_FLAG_PAGES 1u

static int64_t ring_entry_bytes(const engine_seq_t *seq)
{
    return seq->d + seq->d / 32;
}

int engine_seq_source_slot(const engine_seq_t *seq, int layer)
{
    for (int s = 0; s < seq->n_sources; s++) {
        if (seq->source_layer[s] == layer) {
            return s;
        }
    }
    return -1;
}

uint8_t *engine_seq_ring_codes_at(engine_seq_t *seq, int r, int64_t p)
{
    return seq->ring_codes + ((int64_t)r * seq->C + p % seq->C) * seq->d;
}

uint8_t *engine_seq_ring_scales_at(engine_seq_t *seq, int r, int64_t p)
{
    return seq->ring_scales + ((int64_t)r * seq->C + p % seq->C) * (seq->d / 32);
}

int32_t engine_seq_id_at(const engine_seq_t *seq, int64_t p)
{
    return seq->ids[p % seq->n_ids_cap];
}

void engine_seq_set_id(engine_seq_t *seq, int64_t p, int32_t id)
{
    seq->ids[p % seq->n_ids_cap] = id;
}

/* The kernel table whose memory holds the rings, pending halves and keep buffers. */
static const kern_ops_t *seq_ops(const engine_seq_t *seq)
{
    return engine_model_ops(seq->model);
}

tdm_status_t engine_seq_copy_state(const engine_seq_t *seq, void *dst, const void *src,
                                   size_t n_bytes, kern_copy_kind_t kind)
{
    return seq_ops(seq)->mem_copy(NULL, dst, src, n_bytes, kind);
}

void engine_seq_clear_pending(engine_seq_t *seq, int s)
{
    const kern_ops_t *ops = seq_ops(seq);
    size_t n = (size_t)seq->d * sizeof(float);

    seq->has_pend[s] = 0;
    (void)ops->mem_set(NULL, seq->pend_a + (int64_t)s * seq->d, 0, n);
    (void)ops->mem_set(NULL, seq->pend_b + (int64_t)s * seq->d, 0, n);
}

tdm_status_t engine_seq_keep_pending(engine_seq_t *seq, int slot, int64_t p)
{
    int64_t k = (int64_t)slot * seq->n_keep + (p / 2) % seq->n_keep;
    size_t n = (size_t)seq->d * sizeof(float);
    tdm_status_t st = engine_seq_copy_state(seq, seq->keep_a + k * seq->d,
                                            seq->pend_a + (int64_t)slot * seq->d, n, KERN_COPY_D2D);
    if (st == TDM_OK) {
        st = engine_seq_copy_state(seq, seq->keep_b + k * seq->d,
                                   seq->pend_b + (int64_t)slot * seq->d, n, KERN_COPY_D2D);
    }
    if (st == TDM_OK) {
        seq->keep_pos[k] = p;
    }
    return st;
}

/* n_bytes of zeroed backend memory (the model's table), or NULL with the error in *st (left
 * alone on success; nothing is tried once *st holds an error). */
static void *seq_zalloc(const engine_seq_t *seq, size_t n_bytes, tdm_status_t *st)
{
    const kern_ops_t *ops = seq_ops(seq);
    void *mem = NULL;

    if (*st != TDM_OK) {
        return NULL;
    }
    *st = ops->mem_alloc(NULL, n_bytes, &mem);
    if (*st != TDM_OK) {
        return NULL;
    }
    *st = ops->mem_set(NULL, mem, 0, n_bytes);
    if (*st != TDM_OK) {
        ops->mem_free(NULL, mem);
        return NULL;
    }
    return mem;
}

/* An empty sequence without checks on the pool's fingerprint. */
static tdm_status_t seq_alloc(const engine_model_t *model, engine_kv_pool_t *pool,
                              engine_seq_t **seq_out)
{
    const engine_config_t *cfg = engine_model_config(model);
    engine_seq_t *seq = calloc(1, sizeof(*seq));

    if (seq == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    seq->model = model;
    seq->pool = pool;
    seq->n_rings = cfg->n_roles;
    seq->C = engine_config_ring_entries(cfg);
    seq->d = cfg->head_dim;
    seq->n_sources = cfg->n_kv_source_layer_ids;
    for (int s = 0; s < seq->n_sources; s++) {
        int layer = (int)cfg->kv_source_layer_ids[s];
        seq->source_layer[s] = layer;
        engine_kv_table_init(&seq->tables[s], layer, cfg->roles[layer].ratio);
    }
    seq->n_ids_cap =
        cfg->sliding_window + cfg->engram_max_ngram_size - 1 + cfg->dspark_block_size + 1;
    seq->n_keep = cfg->dspark_block_size / 2 + 2;
    /* rings, pending halves and keep buffers: the kernels' memory (zeroed); ids and keep_pos
     * are host metadata */
    {
        size_t pend = (size_t)(seq->n_sources * seq->d) * sizeof(float);
        size_t keep = (size_t)(seq->n_sources * seq->n_keep * seq->d) * sizeof(float);
        tdm_status_t st = TDM_OK;
        seq->ring_codes = seq_zalloc(seq, (size_t)(seq->n_rings * seq->C * seq->d), &st);
        seq->ring_scales = seq_zalloc(seq, (size_t)(seq->n_rings * seq->C * (seq->d / 32)), &st);
        seq->pend_a = seq_zalloc(seq, pend, &st);
        seq->pend_b = seq_zalloc(seq, pend, &st);
        seq->keep_a = seq_zalloc(seq, keep, &st);
        seq->keep_b = seq_zalloc(seq, keep, &st);
        seq->ids = calloc((size_t)seq->n_ids_cap, sizeof(int32_t));
        seq->keep_pos = malloc((size_t)(seq->n_sources * seq->n_keep + 1) * sizeof(int64_t));
        if (st == TDM_OK && (seq->ids == NULL || seq->keep_pos == NULL)) {
            st = TDM_ERR_NO_MEMORY;
        }
        if (st != TDM_OK) {
            engine_seq_destroy(seq);
            return st;
        }
    }
    for (int64_t k = 0; k < seq->n_sources * seq->n_keep; k++) {
        seq->keep_pos[k] = -1;
    }
    *seq_out = seq;
    return TDM_OK;
}

tdm_status_t engine_seq_create(const engine_model_t *model, engine_kv_pool_t *pool,
                               engine_seq_t **seq_out)
{
    if (model == NULL || pool == NULL || seq_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    if (engine_kv_pool_fingerprint(pool) != engine_model_fingerprint(model)) {
        return TDM_ERR_MISMATCH;
    }
    return seq_alloc(model, pool, seq_out);
}

void engine_seq_destroy(engine_seq_t *seq)
{
    if (seq == NULL) {
        return;
    }
    for (int s = 0; s < seq->n_sources; s++) {
        engine_kv_table_release(seq->pool, &seq->tables[s]);
    }
    {
        const kern_ops_t *ops = seq_ops(seq);
        ops->mem_free(NULL, seq->ring_codes);
        ops->mem_free(NULL, seq->ring_scales);
        ops->mem_free(NULL, seq->pend_a);
        ops->mem_free(NULL, seq->pend_b);
        ops->mem_free(NULL, seq->keep_a);
        ops->mem_free(NULL, seq->keep_b);
    }
    free(seq->ids);
    free(seq->keep_pos);
    free(seq);
}

int64_t engine_seq_length(const engine_seq_t *seq)
{
    return seq->length;
}

int64_t engine_seq_n_rows(const engine_seq_t *seq, int source_layer)
{
    int s = engine_seq_source_slot(seq, source_layer);
    return s < 0 ? -1 : seq->tables[s].n_rows;
}

uint32_t engine_seq_n_pages(const engine_seq_t *seq)
{
    uint32_t n = 0;
    for (int s = 0; s < seq->n_sources; s++) {
        n += seq->tables[s].n_pages;
    }
    return n;
}

const engine_kv_table_t *engine_seq_table(const engine_seq_t *seq, int source_layer)
{
    int s = engine_seq_source_slot(seq, source_layer);
    return s < 0 ? NULL : &seq->tables[s];
}

int64_t engine_seq_last_ids(const engine_seq_t *seq, int32_t *ids_out, int64_t n_ids_max)
{
    int64_t kept = seq->length < seq->n_ids_cap ? seq->length : seq->n_ids_cap;
    int64_t n = kept < n_ids_max ? kept : n_ids_max;
    for (int64_t i = 0; i < n; i++) {
        ids_out[i] = engine_seq_id_at(seq, seq->length - n + i);
    }
    return n;
}

tdm_status_t engine_seq_ring_entry(const engine_seq_t *seq, int ring, int64_t p,
                                   const uint8_t **codes_out, const uint8_t **scales_out)
{
    if (seq == NULL || ring < 0 || ring >= seq->n_rings || p < 0 || p >= seq->length ||
        p < seq->length - seq->C || codes_out == NULL || scales_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    *codes_out = engine_seq_ring_codes_at((engine_seq_t *)seq, ring, p);
    *scales_out = engine_seq_ring_scales_at((engine_seq_t *)seq, ring, p);
    return TDM_OK;
}

int64_t engine_seq_rollback_floor(const engine_seq_t *seq)
{
    int64_t floor = seq->length;
    const engine_config_t *cfg = engine_model_config(seq->model);
    int64_t B = cfg->dspark_block_size;
    /* ring entries and ids below length survive up to B + 1 newer positions (C = W + B + 1) */
    floor = floor - B - 1 > 0 ? floor - B - 1 : 0;
    return floor;
}

tdm_status_t engine_seq_rollback(engine_seq_t *seq, int64_t n)
{
    if (seq == NULL || n > seq->length || n < engine_seq_rollback_floor(seq)) {
        return TDM_ERR_INVALID_ARG;
    }
    /* check first: each ratio-2 source needs the half of token n - 1 when n is odd */
    for (int s = 0; s < seq->n_sources && n % 2 == 1 && n < seq->length; s++) {
        int64_t k = (int64_t)s * seq->n_keep + ((n - 1) / 2) % seq->n_keep;
        if (seq->tables[s].ratio == 2 && seq->keep_pos[k] != n - 1) {
            return TDM_ERR_INVALID_ARG;
        }
    }
    {
        uint32_t cow = 0; /* a shared page cut into is copied first (engine/kv_cache.h) */
        for (int s = 0; s < seq->n_sources; s++) {
            int64_t keep_rows = n / seq->tables[s].ratio;
            cow += engine_kv_table_truncate_pages_needed(
                seq->pool, &seq->tables[s],
                keep_rows < seq->tables[s].n_rows ? keep_rows : seq->tables[s].n_rows);
        }
        if (cow > engine_kv_pool_n_free(seq->pool)) {
            return TDM_ERR_NO_PAGES;
        }
    }
    if (n == seq->length) {
        for (int s = 0; s < seq->n_sources; s++) {
            /* give back pages reserved beyond the rows (a failed verify) */
            engine_kv_table_truncate(seq->pool, &seq->tables[s], seq->tables[s].n_rows);
        }
        return TDM_OK;
    }
    for (int s = 0; s < seq->n_sources; s++) {
        engine_kv_table_t *t = &seq->tables[s];
        int64_t keep_rows = n / t->ratio; /* n_c(n - 1): a group missing its second token goes */
        engine_kv_table_truncate(seq->pool, t, keep_rows < t->n_rows ? keep_rows : t->n_rows);
        if (t->ratio != 2) {
            continue;
        }
        if (n % 2 == 1) {
            int64_t k = (int64_t)s * seq->n_keep + ((n - 1) / 2) % seq->n_keep;
            size_t bytes = (size_t)seq->d * sizeof(float);
            tdm_status_t st = engine_seq_copy_state(seq, seq->pend_a + s * seq->d,
                                                    seq->keep_a + k * seq->d, bytes, KERN_COPY_D2D);
            if (st == TDM_OK) {
                st = engine_seq_copy_state(seq, seq->pend_b + s * seq->d, seq->keep_b + k * seq->d,
                                           bytes, KERN_COPY_D2D);
            }
            if (st != TDM_OK) {
                return st; /* a backend copy failed (logged by the backend) */
            }
            seq->has_pend[s] = 1;
        } else {
            seq->has_pend[s] = 0;
        }
    }
    /* ring entries (backbone and DSpark context) and ids at positions >= n are now invalid;
     * C = W + B + 1 guarantees none of the last W was overwritten, so nothing is copied */
    seq->length = n;
    return TDM_OK;
}

void engine_seq_reset_rings(engine_seq_t *seq)
{
    const kern_ops_t *ops = seq_ops(seq);
    /* a fill of memory the sequence owns: fails only on a broken device (logged there) */
    (void)ops->mem_set(NULL, seq->ring_codes, 0, (size_t)(seq->n_rings * seq->C * seq->d));
    (void)ops->mem_set(NULL, seq->ring_scales, 0, (size_t)(seq->n_rings * seq->C * (seq->d / 32)));
}

/* ---- blob ------------------------------------------------------------------------------- */

typedef struct {
    uint8_t *p;
    size_t used;
    size_t cap;
    tdm_status_t st; /* the first failed backend copy (TDM_OK: none) */
} writer_t;

static void put(writer_t *w, const void *src, size_t n)
{
    if (w->p != NULL && w->used + n <= w->cap) {
        memcpy(w->p + w->used, src, n);
    }
    w->used += n;
}

/* put of n bytes of the sequence's state buffers (backend memory: a D2H copy). */
static void put_state(writer_t *w, const engine_seq_t *seq, const void *src, size_t n)
{
    if (w->p != NULL && w->used + n <= w->cap && w->st == TDM_OK) {
        w->st = engine_seq_copy_state(seq, w->p + w->used, src, n, KERN_COPY_D2H);
    }
    w->used += n;
}

/* put of pool page `page_id` (a backend pool's page comes through a D2H copy). */
static void put_page(writer_t *w, const engine_kv_pool_t *pool, uint32_t page_id, size_t n)
{
    if (w->p != NULL && w->used + n <= w->cap && w->st == TDM_OK) {
        w->st = engine_kv_pool_read_page(pool, page_id, w->p + w->used);
    }
    w->used += n;
}

static void put_u32(writer_t *w, uint32_t v)
{
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put(w, b, 4);
}

static void put_u64(writer_t *w, uint64_t v)
{
    put_u32(w, (uint32_t)v);
    put_u32(w, (uint32_t)(v >> 32));
}

typedef struct {
    const uint8_t *p;
    size_t used;
    size_t n;
    int bad;
} reader_t;

static const uint8_t *get(reader_t *r, size_t n)
{
    const uint8_t *at;
    if (r->bad || r->used + n > r->n) {
        r->bad = 1;
        return NULL;
    }
    at = r->p + r->used;
    r->used += n;
    return at;
}

static uint32_t get_u32(reader_t *r)
{
    const uint8_t *b = get(r, 4);
    return b == NULL ? 0 : (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                               (uint32_t)b[3] << 24;
}

static uint64_t get_u64(reader_t *r)
{
    uint64_t lo = get_u32(r);
    return lo | (uint64_t)get_u32(r) << 32;
}

static int n_ids_stored(const engine_seq_t *seq)
{
    const engine_config_t *cfg = engine_model_config(seq->model);
    int64_t n = cfg->engram_max_ngram_size - 1;
    return (int)(seq->length < n ? seq->length : n);
}

/* Write (or measure, w->p NULL) the blob. */
static void write_blob(engine_seq_t *seq, uint32_t flags, writer_t *w)
{
    const engine_config_t *cfg = engine_model_config(seq->model);
    int64_t W = cfg->sliding_window;
    int64_t E = seq->length < W ? seq->length : W;
    int64_t eb = ring_entry_bytes(seq);
    int n_ids = n_ids_stored(seq);
    size_t page_bytes = engine_kv_pool_page_bytes(seq->pool);
    int n_ratio2 = 0;

    for (int s = 0; s < seq->n_sources; s++) {
        n_ratio2 += seq->tables[s].ratio == 2;
    }
    put(w, ENGINE_SEQ_BLOB_MAGIC, 4);
    put_u32(w, ENGINE_SEQ_BLOB_VERSION);
    put_u64(w, engine_model_fingerprint(seq->model));
    put_u64(w, (uint64_t)seq->length);
    put_u32(w, (uint32_t)seq->n_rings);
    put_u32(w, (uint32_t)E);
    put_u32(w, (uint32_t)eb);
    put_u32(w, (uint32_t)n_ratio2);
    put_u32(w, (uint32_t)seq->d);
    put_u32(w, (uint32_t)n_ids);
    put_u32(w, (uint32_t)seq->n_sources);
    put_u32(w, flags & BLOB_FLAG_PAGES);
    put_u64(w, (uint64_t)page_bytes);
    for (int r = 0; r < seq->n_rings; r++) {
        for (int64_t p = seq->length - E; p < seq->length; p++) {
            put_state(w, seq, engine_seq_ring_codes_at(seq, r, p), (size_t)seq->d);
            put_state(w, seq, engine_seq_ring_scales_at(seq, r, p), (size_t)(seq->d / 32));
        }
    }
    for (int s = 0; s < seq->n_sources; s++) {
        if (seq->tables[s].ratio != 2) {
            continue;
        }
        put_u32(w, (uint32_t)seq->has_pend[s]);
        if (seq->has_pend[s]) {
            put_state(w, seq, seq->pend_a + s * seq->d, (size_t)seq->d * sizeof(float));
            put_state(w, seq, seq->pend_b + s * seq->d, (size_t)seq->d * sizeof(float));
        } else {
            static const float zero = 0.0f; /* zeros when absent (format above) */
            for (int64_t i = 0; i < 2 * seq->d; i++) {
                put(w, &zero, sizeof(zero));
            }
        }
    }
    for (int i = 0; i < n_ids; i++) {
        put_u32(w, (uint32_t)engine_seq_id_at(seq, seq->length - n_ids + i));
    }
    if ((flags & BLOB_FLAG_PAGES) != 0) {
        for (int s = 0; s < seq->n_sources; s++) {
            engine_kv_table_t *t = &seq->tables[s];
            put_u64(w, (uint64_t)t->n_rows);
            put_u32(w, t->n_pages);
            for (uint32_t i = 0; i < t->n_pages; i++) {
                put_page(w, seq->pool, t->page_ids[i], page_bytes);
            }
        }
    }
}

size_t engine_seq_export_bytes(const engine_seq_t *seq, uint32_t flags)
{
    writer_t w = {NULL, 0, 0, TDM_OK};
    write_blob((engine_seq_t *)seq, flags, &w);
    return w.used + 8;
}

tdm_status_t engine_seq_export(engine_seq_t *seq, uint32_t flags, uint8_t *blob_out,
                               size_t blob_bytes, size_t *n_written_out)
{
    writer_t w;
    size_t need;
    uint64_t sum;

    if (seq == NULL || blob_out == NULL || n_written_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    need = engine_seq_export_bytes(seq, flags);
    if (blob_bytes < need) {
        return TDM_ERR_INVALID_ARG;
    }
    if ((flags & BLOB_FLAG_PAGES) != 0) {
        for (int s = 0; s < seq->n_sources; s++) {
            tdm_status_t st = engine_kv_table_seal(seq->pool, &seq->tables[s]);
            if (st != TDM_OK) {
                return st;
            }
        }
    }
    w.p = blob_out;
    w.used = 0;
    w.cap = blob_bytes;
    w.st = TDM_OK;
    write_blob(seq, flags, &w);
    if (w.st != TDM_OK) {
        return w.st;
    }
    sum = tdm_hash_xxh3_64(blob_out, w.used);
    put_u64(&w, sum);
    *n_written_out = w.used;
    return TDM_OK;
}

tdm_status_t engine_seq_import(const engine_model_t *model, engine_kv_pool_t *pool,
                               const uint8_t *blob, size_t blob_bytes, engine_seq_t **seq_out)
{
    const engine_config_t *cfg;
    engine_seq_t *seq = NULL;
    reader_t r;
    uint64_t fp;
    int64_t T;
    uint32_t n_rings, E, eb, n_ratio2, d, n_ids, n_sources, flags;
    uint64_t page_bytes;
    tdm_status_t st = TDM_ERR_FORMAT;

    if (model == NULL || pool == NULL || blob == NULL || seq_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    cfg = engine_model_config(model);
    if (blob_bytes < ENGINE_SEQ_BLOB_HEADER_BYTES + 8 || memcmp(blob, ENGINE_SEQ_BLOB_MAGIC, 4) != 0) {
        tdm_log(TDM_LOG_WARN, "engine", "state blob rejected: field=magic bytes=%zu", blob_bytes);
        return TDM_ERR_FORMAT;
    }
    {
        uint64_t stored = 0;
        for (int b = 7; b >= 0; b--) {
            stored = (stored << 8) | blob[blob_bytes - 8 + (size_t)b];
        }
        if (stored != tdm_hash_xxh3_64(blob, blob_bytes - 8)) {
            tdm_log(TDM_LOG_WARN, "engine", "state blob rejected: field=checksum");
            return TDM_ERR_FORMAT;
        }
    }
    r.p = blob;
    r.used = 4;
    r.n = blob_bytes - 8;
    r.bad = 0;
    if (get_u32(&r) != ENGINE_SEQ_BLOB_VERSION) {
        tdm_log(TDM_LOG_WARN, "engine", "state blob rejected: field=version");
        return TDM_ERR_FORMAT;
    }
    fp = get_u64(&r);
    T = (int64_t)get_u64(&r);
    n_rings = get_u32(&r);
    E = get_u32(&r);
    eb = get_u32(&r);
    n_ratio2 = get_u32(&r);
    d = get_u32(&r);
    n_ids = get_u32(&r);
    n_sources = get_u32(&r);
    flags = get_u32(&r);
    page_bytes = get_u64(&r);
    if (fp != engine_model_fingerprint(model) || d != (uint32_t)cfg->head_dim ||
        n_rings != (uint32_t)cfg->n_roles || n_sources != (uint32_t)cfg->n_kv_source_layer_ids ||
        eb != (uint32_t)(d + d / 32) || page_bytes != engine_kv_pool_page_bytes(pool)) {
        tdm_log(TDM_LOG_WARN, "engine", "state blob rejected: field=identity fingerprint=%016llx",
                (unsigned long long)fp);
        return TDM_ERR_MISMATCH;
    }
    /* n_ids is exactly min(N - 1, T): more than T would write ids before position 0 */
    if (T < 0 || E != (uint32_t)(T < cfg->sliding_window ? T : cfg->sliding_window) ||
        n_ids != (uint32_t)(T < cfg->engram_max_ngram_size - 1 ? T
                                                                : cfg->engram_max_ngram_size - 1) ||
        r.bad) {
        tdm_log(TDM_LOG_WARN, "engine", "state blob rejected: field=sizes");
        return TDM_ERR_FORMAT;
    }
    st = engine_seq_create(model, pool, &seq);
    if (st != TDM_OK) {
        return st;
    }
    seq->length = T;
    for (uint32_t ring = 0; ring < n_rings; ring++) {
        for (int64_t p = T - E; p < T; p++) {
            const uint8_t *c = get(&r, d);
            const uint8_t *s = get(&r, d / 32);
            if (c == NULL || s == NULL) {
                break;
            }
            if (engine_seq_copy_state(seq, engine_seq_ring_codes_at(seq, (int)ring, p), c, d,
                                      KERN_COPY_H2D) != TDM_OK ||
                engine_seq_copy_state(seq, engine_seq_ring_scales_at(seq, (int)ring, p), s, d / 32,
                                      KERN_COPY_H2D) != TDM_OK) {
                r.bad = 1; /* a backend copy failed (logged there) */
                break;
            }
        }
    }
    {
        uint32_t seen = 0;
        for (int s = 0; s < seq->n_sources; s++) {
            if (seq->tables[s].ratio != 2) {
                continue;
            }
            seen++;
            seq->has_pend[s] = get_u32(&r) != 0;
            const uint8_t *a = get(&r, (size_t)d * sizeof(float));
            const uint8_t *b = get(&r, (size_t)d * sizeof(float));
            if (a != NULL && b != NULL &&
                (engine_seq_copy_state(seq, seq->pend_a + s * seq->d, a, (size_t)d * sizeof(float),
                                       KERN_COPY_H2D) != TDM_OK ||
                 engine_seq_copy_state(seq, seq->pend_b + s * seq->d, b, (size_t)d * sizeof(float),
                                       KERN_COPY_H2D) != TDM_OK)) {
                r.bad = 1; /* a backend copy failed (logged there) */
            }
        }
        if (seen != n_ratio2) {
            r.bad = 1;
        }
    }
    for (uint32_t i = 0; i < n_ids; i++) {
        engine_seq_set_id(seq, T - n_ids + i, (int32_t)get_u32(&r));
    }
    if (r.bad) {
        st = TDM_ERR_FORMAT;
        goto err_destroy;
    }
    if ((flags & BLOB_FLAG_PAGES) == 0) {
        for (int s = 0; s < seq->n_sources; s++) {
            if (engine_config_n_c(cfg, seq->source_layer[s], T - 1) > 0) {
                st = TDM_ERR_UNSUPPORTED;
                goto err_destroy;
            }
        }
    } else {
        for (int s = 0; s < seq->n_sources && st == TDM_OK; s++) {
            engine_kv_table_t *t = &seq->tables[s];
            int64_t n_rows = (int64_t)get_u64(&r);
            uint32_t n_pages = get_u32(&r);
            if (r.bad || n_rows != engine_config_n_c(cfg, t->source_layer, T - 1) ||
                n_pages != (uint32_t)kern_kv_page_count(n_rows)) {
                st = TDM_ERR_FORMAT;
                break;
            }
            st = engine_kv_table_reserve(pool, t, n_rows);
            for (uint32_t i = 0; i < n_pages && st == TDM_OK; i++) {
                const uint8_t *src = get(&r, (size_t)page_bytes);
                kern_kv_page_params_t want = {
                    .source_layer = (uint16_t)t->source_layer,
                    .first_row = (uint64_t)i * KERN_KV_PAGE_ROWS,
                    .ratio = (uint8_t)t->ratio,
                    .d = (uint16_t)cfg->head_dim,
                    .d_I = (uint16_t)cfg->index_head_dim,
                    .fingerprint = engine_model_fingerprint(model),
                };
                if (src == NULL) {
                    st = TDM_ERR_FORMAT;
                    break;
                }
                st = kern_kv_page_check(src, (size_t)page_bytes, &want,
                                        KERN_KV_PAGE_CHECK_CHECKSUM);
                if (st == TDM_OK) {
                    st = engine_kv_pool_write_page(pool, t->page_ids[i], src);
                }
            }
            t->n_rows = n_rows;
        }
        if (st != TDM_OK) {
            goto err_destroy;
        }
    }
    *seq_out = seq;
    return TDM_OK;

err_destroy:
    engine_seq_destroy(seq);
    return st;
}

/* ---- a record blob plus pages ------------------------------------------------------------ */

/* Byte offset of the u32 flags in the 64-byte header (format in seq_state.h). */
#define BLOB_FLAGS_OFFSET 52u

tdm_status_t engine_seq_blob_add_pages(const uint8_t *record, size_t n_record, uint32_t n_sources,
                                       const int64_t *n_rows, const uint32_t *n_pages,
                                       const void *const *pages, size_t page_bytes,
                                       uint8_t **blob_out, size_t *n_blob_out)
{
    reader_t r = {record, 4, n_record, 0};
    size_t body = n_record - 8;
    size_t total = body + 8;
    size_t k = 0;
    uint8_t *blob;
    writer_t w;

    if (record == NULL || n_record < ENGINE_SEQ_BLOB_HEADER_BYTES + 8 ||
        memcmp(record, ENGINE_SEQ_BLOB_MAGIC, 4) != 0 || get_u32(&r) != ENGINE_SEQ_BLOB_VERSION) {
        return TDM_ERR_FORMAT;
    }
    for (uint32_t s = 0; s < n_sources; s++) {
        total += 12 + (size_t)n_pages[s] * page_bytes;
    }
    blob = malloc(total);
    if (blob == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    w.p = blob;
    w.used = 0;
    w.cap = total;
    put(&w, record, body);
    w.used = BLOB_FLAGS_OFFSET;
    put_u32(&w, BLOB_FLAG_PAGES);
    w.used = body;
    for (uint32_t s = 0; s < n_sources; s++) {
        put_u64(&w, (uint64_t)n_rows[s]);
        put_u32(&w, n_pages[s]);
        for (uint32_t i = 0; i < n_pages[s]; i++) {
            put(&w, pages[k++], page_bytes);
        }
    }
    put_u64(&w, tdm_hash_xxh3_64(blob, w.used));
    *blob_out = blob;
    *n_blob_out = w.used;
    return TDM_OK;
}
