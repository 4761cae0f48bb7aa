/* test_router_fence.c - the router's table of writer fences it still owes decode nodes
 * (router/fence.h): an entry is taken only by its writer's answer of the same (request, attempt),
 * or when its writer or reservation owner goes; a full table drops its oldest entry (whose pages
 * then wait for the decode node's timer) and keeps working. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "router/fence.h"

static router_fence_t entry(uint64_t request_id, uint32_t attempt, int prefill_slot,
                            int decode_slot)
{
    router_fence_t f = {request_id,  attempt, request_id * 10 + attempt, prefill_slot, 1,
                        decode_slot, 1};
    return f;
}

static void test_only_the_writers_answer_of_that_attempt_takes_it(void **state)
{
    router_fences_t *t;
    router_fence_t e = entry(5, 1, 2, 3), out;

    (void)state;
    assert_int_equal(router_fences_create(&t), TDM_OK);
    assert_int_equal(router_fences_add(t, &e), 0);
    assert_false(router_fences_take(t, 2, 5, 2, &out)); /* the retry's answer: not this fence */
    assert_false(router_fences_take(t, 4, 5, 1, &out)); /* another worker */
    assert_false(router_fences_take(t, 2, 6, 1, &out)); /* another request */
    assert_true(router_fences_take(t, 2, 5, 1, &out));
    assert_int_equal(out.reservation_id, 51);
    assert_int_equal(out.decode_slot, 3);
    assert_int_equal(router_fences_n(t), 0);
    assert_false(router_fences_take(t, 2, 5, 1, &out)); /* taken once */
    router_fences_destroy(t);
}

static void test_a_going_worker_takes_its_entries(void **state)
{
    router_fences_t *t;
    router_fence_t a = entry(1, 1, 2, 3), b = entry(2, 1, 4, 3), c = entry(3, 1, 4, 5), out;
    int n = 0;

    (void)state;
    assert_int_equal(router_fences_create(&t), TDM_OK);
    router_fences_add(t, &a);
    router_fences_add(t, &b);
    router_fences_add(t, &c);
    while (router_fences_take_slot(t, 3, &out)) { /* the decode node of a and b */
        assert_int_equal(out.decode_slot, 3);
        n++;
    }
    assert_int_equal(n, 2);
    assert_true(router_fences_take_slot(t, 4, &out)); /* c's writer */
    assert_int_equal(out.request_id, 3);
    assert_int_equal(router_fences_n(t), 0);
    router_fences_destroy(t);
}

static void test_a_full_table_drops_its_oldest(void **state)
{
    router_fences_t *t;
    router_fence_t out;

    (void)state;
    assert_int_equal(router_fences_create(&t), TDM_OK);
    for (uint32_t i = 1; i <= ROUTER_FENCES; i++) {
        router_fence_t e = entry(i, 1, 0, 1);
        assert_int_equal(router_fences_add(t, &e), 0);
    }
    {
        router_fence_t e = entry(ROUTER_FENCES + 1, 1, 0, 1);
        assert_int_equal(router_fences_add(t, &e), 1);
    }
    assert_int_equal(router_fences_n(t), ROUTER_FENCES);
    assert_false(router_fences_take(t, 0, 1, 1, &out));
    assert_true(router_fences_take(t, 0, 2, 1, &out));
    assert_true(router_fences_take(t, 0, ROUTER_FENCES + 1, 1, &out));
    router_fences_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_only_the_writers_answer_of_that_attempt_takes_it),
        cmocka_unit_test(test_a_going_worker_takes_its_entries),
        cmocka_unit_test(test_a_full_table_drops_its_oldest),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
