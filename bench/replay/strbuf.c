/* strbuf.c - growable byte buffer; see strbuf.h. */
#include "bench/replay/strbuf.h"

#include "common/log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STRBUF_MIN_CAPACITY     256
#define STRBUF_READ_CHUNK_BYTES 65536

void bench_strbuf_fini(bench_strbuf_t *buf)
{
    free(buf->data);
    buf->data = NULL;
    buf->n_bytes = 0;
    buf->capacity = 0;
}

void bench_strbuf_reset(bench_strbuf_t *buf)
{
    buf->n_bytes = 0;
    if (buf->data != NULL) {
        buf->data[0] = '\0';
    }
}

static tdm_status_t reserve(bench_strbuf_t *buf, size_t n_more)
{
    size_t need = buf->n_bytes + n_more + 1;
    size_t capacity = buf->capacity == 0 ? STRBUF_MIN_CAPACITY : buf->capacity;
    char *grown;

    if (need <= buf->capacity) {
        return TDM_OK;
    }
    while (capacity < need) {
        capacity *= 2;
    }
    grown = realloc(buf->data, capacity);
    if (grown == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    buf->data = grown;
    buf->capacity = capacity;
    return TDM_OK;
}

tdm_status_t bench_strbuf_append(bench_strbuf_t *buf, const void *bytes, size_t n_bytes)
{
    tdm_status_t status = reserve(buf, n_bytes);

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

tdm_status_t bench_strbuf_printf(bench_strbuf_t *buf, const char *fmt, ...)
{
    va_list args;
    int n;
    tdm_status_t status;

    va_start(args, fmt);
    n = vsnprintf(NULL, 0, fmt, args);
    va_end(args);
    if (n < 0) {
        return TDM_ERR_INVALID_ARG;
    }
    status = reserve(buf, (size_t)n);
    if (status != TDM_OK) {
        return status;
    }
    va_start(args, fmt);
    vsnprintf(buf->data + buf->n_bytes, (size_t)n + 1, fmt, args);
    va_end(args);
    buf->n_bytes += (size_t)n;
    return TDM_OK;
}

void bench_strbuf_consume(bench_strbuf_t *buf, size_t n_bytes)
{
    if (n_bytes >= buf->n_bytes) {
        bench_strbuf_reset(buf);
        return;
    }
    memmove(buf->data, buf->data + n_bytes, buf->n_bytes - n_bytes);
    buf->n_bytes -= n_bytes;
    buf->data[buf->n_bytes] = '\0';
}

tdm_status_t bench_strbuf_read_file(bench_strbuf_t *buf, const char *path)
{
    FILE *file = fopen(path, "rb");
    char chunk[STRBUF_READ_CHUNK_BYTES];
    tdm_status_t status = TDM_OK;
    size_t n;

    if (file == NULL) {
        int err = errno;
        if (err == ENOENT) {
            return TDM_ERR_NOT_FOUND;
        }
        tdm_log(TDM_LOG_ERROR, "bench", "open failed: path=%s err=%s", path, strerror(err));
        return TDM_ERR_IO;
    }
    bench_strbuf_reset(buf);
    while ((n = fread(chunk, 1, sizeof(chunk), file)) > 0) {
        status = bench_strbuf_append(buf, chunk, n);
        if (status != TDM_OK) {
            break;
        }
    }
    if (status == TDM_OK && ferror(file)) {
        tdm_log(TDM_LOG_ERROR, "bench", "read failed: path=%s err=%s", path, strerror(errno));
        status = TDM_ERR_IO;
    }
    fclose(file);
    if (status == TDM_OK && buf->data == NULL) {
        status = bench_strbuf_append(buf, "", 0);
    }
    return status;
}
