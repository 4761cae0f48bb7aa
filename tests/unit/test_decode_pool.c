/* test_decode_pool.c - the decode node's page pool and reservations (decode-node/pool.h), in
 * process on the tiny preset and without UCX (no transfer context): a reservation takes exactly
 * the pages it asked for and gives them back when released; a reservation beyond the free pages
 * fails with TDM_ERR_NO_PAGES and changes nothing; an aborted (fenced) or lapsed reservation
 * keeps its pages until its fence has passed, then frees them; every page comes back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "common/clock.h"
#include "decode-node/pool.h"
#include "forward_test_util.h"

#define POOL_PAGES 64u
#define FENCE_MS   1000u
#define TIMEOUT_MS 10u
#define LATER_NS   (3600ull * TDM_NS_PER_S) /* past every deadline these tests set */

typedef struct {
    ftu_engine_t engine; /* the model (its own small pool is not used here) */
    decode_pool_t *pool;
    uint32_t n_sources;
    uint32_t first[NODE_MAX_SOURCES];
    uint32_t need[NODE_MAX_SOURCES];
    int n_lapsed;
    decode_resv_t *lapsed;
} fixture_t;

static int setup(void **state)
{
    fixture_t *fx = calloc(1, sizeof(*fx));

    if (fx == NULL || ftu_engine_open(&fx->engine, 16) != 0) {
        return -1;
    }
    if (decode_pool_create(fx->engine.model, POOL_PAGES, NULL, &fx->pool) != TDM_OK) {
        return -1;
    }
    fx->n_sources = (uint32_t)fx->engine.cfg->n_kv_source_layer_ids;
    *state = fx;
    return 0;
}

/* Every page free again and no reservation left, then free the fixture. */
static int teardown(void **state)
{
    fixture_t *fx = *state;
    int ok = decode_pool_n_free(fx->pool) == POOL_PAGES && decode_pool_n_reserved(fx->pool) == 0;

    decode_pool_destroy(fx->pool);
    ok = ftu_engine_close(&fx->engine) == 0 && ok;
    free(fx);
    return ok ? 0 : -1;
}

/* need[s] = per_source pages for every source, first[s] = 0. */
static void ask(fixture_t *fx, uint32_t per_source)
{
    for (uint32_t s = 0; s < fx->n_sources; s++) {
        fx->first[s] = 0;
        fx->need[s] = per_source;
    }
}

/* need[source] = n pages, none from the other sources. */
static void ask_in(fixture_t *fx, uint32_t source, uint32_t n)
{
    ask(fx, 0);
    fx->need[source] = n;
}

/* The pool's free and reserved page counts are these. */
static void expect_pages(const fixture_t *fx, uint32_t n_free, uint32_t n_reserved)
{
    assert_int_equal(decode_pool_n_free(fx->pool), n_free);
    assert_int_equal(decode_pool_n_reserved(fx->pool), n_reserved);
}

static tdm_status_t reserve(fixture_t *fx, uint32_t timeout_ms, decode_resv_t **resv_out)
{
    return decode_pool_reserve(fx->pool, 7, "session-a", 0, 64, fx->first, fx->need, timeout_ms,
                               resv_out);
}

/* A reservation of per_source pages in every source, which must succeed. */
static decode_resv_t *reserve_ok(fixture_t *fx, uint32_t per_source, uint32_t timeout_ms)
{
    decode_resv_t *resv = NULL;

    ask(fx, per_source);
    assert_int_equal(reserve(fx, timeout_ms, &resv), TDM_OK);
    assert_non_null(resv);
    return resv;
}

static void on_lapse(void *arg, decode_resv_t *resv)
{
    fixture_t *fx = arg;

    fx->n_lapsed++;
    fx->lapsed = resv;
}

static void test_pool_starts_with_every_page_free(void **state)
{
    fixture_t *fx = *state;
    const uint8_t *desc = (const uint8_t *)"x";
    size_t n_desc = 1;

    assert_true(fx->n_sources > 0);
    assert_int_equal(decode_pool_n_total(fx->pool), POOL_PAGES);
    expect_pages(fx, POOL_PAGES, 0);
    decode_pool_descriptor(fx->pool, &desc, &n_desc); /* no transfer context: no descriptor */
    assert_null(desc);
    assert_int_equal(n_desc, 0);
}

static void test_reserve_takes_its_pages_and_release_returns_them(void **state)
{
    fixture_t *fx = *state;
    decode_resv_t *resv;

    resv = reserve_ok(fx, 2, 10000);
    assert_non_null(resv);
    assert_int_equal(resv->n_pages, 2 * fx->n_sources);
    assert_int_equal(resv->n_sources, fx->n_sources);
    assert_int_equal(resv->state, DECODE_RESV_ACTIVE);
    assert_int_equal(resv->request_id, 7);
    assert_string_equal(resv->session_id, "session-a");
    for (uint32_t s = 0; s < fx->n_sources; s++) {
        assert_int_equal(resv->tables[s].n_pages, 2);
    }
    expect_pages(fx, POOL_PAGES - 2 * fx->n_sources, 2 * fx->n_sources);
    assert_ptr_equal(decode_pool_find(fx->pool, resv->id), resv);
    assert_null(decode_pool_find(fx->pool, resv->id + 1)); /* ids are odd: +1 is none */

    decode_pool_release(fx->pool, resv);
    expect_pages(fx, POOL_PAGES, 0);
}

static void test_two_reservations_get_distinct_ids_and_pages(void **state)
{
    fixture_t *fx = *state;
    decode_resv_t *a = reserve_ok(fx, 1, 10000);
    decode_resv_t *b = reserve_ok(fx, 1, 10000);

    assert_true(a->id != b->id);
    for (uint32_t s = 0; s < fx->n_sources; s++) {
        assert_true(a->tables[s].page_ids[0] != b->tables[s].page_ids[0]);
    }
    expect_pages(fx, POOL_PAGES - 2 * fx->n_sources, 2 * fx->n_sources);
    decode_pool_release(fx->pool, a);
    assert_ptr_equal(decode_pool_find(fx->pool, b->id), b);
    expect_pages(fx, POOL_PAGES - fx->n_sources, fx->n_sources);
    decode_pool_release(fx->pool, b);
}

static void test_reserve_beyond_free_fails_and_changes_nothing(void **state)
{
    fixture_t *fx = *state;
    decode_resv_t *resv = NULL;

    ask_in(fx, 0, POOL_PAGES + 1);
    assert_int_equal(reserve(fx, 10000, &resv), TDM_ERR_NO_PAGES);
    assert_null(resv);
    expect_pages(fx, POOL_PAGES, 0);
}

static void test_exhausted_pool_refuses_one_more_page(void **state)
{
    fixture_t *fx = *state;
    decode_resv_t *all = NULL;
    decode_resv_t *more = NULL;

    ask_in(fx, 0, POOL_PAGES); /* every page, in one source */
    assert_int_equal(reserve(fx, 10000, &all), TDM_OK);
    expect_pages(fx, 0, POOL_PAGES);

    ask_in(fx, fx->n_sources - 1, 1);
    assert_int_equal(reserve(fx, 10000, &more), TDM_ERR_NO_PAGES);
    assert_null(more);
    expect_pages(fx, 0, POOL_PAGES);
    assert_ptr_equal(decode_pool_find(fx->pool, all->id), all);

    decode_pool_release(fx->pool, all);
    expect_pages(fx, POOL_PAGES, 0);
}

static void test_fenced_reservation_keeps_its_pages_until_the_fence(void **state)
{
    fixture_t *fx = *state;
    decode_resv_t *resv;
    uint64_t now;
    uint64_t next;

    resv = reserve_ok(fx, 1, 10000);
    decode_pool_fence(fx->pool, resv, FENCE_MS);
    assert_int_equal(resv->state, DECODE_RESV_FENCED);
    now = tdm_clock_now_ns();

    /* before the fence: the pages stay held (a remote write may still land) */
    next = decode_pool_expire(fx->pool, now, FENCE_MS, on_lapse, fx);
    assert_true(next > 0 && next <= (uint64_t)FENCE_MS * TDM_NS_PER_MS);
    assert_int_equal(fx->n_lapsed, 0); /* a fenced reservation does not lapse again */
    assert_ptr_equal(decode_pool_find(fx->pool, resv->id), resv);
    expect_pages(fx, POOL_PAGES - fx->n_sources, fx->n_sources);

    /* past it: freed */
    next = decode_pool_expire(fx->pool, now + LATER_NS, FENCE_MS, on_lapse, fx);
    assert_true(next == UINT64_MAX);
    assert_int_equal(fx->n_lapsed, 0);
    expect_pages(fx, POOL_PAGES, 0);
}

static void test_lapsed_reservation_is_reported_once_then_freed(void **state)
{
    fixture_t *fx = *state;
    decode_resv_t *resv;
    uint64_t id;
    uint64_t now;

    resv = reserve_ok(fx, 1, TIMEOUT_MS);
    id = resv->id;
    now = tdm_clock_now_ns() + 2ull * TIMEOUT_MS * TDM_NS_PER_MS; /* past its timeout */

    assert_true(decode_pool_expire(fx->pool, now, FENCE_MS, on_lapse, fx) != UINT64_MAX);
    assert_int_equal(fx->n_lapsed, 1);
    assert_ptr_equal(fx->lapsed, resv);
    assert_int_equal(resv->state, DECODE_RESV_FENCED); /* fenced, pages still held */
    expect_pages(fx, POOL_PAGES - fx->n_sources, fx->n_sources);

    assert_int_equal(decode_pool_expire(fx->pool, now + LATER_NS, FENCE_MS, on_lapse, fx),
                     UINT64_MAX);
    assert_int_equal(fx->n_lapsed, 1);
    assert_null(decode_pool_find(fx->pool, id));
    expect_pages(fx, POOL_PAGES, 0);
}

static void test_lapse_all_times_out_every_active_reservation_at_once(void **state)
{
    fixture_t *fx = *state;
    decode_resv_t *a;
    decode_resv_t *b;
    uint64_t now = tdm_clock_now_ns();

    a = reserve_ok(fx, 1, 600000); /* a ReservePages.timeout_ms of 610 s would hold them 10 min */
    b = reserve_ok(fx, 1, 600000);
    decode_pool_fence(fx->pool, b, FENCE_MS); /* already fenced: not lapsed again */
    assert_int_equal(decode_pool_expire(fx->pool, now, FENCE_MS, on_lapse, fx) > 0, 1);
    assert_int_equal(fx->n_lapsed, 0);

    assert_int_equal(decode_pool_lapse_all(fx->pool, now), 1);
    assert_int_equal(decode_pool_lapse_all(fx->pool, now), 0); /* once */
    decode_pool_expire(fx->pool, now, FENCE_MS, on_lapse, fx);
    assert_int_equal(fx->n_lapsed, 1);
    assert_ptr_equal(fx->lapsed, a);
    assert_int_equal(a->state, DECODE_RESV_FENCED); /* pages wait for the writer's fence */
    expect_pages(fx, POOL_PAGES - 2 * fx->n_sources, 2 * fx->n_sources);

    assert_int_equal(decode_pool_expire(fx->pool, now + LATER_NS, FENCE_MS, on_lapse, fx),
                     UINT64_MAX);
    expect_pages(fx, POOL_PAGES, 0);
}

static void test_destroy_frees_reservations_still_held(void **state)
{
    fixture_t *fx = *state;
    decode_pool_t *other = NULL;
    decode_resv_t *resv = NULL;

    /* a second pool left with a reservation: destroy releases it (ASan sees any leak) */
    assert_int_equal(decode_pool_create(fx->engine.model, 16, NULL, &other), TDM_OK);
    ask(fx, 1);
    assert_int_equal(decode_pool_reserve(other, 1, "s", 0, 64, fx->first, fx->need, 10000, &resv),
                     TDM_OK);
    assert_int_equal(decode_pool_n_reserved(other), fx->n_sources);
    decode_pool_destroy(other);
    decode_pool_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_pool_starts_with_every_page_free, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reserve_takes_its_pages_and_release_returns_them,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_two_reservations_get_distinct_ids_and_pages, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_reserve_beyond_free_fails_and_changes_nothing, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_exhausted_pool_refuses_one_more_page, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fenced_reservation_keeps_its_pages_until_the_fence,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_lapsed_reservation_is_reported_once_then_freed, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_lapse_all_times_out_every_active_reservation_at_once,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_destroy_frees_reservations_still_held, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
