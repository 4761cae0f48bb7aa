/* pool.c - the CPU kernels' worker pool (kern_pool_t in kernels/backend.h, run through
 * kernels/cpu/pool.h): pthreads, one mutex, two condition variables; a job is (fn, arg, n_chunks)
 * plus the next unclaimed chunk and the count of finished ones, all read and written under the
 * mutex. Every worker is started at create and joined at destroy. */
#include "kernels/cpu/pool.h"

#include "common/log.h"

#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

struct kern_pool {
    pthread_mutex_t mu;
    pthread_cond_t work;     /* a new job was posted, or the pool is stopping */
    pthread_cond_t done;     /* a job's last chunk finished */
    pthread_mutex_t call_mu; /* one job at a time; others run on their caller */
    pthread_t *threads;      /* [n_workers] */
    int n_workers;
    int stopping; /* set by destroy: workers return */
    uint64_t gen; /* job generation, bumped per job */
    cpu_pool_chunk_fn *fn;
    void *arg;
    int64_t n_chunks;
    int64_t next;
    int64_t n_done;
    int helpers_left; /* workers still allowed to join the current job */
};

/* Claim and run chunks of the current job until none is left; called with mu held, returns
 * with it held. */
static void run_chunks(kern_pool_t *p)
{
    while (p->next < p->n_chunks) {
        int64_t c = p->next++;
        cpu_pool_chunk_fn *fn = p->fn;
        void *arg = p->arg;
        pthread_mutex_unlock(&p->mu);
        fn(arg, c);
        pthread_mutex_lock(&p->mu);
        if (++p->n_done == p->n_chunks) {
            pthread_cond_broadcast(&p->done);
        }
    }
}

/* arg: the pool. Workers start before any job is posted (generation 0). */
static void *worker_main(void *arg)
{
    kern_pool_t *p = arg;
    uint64_t seen = 0;

    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->gen == seen && !p->stopping) {
            pthread_cond_wait(&p->work, &p->mu);
        }
        if (p->stopping) {
            break;
        }
        seen = p->gen;
        if (p->helpers_left > 0 && p->next < p->n_chunks) {
            p->helpers_left--;
            run_chunks(p);
        }
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Stop and join every started worker, then free the pool. */
static void stop_and_free(kern_pool_t *p)
{
    pthread_mutex_lock(&p->mu);
    p->stopping = 1;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_workers; i++) {
        pthread_join(p->threads[i], NULL);
    }
    pthread_cond_destroy(&p->done);
    pthread_cond_destroy(&p->work);
    pthread_mutex_destroy(&p->call_mu);
    pthread_mutex_destroy(&p->mu);
    free(p->threads);
    free(p);
}

tdm_status_t kern_pool_create(int n_threads, kern_pool_t **pool_out)
{
    kern_pool_t *p;
    int n_workers;

    if (pool_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    if (n_threads < 1 || n_threads > KERN_POOL_MAX_THREADS) {
        tdm_log(TDM_LOG_WARN, "kernels", "worker pool rejected: n_threads=%d allowed=1..%d",
                n_threads, KERN_POOL_MAX_THREADS);
        return TDM_ERR_INVALID_ARG;
    }
    n_workers = n_threads - 1;
    p = calloc(1, sizeof(*p));
    if (p == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    p->threads = calloc((size_t)(n_workers > 0 ? n_workers : 1), sizeof(*p->threads));
    if (p->threads == NULL) {
        free(p);
        return TDM_ERR_NO_MEMORY;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->call_mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->done, NULL);
    while (p->n_workers < n_workers) {
        int rc = pthread_create(&p->threads[p->n_workers], NULL, worker_main, p);
        if (rc != 0) {
            tdm_log(TDM_LOG_ERROR, "kernels", "worker pool: pthread_create failed: %s workers=%d",
                    strerror(rc), p->n_workers);
            stop_and_free(p);
            return TDM_ERR_NO_MEMORY;
        }
        p->n_workers++;
    }
    *pool_out = p;
    return TDM_OK;
}

void kern_pool_destroy(kern_pool_t *pool)
{
    if (pool == NULL) {
        return;
    }
    stop_and_free(pool);
}

int kern_pool_n_threads(const kern_pool_t *pool)
{
    return pool != NULL ? pool->n_workers + 1 : 1;
}

void cpu_pool_run(kern_pool_t *pool, int n_threads, int64_t n_chunks, cpu_pool_chunk_fn *fn,
                  void *arg)
{
    kern_pool_t *p = pool;
    int helpers;

    if (n_chunks <= 0) {
        return;
    }
    if (p == NULL || p->n_workers == 0 || n_threads <= 1 || n_chunks == 1 ||
        pthread_mutex_trylock(&p->call_mu) != 0) {
        for (int64_t c = 0; c < n_chunks; c++) {
            fn(arg, c);
        }
        return;
    }
    pthread_mutex_lock(&p->mu);
    helpers = p->n_workers;
    if (helpers > n_threads - 1) {
        helpers = n_threads - 1;
    }
    p->fn = fn;
    p->arg = arg;
    p->n_chunks = n_chunks;
    p->next = 0;
    p->n_done = 0;
    p->helpers_left = helpers;
    p->gen++;
    pthread_cond_broadcast(&p->work);
    run_chunks(p);
    while (p->n_done < p->n_chunks) {
        pthread_cond_wait(&p->done, &p->mu);
    }
    p->helpers_left = 0;
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&p->call_mu);
}
