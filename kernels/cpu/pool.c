/* pool.c - the CPU kernels' worker pool (kern_pool_t in kernels/backend.h, run through
 * kernels/cpu/pool.h).
 *
 * A job is (fn, arg, base) plus one 64-bit atomic ticket: the job's sequence number, how many
 * workers may help, its chunk count and the next unclaimed chunk. A chunk is claimed by a
 * compare-and-swap that advances `next` only while the ticket still names the claimer's job, so a
 * worker that slept through a job never claims a chunk of the next one, and fn/arg/base are read
 * only after a claim succeeds (the job cannot end, and its fields cannot be rewritten, while one
 * of its chunks is claimed and not done). Finished chunks are counted in n_done; the caller claims
 * too and then waits for n_done to reach the chunk count.
 *
 * Waiting: a decode step is hundreds of GEMVs of a few microseconds each, and waking a thread
 * through a condition variable costs about as much as one of them, so an idle worker first polls
 * the ticket for spin_ns (TANDEM_POOL_SPIN_US, default KERN_POOL_SPIN_US_DEFAULT) and only then
 * sleeps on the condition variable; the caller wakes sleepers only when there are any (a
 * seq_cst store of the ticket then a load of `sleepers`, against the worker's increment of
 * `sleepers` then load of the ticket: one of the two sees the other). Between decode steps and
 * on an idle server the workers sleep; TANDEM_POOL_SPIN_US=0 never polls (for boxes shared with
 * other busy processes). Every worker of the pool polls after each job, also one that a job
 * with fewer threads than the pool left out (the engine makes its pool as large as its
 * n_threads, so none is left out there). Every worker is started at create and joined at
 * destroy.
 */
#include "kernels/cpu/pool.h"

#include "common/clock.h"
#include "common/log.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* Microseconds an idle worker polls for the next job before it sleeps (longer than the gaps
 * between the GEMMs of a decode step, shorter than a step). */
#define KERN_POOL_SPIN_US_DEFAULT 200
#define KERN_POOL_SPIN_US_MAX     100000

/* The ticket's fields: next (bits 0-12), n (13-25), helpers (26-31), seq (32-63). */
#define TK_NEXT_BITS  13
#define TK_N_SHIFT    13
#define TK_HELP_SHIFT 26
#define TK_SEQ_SHIFT  32
#define TK_FIELD_MASK ((1u << TK_NEXT_BITS) - 1u)
#define TK_MAX_CHUNKS ((int64_t)TK_FIELD_MASK) /* chunks per ticket; larger jobs go in parts */
#define TK_NEXT(t)    ((int64_t)((t)&TK_FIELD_MASK))
#define TK_N(t)       ((int64_t)(((t) >> TK_N_SHIFT) & TK_FIELD_MASK))
#define TK_HELPERS(t) ((int)(((t) >> TK_HELP_SHIFT) & 0x3Fu))
#define TK_SEQ(t)     ((uint32_t)((t) >> TK_SEQ_SHIFT))
_Static_assert(KERN_POOL_MAX_THREADS - 1 <= 0x3F, "the ticket's helpers field holds 6 bits");

struct kern_pool {
    pthread_mutex_t mu;      /* guards the condition variable's waits only */
    pthread_cond_t work;     /* a new job was posted, or the pool is stopping */
    pthread_mutex_t call_mu; /* one job at a time; others run on their caller */
    pthread_t *threads;      /* [n_workers] */
    int n_workers;
    int64_t spin_ns; /* a worker's polling before it sleeps */
    _Atomic uint64_t ticket;
    _Atomic int64_t n_done;
    _Atomic int sleepers;
    _Atomic int stopping; /* set by destroy: workers return */
    uint32_t seq;         /* the last job's sequence number (the caller's, under call_mu) */
    /* the current job: written by the caller before it publishes the ticket */
    cpu_pool_chunk_fn *fn;
    void *arg;
    int64_t base; /* chunk c of the ticket is fn(arg, base + c) */
};

/* One worker: the pool and its index (workers with index < the ticket's helpers take part). */
typedef struct {
    kern_pool_t *pool;
    int index;
} worker_arg_t;

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield" ::: "memory");
#endif
}

/* Claim and run chunks of job `seq` until none is left or another job holds the ticket. */
static void run_chunks(kern_pool_t *p, uint32_t seq)
{
    for (;;) {
        uint64_t t = atomic_load_explicit(&p->ticket, memory_order_acquire);
        do {
            if (TK_SEQ(t) != seq || TK_NEXT(t) >= TK_N(t)) {
                return;
            }
        } while (!atomic_compare_exchange_weak_explicit(&p->ticket, &t, t + 1, memory_order_acq_rel,
                                                        memory_order_acquire));
        p->fn(p->arg, p->base + TK_NEXT(t));
        atomic_fetch_add_explicit(&p->n_done, 1, memory_order_release);
    }
}

/* The ticket of a job newer than `seen`, or 0 once the pool is stopping: polls for spin_ns, then
 * sleeps on the condition variable. */
static uint64_t wait_job(kern_pool_t *p, uint32_t seen)
{
    int64_t t_end = -1;
    for (unsigned i = 0;; i++) {
        uint64_t t = atomic_load_explicit(&p->ticket, memory_order_acquire);
        if (atomic_load_explicit(&p->stopping, memory_order_relaxed)) {
            return 0;
        }
        if (TK_SEQ(t) != seen) {
            return t;
        }
        if ((i & 63u) == 0) {
            int64_t now = (int64_t)tdm_clock_now_ns();
            if (t_end < 0) {
                t_end = now + p->spin_ns;
            }
            if (now >= t_end) {
                break;
            }
        }
        cpu_relax();
    }
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->sleepers, 1);
    uint64_t t = atomic_load(&p->ticket);
    while (TK_SEQ(t) == seen && !atomic_load(&p->stopping)) {
        pthread_cond_wait(&p->work, &p->mu);
        t = atomic_load(&p->ticket);
    }
    atomic_fetch_sub(&p->sleepers, 1);
    pthread_mutex_unlock(&p->mu);
    return atomic_load(&p->stopping) ? 0 : t;
}

/* arg: a worker_arg_t (freed here). Workers start before any job is posted (sequence 0). */
static void *worker_main(void *arg)
{
    worker_arg_t wa = *(worker_arg_t *)arg;
    kern_pool_t *p = wa.pool;
    uint32_t seen = 0;
    free(arg);
    for (;;) {
        uint64_t t = wait_job(p, seen);
        if (t == 0) {
            break;
        }
        seen = TK_SEQ(t);
        if (wa.index < TK_HELPERS(t)) {
            run_chunks(p, seen);
        }
    }
    return NULL;
}

/* Stop and join every started worker, then free the pool. */
static void stop_and_free(kern_pool_t *p)
{
    atomic_store(&p->stopping, 1);
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_workers; i++) {
        pthread_join(p->threads[i], NULL);
    }
    pthread_cond_destroy(&p->work);
    pthread_mutex_destroy(&p->call_mu);
    pthread_mutex_destroy(&p->mu);
    free(p->threads);
    free(p);
}

/* TANDEM_POOL_SPIN_US in nanoseconds (a bad value: the default, with a warning). */
static int64_t spin_ns_from_env(void)
{
    const char *env = getenv("TANDEM_POOL_SPIN_US");
    long us = KERN_POOL_SPIN_US_DEFAULT;
    if (env != NULL && *env != '\0') {
        char *end = NULL;
        errno = 0;
        long v = strtol(env, &end, 10);
        if (errno != 0 || end == env || *end != '\0' || v < 0 || v > KERN_POOL_SPIN_US_MAX) {
            tdm_log(TDM_LOG_WARN, "kernels",
                    "TANDEM_POOL_SPIN_US=%s: expected 0..%d microseconds; using %d", env,
                    KERN_POOL_SPIN_US_MAX, KERN_POOL_SPIN_US_DEFAULT);
        } else {
            us = v;
        }
    }
    return (int64_t)us * 1000;
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
    atomic_init(&p->ticket, 0);
    atomic_init(&p->n_done, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->stopping, 0);
    p->spin_ns = spin_ns_from_env();
    while (p->n_workers < n_workers) {
        worker_arg_t *wa = malloc(sizeof(*wa));
        int rc = wa == NULL ? ENOMEM : 0;
        if (wa != NULL) {
            wa->pool = p;
            wa->index = p->n_workers;
            rc = pthread_create(&p->threads[p->n_workers], NULL, worker_main, wa);
            if (rc != 0) {
                free(wa);
            }
        }
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

/* Post chunks [base, base + n) (n <= TK_MAX_CHUNKS) to `helpers` workers, claim beside them,
 * and return when all have run. Called with call_mu held. */
static void run_part(kern_pool_t *p, int helpers, int64_t base, int64_t n, cpu_pool_chunk_fn *fn,
                     void *arg)
{
    uint32_t seq;
    p->fn = fn;
    p->arg = arg;
    p->base = base;
    atomic_store_explicit(&p->n_done, 0, memory_order_relaxed);
    p->seq = p->seq + 1 == 0 ? 1 : p->seq + 1; /* sequence 0: before any job */
    seq = p->seq;
    atomic_store(&p->ticket, ((uint64_t)seq << TK_SEQ_SHIFT) |
                                 ((uint64_t)helpers << TK_HELP_SHIFT) |
                                 ((uint64_t)n << TK_N_SHIFT));
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->work);
        pthread_mutex_unlock(&p->mu);
    }
    run_chunks(p, seq);
    /* only chunks a worker has claimed are left: they are running */
    for (unsigned i = 0; atomic_load_explicit(&p->n_done, memory_order_acquire) < n; i++) {
        if (i < 4096) {
            cpu_relax();
        } else {
            sched_yield(); /* a worker descheduled inside its chunk */
        }
    }
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
    helpers = p->n_workers;
    if (helpers > n_threads - 1) {
        helpers = n_threads - 1;
    }
    for (int64_t base = 0; base < n_chunks; base += TK_MAX_CHUNKS) {
        int64_t n = n_chunks - base < TK_MAX_CHUNKS ? n_chunks - base : TK_MAX_CHUNKS;
        run_part(p, helpers, base, n, fn, arg);
    }
    pthread_mutex_unlock(&p->call_mu);
}
