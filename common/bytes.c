#include "common/bytes.h"

#include <string.h>

void tdm_bytes_put(tdm_bytes_writer_t *w, const void *src, size_t n)
{
    if (w->p != NULL && n > 0 && w->used <= w->cap && n <= w->cap - w->used) {
        memcpy(w->p + w->used, src, n);
    }
    w->used += n;
}

void tdm_bytes_put_u32(tdm_bytes_writer_t *w, uint32_t v)
{
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    tdm_bytes_put(w, b, sizeof(b));
}

void tdm_bytes_put_u64(tdm_bytes_writer_t *w, uint64_t v)
{
    tdm_bytes_put_u32(w, (uint32_t)v);
    tdm_bytes_put_u32(w, (uint32_t)(v >> 32));
}

const uint8_t *tdm_bytes_get(tdm_bytes_reader_t *r, size_t n)
{
    const uint8_t *at;

    if (r->bad || r->at > r->n || n > r->n - r->at) {
        r->bad = 1;
        return NULL;
    }
    at = r->p + r->at;
    r->at += n;
    return at;
}

uint32_t tdm_bytes_get_u32(tdm_bytes_reader_t *r)
{
    const uint8_t *b = tdm_bytes_get(r, 4);

    if (b == NULL) {
        return 0;
    }
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

uint64_t tdm_bytes_get_u64(tdm_bytes_reader_t *r)
{
    uint64_t lo = tdm_bytes_get_u32(r);
    return lo | (uint64_t)tdm_bytes_get_u32(r) << 32;
}
