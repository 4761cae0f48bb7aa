/* test_sim_evq.c - sim/evq.h: events pop in time order, ties in push order, bad times refused,
 * and the heap stays ordered across growth and interleaved pushes and pops. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "sim/evq.h"

static void test_time_then_push_order(void **state)
{
    sim_evq_t *q = NULL;
    sim_event_t ev;
    const double times[6] = {3.0, 1.0, 2.0, 1.0, 0.0, 1.0};

    (void)state;
    assert_int_equal(sim_evq_create(2, &q), TDM_OK);
    for (uint32_t i = 0; i < 6; i++) {
        assert_int_equal(sim_evq_push(q, times[i], 7, i, 100 + i), TDM_OK);
    }
    assert_int_equal(sim_evq_size(q), 6);
    /* 0.0 (id 4), then the three 1.0 in push order (1, 3, 5), then 2.0 (2), 3.0 (0) */
    const uint32_t want[6] = {4, 1, 3, 5, 2, 0};
    for (int i = 0; i < 6; i++) {
        assert_int_equal(sim_evq_pop(q, &ev), 1);
        assert_int_equal(ev.id, want[i]);
        assert_int_equal(ev.kind, 7);
        assert_int_equal(ev.arg, 100 + want[i]);
        assert_true(ev.t_s == times[want[i]]);
    }
    assert_int_equal(sim_evq_pop(q, &ev), 0);
    assert_int_equal(sim_evq_pushed(q), 6);
    sim_evq_destroy(q);
}

static void test_bad_time_refused(void **state)
{
    sim_evq_t *q = NULL;

    (void)state;
    assert_int_equal(sim_evq_create(0, &q), TDM_OK);
    assert_int_equal(sim_evq_push(q, -1.0, 0, 0, 0), TDM_ERR_INVALID_ARG);
    assert_int_equal(sim_evq_push(q, NAN, 0, 0, 0), TDM_ERR_INVALID_ARG);
    assert_int_equal(sim_evq_push(q, INFINITY, 0, 0, 0), TDM_ERR_INVALID_ARG);
    assert_int_equal(sim_evq_size(q), 0);
    sim_evq_destroy(q);
    sim_evq_destroy(NULL);
}

/* 20,000 pseudo-random pushes interleaved with pops: every pop is >= the previous one. */
static void test_interleaved_order(void **state)
{
    sim_evq_t *q = NULL;
    sim_event_t ev;
    uint64_t x = 12345;
    double last = 0.0, now = 0.0;
    size_t popped = 0;

    (void)state;
    assert_int_equal(sim_evq_create(4, &q), TDM_OK);
    for (int i = 0; i < 20000; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        assert_int_equal(sim_evq_push(q, now + (double)(x >> 44) / 1e3, 0, (uint32_t)i, 0), TDM_OK);
        if (i % 3 == 2) {
            assert_int_equal(sim_evq_pop(q, &ev), 1);
            assert_true(ev.t_s >= last);
            last = now = ev.t_s;
            popped++;
        }
    }
    while (sim_evq_pop(q, &ev)) {
        assert_true(ev.t_s >= last);
        last = ev.t_s;
        popped++;
    }
    assert_int_equal(popped, 20000);
    sim_evq_destroy(q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_time_then_push_order),
        cmocka_unit_test(test_bad_time_refused),
        cmocka_unit_test(test_interleaved_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
