/* bytes.h - little-endian writing and reading of byte blobs (Tandem's handoff and file formats).
 *
 * A writer appends to a caller-owned buffer, or only measures when it has none, so one function
 * can size a blob and then fill it. A reader walks a caller-owned buffer and turns sticky-bad on
 * the first read past its end, so a parser reads every field and checks once. Owns no memory;
 * not thread-safe per writer or reader.
 */
#ifndef TANDEM_COMMON_BYTES_H
#define TANDEM_COMMON_BYTES_H

#include <stddef.h>
#include <stdint.h>

/* Where the next bytes go. Zero it (or {NULL, 0, 0}) to measure; {buf, 0, buf_bytes} to write. */
typedef struct {
    uint8_t *p;  /* the buffer, or NULL to measure only */
    size_t used; /* bytes appended so far (counted even past cap, so used > cap means too small) */
    size_t cap;  /* bytes at p */
} tdm_bytes_writer_t;

/* Where the next bytes come from: {buf, n_bytes, 0, 0}. */
typedef struct {
    const uint8_t *p; /* the buffer */
    size_t n;         /* bytes at p */
    size_t at;        /* bytes consumed so far */
    int bad;          /* 1 once a read went past n; every later read fails too */
} tdm_bytes_reader_t;

/* tdm_bytes_put - append n bytes of src (may be NULL when n is 0). Copies only while the bytes fit
 * in cap; always advances used. */
void tdm_bytes_put(tdm_bytes_writer_t *w, const void *src, size_t n);

/* tdm_bytes_put_u32 / tdm_bytes_put_u64 - append v as 4 / 8 little-endian bytes. */
void tdm_bytes_put_u32(tdm_bytes_writer_t *w, uint32_t v);
void tdm_bytes_put_u64(tdm_bytes_writer_t *w, uint64_t v);

/* tdm_bytes_get - the next n bytes (a pointer into the reader's buffer), or NULL with r->bad set
 * when fewer than n remain or r is already bad (nothing consumed). */
const uint8_t *tdm_bytes_get(tdm_bytes_reader_t *r, size_t n);

/* tdm_bytes_get_u32 / tdm_bytes_get_u64 - the next 4 / 8 bytes as a little-endian integer, or 0
 * with r->bad set when they are not there. */
uint32_t tdm_bytes_get_u32(tdm_bytes_reader_t *r);
uint64_t tdm_bytes_get_u64(tdm_bytes_reader_t *r);

#endif
