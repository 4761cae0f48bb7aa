/* errbuf.h - the caller-provided error text buffer that fallible Tandem functions fill.
 *
 * Many functions take `char *err, size_t err_bytes` and write one human-readable reason there on
 * failure (the status code says what happened; the text says where and why). This module writes
 * that text, once for all of them. Owns nothing: the buffer is the caller's.
 */
#ifndef TANDEM_COMMON_ERRBUF_H
#define TANDEM_COMMON_ERRBUF_H

#include <stdarg.h>
#include <stddef.h>

/*
 * tdm_errbuf_set - printf `fmt` into err[0, err_bytes), truncated and always NUL-terminated.
 *
 * err may be NULL or err_bytes 0: then nothing is written (callers that do not want the text pass
 * NULL, 0). Cannot fail; thread-safe for distinct buffers.
 */
void tdm_errbuf_set(char *err, size_t err_bytes, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* tdm_errbuf_vset - tdm_errbuf_set with a va_list (for callers that are variadic themselves);
 * leaves `args` consumed as vsnprintf does. */
void tdm_errbuf_vset(char *err, size_t err_bytes, const char *fmt, va_list args)
    __attribute__((format(printf, 3, 0)));

#endif
