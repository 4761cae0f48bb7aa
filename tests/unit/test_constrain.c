/* test_constrain.c - engine/constrain: the token mask equals the brute-force answer (every token's
 * bytes stepped through the automaton, stop ids where the text is complete) along random
 * constrained generations over a hand-made vocabulary and over the synthetic tokenizer; apply
 * masks exactly the refused tokens; advance refuses a masked token and changes nothing;
 * mark/rewind; error paths. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/constrain.h"
#include "text/constrain.h"
#include "text/tokenizer.h"

#define ERR_BYTES 256

/* A 10-property schema with every supported keyword. */
static const char *const SCHEMA_RF =
    "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"t\",\"strict\":true,\"schema\":{"
    "\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
    "\"score\":{\"type\":\"number\"},\"ok\":{\"type\":\"boolean\"},\"none\":{\"type\":\"null\"},"
    "\"color\":{\"enum\":[\"red\",\"green\",\"blue\"]},\"v\":{\"const\":2},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},"
    "\"either\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"integer\"}]},"
    "\"child\":{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"string\"}},"
    "\"required\":[\"k\"],\"additionalProperties\":false}},"
    "\"required\":[\"name\",\"age\",\"color\"],\"additionalProperties\":false}}}";

static const int32_t STOP_ID = 0;

/* Splittable PRNG for the walks (xorshift64*). */
static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1Dull;
}

typedef struct {
    int64_t n;
    const uint8_t **bytes;
    size_t *lens;
} vocab_bytes_t;

/* The brute-force mask bit of token x from `state`. */
static int brute_allows(const text_constraint_t *cc, const text_constraint_state_t *state,
                        const vocab_bytes_t *vb, int64_t x)
{
    text_constraint_state_t st;

    if (x == STOP_ID) {
        return text_constraint_accepting(cc, state);
    }
    if (vb->bytes[x] == NULL || vb->lens[x] == 0) {
        return 0;
    }
    text_constraint_state_copy(&st, state);
    return text_constraint_step_bytes(cc, &st, vb->bytes[x], vb->lens[x]);
}

/* Random constrained generations: at each step the mask equals brute force; the token is drawn
 * uniformly from the allowed ones, biased to end strings and values after a while. */
/* The tool-call language over two tools (text/constrain.h), thinking on. */
static const char *const TOOLS_JSON =
    "{\"thinking\":true,\"parallel\":true,\"tools\":["
    "{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"location\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},"
    "\"unit\":{\"enum\":[\"c\",\"f\"]}},\"required\":[\"location\"]}},"
    "{\"name\":\"get_time\"}]}";

static tdm_status_t compile_any(int tools, text_constraint_t **out)
{
    return tools ? text_constraint_compile_tool_calls(TOOLS_JSON, strlen(TOOLS_JSON), out, NULL, 0)
                 : text_constraint_compile(SCHEMA_RF, strlen(SCHEMA_RF), out, NULL, 0);
}

static void check_walks(const engine_constrain_vocab_t *vocab, const vocab_bytes_t *vb, int n_walks,
                        int max_steps, int tools, int *n_finished_out)
{
    text_constraint_t *cc = NULL;
    int32_t *allowed = malloc((size_t)vb->n * sizeof(int32_t));
    uint64_t rng = 0x9E3779B97F4A7C15ull;

    assert_non_null(allowed);
    assert_int_equal(compile_any(tools, &cc), TDM_OK);
    *n_finished_out = 0;
    for (int w = 0; w < n_walks; w++) {
        engine_constraint_t *c = NULL;
        text_constraint_t *own = NULL;
        text_constraint_state_t shadow;

        assert_int_equal(compile_any(tools, &own), TDM_OK);
        assert_int_equal(engine_constraint_create_compiled(vocab, own, &STOP_ID, 1, &c), TDM_OK);
        text_constraint_start(cc, &shadow);
        for (int step = 0; step < max_steps && !engine_constraint_finished(c); step++) {
            const uint64_t *mask = engine_constraint_mask(c);
            int64_t n_allowed = 0;
            int32_t pick;

            for (int64_t x = 0; x < vb->n; x++) {
                int bit = (int)(mask[x / 64] >> (x % 64) & 1);

                if (bit != brute_allows(cc, &shadow, vb, x)) {
                    print_message("walk %d step %d token %lld: mask %d, brute force %d\n", w, step,
                                  (long long)x, bit, !bit);
                    fail();
                }
                if (bit) {
                    allowed[n_allowed++] = (int32_t)x;
                }
            }
            assert_true(n_allowed > 0);
            pick = allowed[rng_next(&rng) % (uint64_t)n_allowed];
            /* late in a walk prefer short tokens with a quote or a closing bracket: ends values */
            if (step > max_steps / 2) {
                for (int tries = 0; tries < 64; tries++) {
                    int32_t y = allowed[rng_next(&rng) % (uint64_t)n_allowed];

                    if (y == STOP_ID || (vb->lens[y] <= 2 && vb->bytes[y] != NULL &&
                                         memchr("\"}]<", vb->bytes[y][0], 4) != NULL)) {
                        pick = y;
                        break;
                    }
                }
            }
            assert_int_equal(engine_constraint_advance(c, pick), TDM_OK);
            if (pick != STOP_ID) {
                assert_true(
                    text_constraint_step_bytes(cc, &shadow, vb->bytes[pick], vb->lens[pick]));
            }
        }
        *n_finished_out += engine_constraint_finished(c);
        engine_constraint_destroy(c);
    }
    text_constraint_destroy(cc);
    free(allowed);
}

/* A hand-made vocabulary: every byte alone, JSON punctuation pairs, the schema's keys cut in
 * pieces, digits, words, UTF-8 pieces (whole and split), and random byte strings. */
static void make_small_vocab(vocab_bytes_t *vb, uint8_t **pool_out)
{
    /* clang-format off */
    static const char *const pieces[] = {
        "{\"", "\":", "\",", "\"}", "\"]", "\"", "\":\"", "},", "}", "]", "[", "[\"", ",\"", ": ",
        ", ", " ", "\n", "\n  ", "name", "na", "me", "age", "score", "ok", "none", "null",
        "color", "col", "or", "red", "green", "blue", "tags", "either", "child", "k", "true",
        "false", "tr", "ue", "0", "1", "12", "-", ".", "e", "E+", "5", "2", "\\", "\\n", "\\u",
        "00e9", "\xc3\xa9", "\xc3", "\xa9", "\xe2\x82", "\xac", "hello", " world", "\"v\":2",
        "\"age\":", "\"name\":\"", "abc\"", "x\"}", "1}", "3,", "\"ok\":true}",
        /* the tool-call markup, whole and in pieces */
        "</think>", "</", "think>", "\n\n", "\xef\xbd\x9c", "DSML",
        "<\xef\xbd\x9c" "DSML\xef\xbd\x9c",
        "tool_calls>", "tool_calls>\n", "invoke", " name=\"", "invoke name=\"", "parameter",
        "parameter name=\"", "\">\n", "\">", "\" string=\"", "true\">", "false\">", "get_time",
        "get_weather", "location", "days", "unit", "\n<", "\n</", "Seoul", "</\xef\xbd\x9c" "DSML"};
    /* clang-format on */
    size_t n_pieces = sizeof(pieces) / sizeof(pieces[0]);
    int64_t n = 1 + 256 + (int64_t)n_pieces + 400;

    assert_true(n_pieces < 128);
    uint8_t *pool = malloc((size_t)n * 8);
    uint64_t rng = 12345;
    size_t used = 0;

    assert_non_null(pool);
    vb->n = n;
    vb->bytes = calloc((size_t)n, sizeof(*vb->bytes));
    vb->lens = calloc((size_t)n, sizeof(*vb->lens));
    assert_non_null(vb->bytes);
    assert_non_null(vb->lens);
    /* id 0: the stop id (no bytes) */
    for (int b = 0; b < 256; b++) {
        pool[used] = (uint8_t)b;
        vb->bytes[1 + b] = pool + used;
        vb->lens[1 + b] = 1;
        used++;
    }
    for (size_t i = 0; i < n_pieces; i++) {
        vb->bytes[257 + i] = (const uint8_t *)pieces[i];
        vb->lens[257 + i] = strlen(pieces[i]);
    }
    for (int64_t x = 257 + (int64_t)n_pieces; x < n; x++) {
        static const char alphabet[] = "{}[]\":,ab1 .\\ntrue-e\xc3\xa9";
        size_t len = 1 + rng_next(&rng) % 5;

        vb->bytes[x] = pool + used;
        vb->lens[x] = len;
        for (size_t k = 0; k < len; k++) {
            pool[used++] = (uint8_t)alphabet[rng_next(&rng) % (sizeof(alphabet) - 1)];
        }
    }
    *pool_out = pool;
}

static void test_mask_matches_brute_force_small_vocab(void **state)
{
    vocab_bytes_t vb;
    uint8_t *pool;
    engine_constrain_vocab_t *vocab = NULL;
    int n_finished;

    (void)state;
    make_small_vocab(&vb, &pool);
    assert_int_equal(engine_constrain_vocab_create(vb.n, vb.bytes, vb.lens, &vocab), TDM_OK);
    check_walks(vocab, &vb, 40, 120, 0, &n_finished);
    print_message("JSON walks that ended with the stop id: %d of 40\n", n_finished);
    assert_true(n_finished > 0);
    check_walks(vocab, &vb, 40, 200, 1, &n_finished);
    print_message("tool-call walks that ended with the stop id: %d of 40\n", n_finished);
    assert_true(n_finished > 0);
    engine_constrain_vocab_destroy(vocab);
    free(vb.bytes);
    free(vb.lens);
    free(pool);
}

static void test_mask_matches_brute_force_synthetic_tokenizer(void **state)
{
    char *json = NULL;
    size_t n_json = 0;
    text_tokenizer_t *tok = NULL;
    engine_constrain_vocab_t *vocab = NULL;
    char err[ERR_BYTES] = "";
    vocab_bytes_t vb;
    int n_finished;
    int32_t dsml = -1;

    (void)state;
    assert_int_equal(text_tokenizer_synthetic_hf_text(4096, &json, &n_json, err, sizeof(err)),
                     TDM_OK);
    assert_int_equal(
        text_tokenizer_load_hf_buffer(json, n_json, "synthetic", &tok, err, sizeof(err)), TDM_OK);
    free(json);
    assert_int_equal(engine_constrain_vocab_from_tokenizer(tok, 4096, &vocab), TDM_OK);
    /* the DSML marker is a special token the masks admit as its text */
    assert_int_equal(text_tokenizer_find_special(tok,
                                                 "\xef\xbd\x9c"
                                                 "DSML"
                                                 "\xef\xbd\x9c",
                                                 &dsml),
                     TDM_OK);
    vb.n = 4096;
    vb.bytes = calloc(4096, sizeof(*vb.bytes));
    vb.lens = calloc(4096, sizeof(*vb.lens));
    assert_non_null(vb.bytes);
    assert_non_null(vb.lens);
    for (int32_t x = 0; x < 4096; x++) {
        text_token_kind_t kind;

        assert_int_equal(text_tokenizer_token_kind(tok, x, &kind), TDM_OK);
        if (kind == TEXT_TOKEN_NORMAL || kind == TEXT_TOKEN_USER_DEFINED || x == dsml) {
            assert_int_equal(text_tokenizer_token_bytes(tok, x, &vb.bytes[x], &vb.lens[x]), TDM_OK);
        }
    }
    /* id 0 is BOS in the synthetic layout, a control token: the walks use it as the stop id */
    vb.bytes[STOP_ID] = NULL;
    vb.lens[STOP_ID] = 0;
    check_walks(vocab, &vb, 6, 80, 0, &n_finished);
    check_walks(vocab, &vb, 4, 80, 1, &n_finished);
    engine_constrain_vocab_destroy(vocab);
    text_tokenizer_destroy(tok);
    free(vb.bytes);
    free(vb.lens);
}

static void test_apply_advance_rewind(void **state)
{
    static const uint8_t *const bytes[] = {NULL, (const uint8_t *)"{", (const uint8_t *)"}",
                                           (const uint8_t *)"x", (const uint8_t *)"\"a\":1"};
    static const size_t lens[] = {0, 1, 1, 1, 5};
    const char *rf = "{\"type\":\"json_object\"}";
    engine_constrain_vocab_t *vocab = NULL;
    engine_constraint_t *c = NULL;
    engine_constraint_mark_t mark;
    float logits[5] = {1, 2, 3, 4, 5};

    (void)state;
    assert_int_equal(engine_constrain_vocab_create(5, bytes, lens, &vocab), TDM_OK);
    assert_int_equal(engine_constraint_create(vocab, rf, strlen(rf), &STOP_ID, 1, &c, NULL, 0),
                     TDM_OK);
    assert_int_equal(engine_constraint_apply(c, logits, 5), TDM_OK);
    assert_true(isinf(logits[0]) && isinf(logits[2]) && isinf(logits[3]) && isinf(logits[4]));
    assert_true(logits[1] == 2.0f);
    assert_int_equal(engine_constraint_apply(c, logits, 4), TDM_ERR_INVALID_ARG);
    /* a refused token changes nothing */
    assert_int_equal(engine_constraint_advance(c, 2), TDM_ERR_INVALID_ARG);
    assert_int_equal(engine_constraint_advance(c, 7), TDM_ERR_INVALID_ARG);
    assert_true(engine_constraint_allows(c, 1));
    engine_constraint_mark(c, &mark);
    assert_int_equal(engine_constraint_advance(c, 1), TDM_OK);
    assert_true(engine_constraint_allows(c, 4) && engine_constraint_allows(c, 2));
    assert_int_equal(engine_constraint_advance(c, 4), TDM_OK);
    assert_int_equal(engine_constraint_advance(c, 2), TDM_OK);
    assert_true(engine_constraint_allows(c, STOP_ID));
    assert_false(engine_constraint_allows(c, 1));
    assert_int_equal(engine_constraint_advance(c, STOP_ID), TDM_OK);
    assert_true(engine_constraint_finished(c));
    for (int i = 0; i < 5; i++) {
        logits[i] = 0.0f;
    }
    assert_int_equal(engine_constraint_apply(c, logits, 5), TDM_ERR_INTERNAL);
    assert_true(logits[0] == 0.0f); /* unchanged */
    engine_constraint_rewind(c, &mark);
    assert_false(engine_constraint_finished(c));
    assert_true(engine_constraint_allows(c, 1));
    assert_false(engine_constraint_allows(c, 2));
    engine_constraint_destroy(c);

    /* a clone (constraints made from a request's fields) walks on its own */
    {
        engine_constraint_t *a = NULL;
        engine_constraint_t *b = NULL;

        assert_int_equal(engine_constraint_create_request(vocab, rf, "", &STOP_ID, 1, &a, NULL, 0),
                         TDM_OK);
        assert_int_equal(engine_constraint_advance(a, 1), TDM_OK);
        assert_int_equal(engine_constraint_clone(a, &b), TDM_OK);
        assert_true(engine_constraint_allows(b, 4) && !engine_constraint_allows(b, 1));
        assert_int_equal(engine_constraint_advance(b, 2), TDM_OK);
        assert_true(engine_constraint_allows(b, STOP_ID));
        assert_false(engine_constraint_allows(a, STOP_ID)); /* a did not move */
        assert_true(engine_constraint_allows(a, 4));
        engine_constraint_destroy(a);
        engine_constraint_destroy(b);
        assert_int_equal(engine_constraint_create(vocab, rf, strlen(rf), &STOP_ID, 1, &a, NULL, 0),
                         TDM_OK);
        assert_int_equal(engine_constraint_clone(a, &b), TDM_ERR_INVALID_ARG);
        assert_null(b);
        engine_constraint_destroy(a);
    }

    /* errors: no stop id, a stop id out of range, a refused schema */
    assert_int_equal(engine_constraint_create(vocab, rf, strlen(rf), &STOP_ID, 0, &c, NULL, 0),
                     TDM_ERR_INVALID_ARG);
    {
        const int32_t far = 9;
        const char *bad = "{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{\"not\":{}}}}";
        char err[ERR_BYTES] = "";

        assert_int_equal(engine_constraint_create(vocab, rf, strlen(rf), &far, 1, &c, NULL, 0),
                         TDM_ERR_INVALID_ARG);
        assert_int_equal(
            engine_constraint_create(vocab, bad, strlen(bad), &STOP_ID, 1, &c, err, sizeof(err)),
            TDM_ERR_INVALID_ARG);
        assert_non_null(strstr(err, "schema.not"));
    }
    engine_constrain_vocab_destroy(vocab);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mask_matches_brute_force_small_vocab),
        cmocka_unit_test(test_mask_matches_brute_force_synthetic_tokenizer),
        cmocka_unit_test(test_apply_advance_rewind),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
