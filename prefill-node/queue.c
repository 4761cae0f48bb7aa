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
    uint64_t aborted[PREFILL_QUEUE_ABORTS];
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

int prefill_queue_abort(prefill_queue_t *queue, uint64_t request_id)
{
    item_t **link = &queue->head;
    item_t *prev = NULL;

    queue->aborted[queue->next_abort++ % PREFILL_QUEUE_ABORTS] = request_id;
    while (*link != NULL) {
        item_t *it = *link;
        if (it->env->prefill_job->request_id == request_id) {
            *link = it->next;
            if (queue->tail == it) {
                queue->tail = prev;
            }
            queue->n_jobs--;
            queue->n_tokens -= it->env->prefill_job->n_delta_tokens;
            proto_envelope_free(it->env);
            free(it);
            return 1;
        }
        prev = it;
        link = &it->next;
    }
    return 0;
}

int prefill_queue_is_aborted(const prefill_queue_t *queue, uint64_t request_id)
{
    for (uint32_t i = 0; i < PREFILL_QUEUE_ABORTS; i++) {
        if (queue->aborted[i] == request_id && request_id != 0) {
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
