/* wire.h - little-endian loads and stores for transfer/'s wire formats (descriptor, notice).
 *
 * Private to transfer/: header-only static inline helpers, byte by byte so they are correct on
 * any alignment and host byte order. Owns nothing.
 */
#ifndef TANDEM_TRANSFER_WIRE_H
#define TANDEM_TRANSFER_WIRE_H

#include <stdint.h>

/* wire_put_u16/u32/u64 - store v little-endian at p. */
static inline void wire_put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline void wire_put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

static inline void wire_put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

/* wire_get_u16/u32/u64 - load a little-endian value from p. */
static inline uint16_t wire_get_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static inline uint32_t wire_get_u32(const uint8_t *p)
{
    uint32_t v = 0;

    for (int i = 3; i >= 0; i--) {
        v = (v << 8) | p[i];
    }
    return v;
}

static inline uint64_t wire_get_u64(const uint8_t *p)
{
    uint64_t v = 0;

    for (int i = 7; i >= 0; i--) {
        v = (v << 8) | p[i];
    }
    return v;
}

#endif
