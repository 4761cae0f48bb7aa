/* arena.h - bump allocator for per-request and per-step scratch.
 *
 * One contiguous buffer sized at setup; allocations are aligned bumps; reset frees everything at
 * once. No malloc after init, so the decode loop never allocates (STYLE.md section 4).
 * Not thread-safe: one arena per thread or per step.
 */
#ifndef TANDEM_COMMON_ARENA_H
#define TANDEM_COMMON_ARENA_H

#include <stddef.h>

#include "common/status.h"

/* Plain data: the caller owns the struct; the arena owns `base` between init and fini. */
typedef struct {
    unsigned char *base; /* buffer of capacity_bytes, 64-byte aligned */
    size_t capacity_bytes;
    size_t used_bytes;
    size_t high_water_bytes; /* most ever used since init (for sizing) */
    int borrowed;            /* 1: base is the caller's (tdm_arena_init_over); fini frees nothing */
} tdm_arena_t;

/*
 * tdm_arena_init - allocate a buffer of capacity_bytes (> 0).
 * Returns TDM_OK, TDM_ERR_INVALID_ARG (capacity 0; arena zeroed) or TDM_ERR_NO_MEMORY.
 */
tdm_status_t tdm_arena_init(tdm_arena_t *arena, size_t capacity_bytes);

/*
 * tdm_arena_init_over - an arena over the caller's buffer base [capacity_bytes] (e.g. backend
 * memory from ops->mem_alloc: the arena only computes offsets, it never reads or writes the
 * bytes). base must be 64-byte aligned; allocations asking for more alignment than base has are
 * refused (NULL). The buffer stays the caller's: fini forgets it without freeing.
 * Returns TDM_OK, or TDM_ERR_INVALID_ARG (base NULL or misaligned, capacity 0; arena zeroed).
 */
tdm_status_t tdm_arena_init_over(tdm_arena_t *arena, void *base, size_t capacity_bytes);

/* tdm_arena_fini - free the buffer (not a borrowed one); accepts a zeroed arena. */
void tdm_arena_fini(tdm_arena_t *arena);

/*
 * tdm_arena_alloc - `n_bytes` aligned to `align` (a power of two <= 4096; 0 means 64).
 * Returns the pointer, or NULL when the arena lacks room (arena unchanged). Memory is not zeroed
 * and stays valid until the next reset or fini.
 */
void *tdm_arena_alloc(tdm_arena_t *arena, size_t n_bytes, size_t align);

/* tdm_arena_reset - forget every allocation (used_bytes back to 0). */
void tdm_arena_reset(tdm_arena_t *arena);

#endif
