/* config_sizes.c - sizes that follow from a config alone: published rows, KV record and ring
 * entry bytes, Engram primes (MODEL.md 5.3, 5.6 and 7; see config.h). */
#include "engine/config_impl.h"

#include <stdio.h>

#include "common/hash.h"

#define KV_LAYOUT_PAGE_ROWS 64 /* KERN_KV_PAGE_ROWS; the config library does not link kernels */

int64_t engine_config_n_c(const engine_config_t *cfg, int layer, int64_t t)
{
    int ratio;

    if (layer < 0 || layer >= cfg->n_roles || t < 0) {
        return 0;
    }
    ratio = cfg->roles[layer].ratio;
    if (ratio == 0 || (cfg->roles[layer].flags & ENGINE_ROLE_DSPARK) != 0) {
        return 0;
    }
    return (t + 1) / ratio;
}

int64_t engine_config_kv_row_bytes(const engine_config_t *cfg)
{
    /* main: d/2 E2M1 bytes + d/16 E4M3 scales; index key: d_I/2 E2M1 + d_I/32 UE8M0 */
    return cfg->head_dim / 2 + cfg->head_dim / 16 + cfg->index_head_dim / 2 +
           cfg->index_head_dim / ENGINE_CONFIG_QUANT_BLOCK;
}

uint32_t engine_config_max_kv_ratio(const engine_config_t *cfg)
{
    uint32_t max_ratio = 1;

    for (int i = 0; i < cfg->n_kv_source_layer_ids; i++) {
        int ratio = cfg->roles[cfg->kv_source_layer_ids[i]].ratio;
        if (ratio > (int)max_ratio) {
            max_ratio = (uint32_t)ratio;
        }
    }
    return max_ratio;
}

double engine_config_kv_rows_per_token(const engine_config_t *cfg)
{
    double rows = 0.0;

    for (int i = 0; i < cfg->n_kv_source_layer_ids; i++) {
        int ratio = cfg->roles[cfg->kv_source_layer_ids[i]].ratio;
        if (ratio > 0) {
            rows += 1.0 / (double)ratio;
        }
    }
    return rows;
}

double engine_config_kv_bytes_per_token(const engine_config_t *cfg)
{
    return (double)engine_config_kv_row_bytes(cfg) * engine_config_kv_rows_per_token(cfg);
}

int64_t engine_config_kv_bytes(const engine_config_t *cfg, int64_t n_tokens)
{
    int64_t rows = 0;

    if (n_tokens <= 0) {
        return 0;
    }
    for (int i = 0; i < cfg->n_kv_source_layer_ids; i++) {
        rows += engine_config_n_c(cfg, (int)cfg->kv_source_layer_ids[i], n_tokens - 1);
    }
    return rows * engine_config_kv_row_bytes(cfg);
}

int64_t engine_config_ring_entry_bytes(const engine_config_t *cfg)
{
    /* d E4M3 codes + d/32 UE8M0 scales (Q_swa) */
    return cfg->head_dim + cfg->head_dim / ENGINE_CONFIG_QUANT_BLOCK;
}

int64_t engine_config_ring_entries(const engine_config_t *cfg)
{
    return cfg->sliding_window + cfg->dspark_block_size + 1;
}

const char *engine_config_layer_kind_name(engine_layer_kind_t kind)
{
    switch (kind) {
    case ENGINE_LAYER_SWA:
        return "swa";
    case ENGINE_LAYER_FULL:
        return "full";
    case ENGINE_LAYER_REINDEX:
        return "reindex";
    case ENGINE_LAYER_REUSE:
        return "reuse";
    }
    return "?";
}

static int is_prime(int64_t n)
{
    if (n < 2) {
        return 0;
    }
    if (n < 4) {
        return 1;
    }
    if (n % 2 == 0 || n % 3 == 0) {
        return 0;
    }
    for (int64_t i = 5; i <= n / i; i += 6) {
        if (n % i == 0 || n % (i + 2) == 0) {
            return 0;
        }
    }
    return 1;
}

int64_t engine_engram_prime_after(int64_t x)
{
    int64_t n = x < 1 ? 2 : x + 1;

    while (!is_prime(n)) {
        n++;
    }
    return n;
}

void engine_config_kv_layout(const engine_config_t *cfg, char *out, size_t out_bytes)
{
    int64_t map[2 * ENGINE_CONFIG_MAX_LAYERS + ENGINE_CONFIG_MAX_LAYERS];
    size_t n = 0;

    for (int i = 0; i < cfg->n_kv_source_layer_ids; i++) {
        int64_t layer = cfg->kv_source_layer_ids[i];
        map[n++] = layer;
        map[n++] = layer >= 0 && layer < cfg->n_roles ? cfg->roles[layer].ratio : -1;
    }
    for (int i = 0; i < cfg->n_index_source_layer_ids; i++) {
        map[n++] = -2 - cfg->index_source_layer_ids[i]; /* apart from the (layer, ratio) pairs */
    }
    snprintf(out, out_bytes, "tandem-kv1:src=%d,idx=%d,rows=%d,row=%lld,map=%016llx",
             cfg->n_kv_source_layer_ids, cfg->n_index_source_layer_ids, KV_LAYOUT_PAGE_ROWS,
             (long long)engine_config_kv_row_bytes(cfg),
             (unsigned long long)tdm_hash_xxh3_64(map, n * sizeof(map[0])));
}

/* Pages the KV sources of a t-token sequence take. */
static uint64_t pages_for_tokens(const engine_config_t *cfg, uint64_t t)
{
    uint64_t pages = 0;

    for (int i = 0; i < cfg->n_kv_source_layer_ids; i++) {
        int64_t rows = engine_config_n_c(cfg, (int)cfg->kv_source_layer_ids[i], (int64_t)t - 1);
        pages += (uint64_t)((rows + KV_LAYOUT_PAGE_ROWS - 1) / KV_LAYOUT_PAGE_ROWS);
    }
    return pages;
}

uint64_t engine_config_max_tokens_in_pages(const engine_config_t *cfg, uint64_t n_pages,
                                           uint64_t limit)
{
    uint64_t lo = 0; /* fits */
    uint64_t hi = limit;

    if (pages_for_tokens(cfg, limit) <= n_pages) {
        return limit;
    }
    /* pages_for_tokens grows with t: the largest fitting t is in [lo, hi) */
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (pages_for_tokens(cfg, mid) <= n_pages) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return lo;
}
