/* pool.c - the CPU kernels' worker pool (kernels/cpu/pool.h): pthreads, one mutex, two
 * condition variables; a job is (fn, arg, n_chunks) plus the next unclaimed chunk and the count
 * of finished ones, all read and written under the mutex. */
#include "kernels/cpu/pool.h"

#include <pthread.h>
#include <stddef.h>

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t work;     /* a new job was posted */
    pthread_cond_t done;     /* a job's last chunk finished */
    pthread_mutex_t call_mu; /* one job at a time; others run on their caller */
    int n_workers;
    uint64_t gen; /* job generation, bumped per job */
    cpu_pool_chunk_fn *fn;
    void *arg;
    int64_t n_chunks;
    int64_t next;
    int64_t n_done;
    int helpers_left; /* workers still allowed to join the current job */
} cpu_pool_t;

static cpu_pool_t g_pool = {PTHREAD_MUTEX_INITIALIZER,
                            PTHREAD_COND_INITIALIZER,
                            PTHREAD_COND_INITIALIZER,
                            PTHREAD_MUTEX_INITIALIZER,
                            0,
                            0,
                            NULL,
                            NULL,
                            0,
                            0,
                            0,
                            0};

/* Claim and run chunks of the current job until none is left; called with mu held, returns
 * with it held. */
static void run_chunks(cpu_pool_t *p)
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

/* arg: the generation before the worker was started (it may join the job being posted). */
static void *worker_main(void *arg)
{
    cpu_pool_t *p = &g_pool;
    uint64_t seen = (uint64_t)(uintptr_t)arg;

    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->gen == seen) {
            pthread_cond_wait(&p->work, &p->mu);
        }
        seen = p->gen;
        if (p->helpers_left > 0 && p->next < p->n_chunks) {
            p->helpers_left--;
            run_chunks(p);
        }
    }
    return NULL; /* not reached: workers live as long as the process */
}

/* Start workers up to n (mu held). Returns how many exist. */
static int grow(cpu_pool_t *p, int n)
{
    if (n > CPU_POOL_MAX_WORKERS) {
        n = CPU_POOL_MAX_WORKERS;
    }
    while (p->n_workers < n) {
        pthread_t th;
        pthread_attr_t attr;
        int rc;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        rc = pthread_create(&th, &attr, worker_main, (void *)(uintptr_t)p->gen);
        pthread_attr_destroy(&attr);
        if (rc != 0) {
            break;
        }
        p->n_workers++;
    }
    return p->n_workers;
}

void cpu_pool_run(int n_threads, int64_t n_chunks, cpu_pool_chunk_fn *fn, void *arg)
{
    cpu_pool_t *p = &g_pool;
    int helpers;

    if (n_chunks <= 0) {
        return;
    }
    if (n_threads <= 1 || n_chunks == 1 || pthread_mutex_trylock(&p->call_mu) != 0) {
        for (int64_t c = 0; c < n_chunks; c++) {
            fn(arg, c);
        }
        return;
    }
    pthread_mutex_lock(&p->mu);
    helpers = grow(p, n_threads - 1);
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
    if (helpers > 0) {
        pthread_cond_broadcast(&p->work);
    }
    run_chunks(p);
    while (p->n_done < p->n_chunks) {
        pthread_cond_wait(&p->done, &p->mu);
    }
    p->helpers_left = 0;
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&p->call_mu);
}
