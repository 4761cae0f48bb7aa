/* evq.c - binary min-heap keyed by (time, push sequence). See evq.h. */
#include "sim/evq.h"

#include <math.h>
#include <stdlib.h>

struct sim_evq {
    sim_event_t *heap;
    size_t n;
    size_t cap;
    uint64_t next_seq;
};

static int before(const sim_event_t *a, const sim_event_t *b)
{
    if (a->t_s != b->t_s) {
        return a->t_s < b->t_s;
    }
    return a->seq < b->seq;
}

tdm_status_t sim_evq_create(size_t initial_cap, sim_evq_t **evq_out)
{
    sim_evq_t *evq = calloc(1, sizeof(*evq));

    if (evq == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    evq->cap = initial_cap < 16 ? 16 : initial_cap;
    evq->heap = malloc(evq->cap * sizeof(*evq->heap));
    if (evq->heap == NULL) {
        free(evq);
        return TDM_ERR_NO_MEMORY;
    }
    *evq_out = evq;
    return TDM_OK;
}

void sim_evq_destroy(sim_evq_t *evq)
{
    if (evq == NULL) {
        return;
    }
    free(evq->heap);
    free(evq);
}

tdm_status_t sim_evq_push(sim_evq_t *evq, double t_s, uint32_t kind, uint32_t id, uint64_t arg)
{
    sim_event_t ev;
    size_t i;

    if (!isfinite(t_s) || t_s < 0.0) {
        return TDM_ERR_INVALID_ARG;
    }
    if (evq->n == evq->cap) {
        size_t cap = evq->cap * 2;
        sim_event_t *heap = realloc(evq->heap, cap * sizeof(*heap));

        if (heap == NULL) {
            return TDM_ERR_NO_MEMORY;
        }
        evq->heap = heap;
        evq->cap = cap;
    }
    ev.t_s = t_s;
    ev.seq = evq->next_seq++;
    ev.kind = kind;
    ev.id = id;
    ev.arg = arg;
    i = evq->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;

        if (!before(&ev, &evq->heap[parent])) {
            break;
        }
        evq->heap[i] = evq->heap[parent];
        i = parent;
    }
    evq->heap[i] = ev;
    return TDM_OK;
}

int sim_evq_pop(sim_evq_t *evq, sim_event_t *event_out)
{
    sim_event_t last;
    size_t i = 0;

    if (evq->n == 0) {
        return 0;
    }
    *event_out = evq->heap[0];
    last = evq->heap[--evq->n];
    for (;;) {
        size_t child = 2 * i + 1;

        if (child >= evq->n) {
            break;
        }
        if (child + 1 < evq->n && before(&evq->heap[child + 1], &evq->heap[child])) {
            child++;
        }
        if (!before(&evq->heap[child], &last)) {
            break;
        }
        evq->heap[i] = evq->heap[child];
        i = child;
    }
    if (evq->n > 0) {
        evq->heap[i] = last;
    }
    return 1;
}

size_t sim_evq_size(const sim_evq_t *evq)
{
    return evq->n;
}

uint64_t sim_evq_pushed(const sim_evq_t *evq)
{
    return evq->next_seq;
}
