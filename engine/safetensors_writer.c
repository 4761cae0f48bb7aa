/* safetensors_writer.c - engine_st_writer_*: collect tensors, write one deterministic file.
 * The reader and the shape helpers are in safetensors.c. */
#include "engine/safetensors.h"

#include "common/buf.h"
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LENGTH_FIELD_BYTES 8u /* the little-endian u64 before the header */

typedef struct {
    char *key;
    char *value;
} meta_entry_t;

typedef struct {
    char *name;
    engine_dtype_t dtype;
    int n_dims;
    int64_t shape[ENGINE_TENSOR_MAX_DIMS];
    void *data;
    size_t n_bytes;
} queued_tensor_t;

struct engine_st_writer {
    char *path;
    queued_tensor_t *tensors;
    size_t n_tensors;
    size_t cap_tensors;
    meta_entry_t *meta;
    size_t n_meta;
    size_t cap_meta;
    int finished;
};

/* Strict UTF-8 (no overlongs, surrogates or code points past U+10FFFF). */
static int utf8_valid(const char *text)
{
    const unsigned char *s = (const unsigned char *)text;

    while (*s != 0) {
        unsigned c = *s;
        int n_more;
        unsigned min_cp;
        unsigned cp;

        if (c < 0x80) {
            s++;
            continue;
        }
        if ((c & 0xE0) == 0xC0) {
            n_more = 1;
            min_cp = 0x80;
            cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            n_more = 2;
            min_cp = 0x800;
            cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            n_more = 3;
            min_cp = 0x10000;
            cp = c & 0x07;
        } else {
            return 0;
        }
        for (int k = 1; k <= n_more; k++) {
            if ((s[k] & 0xC0) != 0x80) {
                return 0;
            }
            cp = (cp << 6) | (s[k] & 0x3F);
        }
        if (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
            return 0;
        }
        s += 1 + n_more;
    }
    return 1;
}

static int compare_meta_keys(const void *a, const void *b)
{
    const meta_entry_t *ma = a;
    const meta_entry_t *mb = b;

    return strcmp(ma->key, mb->key);
}

tdm_status_t engine_st_writer_create(const char *path, engine_st_writer_t **writer_out)
{
    engine_st_writer_t *writer;

    if (path == NULL || path[0] == '\0' || writer_out == NULL) {
        tdm_log(TDM_LOG_WARN, "safetensors", "writer rejected: path and writer_out required");
        return TDM_ERR_INVALID_ARG;
    }
    writer = calloc(1, sizeof(*writer));
    if (writer == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    writer->path = strdup(path);
    if (writer->path == NULL) {
        free(writer);
        return TDM_ERR_NO_MEMORY;
    }
    *writer_out = writer;
    return TDM_OK;
}

static tdm_status_t validate_add(const engine_st_writer_t *writer, const char *name,
                                 engine_dtype_t dtype, int n_dims, const int64_t *shape,
                                 const void *data, size_t n_bytes)
{
    uint64_t need_bytes;
    const char *path = writer->path;

    if (writer->finished) {
        tdm_log(TDM_LOG_WARN, "safetensors", "add after finish: path=%s", path);
        return TDM_ERR_INVALID_ARG;
    }
    if (name == NULL || name[0] == '\0' || strcmp(name, ENGINE_ST_METADATA_KEY) == 0 ||
        !utf8_valid(name)) {
        tdm_log(TDM_LOG_WARN, "safetensors",
                "add rejected: name empty, reserved or not UTF-8: path=%s", path);
        return TDM_ERR_INVALID_ARG;
    }
    if (engine_dtype_size_bytes(dtype) == 0) {
        tdm_log(TDM_LOG_WARN, "safetensors", "add rejected: bad dtype: path=%s tensor=%s dtype=%d",
                path, name, (int)dtype);
        return TDM_ERR_INVALID_ARG;
    }
    if (n_dims < 0 || n_dims > ENGINE_TENSOR_MAX_DIMS || (n_dims > 0 && shape == NULL)) {
        tdm_log(TDM_LOG_WARN, "safetensors", "add rejected: n_dims=%d allowed=0..%d tensor=%s",
                n_dims, ENGINE_TENSOR_MAX_DIMS, name);
        return TDM_ERR_INVALID_ARG;
    }
    for (int d = 0; d < n_dims; d++) {
        if (shape[d] < 0) {
            tdm_log(TDM_LOG_WARN, "safetensors", "add rejected: negative dim %d tensor=%s", d,
                    name);
            return TDM_ERR_INVALID_ARG;
        }
    }
    if (engine_st_shape_bytes(dtype, n_dims, shape, &need_bytes) != TDM_OK ||
        need_bytes != n_bytes || (data == NULL && n_bytes > 0)) {
        tdm_log(TDM_LOG_WARN, "safetensors",
                "add rejected: data does not match shape: tensor=%s n_bytes=%zu", name, n_bytes);
        return TDM_ERR_INVALID_ARG;
    }
    return TDM_OK;
}

tdm_status_t engine_st_writer_add(engine_st_writer_t *writer, const char *name,
                                  engine_dtype_t dtype, int n_dims, const int64_t *shape,
                                  const void *data, size_t n_bytes)
{
    queued_tensor_t *t;
    tdm_status_t status;

    if (writer == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    status = validate_add(writer, name, dtype, n_dims, shape, data, n_bytes);
    if (status != TDM_OK) {
        return status;
    }
    if (writer->n_tensors == writer->cap_tensors) {
        queued_tensor_t *grown = tdm_array_grow(writer->tensors, sizeof(*grown),
                                                writer->n_tensors + 1, 16, &writer->cap_tensors);
        if (grown == NULL) {
            return TDM_ERR_NO_MEMORY;
        }
        writer->tensors = grown;
    }
    t = &writer->tensors[writer->n_tensors];
    memset(t, 0, sizeof(*t));
    t->name = strdup(name);
    if (t->name == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    if (n_bytes > 0) {
        t->data = malloc(n_bytes);
        if (t->data == NULL) {
            free(t->name);
            return TDM_ERR_NO_MEMORY;
        }
        memcpy(t->data, data, n_bytes);
    }
    t->dtype = dtype;
    t->n_dims = n_dims;
    for (int d = 0; d < n_dims; d++) {
        t->shape[d] = shape[d];
    }
    t->n_bytes = n_bytes;
    writer->n_tensors++;
    return TDM_OK;
}

tdm_status_t engine_st_writer_set_metadata(engine_st_writer_t *writer, const char *key,
                                           const char *value)
{
    char *key_copy;
    char *value_copy;

    if (writer == NULL || key == NULL || value == NULL || key[0] == '\0' || writer->finished ||
        !utf8_valid(key) || !utf8_valid(value)) {
        tdm_log(TDM_LOG_WARN, "safetensors", "metadata rejected: key=%s", key ? key : "(null)");
        return TDM_ERR_INVALID_ARG;
    }
    value_copy = strdup(value);
    if (value_copy == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    for (size_t i = 0; i < writer->n_meta; i++) {
        if (strcmp(writer->meta[i].key, key) == 0) {
            free(writer->meta[i].value);
            writer->meta[i].value = value_copy;
            return TDM_OK;
        }
    }
    if (writer->n_meta == writer->cap_meta) {
        meta_entry_t *grown =
            tdm_array_grow(writer->meta, sizeof(*grown), writer->n_meta + 1, 4, &writer->cap_meta);
        if (grown == NULL) {
            free(value_copy);
            return TDM_ERR_NO_MEMORY;
        }
        writer->meta = grown;
    }
    key_copy = strdup(key);
    if (key_copy == NULL) {
        free(value_copy);
        return TDM_ERR_NO_MEMORY;
    }
    writer->meta[writer->n_meta].key = key_copy;
    writer->meta[writer->n_meta].value = value_copy;
    writer->n_meta++;
    return TDM_OK;
}

static int compare_queued_names(const void *a, const void *b)
{
    const queued_tensor_t *ta = a;
    const queued_tensor_t *tb = b;

    return strcmp(ta->name, tb->name);
}

/* The compact JSON header text (caller frees), tensors and metadata already sorted. */
static char *build_header_json(const engine_st_writer_t *writer)
{
    json_t *root = json_object();
    json_t *meta;
    char *text = NULL;
    uint64_t offset = 0;
    int failed = root == NULL;

    if (!failed && writer->n_meta > 0) {
        meta = json_object();
        failed = meta == NULL || json_object_set_new(root, ENGINE_ST_METADATA_KEY, meta) != 0;
        for (size_t i = 0; i < writer->n_meta && !failed; i++) {
            failed = json_object_set_new(meta, writer->meta[i].key,
                                         json_string(writer->meta[i].value)) != 0;
        }
    }
    for (size_t i = 0; i < writer->n_tensors && !failed; i++) {
        const queued_tensor_t *t = &writer->tensors[i];
        json_t *entry = json_object();
        json_t *shape = json_array();
        json_t *offsets = json_array();

        failed = entry == NULL || shape == NULL || offsets == NULL;
        for (int d = 0; d < t->n_dims && !failed; d++) {
            failed = json_array_append_new(shape, json_integer((json_int_t)t->shape[d])) != 0;
        }
        failed =
            failed || json_array_append_new(offsets, json_integer((json_int_t)offset)) != 0 ||
            json_array_append_new(offsets, json_integer((json_int_t)(offset + t->n_bytes))) != 0;
        failed =
            failed ||
            json_object_set_new(entry, "dtype", json_string(engine_dtype_name(t->dtype))) != 0 ||
            json_object_set(entry, "shape", shape) != 0 ||
            json_object_set(entry, "data_offsets", offsets) != 0 ||
            json_object_set(root, t->name, entry) != 0;
        json_decref(entry);
        json_decref(shape);
        json_decref(offsets);
        offset += t->n_bytes;
    }
    if (!failed) {
        text = json_dumps(root, JSON_COMPACT);
    }
    json_decref(root);
    return text;
}

/* Writes all n_bytes or fails with errno set. */
static int write_all(int fd, const void *data, size_t n_bytes)
{
    const uint8_t *p = data;

    while (n_bytes > 0) {
        ssize_t n = write(fd, p, n_bytes);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            return -1;
        }
        p += n;
        n_bytes -= (size_t)n;
    }
    return 0;
}

/* Writes the length field, header and data to fd. */
static int write_contents(int fd, const char *header, size_t header_bytes,
                          const engine_st_writer_t *writer)
{
    uint8_t length_field[LENGTH_FIELD_BYTES];
    size_t text_bytes = strlen(header);
    static const char spaces[ENGINE_ST_HEADER_ALIGN_BYTES + 1] = "        ";

    for (unsigned b = 0; b < LENGTH_FIELD_BYTES; b++) {
        length_field[b] = (uint8_t)((uint64_t)header_bytes >> (8 * b));
    }
    if (write_all(fd, length_field, sizeof(length_field)) != 0 ||
        write_all(fd, header, text_bytes) != 0 ||
        write_all(fd, spaces, header_bytes - text_bytes) != 0) {
        return -1;
    }
    for (size_t i = 0; i < writer->n_tensors; i++) {
        if (write_all(fd, writer->tensors[i].data, writer->tensors[i].n_bytes) != 0) {
            return -1;
        }
    }
    return 0;
}

tdm_status_t engine_st_writer_finish(engine_st_writer_t *writer)
{
    char *header = NULL;
    char *tmp_path = NULL;
    size_t header_bytes;
    size_t tmp_path_bytes;
    int fd;
    tdm_status_t status = TDM_OK;

    if (writer == NULL || writer->finished) {
        tdm_log(TDM_LOG_WARN, "safetensors", "finish rejected: no writer or already finished");
        return TDM_ERR_INVALID_ARG;
    }
    writer->finished = 1;
    if (writer->n_tensors > 1) {
        qsort(writer->tensors, writer->n_tensors, sizeof(*writer->tensors), compare_queued_names);
    }
    if (writer->n_meta > 1) {
        qsort(writer->meta, writer->n_meta, sizeof(*writer->meta), compare_meta_keys);
    }
    for (size_t i = 1; i < writer->n_tensors; i++) {
        if (strcmp(writer->tensors[i - 1].name, writer->tensors[i].name) == 0) {
            tdm_log(TDM_LOG_ERROR, "safetensors",
                    "write rejected: duplicate tensor: path=%s "
                    "tensor=%s",
                    writer->path, writer->tensors[i].name);
            return TDM_ERR_INVALID_ARG;
        }
    }

    header = build_header_json(writer);
    if (header == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    header_bytes = strlen(header);
    header_bytes += (ENGINE_ST_HEADER_ALIGN_BYTES - header_bytes % ENGINE_ST_HEADER_ALIGN_BYTES) %
                    ENGINE_ST_HEADER_ALIGN_BYTES;

    tmp_path_bytes = strlen(writer->path) + 32;
    tmp_path = malloc(tmp_path_bytes);
    if (tmp_path == NULL) {
        status = TDM_ERR_NO_MEMORY;
        goto out_free_header;
    }
    snprintf(tmp_path, tmp_path_bytes, "%s.tmp.%ld", writer->path, (long)getpid());
    fd = open(tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        tdm_log(TDM_LOG_ERROR, "safetensors", "create failed: path=%s: %s", tmp_path,
                strerror(errno));
        status = TDM_ERR_IO;
        goto out_free_tmp_path;
    }
    if (write_contents(fd, header, header_bytes, writer) != 0) {
        tdm_log(TDM_LOG_ERROR, "safetensors", "write failed: path=%s: %s", tmp_path,
                strerror(errno));
        status = TDM_ERR_IO;
        close(fd);
        goto out_unlink;
    }
    if (close(fd) != 0) {
        tdm_log(TDM_LOG_ERROR, "safetensors", "close failed: path=%s: %s", tmp_path,
                strerror(errno));
        status = TDM_ERR_IO;
        goto out_unlink;
    }
    if (rename(tmp_path, writer->path) != 0) {
        tdm_log(TDM_LOG_ERROR, "safetensors", "rename failed: from=%s to=%s: %s", tmp_path,
                writer->path, strerror(errno));
        status = TDM_ERR_IO;
        goto out_unlink;
    }
    goto out_free_tmp_path;

out_unlink:
    unlink(tmp_path);
out_free_tmp_path:
    free(tmp_path);
out_free_header:
    free(header);
    return status;
}

void engine_st_writer_destroy(engine_st_writer_t *writer)
{
    if (writer == NULL) {
        return;
    }
    for (size_t i = 0; i < writer->n_tensors; i++) {
        free(writer->tensors[i].name);
        free(writer->tensors[i].data);
    }
    free(writer->tensors);
    for (size_t i = 0; i < writer->n_meta; i++) {
        free(writer->meta[i].key);
        free(writer->meta[i].value);
    }
    free(writer->meta);
    free(writer->path);
    free(writer);
}
