/* test_sampler.c - engine/sampler: Philox-4x32-10 known answers, the MODEL.md section-8 Gumbel
 * primitive, greedy tie order, determinism per (seed, position), softmax frequencies (chi-square),
 * exact top-k / top-p / min-p support, raw log-probabilities, stop ids and every error path. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/arena.h"
#include "common/hash.h"
#include "engine/sampler.h"

#define ERR_BYTES 256

/* Vocabulary of the real tokenizer: the arena is sized for it. */
#define BIG_VOCAB 129280

/* Every test runs with a fresh arena (setup) and checks it comes back empty (teardown). */
#define SAMPLER_TEST(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

/* Chi-square critical values at alpha = 0.001 for df = 1..9 (NIST/SEMATECH table). */
static const double chi2_crit_001[10] = {0.0,    10.828, 13.816, 16.266, 18.467,
                                         20.515, 22.458, 24.322, 26.124, 27.877};

/* ---- fixture and helpers ----------------------------------------------------------------- */

static int setup(void **state)
{
    tdm_arena_t *arena = calloc(1, sizeof(*arena));

    if (arena == NULL || tdm_arena_init(arena, engine_sampler_scratch_bytes(BIG_VOCAB)) != TDM_OK) {
        free(arena);
        return -1;
    }
    *state = arena;
    return 0;
}

/* Teardown checks the sampler gave every scratch byte back. */
static int teardown(void **state)
{
    tdm_arena_t *arena = *state;
    int ok = arena->used_bytes == 0;

    tdm_arena_fini(arena);
    free(arena);
    return ok ? 0 : -1;
}

/* A deterministic test RNG: splitmix64 over a counter. */
typedef struct {
    uint64_t state;
} rng_t;

static uint64_t rng_next(rng_t *rng)
{
    rng->state++;
    return tdm_hash_splitmix64(rng->state);
}

static double rng_unit(rng_t *rng)
{
    return ((double)(rng_next(rng) >> 11) + 0.5) / 9007199254740992.0;
}

static double rng_normal(rng_t *rng)
{
    return sqrt(-2.0 * log(rng_unit(rng))) * cos(6.283185307179586 * rng_unit(rng));
}

static engine_sampler_params_t params_with(double temperature, int32_t top_k, double top_p,
                                           double min_p)
{
    engine_sampler_params_t p;

    engine_sampler_params_default(&p);
    p.temperature = temperature;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    return p;
}

static int32_t sample_token(tdm_arena_t *arena, const engine_sampler_params_t *p,
                            const float *logits, int64_t n_vocab, int64_t position)
{
    engine_sample_t s;

    assert_int_equal(engine_sampler_sample(p, logits, n_vocab, position, arena, &s), TDM_OK);
    assert_true(s.token >= 0 && s.token < n_vocab);
    return s.token;
}

typedef struct {
    float logit;
    int32_t id;
} ranked_t;

static int rank_cmp(const void *pa, const void *pb)
{
    const ranked_t *a = pa;
    const ranked_t *b = pb;

    if (a->logit != b->logit) {
        return a->logit > b->logit ? -1 : 1;
    }
    return a->id < b->id ? -1 : (a->id > b->id ? 1 : 0);
}

/*
 * The kept set, written straight from the definitions in sampler.h with a full sort: top-k prefix,
 * top-p prefix of the top-k set (Z in id order, running sum in rank order), min-p threshold.
 * kept: [n] 0/1. Temperature > 0.
 */
static void naive_kept(const engine_sampler_params_t *p, const float *logits, int n, int *kept)
{
    ranked_t *order = calloc((size_t)n, sizeof(*order));
    int *in_set = calloc((size_t)n, sizeof(*in_set));
    int n_fin = 0;
    int n_set;
    int n_keep;
    double s_max;
    double z = 0.0;

    assert_non_null(order);
    assert_non_null(in_set);
    for (int x = 0; x < n; x++) {
        kept[x] = 0;
        if (isfinite(logits[x])) {
            order[n_fin].logit = logits[x];
            order[n_fin].id = x;
            n_fin++;
        }
    }
    qsort(order, (size_t)n_fin, sizeof(*order), rank_cmp);
    s_max = (double)order[0].logit / p->temperature;
    n_set = (p->top_k > 0 && p->top_k < n_fin) ? p->top_k : n_fin;
    for (int i = 0; i < n_set; i++) {
        in_set[order[i].id] = 1;
    }
    n_keep = n_set;
    if (p->top_p < 1.0) {
        double cum = 0.0;

        for (int x = 0; x < n; x++) {
            if (in_set[x]) {
                z += exp((double)logits[x] / p->temperature - s_max);
            }
        }
        for (int i = 0; i < n_set; i++) {
            cum += exp((double)order[i].logit / p->temperature - s_max);
            if (cum >= p->top_p * z) {
                n_keep = i + 1;
                break;
            }
        }
    }
    for (int i = 0; i < n_keep; i++) {
        double rel = (double)order[i].logit / p->temperature - s_max;

        if (p->min_p > 0.0 && rel < log(p->min_p)) {
            break;
        }
        kept[order[i].id] = 1;
    }
    free(in_set);
    free(order);
}

/* e(x) / sum of e over kept tokens (ascending id order), 0 elsewhere: filtered_probs, literally. */
static void naive_probs(const engine_sampler_params_t *p, const float *logits, int n,
                        const int *kept, double *probs)
{
    double max = -INFINITY;
    double z = 0.0;

    for (int x = 0; x < n; x++) {
        max = fmax(max, logits[x]);
    }
    for (int x = 0; x < n; x++) {
        probs[x] = kept[x] ? exp((double)logits[x] / p->temperature - max / p->temperature) : 0.0;
        z += probs[x];
    }
    for (int x = 0; x < n; x++) {
        probs[x] /= z;
    }
}

/* argmax over kept tokens of l/tau + G, ties to the lower id: the primitive, literally. */
static int32_t naive_sample(const engine_sampler_params_t *p, const float *logits, int n,
                            const int *kept, uint32_t position)
{
    int32_t best = -1;
    double best_score = -INFINITY;

    for (int x = 0; x < n; x++) {
        double score;

        if (!kept[x]) {
            continue;
        }
        score = (double)logits[x] / p->temperature +
                engine_sampler_gumbel(p->seed, position, (uint32_t)x);
        if (best < 0 || score > best_score) {
            best = x;
            best_score = score;
        }
    }
    return best;
}

/* Draws n_draws tokens (seed = seed0 + i, fixed position) into counts[n]. */
static void draw_counts(tdm_arena_t *arena, engine_sampler_params_t p, const float *logits, int n,
                        int n_draws, uint64_t seed0, long *counts)
{
    memset(counts, 0, (size_t)n * sizeof(counts[0]));
    for (int i = 0; i < n_draws; i++) {
        p.seed = seed0 + (uint64_t)i;
        counts[sample_token(arena, &p, logits, n, 17)]++;
    }
}

/* Pearson chi-square of counts against probs over tokens with probs > 0; *df_out = cells - 1.
 * A count on a token of probability 0 fails the test at once. */
static double chi_square(const long *counts, const double *probs, int n, long n_draws, int *df_out)
{
    double chi2 = 0.0;
    int cells = 0;

    for (int x = 0; x < n; x++) {
        if (probs[x] == 0.0) {
            assert_int_equal(counts[x], 0);
            continue;
        }
        double expect = probs[x] * (double)n_draws;

        assert_true(expect >= 5.0);
        chi2 += ((double)counts[x] - expect) * ((double)counts[x] - expect) / expect;
        cells++;
    }
    *df_out = cells - 1;
    return chi2;
}

static void softmax_double(const float *logits, int n, double temperature, double *probs)
{
    double max = -INFINITY;
    double z = 0.0;

    for (int x = 0; x < n; x++) {
        max = fmax(max, (double)logits[x] / temperature);
    }
    for (int x = 0; x < n; x++) {
        probs[x] = exp((double)logits[x] / temperature - max);
        z += probs[x];
    }
    for (int x = 0; x < n; x++) {
        probs[x] /= z;
    }
}

/* The support of engine_sampler_filtered_probs as 0/1 flags. */
static void filtered_support(tdm_arena_t *arena, const engine_sampler_params_t *p,
                             const float *logits, int n, int *support)
{
    double *probs = calloc((size_t)n, sizeof(*probs));

    assert_non_null(probs);
    assert_int_equal(engine_sampler_filtered_probs(p, logits, n, arena, probs), TDM_OK);
    for (int x = 0; x < n; x++) {
        support[x] = probs[x] > 0.0;
    }
    free(probs);
}

static void assert_support(tdm_arena_t *arena, const engine_sampler_params_t *p,
                           const float *logits, int n, const int *expect)
{
    int support[16];

    assert_true(n <= 16);
    filtered_support(arena, p, logits, n, support);
    for (int x = 0; x < n; x++) {
        if (support[x] != expect[x]) {
            print_message("token %d: support %d, expected %d\n", x, support[x], expect[x]);
        }
        assert_int_equal(support[x], expect[x]);
    }
}

/* Draws many tokens and checks every one is in expect[] and every expected token appears. */
static void assert_draws_within(tdm_arena_t *arena, engine_sampler_params_t p, const float *logits,
                                int n, const int *expect)
{
    long counts[16];

    assert_true(n <= 16);
    draw_counts(arena, p, logits, n, 4000, 1000, counts);
    for (int x = 0; x < n; x++) {
        assert_int_equal(counts[x] > 0, expect[x]);
    }
}

/* ---- Philox and the Gumbel primitive ----------------------------------------------------- */

static void test_philox_matches_random123_known_answers(void **state)
{
    /* Random123 kat_vectors, philox4x32 10: counter, key -> output. */
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d,
         0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
         0x94fdcceb, 0x5001e420, 0x24126ea1},
    };
    (void)state;

    for (int v = 0; v < 3; v++) {
        uint32_t out[4];

        engine_sampler_philox4x32_10(&kat[v][0], &kat[v][4], out);
        for (int i = 0; i < 4; i++) {
            assert_int_equal(out[i], kat[v][6 + i]);
        }
    }
}

static void test_gumbel_uses_seed_low_word_as_key_0_and_counter_q_x_0_0(void **state)
{
    const uint64_t seed = ((uint64_t)0x299f31d0 << 32) | 0xa4093822u;
    const uint32_t key[2] = {0xa4093822u, 0x299f31d0u};
    (void)state;

    /* Counter and key all zero: w = 0x6627e8d5 from the first known answer. */
    assert_true(engine_sampler_gumbel(0, 0, 0) == -log(-log((0x6627e8d5 + 0.5) / 4294967296.0)));
    for (uint32_t q = 0; q < 4; q++) {
        for (uint32_t x = 0; x < 4; x++) {
            const uint32_t counter[4] = {1000 + q, 70000 + x, 0, 0};
            uint32_t out[4];
            double u;

            engine_sampler_philox4x32_10(counter, key, out);
            u = ((double)out[0] + 0.5) * 0x1p-32;
            assert_true(engine_sampler_gumbel(seed, 1000 + q, 70000 + x) == -log(-log(u)));
        }
    }
    /* Swapping position and token, or the seed's words, changes the draw. */
    assert_true(engine_sampler_gumbel(seed, 5, 9) != engine_sampler_gumbel(seed, 9, 5));
    assert_true(engine_sampler_gumbel(seed, 5, 9) !=
                engine_sampler_gumbel((seed << 32) | (seed >> 32), 5, 9));
}

static void test_gumbel_is_finite_and_bounded(void **state)
{
    double lo = -log(-log(0.5 * 0x1p-32));
    double hi = -log(-log((4294967295.0 + 0.5) * 0x1p-32));
    (void)state;

    assert_true(lo > -3.2 && lo < -3.0);
    assert_true(hi > 22.8 && hi < 22.9);
    for (uint32_t x = 0; x < 20000; x++) {
        double g = engine_sampler_gumbel(42, 3, x);

        assert_true(isfinite(g) && g >= lo && g <= hi);
    }
}

/* ---- greedy and determinism ------------------------------------------------------------- */

static void test_greedy_is_argmax_with_lower_id_on_ties(void **state)
{
    tdm_arena_t *arena = *state;
    const float logits[6] = {1.0f, 3.5f, -INFINITY, 3.5f, 2.0f, 3.5f};
    const float masked_first[3] = {-INFINITY, -7.0f, -7.0f};
    engine_sampler_params_t p = params_with(0.0, 0, 1.0, 0.0);

    for (uint64_t seed = 0; seed < 50; seed++) {
        p.seed = seed * 0x9E3779B97F4A7C15u;
        assert_int_equal(sample_token(arena, &p, logits, 6, (int64_t)seed), 1);
    }
    assert_int_equal(sample_token(arena, &p, masked_first, 3, 0), 1);
    /* Filters cannot move the greedy choice. */
    p = params_with(0.0, 1, 0.01, 1.0);
    assert_int_equal(sample_token(arena, &p, logits, 6, 3), 1);
}

static void test_same_seed_and_position_give_the_same_token(void **state)
{
    tdm_arena_t *arena = *state;
    float logits[1000];
    engine_sampler_params_t p = params_with(1.0, 0, 1.0, 0.0);
    rng_t rng = {7};

    for (int x = 0; x < 1000; x++) {
        logits[x] = (float)(0.3 * rng_normal(&rng));
    }
    p.seed = 0x0123456789abcdefu;
    for (int64_t q = 0; q < 64; q++) {
        int32_t first = sample_token(arena, &p, logits, 1000, q);

        assert_int_equal(sample_token(arena, &p, logits, 1000, q), first);
    }
}

static void test_different_seeds_and_positions_give_different_tokens(void **state)
{
    tdm_arena_t *arena = *state;
    float logits[1000] = {0};
    engine_sampler_params_t a = params_with(1.0, 0, 1.0, 0.0);
    engine_sampler_params_t b = a;
    int n_seed_diff = 0;
    int n_pos_diff = 0;

    a.seed = 1;
    b.seed = 2;
    for (int64_t q = 0; q < 64; q++) {
        int32_t ta = sample_token(arena, &a, logits, 1000, q);

        n_seed_diff += ta != sample_token(arena, &b, logits, 1000, q);
        n_pos_diff += ta != sample_token(arena, &a, logits, 1000, q + 64);
    }
    /* Uniform over 1000 tokens: a match has probability 1/1000 per position. */
    assert_true(n_seed_diff >= 60);
    assert_true(n_pos_diff >= 60);
}

/* ---- the distribution ------------------------------------------------------------------- */

static void test_frequencies_match_softmax_chi_square(void **state)
{
    tdm_arena_t *arena = *state;
    const float logits[8] = {1.0f, 0.5f, 0.0f, -0.5f, -1.0f, 2.0f, 0.25f, -1.5f};
    const double temperature = 0.8;
    const long n_draws = 40000;
    engine_sampler_params_t p = params_with(temperature, 0, 1.0, 0.0);
    double probs[8];
    long counts[8] = {0};
    double chi2;
    int df;

    softmax_double(logits, 8, temperature, probs);
    /* Half the draws vary the seed at a fixed position, half the position at a fixed seed. */
    draw_counts(arena, p, logits, 8, (int)(n_draws / 2), 1, counts);
    p.seed = 0xfeedfacecafebeefu;
    for (long q = 0; q < n_draws / 2; q++) {
        counts[sample_token(arena, &p, logits, 8, q)]++;
    }
    chi2 = chi_square(counts, probs, 8, n_draws, &df);
    print_message("softmax chi2=%.3f df=%d critical(alpha=0.001)=%.3f\n", chi2, df,
                  chi2_crit_001[df]);
    assert_int_equal(df, 7);
    assert_true(chi2 < chi2_crit_001[df]);
}

static void test_filtered_frequencies_match_filtered_probs_chi_square(void **state)
{
    tdm_arena_t *arena = *state;
    const float logits[10] = {2.0f, 1.6f, -INFINITY, 1.2f, 0.9f, 0.5f, 0.1f, -0.4f, 1.9f, -3.0f};
    const engine_sampler_params_t cases[3] = {
        params_with(1.0, 6, 1.0, 0.0),
        params_with(1.3, 0, 0.8, 0.0),
        params_with(0.7, 8, 0.95, 0.1),
    };
    const long n_draws = 20000;

    for (int c = 0; c < 3; c++) {
        double probs[10];
        long counts[10];
        double sum = 0.0;
        double chi2;
        int df;

        assert_int_equal(engine_sampler_filtered_probs(&cases[c], logits, 10, arena, probs),
                         TDM_OK);
        for (int x = 0; x < 10; x++) {
            sum += probs[x];
        }
        assert_true(fabs(sum - 1.0) < 1e-12);
        assert_true(probs[2] == 0.0 && probs[9] == 0.0);
        draw_counts(arena, cases[c], logits, 10, (int)n_draws, 500000 * (uint64_t)c, counts);
        chi2 = chi_square(counts, probs, 10, n_draws, &df);
        print_message("case %d chi2=%.3f df=%d critical(alpha=0.001)=%.3f\n", c, chi2, df,
                      chi2_crit_001[df]);
        assert_true(df >= 2);
        assert_true(chi2 < chi2_crit_001[df]);
    }
}

/* ---- exact support of each filter, worked by hand ---------------------------------------- */

static void test_top_k_keeps_k_best_with_lower_id_on_ties(void **state)
{
    tdm_arena_t *arena = *state;
    /* Rank order: 0 (3), 2 (3), 3 (2), 4 (2), 1 (1), 5 (0). */
    const float logits[6] = {3.0f, 1.0f, 3.0f, 2.0f, 2.0f, 0.0f};
    const int keep1[6] = {1, 0, 0, 0, 0, 0};
    const int keep3[6] = {1, 0, 1, 1, 0, 0};
    const int keep_all[6] = {1, 1, 1, 1, 1, 1};
    engine_sampler_params_t p = params_with(2.0, 1, 1.0, 0.0);

    assert_support(arena, &p, logits, 6, keep1);
    assert_draws_within(arena, p, logits, 6, keep1);
    p.top_k = 3;
    assert_support(arena, &p, logits, 6, keep3);
    assert_draws_within(arena, p, logits, 6, keep3);
    p.top_k = 6;
    assert_support(arena, &p, logits, 6, keep_all);
    p.top_k = 1000;
    assert_support(arena, &p, logits, 6, keep_all);
}

static void test_top_p_keeps_the_smallest_prefix_reaching_p(void **state)
{
    tdm_arena_t *arena = *state;
    /* Four equal logits: each has probability exactly 1/4, ranked by id. */
    const float flat[4] = {0.5f, 0.5f, 0.5f, 0.5f};
    const int keep1[4] = {1, 0, 0, 0};
    const int keep2[4] = {1, 1, 0, 0};
    const int keep3[4] = {1, 1, 1, 0};
    const int keep4[4] = {1, 1, 1, 1};
    engine_sampler_params_t p = params_with(1.0, 0, 0.25, 0.0);

    assert_support(arena, &p, flat, 4, keep1); /* 1/4 >= 0.25 */
    p.top_p = 0.25 + 1e-9;
    assert_support(arena, &p, flat, 4, keep2);
    p.top_p = 0.5; /* mass exactly 0.5 after two tokens */
    assert_support(arena, &p, flat, 4, keep2);
    assert_draws_within(arena, p, flat, 4, keep2);
    p.top_p = 0.5 + 1e-9;
    assert_support(arena, &p, flat, 4, keep3);
    assert_draws_within(arena, p, flat, 4, keep3);
    p.top_p = 0.75;
    assert_support(arena, &p, flat, 4, keep3);
    p.top_p = 0.76;
    assert_support(arena, &p, flat, 4, keep4);
    /* After top-k 2 the two survivors have 1/2 each: top-p 0.5 keeps one, 0.51 both. */
    p = params_with(1.0, 2, 0.5, 0.0);
    assert_support(arena, &p, flat, 4, keep1);
    p.top_p = 0.51;
    assert_support(arena, &p, flat, 4, keep2);
}

static void test_top_p_counts_mass_at_the_temperature(void **state)
{
    tdm_arena_t *arena = *state;
    /* l = (ln 3, 0, 0) in units of tau: with tau = 1 p = (3/5, 1/5, 1/5); top-p 0.7 keeps two.
     * With tau = 0.5 the first token has 9/11 > 0.7: keeps one. */
    const float logits[3] = {(float)log(3.0), 0.0f, 0.0f};
    const int keep1[3] = {1, 0, 0};
    const int keep2[3] = {1, 1, 0};
    engine_sampler_params_t p = params_with(1.0, 0, 0.7, 0.0);

    assert_support(arena, &p, logits, 3, keep2);
    p.temperature = 0.5;
    assert_support(arena, &p, logits, 3, keep1);
}

static void test_min_p_keeps_tokens_above_min_p_times_p_max(void **state)
{
    tdm_arena_t *arena = *state;
    const float logits[4] = {0.0f, -1.0f, -2.0f, -INFINITY};
    const float tied[3] = {2.0f, 1.0f, 2.0f};
    const int keep_top[4] = {1, 0, 0, 0};
    const int keep_two[4] = {1, 1, 0, 0};
    const int keep_three[4] = {1, 1, 1, 0};
    const int keep_tied[3] = {1, 0, 1};
    /* p(1)/p(0) = e^-1 at tau 1. */
    engine_sampler_params_t p = params_with(1.0, 0, 1.0, exp(-1.0) * (1.0 - 1e-9));

    assert_support(arena, &p, logits, 4, keep_two);
    assert_draws_within(arena, p, logits, 4, keep_two);
    p.min_p = exp(-1.0) * (1.0 + 1e-9);
    assert_support(arena, &p, logits, 4, keep_top);
    p.min_p = exp(-2.0) * (1.0 - 1e-9);
    assert_support(arena, &p, logits, 4, keep_three);
    /* tau = 2 halves the gaps: p(2)/p(0) = e^-1. */
    p = params_with(2.0, 0, 1.0, exp(-1.0) * (1.0 - 1e-9));
    assert_support(arena, &p, logits, 4, keep_three);
    /* min_p = 1 keeps exactly the tokens tied at the maximum. */
    p = params_with(1.0, 0, 1.0, 1.0);
    assert_support(arena, &p, tied, 3, keep_tied);
    assert_draws_within(arena, p, tied, 3, keep_tied);
}

static void test_masked_tokens_are_never_drawn(void **state)
{
    tdm_arena_t *arena = *state;
    const float logits[5] = {-INFINITY, 0.0f, -INFINITY, -30.0f, -INFINITY};
    const int expect[5] = {0, 1, 0, 1, 0};
    engine_sampler_params_t p = params_with(1.0, 0, 1.0, 0.0);
    long counts[5];

    draw_counts(arena, p, logits, 5, 4000, 1, counts);
    assert_true(counts[0] == 0 && counts[2] == 0 && counts[4] == 0);
    /* At tau = 30 token 3 has weight e^-1 and must be drawn too. */
    p.temperature = 30.0;
    draw_counts(arena, p, logits, 5, 4000, 1, counts);
    assert_true(counts[0] == 0 && counts[2] == 0 && counts[4] == 0 && counts[3] > 0);
    p.temperature = 1.0;
    assert_support(arena, &p, logits, 5, expect);
}

static void test_sample_matches_naive_primitive_on_random_cases(void **state)
{
    tdm_arena_t *arena = *state;
    static const double temperatures[4] = {0.3, 1.0, 2.5, 0.05};
    static const double top_ps[5] = {1.0, 0.9, 0.5, 0.1, 1.0 - 0x1p-52};
    static const double min_ps[4] = {0.0, 0.01, 0.2, 1.0};
    rng_t rng = {2024};
    int n_cases = 0;

    for (int c = 0; c < 600; c++) {
        int n = 1 + (int)(rng_next(&rng) % (c < 590 ? 300 : 20000));
        float *logits = calloc((size_t)n, sizeof(*logits));
        int *kept = calloc((size_t)n, sizeof(*kept));
        double *probs = calloc((size_t)n, sizeof(*probs));
        double *want = calloc((size_t)n, sizeof(*want));
        engine_sampler_params_t p;
        int any = 0;
        int32_t top_ks[5] = {0, 1, 3, n / 2, n + 5};

        assert_non_null(logits);
        assert_non_null(kept);
        assert_non_null(probs);
        assert_non_null(want);
        for (int x = 0; x < n; x++) {
            /* Quarter steps make ties; one token in ten is masked; one case in eight has a
             * far tail that top-p's candidate floor drops. */
            logits[x] = (float)(round(rng_normal(&rng) * 8.0) / 4.0);
            if (c % 8 == 7 && x % 3 != 0) {
                logits[x] -= 60.0f;
            }
            if (rng_next(&rng) % 10 == 0) {
                logits[x] = -INFINITY;
            }
            any |= isfinite(logits[x]);
        }
        if (!any) {
            logits[n - 1] = 1.0f;
        }
        p = params_with(temperatures[rng_next(&rng) % 4], top_ks[rng_next(&rng) % 5],
                        top_ps[rng_next(&rng) % 5], min_ps[rng_next(&rng) % 4]);
        naive_kept(&p, logits, n, kept);
        naive_probs(&p, logits, n, kept, want);
        assert_int_equal(engine_sampler_filtered_probs(&p, logits, n, arena, probs), TDM_OK);
        for (int x = 0; x < n; x++) {
            assert_true(probs[x] == want[x]);
        }
        for (int d = 0; d < 4; d++) {
            uint32_t q = (uint32_t)(rng_next(&rng) % 100000);

            p.seed = rng_next(&rng);
            assert_int_equal(sample_token(arena, &p, logits, n, q),
                             naive_sample(&p, logits, n, kept, q));
        }
        n_cases++;
        free(want);
        free(probs);
        free(kept);
        free(logits);
    }
    assert_int_equal(n_cases, 600);
}

static void test_top_p_near_one_keeps_all_when_no_prefix_reaches_it(void **state)
{
    tdm_arena_t *arena = *state;
    /* With top_p = 1 - 2^-52, the running sum (rank order) of these logits ends a few ulps below
     * top_p * Z (id order), so no prefix reaches it and top-p keeps the whole set, far tail
     * included, although the candidate floor first drops token 8 (glibc exp). */
    const float logits[9] = {0.402779996f, 2.50898576f,  2.46112561f, 0.0853823274f, 1.11312532f,
                             2.9593184f,   0.444717348f, 1.90646112f, -60.0f};
    engine_sampler_params_t p = params_with(1.0, 0, 1.0 - 0x1p-52, 0.0);
    int kept[9];
    double want[9];
    double probs[9];

    naive_kept(&p, logits, 9, kept);
    naive_probs(&p, logits, 9, kept, want);
    assert_int_equal(engine_sampler_filtered_probs(&p, logits, 9, arena, probs), TDM_OK);
    for (int x = 0; x < 9; x++) {
        assert_true(probs[x] == want[x]);
    }
    assert_true(kept[8] == 1 && probs[8] > 0.0);
}

static void test_filtered_probs_of_greedy_is_one_hot(void **state)
{
    tdm_arena_t *arena = *state;
    const float logits[4] = {0.0f, 5.0f, 5.0f, 1.0f};
    engine_sampler_params_t p = params_with(0.0, 0, 1.0, 0.0);
    double probs[4];

    assert_int_equal(engine_sampler_filtered_probs(&p, logits, 4, arena, probs), TDM_OK);
    assert_true(probs[0] == 0.0 && probs[1] == 1.0 && probs[2] == 0.0 && probs[3] == 0.0);
}

/* Issue 16: tau = 1e-310 made l / tau overflow (+inf - +inf = NaN scores) and token 0 won every
 * draw. Every temperature below ENGINE_SAMPLER_GREEDY_BELOW is the tau -> 0+ limit: the argmax,
 * whatever the seed and filters, in sample() and filtered_probs() alike. */
static void test_tiny_positive_temperature_is_greedy(void **state)
{
    tdm_arena_t *arena = *state;
    const double taus[] = {5e-324, 1e-310, 2.2250738585072014e-308, 1e-300, 1e-100, 1e-6, 9.99e-6};
    const float logits[5] = {1.0f, 3.5f, 2.0f, 3.5f, -1.0f};
    double probs[5];

    for (size_t i = 0; i < sizeof(taus) / sizeof(taus[0]); i++) {
        engine_sampler_params_t p = params_with(taus[i], 0, 1.0, 0.0);

        assert_int_equal(engine_sampler_params_validate(&p, 5, NULL, 0), TDM_OK);
        assert_true(engine_sampler_is_greedy(&p));
        for (uint64_t seed = 0; seed < 40; seed++) {
            p.seed = seed * 0x9E3779B97F4A7C15u;
            assert_int_equal(sample_token(arena, &p, logits, 5, (int64_t)seed), 1);
        }
        p.top_p = 0.5;
        p.min_p = 0.2;
        assert_int_equal(engine_sampler_filtered_probs(&p, logits, 5, arena, probs), TDM_OK);
        assert_true(probs[0] == 0.0 && probs[1] == 1.0 && probs[2] == 0.0 && probs[3] == 0.0 &&
                    probs[4] == 0.0);
    }
}

/* The line itself samples: tau = ENGINE_SAMPLER_GREEDY_BELOW keeps the Gumbel draw (finite
 * scores, every seed gives one of the two tied best tokens or a close runner-up, never a NaN). */
static void test_greedy_line_is_documented_and_sampling_starts_at_it(void **state)
{
    tdm_arena_t *arena = *state;
    const float logits[3] = {1.0f, 3.5f, 3.5f + 1e-6f};
    engine_sampler_params_t p = params_with(ENGINE_SAMPLER_GREEDY_BELOW, 0, 1.0, 0.0);
    double probs[3];

    assert_false(engine_sampler_is_greedy(&p));
    assert_int_equal(engine_sampler_filtered_probs(&p, logits, 3, arena, probs), TDM_OK);
    assert_true(isfinite(probs[1]) && isfinite(probs[2]) && probs[0] == 0.0);
    assert_true(fabs(probs[1] + probs[2] - 1.0) < 1e-12);
    for (uint64_t seed = 0; seed < 20; seed++) {
        int32_t t;

        p.seed = seed;
        t = sample_token(arena, &p, logits, 3, 0);
        assert_true(t == 1 || t == 2);
    }
    p.temperature = 0.0;
    assert_true(engine_sampler_is_greedy(&p));
}

static void test_full_vocabulary_with_every_filter(void **state)
{
    tdm_arena_t *arena = *state;
    float *logits = calloc(BIG_VOCAB, sizeof(*logits));
    int *kept = calloc(BIG_VOCAB, sizeof(*kept));
    engine_sampler_params_t p = params_with(0.7, 0, 0.95, 0.0);
    rng_t rng = {99};

    assert_non_null(logits);
    assert_non_null(kept);
    for (int x = 0; x < BIG_VOCAB; x++) {
        logits[x] = (float)(2.5 * rng_normal(&rng));
    }
    for (int c = 0; c < 3; c++) {
        if (c == 1) {
            p = params_with(1.0, 40, 0.9, 0.02);
        } else if (c == 2) {
            p = params_with(1.2, 50000, 0.99, 0.0);
        }
        naive_kept(&p, logits, BIG_VOCAB, kept);
        for (int d = 0; d < 3; d++) {
            p.seed = 77 + (uint64_t)d;
            assert_int_equal(sample_token(arena, &p, logits, BIG_VOCAB, 4096 + d),
                             naive_sample(&p, logits, BIG_VOCAB, kept, 4096 + (uint32_t)d));
        }
    }
    free(kept);
    free(logits);
}

/* ---- log-probabilities ------------------------------------------------------------------ */

static void test_logprobs_equal_double_log_softmax_of_raw_logits(void **state)
{
    tdm_arena_t *arena = *state;
    enum { N = 1000 };
    float logits[N];
    double lp[N];
    ranked_t order[N];
    int n_fin = 0;
    double max = -INFINITY;
    double z = 0.0;
    rng_t rng = {5};
    engine_sampler_params_t p = params_with(0.6, 50, 0.9, 0.0);
    engine_sample_t s;

    for (int x = 0; x < N; x++) {
        logits[x] = x % 97 == 3 ? -INFINITY : (float)(round(rng_normal(&rng) * 12.0) / 4.0);
    }
    for (int x = 0; x < N; x++) {
        if (isfinite(logits[x])) {
            max = fmax(max, logits[x]);
            order[n_fin].logit = logits[x];
            order[n_fin].id = x;
            n_fin++;
        }
    }
    for (int x = 0; x < N; x++) {
        z += isfinite(logits[x]) ? exp((double)logits[x] - max) : 0.0;
    }
    for (int x = 0; x < N; x++) {
        lp[x] = (double)logits[x] - max - log(z);
    }
    qsort(order, (size_t)n_fin, sizeof(order[0]), rank_cmp);

    for (int t = 0; t < 3; t++) {
        p.temperature = t == 0 ? 0.6 : (t == 1 ? 0.0 : 3.0); /* raw: temperature does not matter */
        p.n_logprobs = ENGINE_SAMPLER_MAX_LOGPROBS;
        p.seed = 11 + (uint64_t)t;
        assert_int_equal(engine_sampler_sample(&p, logits, N, 8, arena, &s), TDM_OK);
        assert_true(fabs(s.logprob - lp[s.token]) < 1e-12);
        assert_int_equal(s.n_top, ENGINE_SAMPLER_MAX_LOGPROBS);
        for (int i = 0; i < s.n_top; i++) {
            assert_int_equal(s.top[i].token, order[i].id);
            assert_true(fabs(s.top[i].logprob - lp[order[i].id]) < 1e-12);
        }
    }
    /* 0: the chosen token only; off: nothing. */
    p.n_logprobs = 0;
    assert_int_equal(engine_sampler_sample(&p, logits, N, 8, arena, &s), TDM_OK);
    assert_int_equal(s.n_top, 0);
    assert_true(fabs(s.logprob - lp[s.token]) < 1e-12);
    p.n_logprobs = ENGINE_SAMPLER_LOGPROBS_OFF;
    assert_int_equal(engine_sampler_sample(&p, logits, N, 8, arena, &s), TDM_OK);
    assert_int_equal(s.n_top, 0);
    assert_true(s.logprob == 0.0);
}

static void test_logprobs_list_only_finite_tokens(void **state)
{
    tdm_arena_t *arena = *state;
    const float logits[4] = {-INFINITY, 1.0f, -INFINITY, 1.0f};
    engine_sampler_params_t p = params_with(1.0, 0, 1.0, 0.0);
    engine_sample_t s;

    p.n_logprobs = 5;
    assert_int_equal(engine_sampler_sample(&p, logits, 4, 0, arena, &s), TDM_OK);
    assert_int_equal(s.n_top, 2);
    assert_int_equal(s.top[0].token, 1);
    assert_int_equal(s.top[1].token, 3);
    assert_true(fabs(s.top[0].logprob - log(0.5)) < 1e-15);
    assert_true(s.top[2].token == 0 && s.top[2].logprob == 0.0);
}

/* ---- parameters, stop ids, errors ------------------------------------------------------- */

static void test_default_params_are_valid_and_documented(void **state)
{
    engine_sampler_params_t p;
    char err[ERR_BYTES] = "";
    (void)state;

    engine_sampler_params_default(&p);
    assert_int_equal(engine_sampler_params_validate(&p, 10, err, sizeof(err)), TDM_OK);
    assert_true(p.temperature == 1.0 && p.top_k == 0 && p.top_p == 1.0 && p.min_p == 0.0);
    assert_int_equal(p.n_logprobs, ENGINE_SAMPLER_LOGPROBS_OFF);
    assert_int_equal(p.n_stop_ids, 0);
}

static void test_is_stop_says_whether_a_token_ends_the_sequence(void **state)
{
    engine_sampler_params_t p;
    (void)state;

    engine_sampler_params_default(&p);
    assert_false(engine_sampler_is_stop(&p, 0));
    p.stop_ids[0] = 2;
    p.stop_ids[1] = 151;
    p.n_stop_ids = 2;
    assert_true(engine_sampler_is_stop(&p, 2));
    assert_true(engine_sampler_is_stop(&p, 151));
    assert_false(engine_sampler_is_stop(&p, 3));
    assert_false(engine_sampler_is_stop(&p, -1));
}

/* Every bad field: validate and sample both refuse, naming the field; outputs untouched. */
static void test_every_bad_field_is_refused_by_name_and_changes_nothing(void **state)
{
    tdm_arena_t *arena = *state;
    const float logits[4] = {0.0f, 1.0f, 2.0f, 3.0f};
    struct {
        const char *field;
        engine_sampler_params_t p;
    } bad[16];
    int n_bad = 0;
    engine_sampler_params_t base;

    engine_sampler_params_default(&base);
    for (int i = 0; i < 16; i++) {
        bad[i].p = base;
    }
    bad[n_bad].field = "temperature";
    bad[n_bad++].p.temperature = NAN;
    bad[n_bad].field = "temperature";
    bad[n_bad++].p.temperature = INFINITY;
    bad[n_bad].field = "temperature";
    bad[n_bad++].p.temperature = -0.5;
    bad[n_bad].field = "top_k";
    bad[n_bad++].p.top_k = -1;
    bad[n_bad].field = "top_p";
    bad[n_bad++].p.top_p = 0.0;
    bad[n_bad].field = "top_p";
    bad[n_bad++].p.top_p = 1.5;
    bad[n_bad].field = "top_p";
    bad[n_bad++].p.top_p = NAN;
    bad[n_bad].field = "min_p";
    bad[n_bad++].p.min_p = -0.1;
    bad[n_bad].field = "min_p";
    bad[n_bad++].p.min_p = NAN;
    bad[n_bad].field = "min_p";
    bad[n_bad++].p.min_p = INFINITY;
    bad[n_bad].field = "n_logprobs";
    bad[n_bad++].p.n_logprobs = ENGINE_SAMPLER_MAX_LOGPROBS + 1;
    bad[n_bad].field = "n_logprobs";
    bad[n_bad++].p.n_logprobs = -2;
    bad[n_bad].field = "n_stop_ids";
    bad[n_bad++].p.n_stop_ids = ENGINE_SAMPLER_MAX_STOP_IDS + 1;
    bad[n_bad].field = "n_stop_ids";
    bad[n_bad++].p.n_stop_ids = -1;
    bad[n_bad].field = "stop_ids[1]";
    bad[n_bad].p.n_stop_ids = 2;
    bad[n_bad++].p.stop_ids[1] = 4;

    for (int i = 0; i < n_bad; i++) {
        char err[ERR_BYTES] = "";
        engine_sample_t before;
        engine_sample_t s;
        double probs[4] = {-1.0, -1.0, -1.0, -1.0};
        engine_sampler_params_t copy = bad[i].p;
        size_t high_water = arena->high_water_bytes;

        assert_int_equal(engine_sampler_params_validate(&bad[i].p, 4, err, sizeof(err)),
                         TDM_ERR_INVALID_ARG);
        print_message("%s\n", err);
        assert_memory_equal(err, bad[i].field, strlen(bad[i].field));
        assert_int_equal(err[strlen(bad[i].field)], ':');
        assert_memory_equal(&copy, &bad[i].p, sizeof(copy));
        memset(&before, 0xa5, sizeof(before));
        memcpy(&s, &before, sizeof(s));
        assert_int_equal(engine_sampler_sample(&bad[i].p, logits, 4, 0, arena, &s),
                         TDM_ERR_INVALID_ARG);
        assert_memory_equal(&s, &before, sizeof(s));
        assert_int_equal(engine_sampler_filtered_probs(&bad[i].p, logits, 4, arena, probs),
                         TDM_ERR_INVALID_ARG);
        assert_true(probs[0] == -1.0 && probs[3] == -1.0);
        assert_int_equal(arena->used_bytes, 0);
        assert_int_equal(arena->high_water_bytes, high_water);
    }
    /* A NULL err buffer is allowed. */
    assert_int_equal(engine_sampler_params_validate(&bad[0].p, 4, NULL, 0), TDM_ERR_INVALID_ARG);
}

static void test_bad_call_arguments_are_refused_and_change_nothing(void **state)
{
    tdm_arena_t *arena = *state;
    const float logits[4] = {0.0f, 1.0f, 2.0f, 3.0f};
    engine_sampler_params_t p = params_with(1.0, 0, 1.0, 0.0);
    engine_sample_t before;
    engine_sample_t s;
    char err[ERR_BYTES] = "";
    double probs[4] = {-1.0, -1.0, -1.0, -1.0};

    memset(&before, 0x5a, sizeof(before));
    memcpy(&s, &before, sizeof(s));
    assert_int_equal(engine_sampler_params_validate(&p, 0, err, sizeof(err)), TDM_ERR_INVALID_ARG);
    assert_memory_equal(err, "n_vocab:", 8);
    assert_int_equal(engine_sampler_sample(&p, logits, 0, 0, arena, &s), TDM_ERR_INVALID_ARG);
    assert_int_equal(engine_sampler_sample(&p, logits, (int64_t)INT32_MAX + 1, 0, arena, &s),
                     TDM_ERR_INVALID_ARG);
    assert_int_equal(engine_sampler_sample(&p, NULL, 4, 0, arena, &s), TDM_ERR_INVALID_ARG);
    assert_int_equal(engine_sampler_sample(&p, logits, 4, 0, NULL, &s), TDM_ERR_INVALID_ARG);
    assert_int_equal(engine_sampler_sample(NULL, logits, 4, 0, arena, &s), TDM_ERR_INVALID_ARG);
    assert_int_equal(engine_sampler_sample(&p, logits, 4, -1, arena, &s), TDM_ERR_INVALID_ARG);
    assert_int_equal(
        engine_sampler_sample(&p, logits, 4, ENGINE_SAMPLER_MAX_POSITION + 1, arena, &s),
        TDM_ERR_INVALID_ARG);
    assert_int_equal(engine_sampler_filtered_probs(&p, logits, 4, arena, NULL),
                     TDM_ERR_INVALID_ARG);
    assert_memory_equal(&s, &before, sizeof(s));
    assert_int_equal(arena->used_bytes, 0);
    /* The largest position is fine. */
    assert_int_equal(engine_sampler_sample(&p, logits, 4, ENGINE_SAMPLER_MAX_POSITION, arena, &s),
                     TDM_OK);
    assert_true(probs[0] == -1.0);
}

static void test_nan_inf_or_all_masked_logits_are_engine_errors(void **state)
{
    tdm_arena_t *arena = *state;
    const float with_nan[4] = {0.0f, NAN, 2.0f, 3.0f};
    const float with_inf[4] = {0.0f, 1.0f, INFINITY, 3.0f};
    const float all_masked[3] = {-INFINITY, -INFINITY, -INFINITY};
    const float *bad[3] = {with_nan, with_inf, all_masked};
    const int64_t n[3] = {4, 4, 3};
    const double temperatures[2] = {0.0, 1.0};

    for (int b = 0; b < 3; b++) {
        for (int t = 0; t < 2; t++) {
            engine_sampler_params_t p = params_with(temperatures[t], 0, 1.0, 0.0);
            engine_sample_t before;
            engine_sample_t s;
            double probs[4] = {-1.0, -1.0, -1.0, -1.0};

            p.n_logprobs = 3;
            memset(&before, 0x3c, sizeof(before));
            memcpy(&s, &before, sizeof(s));
            assert_int_equal(engine_sampler_sample(&p, bad[b], n[b], 1, arena, &s),
                             TDM_ERR_INTERNAL);
            assert_memory_equal(&s, &before, sizeof(s));
            assert_int_equal(engine_sampler_filtered_probs(&p, bad[b], n[b], arena, probs),
                             TDM_ERR_INTERNAL);
            assert_true(probs[0] == -1.0 && probs[2] == -1.0);
            assert_int_equal(arena->used_bytes, 0);
        }
    }
}

static void test_arena_too_small_is_no_memory_and_changes_nothing(void **state)
{
    tdm_arena_t small;
    const float logits[64] = {0};
    engine_sampler_params_t p = params_with(1.0, 0, 1.0, 0.0);
    engine_sample_t before;
    engine_sample_t s;
    double probs[64];
    (void)state;

    assert_int_equal(tdm_arena_init(&small, engine_sampler_scratch_bytes(64)), TDM_OK);
    assert_int_equal(engine_sampler_sample(&p, logits, 64, 0, &small, &s), TDM_OK);
    assert_int_equal(small.used_bytes, 0);
    assert_non_null(tdm_arena_alloc(&small, 64, 0));
    memset(&before, 0x11, sizeof(before));
    memcpy(&s, &before, sizeof(s));
    assert_int_equal(engine_sampler_sample(&p, logits, 64, 0, &small, &s), TDM_ERR_NO_MEMORY);
    assert_memory_equal(&s, &before, sizeof(s));
    assert_int_equal(engine_sampler_filtered_probs(&p, logits, 64, &small, probs),
                     TDM_ERR_NO_MEMORY);
    assert_int_equal(small.used_bytes, 64);
    tdm_arena_fini(&small);
}

static void test_sampling_returns_the_scratch_it_used(void **state)
{
    tdm_arena_t *arena = *state;
    float logits[256];
    engine_sampler_params_t p = params_with(0.9, 10, 0.8, 0.05);
    engine_sample_t s;
    double probs[256];

    for (int x = 0; x < 256; x++) {
        logits[x] = (float)(x % 17) * 0.25f;
    }
    assert_non_null(tdm_arena_alloc(arena, 100, 0)); /* the caller's own allocation stays */
    assert_int_equal(engine_sampler_sample(&p, logits, 256, 3, arena, &s), TDM_OK);
    assert_int_equal(arena->used_bytes, 100);
    assert_int_equal(engine_sampler_filtered_probs(&p, logits, 256, arena, probs), TDM_OK);
    assert_int_equal(arena->used_bytes, 100);
    tdm_arena_reset(arena);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        SAMPLER_TEST(test_philox_matches_random123_known_answers),
        SAMPLER_TEST(test_gumbel_uses_seed_low_word_as_key_0_and_counter_q_x_0_0),
        SAMPLER_TEST(test_gumbel_is_finite_and_bounded),
        SAMPLER_TEST(test_greedy_is_argmax_with_lower_id_on_ties),
        SAMPLER_TEST(test_same_seed_and_position_give_the_same_token),
        SAMPLER_TEST(test_different_seeds_and_positions_give_different_tokens),
        SAMPLER_TEST(test_frequencies_match_softmax_chi_square),
        SAMPLER_TEST(test_filtered_frequencies_match_filtered_probs_chi_square),
        SAMPLER_TEST(test_top_k_keeps_k_best_with_lower_id_on_ties),
        SAMPLER_TEST(test_top_p_keeps_the_smallest_prefix_reaching_p),
        SAMPLER_TEST(test_top_p_counts_mass_at_the_temperature),
        SAMPLER_TEST(test_min_p_keeps_tokens_above_min_p_times_p_max),
        SAMPLER_TEST(test_masked_tokens_are_never_drawn),
        SAMPLER_TEST(test_sample_matches_naive_primitive_on_random_cases),
        SAMPLER_TEST(test_top_p_near_one_keeps_all_when_no_prefix_reaches_it),
        SAMPLER_TEST(test_filtered_probs_of_greedy_is_one_hot),
        SAMPLER_TEST(test_tiny_positive_temperature_is_greedy),
        SAMPLER_TEST(test_greedy_line_is_documented_and_sampling_starts_at_it),
        SAMPLER_TEST(test_full_vocabulary_with_every_filter),
        SAMPLER_TEST(test_logprobs_equal_double_log_softmax_of_raw_logits),
        SAMPLER_TEST(test_logprobs_list_only_finite_tokens),
        SAMPLER_TEST(test_default_params_are_valid_and_documented),
        SAMPLER_TEST(test_is_stop_says_whether_a_token_ends_the_sequence),
        SAMPLER_TEST(test_every_bad_field_is_refused_by_name_and_changes_nothing),
        SAMPLER_TEST(test_bad_call_arguments_are_refused_and_change_nothing),
        SAMPLER_TEST(test_nan_inf_or_all_masked_logits_are_engine_errors),
        SAMPLER_TEST(test_arena_too_small_is_no_memory_and_changes_nothing),
        SAMPLER_TEST(test_sampling_returns_the_scratch_it_used),
    };

    return cmocka_run_group_tests(tests, NULL, NULL) == 0 ? 0 : 1;
}
