#include "common/arena.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ARENA_BASE_ALIGN 64
#define ARENA_MAX_ALIGN 4096

tdm_status_t tdm_arena_init(tdm_arena_t *arena, size_t capacity_bytes)
{
    void *base = NULL;

    memset(arena, 0, sizeof(*arena));
    if (capacity_bytes == 0) {
        return TDM_ERR_INVALID_ARG;
    }
    if (posix_memalign(&base, ARENA_MAX_ALIGN, capacity_bytes) != 0) {
        return TDM_ERR_NO_MEMORY;
    }
    arena->base = base;
    arena->capacity_bytes = capacity_bytes;
    return TDM_OK;
}

tdm_status_t tdm_arena_init_over(tdm_arena_t *arena, void *base, size_t capacity_bytes)
{
    memset(arena, 0, sizeof(*arena));
    if (base == NULL || capacity_bytes == 0 || (uintptr_t)base % ARENA_BASE_ALIGN != 0) {
        return TDM_ERR_INVALID_ARG;
    }
    arena->base = base;
    arena->capacity_bytes = capacity_bytes;
    arena->borrowed = 1;
    return TDM_OK;
}

void tdm_arena_fini(tdm_arena_t *arena)
{
    if (arena == NULL) {
        return;
    }
    if (!arena->borrowed) {
        free(arena->base);
    }
    memset(arena, 0, sizeof(*arena));
}

void *tdm_arena_alloc(tdm_arena_t *arena, size_t n_bytes, size_t align)
{
    size_t start;

    if (align == 0) {
        align = ARENA_BASE_ALIGN;
    }
    if ((align & (align - 1)) != 0 || align > ARENA_MAX_ALIGN || arena->base == NULL ||
        (arena->borrowed && (uintptr_t)arena->base % align != 0)) {
        return NULL;
    }
    start = (arena->used_bytes + align - 1) & ~(align - 1);
    if (start > arena->capacity_bytes || n_bytes > arena->capacity_bytes - start) {
        return NULL;
    }
    arena->used_bytes = start + n_bytes;
    if (arena->used_bytes > arena->high_water_bytes) {
        arena->high_water_bytes = arena->used_bytes;
    }
    return arena->base + start;
}

void tdm_arena_reset(tdm_arena_t *arena)
{
    arena->used_bytes = 0;
}
