/* config_sizes.c - sizes that follow from a config alone: published rows, KV record and ring
 * entry bytes, Engram primes (MODEL.md 5.3, 5.6 and 7; see config.h). */
#include "engine/config_impl.h"

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
