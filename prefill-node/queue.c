/* queue.c - the prefill job queue (queue.h). */
#include "prefill-node/queue.h"

#include <stdlib.h>

typedef struct item {
    Tandem__Envelope *env;
    struct item *next;
} item_t;

struct prefill_queue {
    item_t *head, *tail;
    uint32_t n_jobs;
    uint64_t n_tokens;
    struct {
        uint64_t request_id, reservation_id; /* reservation 0: every attempt */
    } aborted[PREFILL_QUEUE_ABORTS];
    uint32_t next_abort;
};

tdm_status_t prefill_queue_create(prefill_queue_t **queue_out)
{
    prefill_queue_t *q = calloc(1, sizeof(*q));

    if (q == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    *queue_out = q;
    return TDM_OK;
}

void prefill_queue_destroy(prefill_queue_t *queue)
{
    Tandem__Envelope *env;

    if (queue == NULL) {
        return;
    }
    while ((env = prefill_queue_pop(queue)) != NULL) {
        proto_envelope_free(env);
    }
    free(queue);
}

tdm_status_t prefill_queue_push(prefill_queue_t *queue, Tandem__Envelope *env)
{
    item_t *it = calloc(1, sizeof(*it));

    if (it == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    it->env = env;
    if (queue->tail != NULL) {
        queue->tail->next = it;
    } else {
        queue->head = it;
    }
    queue->tail = it;
    queue->n_jobs++;
    queue->n_tokens += env->prefill_job->n_delta_tokens;
    return TDM_OK;
}

Tandem__Envelope *prefill_queue_pop(prefill_queue_t *queue)
{
    item_t *it = queue->head;
    Tandem__Envelope *env;

    if (it == NULL) {
        return NULL;
    }
    queue->head = it->next;
    if (queue->head == NULL) {
        queue->tail = NULL;
    }
    env = it->env;
    free(it);
    queue->n_jobs--;
    queue->n_tokens -= env->prefill_job->n_delta_tokens;
    return env;
}

/* Whether an abort of (request_id, abort_reservation) covers a job of job_reservation. */
static int abort_covers(uint64_t abort_reservation, uint64_t job_reservation)
{
    return abort_reservation == 0 || abort_reservation == job_reservation;
}

int prefill_queue_abort(prefill_queue_t *queue, uint64_t request_id, uint64_t reservation_id)
{
    item_t **link = &queue->head;
    item_t *prev = NULL;
    int n_dropped = 0;
    uint32_t slot = queue->next_abort++ % PREFILL_QUEUE_ABORTS;

    queue->aborted[slot].request_id = request_id;
    queue->aborted[slot].reservation_id = reservation_id;
    while (*link != NULL) {
        item_t *it = *link;
        const Tandem__PrefillJob *job = it->env->prefill_job;
        if (job->request_id == request_id && abort_covers(reservation_id, job->reservation_id)) {
            *link = it->next;
            if (queue->tail == it) {
                queue->tail = prev;
            }
            queue->n_jobs--;
            queue->n_tokens -= job->n_delta_tokens;
            proto_envelope_free(it->env);
            free(it);
            n_dropped++;
            continue;
        }
        prev = it;
        link = &it->next;
    }
    return n_dropped;
}

int prefill_queue_is_aborted(const prefill_queue_t *queue, uint64_t request_id,
                             uint64_t reservation_id)
{
    if (request_id == 0) {
        return 0;
    }
    for (uint32_t i = 0; i < PREFILL_QUEUE_ABORTS; i++) {
        if (queue->aborted[i].request_id == request_id &&
            abort_covers(queue->aborted[i].reservation_id, reservation_id)) {
            return 1;
        }
    }
    return 0;
}

uint32_t prefill_queue_n_jobs(const prefill_queue_t *queue)
{
    return queue->n_jobs;
}

uint64_t prefill_queue_n_tokens(const prefill_queue_t *queue)
{
    return queue->n_tokens;
}
