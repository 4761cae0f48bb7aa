/* ring.c - consistent hashing of session ids onto routers (ring.h). */
#include "router/ring.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

typedef struct {
    uint64_t point;
    uint32_t member; /* index into members */
} vnode_t;

struct router_ring {
    char members[ROUTER_RING_MAX_MEMBERS][ROUTER_RING_ID_BYTES + 1];
    size_t n_members;
    vnode_t *vnodes; /* [n_members * ROUTER_RING_VNODES] sorted by point */
    size_t n_vnodes;
};

static int vnode_cmp(const void *a, const void *b)
{
    const vnode_t *x = a;
    const vnode_t *y = b;

    if (x->point != y->point) {
        return x->point < y->point ? -1 : 1;
    }
    return x->member < y->member ? -1 : (x->member > y->member);
}

/* Rebuild the sorted vnode array from members. */
static tdm_status_t rebuild(router_ring_t *ring)
{
    size_t n = ring->n_members * ROUTER_RING_VNODES;
    vnode_t *v = n > 0 ? malloc(n * sizeof(*v)) : NULL;
    char label[ROUTER_RING_ID_BYTES + 16];

    if (n > 0 && v == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    for (size_t m = 0; m < ring->n_members; m++) {
        for (uint32_t i = 0; i < ROUTER_RING_VNODES; i++) {
            int len = snprintf(label, sizeof(label), "%s#%u", ring->members[m], i);
            v[m * ROUTER_RING_VNODES + i].point = XXH3_64bits(label, (size_t)len);
            v[m * ROUTER_RING_VNODES + i].member = (uint32_t)m;
        }
    }
    if (n > 0) {
        qsort(v, n, sizeof(*v), vnode_cmp);
    }
    free(ring->vnodes);
    ring->vnodes = v;
    ring->n_vnodes = n;
    return TDM_OK;
}

tdm_status_t router_ring_create(router_ring_t **ring_out)
{
    router_ring_t *ring = calloc(1, sizeof(*ring));

    if (ring == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    *ring_out = ring;
    return TDM_OK;
}

void router_ring_destroy(router_ring_t *ring)
{
    if (ring != NULL) {
        free(ring->vnodes);
        free(ring);
    }
}

static int find_member(const router_ring_t *ring, const char *id)
{
    for (size_t m = 0; m < ring->n_members; m++) {
        if (strcmp(ring->members[m], id) == 0) {
            return (int)m;
        }
    }
    return -1;
}

tdm_status_t router_ring_add(router_ring_t *ring, const char *id)
{
    size_t len;
    tdm_status_t status;

    if (ring == NULL || id == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    len = strlen(id);
    if (len == 0 || len > ROUTER_RING_ID_BYTES || ring->n_members >= ROUTER_RING_MAX_MEMBERS ||
        find_member(ring, id) >= 0) {
        return TDM_ERR_INVALID_ARG;
    }
    for (size_t i = 0; i < len; i++) {
        if ((unsigned char)id[i] <= 0x20 || (unsigned char)id[i] >= 0x7f) {
            return TDM_ERR_INVALID_ARG;
        }
    }
    memcpy(ring->members[ring->n_members], id, len + 1);
    ring->n_members++;
    status = rebuild(ring);
    if (status != TDM_OK) {
        ring->n_members--;
    }
    return status;
}

tdm_status_t router_ring_remove(router_ring_t *ring, const char *id)
{
    int m = ring != NULL && id != NULL ? find_member(ring, id) : -1;
    char saved[ROUTER_RING_ID_BYTES + 1];
    tdm_status_t status;

    if (m < 0) {
        return TDM_ERR_NOT_FOUND;
    }
    memcpy(saved, ring->members[m], sizeof(saved));
    memmove(ring->members[m], ring->members[m + 1],
            (ring->n_members - (size_t)m - 1) * sizeof(ring->members[0]));
    ring->n_members--;
    status = rebuild(ring);
    if (status != TDM_OK) { /* put it back: the old vnodes are still in place */
        memmove(ring->members[m + 1], ring->members[m],
                (ring->n_members - (size_t)m) * sizeof(ring->members[0]));
        memcpy(ring->members[m], saved, sizeof(saved));
        ring->n_members++;
    }
    return status;
}

size_t router_ring_size(const router_ring_t *ring)
{
    return ring->n_members;
}

uint64_t router_ring_key(const char *session_id)
{
    return XXH3_64bits(session_id, strlen(session_id));
}

size_t router_ring_owners(const router_ring_t *ring, uint64_t key, const char **owners_out,
                          size_t n_out)
{
    size_t lo = 0;
    size_t hi = ring->n_vnodes;
    size_t n = 0;
    size_t want = n_out < ring->n_members ? n_out : ring->n_members;

    if (ring->n_vnodes == 0 || want == 0) {
        return 0;
    }
    while (lo < hi) { /* first vnode with point >= key */
        size_t mid = lo + (hi - lo) / 2;
        if (ring->vnodes[mid].point < key) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    for (size_t step = 0; step < ring->n_vnodes && n < want; step++) {
        const char *id = ring->members[ring->vnodes[(lo + step) % ring->n_vnodes].member];
        int seen = 0;
        for (size_t j = 0; j < n; j++) {
            seen |= owners_out[j] == id;
        }
        if (!seen) {
            owners_out[n++] = id;
        }
    }
    return n;
}
