/* test_tokenizer_detok.c - text/tokenizer.h streaming detokenizer: multi-byte characters and
 * emoji split at every byte, ill-formed sequences to U+FFFD only once provably invalid,
 * whole-sequence decode equal to streaming, SKIP_CONTROL, errors. Uses the synthetic
 * tokenizer, whose ids 3..258 are the single bytes 0..255. Needs no shared data. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "text/tokenizer.h"
#include "tokenizer_test_util.h"

#define VOCAB      1024u
#define BYTE_ID(b) (3 + (int32_t)(uint8_t)(b))
#define FFFD       "\xef\xbf\xbd"

static int setup(void **state)
{
    text_tokenizer_t *tok = NULL;
    char *json = NULL;
    size_t n = 0;

    if (text_tokenizer_synthetic_hf_text(VOCAB, &json, &n, NULL, 0) != TDM_OK ||
        text_tokenizer_load_hf_buffer(json, n, "synthetic", &tok, NULL, 0) != TDM_OK) {
        free(json);
        return -1;
    }
    free(json);
    *state = tok;
    return 0;
}

static int teardown(void **state)
{
    text_tokenizer_destroy(*state);
    return 0;
}

/* Is s[0..n) well-formed UTF-8 made of complete characters? */
static int is_valid_utf8(const uint8_t *s, size_t n)
{
    size_t i = 0;

    while (i < n) {
        uint8_t b = s[i];
        size_t len;
        uint8_t lo = 0x80, hi = 0xbf;
        if (b < 0x80) {
            i++;
            continue;
        }
        if (b >= 0xc2 && b <= 0xdf) {
            len = 2;
        } else if (b >= 0xe0 && b <= 0xef) {
            len = 3;
            lo = b == 0xe0 ? 0xa0 : 0x80;
            hi = b == 0xed ? 0x9f : 0xbf;
        } else if (b >= 0xf0 && b <= 0xf4) {
            len = 4;
            lo = b == 0xf0 ? 0x90 : 0x80;
            hi = b == 0xf4 ? 0x8f : 0xbf;
        } else {
            return 0;
        }
        if (i + len > n || s[i + 1] < lo || s[i + 1] > hi) {
            return 0;
        }
        for (size_t k = 2; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) {
                return 0;
            }
        }
        i += len;
    }
    return 1;
}

/* Push `ids`, then flush; every chunk must be valid UTF-8; returns the concatenation. */
static char *stream(text_tokenizer_t *tok, const int32_t *ids, size_t n_ids, uint32_t flags,
                    size_t *n_out)
{
    text_detok_t *detok = NULL;
    char *all = malloc(3 * 4096 + 1);
    size_t n_all = 0;
    const char *chunk;
    size_t n_chunk;

    assert_non_null(all);
    assert_int_equal(text_detok_create(tok, flags, &detok), TDM_OK);
    for (size_t i = 0; i < n_ids; i++) {
        assert_int_equal(text_detok_push(detok, ids[i], &chunk, &n_chunk), TDM_OK);
        assert_true(is_valid_utf8((const uint8_t *)chunk, n_chunk));
        assert_true(n_all + n_chunk <= 3 * 4096);
        memcpy(all + n_all, chunk, n_chunk);
        n_all += n_chunk;
    }
    assert_int_equal(text_detok_flush(detok, &chunk, &n_chunk), TDM_OK);
    assert_true(is_valid_utf8((const uint8_t *)chunk, n_chunk));
    memcpy(all + n_all, chunk, n_chunk);
    n_all += n_chunk;
    all[n_all] = '\0';
    text_detok_destroy(detok);
    *n_out = n_all;
    return all;
}

/* Length of the longest prefix of s[0..n) that is made of complete characters. */
static size_t complete_prefix(const uint8_t *s, size_t n)
{
    size_t best = 0;

    for (size_t k = 0; k <= n; k++) {
        if (is_valid_utf8(s, k)) {
            best = k;
        }
    }
    return best;
}

static void test_multibyte_text_split_at_every_byte_streams_exactly(void **state)
{
    static const char *const texts[] = {
        "é",
        "€",
        "😀",
        "a€b",
        "Füße ß",
        "日本語のテキスト",
        "🚀 (normal) 😶‍🌫️ ✅",
        "👨‍👩‍👧‍👦",
        "🇯🇵🇫🇷",
        "e\u0301\u0308",
        "\xf4\x8f\xbf\xbf",
        "\xed\x9f\xbf",
    };
    text_tokenizer_t *tok = *state;

    for (size_t t = 0; t < sizeof(texts) / sizeof(texts[0]); t++) {
        const uint8_t *s = (const uint8_t *)texts[t];
        size_t n = strlen(texts[t]);
        /* One token per byte: every split point of every character is exercised. */
        text_detok_t *detok = NULL;
        const char *chunk;
        size_t n_chunk, emitted = 0;
        char out[256];
        assert_int_equal(text_detok_create(tok, 0, &detok), TDM_OK);
        for (size_t i = 0; i < n; i++) {
            assert_int_equal(text_detok_push(detok, BYTE_ID(s[i]), &chunk, &n_chunk), TDM_OK);
            assert_true(is_valid_utf8((const uint8_t *)chunk, n_chunk));
            memcpy(out + emitted, chunk, n_chunk);
            emitted += n_chunk;
            /* After each byte, exactly the complete characters so far are out. */
            assert_int_equal(emitted, complete_prefix(s, i + 1));
            assert_memory_equal(out, s, emitted);
        }
        assert_int_equal(text_detok_flush(detok, &chunk, &n_chunk), TDM_OK);
        assert_int_equal(n_chunk, 0);
        assert_int_equal(emitted, n);
        text_detok_destroy(detok);
    }
}

static void test_tokens_spanning_two_characters_stream_exactly(void **state)
{
    static const char text[] = "x😀é€y日";
    text_tokenizer_t *tok = *state;
    size_t n = sizeof(text) - 1;

    /* Two ids: bytes [0, cut) as byte tokens then one run; re-encode each part with encode(). */
    for (size_t cut = 0; cut <= n; cut++) {
        int32_t *a = NULL, *b = NULL, ids[64];
        size_t n_a = 0, n_b = 0, n_out = 0;
        char *out;
        assert_int_equal(text_tokenizer_encode(tok, text, cut, 0, &a, &n_a), TDM_OK);
        assert_int_equal(text_tokenizer_encode(tok, text + cut, n - cut, 0, &b, &n_b), TDM_OK);
        assert_true(n_a + n_b <= 64);
        if (n_a > 0) {
            memcpy(ids, a, n_a * sizeof(*ids));
        }
        if (n_b > 0) {
            memcpy(ids + n_a, b, n_b * sizeof(*ids));
        }
        out = stream(tok, ids, n_a + n_b, 0, &n_out);
        assert_int_equal(n_out, n);
        assert_memory_equal(out, text, n);
        free(out);
        text_tokens_free(a);
        text_tokens_free(b);
    }
}

/* Stream raw bytes (one token each) and compare with the expected sanitized text. */
static void assert_bytes_give(text_tokenizer_t *tok, const char *raw, size_t n_raw,
                              const char *expected)
{
    int32_t ids[64];
    char *out, *whole = NULL;
    size_t n_out = 0, n_whole = 0;

    for (size_t i = 0; i < n_raw; i++) {
        ids[i] = BYTE_ID(raw[i]);
    }
    out = stream(tok, ids, n_raw, 0, &n_out);
    if (strcmp(out, expected) != 0) {
        print_message("got \"%s\" expected \"%s\"\n", out, expected);
    }
    assert_string_equal(out, expected);
    assert_int_equal(text_detok_decode(tok, ids, n_raw, 0, &whole, &n_whole), TDM_OK);
    assert_string_equal(whole, expected);
    free(out);
    free(whole);
}

static void test_ill_formed_bytes_become_one_fffd_per_maximal_subpart(void **state)
{
    text_tokenizer_t *tok = *state;

    assert_bytes_give(tok, "\x80", 1, FFFD);          /* stray continuation */
    assert_bytes_give(tok, "\xc0\x80", 2, FFFD FFFD); /* overlong lead C0 */
    assert_bytes_give(tok, "\xc1\xbf", 2, FFFD FFFD);
    assert_bytes_give(tok, "\xf5\x80\x80\x80", 4, FFFD FFFD FFFD FFFD);
    assert_bytes_give(tok, "\xff", 1, FFFD);
    assert_bytes_give(tok, "\xe0\x80\x80", 3, FFFD FFFD FFFD);          /* overlong 3-byte */
    assert_bytes_give(tok, "\xed\xa0\x80", 3, FFFD FFFD FFFD);          /* surrogate D800 */
    assert_bytes_give(tok, "\xf4\x90\x80\x80", 4, FFFD FFFD FFFD FFFD); /* > U+10FFFF */
    assert_bytes_give(tok,
                      "\xe2\x82"
                      "A",
                      3, FFFD "A"); /* truncated, then ASCII */
    assert_bytes_give(tok,
                      "\xf0\x9f\x98"
                      "\xf0\x9f\x98\x80",
                      7, FFFD "😀");
    assert_bytes_give(tok, "\xf0\x9f\x98", 3, FFFD); /* truncated at the end */
    assert_bytes_give(tok, "a\xe2\x82\xacz\xe2", 6, "a€z" FFFD);
}

static void test_fffd_waits_until_the_sequence_is_provably_invalid(void **state)
{
    text_tokenizer_t *tok = *state;
    text_detok_t *detok = NULL;
    const char *chunk;
    size_t n;

    assert_int_equal(text_detok_create(tok, 0, &detok), TDM_OK);
    assert_int_equal(text_detok_push(detok, BYTE_ID(0xf0), &chunk, &n), TDM_OK);
    assert_int_equal(n, 0);
    assert_int_equal(text_detok_push(detok, BYTE_ID(0x9f), &chunk, &n), TDM_OK);
    assert_int_equal(n, 0);
    /* 'A' proves the prefix F0 9F can never complete: one U+FFFD, then 'A'. */
    assert_int_equal(text_detok_push(detok, BYTE_ID('A'), &chunk, &n), TDM_OK);
    assert_int_equal(n, 4);
    assert_memory_equal(chunk, FFFD "A", 4);
    /* An impossible second byte is known at once: E0 80 -> two U+FFFD immediately. */
    assert_int_equal(text_detok_push(detok, BYTE_ID(0xe0), &chunk, &n), TDM_OK);
    assert_int_equal(n, 0);
    assert_int_equal(text_detok_push(detok, BYTE_ID(0x80), &chunk, &n), TDM_OK);
    assert_int_equal(n, 6);
    assert_memory_equal(chunk, FFFD FFFD, 6);
    /* reset drops a held prefix without emitting anything. */
    assert_int_equal(text_detok_push(detok, BYTE_ID(0xe2), &chunk, &n), TDM_OK);
    text_detok_reset(detok);
    assert_int_equal(text_detok_flush(detok, &chunk, &n), TDM_OK);
    assert_int_equal(n, 0);
    text_detok_destroy(detok);
}

static void test_decode_equals_streaming_for_random_ids(void **state)
{
    text_tokenizer_t *tok = *state;
    uint64_t rng = 7;

    for (int round = 0; round < 300; round++) {
        int32_t ids[48];
        size_t n_ids = 1 + (size_t)round % 48, n_stream = 0, n_whole = 0;
        char *streamed, *whole = NULL;
        for (size_t i = 0; i < n_ids; i++) {
            uint64_t r = tt_rand(&rng);
            /* Mostly bytes >= 0x80 (where splitting matters), sometimes any token. */
            ids[i] =
                r % 4 != 0 ? BYTE_ID(0x80 + (r >> 8) % 128) : (int32_t)((r >> 8) % (VOCAB - 2));
        }
        streamed = stream(tok, ids, n_ids, 0, &n_stream);
        assert_int_equal(text_detok_decode(tok, ids, n_ids, 0, &whole, &n_whole), TDM_OK);
        assert_int_equal(n_whole, n_stream);
        assert_memory_equal(whole, streamed, n_whole);
        assert_true(is_valid_utf8((const uint8_t *)whole, n_whole));
        free(streamed);
        free(whole);
    }
}

static void test_skip_control_drops_special_tokens_only(void **state)
{
    text_tokenizer_t *tok = *state;
    int32_t user = -1, think = -1;
    int32_t ids[6];
    char *text = NULL;
    size_t n = 0;

    assert_int_equal(text_tokenizer_find_special(tok, "<｜User｜>", &user), TDM_OK);
    assert_int_equal(text_tokenizer_find_special(tok, "<think>", &think), TDM_OK);
    ids[0] = TEXT_TOKENIZER_SYNTH_BOS_ID;
    ids[1] = user;
    ids[2] = BYTE_ID('h');
    ids[3] = think;
    ids[4] = BYTE_ID('i');
    ids[5] = TEXT_TOKENIZER_SYNTH_EOS_ID;
    assert_int_equal(text_detok_decode(tok, ids, 6, TEXT_DETOK_SKIP_CONTROL, &text, &n), TDM_OK);
    assert_string_equal(text, "h<think>i"); /* <think> is not a control token */
    free(text);
    assert_int_equal(text_detok_decode(tok, ids, 6, 0, &text, &n), TDM_OK);
    assert_string_equal(text, "<｜begin▁of▁sentence｜><｜User｜>h<think>i<｜end▁of▁sentence｜>");
    free(text);
}

static void test_bad_ids_are_rejected_and_change_nothing(void **state)
{
    text_tokenizer_t *tok = *state;
    text_detok_t *detok = NULL;
    int32_t ids[2] = {BYTE_ID('a'), (int32_t)VOCAB};
    char *text = (char *)"untouched";
    const char *chunk;
    size_t n = 3;

    assert_int_equal(text_detok_decode(tok, ids, 2, 0, &text, &n), TDM_ERR_INVALID_ARG);
    assert_string_equal(text, "untouched");
    assert_int_equal(n, 3);
    assert_int_equal(text_detok_create(tok, 1u << 9, &detok), TDM_ERR_INVALID_ARG);
    assert_int_equal(text_detok_create(tok, 0, &detok), TDM_OK);
    assert_int_equal(text_detok_push(detok, BYTE_ID(0xe2), &chunk, &n), TDM_OK);
    assert_int_equal(text_detok_push(detok, -1, &chunk, &n), TDM_ERR_INVALID_ARG);
    assert_int_equal(text_detok_push(detok, (int32_t)VOCAB, &chunk, &n), TDM_ERR_INVALID_ARG);
    /* The held E2 survived the rejected pushes. */
    assert_int_equal(text_detok_push(detok, BYTE_ID(0x82), &chunk, &n), TDM_OK);
    assert_int_equal(text_detok_push(detok, BYTE_ID(0xac), &chunk, &n), TDM_OK);
    assert_int_equal(n, 3);
    assert_memory_equal(chunk, "€", 3);
    text_detok_destroy(detok);
    text_detok_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_multibyte_text_split_at_every_byte_streams_exactly),
        cmocka_unit_test(test_tokens_spanning_two_characters_stream_exactly),
        cmocka_unit_test(test_ill_formed_bytes_become_one_fffd_per_maximal_subpart),
        cmocka_unit_test(test_fffd_waits_until_the_sequence_is_provably_invalid),
        cmocka_unit_test(test_decode_equals_streaming_for_random_ids),
        cmocka_unit_test(test_skip_control_drops_special_tokens_only),
        cmocka_unit_test(test_bad_ids_are_rejected_and_change_nothing),
    };

    return cmocka_run_group_tests(tests, setup, teardown);
}
