/* test_cluster_prefix.c - shared prefixes across sessions (issue 17 item 2, docs/PROTOCOL.md 6):
 * two requests without X-Session-Id whose prompts share a system prompt P (|P| = 260 ids, tiny
 * preset: whole blocks of 128 tokens match, so 256 are shared). The second is a new session; the
 * router names the first as prefix_session_id with cached_len 256 and sends the 256 ids; the
 * decode node links the first session's pages, replays (MODEL.md 6(d)(2) recovery) and prefills
 * only the rest, locally (a short own part) and through a prefill node (a long one: the import of
 * the handoff links the shared pages again instead of keeping copies). The
 * router's tokens_computed_total grows by |prompt| - 256 and tokens_reused_total by 256; the
 * node counts one share and no STATE_LOST. The text equals bit for bit the unshared schedule
 * that gives the same state: a named session that computed P[0, 256) itself (then diverged) and
 * is cut back to 256 and replayed by the next turn (a rewind). Without --prefix-share the node
 * answers STATE_LOST (or reserves from 0) and the router computes the whole prompt; that cold-prefill text is
 * approximate against the shared one (MODEL.md 6(e), |P| > W = 16) and only printed. Pages back
 * at baseline (a shared page counted once).
 */
#define T_MODEL_PREFIX "cluster-prefix"
#include "test_cluster_harness.h"

#define N_P      260 /* the shared system prompt */
#define N_SHARED 256 /* whole 128-token blocks of P */

typedef struct {
    double computed; /* router: tandem_prefill_tokens_computed_total */
    double reused;   /* router: tandem_prefill_tokens_reused_total */
    double shares;   /* decode: tandem_decode_prefix_shares_total */
    double shared;   /* decode: tandem_decode_prefix_shared_tokens_total */
    double lost;     /* decode: tandem_decode_state_lost_total */
    double rewinds;  /* decode: tandem_decode_rewinds_total */
    double refs;     /* decode: tandem_decode_shared_page_refs */
} counters_t;

static void read_counters(const cluster_t *c, counters_t *out)
{
    out->computed = metric(c->http_port, "tandem_prefill_tokens_computed_total");
    out->reused = metric(c->http_port, "tandem_prefill_tokens_reused_total");
    out->shares = metric(c->decode_port[0], "tandem_decode_prefix_shares_total");
    out->shared = metric(c->decode_port[0], "tandem_decode_prefix_shared_tokens_total");
    out->lost = metric(c->decode_port[0], "tandem_decode_state_lost_total");
    out->rewinds = metric(c->decode_port[0], "tandem_decode_rewinds_total");
    out->refs = metric(c->decode_port[0], "tandem_decode_shared_page_refs");
}

/* The prompt P + own part of n_own ids (seeded by `own_seed`), as "a,b,c" (T_BODY bytes). */
static char *prompt_of(const char *p, int n_own, int own_seed)
{
    char *out = malloc(T_BODY), own[4096];

    assert_non_null(out);
    make_ids(own, sizeof(own), n_own, 13, own_seed);
    snprintf(out, T_BODY, "%s,%s", p, own);
    return out;
}

/*
 * One shared request: P + own part of n_own ids as a new session (no X-Session-Id) after the
 * donor; returns its text. want_share: the node shares (else no --prefix-share: STATE_LOST and a
 * whole-prompt prefill).
 */
static char *shared_turn(const cluster_t *c, const char *p, int n_own, int own_seed,
                         int want_share)
{
    char *prompt = prompt_of(p, n_own, own_seed), *text;
    int total = N_P + n_own;
    counters_t before, after;

    read_counters(c, &before);
    text = complete(c->http_port, NULL, prompt, 8);
    read_counters(c, &after);
    print_message("own %d (%s), %s: router computed %.0f reused %.0f, node shares %.0f shared "
                  "tokens %.0f state lost %.0f\n",
                  n_own, total - N_SHARED >= T_THRESHOLD ? "remote" : "local",
                  want_share ? "sharing" : "no --prefix-share", after.computed - before.computed,
                  after.reused - before.reused, after.shares - before.shares,
                  after.shared - before.shared, after.lost - before.lost);
    if (want_share) {
        assert_true(after.shares - before.shares == 1);
        assert_true(after.shared - before.shared == N_SHARED);
        assert_true(after.lost - before.lost == 0);
        assert_true(after.computed - before.computed == total - N_SHARED);
        assert_true(after.reused - before.reused == N_SHARED);
        /* the session links the shared pages, also after a remote handoff's import */
        assert_true(after.refs > before.refs);
    } else {
        /* local: STATE_LOST and a resend from 0; remote: the reservation says H = 0 */
        assert_true(after.shares - before.shares == 0);
        assert_true(after.computed - before.computed == total);
    }
    free(prompt);
    return text;
}

/* The unshared schedule with the same state: a named session computes P[0, 256) + X itself, then
 * its next turn P + own diverges at 256: the node cuts back to 256 and replays (a rewind). */
static char *rewound_turn(const cluster_t *c, const char *session, const char *p_256,
                          const char *p, int n_own, int own_seed)
{
    char *first = malloc(T_BODY), x[256], *prompt = prompt_of(p, n_own, own_seed), *t1, *t2;
    counters_t before, after;

    assert_non_null(first);
    make_ids(x, sizeof(x), 9, 17, 777); /* X[0] = 780 differs from P[256] (checked below) */
    snprintf(first, T_BODY, "%s,%s", p_256, x);
    t1 = complete(c->http_port, session, first, 4);
    read_counters(c, &before);
    t2 = complete(c->http_port, session, prompt, 8);
    read_counters(c, &after);
    assert_true(after.rewinds - before.rewinds == 1);
    assert_true(after.reused - before.reused == N_SHARED);
    free(first);
    free(prompt);
    free(t1);
    return t2;
}

static void test_sessions_share_a_system_prompt(void **state)
{
    static cluster_t c; /* static: the teardown may stop it after a failed assertion */
    char *p = malloc(T_BODY), *p_256 = malloc(T_BODY), *donor_prompt;
    static const int own[2] = {10, 60}; /* local (delta 14 < 32), remote (delta 64) */
    char *shared[2], *rewound[2], *cold[2], *t;

    (void)state;
    assert_non_null(p);
    assert_non_null(p_256);
    make_ids(p, T_BODY, N_P, 7, 5);
    make_ids(p_256, T_BODY, N_SHARED, 7, 5);
    assert_true((256 * 7 + 5) % 1000 + 3 != 780); /* P[256] != X[0] */

    assert_int_equal(setenv("TANDEM_PREFIX_SHARE", "1", 1), 0); /* --prefix-share */
    assert_int_equal(cluster_start(&c, 1, 1, NULL, 0), 0);
    assert_int_equal(unsetenv("TANDEM_PREFIX_SHARE"), 0);
    donor_prompt = prompt_of(p, 20, 901);
    t = complete(c.http_port, NULL, donor_prompt, 8); /* the donor: computes all of P */
    free(t);
    for (int k = 0; k < 2; k++) {
        char name[32];
        shared[k] = shared_turn(&c, p, own[k], 100 + k, 1);
        snprintf(name, sizeof(name), "pfx-rewound-%d", k);
        rewound[k] = rewound_turn(&c, name, p_256, p, own[k], 100 + k);
        print_message("own %d: shared \"%s\", unshared (computed, cut back, replayed) \"%s\"\n",
                      own[k], shared[k], rewound[k]);
        assert_string_equal(shared[k], rewound[k]);
    }
    print_message("shared pages now %.0f (extra references %.0f)\n",
                  metric(c.decode_port[0], "tandem_decode_shared_pages"),
                  metric(c.decode_port[0], "tandem_decode_shared_page_refs"));
    assert_true(metric(c.decode_port[0], "tandem_decode_shared_pages") > 0);
    cluster_check_pages(&c, "prefix");
    cluster_stop(&c);

    /* the same requests on a node that does not share: whole prompts, cold prefills */
    assert_int_equal(cluster_start(&c, 1, 1, NULL, 0), 0); /* default: no sharing */
    t = complete(c.http_port, NULL, donor_prompt, 8);
    free(t);
    for (int k = 0; k < 2; k++) {
        cold[k] = shared_turn(&c, p, own[k], 100 + k, 0);
        print_message("own %d: shared \"%s\", cold prefill \"%s\" (approximate: MODEL.md 6(e))\n",
                      own[k], shared[k], cold[k]);
    }
    cluster_check_pages(&c, "no --prefix-share");
    cluster_stop(&c);
    for (int k = 0; k < 2; k++) {
        free(shared[k]);
        free(rewound[k]);
        free(cold[k]);
    }
    free(donor_prompt);
    free(p);
    free(p_256);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_sessions_share_a_system_prompt, stop_leftovers),
    };
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests(tests, setup_models, teardown_models);
}
