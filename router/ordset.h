/* ordset.h - an intrusive ordered set (skip list) of entries keyed by an exact integer tuple.
 *
 * The router's placement indexes (registry_index.c) keep workers and racks ordered by load
 * score so the least loaded one is found in O(1) and kept in order in O(log N) expected per
 * change. Keys are (score, tie, id): fixed-point integer scores, so orders are exact and equal to
 * what a linear scan computes from the same integers; id is unique within one set. The set owns
 * no memory of its entries: each entry embeds a router_ordnode_t. Knows nothing of workers.
 * Not thread-safe.
 */
#ifndef TANDEM_ROUTER_ORDSET_H
#define TANDEM_ROUTER_ORDSET_H

#include <stdint.h>

/* Levels of the skip list: 2^20 entries per set keep the expected O(log N) cost. */
#define ROUTER_ORDSET_LEVELS 20

/* One set's sort key, compared lexicographically (score, tie, id). */
typedef struct {
    uint64_t score; /* fixed-point score, lower first */
    uint32_t tie;   /* tie break, lower first (e.g. requests in flight) */
    uint32_t id;    /* unique within the set (e.g. registry slot) */
} router_ordkey_t;

/* One entry's links; embedded in the entry (its owner), zeroed while it is in no set. */
typedef struct router_ordnode {
    router_ordkey_t key;
    struct router_ordnode *next[ROUTER_ORDSET_LEVELS];
    uint8_t n_levels; /* 0: in no set */
} router_ordnode_t;

/* The set (plain storage, router_ordset_init / nothing to free: it owns no memory). */
typedef struct {
    router_ordnode_t head; /* sentinel: head.next[l] is the first node of level l */
    uint64_t rng;          /* xorshift state for node levels (deterministic) */
    uint32_t n;            /* entries */
    int top;               /* levels ever used (1..ROUTER_ORDSET_LEVELS; 0: none yet) */
} router_ordset_t;

/* router_ordset_init - an empty set; seed picks the (deterministic) level sequence. */
void router_ordset_init(router_ordset_t *set, uint64_t seed);

/* router_ordset_key_cmp - -1, 0 or 1 as a sorts before, equal to, or after b. */
int router_ordset_key_cmp(const router_ordkey_t *a, const router_ordkey_t *b);

/* router_ordset_insert - add `node` (in no set: n_levels 0) with `key`. O(log N) expected. */
void router_ordset_insert(router_ordset_t *set, router_ordnode_t *node, const router_ordkey_t *key);

/* router_ordset_remove - take `node` out of `set` (no-op when it is in no set). O(log N)
 * expected. */
void router_ordset_remove(router_ordset_t *set, router_ordnode_t *node);

/* router_ordset_first - the entry with the smallest key, or NULL when empty. O(1). */
router_ordnode_t *router_ordset_first(const router_ordset_t *set);

/* router_ordset_next - the entry after `node` in key order, or NULL. O(1). */
router_ordnode_t *router_ordset_next(const router_ordnode_t *node);

#endif
