/* buf.h - the growable byte buffer (request and response bodies, SSE text, report text, string
 * pools, files read whole) and the same growth for typed arrays (tdm_array_grow).
 *
 * Owns its heap storage. Capacity doubles from TDM_BUF_MIN_CAPACITY; a failed growth returns
 * TDM_ERR_NO_MEMORY and leaves the buffer as it was. Whenever data is not NULL the used bytes are
 * followed by a NUL, so text can be read as a C string (binary contents may hold NULs of their
 * own). Not thread-safe: one buffer, one thread at a time. Knows nothing of HTTP, JSON or files
 * beyond tdm_buf_read_file.
 */
#ifndef TANDEM_COMMON_BUF_H
#define TANDEM_COMMON_BUF_H

#include <stdarg.h>
#include <stddef.h>

#include "common/status.h"

/* Capacity of the first allocation, bytes. */
#define TDM_BUF_MIN_CAPACITY 256

/* Plain data: zero-initialised is an empty buffer. `data` may be NULL while empty; read the
 * fields, change them only through the functions below. */
typedef struct {
    char *data;      /* capacity bytes, data[n_bytes] == '\0'; NULL until the first growth */
    size_t n_bytes;  /* used, excluding the terminating NUL */
    size_t capacity; /* allocated bytes (>= n_bytes + 1 once allocated) */
} tdm_buf_t;

/* tdm_buf_fini - free the storage; accepts a zeroed buffer; leaves it zeroed. */
void tdm_buf_fini(tdm_buf_t *buf);

/* tdm_buf_reset - empty the buffer, keeping its storage. */
void tdm_buf_reset(tdm_buf_t *buf);

/*
 * tdm_buf_reserve - make room for n_more bytes after the used ones (plus the NUL), doubling the
 * capacity from TDM_BUF_MIN_CAPACITY until it fits. Contents and n_bytes are unchanged.
 *
 * Returns TDM_OK, or TDM_ERR_NO_MEMORY (the buffer unchanged, its old storage still valid) when
 * the allocation fails or n_bytes + n_more + 1 exceeds SIZE_MAX.
 */
tdm_status_t tdm_buf_reserve(tdm_buf_t *buf, size_t n_more);

/* tdm_buf_append - add n_bytes from `bytes` (may be NULL when n_bytes is 0). TDM_OK or
 * TDM_ERR_NO_MEMORY (unchanged). After TDM_OK data is not NULL. */
tdm_status_t tdm_buf_append(tdm_buf_t *buf, const void *bytes, size_t n_bytes);

/* tdm_buf_printf - append printf-style text. TDM_OK, TDM_ERR_NO_MEMORY (unchanged) or
 * TDM_ERR_INVALID_ARG (an encoding error in vsnprintf; unchanged). */
tdm_status_t tdm_buf_printf(tdm_buf_t *buf, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* tdm_buf_vprintf - tdm_buf_printf with a va_list (consumed). */
tdm_status_t tdm_buf_vprintf(tdm_buf_t *buf, const char *fmt, va_list args)
    __attribute__((format(printf, 2, 0)));

/* tdm_buf_truncate - keep the first n_bytes (nothing changes when n_bytes >= the used bytes),
 * NUL after them. Keeps the storage. */
void tdm_buf_truncate(tdm_buf_t *buf, size_t n_bytes);

/* tdm_buf_consume - drop the first n_bytes (all of them when n_bytes >= n_bytes used), moving the
 * rest down. Keeps the storage. */
void tdm_buf_consume(tdm_buf_t *buf, size_t n_bytes);

/*
 * tdm_buf_take - hand the contents to the caller: returns the NUL-terminated storage (an empty
 * buffer gives a new "" allocation) with its length in *n_bytes_out (may be NULL), and leaves the
 * buffer zeroed. The caller frees the result with free(). Returns NULL on TDM_ERR_NO_MEMORY
 * (only for an empty buffer without storage); the buffer is then unchanged.
 */
char *tdm_buf_take(tdm_buf_t *buf, size_t *n_bytes_out);

/*
 * tdm_buf_read_file - replace the contents with the file at `path`.
 * Returns TDM_OK, TDM_ERR_NOT_FOUND (no such file), TDM_ERR_IO (logged with strerror) or
 * TDM_ERR_NO_MEMORY. On failure the buffer holds no contents (its storage is kept).
 */
tdm_status_t tdm_buf_read_file(tdm_buf_t *buf, const char *path);

/*
 * tdm_array_grow - room for n_needed elements of elem_bytes each in the heap array `items` (NULL
 * while empty) of *capacity elements: when n_needed > *capacity the capacity doubles, starting
 * from min_capacity (>= 1), until it fits (the growth of tdm_buf_t), and the array is
 * reallocated; elements [0, old *capacity) keep their values, the new ones are uninitialised.
 *
 * Returns the array to use from now on (`items` itself when it had room), with *capacity
 * updated; or NULL when the allocation fails or the byte size overflows, leaving `items` (still
 * valid, still the caller's) and *capacity unchanged. n_needed must be >= 1. Typical use:
 *     int32_t *grown = tdm_array_grow(v->ids, sizeof(*grown), v->n + 1, 256, &v->cap);
 *     if (grown == NULL) return TDM_ERR_NO_MEMORY;
 *     v->ids = grown;
 */
void *tdm_array_grow(void *items, size_t elem_bytes, size_t n_needed, size_t min_capacity,
                     size_t *capacity);

#endif
