/* buf.c - the growable byte buffer (common/buf.h). */
#include "common/buf.h"

#include "common/log.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BUF_READ_CHUNK_BYTES 65536

void tdm_buf_fini(tdm_buf_t *buf)
{
    free(buf->data);
    buf->data = NULL;
    buf->n_bytes = 0;
    buf->capacity = 0;
}

void tdm_buf_reset(tdm_buf_t *buf)
{
    buf->n_bytes = 0;
    if (buf->data != NULL) {
        buf->data[0] = '\0';
    }
}

/* The growth policy of tdm_buf_t and tdm_array_grow: double from `capacity` (min_capacity when
 * 0) until `need` fits; `need` itself when doubling would overflow. */
static size_t grown_capacity(size_t capacity, size_t need, size_t min_capacity)
{
    capacity = capacity == 0 ? (min_capacity > 0 ? min_capacity : 1) : capacity;
    while (capacity < need) {
        capacity = capacity > SIZE_MAX / 2 ? need : capacity * 2;
    }
    return capacity;
}

void *tdm_array_grow(void *items, size_t elem_bytes, size_t n_needed, size_t min_capacity,
                     size_t *capacity)
{
    size_t n_items;
    void *grown;

    if (n_needed <= *capacity) {
        return items;
    }
    n_items = grown_capacity(*capacity, n_needed, min_capacity);
    if (elem_bytes == 0 || n_items > SIZE_MAX / elem_bytes) {
        return NULL;
    }
    grown = realloc(items, n_items * elem_bytes);
    if (grown != NULL) {
        *capacity = n_items;
    }
    return grown;
}

tdm_status_t tdm_buf_reserve(tdm_buf_t *buf, size_t n_more)
{
    size_t need;
    size_t capacity;
    char *grown;

    if (n_more > SIZE_MAX - 1 - buf->n_bytes) {
        return TDM_ERR_NO_MEMORY;
    }
    need = buf->n_bytes + n_more + 1;
    if (need <= buf->capacity) {
        return TDM_OK;
    }
    capacity = grown_capacity(buf->capacity, need, TDM_BUF_MIN_CAPACITY);
    grown = realloc(buf->data, capacity);
    if (grown == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    if (buf->data == NULL) {
        grown[0] = '\0';
    }
    buf->data = grown;
    buf->capacity = capacity;
    return TDM_OK;
}

tdm_status_t tdm_buf_append(tdm_buf_t *buf, const void *bytes, size_t n_bytes)
{
    tdm_status_t status = tdm_buf_reserve(buf, n_bytes);

    if (status != TDM_OK) {
        return status;
    }
    if (n_bytes > 0) {
        memcpy(buf->data + buf->n_bytes, bytes, n_bytes);
    }
    buf->n_bytes += n_bytes;
    buf->data[buf->n_bytes] = '\0';
    return TDM_OK;
}

tdm_status_t tdm_buf_vprintf(tdm_buf_t *buf, const char *fmt, va_list args)
{
    va_list again;
    int n;
    tdm_status_t status;

    va_copy(again, args);
    n = vsnprintf(NULL, 0, fmt, args);
    if (n < 0) {
        va_end(again);
        return TDM_ERR_INVALID_ARG;
    }
    status = tdm_buf_reserve(buf, (size_t)n);
    if (status == TDM_OK) {
        vsnprintf(buf->data + buf->n_bytes, (size_t)n + 1, fmt, again);
        buf->n_bytes += (size_t)n;
    }
    va_end(again);
    return status;
}

tdm_status_t tdm_buf_printf(tdm_buf_t *buf, const char *fmt, ...)
{
    va_list args;
    tdm_status_t status;

    va_start(args, fmt);
    status = tdm_buf_vprintf(buf, fmt, args);
    va_end(args);
    return status;
}

void tdm_buf_truncate(tdm_buf_t *buf, size_t n_bytes)
{
    if (n_bytes < buf->n_bytes) {
        buf->n_bytes = n_bytes;
        buf->data[n_bytes] = '\0';
    }
}

void tdm_buf_consume(tdm_buf_t *buf, size_t n_bytes)
{
    if (n_bytes >= buf->n_bytes) {
        tdm_buf_reset(buf);
        return;
    }
    memmove(buf->data, buf->data + n_bytes, buf->n_bytes - n_bytes);
    buf->n_bytes -= n_bytes;
    buf->data[buf->n_bytes] = '\0';
}

char *tdm_buf_take(tdm_buf_t *buf, size_t *n_bytes_out)
{
    char *data;

    if (buf->data == NULL && tdm_buf_reserve(buf, 0) != TDM_OK) {
        return NULL;
    }
    data = buf->data;
    if (n_bytes_out != NULL) {
        *n_bytes_out = buf->n_bytes;
    }
    buf->data = NULL;
    buf->n_bytes = 0;
    buf->capacity = 0;
    return data;
}

tdm_status_t tdm_buf_read_file(tdm_buf_t *buf, const char *path)
{
    FILE *file = fopen(path, "rb");
    char chunk[BUF_READ_CHUNK_BYTES];
    tdm_status_t status = TDM_OK;
    size_t n;

    tdm_buf_reset(buf);
    if (file == NULL) {
        int err = errno;
        if (err == ENOENT) {
            return TDM_ERR_NOT_FOUND;
        }
        tdm_log(TDM_LOG_ERROR, "buf", "open failed: path=%s err=%s", path, strerror(err));
        return TDM_ERR_IO;
    }
    while ((n = fread(chunk, 1, sizeof(chunk), file)) > 0) {
        status = tdm_buf_append(buf, chunk, n);
        if (status != TDM_OK) {
            break;
        }
    }
    if (status == TDM_OK && ferror(file)) {
        tdm_log(TDM_LOG_ERROR, "buf", "read failed: path=%s err=%s", path, strerror(errno));
        status = TDM_ERR_IO;
    }
    fclose(file);
    if (status == TDM_OK) {
        status = tdm_buf_reserve(buf, 0); /* an empty file still gives a "" */
    }
    if (status != TDM_OK) {
        tdm_buf_reset(buf);
    }
    return status;
}
