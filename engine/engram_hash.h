/* engram_hash.h - the Engram n-gram hash: primes, offsets, multipliers, token map, table rows.
 *
 * Computes what MODEL.md 5.6 and 9.2 derive from the config: each Engram layer's table primes and
 * offsets, the multiplier bound b_mu, the multipliers and token map of random checkpoints, the
 * hashed table rows of one position, and the checks a checkpoint's engram-hash.safetensors sidecar
 * must pass. Owns only the arrays of a loaded sidecar (engine_engram_sidecar_t). Knows nothing of
 * the tables' contents, the gate math or the tokenizer. The primes come from
 * engine_engram_prime_after (engine/config.h; the config check needs them too).
 */
#ifndef TANDEM_ENGINE_ENGRAM_HASH_H
#define TANDEM_ENGINE_ENGRAM_HASH_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "engine/config.h"

/* Most hash columns (N-1)*h_e one Engram layer may have. */
#define ENGINE_ENGRAM_MAX_COLS ((ENGINE_CONFIG_MAX_NGRAM - 1) * ENGINE_CONFIG_MAX_ENGRAM_HEADS)

/* Ids below this map to themselves in a random checkpoint's token map (MODEL.md 9.2). */
#define ENGINE_ENGRAM_RANDOM_KEEP_IDS 16

/* Multiplier seed stride per layer id: a layer's stream starts at 10007 * layer (MODEL.md 9.2). */
#define ENGINE_ENGRAM_SEED_STRIDE 10007

/* File name of the sidecar next to a checkpoint (MODEL.md 9.2). */
#define ENGINE_ENGRAM_SIDECAR_FILE "engram-hash.safetensors"

/*
 * The hash tables' layout of every Engram layer, computed from the config.
 *
 * n_layers:  entries of engram_layer_ids; slot i is layer engram_layer_ids[i].
 * ngram:     N; hashes use ids v_0..v_{N-1}.
 * n_heads:   h_e.
 * n_cols:    (N-1)*h_e; column col = (s-1)*h_e + k for n-gram size s+1 and head k.
 * primes:    [n_layers][n_cols] P_l[col], distinct primes >= engram_vocab_size, assigned in
 *            (layer slot, s, head) order (MODEL.md 5.6).
 * offsets:   [n_layers][n_cols] O_l[col] = sum of P_l[0..col-1] (exclusive prefix sum).
 * n_rows:    [n_layers] sum of P_l = rows of that layer's table (must equal
 *            engram_num_embeddings, checked by engine_config_from_json).
 * mult_bound: b_mu = max(1, floor(floor((2^63-1)/V_c)/2)); multipliers are odd and <= 2*b_mu-1.
 * Plain data (about 29 KB).
 */
typedef struct {
    int n_layers;
    int ngram;
    int n_heads;
    int n_cols;
    int64_t primes[ENGINE_CONFIG_MAX_ENGRAM_LAYERS][ENGINE_ENGRAM_MAX_COLS];
    int64_t offsets[ENGINE_CONFIG_MAX_ENGRAM_LAYERS][ENGINE_ENGRAM_MAX_COLS];
    int64_t n_rows[ENGINE_CONFIG_MAX_ENGRAM_LAYERS];
    int64_t mult_bound;
} engine_engram_layout_t;

/*
 * A checkpoint's Engram sidecar (MODEL.md 9.2), loaded by engine_engram_sidecar_load().
 *
 * token_map:   [n_vocab] int32 compressed id of every token id (n_vocab = V).
 * multipliers: [n_layers, ngram] int64 mu_l[s], one row per Engram layer slot.
 * primes, offsets: [n_layers, n_cols] int64, as engine_engram_layout_t.
 * compressed_vocab_size: metadata, the token map's compressed vocabulary (<= the config's V_c);
 * tokenizer_sha256, origin: metadata strings ("" if absent).
 * The arrays are owned by the struct; release with engine_engram_sidecar_fini().
 */
typedef struct {
    int32_t *token_map;
    int64_t n_vocab;
    int64_t *multipliers;
    int64_t *primes;
    int64_t *offsets;
    int n_layers;
    int ngram;
    int n_cols;
    int64_t compressed_vocab_size;
    char tokenizer_sha256[72];
    char origin[64];
} engine_engram_sidecar_t;

/*
 * engine_engram_mult_bound - b_mu = max(1, floor(floor((2^63-1)/V_c)/2)) for V_c >= 1, so that
 * id * mu never overflows int64 for ids < V_c and odd mu <= 2*b_mu-1 (MODEL.md 9.2). Returns 1
 * for V_c < 1.
 */
int64_t engine_engram_mult_bound(int64_t compressed_vocab_size);

/*
 * engine_engram_layout_init - primes, offsets, table rows and b_mu of every Engram layer of
 * *cfg (MODEL.md 5.6: walk layer slots in engram_layer_ids order, n = 2..N, head 0..h_e-1, each
 * taking the smallest prime > engram_vocab_size - 1 not yet used).
 *
 * Returns TDM_OK, or TDM_ERR_INVALID_ARG (*layout_out untouched) when a pointer is NULL or the
 * config exceeds ENGINE_CONFIG_MAX_ENGRAM_LAYERS / ENGINE_ENGRAM_MAX_COLS (a loaded config never
 * does). Full model: slot 0 primes 16000057..16000463, slot 1 16000477..16000889.
 */
tdm_status_t engine_engram_layout_init(const engine_config_t *cfg,
                                       engine_engram_layout_t *layout_out);

/*
 * engine_engram_random_vocab - V_c of a random checkpoint's token map: V for V <= 16, else
 * 16 + ceil((V-16)/2) (tiny 520, small 16392).
 */
int64_t engine_engram_random_vocab(int64_t n_vocab);

/*
 * engine_engram_random_token_map - token_map_out[i] = i for i < 16, else 16 + floor((i-16)/2),
 * for i < n_vocab (MODEL.md 9.2, random checkpoints). token_map_out: [n_vocab] int32, written.
 * n_vocab must be < 2^31.
 */
void engine_engram_random_token_map(int64_t n_vocab, int32_t *token_map_out);

/*
 * engine_engram_random_multipliers - multipliers of a random checkpoint (MODEL.md 9.2):
 * mult_out[i*N + s] = 2 * (splitmix64(10007 * l + s) mod b_mu) + 1 for Engram slot i, l =
 * engram_layer_ids[i], s < N, b_mu from cfg's engram_compressed_vocab_size.
 * mult_out: [n_engram_layer_ids, N] int64, written. Source: MODEL.md 9.2 and 12.8.
 */
void engine_engram_random_multipliers(const engine_config_t *cfg, int64_t *mult_out);

/*
 * engine_engram_release_multipliers - multipliers of a real (released) checkpoint (MODEL.md 9.2):
 * row i = numpy `default_rng(10007 * l).integers(0, b_mu, size=N, dtype=int64) * 2 + 1` for
 * Engram slot i, l = engram_layer_ids[i], b_mu from cfg's engram_compressed_vocab_size (numpy's
 * generator reproduced by engine/np_random.h). mult_out: [n_engram_layer_ids, N] int64, written.
 * Full model: layer 1 [76632096046245, 4839876093313, 35959672319349, 73987337458391], layer 14
 * [67716810739261, 51510806800915, 30921347202721, 82619226485591]. Pure function.
 */
void engine_engram_release_multipliers(const engine_config_t *cfg, int64_t *mult_out);

/*
 * engine_engram_window_ids - the N compressed ids hashed at position p (MODEL.md 5.6):
 * ids_out[s] = token_map[tokens[p-s]] for p-s >= 0, else token_map[engram_pad_token_id] (a
 * blocked shift blocks every longer one). tokens: the sequence's token ids, [p+1] at least, each
 * < cfg->vocab_size; token_map: [V] int32. ids_out: [N] int64, written. No image tokens exist in
 * text-only serving, so no other position is "dead".
 */
void engine_engram_window_ids(const engine_config_t *cfg, const int32_t *token_map,
                              const int32_t *tokens, int64_t p, int64_t *ids_out);

/*
 * engine_engram_hash_rows - the (N-1)*h_e table rows of one position at Engram slot `slot`:
 * h_0 = ids[0]*mu[0], h_s = h_{s-1} XOR ids[s]*mu[s] (int64, no overflow), then for s = 1..N-1
 * and head k < h_e, col = (s-1)*h_e + k: rows_out[col] = (h_s mod P[col]) + O[col].
 *
 * layout:      from engine_engram_layout_init(); 0 <= slot < layout->n_layers.
 * multipliers: [N] int64 mu of this slot, odd, <= 2*b_mu-1 (checked at load).
 * ids:         [N] int64 compressed ids, ids[s] for the token s positions back, each < V_c.
 * rows_out:    [(N-1)*h_e] int64 table rows, written, each < layout->n_rows[slot].
 * Pure function. Source: MODEL.md 5.6.
 */
void engine_engram_hash_rows(const engine_engram_layout_t *layout, int slot,
                             const int64_t *multipliers, const int64_t *ids, int64_t *rows_out);

/*
 * engine_engram_sidecar_check - refuse a sidecar that does not fit the config (MODEL.md 9.2).
 *
 * token_map:   [n_vocab] int32; n_vocab must equal V; every entry in [0, V_c).
 * multipliers: [n_engram_layer_ids, N] int64; each odd, >= 1 and <= 2*b_mu-1.
 * primes, offsets: [n_engram_layer_ids, (N-1)*h_e] int64; must equal the values recomputed from
 *              the config (engine_engram_layout_init).
 * Shapes are the caller's to check (the loader compares the tensors' shapes).
 *
 * Returns TDM_OK, TDM_ERR_INVALID_ARG (a NULL pointer) or TDM_ERR_MISMATCH with one line naming
 * the array and index in err (err_bytes, may be 0), e.g. "engram sidecar: primes[1][3]: 16000481
 * but the config gives 16000483". Reads only.
 */
tdm_status_t engine_engram_sidecar_check(const engine_config_t *cfg, const int32_t *token_map,
                                         int64_t n_vocab, const int64_t *multipliers,
                                         const int64_t *primes, const int64_t *offsets, char *err,
                                         size_t err_bytes);

/*
 * engine_engram_sidecar_load - read `dir`/engram-hash.safetensors, check tensor dtypes and shapes
 * (token_map I32 [V], multipliers I64 [#Engram layers, N], primes and offsets I64 [#Engram
 * layers, (N-1)*h_e]) and metadata compressed_vocab_size (the map's own count, in [1, V_c]), then
 * engine_engram_sidecar_check().
 *
 * Returns TDM_OK with *sidecar_out filled (release with engine_engram_sidecar_fini()), or with
 * *sidecar_out untouched and one line in err: TDM_ERR_INVALID_ARG (NULL), TDM_ERR_NOT_FOUND (no
 * sidecar file), TDM_ERR_IO, TDM_ERR_FORMAT (unreadable safetensors, a missing tensor or
 * metadata key), TDM_ERR_UNSUPPORTED (unknown dtype), TDM_ERR_MISMATCH (wrong dtype, shape or
 * value), TDM_ERR_NO_MEMORY. Reads the file once; nothing stays mapped.
 */
tdm_status_t engine_engram_sidecar_load(const char *dir, const engine_config_t *cfg,
                                        engine_engram_sidecar_t *sidecar_out, char *err,
                                        size_t err_bytes);

/* Bytes of a SHA-256 digest in lowercase hex, NUL included (engine_engram_file_sha256). */
#define ENGINE_ENGRAM_SHA256_HEX_BYTES 65

/*
 * engine_engram_file_sha256 - hex_out = the lowercase hex SHA-256 of the file at `path` (OpenSSL
 * EVP), the sidecar's tokenizer_sha256 metadata. hex_out: ENGINE_ENGRAM_SHA256_HEX_BYTES bytes,
 * written only on success.
 *
 * Returns TDM_OK, TDM_ERR_INVALID_ARG (NULL), TDM_ERR_NOT_FOUND (no such file), TDM_ERR_IO
 * (unreadable; strerror in err) or TDM_ERR_INTERNAL (the digest failed), with one line in err.
 */
tdm_status_t engine_engram_file_sha256(const char *path, char *hex_out, char *err,
                                       size_t err_bytes);

/*
 * engine_engram_sidecar_write - write `dir`/engram-hash.safetensors (MODEL.md 9.2): token_map I32
 * [V], multipliers I64 [#Engram layers, N], primes and offsets I64 [#Engram layers, (N-1)*h_e]
 * (recomputed from cfg by engine_engram_layout_init), metadata compressed_vocab_size (decimal),
 * tokenizer_sha256 and origin. Deterministic bytes (engine_st_writer_finish), written through a
 * temporary file and a rename.
 *
 * token_map:   [cfg->vocab_size] int32; multipliers: [n_engram_layer_ids, N] int64; both
 *              borrowed for the call and checked with engine_engram_sidecar_check() first.
 * compressed_vocab_size: the map's own count, in [1, V_c].
 * tokenizer_sha256, origin: metadata strings (UTF-8, non-NULL).
 * Returns TDM_OK, or with one line in err and no sidecar written or changed: TDM_ERR_INVALID_ARG
 * (NULL argument, count out of range), TDM_ERR_MISMATCH (the arrays fail the sidecar check),
 * TDM_ERR_IO, TDM_ERR_NO_MEMORY.
 */
tdm_status_t engine_engram_sidecar_write(const char *dir, const engine_config_t *cfg,
                                         const int32_t *token_map, int64_t compressed_vocab_size,
                                         const int64_t *multipliers, const char *tokenizer_sha256,
                                         const char *origin, char *err, size_t err_bytes);

/* engine_engram_sidecar_fini - free the arrays of *sidecar and zero it; accepts NULL or a zeroed
 * struct. */
void engine_engram_sidecar_fini(engine_engram_sidecar_t *sidecar);

#endif
