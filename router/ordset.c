#include "router/ordset.h"

#include <string.h>

void router_ordset_init(router_ordset_t *set, uint64_t seed)
{
    memset(set, 0, sizeof(*set));
    set->rng = seed != 0 ? seed : 0x9E3779B97F4A7C15ull;
    set->head.n_levels = ROUTER_ORDSET_LEVELS;
}

int router_ordset_key_cmp(const router_ordkey_t *a, const router_ordkey_t *b)
{
    if (a->score != b->score) {
        return a->score < b->score ? -1 : 1;
    }
    if (a->tie != b->tie) {
        return a->tie < b->tie ? -1 : 1;
    }
    if (a->id != b->id) {
        return a->id < b->id ? -1 : 1;
    }
    return 0;
}

/* A level with P(level >= l) = 4^-(l-1) (xorshift64). */
static uint8_t random_levels(router_ordset_t *set)
{
    uint64_t x = set->rng;
    uint8_t levels = 1;

    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    set->rng = x;
    while (levels < ROUTER_ORDSET_LEVELS && (x & 3u) == 0) {
        levels++;
        x >>= 2;
    }
    return levels;
}

/* update[l]: the last node on level l whose key sorts before `key`. */
static void find_before(router_ordset_t *set, const router_ordkey_t *key,
                        router_ordnode_t *update[ROUTER_ORDSET_LEVELS])
{
    router_ordnode_t *x = &set->head;

    for (int l = ROUTER_ORDSET_LEVELS - 1; l >= set->top; l--) {
        update[l] = x; /* levels no node uses */
    }
    for (int l = set->top - 1; l >= 0; l--) {
        while (x->next[l] != NULL && router_ordset_key_cmp(&x->next[l]->key, key) < 0) {
            x = x->next[l];
        }
        update[l] = x;
    }
}

void router_ordset_insert(router_ordset_t *set, router_ordnode_t *node, const router_ordkey_t *key)
{
    router_ordnode_t *update[ROUTER_ORDSET_LEVELS];

    node->key = *key;
    find_before(set, key, update);
    node->n_levels = random_levels(set);
    if (node->n_levels > set->top) {
        set->top = node->n_levels;
    }
    for (int l = 0; l < node->n_levels; l++) {
        node->next[l] = update[l]->next[l];
        update[l]->next[l] = node;
    }
    set->n++;
}

void router_ordset_remove(router_ordset_t *set, router_ordnode_t *node)
{
    router_ordnode_t *update[ROUTER_ORDSET_LEVELS];

    if (node->n_levels == 0) {
        return;
    }
    find_before(set, &node->key, update);
    for (int l = 0; l < node->n_levels; l++) {
        if (update[l]->next[l] == node) {
            update[l]->next[l] = node->next[l];
        }
        node->next[l] = NULL;
    }
    node->n_levels = 0;
    set->n--;
}

router_ordnode_t *router_ordset_first(const router_ordset_t *set)
{
    return set->head.next[0];
}

router_ordnode_t *router_ordset_next(const router_ordnode_t *node)
{
    return node->next[0];
}
