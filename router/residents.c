/* residents.c - the index of sessions the decode nodes hold (residents.h). */
#include "router/residents.h"

#include <stdlib.h>
#include <string.h>

#define RESIDENTS_MIN_BUCKETS 1024u

typedef struct entry {
    uint64_t key;
    uint64_t cached_len;
    uint32_t node; /* index into nodes */
    struct entry *next;
} entry_t;

typedef struct {
    char id[ROUTER_RESIDENTS_ID_BYTES + 1]; /* "" : free */
    uint64_t *keys;                         /* [n_keys] as last reported */
    uint64_t *lens;                         /* [n_keys] */
    size_t n_keys;
} node_t;

struct router_residents {
    entry_t **buckets; /* [n_buckets], a power of two */
    size_t n_buckets;
    size_t n_entries;
    node_t *nodes;
    size_t n_nodes;
};

static size_t bucket_of(const router_residents_t *r, uint64_t key)
{
    uint64_t h = key * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 32) & (r->n_buckets - 1);
}

tdm_status_t router_residents_create(router_residents_t **residents_out)
{
    router_residents_t *r = calloc(1, sizeof(*r));

    if (r == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    r->buckets = calloc(RESIDENTS_MIN_BUCKETS, sizeof(*r->buckets));
    if (r->buckets == NULL) {
        free(r);
        return TDM_ERR_NO_MEMORY;
    }
    r->n_buckets = RESIDENTS_MIN_BUCKETS;
    *residents_out = r;
    return TDM_OK;
}

/* Unlink and free node n's entries. */
static void drop_entries(router_residents_t *r, uint32_t n)
{
    node_t *node = &r->nodes[n];

    for (size_t i = 0; i < node->n_keys; i++) {
        entry_t **pp = &r->buckets[bucket_of(r, node->keys[i])];
        while (*pp != NULL) {
            entry_t *e = *pp;
            if (e->key == node->keys[i] && e->node == n) {
                *pp = e->next;
                free(e);
                r->n_entries--;
                break;
            }
            pp = &e->next;
        }
    }
    free(node->keys);
    free(node->lens);
    node->keys = NULL;
    node->lens = NULL;
    node->n_keys = 0;
}

void router_residents_destroy(router_residents_t *residents)
{
    if (residents == NULL) {
        return;
    }
    for (size_t n = 0; n < residents->n_nodes; n++) {
        drop_entries(residents, (uint32_t)n);
    }
    free(residents->nodes);
    free(residents->buckets);
    free(residents);
}

static int find_node(const router_residents_t *r, const char *id)
{
    for (size_t n = 0; n < r->n_nodes; n++) {
        if (r->nodes[n].id[0] != '\0' && strcmp(r->nodes[n].id, id) == 0) {
            return (int)n;
        }
    }
    return -1;
}

/* The node named id, added when new; -1 without memory. */
static int node_for(router_residents_t *r, const char *id)
{
    int n = find_node(r, id);
    size_t free_at = r->n_nodes;
    node_t *grown;

    if (n >= 0) {
        return n;
    }
    for (size_t i = 0; i < r->n_nodes; i++) {
        if (r->nodes[i].id[0] == '\0') {
            free_at = i;
            break;
        }
    }
    if (free_at == r->n_nodes) {
        grown = realloc(r->nodes, (r->n_nodes + 1) * sizeof(*grown));
        if (grown == NULL) {
            return -1;
        }
        r->nodes = grown;
        memset(&r->nodes[r->n_nodes], 0, sizeof(r->nodes[0]));
        r->n_nodes++;
    }
    strcpy(r->nodes[free_at].id, id);
    return (int)free_at;
}

/* Double the buckets when the chains grow long (best effort: a failed grow keeps the table). */
static void maybe_grow(router_residents_t *r)
{
    size_t n_new = r->n_buckets * 2;
    entry_t **b;
    entry_t **old = r->buckets;
    size_t n_old = r->n_buckets;

    if (r->n_entries <= r->n_buckets * 2) {
        return;
    }
    b = calloc(n_new, sizeof(*b));
    if (b == NULL) {
        return;
    }
    r->buckets = b;
    r->n_buckets = n_new;
    for (size_t i = 0; i < n_old; i++) {
        entry_t *e = old[i];
        while (e != NULL) {
            entry_t *next = e->next;
            size_t at = bucket_of(r, e->key);
            e->next = b[at];
            b[at] = e;
            e = next;
        }
    }
    free(old);
}

static int same_list(const node_t *node, const uint64_t *keys, size_t n_keys, const uint64_t *lens,
                     size_t n_lens)
{
    if (node->n_keys != n_keys) {
        return 0;
    }
    for (size_t i = 0; i < n_keys; i++) {
        if (node->keys[i] != keys[i] || node->lens[i] != (i < n_lens ? lens[i] : 0)) {
            return 0;
        }
    }
    return 1;
}

tdm_status_t router_residents_update(router_residents_t *residents, const char *node_id,
                                     const uint64_t *keys, size_t n_keys,
                                     const uint64_t *cached_lens, size_t n_cached_lens)
{
    router_residents_t *r = residents;
    size_t len = node_id != NULL ? strlen(node_id) : 0;
    node_t *node;
    int n;

    if (r == NULL || len == 0 || len > ROUTER_RESIDENTS_ID_BYTES || (n_keys > 0 && keys == NULL)) {
        return TDM_ERR_INVALID_ARG;
    }
    if (cached_lens == NULL) {
        n_cached_lens = 0;
    }
    n = find_node(r, node_id);
    if (n < 0 && n_keys == 0) {
        return TDM_OK; /* nothing held, nothing known: no entry needed */
    }
    n = n >= 0 ? n : node_for(r, node_id);
    if (n < 0) {
        return TDM_ERR_NO_MEMORY;
    }
    node = &r->nodes[n];
    if (same_list(node, keys, n_keys, cached_lens, n_cached_lens)) {
        return TDM_OK;
    }
    drop_entries(r, (uint32_t)n);
    if (n_keys == 0) {
        return TDM_OK;
    }
    node->keys = malloc(n_keys * sizeof(*node->keys));
    node->lens = malloc(n_keys * sizeof(*node->lens));
    if (node->keys == NULL || node->lens == NULL) {
        free(node->keys);
        free(node->lens);
        node->keys = NULL;
        node->lens = NULL;
        return TDM_ERR_NO_MEMORY;
    }
    for (size_t i = 0; i < n_keys; i++) {
        entry_t *e = malloc(sizeof(*e));
        size_t at;
        if (e == NULL) {
            return TDM_ERR_NO_MEMORY; /* the first i are indexed and recorded: consistent */
        }
        node->keys[i] = keys[i];
        node->lens[i] = i < n_cached_lens ? cached_lens[i] : 0;
        node->n_keys = i + 1;
        e->key = keys[i];
        e->cached_len = node->lens[i];
        e->node = (uint32_t)n;
        at = bucket_of(r, e->key);
        e->next = r->buckets[at];
        r->buckets[at] = e;
        r->n_entries++;
    }
    maybe_grow(r);
    return TDM_OK;
}

void router_residents_forget(router_residents_t *residents, const char *node_id)
{
    int n = residents != NULL && node_id != NULL ? find_node(residents, node_id) : -1;

    if (n >= 0) {
        drop_entries(residents, (uint32_t)n);
        residents->nodes[n].id[0] = '\0';
    }
}

int router_residents_lookup(const router_residents_t *residents, uint64_t key,
                            router_residents_live_fn *live, void *ctx, char *node_id_out,
                            uint64_t *cached_len_out)
{
    const entry_t *best = NULL;

    for (const entry_t *e = residents->buckets[bucket_of(residents, key)]; e != NULL; e = e->next) {
        if (e->key != key || (best != NULL && e->cached_len <= best->cached_len)) {
            continue;
        }
        if (live == NULL || live(ctx, residents->nodes[e->node].id)) {
            best = e;
        }
    }
    if (best == NULL) {
        return 0;
    }
    strcpy(node_id_out, residents->nodes[best->node].id);
    *cached_len_out = best->cached_len;
    return 1;
}

size_t router_residents_count(const router_residents_t *residents)
{
    return residents->n_entries;
}
