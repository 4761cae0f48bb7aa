#include "engine/safetensors.h"

#include "common/errbuf.h"
#include "common/json.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define LENGTH_FIELD_BYTES 8u /* the little-endian u64 before the header */

typedef struct {
    char *key;
    char *value;
} meta_entry_t;

struct engine_st_file {
    char *path;
    const uint8_t *map;
    size_t map_bytes;
    void *anon;        /* engine_st_file_copy_resident's mapping (NULL: map is the file's) */
    size_t anon_bytes; /* its length */
    uint64_t header_bytes;
    engine_st_tensor_t *tensors; /* sorted by name */
    size_t n_tensors;
    char *name_pool;    /* every tensor name, NUL-terminated, back to back */
    meta_entry_t *meta; /* sorted by key */
    size_t n_meta;
};

/* ---- shapes ---------------------------------------------------------------------------- */

tdm_status_t engine_st_shape_bytes(engine_dtype_t dtype, int n_dims, const int64_t *shape,
                                   uint64_t *n_bytes_out)
{
    uint64_t total = engine_dtype_size_bytes(dtype);

    if (total == 0 || n_dims < 0 || n_dims > ENGINE_TENSOR_MAX_DIMS ||
        (n_dims > 0 && shape == NULL)) {
        return TDM_ERR_INVALID_ARG;
    }
    for (int d = 0; d < n_dims; d++) {
        uint64_t dim = (uint64_t)shape[d];
        if (shape[d] < 0 || (dim != 0 && total > UINT64_MAX / dim)) {
            return TDM_ERR_INVALID_ARG;
        }
        total *= dim;
    }
    *n_bytes_out = total;
    return TDM_OK;
}

void engine_st_shape_format(int n_dims, const int64_t *shape, char *text, size_t text_bytes)
{
    size_t used;

    if (text_bytes == 0) {
        return;
    }
    used = (size_t)snprintf(text, text_bytes, "[");
    for (int d = 0; d < n_dims && used < text_bytes; d++) {
        used += (size_t)snprintf(text + used, text_bytes - used, "%s%lld", d > 0 ? ", " : "",
                                 (long long)shape[d]);
    }
    if (used < text_bytes) {
        snprintf(text + used, text_bytes - used, "]");
    }
}

/* ---- reader ---------------------------------------------------------------------------- */

static int compare_tensor_names(const void *a, const void *b)
{
    const engine_st_tensor_t *ta = a;
    const engine_st_tensor_t *tb = b;

    return strcmp(ta->name, tb->name);
}

static int compare_tensor_ptr_offsets(const void *a, const void *b)
{
    const engine_st_tensor_t *ta = *(const engine_st_tensor_t *const *)a;
    const engine_st_tensor_t *tb = *(const engine_st_tensor_t *const *)b;

    if (ta->data_offset != tb->data_offset) {
        return ta->data_offset < tb->data_offset ? -1 : 1;
    }
    if (ta->n_bytes != tb->n_bytes) {
        return ta->n_bytes < tb->n_bytes ? -1 : 1;
    }
    return strcmp(ta->name, tb->name);
}

static int compare_meta_keys(const void *a, const void *b)
{
    const meta_entry_t *ma = a;
    const meta_entry_t *mb = b;

    return strcmp(ma->key, mb->key);
}

/* bsearch comparators: a name (key) against a tensor, a key against a metadata entry. */
static int compare_name_to_tensor(const void *name, const void *tensor)
{
    return strcmp(name, ((const engine_st_tensor_t *)tensor)->name);
}

static int compare_key_to_meta(const void *key, const void *entry)
{
    return strcmp(key, ((const meta_entry_t *)entry)->key);
}

/* Reads one non-negative JSON integer; returns 0, or -1 if value is anything else. */
static int read_u64(const json_t *value, uint64_t *value_out)
{
    json_int_t v;

    if (!json_is_integer(value)) {
        return -1;
    }
    v = json_integer_value(value);
    if (v < 0) {
        return -1;
    }
    *value_out = (uint64_t)v;
    return 0;
}

/* Parses one tensor entry into *t (name and data set by the caller). */
static tdm_status_t parse_tensor_entry(const char *path, const char *name, const json_t *entry,
                                       uint64_t data_bytes, engine_st_tensor_t *t, char *err,
                                       size_t err_bytes)
{
    const json_t *dtype_json;
    const json_t *shape_json;
    const json_t *offsets_json;
    uint64_t begin;
    uint64_t end;
    uint64_t need_bytes;
    size_t n_dims;
    char shape_text[ENGINE_ST_SHAPE_TEXT_BYTES];

    if (!json_is_object(entry)) {
        tdm_errbuf_set(err, err_bytes, "%s: tensor '%s': entry is not a JSON object", path, name);
        return TDM_ERR_FORMAT;
    }
    dtype_json = json_object_get(entry, "dtype");
    if (!json_is_string(dtype_json)) {
        tdm_errbuf_set(err, err_bytes, "%s: tensor '%s': \"dtype\" missing or not a string", path,
                       name);
        return TDM_ERR_FORMAT;
    }
    if (strlen(json_string_value(dtype_json)) != json_string_length(dtype_json) ||
        engine_dtype_parse(json_string_value(dtype_json), &t->dtype) != TDM_OK) {
        tdm_errbuf_set(err, err_bytes, "%s: tensor '%s': unsupported dtype \"%s\"", path, name,
                       json_string_value(dtype_json));
        return TDM_ERR_UNSUPPORTED;
    }

    shape_json = json_object_get(entry, "shape");
    if (!json_is_array(shape_json)) {
        tdm_errbuf_set(err, err_bytes, "%s: tensor '%s': \"shape\" missing or not a list", path,
                       name);
        return TDM_ERR_FORMAT;
    }
    n_dims = json_array_size(shape_json);
    if (n_dims > ENGINE_TENSOR_MAX_DIMS) {
        tdm_errbuf_set(err, err_bytes, "%s: tensor '%s': %zu dimensions, at most %d supported",
                       path, name, n_dims, ENGINE_TENSOR_MAX_DIMS);
        return TDM_ERR_UNSUPPORTED;
    }
    t->n_dims = (int)n_dims;
    for (size_t d = 0; d < n_dims; d++) {
        uint64_t dim;
        if (read_u64(json_array_get(shape_json, d), &dim) != 0) {
            tdm_errbuf_set(err, err_bytes,
                           "%s: tensor '%s': shape entry %zu is not a non-negative integer", path,
                           name, d);
            return TDM_ERR_FORMAT;
        }
        t->shape[d] = (int64_t)dim;
    }
    engine_st_shape_format(t->n_dims, t->shape, shape_text, sizeof(shape_text));

    offsets_json = json_object_get(entry, "data_offsets");
    if (!json_is_array(offsets_json) || json_array_size(offsets_json) != 2 ||
        read_u64(json_array_get(offsets_json, 0), &begin) != 0 ||
        read_u64(json_array_get(offsets_json, 1), &end) != 0) {
        tdm_errbuf_set(err, err_bytes,
                       "%s: tensor '%s': \"data_offsets\" missing or not [begin, end] of "
                       "non-negative integers",
                       path, name);
        return TDM_ERR_FORMAT;
    }
    if (end < begin) {
        tdm_errbuf_set(err, err_bytes,
                       "%s: tensor '%s': data_offsets [%llu, %llu] end before begin", path, name,
                       (unsigned long long)begin, (unsigned long long)end);
        return TDM_ERR_FORMAT;
    }
    if (end > data_bytes) {
        tdm_errbuf_set(err, err_bytes,
                       "%s: tensor '%s': data_offsets [%llu, %llu] past the %llu-byte data region "
                       "(file truncated?)",
                       path, name, (unsigned long long)begin, (unsigned long long)end,
                       (unsigned long long)data_bytes);
        return TDM_ERR_FORMAT;
    }
    if (engine_st_shape_bytes(t->dtype, t->n_dims, t->shape, &need_bytes) != TDM_OK) {
        tdm_errbuf_set(err, err_bytes,
                       "%s: tensor '%s': shape %s of %s overflows a 64-bit byte count", path, name,
                       shape_text, engine_dtype_name(t->dtype));
        return TDM_ERR_FORMAT;
    }
    if (end - begin != need_bytes) {
        tdm_errbuf_set(err, err_bytes,
                       "%s: tensor '%s': data_offsets [%llu, %llu] hold %llu bytes, shape %s of %s "
                       "needs %llu",
                       path, name, (unsigned long long)begin, (unsigned long long)end,
                       (unsigned long long)(end - begin), shape_text, engine_dtype_name(t->dtype),
                       (unsigned long long)need_bytes);
        return TDM_ERR_FORMAT;
    }
    t->data_offset = begin;
    t->n_bytes = (size_t)need_bytes;
    return TDM_OK;
}

static tdm_status_t parse_metadata(engine_st_file_t *file, const json_t *meta_json, char *err,
                                   size_t err_bytes)
{
    size_t n_meta = json_object_size(meta_json);

    if (n_meta == 0) {
        return TDM_OK;
    }
    file->meta = calloc(n_meta, sizeof(*file->meta));
    if (file->meta == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    for (void *it = json_object_iter((json_t *)meta_json); it != NULL;
         it = json_object_iter_next((json_t *)meta_json, it)) {
        const char *key = json_object_iter_key(it);
        const json_t *value = json_object_iter_value(it);
        meta_entry_t *entry = &file->meta[file->n_meta];
        if (!json_is_string(value) ||
            strlen(json_string_value(value)) != json_string_length(value)) {
            tdm_errbuf_set(err, err_bytes,
                           "%s: __metadata__ \"%s\" is not a string without NUL bytes", file->path,
                           key);
            return TDM_ERR_FORMAT;
        }
        entry->key = strdup(key);
        entry->value = strdup(json_string_value(value));
        file->n_meta++;
        if (entry->key == NULL || entry->value == NULL) {
            return TDM_ERR_NO_MEMORY;
        }
    }
    if (file->n_meta > 1) {
        qsort(file->meta, file->n_meta, sizeof(*file->meta), compare_meta_keys);
    }
    return TDM_OK;
}

/* Fails if two non-empty tensors share a byte. */
static tdm_status_t check_overlaps(const engine_st_file_t *file, char *err, size_t err_bytes)
{
    const engine_st_tensor_t **by_offset;
    const engine_st_tensor_t *reach = NULL; /* the tensor reaching furthest so far */
    tdm_status_t status = TDM_OK;

    if (file->n_tensors < 2) {
        return TDM_OK;
    }
    by_offset = malloc(file->n_tensors * sizeof(*by_offset));
    if (by_offset == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    for (size_t i = 0; i < file->n_tensors; i++) {
        by_offset[i] = &file->tensors[i];
    }
    qsort(by_offset, file->n_tensors, sizeof(*by_offset), compare_tensor_ptr_offsets);
    for (size_t i = 0; i < file->n_tensors; i++) {
        const engine_st_tensor_t *t = by_offset[i];
        if (t->n_bytes == 0) {
            continue;
        }
        if (reach != NULL && t->data_offset < reach->data_offset + reach->n_bytes) {
            tdm_errbuf_set(err, err_bytes,
                           "%s: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap",
                           file->path, reach->name, (unsigned long long)reach->data_offset,
                           (unsigned long long)(reach->data_offset + reach->n_bytes), t->name,
                           (unsigned long long)t->data_offset,
                           (unsigned long long)(t->data_offset + t->n_bytes));
            status = TDM_ERR_FORMAT;
            break;
        }
        reach = t;
    }
    free(by_offset);
    return status;
}

/* Parses the JSON header into file->tensors and file->meta. */
static tdm_status_t parse_header(engine_st_file_t *file, char *err, size_t err_bytes)
{
    const char *header = (const char *)file->map + LENGTH_FIELD_BYTES;
    uint64_t data_bytes = file->map_bytes - LENGTH_FIELD_BYTES - file->header_bytes;
    const uint8_t *data = file->map + LENGTH_FIELD_BYTES + file->header_bytes;
    json_t *root = NULL;
    const json_t *meta_json;
    size_t n_tensors;
    size_t pool_bytes = 0;
    size_t pool_used = 0;
    tdm_status_t status;

    if (file->header_bytes == 0 || header[0] != '{') {
        tdm_errbuf_set(err, err_bytes, "%s: header does not start with '{'", file->path);
        return TDM_ERR_FORMAT;
    }
    status =
        tdm_json_load_text(header, (size_t)file->header_bytes, file->path, &root, err, err_bytes);
    if (status != TDM_OK) {
        return status;
    }
    if (!json_is_object(root)) {
        tdm_errbuf_set(err, err_bytes, "%s: header is not a JSON object", file->path);
        status = TDM_ERR_FORMAT;
        goto out_decref;
    }

    meta_json = json_object_get(root, ENGINE_ST_METADATA_KEY);
    n_tensors = json_object_size(root);
    if (meta_json != NULL) {
        if (!json_is_object(meta_json)) {
            tdm_errbuf_set(err, err_bytes, "%s: __metadata__ is not a JSON object", file->path);
            status = TDM_ERR_FORMAT;
            goto out_decref;
        }
        status = parse_metadata(file, meta_json, err, err_bytes);
        if (status != TDM_OK) {
            goto out_decref;
        }
        n_tensors--;
    }

    for (void *it = json_object_iter(root); it != NULL; it = json_object_iter_next(root, it)) {
        if (json_object_iter_value(it) != meta_json) {
            pool_bytes += strlen(json_object_iter_key(it)) + 1;
        }
    }
    if (n_tensors > 0) {
        file->tensors = calloc(n_tensors, sizeof(*file->tensors));
        file->name_pool = malloc(pool_bytes);
        if (file->tensors == NULL || file->name_pool == NULL) {
            status = TDM_ERR_NO_MEMORY;
            goto out_decref;
        }
    }
    for (void *it = json_object_iter(root); it != NULL; it = json_object_iter_next(root, it)) {
        const char *key = json_object_iter_key(it);
        const json_t *value = json_object_iter_value(it);
        engine_st_tensor_t *t;
        size_t key_bytes;
        if (value == meta_json) {
            continue;
        }
        if (key[0] == '\0') {
            tdm_errbuf_set(err, err_bytes, "%s: a tensor has an empty name", file->path);
            status = TDM_ERR_FORMAT;
            goto out_decref;
        }
        t = &file->tensors[file->n_tensors];
        status = parse_tensor_entry(file->path, key, value, data_bytes, t, err, err_bytes);
        if (status != TDM_OK) {
            goto out_decref;
        }
        key_bytes = strlen(key) + 1;
        memcpy(file->name_pool + pool_used, key, key_bytes);
        t->name = file->name_pool + pool_used;
        t->data = data + t->data_offset;
        pool_used += key_bytes;
        file->n_tensors++;
    }
    if (file->n_tensors > 1) {
        qsort(file->tensors, file->n_tensors, sizeof(*file->tensors), compare_tensor_names);
    }
    status = check_overlaps(file, err, err_bytes);

out_decref:
    json_decref(root);
    return status;
}

static void free_file(engine_st_file_t *file)
{
    for (size_t i = 0; i < file->n_meta; i++) {
        free(file->meta[i].key);
        free(file->meta[i].value);
    }
    free(file->meta);
    free(file->tensors);
    free(file->name_pool);
    if (file->anon != NULL) {
        munmap(file->anon, file->anon_bytes);
    } else if (file->map != NULL) {
        munmap((void *)file->map, file->map_bytes);
    }
    free(file->path);
    free(file);
}

/* Opens, checks and maps the file; sets file->map, map_bytes and header_bytes. */
static tdm_status_t map_file(engine_st_file_t *file, char *err, size_t err_bytes)
{
    struct stat st;
    void *map;
    uint64_t header_bytes = 0;
    int fd;
    tdm_status_t status = TDM_OK;

    fd = open(file->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        tdm_errbuf_set(err, err_bytes, "%s: %s", file->path, strerror(errno));
        return errno == ENOENT ? TDM_ERR_NOT_FOUND : TDM_ERR_IO;
    }
    if (fstat(fd, &st) != 0) {
        tdm_errbuf_set(err, err_bytes, "%s: fstat: %s", file->path, strerror(errno));
        status = TDM_ERR_IO;
        goto out_close;
    }
    if (!S_ISREG(st.st_mode)) {
        tdm_errbuf_set(err, err_bytes, "%s: not a regular file", file->path);
        status = TDM_ERR_IO;
        goto out_close;
    }
    if ((uint64_t)st.st_size < LENGTH_FIELD_BYTES) {
        tdm_errbuf_set(err, err_bytes, "%s: %lld bytes, shorter than the 8-byte header length",
                       file->path, (long long)st.st_size);
        status = TDM_ERR_FORMAT;
        goto out_close;
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        tdm_errbuf_set(err, err_bytes, "%s: %lld bytes do not fit the address space", file->path,
                       (long long)st.st_size);
        status = TDM_ERR_UNSUPPORTED;
        goto out_close;
    }
    map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        tdm_errbuf_set(err, err_bytes, "%s: mmap of %lld bytes: %s", file->path,
                       (long long)st.st_size, strerror(errno));
        status = TDM_ERR_IO;
        goto out_close;
    }
    file->map = map;
    file->map_bytes = (size_t)st.st_size;
    for (unsigned b = 0; b < LENGTH_FIELD_BYTES; b++) {
        header_bytes |= (uint64_t)file->map[b] << (8 * b);
    }
    if (header_bytes > ENGINE_ST_MAX_HEADER_BYTES) {
        tdm_errbuf_set(err, err_bytes, "%s: header length %llu exceeds the %u-byte limit",
                       file->path, (unsigned long long)header_bytes, ENGINE_ST_MAX_HEADER_BYTES);
        status = TDM_ERR_FORMAT;
        goto out_close;
    }
    if (header_bytes > file->map_bytes - LENGTH_FIELD_BYTES) {
        tdm_errbuf_set(err, err_bytes,
                       "%s: header length %llu runs past the end of the %zu-byte file (truncated?)",
                       file->path, (unsigned long long)header_bytes, file->map_bytes);
        status = TDM_ERR_FORMAT;
        goto out_close;
    }
    file->header_bytes = header_bytes;

out_close:
    close(fd);
    return status;
}

tdm_status_t engine_st_file_copy_resident(engine_st_file_t *file, uint64_t *huge_bytes_out,
                                          char *err, size_t err_bytes)
{
    const size_t huge = (size_t)ENGINE_ST_HUGE_PAGE_BYTES;

    if (file == NULL || file->map == NULL) {
        tdm_errbuf_set(err, err_bytes, "engine_st_file_copy_resident: an open file is required");
        return TDM_ERR_INVALID_ARG;
    }
    if (file->anon != NULL) {
        if (huge_bytes_out != NULL) {
            *huge_bytes_out = 0;
        }
        return TDM_OK;
    }
    /* whole huge pages, one more to align the start */
    size_t len = (file->map_bytes + huge - 1) / huge * huge;
    size_t raw_bytes = len + huge;
    uint8_t *raw =
        mmap(NULL, raw_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) {
        int e = errno;
        tdm_errbuf_set(err, err_bytes, "%s: %zu bytes of anonymous memory for the weights: %s",
                       file->path, raw_bytes, strerror(e));
        return e == ENOMEM ? TDM_ERR_NO_MEMORY : TDM_ERR_IO;
    }
    uint8_t *base = (uint8_t *)(((uintptr_t)raw + huge - 1) / huge * huge);
    /* the unaligned head and the tail past len go back at once */
    if (base > raw) {
        munmap(raw, (size_t)(base - raw));
    }
    if (raw + raw_bytes > base + len) {
        munmap(base + len, (size_t)(raw + raw_bytes - (base + len)));
    }
    /* advice only: without transparent huge pages (or with them off) the copy still works on
     * 4 KiB pages */
    uint64_t huge_bytes = madvise(base, len, MADV_HUGEPAGE) == 0 ? (uint64_t)len : 0;
    memcpy(base, file->map, file->map_bytes);
    if (mprotect(base, len, PROT_READ) != 0) {
        int e = errno;
        tdm_errbuf_set(err, err_bytes, "%s: mprotect of the weights' copy: %s", file->path,
                       strerror(e));
        munmap(base, len);
        return TDM_ERR_IO;
    }
    for (size_t i = 0; i < file->n_tensors; i++) {
        engine_st_tensor_t *t = &file->tensors[i];
        t->data = base + ((const uint8_t *)t->data - file->map);
    }
    munmap((void *)file->map, file->map_bytes);
    file->map = base;
    file->anon = base;
    file->anon_bytes = len;
    if (huge_bytes_out != NULL) {
        *huge_bytes_out = huge_bytes;
    }
    return TDM_OK;
}

tdm_status_t engine_st_file_open(const char *path, engine_st_file_t **file_out, char *err,
                                 size_t err_bytes)
{
    engine_st_file_t *file;
    tdm_status_t status;

    if (path == NULL || file_out == NULL) {
        tdm_errbuf_set(err, err_bytes, "engine_st_file_open: path and file_out are required");
        return TDM_ERR_INVALID_ARG;
    }
    file = calloc(1, sizeof(*file));
    if (file == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    file->path = strdup(path);
    if (file->path == NULL) {
        status = TDM_ERR_NO_MEMORY;
        goto err_free_file;
    }
    status = map_file(file, err, err_bytes);
    if (status != TDM_OK) {
        goto err_free_file;
    }
    status = parse_header(file, err, err_bytes);
    if (status != TDM_OK) {
        goto err_free_file;
    }
    *file_out = file;
    return TDM_OK;

err_free_file:
    if (status == TDM_ERR_NO_MEMORY) {
        tdm_errbuf_set(err, err_bytes, "%s: out of memory", path);
    }
    free_file(file);
    return status;
}

void engine_st_file_close(engine_st_file_t *file)
{
    if (file != NULL) {
        free_file(file);
    }
}

const char *engine_st_file_path(const engine_st_file_t *file)
{
    return file->path;
}

size_t engine_st_file_n_tensors(const engine_st_file_t *file)
{
    return file->n_tensors;
}

const engine_st_tensor_t *engine_st_file_tensor_at(const engine_st_file_t *file, size_t i)
{
    if (i >= file->n_tensors) {
        return NULL;
    }
    return &file->tensors[i];
}

const engine_st_tensor_t *engine_st_file_find(const engine_st_file_t *file, const char *name)
{
    if (file->n_tensors == 0) {
        return NULL;
    }
    return bsearch(name, file->tensors, file->n_tensors, sizeof(*file->tensors),
                   compare_name_to_tensor);
}

const char *engine_st_file_metadata(const engine_st_file_t *file, const char *key)
{
    const meta_entry_t *entry;

    if (file->n_meta == 0) {
        return NULL;
    }
    entry = bsearch(key, file->meta, file->n_meta, sizeof(*file->meta), compare_key_to_meta);
    return entry != NULL ? entry->value : NULL;
}

size_t engine_st_file_n_metadata(const engine_st_file_t *file)
{
    return file->n_meta;
}

tdm_status_t engine_st_file_metadata_at(const engine_st_file_t *file, size_t i,
                                        const char **key_out, const char **value_out)
{
    if (i >= file->n_meta) {
        return TDM_ERR_INVALID_ARG;
    }
    *key_out = file->meta[i].key;
    *value_out = file->meta[i].value;
    return TDM_OK;
}

uint64_t engine_st_file_header_bytes(const engine_st_file_t *file)
{
    return file->header_bytes;
}
