/* engram_sidecar.c - engine_engram_sidecar_load / _write: read and write engram-hash.safetensors
 * (MODEL.md 9.2) over engine/safetensors.h and check it against the config (see engram_hash.h),
 * plus the tokenizer digest its metadata records. Kept apart from engram_hash.c so that the hash
 * itself does not pull in the safetensors reader or OpenSSL. */
#include "engine/engram_hash.h"

#include "engine/safetensors.h"

#include <openssl/evp.h>

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bytes of the sidecar's path. */
#define PATH_BYTES 4096

static tdm_status_t load_fail(char *err, size_t err_bytes, tdm_status_t status, const char *path,
                              const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static tdm_status_t load_fail(char *err, size_t err_bytes, tdm_status_t status, const char *path,
                              const char *fmt, ...)
{
    char reason[256];
    va_list args;

    va_start(args, fmt);
    vsnprintf(reason, sizeof(reason), fmt, args);
    va_end(args);
    if (err != NULL && err_bytes > 0) {
        snprintf(err, err_bytes, "%s: %s", path, reason);
    }
    return status;
}

/*
 * Copy tensor `name` of `file` into a new buffer (caller frees) after checking its dtype and its
 * 2-D (or 1-D when dim1 < 0) shape. The mapping is only byte-aligned, hence the copy.
 */
static tdm_status_t copy_tensor(const engine_st_file_t *file, const char *path, const char *name,
                                engine_dtype_t dtype, int64_t dim0, int64_t dim1, void **data_out,
                                char *err, size_t err_bytes)
{
    const engine_st_tensor_t *tensor = engine_st_file_find(file, name);
    int n_dims = dim1 < 0 ? 1 : 2;
    int64_t shape[2] = {dim0, dim1};
    char got[ENGINE_ST_SHAPE_TEXT_BYTES];
    char want[ENGINE_ST_SHAPE_TEXT_BYTES];
    void *data;

    if (tensor == NULL) {
        return load_fail(err, err_bytes, TDM_ERR_FORMAT, path, "tensor %s: missing", name);
    }
    if (tensor->dtype != dtype) {
        return load_fail(err, err_bytes, TDM_ERR_MISMATCH, path, "tensor %s: dtype %s, expected %s",
                         name, engine_dtype_name(tensor->dtype), engine_dtype_name(dtype));
    }
    if (tensor->n_dims != n_dims || tensor->shape[0] != dim0 ||
        (n_dims == 2 && tensor->shape[1] != dim1)) {
        engine_st_shape_format(tensor->n_dims, tensor->shape, got, sizeof(got));
        engine_st_shape_format(n_dims, shape, want, sizeof(want));
        return load_fail(err, err_bytes, TDM_ERR_MISMATCH, path, "tensor %s: shape %s, expected %s",
                         name, got, want);
    }
    data = malloc(tensor->n_bytes > 0 ? tensor->n_bytes : 1);
    if (data == NULL) {
        return load_fail(err, err_bytes, TDM_ERR_NO_MEMORY, path, "tensor %s: out of memory", name);
    }
    if (tensor->n_bytes > 0) {
        memcpy(data, tensor->data, tensor->n_bytes);
    }
    *data_out = data;
    return TDM_OK;
}

/*
 * The metadata compressed_vocab_size: a decimal integer in [1, V_c]. It is the token map's own
 * compressed vocabulary, which may be smaller than the config's V_c (a random full checkpoint maps
 * 129280 ids to 64648); MODEL.md 9.2 requires only max(token_map) < V_c (checked later).
 */
static tdm_status_t check_vocab_metadata(const engine_st_file_t *file, const char *path,
                                         const engine_config_t *cfg, int64_t *value_out, char *err,
                                         size_t err_bytes)
{
    const char *text = engine_st_file_metadata(file, "compressed_vocab_size");
    char *end = NULL;
    long long value;

    if (text == NULL) {
        return load_fail(err, err_bytes, TDM_ERR_FORMAT, path,
                         "metadata compressed_vocab_size: missing");
    }
    errno = 0;
    value = strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0') {
        return load_fail(err, err_bytes, TDM_ERR_FORMAT, path,
                         "metadata compressed_vocab_size: \"%.32s\" is not an integer", text);
    }
    if (value < 1 || value > cfg->engram_compressed_vocab_size) {
        return load_fail(err, err_bytes, TDM_ERR_MISMATCH, path,
                         "metadata compressed_vocab_size: %lld not in [1, %lld] (config "
                         "engram_compressed_vocab_size)",
                         value, (long long)cfg->engram_compressed_vocab_size);
    }
    *value_out = (int64_t)value;
    return TDM_OK;
}

tdm_status_t engine_engram_sidecar_load(const char *dir, const engine_config_t *cfg,
                                        engine_engram_sidecar_t *sidecar_out, char *err,
                                        size_t err_bytes)
{
    engine_engram_sidecar_t sidecar;
    engine_engram_layout_t layout;
    engine_st_file_t *file = NULL;
    char path[PATH_BYTES];
    const char *text;
    void *data;
    tdm_status_t status;

    if (dir == NULL || cfg == NULL || sidecar_out == NULL) {
        return load_fail(err, err_bytes, TDM_ERR_INVALID_ARG, "engram sidecar",
                         "no directory, config or output");
    }
    if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, ENGINE_ENGRAM_SIDECAR_FILE) >=
        sizeof(path)) {
        return load_fail(err, err_bytes, TDM_ERR_INVALID_ARG, dir, "path too long");
    }
    status = engine_engram_layout_init(cfg, &layout);
    if (status != TDM_OK) {
        return load_fail(err, err_bytes, status, path, "config exceeds the Engram limits");
    }
    status = engine_st_file_open(path, &file, err, err_bytes);
    if (status == TDM_ERR_NOT_FOUND) {
        return load_fail(err, err_bytes, status, path,
                         "no Engram sidecar (MODEL.md 9.2); make it once with tandem-convert "
                         "--model %s (docs/CONVERT.md)",
                         dir);
    }
    if (status != TDM_OK) {
        return status;
    }
    memset(&sidecar, 0, sizeof(sidecar));
    sidecar.n_vocab = cfg->vocab_size;
    sidecar.n_layers = layout.n_layers;
    sidecar.ngram = layout.ngram;
    sidecar.n_cols = layout.n_cols;

    status = check_vocab_metadata(file, path, cfg, &sidecar.compressed_vocab_size, err, err_bytes);
    if (status != TDM_OK) {
        goto err_close_file;
    }
    status = copy_tensor(file, path, "token_map", ENGINE_DTYPE_I32, cfg->vocab_size, -1, &data, err,
                         err_bytes);
    if (status != TDM_OK) {
        goto err_close_file;
    }
    sidecar.token_map = data;
    status = copy_tensor(file, path, "multipliers", ENGINE_DTYPE_I64, layout.n_layers, layout.ngram,
                         &data, err, err_bytes);
    if (status != TDM_OK) {
        goto err_free_arrays;
    }
    sidecar.multipliers = data;
    status = copy_tensor(file, path, "primes", ENGINE_DTYPE_I64, layout.n_layers, layout.n_cols,
                         &data, err, err_bytes);
    if (status != TDM_OK) {
        goto err_free_arrays;
    }
    sidecar.primes = data;
    status = copy_tensor(file, path, "offsets", ENGINE_DTYPE_I64, layout.n_layers, layout.n_cols,
                         &data, err, err_bytes);
    if (status != TDM_OK) {
        goto err_free_arrays;
    }
    sidecar.offsets = data;
    text = engine_st_file_metadata(file, "tokenizer_sha256");
    snprintf(sidecar.tokenizer_sha256, sizeof(sidecar.tokenizer_sha256), "%s",
             text != NULL ? text : "");
    text = engine_st_file_metadata(file, "origin");
    snprintf(sidecar.origin, sizeof(sidecar.origin), "%s", text != NULL ? text : "");

    status =
        engine_engram_sidecar_check(cfg, sidecar.token_map, sidecar.n_vocab, sidecar.multipliers,
                                    sidecar.primes, sidecar.offsets, err, err_bytes);
    if (status != TDM_OK) {
        goto err_free_arrays;
    }
    engine_st_file_close(file);
    *sidecar_out = sidecar;
    return TDM_OK;

err_free_arrays:
    engine_engram_sidecar_fini(&sidecar);
err_close_file:
    engine_st_file_close(file);
    return status;
}

tdm_status_t engine_engram_file_sha256(const char *path, char *hex_out, char *err, size_t err_bytes)
{
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned char buf[65536];
    unsigned int n_digest = 0;
    EVP_MD_CTX *ctx;
    FILE *file;
    size_t n;
    int ok;

    if (path == NULL || hex_out == NULL) {
        return load_fail(err, err_bytes, TDM_ERR_INVALID_ARG, "sha256", "no path or output");
    }
    file = fopen(path, "rb");
    if (file == NULL) {
        return load_fail(err, err_bytes, errno == ENOENT ? TDM_ERR_NOT_FOUND : TDM_ERR_IO, path,
                         "cannot open: %s", strerror(errno));
    }
    ctx = EVP_MD_CTX_new();
    ok = ctx != NULL && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1;
    while (ok && (n = fread(buf, 1, sizeof(buf), file)) > 0) {
        ok = EVP_DigestUpdate(ctx, buf, n) == 1;
    }
    if (ok && ferror(file)) {
        fclose(file);
        EVP_MD_CTX_free(ctx);
        return load_fail(err, err_bytes, TDM_ERR_IO, path, "read failed");
    }
    fclose(file);
    ok = ok && EVP_DigestFinal_ex(ctx, digest, &n_digest) == 1 && n_digest == 32;
    EVP_MD_CTX_free(ctx);
    if (!ok) {
        return load_fail(err, err_bytes, TDM_ERR_INTERNAL, path, "SHA-256 failed");
    }
    for (unsigned int i = 0; i < n_digest; i++) {
        snprintf(hex_out + 2 * i, 3, "%02x", digest[i]);
    }
    return TDM_OK;
}

/* Queue the four sidecar tensors and the three metadata keys on `writer`. */
static tdm_status_t queue_sidecar(engine_st_writer_t *writer, const engine_config_t *cfg,
                                  const engine_engram_layout_t *layout, const int32_t *token_map,
                                  const int64_t *multipliers, const int64_t *primes,
                                  const int64_t *offsets, const char *vocab_text,
                                  const char *tokenizer_sha256, const char *origin)
{
    int64_t shape_map[1] = {cfg->vocab_size};
    int64_t shape_mult[2] = {layout->n_layers, layout->ngram};
    int64_t shape_cols[2] = {layout->n_layers, layout->n_cols};
    size_t n_col_bytes = (size_t)layout->n_layers * (size_t)layout->n_cols * sizeof(int64_t);
    tdm_status_t status;

    status = engine_st_writer_add(writer, "token_map", ENGINE_DTYPE_I32, 1, shape_map, token_map,
                                  (size_t)cfg->vocab_size * sizeof(int32_t));
    if (status == TDM_OK) {
        status = engine_st_writer_add(
            writer, "multipliers", ENGINE_DTYPE_I64, 2, shape_mult, multipliers,
            (size_t)layout->n_layers * (size_t)layout->ngram * sizeof(int64_t));
    }
    if (status == TDM_OK) {
        status = engine_st_writer_add(writer, "primes", ENGINE_DTYPE_I64, 2, shape_cols, primes,
                                      n_col_bytes);
    }
    if (status == TDM_OK) {
        status = engine_st_writer_add(writer, "offsets", ENGINE_DTYPE_I64, 2, shape_cols, offsets,
                                      n_col_bytes);
    }
    if (status == TDM_OK) {
        status = engine_st_writer_set_metadata(writer, "compressed_vocab_size", vocab_text);
    }
    if (status == TDM_OK) {
        status = engine_st_writer_set_metadata(writer, "tokenizer_sha256", tokenizer_sha256);
    }
    if (status == TDM_OK) {
        status = engine_st_writer_set_metadata(writer, "origin", origin);
    }
    return status;
}

tdm_status_t engine_engram_sidecar_write(const char *dir, const engine_config_t *cfg,
                                         const int32_t *token_map, int64_t compressed_vocab_size,
                                         const int64_t *multipliers, const char *tokenizer_sha256,
                                         const char *origin, char *err, size_t err_bytes)
{
    char path[PATH_BYTES];
    char vocab_text[32];
    engine_engram_layout_t *layout;
    engine_st_writer_t *writer = NULL;
    int64_t *primes = NULL;
    int64_t *offsets = NULL;
    tdm_status_t status;

    if (dir == NULL || cfg == NULL || token_map == NULL || multipliers == NULL ||
        tokenizer_sha256 == NULL || origin == NULL) {
        return load_fail(err, err_bytes, TDM_ERR_INVALID_ARG, "engram sidecar", "missing argument");
    }
    if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, ENGINE_ENGRAM_SIDECAR_FILE) >=
        sizeof(path)) {
        return load_fail(err, err_bytes, TDM_ERR_INVALID_ARG, dir, "path too long");
    }
    if (compressed_vocab_size < 1 || compressed_vocab_size > cfg->engram_compressed_vocab_size) {
        return load_fail(err, err_bytes, TDM_ERR_INVALID_ARG, path,
                         "compressed_vocab_size %lld not in [1, %lld]",
                         (long long)compressed_vocab_size,
                         (long long)cfg->engram_compressed_vocab_size);
    }
    layout = malloc(sizeof(*layout));
    if (layout == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    status = engine_engram_layout_init(cfg, layout);
    if (status != TDM_OK) {
        load_fail(err, err_bytes, status, path, "config exceeds the Engram limits");
        goto out;
    }
    primes = malloc((size_t)layout->n_layers * (size_t)layout->n_cols * sizeof(int64_t) + 1);
    offsets = malloc((size_t)layout->n_layers * (size_t)layout->n_cols * sizeof(int64_t) + 1);
    if (primes == NULL || offsets == NULL) {
        status = TDM_ERR_NO_MEMORY;
        goto out;
    }
    for (int i = 0; i < layout->n_layers; i++) {
        memcpy(primes + (size_t)i * (size_t)layout->n_cols, layout->primes[i],
               (size_t)layout->n_cols * sizeof(int64_t));
        memcpy(offsets + (size_t)i * (size_t)layout->n_cols, layout->offsets[i],
               (size_t)layout->n_cols * sizeof(int64_t));
    }
    status = engine_engram_sidecar_check(cfg, token_map, cfg->vocab_size, multipliers, primes,
                                         offsets, err, err_bytes);
    if (status != TDM_OK) {
        goto out;
    }
    snprintf(vocab_text, sizeof(vocab_text), "%lld", (long long)compressed_vocab_size);
    status = engine_st_writer_create(path, &writer);
    if (status == TDM_OK) {
        status = queue_sidecar(writer, cfg, layout, token_map, multipliers, primes, offsets,
                               vocab_text, tokenizer_sha256, origin);
    }
    if (status == TDM_OK) {
        status = engine_st_writer_finish(writer);
    }
    if (status != TDM_OK) {
        load_fail(err, err_bytes, status, path, "cannot write the sidecar (%s)",
                  tdm_status_message(status));
    }
out:
    engine_st_writer_destroy(writer);
    free(offsets);
    free(primes);
    free(layout);
    return status;
}
