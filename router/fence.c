/* fence.c - the writer fences the router still owes decode nodes (fence.h). */
#include "router/fence.h"

#include <stdlib.h>

struct router_fences {
    router_fence_t entries[ROUTER_FENCES]; /* [0, n) oldest first */
    uint32_t n;
};

tdm_status_t router_fences_create(router_fences_t **fences_out)
{
    router_fences_t *f = calloc(1, sizeof(*f));

    if (f == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    *fences_out = f;
    return TDM_OK;
}

void router_fences_destroy(router_fences_t *fences)
{
    free(fences);
}

/* Remove entry i, keeping the order of the others. */
static void remove_at(router_fences_t *f, uint32_t i, router_fence_t *fence_out)
{
    *fence_out = f->entries[i];
    for (uint32_t j = i + 1; j < f->n; j++) {
        f->entries[j - 1] = f->entries[j];
    }
    f->n--;
}

int router_fences_add(router_fences_t *fences, const router_fence_t *fence)
{
    int dropped = 0;

    if (fences->n == ROUTER_FENCES) {
        router_fence_t oldest;
        remove_at(fences, 0, &oldest);
        dropped = 1;
    }
    fences->entries[fences->n++] = *fence;
    return dropped;
}

int router_fences_take(router_fences_t *fences, int prefill_slot, uint64_t request_id,
                       uint32_t attempt, router_fence_t *fence_out)
{
    for (uint32_t i = 0; i < fences->n; i++) {
        const router_fence_t *e = &fences->entries[i];
        if (e->prefill_slot == prefill_slot && e->request_id == request_id &&
            e->attempt == attempt) {
            remove_at(fences, i, fence_out);
            return 1;
        }
    }
    return 0;
}

int router_fences_take_slot(router_fences_t *fences, int slot, router_fence_t *fence_out)
{
    for (uint32_t i = 0; i < fences->n; i++) {
        if (fences->entries[i].prefill_slot == slot || fences->entries[i].decode_slot == slot) {
            remove_at(fences, i, fence_out);
            return 1;
        }
    }
    return 0;
}

uint32_t router_fences_n(const router_fences_t *fences)
{
    return fences->n;
}
