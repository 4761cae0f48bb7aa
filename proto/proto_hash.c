#include "proto/proto_hash.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errbuf.h"
#include "common/hash.h"

#define HASH_PATH_BYTES              4096
#define HASH_MAX_SHARDS              4096
#define HASH_READ_BYTES              (1u << 16)
#define SAFETENSORS_LEN_BYTES        8
#define SAFETENSORS_MAX_HEADER_BYTES (100u * 1024u * 1024u)

/* Chain up to `limit_bytes` of an open file into *h (from its current offset); n_read_out gets
 * the bytes consumed. */
static tdm_status_t chain_stream(FILE *f, uint64_t limit_bytes, uint64_t *h, uint64_t *n_read_out)
{
    unsigned char *buf = malloc(HASH_READ_BYTES);
    uint64_t total = 0;

    if (buf == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    while (total < limit_bytes) {
        size_t want =
            limit_bytes - total < HASH_READ_BYTES ? (size_t)(limit_bytes - total) : HASH_READ_BYTES;
        size_t got = fread(buf, 1, want, f);
        if (got > 0) {
            *h = tdm_hash_xxh3_64_seeded(buf, got, *h);
            total += got;
        }
        if (got < want) {
            break;
        }
    }
    free(buf);
    if (ferror(f)) {
        return TDM_ERR_IO;
    }
    *n_read_out = total;
    return TDM_OK;
}

static tdm_status_t chain_whole_file(const char *path, uint64_t *h, char *err, size_t err_bytes)
{
    FILE *f = fopen(path, "rb");
    uint64_t n_read;
    tdm_status_t status;

    if (f == NULL) {
        tdm_errbuf_set(err, err_bytes, "%s: %s", path, strerror(errno));
        return errno == ENOENT ? TDM_ERR_NOT_FOUND : TDM_ERR_IO;
    }
    status = chain_stream(f, UINT64_MAX, h, &n_read);
    fclose(f);
    if (status != TDM_OK) {
        tdm_errbuf_set(err, err_bytes, "%s: read failed", path);
    }
    return status;
}

static tdm_status_t chain_shard(const char *path, uint64_t *h, char *err, size_t err_bytes)
{
    unsigned char len_bytes[SAFETENSORS_LEN_BYTES];
    uint64_t header_bytes = 0;
    uint64_t n_read;
    tdm_status_t status;
    FILE *f = fopen(path, "rb");

    if (f == NULL) {
        tdm_errbuf_set(err, err_bytes, "%s: %s", path, strerror(errno));
        return TDM_ERR_IO;
    }
    if (fread(len_bytes, 1, sizeof(len_bytes), f) != sizeof(len_bytes)) {
        tdm_errbuf_set(err, err_bytes, "%s: shorter than the 8-byte header length", path);
        status = TDM_ERR_FORMAT;
        goto out_close;
    }
    for (int i = SAFETENSORS_LEN_BYTES - 1; i >= 0; i--) {
        header_bytes = (header_bytes << 8) | len_bytes[i];
    }
    if (header_bytes > SAFETENSORS_MAX_HEADER_BYTES) {
        tdm_errbuf_set(err, err_bytes, "%s: header length %llu too large", path,
                       (unsigned long long)header_bytes);
        status = TDM_ERR_FORMAT;
        goto out_close;
    }
    *h = tdm_hash_xxh3_64_seeded(len_bytes, sizeof(len_bytes), *h);
    status = chain_stream(f, header_bytes, h, &n_read);
    if (status == TDM_OK && n_read != header_bytes) {
        tdm_errbuf_set(err, err_bytes, "%s: header truncated (%llu of %llu bytes)", path,
                       (unsigned long long)n_read, (unsigned long long)header_bytes);
        status = TDM_ERR_FORMAT;
    }
    if (status == TDM_OK) {
        status = chain_stream(f, PROTO_FINGERPRINT_DATA_BYTES, h, &n_read);
    }
    if (status == TDM_ERR_IO) {
        tdm_errbuf_set(err, err_bytes, "%s: read failed", path);
    }
out_close:
    fclose(f);
    return status;
}

static int has_suffix(const char *name, const char *suffix)
{
    size_t n = strlen(name);
    size_t m = strlen(suffix);
    return n > m && strcmp(name + n - m, suffix) == 0;
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The sorted names of the *.safetensors files of dir; caller frees each and the array. */
static tdm_status_t list_shards(const char *dir, char ***names_out, size_t *n_names_out, char *err,
                                size_t err_bytes)
{
    DIR *d = opendir(dir);
    struct dirent *entry;
    char **names;
    size_t n_names = 0;
    tdm_status_t status = TDM_OK;

    if (d == NULL) {
        tdm_errbuf_set(err, err_bytes, "%s: %s", dir, strerror(errno));
        return errno == ENOENT ? TDM_ERR_NOT_FOUND : TDM_ERR_IO;
    }
    names = calloc(HASH_MAX_SHARDS, sizeof(*names));
    if (names == NULL) {
        closedir(d);
        return TDM_ERR_NO_MEMORY;
    }
    while ((entry = readdir(d)) != NULL) {
        if (!has_suffix(entry->d_name, ".safetensors")) {
            continue;
        }
        if (n_names == HASH_MAX_SHARDS) {
            tdm_errbuf_set(err, err_bytes, "%s: more than %d safetensors files", dir,
                           HASH_MAX_SHARDS);
            status = TDM_ERR_FORMAT;
            break;
        }
        names[n_names] = strdup(entry->d_name);
        if (names[n_names] == NULL) {
            status = TDM_ERR_NO_MEMORY;
            break;
        }
        n_names++;
    }
    closedir(d);
    if (status != TDM_OK) {
        for (size_t i = 0; i < n_names; i++) {
            free(names[i]);
        }
        free(names);
        return status;
    }
    qsort(names, n_names, sizeof(*names), compare_names);
    *names_out = names;
    *n_names_out = n_names;
    return TDM_OK;
}

tdm_status_t proto_model_fingerprint(const char *model_dir, uint64_t *fingerprint_out, char *err,
                                     size_t err_bytes)
{
    char path[HASH_PATH_BYTES];
    char **names = NULL;
    size_t n_names = 0;
    uint64_t h = 0;
    tdm_status_t status;

    if (model_dir == NULL || fingerprint_out == NULL) {
        tdm_errbuf_set(err, err_bytes, "invalid argument");
        return TDM_ERR_INVALID_ARG;
    }
    snprintf(path, sizeof(path), "%s/config.json", model_dir);
    status = chain_whole_file(path, &h, err, err_bytes);
    if (status != TDM_OK) {
        return status;
    }
    snprintf(path, sizeof(path), "%s/tokenizer.json", model_dir);
    status = chain_whole_file(path, &h, err, err_bytes);
    if (status != TDM_OK) {
        return status;
    }
    status = list_shards(model_dir, &names, &n_names, err, err_bytes);
    if (status != TDM_OK) {
        return status;
    }
    for (size_t i = 0; i < n_names && status == TDM_OK; i++) {
        snprintf(path, sizeof(path), "%s/%s", model_dir, names[i]);
        status = chain_shard(path, &h, err, err_bytes);
    }
    for (size_t i = 0; i < n_names; i++) {
        free(names[i]);
    }
    free(names);
    if (status != TDM_OK) {
        return status;
    }
    *fingerprint_out = h;
    return TDM_OK;
}

size_t proto_block_hashes(const int32_t *tokens, size_t n_tokens, uint32_t tokens_per_block,
                          uint64_t *hashes_out)
{
    unsigned char block[PROTO_BLOCK_HASH_PIECE_TOKENS * 4];
    size_t n_blocks;
    uint64_t h = 0;

    if (tokens_per_block == 0 || tokens == NULL || hashes_out == NULL) {
        return 0;
    }
    n_blocks = n_tokens / tokens_per_block;
    for (size_t b = 0; b < n_blocks; b++) {
        const int32_t *ids = tokens + b * tokens_per_block;
        size_t done = 0;
        uint64_t seed = h;
        /* A block of more than PROTO_BLOCK_HASH_PIECE_TOKENS ids is hashed as a chain of
         * pieces of that many (proto_hash.h). */
        while (done < tokens_per_block) {
            size_t n = tokens_per_block - done;
            if (n > PROTO_BLOCK_HASH_PIECE_TOKENS) {
                n = PROTO_BLOCK_HASH_PIECE_TOKENS;
            }
            for (size_t i = 0; i < n; i++) {
                uint32_t v = (uint32_t)ids[done + i];
                block[4 * i + 0] = (unsigned char)(v & 0xff);
                block[4 * i + 1] = (unsigned char)((v >> 8) & 0xff);
                block[4 * i + 2] = (unsigned char)((v >> 16) & 0xff);
                block[4 * i + 3] = (unsigned char)((v >> 24) & 0xff);
            }
            seed = tdm_hash_xxh3_64_seeded(block, 4 * n, seed);
            done += n;
        }
        h = seed;
        hashes_out[b] = h;
    }
    return n_blocks;
}
