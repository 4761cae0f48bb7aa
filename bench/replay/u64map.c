/* u64map.c - linear-probing multimap; see u64map.h. */
#include "bench/replay/u64map.h"

#include "common/hash.h"

#include <stdlib.h>

#define U64MAP_MIN_SLOTS 64

void bench_u64map_fini(bench_u64map_t *map)
{
    free(map->keys);
    free(map->values);
    free(map->used);
    map->keys = NULL;
    map->values = NULL;
    map->used = NULL;
    map->n_slots = 0;
    map->n_entries = 0;
}

static void place(uint64_t *keys, uint64_t *values, unsigned char *used, size_t n_slots,
                  uint64_t key, uint64_t value)
{
    size_t slot = (size_t)tdm_hash_splitmix64(key) & (n_slots - 1);

    while (used[slot]) {
        slot = (slot + 1) & (n_slots - 1);
    }
    keys[slot] = key;
    values[slot] = value;
    used[slot] = 1;
}

/* Doubles the slot array, keeping insertion order along each probe chain. */
static tdm_status_t grow(bench_u64map_t *map)
{
    size_t n_slots = map->n_slots == 0 ? U64MAP_MIN_SLOTS : map->n_slots * 2;
    bench_u64map_t bigger = {.keys = malloc(n_slots * sizeof(*map->keys)),
                             .values = malloc(n_slots * sizeof(*map->values)),
                             .used = calloc(n_slots, 1),
                             .n_slots = n_slots,
                             .n_entries = map->n_entries};
    size_t start = 0;

    if (bigger.keys == NULL || bigger.values == NULL || bigger.used == NULL) {
        bench_u64map_fini(&bigger);
        return TDM_ERR_NO_MEMORY;
    }
    /* Re-insert starting just after an empty slot so that entries of a chain wrapping past
     * the end are re-placed in their original order. */
    for (size_t i = 0; i < map->n_slots; i++) {
        if (!map->used[i]) {
            start = (i + 1) & (map->n_slots - 1);
            break;
        }
    }
    for (size_t n = 0; n < map->n_slots; n++) {
        size_t i = (start + n) & (map->n_slots - 1);
        if (map->used[i]) {
            place(bigger.keys, bigger.values, bigger.used, n_slots, map->keys[i], map->values[i]);
        }
    }
    bench_u64map_fini(map);
    *map = bigger;
    return TDM_OK;
}

tdm_status_t bench_u64map_insert(bench_u64map_t *map, uint64_t key, uint64_t value)
{
    if ((map->n_entries + 1) * 2 > map->n_slots) {
        tdm_status_t status = grow(map);
        if (status != TDM_OK) {
            return status;
        }
    }
    place(map->keys, map->values, map->used, map->n_slots, key, value);
    map->n_entries++;
    return TDM_OK;
}

int bench_u64map_next(const bench_u64map_t *map, uint64_t key, size_t *cursor, uint64_t *value_out)
{
    size_t home;

    if (map->n_slots == 0) {
        return 0;
    }
    home = (size_t)tdm_hash_splitmix64(key) & (map->n_slots - 1);
    for (size_t step = *cursor; step < map->n_slots; step++) {
        size_t slot = (home + step) & (map->n_slots - 1);
        if (!map->used[slot]) {
            *cursor = map->n_slots;
            return 0;
        }
        if (map->keys[slot] == key) {
            *value_out = map->values[slot];
            *cursor = step + 1;
            return 1;
        }
    }
    *cursor = map->n_slots;
    return 0;
}
