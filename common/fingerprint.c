/* fingerprint.c - the model fingerprint of a checkpoint directory (common/fingerprint.h). */
#include "common/fingerprint.h"

#include "common/errbuf.h"
#include "common/hash.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FP_PATH_BYTES         4096
#define SAFETENSORS_LEN_BYTES 8

/* Chain up to `limit_bytes` of an open file into *h (from its current offset); n_read_out gets
 * the bytes consumed. */
static tdm_status_t chain_stream(FILE *f, uint64_t limit_bytes, uint64_t *h, uint64_t *n_read_out)
{
    unsigned char *buf = malloc(TDM_FINGERPRINT_READ_BYTES);
    uint64_t total = 0;

    if (buf == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    while (total < limit_bytes) {
        size_t want = limit_bytes - total < TDM_FINGERPRINT_READ_BYTES
                          ? (size_t)(limit_bytes - total)
                          : TDM_FINGERPRINT_READ_BYTES;
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

/* Whether chain_whole_file accepts a file that does not exist. */
typedef enum {
    FILE_REQUIRED = 0,
    FILE_OPTIONAL = 1, /* absent: nothing is hashed, TDM_OK */
} file_need_t;

static tdm_status_t chain_whole_file(const char *path, file_need_t need, uint64_t *h, char *err,
                                     size_t err_bytes)
{
    FILE *f = fopen(path, "rb");
    uint64_t n_read;
    tdm_status_t status;

    if (f == NULL) {
        int open_errno = errno;
        if (open_errno == ENOENT && need == FILE_OPTIONAL) {
            return TDM_OK;
        }
        tdm_errbuf_set(err, err_bytes, "%s: %s", path, strerror(open_errno));
        return open_errno == ENOENT ? TDM_ERR_NOT_FOUND : TDM_ERR_IO;
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
    if (header_bytes > TDM_FINGERPRINT_MAX_HEADER_BYTES) {
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
        status = chain_stream(f, TDM_FINGERPRINT_DATA_BYTES, h, &n_read);
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
        int open_errno = errno;
        tdm_errbuf_set(err, err_bytes, "%s: %s", dir, strerror(open_errno));
        return open_errno == ENOENT ? TDM_ERR_NOT_FOUND : TDM_ERR_IO;
    }
    names = calloc(TDM_FINGERPRINT_MAX_SHARDS, sizeof(*names));
    if (names == NULL) {
        closedir(d);
        return TDM_ERR_NO_MEMORY;
    }
    while ((entry = readdir(d)) != NULL) {
        if (!has_suffix(entry->d_name, ".safetensors")) {
            continue;
        }
        if (n_names == TDM_FINGERPRINT_MAX_SHARDS) {
            tdm_errbuf_set(err, err_bytes, "%s: more than %d safetensors files", dir,
                           TDM_FINGERPRINT_MAX_SHARDS);
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

tdm_status_t tdm_model_fingerprint(const char *model_dir, uint64_t *fingerprint_out, char *err,
                                   size_t err_bytes)
{
    char path[FP_PATH_BYTES];
    char **names = NULL;
    size_t n_names = 0;
    uint64_t h = 0;
    tdm_status_t status;

    if (model_dir == NULL || fingerprint_out == NULL) {
        tdm_errbuf_set(err, err_bytes, "invalid argument");
        return TDM_ERR_INVALID_ARG;
    }
    snprintf(path, sizeof(path), "%s/config.json", model_dir);
    status = chain_whole_file(path, FILE_REQUIRED, &h, err, err_bytes);
    if (status != TDM_OK) {
        return status;
    }
    snprintf(path, sizeof(path), "%s/tokenizer.json", model_dir);
    status = chain_whole_file(path, FILE_OPTIONAL, &h, err, err_bytes);
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
