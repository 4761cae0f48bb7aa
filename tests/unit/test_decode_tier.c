/* test_decode_tier.c - tool-pause tiering (issue 17): the host store and disk spill of
 * decode-node/tier.h on their own (round trips, host full -> disk, a damaged, truncated or
 * missing file is a miss, an unwritable directory fails cleanly, the disk cap drops), then the
 * decode scheduler on the tiny preset with a pool too small for two sessions: the idle session is
 * demoted (to host, to disk) and promoted at its next turn, which streams exactly the tokens of a
 * never-demoted node (temperature 0, and temperature 0.8 with a seed) and keeps its recorded ids;
 * a corrupted spill file gives ERROR_STATE_LOST (rebuilt from history, not wrong KV); an
 * unwritable spill directory drops the state cleanly; every page comes back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/clock.h"
#include "common/hash.h"
#include "decode_test_util.h"
#include "decode-node/pool.h"
#include "decode-node/report.h"
#include "decode-node/sched.h"
#include "decode-node/sessions.h"
#include "decode-node/tier.h"
#include "forward_test_util.h"
#include "proto/proto.h"

#define MAX_STEPS     64
#define PROMPT_TOKENS 160
#define MAX_TOKENS    4

/* ---- the store on its own ------------------------------------------------------------------ */

/* A fake blob of n bytes (n > 8) with a valid XXH3-64 trailer, malloc'ed. */
static uint8_t *fake_blob(size_t n, uint8_t seed)
{
    uint8_t *b = malloc(n);
    uint64_t h;

    assert_non_null(b);
    for (size_t i = 0; i < n - 8; i++) {
        b[i] = (uint8_t)(seed + i * 7);
    }
    h = tdm_hash_xxh3_64(b, n - 8);
    for (int i = 0; i < 8; i++) {
        b[n - 8 + (size_t)i] = (uint8_t)(h >> (8 * i));
    }
    return b;
}

static int32_t *fake_ids(int64_t n, int32_t base)
{
    int32_t *ids = malloc((size_t)n * sizeof(int32_t));

    assert_non_null(ids);
    for (int64_t i = 0; i < n; i++) {
        ids[i] = base + (int32_t)i;
    }
    return ids;
}

/* A fresh empty directory under TANDEM_TEST_TMP (or /tmp). */
static void temp_dir(const char *name, char *path_out, size_t n)
{
    const char *root = getenv("TANDEM_TEST_TMP");
    char cmd[600];

    snprintf(path_out, n, "%s/tier-%s-%d", root != NULL ? root : "/tmp", name, (int)getpid());
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", path_out);
    assert_int_equal(system(cmd), 0);
}

static void remove_dir(const char *path)
{
    char cmd[600];

    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", path);
    assert_int_equal(system(cmd), 0);
}

static decode_tier_t *open_tier(uint64_t host_bytes, const char *dir, uint64_t spill_bytes)
{
    decode_tier_params_t p = {host_bytes, dir, spill_bytes};
    decode_tier_t *t = NULL;

    assert_int_equal(decode_tier_create(&p, &t), TDM_OK);
    return t;
}

/* A session whose one turn ended just now. */
static const decode_tier_usage_t *used_now(void)
{
    static decode_tier_usage_t u;

    u.last_used_ns = tdm_clock_now_ns();
    u.n_turns = 1;
    u.gap_mean_ns = 0;
    u.size = 0;
    return &u;
}

/* Take `id` back and compare it with a fresh fake_blob(n, seed) / fake_ids(n_ids, base). */
static void expect_back(decode_tier_t *t, const char *id, size_t n, uint8_t seed, int64_t n_ids,
                        int32_t base, decode_tier_kind_t want_kind)
{
    uint8_t *blob = NULL, *want = fake_blob(n, seed);
    int32_t *ids = NULL, *want_ids = fake_ids(n_ids, base);
    size_t n_blob = 0;
    int64_t got_ids = -1;
    decode_tier_kind_t kind;

    assert_int_equal(decode_tier_take(t, id, &blob, &n_blob, &ids, &got_ids, &kind), TDM_OK);
    assert_int_equal(kind, want_kind);
    assert_int_equal(n_blob, n);
    assert_memory_equal(blob, want, n);
    assert_int_equal(got_ids, n_ids);
    assert_memory_equal(ids, want_ids, (size_t)n_ids * sizeof(int32_t));
    assert_false(decode_tier_holds(t, id));
    free(blob);
    free(ids);
    free(want);
    free(want_ids);
}

static void test_host_full_moves_to_disk_and_both_come_back(void **state)
{
    char dir[512], path[4096];
    decode_tier_t *t;
    decode_tier_kind_t kind;
    decode_tier_stats_t st;
    decode_tier_usage_t old = *used_now();

    (void)state;
    temp_dir("roundtrip", dir, sizeof(dir));
    t = open_tier(5000, dir, 0); /* room for one 4 KB entry */
    assert_true(decode_tier_enabled(t));

    old.last_used_ns = 1; /* idle for as long as the clock has run: the higher score */
    assert_int_equal(
        decode_tier_put(t, "a", &old, fake_blob(4000, 1), 4000, fake_ids(10, 100), 10, &kind),
        TDM_OK);
    assert_int_equal(kind, DECODE_TIER_HOST);
    assert_int_equal(decode_tier_spill_path(t, "a", path, sizeof(path)), TDM_ERR_NOT_FOUND);
    /* "b" (just used) does not fit beside it: "a" (idle longer) goes to disk */
    assert_int_equal(
        decode_tier_put(t, "b", used_now(), fake_blob(4000, 2), 4000, fake_ids(3, 200), 3, &kind),
        TDM_OK);
    assert_int_equal(kind, DECODE_TIER_HOST);
    assert_int_equal(decode_tier_spill_path(t, "a", path, sizeof(path)), TDM_OK);
    assert_int_equal(access(path, R_OK), 0);
    decode_tier_stats(t, &st);
    assert_int_equal(st.t[DECODE_TIER_HOST].sessions, 1);
    assert_int_equal(st.t[DECODE_TIER_DISK].sessions, 1);
    assert_int_equal(st.t[DECODE_TIER_HOST].demotions_total, 2);
    assert_int_equal(st.t[DECODE_TIER_DISK].demotions_total, 1);
    assert_int_equal(st.t[DECODE_TIER_HOST].bytes, 4000 + 3 * 4);

    expect_back(t, "a", 4000, 1, 10, 100, DECODE_TIER_DISK);
    assert_int_not_equal(access(path, F_OK), 0); /* the file went with the entry */
    expect_back(t, "b", 4000, 2, 3, 200, DECODE_TIER_HOST);
    decode_tier_stats(t, &st);
    assert_int_equal(st.t[DECODE_TIER_HOST].sessions + st.t[DECODE_TIER_DISK].sessions, 0);
    assert_int_equal(st.t[DECODE_TIER_HOST].bytes + st.t[DECODE_TIER_DISK].bytes, 0);
    assert_int_equal(st.spill_failures_total, 0);
    decode_tier_destroy(t);
    remove_dir(dir);
}

/* Damage the file of `id` in t: flip one byte at `at` bytes from the end (0: truncate by 1). */
static void damage(decode_tier_t *t, const char *id, long at)
{
    char path[4096];
    FILE *f;

    assert_int_equal(decode_tier_spill_path(t, id, path, sizeof(path)), TDM_OK);
    if (at == 0) {
        struct stat sb;
        assert_int_equal(stat(path, &sb), 0);
        assert_int_equal(truncate(path, sb.st_size - 1), 0);
        return;
    }
    f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, -at, SEEK_END), 0);
    {
        int c = fgetc(f);
        assert_int_equal(fseek(f, -at, SEEK_END), 0);
        fputc(c ^ 0x40, f);
    }
    fclose(f);
}

static void test_damaged_or_missing_spill_file_is_a_miss(void **state)
{
    char dir[512], path[4096];
    decode_tier_t *t;
    decode_tier_kind_t kind;
    decode_tier_stats_t st;
    uint8_t *blob = NULL;
    int32_t *ids = NULL;
    size_t n_blob = 0;
    int64_t n_ids = 0;
    const char *names[] = {"page", "header", "short", "gone"};

    (void)state;
    temp_dir("damaged", dir, sizeof(dir));
    t = open_tier(0, dir, 0); /* disk only */
    for (int i = 0; i < 4; i++) {
        assert_int_equal(decode_tier_put(t, names[i], used_now(), fake_blob(3000, (uint8_t)i), 3000,
                                         fake_ids(5, 0), 5, &kind),
                         TDM_OK);
        assert_int_equal(kind, DECODE_TIER_DISK);
    }
    damage(t, "page", 100);            /* inside the blob (pages and state) */
    damage(t, "header", 3000 + 8 + 2); /* inside the ids, under the header checksum */
    damage(t, "short", 0);
    assert_int_equal(decode_tier_spill_path(t, "gone", path, sizeof(path)), TDM_OK);
    assert_int_equal(unlink(path), 0);

    for (int i = 0; i < 3; i++) {
        assert_int_equal(decode_tier_spill_path(t, names[i], path, sizeof(path)), TDM_OK);
        assert_int_equal(decode_tier_take(t, names[i], &blob, &n_blob, &ids, &n_ids, &kind),
                         TDM_ERR_FORMAT);
        assert_int_equal(kind, DECODE_TIER_DISK);
        assert_int_not_equal(access(path, F_OK), 0); /* the damaged file is removed */
        assert_false(decode_tier_holds(t, names[i]));
    }
    assert_int_equal(decode_tier_take(t, "gone", &blob, &n_blob, &ids, &n_ids, &kind),
                     TDM_ERR_NOT_FOUND);
    assert_null(blob);
    assert_null(ids);
    decode_tier_stats(t, &st);
    assert_int_equal(st.t[DECODE_TIER_DISK].misses_total, 4);
    assert_int_equal(st.t[DECODE_TIER_DISK].promotions_total, 0);
    assert_int_equal(st.t[DECODE_TIER_DISK].sessions, 0);
    assert_int_equal(st.t[DECODE_TIER_DISK].bytes, 0);
    decode_tier_destroy(t);
    remove_dir(dir);
}

static void test_unwritable_spill_dir_fails_cleanly(void **state)
{
    decode_tier_t *t;
    decode_tier_kind_t kind;
    decode_tier_stats_t st;
    uint8_t *blob = fake_blob(2000, 9);
    int32_t *ids = fake_ids(4, 1);
    uint8_t *blob2;

    (void)state;
    /* a path under a character device: no one (root included) can create it */
    t = open_tier(0, "/dev/null/spill", 0);
    assert_int_equal(decode_tier_put(t, "x", used_now(), blob, 2000, ids, 4, &kind), TDM_ERR_IO);
    decode_tier_stats(t, &st);
    assert_int_equal(st.spill_failures_total, 1);
    assert_int_equal(st.t[DECODE_TIER_DISK].sessions, 0);
    assert_false(decode_tier_holds(t, "x"));
    blob[0] ^= 1; /* the caller still owns both (ASan: no double free, no leak) */
    decode_tier_destroy(t);

    /* with a host tier: an entry that cannot go down stays in host, the newcomer is refused */
    t = open_tier(2100, "/dev/null/spill", 0);
    blob2 = fake_blob(2000, 10);
    assert_int_equal(decode_tier_put(t, "old", used_now(), blob2, 2000, NULL, 0, &kind), TDM_OK);
    assert_int_equal(kind, DECODE_TIER_HOST);
    assert_int_not_equal(decode_tier_put(t, "new", used_now(), blob, 2000, ids, 4, &kind), TDM_OK);
    assert_true(decode_tier_holds(t, "old"));
    assert_false(decode_tier_holds(t, "new"));
    decode_tier_destroy(t);
    free(blob);
    free(ids);
}

static void test_disk_cap_drops_and_the_next_turn_misses(void **state)
{
    char dir[512];
    decode_tier_t *t;
    decode_tier_kind_t kind;
    decode_tier_stats_t st;
    decode_tier_usage_t old = *used_now();
    uint8_t *blob = NULL;
    int32_t *ids = NULL;
    size_t n_blob = 0;
    int64_t n_ids = 0;

    (void)state;
    temp_dir("cap", dir, sizeof(dir));
    t = open_tier(0, dir, 5000); /* disk for one 4 KB entry */
    old.last_used_ns = 1;
    assert_int_equal(decode_tier_put(t, "old", &old, fake_blob(4000, 1), 4000, NULL, 0, &kind),
                     TDM_OK);
    assert_int_equal(
        decode_tier_put(t, "new", used_now(), fake_blob(4000, 2), 4000, NULL, 0, &kind), TDM_OK);
    assert_false(decode_tier_holds(t, "old"));
    decode_tier_stats(t, &st);
    assert_int_equal(st.t[DECODE_TIER_DISK].drops_total, 1);
    assert_int_equal(st.t[DECODE_TIER_DISK].sessions, 1);
    assert_int_equal(decode_tier_take(t, "old", &blob, &n_blob, &ids, &n_ids, &kind),
                     TDM_ERR_NOT_FOUND);
    decode_tier_stats(t, &st);
    assert_int_equal(st.t[DECODE_TIER_DISK].misses_total, 1);
    expect_back(t, "new", 4000, 2, 0, 0, DECODE_TIER_DISK);
    decode_tier_destroy(t);
    remove_dir(dir);
}

static void test_score_prefers_idle_rare_and_large(void **state)
{
    uint64_t s = 1000000000ull; /* 1 s */
    uint64_t now = 100 * s;
    decode_tier_usage_t a = {now - 10 * s, 1, 0, 8};
    decode_tier_usage_t b = a;

    (void)state;
    assert_true(decode_tier_score(&a, now) > 0);
    b.last_used_ns = now - 20 * s; /* idle longer */
    assert_true(decode_tier_score(&b, now) > decode_tier_score(&a, now));
    b = a;
    b.size = 64; /* larger */
    assert_true(decode_tier_score(&b, now) > decode_tier_score(&a, now));
    b = a;
    b.n_turns = 3;
    b.gap_mean_ns = 10 * s; /* due back now: stays */
    assert_true(decode_tier_score(&b, now) < decode_tier_score(&a, now));
    b.gap_mean_ns = 30 * s; /* due in 20 s, but it comes back more surely than a */
    b.last_used_ns = now - 10 * s;
    assert_true(decode_tier_score(&b, now) > 0);
}

/* ---- the scheduler with tiers ------------------------------------------------------------- */

typedef struct {
    ftu_engine_t engine;
    uint32_t one_session; /* pages a finished first turn keeps */
} fixture_t;

/* A node of n_pages; tier may be NULL (no tiers: the old drop). Takes ownership of tier. */
static void node_open(fixture_t *fx, dtu_node_t *node, uint32_t n_pages, decode_tier_t *tier)
{
    decode_sched_params_t sp;

    dtu_sched_params(&sp);
    sp.tier = tier;
    dtu_node_open(node, fx->engine.model, n_pages, &sp);
}

static void submit(dtu_node_t *node, uint64_t request_id, const char *session, uint64_t cached_len,
                   const int32_t *ids, size_t n, double temperature)
{
    Tandem__DecodeRequest dr;
    Tandem__SamplingParams sp;

    dtu_sampling(&sp, temperature, 42);
    dtu_request(&dr, request_id, session, cached_len, ids, n, MAX_TOKENS, &sp);
    dtu_send_request(node, &dr);
}

/* The Finish or Error of request_id once out (stepping at most MAX_STEPS); tokens streamed go to
 * toks[0..*n_toks). Returns the Finish, or NULL after an Error (*code_out set). */
static const Tandem__Finish *run(dtu_node_t *node, uint64_t request_id, int32_t *toks, int *n_toks,
                                 Tandem__ErrorCode *code_out)
{
    const Tandem__Finish *f = dtu_run_to_end(node, request_id, MAX_STEPS + 1);

    if (f == NULL) {
        int e = dtu_find(node, TANDEM__ENVELOPE__BODY_ERROR, request_id, 0);
        *code_out = node->rec.msgs[e]->error->code;
        return NULL;
    }
    *n_toks = dtu_tokens_of(node, request_id, toks, INT_MAX);
    return f;
}

/* One turn that must finish; its tokens in toks (MAX_TOKENS), returns its cached_len. */
static uint64_t turn(dtu_node_t *node, uint64_t request_id, const char *session,
                     uint64_t cached_len, const int32_t *ids, size_t n, double temperature,
                     int32_t *toks)
{
    Tandem__ErrorCode code = TANDEM__ERROR_CODE__ERROR_UNSPECIFIED;
    const Tandem__Finish *f;
    int n_toks = 0;

    submit(node, request_id, session, cached_len, ids, n, temperature);
    f = run(node, request_id, toks, &n_toks, &code);
    if (f == NULL) {
        fail_msg("request %llu got error %d", (unsigned long long)request_id, (int)code);
    }
    assert_int_equal(n_toks, MAX_TOKENS);
    return f->cached_len;
}

static int setup(void **state)
{
    fixture_t *fx = calloc(1, sizeof(*fx));
    dtu_node_t probe;
    int32_t ids[PROMPT_TOKENS], toks[MAX_TOKENS];

    *state = NULL;
    if (fx == NULL || ftu_engine_open(&fx->engine, 16) != 0) {
        free(fx);
        return -1;
    }
    node_open(fx, &probe, 1024, NULL);
    ftu_prompt(1, fx->engine.V, ids, PROMPT_TOKENS);
    turn(&probe, 1, "probe", 0, ids, PROMPT_TOKENS, 0.0, toks);
    fx->one_session = decode_sessions_n_pages(probe.sessions);
    if (!dtu_node_close(&probe) || fx->one_session < 2) {
        return -1;
    }
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *fx = *state;
    int ok;

    if (fx == NULL) {
        return 0;
    }
    ok = ftu_engine_close(&fx->engine) == 0;

    free(fx);
    return ok ? 0 : -1;
}

/*
 * Session "a": a first turn, then (optionally) session "b"'s first turn on the same node, then
 * a's second turn (the last token a was sent, then two more). With a small pool, b's turn needs
 * a's pages and a's second turn needs b's. toks2: a's second turn's tokens. Returns 0, or the
 * Error code of a's second turn.
 */
static int two_sessions(fixture_t *fx, dtu_node_t *node, int with_b, double temperature,
                        int32_t *toks2)
{
    int32_t a[PROMPT_TOKENS], b[PROMPT_TOKENS], toks[MAX_TOKENS], delta[3];
    Tandem__ErrorCode code = TANDEM__ERROR_CODE__ERROR_UNSPECIFIED;
    uint64_t cached;
    int n_toks = 0;

    ftu_prompt(11, fx->engine.V, a, PROMPT_TOKENS);
    ftu_prompt(12, fx->engine.V, b, PROMPT_TOKENS);
    cached = turn(node, 1, "a", 0, a, PROMPT_TOKENS, temperature, toks);
    delta[0] = toks[MAX_TOKENS - 1];
    delta[1] = 5;
    delta[2] = 6;
    if (with_b) {
        turn(node, 2, "b", 0, b, PROMPT_TOKENS, temperature, toks);
    }
    submit(node, 3, "a", cached, delta, 3, temperature);
    if (run(node, 3, toks2, &n_toks, &code) == NULL) {
        return (int)code;
    }
    assert_int_equal(n_toks, MAX_TOKENS);
    return 0;
}

/* The reference: a's second turn on a node that never demotes (room for both); a's recorded
 * ids after it in ids_out (n_ids_out, at most 1024). */
static void reference(fixture_t *fx, double temperature, int32_t *toks2, int32_t *ids_out,
                      int64_t *n_ids_out)
{
    dtu_node_t roomy;
    const decode_session_t *a;

    node_open(fx, &roomy, 1024, NULL);
    assert_int_equal(two_sessions(fx, &roomy, 0, temperature, toks2), 0);
    a = decode_sessions_find(roomy.sessions, "a");
    assert_true(a->n_ids > PROMPT_TOKENS && a->n_ids <= 1024);
    memcpy(ids_out, a->ids, (size_t)a->n_ids * sizeof(int32_t));
    *n_ids_out = a->n_ids;
    assert_true(dtu_node_close(&roomy));
}

static uint32_t small_pool(const fixture_t *fx)
{
    return fx->one_session + fx->one_session / 2;
}

static void resume_equals_never_demoted(fixture_t *fx, decode_tier_t *tier,
                                        decode_tier_kind_t where, double temperature)
{
    int32_t want[MAX_TOKENS], got[MAX_TOKENS], want_ids[1024];
    int64_t n_want_ids = 0;
    dtu_node_t small;
    decode_stats_t st;
    decode_session_t *a;

    reference(fx, temperature, want, want_ids, &n_want_ids);
    node_open(fx, &small, small_pool(fx), tier);
    assert_int_equal(two_sessions(fx, &small, 1, temperature, got), 0);
    assert_memory_equal(got, want, sizeof(want));

    decode_sched_step(small.sched);
    decode_sched_stats(small.sched, &st);
    assert_int_equal(st.state_lost_total, 0);
    assert_int_equal(st.tier.t[where].promotions_total, 1);
    assert_int_equal(st.tier.t[where].misses_total, 0);
    assert_true(st.tier.t[where].restore_seconds > 0);
    assert_true(st.tier.t[where].restore_tokens >= PROMPT_TOKENS);
    assert_true(st.evictions_total >= 2); /* a for b, then b for a */
    /* a's recorded ids came back with it: the prompt, its tokens, the delta */
    a = decode_sessions_find(small.sessions, "a");
    assert_non_null(a->seq);
    assert_null(a->tier_home);
    assert_int_equal(a->n_ids, n_want_ids);
    assert_memory_equal(a->ids, want_ids, (size_t)n_want_ids * sizeof(int32_t));
    /* b went down in a's place and is held there */
    assert_non_null(decode_sessions_find(small.sessions, "b")->tier_home);
    assert_true(decode_tier_holds(tier, "b"));
    /* and routers are still told b's history (report.h, issue 18 item 3): its ids and length */
    {
        const decode_session_t *b = decode_sessions_find(small.sessions, "b");
        Tandem__SessionQuery q = TANDEM__SESSION_QUERY__INIT;
        Tandem__SessionHistory h;

        assert_null(b->seq);
        assert_true(b->tier_len >= PROMPT_TOKENS);
        assert_int_equal(decode_report_held(b), b->tier_len);
        q.query_id = 9;
        q.session_id = (char *)"b";
        decode_report_history(small.sessions, &q, &h);
        assert_true(h.found);
        assert_int_equal(h.cached_len, b->tier_len);
        assert_int_equal(h.n_tokens, h.cached_len);
    }
    assert_int_equal(st.free_pages + st.session_pages, small_pool(fx));
    assert_true(dtu_node_close(&small));
}

static void test_demoted_to_host_resumes_with_the_same_tokens(void **state)
{
    fixture_t *fx = *state;

    resume_equals_never_demoted(fx, open_tier(64u << 20, NULL, 0), DECODE_TIER_HOST, 0.0);
    resume_equals_never_demoted(fx, open_tier(64u << 20, NULL, 0), DECODE_TIER_HOST, 0.8);
}

static void test_demoted_to_disk_resumes_with_the_same_tokens(void **state)
{
    fixture_t *fx = *state;
    char dir[512];

    temp_dir("sched-disk", dir, sizeof(dir));
    resume_equals_never_demoted(fx, open_tier(0, dir, 0), DECODE_TIER_DISK, 0.0);
    resume_equals_never_demoted(fx, open_tier(0, dir, 0), DECODE_TIER_DISK, 0.8);
    remove_dir(dir);
}

/* b's first turn demotes a to disk; a's file is damaged before a's second turn. */
static void test_corrupt_spill_file_is_rebuilt_not_wrong(void **state)
{
    fixture_t *fx = *state;
    int32_t a[PROMPT_TOKENS], b[PROMPT_TOKENS], toks[MAX_TOKENS], delta[3];
    Tandem__ErrorCode code = TANDEM__ERROR_CODE__ERROR_UNSPECIFIED;
    char dir[512];
    dtu_node_t small;
    decode_stats_t st;
    uint64_t cached;
    int n_toks = 0;

    temp_dir("sched-corrupt", dir, sizeof(dir));
    node_open(fx, &small, small_pool(fx), open_tier(0, dir, 0));
    ftu_prompt(11, fx->engine.V, a, PROMPT_TOKENS);
    ftu_prompt(12, fx->engine.V, b, PROMPT_TOKENS);
    cached = turn(&small, 1, "a", 0, a, PROMPT_TOKENS, 0.0, toks);
    turn(&small, 2, "b", 0, b, PROMPT_TOKENS, 0.0, toks);
    assert_true(decode_tier_holds(small.tier, "a"));
    damage(small.tier, "a", 4096); /* a byte of a's last KV page */
    delta[0] = toks[MAX_TOKENS - 1];
    delta[1] = 5;
    delta[2] = 6;
    submit(&small, 3, "a", cached, delta, 3, 0.0);
    assert_null(run(&small, 3, toks, &n_toks, &code));
    assert_int_equal(code, TANDEM__ERROR_CODE__ERROR_STATE_LOST);
    decode_sched_step(small.sched);
    decode_sched_stats(small.sched, &st);
    assert_int_equal(st.tier.t[DECODE_TIER_DISK].misses_total, 1);
    assert_int_equal(st.tier.t[DECODE_TIER_DISK].promotions_total, 0);
    assert_null(decode_sessions_find(small.sessions, "a")->seq);
    /* the router resends the history from 0: the session is rebuilt and served */
    turn(&small, 4, "a", 0, a, PROMPT_TOKENS, 0.0, toks);
    assert_true(dtu_node_close(&small));
    remove_dir(dir);
}

/* No tier takes the state (unwritable spill dir, no host tier): it is dropped as before tiering,
 * the next turn is rebuilt, nothing leaks. */
static void test_unwritable_spill_dir_drops_cleanly(void **state)
{
    fixture_t *fx = *state;
    int32_t toks2[MAX_TOKENS];
    dtu_node_t small;
    decode_stats_t st;

    node_open(fx, &small, small_pool(fx), open_tier(0, "/dev/null/spill", 0));
    assert_int_equal(two_sessions(fx, &small, 1, 0.0, toks2), TANDEM__ERROR_CODE__ERROR_STATE_LOST);
    decode_sched_step(small.sched);
    decode_sched_stats(small.sched, &st);
    assert_true(st.tier.spill_failures_total >= 1);
    assert_int_equal(st.tier.t[DECODE_TIER_DISK].sessions, 0);
    assert_int_equal(st.evictions_total, 1);
    assert_int_equal(st.free_pages + st.session_pages, small_pool(fx));
    assert_true(dtu_node_close(&small));
}

/* Without tiers (the old behaviour, --host-tier-mb 0 and no --spill-dir) the same two sessions
 * lose a's state. */
static void test_without_tiers_the_state_is_lost(void **state)
{
    fixture_t *fx = *state;
    int32_t toks2[MAX_TOKENS];
    dtu_node_t small;

    node_open(fx, &small, small_pool(fx), open_tier(0, NULL, 0));
    assert_false(decode_tier_enabled(small.tier));
    assert_int_equal(two_sessions(fx, &small, 1, 0.0, toks2), TANDEM__ERROR_CODE__ERROR_STATE_LOST);
    assert_true(dtu_node_close(&small));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_full_moves_to_disk_and_both_come_back),
        cmocka_unit_test(test_damaged_or_missing_spill_file_is_a_miss),
        cmocka_unit_test(test_unwritable_spill_dir_fails_cleanly),
        cmocka_unit_test(test_disk_cap_drops_and_the_next_turn_misses),
        cmocka_unit_test(test_score_prefers_idle_rare_and_large),
    };
    const struct CMUnitTest sched_tests[] = {
        cmocka_unit_test(test_demoted_to_host_resumes_with_the_same_tokens),
        cmocka_unit_test(test_demoted_to_disk_resumes_with_the_same_tokens),
        cmocka_unit_test(test_corrupt_spill_file_is_rebuilt_not_wrong),
        cmocka_unit_test(test_unwritable_spill_dir_drops_cleanly),
        cmocka_unit_test(test_without_tiers_the_state_is_lost),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);

    return failed + cmocka_run_group_tests(sched_tests, setup, teardown);
}
