/* strbuf.h - a growable byte buffer for request bodies, SSE input and report text.
 *
 * Owns its heap storage; the text is always NUL-terminated. Not thread-safe. Knows nothing of
 * HTTP or JSON.
 */
#ifndef TANDEM_BENCH_STRBUF_H
#define TANDEM_BENCH_STRBUF_H

#include <stddef.h>

#include "common/status.h"

/* Plain data: zero-initialised is an empty buffer. `data` may be NULL while empty. */
typedef struct {
    char *data;
    size_t n_bytes;  /* used, excluding the terminating NUL */
    size_t capacity; /* allocated bytes */
} bench_strbuf_t;

/* bench_strbuf_fini - free the storage; accepts a zeroed buffer; leaves it zeroed. */
void bench_strbuf_fini(bench_strbuf_t *buf);

/* bench_strbuf_reset - empty the buffer, keeping its storage. */
void bench_strbuf_reset(bench_strbuf_t *buf);

/* bench_strbuf_append - add n_bytes from `bytes`. TDM_OK or TDM_ERR_NO_MEMORY (unchanged). */
tdm_status_t bench_strbuf_append(bench_strbuf_t *buf, const void *bytes, size_t n_bytes);

/* bench_strbuf_printf - append printf-style text. TDM_OK or TDM_ERR_NO_MEMORY (unchanged). */
tdm_status_t bench_strbuf_printf(bench_strbuf_t *buf, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* bench_strbuf_consume - drop the first n_bytes (<= n_bytes used), moving the rest down. */
void bench_strbuf_consume(bench_strbuf_t *buf, size_t n_bytes);

/*
 * bench_strbuf_read_file - replace the contents with the file at `path`.
 * Returns TDM_OK, TDM_ERR_NOT_FOUND, TDM_ERR_IO (logged with strerror) or TDM_ERR_NO_MEMORY.
 */
tdm_status_t bench_strbuf_read_file(bench_strbuf_t *buf, const char *path);

#endif
