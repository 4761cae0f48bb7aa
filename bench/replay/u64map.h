/* u64map.h - an open-addressing multimap from 64-bit keys to 64-bit values for tandem-bench.
 *
 * Owns its slot array. Duplicate keys are allowed: lookups walk every entry with a key, so
 * callers that key by a hash verify candidates themselves. No deletion (callers that need it
 * keep their own "still current" check). Not thread-safe. Knows nothing of traces.
 */
#ifndef TANDEM_BENCH_U64MAP_H
#define TANDEM_BENCH_U64MAP_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* Plain data; fields are private to u64map.c. Zero-initialised means empty. */
typedef struct {
    uint64_t *keys;
    uint64_t *values;
    unsigned char *used;
    size_t n_slots; /* a power of two, or 0 */
    size_t n_entries;
} bench_u64map_t;

/* bench_u64map_fini - free the slots; accepts a zeroed map; leaves it zeroed. */
void bench_u64map_fini(bench_u64map_t *map);

/*
 * bench_u64map_insert - add (key, value); an existing entry with the same key stays.
 * Returns TDM_OK or TDM_ERR_NO_MEMORY (map unchanged).
 */
tdm_status_t bench_u64map_insert(bench_u64map_t *map, uint64_t key, uint64_t value);

/*
 * bench_u64map_next - iterate the values stored under `key`. Start with *cursor = 0; each call
 * that returns 1 writes one value to *value_out and advances *cursor; 0 means no more.
 * Values come back in insertion order. The map must not change during an iteration.
 */
int bench_u64map_next(const bench_u64map_t *map, uint64_t key, size_t *cursor, uint64_t *value_out);

#endif
