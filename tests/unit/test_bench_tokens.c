/* test_bench_tokens.c - tandem-bench token synthesis: determinism, prefix sharing, vocabulary
 * range, scaling and argument checks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "bench/replay/tokens.h"

#define N_MAX 4096

static bench_token_params_t params_of(uint32_t vocab, double scale, uint64_t salt)
{
    bench_token_params_t p;
    p.vocab_size = vocab;
    p.scale = scale;
    p.salt = salt;
    return p;
}

static void test_same_id_gives_same_block(void **state)
{
    bench_token_params_t p = params_of(129280, 1.0, 7);
    uint32_t a[512];
    uint32_t b[512];
    uint32_t c[512];
    (void)state;

    bench_tokens_block(&p, 12345, a, 512);
    bench_tokens_block(&p, 12345, b, 512);
    bench_tokens_block(&p, 12346, c, 512);
    assert_memory_equal(a, b, sizeof(a));
    assert_memory_not_equal(a, c, sizeof(a));
    /* A shorter request is a prefix of the same block. */
    bench_tokens_block(&p, 12345, c, 100);
    assert_memory_equal(a, c, 100 * sizeof(uint32_t));
    /* Known values pin the generator: a change here changes every run's prompts. */
    print_message("block 12345 salt 7 starts %u %u %u\n", a[0], a[1], a[2]);
}

static void test_salt_gives_unrelated_tokens(void **state)
{
    bench_token_params_t p1 = params_of(129280, 1.0, 1);
    bench_token_params_t p2 = params_of(129280, 1.0, 2);
    uint32_t a[512];
    uint32_t b[512];
    size_t n_same = 0;
    (void)state;

    bench_tokens_block(&p1, 0, a, 512);
    bench_tokens_block(&p2, 0, b, 512);
    for (size_t i = 0; i < 512; i++) {
        n_same += a[i] == b[i];
    }
    assert_true(n_same < 5);
}

static void test_ids_stay_inside_the_plain_vocabulary(void **state)
{
    const uint32_t vocabs[] = {16, 17, 1000, 129280};
    uint32_t tokens[512];
    int seen_low = 0;
    int seen_high = 0;
    (void)state;

    for (size_t v = 0; v < sizeof(vocabs) / sizeof(vocabs[0]); v++) {
        bench_token_params_t p = params_of(vocabs[v], 1.0, 3);
        for (int64_t id = 0; id < 64; id++) {
            bench_tokens_block(&p, id, tokens, 512);
            for (size_t i = 0; i < 512; i++) {
                assert_true(tokens[i] >= BENCH_TOKEN_FIRST_ID);
                assert_true(tokens[i] < vocabs[v] - BENCH_TOKEN_TOP_RESERVED);
                if (vocabs[v] == 16) {
                    seen_low |= tokens[i] == BENCH_TOKEN_FIRST_ID;
                    seen_high |= tokens[i] == 16 - BENCH_TOKEN_TOP_RESERVED - 1;
                }
            }
        }
    }
    /* The whole allowed range is used (both ends seen with a tiny vocabulary). */
    assert_true(seen_low);
    assert_true(seen_high);
}

static void test_prompts_share_prefix_exactly_where_hash_ids_do(void **state)
{
    bench_token_params_t p = params_of(50000, 1.0, 9);
    int64_t ids1[] = {0, 1, 2};
    int64_t ids2[] = {0, 1, 5, 6};
    bench_turn_t t1 = {0};
    bench_turn_t t2 = {0};
    uint32_t *a = calloc(N_MAX, sizeof(uint32_t));
    uint32_t *b = calloc(N_MAX, sizeof(uint32_t));
    size_t na = 0;
    size_t nb = 0;
    (void)state;

    t1.input_length = 1300; /* 2 full blocks + 276 */
    t1.hash_ids = ids1;
    t1.n_hash_ids = 3;
    t1.line = 1;
    t2.input_length = 1900;
    t2.hash_ids = ids2;
    t2.n_hash_ids = 4;
    t2.line = 2;
    assert_int_equal(bench_tokens_prompt(&p, &t1, a, N_MAX, &na), TDM_OK);
    assert_int_equal(bench_tokens_prompt(&p, &t2, b, N_MAX, &nb), TDM_OK);
    assert_int_equal(na, 1300);
    assert_int_equal(nb, 1900);
    assert_memory_equal(a, b, 1024 * sizeof(uint32_t));
    assert_memory_not_equal(a + 1024, b + 1024, 276 * sizeof(uint32_t));
    free(a);
    free(b);
}

static void test_scale_shrinks_blocks_and_lengths(void **state)
{
    bench_token_params_t full = params_of(50000, 1.0, 4);
    bench_token_params_t small = params_of(50000, 0.125, 4);
    int64_t ids[] = {3, 4};
    bench_turn_t turn = {0};
    uint32_t block[64];
    uint32_t prompt[256];
    size_t n = 0;
    (void)state;

    assert_int_equal(bench_tokens_block_size(1.0), 512);
    assert_int_equal(bench_tokens_block_size(0.125), 64);
    assert_int_equal(bench_tokens_block_size(0.0001), 1);
    assert_int_equal(bench_tokens_scaled(1000, 0.125), 125);
    assert_int_equal(bench_tokens_scaled(3, 0.01), 1);
    turn.input_length = 1000;
    turn.hash_ids = ids;
    turn.n_hash_ids = 2;
    assert_int_equal(bench_tokens_prompt(&small, &turn, prompt, 256, &n), TDM_OK);
    assert_int_equal(n, 125);
    /* Scaled blocks are prefixes of the full-size blocks of the same id. */
    bench_tokens_block(&full, 4, block, 64);
    assert_memory_equal(prompt + 64, block, 61 * sizeof(uint32_t));
}

static void test_unnamed_blocks_are_unique_to_the_request(void **state)
{
    bench_token_params_t p = params_of(50000, 1.0, 4);
    bench_turn_t t1 = {0};
    bench_turn_t t2 = {0};
    uint32_t *a = calloc(N_MAX, sizeof(uint32_t));
    uint32_t *b = calloc(N_MAX, sizeof(uint32_t));
    uint32_t *a_again = calloc(N_MAX, sizeof(uint32_t));
    size_t n = 0;
    (void)state;

    t1.input_length = 700;
    t1.line = 10;
    t2.input_length = 700;
    t2.line = 11;
    assert_int_equal(bench_tokens_prompt(&p, &t1, a, N_MAX, &n), TDM_OK);
    assert_int_equal(bench_tokens_prompt(&p, &t2, b, N_MAX, &n), TDM_OK);
    assert_int_equal(bench_tokens_prompt(&p, &t1, a_again, N_MAX, &n), TDM_OK);
    assert_memory_not_equal(a, b, 512 * sizeof(uint32_t));
    assert_memory_equal(a, a_again, 700 * sizeof(uint32_t));
    free(a);
    free(b);
    free(a_again);
}

static void test_bad_arguments_are_refused_and_change_nothing(void **state)
{
    bench_token_params_t p = params_of(50000, 1.0, 4);
    bench_turn_t turn = {0};
    uint32_t prompt[8];
    size_t n = 77;
    (void)state;

    turn.input_length = 9;
    assert_int_equal(bench_tokens_prompt(&p, &turn, prompt, 8, &n), TDM_ERR_INVALID_ARG);
    assert_int_equal(n, 77);
    p.vocab_size = BENCH_TOKEN_MIN_VOCAB - 1;
    assert_int_equal(bench_tokens_check(&p), TDM_ERR_INVALID_ARG);
    p.vocab_size = 50000;
    p.scale = 0.0;
    assert_int_equal(bench_tokens_check(&p), TDM_ERR_INVALID_ARG);
    p.scale = 1.5;
    assert_int_equal(bench_tokens_check(&p), TDM_ERR_INVALID_ARG);
    p.scale = 1.0;
    assert_int_equal(bench_tokens_check(&p), TDM_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_id_gives_same_block),
        cmocka_unit_test(test_salt_gives_unrelated_tokens),
        cmocka_unit_test(test_ids_stay_inside_the_plain_vocabulary),
        cmocka_unit_test(test_prompts_share_prefix_exactly_where_hash_ids_do),
        cmocka_unit_test(test_scale_shrinks_blocks_and_lengths),
        cmocka_unit_test(test_unnamed_blocks_are_unique_to_the_request),
        cmocka_unit_test(test_bad_arguments_are_refused_and_change_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
