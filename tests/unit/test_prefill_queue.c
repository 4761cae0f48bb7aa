/* test_prefill_queue.c - the prefill node's job queue and its aborts (prefill-node/queue.h,
 * docs/PROTOCOL.md 4a): an abort names one attempt of one request, drops only that job and
 * reports it (the node answers it with an AbortAck); a retry (same request, next attempt) is never
 * cancelled by an earlier abort, whether the abort named its attempt or came from a PROTO_VERSION
 * 2 router without one; an abort that arrives before its job still stops it; the remembered
 * aborts are a ring that keeps working past its size. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "prefill-node/queue.h"

/* A PrefillJob envelope as the node's link delivers it (packed, then unpacked). */
static Tandem__Envelope *job_env(uint64_t request_id, uint64_t reservation_id, uint32_t attempt)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__PrefillJob job = TANDEM__PREFILL_JOB__INIT;
    Tandem__SamplingParams sp = TANDEM__SAMPLING_PARAMS__INIT;
    int32_t tokens[3] = {5, 6, 7};
    Tandem__Envelope *copy = NULL;
    uint8_t *buf;
    size_t n;

    job.request_id = request_id;
    job.session_id = (char *)"s";
    job.decode_incarnation_id = (char *)"decode-1";
    job.reservation_id = reservation_id;
    job.attempt = attempt;
    job.delta_tokens = tokens;
    job.n_delta_tokens = 3;
    job.canonical_start = 1;
    sp.top_p = 1.0;
    job.sampling = &sp;
    env.body_case = TANDEM__ENVELOPE__BODY_PREFILL_JOB;
    env.prefill_job = &job;
    assert_int_equal(proto_pack(&env, &buf, &n), TDM_OK);
    assert_int_equal(proto_unpack(buf, n, 0, &copy, NULL, 0), TDM_OK);
    free(buf);
    return copy;
}

typedef struct {
    int n;
    uint64_t request_id[8];
    uint32_t attempt[8];
} dropped_t;

static void on_dropped(void *arg, const Tandem__PrefillJob *job)
{
    dropped_t *d = arg;

    if (d->n < 8) {
        d->request_id[d->n] = job->request_id;
        d->attempt[d->n] = job->attempt;
    }
    d->n++;
}

static void test_abort_drops_only_the_named_attempt_and_reports_it(void **state)
{
    prefill_queue_t *q;
    prefill_abort_t a = {7, 0, 1};
    dropped_t d = {0};
    Tandem__Envelope *env;

    (void)state;
    assert_int_equal(prefill_queue_create(&q), TDM_OK);
    assert_int_equal(prefill_queue_push(q, job_env(7, 11, 1), 0), TDM_OK);
    assert_int_equal(prefill_queue_push(q, job_env(7, 12, 2), 0), TDM_OK); /* the retry */
    assert_int_equal(prefill_queue_push(q, job_env(8, 13, 1), 0), TDM_OK); /* another request */
    assert_int_equal(prefill_queue_n_tokens(q), 9);
    assert_int_equal(prefill_queue_abort(q, &a, on_dropped, &d), 1);
    assert_int_equal(d.n, 1);
    assert_int_equal(d.request_id[0], 7);
    assert_int_equal(d.attempt[0], 1);
    assert_int_equal(prefill_queue_n_jobs(q), 2);
    assert_int_equal(prefill_queue_n_tokens(q), 6);
    env = prefill_queue_pop(q, NULL);
    assert_int_equal(env->prefill_job->request_id, 7);
    assert_int_equal(env->prefill_job->attempt, 2);
    assert_false(prefill_queue_is_aborted(q, env->prefill_job));
    proto_envelope_free(env);
    prefill_queue_destroy(q);
}

/* Old code: an Abort with reservation 0 stayed in the ring as "every attempt" and cancelled the
 * retry that came after it, which then got no answer at all. */
static void test_retry_is_never_cancelled_by_an_earlier_abort(void **state)
{
    prefill_queue_t *q;
    prefill_abort_t by_attempt = {21, 0, 1};
    prefill_abort_t v2_any = {21, 0, 0}; /* PROTO_VERSION 2: no attempt, no reservation */
    prefill_abort_t v2_resv = {21, 31, 0};
    dropped_t d = {0};
    Tandem__Envelope *env;

    (void)state;
    assert_int_equal(prefill_queue_create(&q), TDM_OK);
    assert_int_equal(prefill_queue_push(q, job_env(21, 31, 1), 0), TDM_OK);
    assert_int_equal(prefill_queue_abort(q, &by_attempt, on_dropped, &d), 1);
    assert_int_equal(prefill_queue_abort(q, &v2_any, on_dropped, &d), 0);
    assert_int_equal(prefill_queue_abort(q, &v2_resv, on_dropped, &d), 0);
    env = job_env(21, 32, 2); /* the retry: next attempt, new reservation */
    assert_false(prefill_queue_is_aborted(q, env->prefill_job));
    assert_int_equal(prefill_queue_push(q, env, 0), TDM_OK);
    assert_int_equal(prefill_queue_n_jobs(q), 1);
    /* a v2 abort without keys still stops the jobs there when it arrives, never later ones */
    assert_int_equal(prefill_queue_abort(q, &v2_any, on_dropped, &d), 1);
    env = job_env(21, 33, 3);
    assert_false(prefill_queue_is_aborted(q, env->prefill_job));
    proto_envelope_free(env);
    assert_int_equal(d.n, 2);
    prefill_queue_destroy(q);
}

static void test_abort_before_its_job_still_stops_it(void **state)
{
    prefill_queue_t *q;
    prefill_abort_t a = {40, 0, 2};
    Tandem__Envelope *mine = job_env(40, 50, 2), *next = job_env(40, 51, 3);
    Tandem__Envelope *other = job_env(41, 50, 2);

    (void)state;
    assert_int_equal(prefill_queue_create(&q), TDM_OK);
    assert_int_equal(prefill_queue_abort(q, &a, NULL, NULL), 0);
    assert_true(prefill_queue_is_aborted(q, mine->prefill_job));
    assert_false(prefill_queue_is_aborted(q, next->prefill_job));
    assert_false(prefill_queue_is_aborted(q, other->prefill_job));
    proto_envelope_free(mine);
    proto_envelope_free(next);
    proto_envelope_free(other);
    prefill_queue_destroy(q);
}

static void test_remembered_aborts_wrap_around(void **state)
{
    prefill_queue_t *q;
    Tandem__Envelope *env;

    (void)state;
    assert_int_equal(prefill_queue_create(&q), TDM_OK);
    for (uint32_t i = 1; i <= PREFILL_QUEUE_ABORTS + 10; i++) {
        prefill_abort_t a = {1000 + i, 0, 1};
        assert_int_equal(prefill_queue_abort(q, &a, NULL, NULL), 0);
    }
    env = job_env(1000 + PREFILL_QUEUE_ABORTS + 10, 1, 1); /* newest: remembered */
    assert_true(prefill_queue_is_aborted(q, env->prefill_job));
    proto_envelope_free(env);
    env = job_env(1001, 1, 1); /* oldest: replaced */
    assert_false(prefill_queue_is_aborted(q, env->prefill_job));
    proto_envelope_free(env);
    prefill_queue_destroy(q);
}

/* peek shows the oldest job without taking it (the node's admission looks before it pops);
 * an abort of that job moves peek on to the next; pop then takes what peek showed. */
static void test_peek_shows_the_oldest_without_taking_it(void **state)
{
    prefill_queue_t *q = NULL;
    prefill_abort_t a = {41, 0, 1};
    uint64_t epoch = 0;
    Tandem__Envelope *env;

    (void)state;
    assert_int_equal(prefill_queue_create(&q), TDM_OK);
    assert_null(prefill_queue_peek(q));
    assert_int_equal(prefill_queue_push(q, job_env(41, 1, 1), 7), TDM_OK);
    assert_int_equal(prefill_queue_push(q, job_env(42, 2, 1), 8), TDM_OK);
    assert_int_equal(prefill_queue_peek(q)->prefill_job->request_id, 41);
    assert_int_equal(prefill_queue_peek(q)->prefill_job->request_id, 41);
    assert_int_equal(prefill_queue_n_jobs(q), 2);
    assert_int_equal(prefill_queue_abort(q, &a, NULL, NULL), 1);
    assert_int_equal(prefill_queue_peek(q)->prefill_job->request_id, 42);
    env = prefill_queue_pop(q, &epoch);
    assert_int_equal(env->prefill_job->request_id, 42);
    assert_int_equal(epoch, 8);
    assert_null(prefill_queue_peek(q));
    proto_envelope_free(env);
    prefill_queue_destroy(q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_abort_drops_only_the_named_attempt_and_reports_it),
        cmocka_unit_test(test_retry_is_never_cancelled_by_an_earlier_abort),
        cmocka_unit_test(test_abort_before_its_job_still_stops_it),
        cmocka_unit_test(test_remembered_aborts_wrap_around),
        cmocka_unit_test(test_peek_shows_the_oldest_without_taking_it),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
