#include "router/request.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/hash.h"

#define BATCH_MIN_TOKENS 64 /* first capacity of a token batch */

struct router_request {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int n_refs;
    uint64_t id;
    uint64_t t_start_ns;
    router_gen_request_t gen;
    int has_asked_session;
    uint32_t tenant; /* written before submit, read-only afterwards */
    char asked_session[ROUTER_SESSION_ID_BYTES + 1];
    char session[ROUTER_SESSION_ID_BYTES + 1];
    router_request_batch_t pending; /* guarded by lock */
    uint64_t cached_tokens;         /* guarded by lock */
};

tdm_status_t router_request_create(router_gen_request_t *gen, const char *session_id, uint64_t id,
                                   uint64_t t_start_ns, router_request_t **request_out)
{
    router_request_t *r;
    pthread_condattr_t attr;

    if (gen == NULL || request_out == NULL ||
        (session_id != NULL && strlen(session_id) > ROUTER_SESSION_ID_BYTES)) {
        return TDM_ERR_INVALID_ARG;
    }
    r = calloc(1, sizeof(*r));
    if (r == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    pthread_mutex_init(&r->lock, NULL);
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cond, &attr);
    pthread_condattr_destroy(&attr);
    r->n_refs = 1;
    r->id = id;
    r->t_start_ns = t_start_ns;
    if (session_id != NULL) {
        r->has_asked_session = 1;
        strcpy(r->asked_session, session_id);
    }
    r->gen = *gen;
    memset(gen, 0, sizeof(*gen));
    *request_out = r;
    return TDM_OK;
}

router_request_t *router_request_ref(router_request_t *request)
{
    pthread_mutex_lock(&request->lock);
    request->n_refs++;
    pthread_mutex_unlock(&request->lock);
    return request;
}

void router_request_unref(router_request_t *request)
{
    int n_refs;

    if (request == NULL) {
        return;
    }
    pthread_mutex_lock(&request->lock);
    n_refs = --request->n_refs;
    pthread_mutex_unlock(&request->lock);
    if (n_refs > 0) {
        return;
    }
    router_request_batch_fini(&request->pending);
    router_gen_request_fini(&request->gen);
    pthread_cond_destroy(&request->cond);
    pthread_mutex_destroy(&request->lock);
    free(request);
}

const router_gen_request_t *router_request_gen(const router_request_t *request)
{
    return &request->gen;
}

uint64_t router_request_first_id(uint64_t entropy)
{
    uint64_t id = tdm_hash_splitmix64(entropy) >> 2; /* < 2^62 */

    return id != 0 ? id : 1;
}

uint64_t router_request_id(const router_request_t *request)
{
    return request->id;
}

uint64_t router_request_t_start_ns(const router_request_t *request)
{
    return request->t_start_ns;
}

const char *router_request_asked_session(const router_request_t *request)
{
    return request->has_asked_session ? request->asked_session : NULL;
}

void router_request_set_tenant(router_request_t *request, uint32_t tenant)
{
    request->tenant = tenant;
}

uint32_t router_request_tenant(const router_request_t *request)
{
    return request->tenant;
}

void router_request_set_session(router_request_t *request, const char *session_id)
{
    pthread_mutex_lock(&request->lock);
    snprintf(request->session, sizeof(request->session), "%s", session_id);
    pthread_mutex_unlock(&request->lock);
}

void router_request_session(router_request_t *request, char *out, size_t out_bytes)
{
    pthread_mutex_lock(&request->lock);
    snprintf(out, out_bytes, "%s", request->session);
    pthread_mutex_unlock(&request->lock);
}

/* Room for n tokens in each of the batch's parallel arrays; every array grows from b->cap the
 * same way, so they agree on the capacity that is stored at the end. */
static tdm_status_t batch_reserve(router_request_batch_t *b, size_t n)
{
    size_t cap;
    void *p;

    if (n <= b->cap) {
        return TDM_OK;
    }
    cap = b->cap;
    p = tdm_array_grow(b->ids, sizeof(*b->ids), n, BATCH_MIN_TOKENS, &cap);
    if (p == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    b->ids = p;
    cap = b->cap;
    p = tdm_array_grow(b->choice, sizeof(*b->choice), n, BATCH_MIN_TOKENS, &cap);
    if (p == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    b->choice = p;
    cap = b->cap;
    p = tdm_array_grow(b->logprobs, sizeof(*b->logprobs), n, BATCH_MIN_TOKENS, &cap);
    if (p == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    b->logprobs = p;
    cap = b->cap;
    p = tdm_array_grow(b->n_top, sizeof(*b->n_top), n, BATCH_MIN_TOKENS, &cap);
    if (p == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    b->n_top = p;
    cap = b->cap;
    p = tdm_array_grow(b->top_ids, ROUTER_REQUEST_MAX_TOP * sizeof(*b->top_ids), n,
                       BATCH_MIN_TOKENS, &cap);
    if (p == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    b->top_ids = p;
    cap = b->cap;
    p = tdm_array_grow(b->top_logprobs, ROUTER_REQUEST_MAX_TOP * sizeof(*b->top_logprobs), n,
                       BATCH_MIN_TOKENS, &cap);
    if (p == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    b->top_logprobs = p;
    b->cap = cap;
    return TDM_OK;
}

void router_request_set_cached_tokens(router_request_t *request, uint64_t n)
{
    pthread_mutex_lock(&request->lock);
    request->cached_tokens = n;
    pthread_mutex_unlock(&request->lock);
}

uint64_t router_request_cached_tokens(router_request_t *request)
{
    uint64_t n;

    pthread_mutex_lock(&request->lock);
    n = request->cached_tokens;
    pthread_mutex_unlock(&request->lock);
    return n;
}

tdm_status_t router_request_post_tokens(router_request_t *request, uint32_t choice,
                                        const int32_t *ids, const float *logprobs,
                                        Tandem__TopLogprobs *const *top, size_t n)
{
    router_request_batch_t *b = &request->pending;
    tdm_status_t status = TDM_OK;

    pthread_mutex_lock(&request->lock);
    if (b->end != ROUTER_REQUEST_OPEN || n == 0) {
        goto out_unlock;
    }
    status = batch_reserve(b, b->n + n);
    if (status != TDM_OK) {
        goto out_unlock;
    }
    for (size_t i = 0; i < n; i++) {
        size_t k = b->n + i;
        size_t n_top = 0;
        b->ids[k] = ids[i];
        b->choice[k] = (uint8_t)choice;
        b->logprobs[k] = logprobs != NULL ? logprobs[i] : NAN;
        if (top != NULL && top[i] != NULL) {
            n_top = top[i]->n_tokens < ROUTER_REQUEST_MAX_TOP ? top[i]->n_tokens
                                                              : ROUTER_REQUEST_MAX_TOP;
            for (size_t j = 0; j < n_top; j++) {
                b->top_ids[k * ROUTER_REQUEST_MAX_TOP + j] = top[i]->tokens[j];
                b->top_logprobs[k * ROUTER_REQUEST_MAX_TOP + j] = top[i]->logprobs[j];
            }
        }
        b->n_top[k] = (uint8_t)n_top;
    }
    b->n += n;
    pthread_cond_broadcast(&request->cond);
out_unlock:
    pthread_mutex_unlock(&request->lock);
    return status;
}

void router_request_post_finish(router_request_t *request, router_request_finish_t finish)
{
    pthread_mutex_lock(&request->lock);
    if (request->pending.end == ROUTER_REQUEST_OPEN) {
        request->pending.end = ROUTER_REQUEST_FINISHED;
        request->pending.finish = finish;
        pthread_cond_broadcast(&request->cond);
    }
    pthread_mutex_unlock(&request->lock);
}

void router_request_post_error(router_request_t *request, const router_apierr_t *error)
{
    pthread_mutex_lock(&request->lock);
    if (request->pending.end == ROUTER_REQUEST_OPEN) {
        request->pending.end = ROUTER_REQUEST_FAILED;
        request->pending.error = *error;
        pthread_cond_broadcast(&request->cond);
    }
    pthread_mutex_unlock(&request->lock);
}

tdm_status_t router_request_take(router_request_t *request, uint64_t deadline_ns,
                                 router_request_batch_t *batch)
{
    struct timespec deadline;
    router_request_batch_t swap;
    tdm_status_t status = TDM_OK;

    deadline.tv_sec = (time_t)(deadline_ns / TDM_NS_PER_S);
    deadline.tv_nsec = (long)(deadline_ns % TDM_NS_PER_S);
    batch->n = 0;
    pthread_mutex_lock(&request->lock);
    while (request->pending.n == 0 && request->pending.end == batch->end) {
        int rc = pthread_cond_timedwait(&request->cond, &request->lock, &deadline);
        if (rc == ETIMEDOUT) {
            status = TDM_ERR_TIMEOUT;
            break;
        }
    }
    if (request->pending.n > 0) {
        swap = *batch;
        batch->ids = request->pending.ids;
        batch->choice = request->pending.choice;
        batch->logprobs = request->pending.logprobs;
        batch->n_top = request->pending.n_top;
        batch->top_ids = request->pending.top_ids;
        batch->top_logprobs = request->pending.top_logprobs;
        batch->n = request->pending.n;
        batch->cap = request->pending.cap;
        request->pending.ids = swap.ids;
        request->pending.choice = swap.choice;
        request->pending.logprobs = swap.logprobs;
        request->pending.n_top = swap.n_top;
        request->pending.top_ids = swap.top_ids;
        request->pending.top_logprobs = swap.top_logprobs;
        request->pending.cap = swap.cap;
        request->pending.n = 0;
        status = TDM_OK;
    }
    batch->end = request->pending.end;
    batch->finish = request->pending.finish;
    batch->error = request->pending.error;
    pthread_mutex_unlock(&request->lock);
    return status;
}

void router_request_batch_fini(router_request_batch_t *batch)
{
    free(batch->ids);
    free(batch->choice);
    free(batch->logprobs);
    free(batch->n_top);
    free(batch->top_ids);
    free(batch->top_logprobs);
    memset(batch, 0, sizeof(*batch));
}
