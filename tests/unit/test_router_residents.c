/* test_router_residents.c - the index of sessions the decode nodes report holding
 * (router/residents.h): each report replaces the node's list, lookups pick the live node holding
 * the most positions, a node that left is forgotten, and the index grows past its first table. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "router/residents.h"

static int only_b_live(void *ctx, const char *id)
{
    (void)ctx;
    return strcmp(id, "node-b") == 0;
}

static void test_reports_replace_and_lookup_picks_longest(void **state)
{
    router_residents_t *r;
    uint64_t keys_a[] = {11, 22, 33};
    uint64_t lens_a[] = {100, 200, 300};
    uint64_t keys_b[] = {22};
    uint64_t lens_b[] = {250};
    char id[ROUTER_RESIDENTS_ID_BYTES + 1];
    uint64_t len = 0;

    (void)state;
    assert_int_equal(router_residents_create(&r), TDM_OK);
    assert_int_equal(router_residents_update(r, "node-a", keys_a, 3, lens_a, 3), TDM_OK);
    assert_int_equal(router_residents_update(r, "node-b", keys_b, 1, lens_b, 1), TDM_OK);
    assert_int_equal(router_residents_count(r), 4);
    assert_int_equal(router_residents_lookup(r, 22, NULL, NULL, id, &len), 1);
    assert_string_equal(id, "node-b");
    assert_int_equal(len, 250);
    assert_int_equal(router_residents_lookup(r, 33, NULL, NULL, id, &len), 1);
    assert_string_equal(id, "node-a");
    assert_int_equal(router_residents_lookup(r, 33, only_b_live, NULL, id, &len), 0);
    assert_int_equal(router_residents_lookup(r, 44, NULL, NULL, id, &len), 0);
    /* a new report replaces the old list: 33 is gone from node-a, 22 grew */
    lens_a[1] = 400;
    assert_int_equal(router_residents_update(r, "node-a", keys_a, 2, lens_a, 2), TDM_OK);
    assert_int_equal(router_residents_lookup(r, 33, NULL, NULL, id, &len), 0);
    assert_int_equal(router_residents_lookup(r, 22, NULL, NULL, id, &len), 1);
    assert_string_equal(id, "node-a");
    assert_int_equal(len, 400);
    router_residents_forget(r, "node-a");
    assert_int_equal(router_residents_lookup(r, 22, NULL, NULL, id, &len), 1);
    assert_string_equal(id, "node-b");
    assert_int_equal(router_residents_count(r), 1);
    assert_int_equal(router_residents_update(r, "", keys_b, 1, lens_b, 1), TDM_ERR_INVALID_ARG);
    router_residents_destroy(r);
}

static void test_many_keys(void **state)
{
    enum { N = 4096 };
    static uint64_t keys[N];
    router_residents_t *r;
    char id[ROUTER_RESIDENTS_ID_BYTES + 1];
    uint64_t len = 0;

    (void)state;
    for (int i = 0; i < N; i++) {
        keys[i] = (uint64_t)i * 0x100000001ull + 7;
    }
    assert_int_equal(router_residents_create(&r), TDM_OK);
    assert_int_equal(router_residents_update(r, "n1", keys, N, NULL, 0), TDM_OK);
    assert_int_equal(router_residents_update(r, "n2", keys, N / 2, keys, N / 2), TDM_OK);
    assert_int_equal(router_residents_count(r), N + N / 2);
    for (int i = 0; i < N; i++) {
        assert_int_equal(router_residents_lookup(r, keys[i], NULL, NULL, id, &len), 1);
        assert_string_equal(id, i < N / 2 ? "n2" : "n1");
    }
    router_residents_update(r, "n2", NULL, 0, NULL, 0);
    assert_int_equal(router_residents_count(r), N);
    router_residents_destroy(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reports_replace_and_lookup_picks_longest),
        cmocka_unit_test(test_many_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
