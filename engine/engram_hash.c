/* engram_hash.c - Engram primes, offsets, multipliers, token map, hashed rows and sidecar checks
 * (see engram_hash.h). The sidecar file reader is engram_sidecar.c. */
#include "engine/engram_hash.h"

#include "common/hash.h"
#include "engine/np_random.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int64_t engine_engram_mult_bound(int64_t compressed_vocab_size)
{
    int64_t bound;

    if (compressed_vocab_size < 1) {
        return 1;
    }
    bound = (INT64_MAX / compressed_vocab_size) / 2;
    return bound < 1 ? 1 : bound;
}

tdm_status_t engine_engram_layout_init(const engine_config_t *cfg,
                                       engine_engram_layout_t *layout_out)
{
    int n_layers;
    int ngram;
    int n_heads;
    int64_t prime;

    if (cfg == NULL || layout_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    n_layers = cfg->n_engram_layer_ids;
    ngram = (int)cfg->engram_max_ngram_size;
    n_heads = (int)cfg->engram_n_heads;
    if (n_layers < 0 || n_layers > ENGINE_CONFIG_MAX_ENGRAM_LAYERS || ngram < 2 ||
        ngram > ENGINE_CONFIG_MAX_NGRAM || n_heads < 1 ||
        n_heads > ENGINE_CONFIG_MAX_ENGRAM_HEADS) {
        return TDM_ERR_INVALID_ARG;
    }
    memset(layout_out, 0, sizeof(*layout_out));
    layout_out->n_layers = n_layers;
    layout_out->ngram = ngram;
    layout_out->n_heads = n_heads;
    layout_out->n_cols = (ngram - 1) * n_heads;
    layout_out->mult_bound = engine_engram_mult_bound(cfg->engram_compressed_vocab_size);
    prime = cfg->engram_vocab_size - 1;
    for (int slot = 0; slot < n_layers; slot++) {
        int64_t offset = 0;

        for (int col = 0; col < layout_out->n_cols; col++) {
            prime = engine_engram_prime_after(prime);
            layout_out->primes[slot][col] = prime;
            layout_out->offsets[slot][col] = offset;
            offset += prime;
        }
        layout_out->n_rows[slot] = offset;
    }
    return TDM_OK;
}

int64_t engine_engram_random_vocab(int64_t n_vocab)
{
    if (n_vocab <= ENGINE_ENGRAM_RANDOM_KEEP_IDS) {
        return n_vocab;
    }
    return ENGINE_ENGRAM_RANDOM_KEEP_IDS + (n_vocab - ENGINE_ENGRAM_RANDOM_KEEP_IDS + 1) / 2;
}

void engine_engram_random_token_map(int64_t n_vocab, int32_t *token_map_out)
{
    for (int64_t i = 0; i < n_vocab; i++) {
        if (i < ENGINE_ENGRAM_RANDOM_KEEP_IDS) {
            token_map_out[i] = (int32_t)i;
        } else {
            token_map_out[i] =
                (int32_t)(ENGINE_ENGRAM_RANDOM_KEEP_IDS + (i - ENGINE_ENGRAM_RANDOM_KEEP_IDS) / 2);
        }
    }
}

void engine_engram_random_multipliers(const engine_config_t *cfg, int64_t *mult_out)
{
    uint64_t bound = (uint64_t)engine_engram_mult_bound(cfg->engram_compressed_vocab_size);
    int64_t ngram = cfg->engram_max_ngram_size;

    for (int slot = 0; slot < cfg->n_engram_layer_ids; slot++) {
        uint64_t layer = (uint64_t)cfg->engram_layer_ids[slot];

        for (int64_t s = 0; s < ngram; s++) {
            uint64_t x = tdm_hash_splitmix64(ENGINE_ENGRAM_SEED_STRIDE * layer + (uint64_t)s);
            mult_out[slot * ngram + s] = (int64_t)(2 * (x % bound) + 1);
        }
    }
}

void engine_engram_release_multipliers(const engine_config_t *cfg, int64_t *mult_out)
{
    int64_t bound = engine_engram_mult_bound(cfg->engram_compressed_vocab_size);
    int64_t ngram = cfg->engram_max_ngram_size;

    for (int slot = 0; slot < cfg->n_engram_layer_ids; slot++) {
        uint64_t layer = (uint64_t)cfg->engram_layer_ids[slot];
        int64_t *row = mult_out + slot * ngram;
        engine_np_rng_t rng;

        engine_np_rng_seed(ENGINE_ENGRAM_SEED_STRIDE * layer, &rng);
        /* bound >= 1 > 0 = low, so the draw cannot fail */
        (void)engine_np_rng_integers_i64(&rng, 0, bound, (size_t)ngram, row);
        for (int64_t s = 0; s < ngram; s++) {
            row[s] = row[s] * 2 + 1;
        }
    }
}

void engine_engram_window_ids(const engine_config_t *cfg, const int32_t *token_map,
                              const int32_t *tokens, int64_t p, int64_t *ids_out)
{
    int64_t pad = token_map[cfg->engram_pad_token_id];

    for (int64_t s = 0; s < cfg->engram_max_ngram_size; s++) {
        /* Only p - s < 0 blocks in text-only serving; once blocked, longer shifts are too. */
        ids_out[s] = p - s < 0 ? pad : token_map[tokens[p - s]];
    }
}

void engine_engram_hash_rows(const engine_engram_layout_t *layout, int slot,
                             const int64_t *multipliers, const int64_t *ids, int64_t *rows_out)
{
    /* Unsigned arithmetic: identical to the int64 formula for in-range ids (no overflow, 9.2),
     * and defined behaviour for anything else. */
    uint64_t h = (uint64_t)ids[0] * (uint64_t)multipliers[0];

    for (int s = 1; s < layout->ngram; s++) {
        h ^= (uint64_t)ids[s] * (uint64_t)multipliers[s];
        for (int k = 0; k < layout->n_heads; k++) {
            int col = (s - 1) * layout->n_heads + k;
            uint64_t prime = (uint64_t)layout->primes[slot][col];
            rows_out[col] = (int64_t)(h % prime) + layout->offsets[slot][col];
        }
    }
}

static tdm_status_t sidecar_fail(char *err, size_t err_bytes, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static tdm_status_t sidecar_fail(char *err, size_t err_bytes, const char *fmt, ...)
{
    char reason[256];
    va_list args;

    va_start(args, fmt);
    vsnprintf(reason, sizeof(reason), fmt, args);
    va_end(args);
    if (err != NULL && err_bytes > 0) {
        snprintf(err, err_bytes, "engram sidecar: %s", reason);
    }
    return TDM_ERR_MISMATCH;
}

/* primes or offsets [n_layers, n_cols] against the layout's table. */
static tdm_status_t check_table(const engine_engram_layout_t *layout, const char *name,
                                const int64_t *values, int64_t (*expected)[ENGINE_ENGRAM_MAX_COLS],
                                char *err, size_t err_bytes)
{
    for (int slot = 0; slot < layout->n_layers; slot++) {
        for (int col = 0; col < layout->n_cols; col++) {
            int64_t got = values[slot * layout->n_cols + col];
            if (got != expected[slot][col]) {
                return sidecar_fail(err, err_bytes, "%s[%d][%d]: %lld but the config gives %lld",
                                    name, slot, col, (long long)got,
                                    (long long)expected[slot][col]);
            }
        }
    }
    return TDM_OK;
}

tdm_status_t engine_engram_sidecar_check(const engine_config_t *cfg, const int32_t *token_map,
                                         int64_t n_vocab, const int64_t *multipliers,
                                         const int64_t *primes, const int64_t *offsets, char *err,
                                         size_t err_bytes)
{
    engine_engram_layout_t layout;
    int64_t compressed_vocab;
    int64_t max_mult;
    tdm_status_t status;

    if (cfg == NULL || token_map == NULL || multipliers == NULL || primes == NULL ||
        offsets == NULL) {
        if (err != NULL && err_bytes > 0) {
            snprintf(err, err_bytes, "engram sidecar: missing array");
        }
        return TDM_ERR_INVALID_ARG;
    }
    status = engine_engram_layout_init(cfg, &layout);
    if (status != TDM_OK) {
        if (err != NULL && err_bytes > 0) {
            snprintf(err, err_bytes, "engram sidecar: config exceeds the Engram limits");
        }
        return status;
    }
    compressed_vocab = cfg->engram_compressed_vocab_size;
    if (n_vocab != cfg->vocab_size) {
        return sidecar_fail(err, err_bytes, "token_map: %lld entries, vocab_size is %lld",
                            (long long)n_vocab, (long long)cfg->vocab_size);
    }
    for (int64_t i = 0; i < n_vocab; i++) {
        if (token_map[i] < 0 || token_map[i] >= compressed_vocab) {
            return sidecar_fail(err, err_bytes,
                                "token_map[%lld]: %d not in [0, %lld) (compressed vocab V_c)",
                                (long long)i, token_map[i], (long long)compressed_vocab);
        }
    }
    max_mult = 2 * layout.mult_bound - 1;
    for (int slot = 0; slot < layout.n_layers; slot++) {
        for (int s = 0; s < layout.ngram; s++) {
            int64_t mu = multipliers[slot * layout.ngram + s];
            if (mu < 1 || mu > max_mult) {
                return sidecar_fail(err, err_bytes,
                                    "multipliers[%d][%d]: %lld not in [1, 2*b_mu-1 = %lld]", slot,
                                    s, (long long)mu, (long long)max_mult);
            }
            if (mu % 2 == 0) {
                return sidecar_fail(err, err_bytes, "multipliers[%d][%d]: %lld is even", slot, s,
                                    (long long)mu);
            }
        }
    }
    status = check_table(&layout, "primes", primes, layout.primes, err, err_bytes);
    if (status != TDM_OK) {
        return status;
    }
    return check_table(&layout, "offsets", offsets, layout.offsets, err, err_bytes);
}

void engine_engram_sidecar_fini(engine_engram_sidecar_t *sidecar)
{
    if (sidecar == NULL) {
        return;
    }
    free(sidecar->token_map);
    free(sidecar->multipliers);
    free(sidecar->primes);
    free(sidecar->offsets);
    memset(sidecar, 0, sizeof(*sidecar));
}
