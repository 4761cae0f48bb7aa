/* queue.c - the prefill job queue (queue.h). */
#include "prefill-node/queue.h"

#include <stdlib.h>

typedef struct item {
    Tandem__Envelope *env;
    uint64_t epoch;
    struct item *next;
} item_t;

struct prefill_queue {
    item_t *head, *tail;
    uint32_t n_jobs;
    uint64_t n_tokens;
    prefill_abort_t aborted[PREFILL_QUEUE_ABORTS]; /* each names one attempt or reservation */
    uint32_t next_abort;                           /* slot the next remembered abort takes */
    uint32_t n_remembered;                         /* slots in use, up to PREFILL_QUEUE_ABORTS */
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
    while ((env = prefill_queue_pop(queue, NULL)) != NULL) {
        proto_envelope_free(env);
    }
    free(queue);
}

tdm_status_t prefill_queue_push(prefill_queue_t *queue, Tandem__Envelope *env, uint64_t epoch)
{
    item_t *it = calloc(1, sizeof(*it));

    if (it == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    it->env = env;
    it->epoch = epoch;
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

const Tandem__Envelope *prefill_queue_peek(const prefill_queue_t *queue)
{
    return queue->head != NULL ? queue->head->env : NULL;
}

Tandem__Envelope *prefill_queue_pop(prefill_queue_t *queue, uint64_t *epoch_out)
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
    if (epoch_out != NULL) {
        *epoch_out = it->epoch;
    }
    free(it);
    queue->n_jobs--;
    queue->n_tokens -= env->prefill_job->n_delta_tokens;
    return env;
}

int prefill_abort_names(const prefill_abort_t *abort, const Tandem__PrefillJob *job)
{
    if (abort->request_id == 0 || abort->request_id != job->request_id) {
        return 0;
    }
    if (abort->attempt != 0) {
        return job->attempt == abort->attempt;
    }
    return abort->reservation_id == 0 || abort->reservation_id == job->reservation_id;
}

int prefill_queue_abort(prefill_queue_t *queue, const prefill_abort_t *abort,
                        prefill_queue_dropped_fn *dropped, void *arg)
{
    item_t **link = &queue->head;
    item_t *prev = NULL;
    int n_dropped = 0;

    if (abort->request_id != 0 && (abort->attempt != 0 || abort->reservation_id != 0)) {
        queue->aborted[queue->next_abort] = *abort;
        queue->next_abort = (queue->next_abort + 1) % PREFILL_QUEUE_ABORTS;
        if (queue->n_remembered < PREFILL_QUEUE_ABORTS) {
            queue->n_remembered++;
        }
    }
    while (*link != NULL) {
        item_t *it = *link;
        const Tandem__PrefillJob *job = it->env->prefill_job;
        if (prefill_abort_names(abort, job)) {
            *link = it->next;
            if (queue->tail == it) {
                queue->tail = prev;
            }
            queue->n_jobs--;
            queue->n_tokens -= job->n_delta_tokens;
            if (dropped != NULL) {
                dropped(arg, job);
            }
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

int prefill_queue_is_aborted(const prefill_queue_t *queue, const Tandem__PrefillJob *job)
{
    for (uint32_t i = 0; i < queue->n_remembered; i++) {
        if (prefill_abort_names(&queue->aborted[i], job)) {
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
