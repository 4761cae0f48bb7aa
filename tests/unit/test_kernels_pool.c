/* test_kernels_pool.c - the CPU kernels' worker pool (kern_pool_t, kernels/backend.h): argument
 * errors, workers that really run chunks, two kernel contexts with pools of their own used from
 * two threads at once (bit-identical GEMMs), every worker joined at destroy, each chunk of
 * back-to-back jobs run exactly once with polling and with sleeping workers, a bad
 * TANDEM_POOL_SPIN_US, attention rows (and one query's heads) split over a pool equal to each
 * row alone (and the one-thread call), and the read bandwidth probe's readers. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <time.h>
#include <cmocka.h>
#include "common/clock.h"
#include "kernels/attention.h"
#include "kernels/backend.h"
#include "kernels/codec.h"
#include "kernels/cpu/pool.h"
#include "kernels/gemm.h"

/* A worker that never comes fails, not hangs. */
#define WAIT_LIMIT_NS (10LL * (int64_t)TDM_NS_PER_S)

/* Threads of this process (entries of /proc/self/task), or -1 where that is not readable. */
static int count_threads(void)
{
    DIR *dir = opendir("/proc/self/task");
    struct dirent *e;
    int n = 0;
    if (dir == NULL) {
        return -1;
    }
    while ((e = readdir(dir)) != NULL) {
        if (e->d_name[0] != '.') {
            n++;
        }
    }
    closedir(dir);
    return n;
}

static int64_t now_ns(void)
{
    return (int64_t)tdm_clock_now_ns();
}

static void test_create_rejects_bad_arguments_and_destroy_accepts_null(void **state)
{
    kern_pool_t *pool = (kern_pool_t *)&pool; /* a value create must leave alone */
    (void)state;
    assert_int_equal(kern_pool_create(0, &pool), TDM_ERR_INVALID_ARG);
    assert_int_equal(kern_pool_create(KERN_POOL_MAX_THREADS + 1, &pool), TDM_ERR_INVALID_ARG);
    assert_ptr_equal(pool, (kern_pool_t *)&pool);
    assert_int_equal(kern_pool_create(2, NULL), TDM_ERR_INVALID_ARG);
    kern_pool_destroy(NULL);
    assert_int_equal(kern_pool_n_threads(NULL), 1);
    assert_int_equal(kern_pool_create(1, &pool), TDM_OK); /* no workers: the caller alone */
    assert_int_equal(kern_pool_n_threads(pool), 1);
    kern_pool_destroy(pool);
}

/* Chunk 0 waits until chunk 1 has run: only a second thread can run chunk 1 while the caller is
 * inside chunk 0, so the job finishes only if a worker takes part. */
typedef struct {
    pthread_mutex_t mu;
    int chunk1_done;
    int chunk0_saw_it;
} handshake_t;

static void handshake_chunk(void *arg, int64_t c)
{
    handshake_t *h = arg;
    if (c == 1) {
        pthread_mutex_lock(&h->mu);
        h->chunk1_done = 1;
        pthread_mutex_unlock(&h->mu);
        return;
    }
    int64_t t_end_ns = now_ns() + WAIT_LIMIT_NS;
    for (;;) {
        int done;
        pthread_mutex_lock(&h->mu);
        done = h->chunk1_done;
        pthread_mutex_unlock(&h->mu);
        if (done || now_ns() > t_end_ns) {
            h->chunk0_saw_it = done;
            return;
        }
        sched_yield();
    }
}

/*
 * count_threads once it is <= `limit` (at_least = 0) or >= `limit` (at_least = 1), polling for
 * up to 2 s: a joined thread can stay listed in /proc/self/task for a moment after pthread_join
 * returns (seen under qemu-user), and threads of an earlier test may still be leaving. A thread
 * that is never joined stays listed and fails the check.
 */
static int count_threads_settled(int limit, int at_least)
{
    int n = count_threads();
    for (int i = 0; i < 200 && (at_least ? n < limit : n > limit); i++) {
        struct timespec ts = {0, (long)(10 * TDM_NS_PER_MS)};
        nanosleep(&ts, NULL);
        n = count_threads();
    }
    return n;
}

static void test_workers_run_chunks_beside_the_caller_and_are_joined(void **state)
{
    int n_before = count_threads();
    kern_pool_t *pool = NULL;
    (void)state;
    assert_int_equal(kern_pool_create(3, &pool), TDM_OK);
    assert_int_equal(kern_pool_n_threads(pool), 3);
    if (n_before > 0) {
        assert_true(count_threads_settled(n_before + 2, 1) >= n_before + 2);
    }
    for (int rep = 0; rep < 20; rep++) {
        handshake_t h = {PTHREAD_MUTEX_INITIALIZER, 0, 0};
        cpu_pool_run(pool, 2, 2, handshake_chunk, &h);
        assert_int_equal(h.chunk0_saw_it, 1);
        pthread_mutex_destroy(&h.mu);
    }
    kern_pool_destroy(pool);
    if (n_before > 0) {
        assert_true(count_threads_settled(n_before, 0) <= n_before);
    } else {
        print_message("/proc/self/task unreadable: thread counts not checked\n");
    }
}

/* One kernel context with its own pool, used by one thread: GEMMs on it equal the reference bit
 * for bit. */
typedef struct {
    int n_threads;
    uint32_t seed;
    int ok;
} ctx_job_t;

static float next_rand(uint32_t *s, float scale)
{
    *s = *s * 1664525u + 1013904223u;
    return ((float)(*s >> 8) / 16777216.0f * 2.0f - 1.0f) * scale;
}

static void *ctx_thread(void *arg)
{
    ctx_job_t *job = arg;
    const int64_t n_out = 2056, n_in = 1024, n_rows = 3;
    uint16_t *w = malloc(sizeof(uint16_t) * (size_t)(n_out * n_in));
    float *x = malloc(sizeof(float) * (size_t)(n_rows * n_in));
    float *y = malloc(sizeof(float) * (size_t)(n_rows * n_out));
    float *y_ref = malloc(sizeof(float) * (size_t)(n_rows * n_out));
    kern_ctx_t ctx = {.backend = KERN_BACKEND_CPU, .n_threads = job->n_threads};
    kern_mat_t m = {KERN_MAT_BF16, n_out, n_in, w, NULL, NULL};
    uint32_t s = job->seed;
    int ok = w != NULL && x != NULL && y != NULL && y_ref != NULL &&
             kern_pool_create(job->n_threads, &ctx.pool) == TDM_OK;

    if (ok) {
        for (int64_t i = 0; i < n_out * n_in; i++) {
            w[i] = kern_bf16_from_f32(next_rand(&s, 0.1f));
        }
        for (int64_t i = 0; i < n_rows * n_in; i++) {
            x[i] = next_rand(&s, 3.0f);
        }
        ok = kern_gemm_ref_cpu(NULL, &m, x, n_in, n_rows, 0, y_ref, n_out) == TDM_OK;
    }
    for (int rep = 0; ok && rep < 10; rep++) {
        memset(y, 0, sizeof(float) * (size_t)(n_rows * n_out));
        ok = kern_gemm_cpu(&ctx, &m, x, n_in, n_rows, 0, y, n_out) == TDM_OK &&
             memcmp(y, y_ref, sizeof(float) * (size_t)(n_rows * n_out)) == 0;
    }
    kern_pool_destroy(ctx.pool);
    free(w);
    free(x);
    free(y);
    free(y_ref);
    job->ok = ok;
    return NULL;
}

static void test_two_contexts_with_own_pools_run_at_once_and_join(void **state)
{
    int n_before = count_threads();
    pthread_t th[2];
    ctx_job_t jobs[2] = {{2, 1u, 0}, {3, 7u, 0}};
    (void)state;
    for (int i = 0; i < 2; i++) {
        assert_int_equal(pthread_create(&th[i], NULL, ctx_thread, &jobs[i]), 0);
    }
    for (int i = 0; i < 2; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_equal(jobs[i].ok, 1);
    }
    if (n_before > 0) {
        /* every worker of both pools joined */
        assert_true(count_threads_settled(n_before, 0) <= n_before);
    }
}

static void test_context_without_pool_runs_on_the_caller(void **state)
{
    const int64_t n_out = 4100, n_in = 1024;
    float *w = calloc((size_t)(n_out * n_in), sizeof(float));
    float *x = calloc((size_t)n_in, sizeof(float));
    float *y = malloc(sizeof(float) * (size_t)n_out);
    kern_ctx_t ctx = {.n_threads = 4}; /* no pool: one thread, same results */
    kern_mat_t m = {KERN_MAT_F32, n_out, n_in, w, NULL, NULL};
    (void)state;
    assert_non_null(w);
    assert_non_null(x);
    assert_non_null(y);
    for (int64_t i = 0; i < n_in; i++) {
        x[i] = 1.0f;
        w[5 * n_in + i] = 0.5f;
    }
    assert_int_equal(kern_gemm_cpu(&ctx, &m, x, n_in, 1, 0, y, n_out), TDM_OK);
    assert_true(y[5] == 0.5f * (float)n_in);
    assert_true(y[6] == 0.0f);
    free(w);
    free(x);
    free(y);
}

/* Chunks that count their own runs (atomically: two threads may run chunks of one job). */
typedef struct {
    _Atomic int *hits;
} count_job_t;

static void count_chunk(void *arg, int64_t c)
{
    count_job_t *j = arg;
    atomic_fetch_add(&j->hits[c], 1);
}

/* Each chunk of each job ran exactly once (the thread count varies per job). */
static int run_counted(kern_pool_t *pool, int n_threads, int64_t n_chunks)
{
    _Atomic int *hits = calloc((size_t)n_chunks, sizeof(*hits));
    count_job_t job = {hits};
    int ok = hits != NULL;
    if (ok) {
        cpu_pool_run(pool, n_threads, n_chunks, count_chunk, &job);
        for (int64_t c = 0; c < n_chunks; c++) {
            ok = ok && atomic_load(&hits[c]) == 1;
        }
    }
    free(hits);
    return ok;
}

/*
 * Many short jobs back to back (the pattern of a decode step: a worker may still be finishing one
 * job's claim loop when the next is posted, and must never run a chunk of the wrong job), jobs
 * with more chunks than one ticket holds (posted in parts), and the same with workers that sleep
 * between jobs instead of polling (TANDEM_POOL_SPIN_US=0, a pause before every job: the wake-up
 * path). A wrong claim runs a chunk twice or never (the job then hangs: ctest's timeout).
 */
static void test_back_to_back_jobs_run_each_chunk_once_polling_or_sleeping(void **state)
{
    (void)state;
    for (int mode = 0; mode < 2; mode++) {
        kern_pool_t *pool = NULL;
        if (mode == 1) {
            assert_int_equal(setenv("TANDEM_POOL_SPIN_US", "0", 1), 0);
        }
        assert_int_equal(kern_pool_create(4, &pool), TDM_OK);
        for (int it = 0; it < (mode == 0 ? 5000 : 200); it++) {
            if (mode == 1) {
                struct timespec ts = {0, 200 * 1000};
                nanosleep(&ts, NULL);
            }
            assert_true(run_counted(pool, 1 + it % 4, 1 + (it * 7) % 37));
        }
        assert_true(run_counted(pool, 4, 20000)); /* more than one ticket's 8191 chunks */
        kern_pool_destroy(pool);
        assert_int_equal(unsetenv("TANDEM_POOL_SPIN_US"), 0);
    }
}

/* A TANDEM_POOL_SPIN_US that is not 0..100000 microseconds: the pool starts anyway (a warning,
 * the default polling) and runs jobs. */
static void test_bad_spin_setting_keeps_the_default(void **state)
{
    const char *bad[] = {"-1", "abc", "100001", "12x"};
    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        kern_pool_t *pool = NULL;
        assert_int_equal(setenv("TANDEM_POOL_SPIN_US", bad[i], 1), 0);
        assert_int_equal(kern_pool_create(2, &pool), TDM_OK);
        assert_true(run_counted(pool, 2, 64));
        kern_pool_destroy(pool);
    }
    assert_int_equal(unsetenv("TANDEM_POOL_SPIN_US"), 0);
}

/* kern_attention_rows_cpu on a pool (rows split into chunks, each chunk with scratch of its
 * own): every row equals kern_attention_cpu of that row alone, bit for bit, at 2 and 3 threads
 * and rows with different key counts; a bad row refuses the call with every output untouched. */
static void test_attention_rows_split_over_the_pool_equal_each_row_alone(void **state)
{
    enum { R = 7, NH = 4, D = 64, KA = 40, KB = 90 };
    static float q[R][NH * D], ka[KA * D], kb[KB * D], sink[NH];
    static float want[R][NH * D], got[R][NH * D], scratch[NH * (KA + KB)];
    kern_attn_row_t rows[R];
    uint32_t s = 11u;
    (void)state;
    for (int i = 0; i < R; i++) {
        for (int j = 0; j < NH * D; j++) {
            q[i][j] = next_rand(&s, 1.0f);
        }
    }
    for (int j = 0; j < KA * D; j++) {
        ka[j] = next_rand(&s, 1.0f);
    }
    for (int j = 0; j < KB * D; j++) {
        kb[j] = next_rand(&s, 1.0f);
    }
    for (int h = 0; h < NH; h++) {
        sink[h] = next_rand(&s, 2.0f);
    }
    for (int i = 0; i < R; i++) {
        int64_t n_a = KA - 5 * i, n_b = i % 3 == 0 ? 0 : KB - 11 * i; /* uneven rows */
        rows[i] = (kern_attn_row_t){q[i], ka, n_b > 0 ? kb : NULL, got[i], n_a, n_b};
        assert_int_equal(kern_attention_cpu(NULL, q[i], ka, n_a, rows[i].keys_b, n_b, sink, NH, D,
                                            0.125f, scratch, want[i]),
                         TDM_OK);
    }
    for (int n_threads = 2; n_threads <= 3; n_threads++) {
        kern_ctx_t ctx = {.backend = KERN_BACKEND_CPU, .n_threads = n_threads};
        assert_int_equal(kern_pool_create(n_threads, &ctx.pool), TDM_OK);
        for (int rep = 0; rep < 20; rep++) {
            memset(got, 0, sizeof(got));
            assert_int_equal(kern_attention_rows_cpu(&ctx, rows, R, sink, NH, D, 0.125f, scratch),
                             TDM_OK);
            assert_memory_equal(got, want, sizeof(got));
        }
        rows[R - 1].n_a = -1; /* a bad last row: nothing written, not even the good rows */
        memset(got, 0x7F, sizeof(got));
        assert_int_equal(kern_attention_rows_cpu(&ctx, rows, R, sink, NH, D, 0.125f, scratch),
                         TDM_ERR_INVALID_ARG);
        for (int i = 0; i < R; i++) {
            for (int j = 0; j < NH * D; j++) {
                uint32_t bits;
                memcpy(&bits, &got[i][j], sizeof(bits));
                assert_true(bits == 0x7F7F7F7Fu);
            }
        }
        rows[R - 1].n_a = KA - 5 * (R - 1);
        kern_pool_destroy(ctx.pool);
    }
}

/* One query's heads split over a pool (kern_attention_cpu, kern_attention_sel_cpu with enough
 * keys): the outputs equal the one-thread call's, bit for bit, at 2 and 3 threads with a head
 * count that does not divide evenly; the selected-rows form equals the gathered form. */
static void test_one_query_heads_split_over_the_pool_equal_one_thread(void **state)
{
    enum { NH = 5, D = 64, KA = 40, KB = 90 };
    static float q[NH * D], ka[KA * D], rows[2 * KB * D], kb[KB * D], sink[NH];
    static float want[NH * D], got[NH * D], scratch[NH * (KA + KB)];
    int32_t sel[KB];
    uint32_t s = 23u;
    (void)state;
    for (int j = 0; j < NH * D; j++) {
        q[j] = next_rand(&s, 1.0f);
    }
    for (int j = 0; j < KA * D; j++) {
        ka[j] = next_rand(&s, 1.0f);
    }
    for (int j = 0; j < 2 * KB * D; j++) {
        rows[j] = next_rand(&s, 1.0f);
    }
    for (int i = 0; i < KB; i++) { /* every other row, backwards */
        sel[i] = 2 * (KB - 1 - i);
        memcpy(kb + i * D, rows + sel[i] * D, sizeof(float) * D);
    }
    for (int h = 0; h < NH; h++) {
        sink[h] = next_rand(&s, 2.0f);
    }
    assert_int_equal(
        kern_attention_cpu(NULL, q, ka, KA, kb, KB, sink, NH, D, 0.125f, scratch, want), TDM_OK);
    for (int n_threads = 2; n_threads <= 3; n_threads++) {
        kern_ctx_t ctx = {.backend = KERN_BACKEND_CPU, .n_threads = n_threads};
        assert_int_equal(kern_pool_create(n_threads, &ctx.pool), TDM_OK);
        for (int rep = 0; rep < 20; rep++) {
            memset(got, 0, sizeof(got));
            assert_int_equal(
                kern_attention_cpu(&ctx, q, ka, KA, kb, KB, sink, NH, D, 0.125f, scratch, got),
                TDM_OK);
            assert_memory_equal(got, want, sizeof(got));
            memset(got, 0, sizeof(got));
            assert_int_equal(kern_attention_sel_cpu(&ctx, q, ka, KA, rows, sel, KB, sink, NH, D,
                                                    0.125f, scratch, got),
                             TDM_OK);
            assert_memory_equal(got, want, sizeof(got));
        }
        kern_pool_destroy(ctx.pool);
    }
}

/* kern_read_bandwidth_cpu with one and several readers: a positive rate; 0 for arguments it
 * refuses (no readers, more than a pool may have, no passes, a buffer under one group). */
static void test_read_bandwidth_with_readers(void **state)
{
    (void)state;
    for (int n_threads = 1; n_threads <= 3; n_threads++) {
        assert_true(kern_read_bandwidth_cpu(1u << 20, 2, n_threads) > 0.0);
    }
    assert_true(kern_read_bandwidth_cpu(1000, 1, 4) > 0.0); /* fewer groups than readers: ok */
    assert_true(kern_read_bandwidth_cpu(1u << 20, 2, 0) == 0.0);
    assert_true(kern_read_bandwidth_cpu(1u << 20, 2, KERN_POOL_MAX_THREADS + 1) == 0.0);
    assert_true(kern_read_bandwidth_cpu(1u << 20, 0, 2) == 0.0);
    assert_true(kern_read_bandwidth_cpu(32, 2, 2) == 0.0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_rejects_bad_arguments_and_destroy_accepts_null),
        cmocka_unit_test(test_workers_run_chunks_beside_the_caller_and_are_joined),
        cmocka_unit_test(test_two_contexts_with_own_pools_run_at_once_and_join),
        cmocka_unit_test(test_context_without_pool_runs_on_the_caller),
        cmocka_unit_test(test_back_to_back_jobs_run_each_chunk_once_polling_or_sleeping),
        cmocka_unit_test(test_bad_spin_setting_keeps_the_default),
        cmocka_unit_test(test_attention_rows_split_over_the_pool_equal_each_row_alone),
        cmocka_unit_test(test_one_query_heads_split_over_the_pool_equal_one_thread),
        cmocka_unit_test(test_read_bandwidth_with_readers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
