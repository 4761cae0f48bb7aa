/* test_router_ring.c - consistent hashing of session ids onto routers (router/ring.h): every
 * router's share of many keys stays within +-10 % of 1/N, removing a router moves only its own
 * keys (about 1/N) and the replica is always a different router. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "router/ring.h"

#define N_KEYS 200000

static router_ring_t *ring_of(int n)
{
    router_ring_t *r;
    char id[32];

    assert_int_equal(router_ring_create(&r), TDM_OK);
    for (int i = 0; i < n; i++) {
        snprintf(id, sizeof(id), "router-%d", i);
        assert_int_equal(router_ring_add(r, id), TDM_OK);
    }
    return r;
}

static const char *owner_of(const router_ring_t *r, int k)
{
    char sid[32];
    const char *o[1] = {NULL};

    snprintf(sid, sizeof(sid), "s-%08x", (unsigned)k);
    assert_int_equal(router_ring_owners(r, router_ring_key(sid), o, 1), 1);
    return o[0];
}

static void check_balance(int n)
{
    router_ring_t *r = ring_of(n);
    size_t counts[8] = {0};
    double expect = (double)N_KEYS / n;

    for (int k = 0; k < N_KEYS; k++) {
        int who = -1;
        assert_int_equal(sscanf(owner_of(r, k), "router-%d", &who), 1);
        counts[who]++;
    }
    for (int i = 0; i < n; i++) {
        double share = (double)counts[i] / expect;
        printf("routers=%d router-%d keys=%zu share_of_fair=%.3f\n", n, i, counts[i], share);
        assert_true(share > 0.90 && share < 1.10);
    }
    router_ring_destroy(r);
}

static void test_balance_within_ten_percent(void **state)
{
    (void)state;
    check_balance(2);
    check_balance(3);
    check_balance(5);
}

static void test_removing_a_router_moves_only_its_keys(void **state)
{
    router_ring_t *before = ring_of(4);
    router_ring_t *after = ring_of(4);
    size_t moved = 0;

    (void)state;
    assert_int_equal(router_ring_remove(after, "router-2"), TDM_OK);
    assert_int_equal(router_ring_remove(after, "router-2"), TDM_ERR_NOT_FOUND);
    assert_int_equal(router_ring_size(after), 3);
    for (int k = 0; k < N_KEYS; k++) {
        const char *a = owner_of(before, k);
        const char *b = owner_of(after, k);
        if (strcmp(a, b) != 0) {
            assert_string_equal(a, "router-2"); /* only the removed router's keys move */
            moved++;
        }
    }
    printf("moved=%zu of %d (1/N=%.0f)\n", moved, N_KEYS, N_KEYS / 4.0);
    assert_true(moved > N_KEYS / 4 * 0.9 && moved < N_KEYS / 4 * 1.1);
    router_ring_destroy(before);
    router_ring_destroy(after);
}

static void test_replica_is_another_router(void **state)
{
    router_ring_t *r = ring_of(3);
    const char *o[4];

    (void)state;
    for (int k = 0; k < 1000; k++) {
        char sid[32];
        snprintf(sid, sizeof(sid), "sess-%d", k);
        assert_int_equal(router_ring_owners(r, router_ring_key(sid), o, 4), 3);
        assert_string_not_equal(o[0], o[1]);
        assert_string_not_equal(o[1], o[2]);
        assert_string_not_equal(o[0], o[2]);
    }
    router_ring_destroy(r);
}

static void test_bad_members_refused(void **state)
{
    router_ring_t *r;
    const char *o[1];

    (void)state;
    assert_int_equal(router_ring_create(&r), TDM_OK);
    assert_int_equal(router_ring_owners(r, 1, o, 1), 0); /* empty */
    assert_int_equal(router_ring_add(r, ""), TDM_ERR_INVALID_ARG);
    assert_int_equal(router_ring_add(r, "has space"), TDM_ERR_INVALID_ARG);
    assert_int_equal(router_ring_add(r, "a"), TDM_OK);
    assert_int_equal(router_ring_add(r, "a"), TDM_ERR_INVALID_ARG);
    assert_int_equal(router_ring_owners(r, 1, o, 1), 1);
    assert_string_equal(o[0], "a");
    router_ring_destroy(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_balance_within_ten_percent),
        cmocka_unit_test(test_removing_a_router_moves_only_its_keys),
        cmocka_unit_test(test_replica_is_another_router),
        cmocka_unit_test(test_bad_members_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
