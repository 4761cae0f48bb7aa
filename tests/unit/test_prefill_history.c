/* test_prefill_history.c - the prefill node's history page cache (prefill-node/history.h) and the
 * page digests the decode node puts in reservation descriptors (node/node_handoff.h).
 *
 * A "decode node" here is a set of block tables in an engine page pool of the tiny preset, filled
 * with rows derived from a seed and sealed, exactly as a decode node's session pages are when it
 * describes a reservation. The cache keeps a copy after a "job"; the next turn's descriptor
 * (history pages with their digests) decides what the job may take from the cache and what it
 * pulls: the test counts the pulled bytes, and checks that every page taken from the cache is
 * byte for byte the page the decode node holds, also after a rewind (cut and rewritten rows).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/config.h"
#include "engine/kv_cache.h"
#include "kernels/kv_page.h"
#include "node/node_handoff.h"
#include "prefill-node/history.h"

#define FP         0x1234abcdULL
#define POOL_PAGES 512u
#define N_SRC      2u /* sources used by these tests (the preset may have more) */

typedef struct {
    engine_config_t cfg;
    engine_kv_pool_t *pool;
    size_t page_bytes;
} fixture_t;

/* One session as the decode node holds it: a table per source. */
typedef struct {
    engine_kv_table_t t[N_SRC];
} sess_t;

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof(*f));

    assert_non_null(f);
    assert_int_equal(engine_config_preset("tiny", &f->cfg), TDM_OK);
    assert_true(f->cfg.n_kv_source_layer_ids >= (int)N_SRC);
    assert_int_equal(engine_kv_pool_create(&f->cfg, FP, POOL_PAGES, &f->pool), TDM_OK);
    f->page_bytes = engine_kv_pool_page_bytes(f->pool);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;

    engine_kv_pool_destroy(f->pool);
    free(f);
    return 0;
}

static int layer_of(const fixture_t *f, uint32_t s)
{
    return (int)f->cfg.kv_source_layer_ids[s];
}

static void sess_init(const fixture_t *f, sess_t *x)
{
    for (uint32_t s = 0; s < N_SRC; s++) {
        int layer = layer_of(f, s);
        engine_kv_table_init(&x->t[s], layer, f->cfg.roles[layer].ratio);
    }
}

static void sess_fini(const fixture_t *f, sess_t *x)
{
    for (uint32_t s = 0; s < N_SRC; s++) {
        engine_kv_table_release(f->pool, &x->t[s]);
    }
}

/* Write rows [from, to) of every source from `seed` and seal every page (a decode step or a
 * prefill; the decode node seals when it describes a reservation). */
static void sess_write(const fixture_t *f, sess_t *x, int64_t from, int64_t to, uint32_t seed)
{
    uint32_t d = (uint32_t)f->cfg.head_dim, dI = (uint32_t)f->cfg.index_head_dim;
    uint8_t mc[4096], ms[512], ic[1024], is[128];

    assert_true(d / 2 <= sizeof(mc) && dI / 2 <= sizeof(ic));
    for (uint32_t s = 0; s < N_SRC; s++) {
        engine_kv_table_t *t = &x->t[s];
        assert_int_equal(engine_kv_table_reserve(f->pool, t, to), TDM_OK);
        for (int64_t r = from; r < to; r++) {
            for (size_t i = 0; i < sizeof(mc); i++) {
                mc[i] = (uint8_t)(seed * 31u + (uint32_t)r * 7u + (uint32_t)i + s);
            }
            memset(ms, 0x38, sizeof(ms)); /* E4M3 1.0 */
            memset(ic, (int)(seed + (uint32_t)r), sizeof(ic));
            memset(is, 127, sizeof(is)); /* UE8M0 2^0 */
            assert_int_equal(
                kern_kv_page_write_row(engine_kv_pool_page(f->pool, t->page_ids[r / 64]),
                                       (uint32_t)(r % 64), mc, ms, ic, is),
                TDM_OK);
        }
        if (to > t->n_rows) {
            t->n_rows = to;
        }
        for (uint32_t j = 0; j < (uint32_t)kern_kv_page_count(t->n_rows); j++) {
            kern_kv_page_seal(engine_kv_pool_page(f->pool, t->page_ids[j]));
        }
    }
}

/* Cut every source to n_rows rows (a rewind) and seal. */
static void sess_cut(const fixture_t *f, sess_t *x, int64_t n_rows)
{
    for (uint32_t s = 0; s < N_SRC; s++) {
        engine_kv_table_truncate(f->pool, &x->t[s], n_rows);
        for (uint32_t j = 0; j < (uint32_t)kern_kv_page_count(n_rows); j++) {
            kern_kv_page_seal(engine_kv_pool_page(f->pool, x->t[s].page_ids[j]));
        }
    }
}

static uint32_t sess_pages(const sess_t *x, uint32_t s)
{
    return (uint32_t)kern_kv_page_count(x->t[s].n_rows);
}

/* The descriptor's history part the decode node would send for the session now (digests of
 * its sealed pages; with_digests 0: a version-1 descriptor). Free with node_resv_desc_fini. */
static void sess_desc(const fixture_t *f, const sess_t *x, int with_digests, node_resv_desc_t *rd)
{
    memset(rd, 0, sizeof(*rd));
    rd->n_sources = N_SRC;
    for (uint32_t s = 0; s < N_SRC; s++) {
        uint32_t n = sess_pages(x, s);
        rd->src[s].layer = layer_of(f, s);
        rd->src[s].n_history = n;
        rd->src[s].history = malloc((n + 1) * sizeof(uint32_t));
        rd->src[s].history_digests = with_digests ? malloc((n + 1) * sizeof(uint64_t)) : NULL;
        assert_non_null(rd->src[s].history);
        for (uint32_t j = 0; j < n; j++) {
            rd->src[s].history[j] = x->t[s].page_ids[j];
            if (with_digests) {
                rd->src[s].history_digests[j] =
                    node_page_digest(engine_kv_pool_page(f->pool, x->t[s].page_ids[j]));
            }
        }
    }
}

/* The session's pages into the cache (what prefill_job_run does after a job). */
static void sess_keep(const fixture_t *f, prefill_history_t *h, const char *id, const sess_t *x)
{
    int32_t layers[N_SRC];
    uint32_t n_pages[N_SRC];
    const void *pages[POOL_PAGES];
    uint32_t k = 0;

    for (uint32_t s = 0; s < N_SRC; s++) {
        layers[s] = layer_of(f, s);
        n_pages[s] = sess_pages(x, s);
        for (uint32_t j = 0; j < n_pages[s]; j++) {
            pages[k++] = engine_kv_pool_page(f->pool, x->t[s].page_ids[j]);
        }
    }
    assert_int_equal(prefill_history_keep(h, id, N_SRC, layers, n_pages, pages), TDM_OK);
}

/* A job's pull for `rd`: returns the pages it must pull; checks that every cached page it may
 * use is the decode node's page, byte for byte. */
static uint32_t pull_plan(const fixture_t *f, prefill_history_t *h, const char *id, const sess_t *x,
                          const node_resv_desc_t *rd)
{
    const void *pages[POOL_PAGES];
    uint32_t n_all = 0, n_hit, k = 0;

    for (uint32_t s = 0; s < rd->n_sources; s++) {
        n_all += rd->src[s].n_history;
    }
    n_hit = prefill_history_lookup(h, id, rd, pages);
    for (uint32_t s = 0; s < rd->n_sources; s++) {
        for (uint32_t j = 0; j < rd->src[s].n_history; j++, k++) {
            if (pages[k] != NULL) {
                assert_memory_equal(pages[k], engine_kv_pool_page(f->pool, x->t[s].page_ids[j]),
                                    f->page_bytes);
            }
        }
    }
    return n_all - n_hit;
}

static uint32_t total_pages(const sess_t *x)
{
    uint32_t n = 0;

    for (uint32_t s = 0; s < N_SRC; s++) {
        n += sess_pages(x, s);
    }
    return n;
}

/* Turn 2 of a session pulls only the pages that changed since turn 1 (the last page of each
 * source, appended to by the decode) and the new ones; turn 1's pull is all of them. */
static void test_second_turn_pulls_only_new_pages(void **state)
{
    fixture_t *f = *state;
    prefill_history_t *h = NULL;
    prefill_history_stats_t st;
    node_resv_desc_t rd;
    sess_t x;
    uint32_t pulled;
    uint64_t bytes_all, bytes_pulled;

    assert_int_equal(prefill_history_create(&f->cfg, FP, f->page_bytes, 64u << 20, &h), TDM_OK);
    sess_init(f, &x);
    sess_write(f, &x, 0, 1000, 1); /* the history at turn 1's H */
    sess_desc(f, &x, 1, &rd);
    assert_int_equal(pull_plan(f, h, "s1", &x, &rd), total_pages(&x)); /* nothing held yet */
    node_resv_desc_fini(&rd);
    sess_write(f, &x, 1000, 1300, 2); /* the job computed [H, T) */
    sess_keep(f, h, "s1", &x);
    sess_write(f, &x, 1300, 1340, 3); /* the decode node generated, then turn 2 arrives */
    sess_desc(f, &x, 1, &rd);
    pulled = pull_plan(f, h, "s1", &x, &rd);
    /* rows 1300..1339 sit in page 20 (1280..1343) of each source: one page per source changed */
    assert_int_equal(pulled, N_SRC);
    bytes_all = (uint64_t)total_pages(&x) * f->page_bytes;
    bytes_pulled = (uint64_t)pulled * f->page_bytes;
    print_message("turn 2: %u of %u history pages pulled (%llu of %llu bytes)\n", pulled,
                  total_pages(&x), (unsigned long long)bytes_pulled, (unsigned long long)bytes_all);
    assert_true(bytes_pulled * 5 <= bytes_all);
    node_resv_desc_fini(&rd);
    /* another session is unknown; a descriptor without digests takes nothing */
    sess_desc(f, &x, 1, &rd);
    assert_int_equal(pull_plan(f, h, "other", &x, &rd), total_pages(&x));
    node_resv_desc_fini(&rd);
    sess_desc(f, &x, 0, &rd);
    assert_int_equal(pull_plan(f, h, "s1", &x, &rd), total_pages(&x));
    node_resv_desc_fini(&rd);
    prefill_history_stats(h, &st);
    assert_int_equal(st.sessions, 1);
    assert_int_equal(st.bytes, (uint64_t)(2 * 21) * f->page_bytes); /* 1300 rows: 21 pages */
    assert_int_equal(st.hit_pages_total, total_pages(&x) - N_SRC);
    prefill_history_destroy(h);
    sess_fini(f, &x);
}

/* A rewind on the decode node (rows cut back, then different rows written) changes pages the
 * cache still holds: none of them is taken, every page used equals the decode node's, and the
 * pages before the cut are still taken. A copy that no longer checks is pulled too. */
static void test_rewound_session_never_reuses_stale_pages(void **state)
{
    fixture_t *f = *state;
    prefill_history_t *h = NULL;
    node_resv_desc_t rd;
    sess_t x;
    uint32_t pulled;

    assert_int_equal(prefill_history_create(&f->cfg, FP, f->page_bytes, 64u << 20, &h), TDM_OK);
    sess_init(f, &x);
    sess_write(f, &x, 0, 700, 1);
    sess_keep(f, h, "s", &x); /* pages 0..10 (rows 0..699) of each source */
    /* rewind to 300 rows (inside page 4), then a different continuation to 700 rows */
    sess_cut(f, &x, 300);
    sess_write(f, &x, 300, 700, 9);
    sess_desc(f, &x, 1, &rd);
    pulled = pull_plan(f, h, "s", &x, &rd); /* asserts every cached page used is current */
    /* pages 0..3 unchanged, 4..10 rewritten: 7 pulled per source */
    assert_int_equal(pulled, 7 * N_SRC);
    node_resv_desc_fini(&rd);
    /* a rewind to the same row count with the same rows at the cut keeps page identity but the
     * rewritten rows differ: the cut page itself must be pulled */
    sess_keep(f, h, "s", &x);
    sess_cut(f, &x, 640);            /* page 10 cut to 0 rows: gone; page 9 full */
    sess_write(f, &x, 630, 650, 77); /* rows 630..639 of page 9 rewritten, page 10 anew */
    sess_desc(f, &x, 1, &rd);
    assert_int_equal(pull_plan(f, h, "s", &x, &rd), 2 * N_SRC);
    node_resv_desc_fini(&rd);
    prefill_history_destroy(h);
    sess_fini(f, &x);
}

/* The cache holds at most its budget: keeping a session evicts the least recently used ones;
 * a lookup makes a session recent; a session larger than the budget is not kept. */
static void test_eviction_by_size(void **state)
{
    fixture_t *f = *state;
    prefill_history_t *h = NULL;
    prefill_history_stats_t st;
    node_resv_desc_t rd;
    sess_t a, b, c, big;
    /* 4 pages per source, 8 per session: room for two sessions and a bit */
    uint64_t budget = (uint64_t)(2 * 8 + 3) * f->page_bytes;

    assert_int_equal(prefill_history_create(&f->cfg, FP, f->page_bytes, budget, &h), TDM_OK);
    sess_init(f, &a);
    sess_init(f, &b);
    sess_init(f, &c);
    sess_init(f, &big);
    sess_write(f, &a, 0, 256, 1);
    sess_write(f, &b, 0, 256, 2);
    sess_write(f, &c, 0, 256, 3);
    sess_write(f, &big, 0, 640, 4); /* 20 pages: over the budget */
    sess_keep(f, h, "a", &a);
    sess_keep(f, h, "b", &b);
    sess_desc(f, &a, 1, &rd);
    assert_int_equal(pull_plan(f, h, "a", &a, &rd), 0); /* a is now the most recent */
    node_resv_desc_fini(&rd);
    sess_keep(f, h, "c", &c); /* evicts b, the least recently used */
    prefill_history_stats(h, &st);
    assert_int_equal(st.sessions, 2);
    assert_int_equal(st.evictions_total, 1);
    assert_true(st.bytes <= budget);
    sess_desc(f, &b, 1, &rd);
    assert_int_equal(pull_plan(f, h, "b", &b, &rd), 8);
    node_resv_desc_fini(&rd);
    sess_desc(f, &a, 1, &rd);
    assert_int_equal(pull_plan(f, h, "a", &a, &rd), 0);
    node_resv_desc_fini(&rd);
    {
        uint64_t keys[8];
        assert_int_equal(prefill_history_sessions(h, keys, 8), 2); /* a, c */
    }
    sess_keep(f, h, "big", &big); /* larger than the whole budget: not kept, nothing evicted */
    prefill_history_stats(h, &st);
    assert_int_equal(st.sessions, 2);
    assert_int_equal(st.evictions_total, 1);
    prefill_history_destroy(h);
    sess_fini(f, &a);
    sess_fini(f, &b);
    sess_fini(f, &c);
    sess_fini(f, &big);
}

/* --history-cache-mb 0: nothing is kept, every page is pulled (the behaviour before the cache). */
static void test_disabled_cache_pulls_everything(void **state)
{
    fixture_t *f = *state;
    prefill_history_t *h = NULL;
    prefill_history_stats_t st;
    node_resv_desc_t rd;
    sess_t x;

    assert_int_equal(prefill_history_create(&f->cfg, FP, f->page_bytes, 0, &h), TDM_OK);
    sess_init(f, &x);
    sess_write(f, &x, 0, 500, 1);
    sess_keep(f, h, "s", &x);
    sess_desc(f, &x, 1, &rd);
    assert_int_equal(pull_plan(f, h, "s", &x, &rd), total_pages(&x));
    assert_int_equal(pull_plan(f, NULL, "s", &x, &rd), total_pages(&x)); /* no cache at all */
    node_resv_desc_fini(&rd);
    prefill_history_stats(h, &st);
    assert_int_equal(st.sessions, 0);
    assert_int_equal(st.bytes, 0);
    prefill_history_destroy(h);
    sess_fini(f, &x);
}

/* The descriptor carries the digests (version 2); node_page_digest follows the rows. */
static void test_descriptor_digests_round_trip(void **state)
{
    fixture_t *f = *state;
    node_resv_desc_t rd, back;
    sess_t x;
    uint8_t *bytes = NULL;
    size_t n = 0;
    uint64_t before;

    sess_init(f, &x);
    sess_write(f, &x, 0, 130, 1);
    sess_desc(f, &x, 1, &rd);
    rd.reservation_id = 7;
    rd.cached_len = 130;
    rd.total_len = 200;
    assert_int_equal(node_resv_desc_encode(&rd, &bytes, &n), TDM_OK);
    assert_int_equal(node_resv_desc_parse(bytes, n, &back), TDM_OK);
    for (uint32_t s = 0; s < N_SRC; s++) {
        assert_non_null(back.src[s].history_digests);
        assert_memory_equal(back.src[s].history_digests, rd.src[s].history_digests,
                            rd.src[s].n_history * sizeof(uint64_t));
    }
    node_resv_desc_fini(&back);
    free(bytes);
    before = rd.src[0].history_digests[2];
    sess_write(f, &x, 130, 131, 5); /* one more row in page 2 */
    assert_true(node_page_digest(engine_kv_pool_page(f->pool, x.t[0].page_ids[2])) != before);
    node_resv_desc_fini(&rd);
    sess_desc(f, &x, 0, &rd); /* no digests: encoded as zeros, parsed as none */
    rd.cached_len = 131;
    rd.total_len = 200;
    assert_int_equal(node_resv_desc_encode(&rd, &bytes, &n), TDM_OK);
    assert_int_equal(node_resv_desc_parse(bytes, n, &back), TDM_OK);
    assert_null(back.src[0].history_digests);
    node_resv_desc_fini(&back);
    free(bytes);
    node_resv_desc_fini(&rd);
    sess_fini(f, &x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_second_turn_pulls_only_new_pages, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rewound_session_never_reuses_stale_pages, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_eviction_by_size, setup, teardown),
        cmocka_unit_test_setup_teardown(test_disabled_cache_pulls_everything, setup, teardown),
        cmocka_unit_test_setup_teardown(test_descriptor_digests_round_trip, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
