/* test_tokenizer_gguf.c - text/tokenizer.h GGUF reader: a tiny GGUF built here (every value
 * type, nested arrays, a tensor info) loads and encodes; truncation at every offset and byte
 * flips at every position give TDM_ERR_FORMAT (or a valid load), never a crash; each header and
 * metadata error names its offset; the real vocabularies in shared/data are truncated and
 * garbled too; SentencePiece vocabularies are reported out of scope. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/log.h"
#include "text/tokenizer.h"
#include "tokenizer_test_util.h"

/* ---- a tiny GGUF writer ---------------------------------------------------------------------- */

typedef struct {
    uint8_t *buf;
    size_t n, cap;
} gbuf_t;

static void put(gbuf_t *g, const void *p, size_t n)
{
    if (g->n + n > g->cap) {
        g->cap = (g->n + n) * 2 + 256;
        g->buf = realloc(g->buf, g->cap);
        assert_non_null(g->buf);
    }
    memcpy(g->buf + g->n, p, n);
    g->n += n;
}

static void put_le(gbuf_t *g, uint64_t v, size_t n)
{
    uint8_t b[8];

    for (size_t i = 0; i < n; i++) {
        b[i] = (uint8_t)(v >> (8 * i));
    }
    put(g, b, n);
}

static void put_str(gbuf_t *g, const char *s, size_t n)
{
    put_le(g, n, 8);
    put(g, s, n);
}

static void put_key(gbuf_t *g, const char *key, uint32_t type)
{
    put_str(g, key, strlen(key));
    put_le(g, type, 4);
}

/* Variations of the tiny file, for the error tests. */
typedef struct {
    const char *model; /* tokenizer.ggml.model */
    int omit_tokens;
    int short_token_types; /* one type fewer than tokens */
    int bad_merge;         /* a merge without a space */
    int nesting;           /* depth of a nested array key (1 = a plain array) */
} tiny_opts_t;

#define N_TINY_EXTRA 5
static const char *const tiny_extra[N_TINY_EXTRA] = {"he", "ll", "hell", "hello", "<|endoftext|>"};
static const char *const tiny_merges[] = {"h e", "l l", "he ll", "hell o"};

static void put_nested(gbuf_t *g, int depth)
{
    if (depth == 1) {
        put_le(g, 1, 4); /* INT8 */
        put_le(g, 3, 8);
        put_le(g, 0x010203, 3);
        return;
    }
    put_le(g, 9, 4); /* ARRAY of ... */
    put_le(g, 2, 8);
    put_nested(g, depth - 1);
    put_nested(g, depth - 1);
}

static gbuf_t tiny_gguf(const tiny_opts_t *o)
{
    gbuf_t g = {0};
    size_t n_tokens = 256 + N_TINY_EXTRA;
    char text[4];

    put(&g, "GGUF", 4);
    put_le(&g, 3, 4);
    put_le(&g, 1, 8); /* tensors */
    put_le(&g, 16 - (o->omit_tokens ? 1 : 0), 8);
    put_key(&g, "general.architecture", 8);
    put_str(&g, "gpt2", 4);
    put_key(&g, "general.some_u8", 0);
    put_le(&g, 7, 1);
    put_key(&g, "general.some_i16", 3);
    put_le(&g, 0xfffe, 2);
    put_key(&g, "general.some_f32", 6);
    put_le(&g, 0x3f800000, 4);
    put_key(&g, "general.some_bool", 7);
    put_le(&g, 1, 1);
    put_key(&g, "general.some_u64", 10);
    put_le(&g, 1ull << 40, 8);
    put_key(&g, "general.some_f64", 12);
    put_le(&g, 0x3ff0000000000000ull, 8);
    put_key(&g, "general.nested", 9);
    put_nested(&g, o->nesting);
    put_key(&g, "tokenizer.ggml.model", 8);
    put_str(&g, o->model, strlen(o->model));
    put_key(&g, "tokenizer.ggml.pre", 8);
    put_str(&g, "gpt-2", 5);
    if (!o->omit_tokens) {
        put_key(&g, "tokenizer.ggml.tokens", 9);
        put_le(&g, 8, 4);
        put_le(&g, n_tokens, 8);
        for (int b = 0; b < 256; b++) {
            put_str(&g, text, tt_byte_text(b, text));
        }
        for (int i = 0; i < N_TINY_EXTRA; i++) {
            put_str(&g, tiny_extra[i], strlen(tiny_extra[i]));
        }
    }
    put_key(&g, "tokenizer.ggml.token_type", 9);
    put_le(&g, 5, 4); /* INT32 */
    put_le(&g, n_tokens - (o->short_token_types ? 1 : 0), 8);
    for (size_t i = 0; i < n_tokens - (o->short_token_types ? 1 : 0); i++) {
        put_le(&g, i + 1 == n_tokens ? 3 : 1, 4);
    }
    put_key(&g, "tokenizer.ggml.merges", 9);
    put_le(&g, 8, 4);
    put_le(&g, 4, 8);
    for (int i = 0; i < 4; i++) {
        const char *m = o->bad_merge && i == 2 ? "hell" : tiny_merges[i];
        put_str(&g, m, strlen(m));
    }
    put_key(&g, "tokenizer.ggml.bos_token_id", 4);
    put_le(&g, n_tokens - 1, 4);
    put_key(&g, "tokenizer.ggml.eos_token_id", 4);
    put_le(&g, n_tokens - 1, 4);
    put_key(&g, "tokenizer.ggml.padding_token_id", 5);
    put_le(&g, n_tokens - 1, 4);
    /* one tensor info: name, n_dims, dims, type, offset */
    put_str(&g, "token_embd.weight", 17);
    put_le(&g, 2, 4);
    put_le(&g, 8, 8);
    put_le(&g, n_tokens, 8);
    put_le(&g, 0, 4);
    put_le(&g, 0, 8);
    return g;
}

static const tiny_opts_t default_opts = {"gpt2", 0, 0, 0, 2};

/* Load a buffer; on success check it encodes and destroy it. */
static tdm_status_t try_load(const uint8_t *data, size_t n, char *err, size_t err_bytes)
{
    text_tokenizer_t *tok = NULL;
    tdm_status_t status =
        text_tokenizer_load_gguf_buffer(data, n, "test.gguf", &tok, err, err_bytes);

    if (status == TDM_OK) {
        int32_t *ids = NULL;
        size_t n_ids = 0;
        assert_non_null(tok);
        assert_int_equal(text_tokenizer_encode(tok, "hello world <|endoftext|>", 25,
                                               TEXT_TOKENIZE_PARSE_SPECIAL, &ids, &n_ids),
                         TDM_OK);
        text_tokens_free(ids);
        text_tokenizer_destroy(tok);
    } else {
        assert_null(tok);
    }
    return status;
}

/* ---- tiny file ------------------------------------------------------------------------------- */

static void test_tiny_gguf_loads_and_encodes(void **state)
{
    gbuf_t g = tiny_gguf(&default_opts);
    text_tokenizer_t *tok = NULL;
    text_tokenizer_info_t info;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    char err[256] = "";

    (void)state;
    assert_int_equal(text_tokenizer_load_gguf_buffer(g.buf, g.n, "tiny", &tok, err, sizeof(err)),
                     TDM_OK);
    text_tokenizer_get_info(tok, &info);
    assert_int_equal(info.n_vocab, 261);
    assert_int_equal(info.n_merges, 4);
    assert_int_equal(info.bos_id, 260);
    assert_int_equal(info.eos_id, 260);
    assert_int_equal(info.pad_id, 260);
    assert_string_equal(info.pre_name, "gpt-2");
    assert_int_equal(text_tokenizer_encode(tok, "hello", 5, 0, &ids, &n_ids), TDM_OK);
    assert_int_equal(n_ids, 1);
    assert_int_equal(ids[0], 259);
    text_tokens_free(ids);
    text_tokenizer_destroy(tok);
    free(g.buf);
}

static void test_tiny_gguf_truncated_at_every_offset_is_format_error(void **state)
{
    gbuf_t g = tiny_gguf(&default_opts);
    char err[256];

    (void)state;
    for (size_t cut = 0; cut < g.n; cut++) {
        err[0] = '\0';
        assert_int_equal(try_load(g.buf, cut, err, sizeof(err)), TDM_ERR_FORMAT);
        assert_non_null(strstr(err, "offset "));
    }
    free(g.buf);
}

static void test_tiny_gguf_every_byte_flipped_never_crashes(void **state)
{
    static const uint8_t masks[] = {0xff, 0x01, 0x80, 0x10};
    gbuf_t g = tiny_gguf(&default_opts);
    uint8_t *copy = malloc(g.n);
    size_t n_ok = 0, n_format = 0, n_unsupported = 0;
    char err[256];

    (void)state;
    assert_non_null(copy);
    tdm_log_set_level(TDM_LOG_ERROR); /* garbled names and ids warn on every load */
    for (size_t pos = 0; pos < g.n; pos++) {
        for (size_t m = 0; m < sizeof(masks); m++) {
            tdm_status_t status;
            memcpy(copy, g.buf, g.n);
            copy[pos] ^= masks[m];
            status = try_load(copy, g.n, err, sizeof(err));
            n_ok += status == TDM_OK;
            n_format += status == TDM_ERR_FORMAT;
            n_unsupported += status == TDM_ERR_UNSUPPORTED;
            assert_true(status == TDM_OK || status == TDM_ERR_FORMAT ||
                        status == TDM_ERR_UNSUPPORTED);
        }
    }
    tdm_log_set_level(TDM_LOG_INFO);
    print_message("%zu flips: %zu load, %zu TDM_ERR_FORMAT, %zu TDM_ERR_UNSUPPORTED\n",
                  g.n * sizeof(masks), n_ok, n_format, n_unsupported);
    assert_true(n_format > 0);
    free(copy);
    free(g.buf);
}

/* Patch bytes [offset, offset + n) of the tiny file and expect `status` with `needle` in err. */
static void expect_patched(size_t offset, uint64_t value, size_t n, tdm_status_t status,
                           const char *needle)
{
    gbuf_t g = tiny_gguf(&default_opts);
    char err[256] = "";

    for (size_t i = 0; i < n; i++) {
        g.buf[offset + i] = (uint8_t)(value >> (8 * i));
    }
    assert_int_equal(try_load(g.buf, g.n, err, sizeof(err)), status);
    if (strstr(err, needle) == NULL) {
        print_message("error \"%s\" lacks \"%s\"\n", err, needle);
    }
    assert_non_null(strstr(err, needle));
    free(g.buf);
}

static void test_header_errors_name_the_problem(void **state)
{
    (void)state;
    expect_patched(0, 'X', 1, TDM_ERR_FORMAT, "magic");
    expect_patched(4, 1, 4, TDM_ERR_UNSUPPORTED, "version 1");
    expect_patched(4, 0x03000000, 4, TDM_ERR_UNSUPPORTED, "big-endian");
    expect_patched(4, 7, 4, TDM_ERR_FORMAT, "version 7");
    expect_patched(16, 1ull << 40, 8, TDM_ERR_FORMAT, "metadata entries cannot fit");
    expect_patched(8, 1ull << 40, 8, TDM_ERR_FORMAT, "tensor infos cannot fit");
    /* The first key's length (offset 24) and its value type (offset 24 + 8 + 20). */
    expect_patched(24, 0xffffffffull, 8, TDM_ERR_FORMAT,
                   "offset 24: key of 4294967295 bytes runs past the end");
    expect_patched(52, 13, 4, TDM_ERR_FORMAT,
                   "offset 52: key 'general.architecture': value "
                   "type 13 is not a GGUF value type");
}

static void test_metadata_errors_name_the_key(void **state)
{
    tiny_opts_t o = default_opts;
    gbuf_t g;
    char err[256] = "";

    (void)state;
    o.nesting = 5;
    g = tiny_gguf(&o);
    assert_int_equal(try_load(g.buf, g.n, err, sizeof(err)), TDM_ERR_FORMAT);
    assert_non_null(strstr(err, "key 'general.nested': arrays nested deeper"));
    free(g.buf);

    o = default_opts;
    o.model = "bert";
    g = tiny_gguf(&o);
    assert_int_equal(try_load(g.buf, g.n, err, sizeof(err)), TDM_ERR_UNSUPPORTED);
    assert_non_null(strstr(err, "tokenizer.ggml.model \"bert\" is not supported"));
    free(g.buf);

    o = default_opts;
    o.omit_tokens = 1;
    g = tiny_gguf(&o);
    assert_int_equal(try_load(g.buf, g.n, err, sizeof(err)), TDM_ERR_FORMAT);
    assert_non_null(strstr(err, "key 'tokenizer.ggml.tokens': required key is missing"));
    free(g.buf);

    o = default_opts;
    o.short_token_types = 1;
    g = tiny_gguf(&o);
    assert_int_equal(try_load(g.buf, g.n, err, sizeof(err)), TDM_ERR_FORMAT);
    assert_non_null(strstr(err, "260 types for 261 tokens"));
    free(g.buf);

    o = default_opts;
    o.bad_merge = 1;
    g = tiny_gguf(&o);
    assert_int_equal(try_load(g.buf, g.n, err, sizeof(err)), TDM_ERR_FORMAT);
    assert_non_null(strstr(err, "merge 2 has no \"left right\" separator"));
    free(g.buf);
}

static void test_gguf_file_errors(void **state)
{
    const char *tmp = getenv("TANDEM_TEST_TMP");
    char path[1024], err[256] = "";
    text_tokenizer_t *tok = NULL;
    gbuf_t g = tiny_gguf(&default_opts);
    FILE *f;

    (void)state;
    snprintf(path, sizeof(path), "%s/tokenizer-missing.gguf", tmp != NULL ? tmp : "/tmp");
    remove(path);
    assert_int_equal(text_tokenizer_load_gguf(path, &tok, err, sizeof(err)), TDM_ERR_NOT_FOUND);
    /* A directory opens but cannot be mapped. */
    assert_int_equal(text_tokenizer_load_gguf(tmp != NULL ? tmp : "/tmp", &tok, err, sizeof(err)),
                     TDM_ERR_IO);
    assert_null(tok);
    snprintf(path, sizeof(path), "%s/tokenizer-truncated.gguf", tmp != NULL ? tmp : "/tmp");
    f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(g.buf, 1, g.n / 2, f), g.n / 2);
    fclose(f);
    assert_int_equal(text_tokenizer_load_gguf(path, &tok, err, sizeof(err)), TDM_ERR_FORMAT);
    assert_non_null(strstr(err, "tokenizer-truncated.gguf: offset "));
    f = fopen(path, "wb");
    assert_non_null(f);
    fclose(f);
    assert_int_equal(text_tokenizer_load_gguf(path, &tok, err, sizeof(err)), TDM_ERR_FORMAT);
    f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(g.buf, 1, g.n, f), g.n);
    fclose(f);
    assert_int_equal(text_tokenizer_load_gguf(path, &tok, err, sizeof(err)), TDM_OK);
    text_tokenizer_destroy(tok);
    remove(path);
    free(g.buf);
}

/* ---- real vocabularies ----------------------------------------------------------------------- */

static uint8_t *read_vocab(const char *name, size_t *n_out)
{
    char path[1024];

    if (!tt_vocab_path(name, "", path, sizeof(path))) {
        return NULL;
    }
    return (uint8_t *)tt_read_file(path, n_out);
}

static void truncate_everywhere(const char *name)
{
    size_t n = 0, n_cuts = 0;
    uint8_t *data = read_vocab(name, &n);
    uint64_t rng = 1;
    char err[256];

    if (data == NULL) {
        skip();
    }
    for (size_t cut = 0; cut < n; cut = cut < 4096 ? cut + 1 : cut + 1 + tt_rand(&rng) % 9000) {
        assert_int_equal(try_load(data, cut, err, sizeof(err)), TDM_ERR_FORMAT);
        n_cuts++;
    }
    assert_int_equal(try_load(data, n - 1, err, sizeof(err)), TDM_ERR_FORMAT);
    assert_int_equal(try_load(data, n, err, sizeof(err)), TDM_OK);
    print_message("%s: %zu truncations, all TDM_ERR_FORMAT\n", name, n_cuts + 1);
    free(data);
}

static void flip_bits(const char *name)
{
    size_t n = 0, n_ok = 0, n_err = 0;
    uint8_t *data = read_vocab(name, &n);
    uint64_t rng = 2;
    char err[256];

    if (data == NULL) {
        skip();
    }
    tdm_log_set_level(TDM_LOG_ERROR);
    for (int i = 0; i < 160; i++) {
        /* Half the flips land in the header and metadata, half anywhere. */
        size_t pos = (size_t)(tt_rand(&rng) % (i % 2 == 0 ? 2048 : n));
        uint8_t mask = (uint8_t)(1u << (tt_rand(&rng) % 8));
        tdm_status_t status;
        data[pos] ^= mask;
        status = try_load(data, n, err, sizeof(err));
        data[pos] ^= mask;
        assert_true(status == TDM_OK || status == TDM_ERR_FORMAT || status == TDM_ERR_UNSUPPORTED);
        n_ok += status == TDM_OK;
        n_err += status != TDM_OK;
    }
    tdm_log_set_level(TDM_LOG_INFO);
    print_message("%s: 160 single-bit flips: %zu load, %zu rejected\n", name, n_ok, n_err);
    free(data);
}

static void test_real_bpe_vocab_truncated_anywhere_is_format_error(void **state)
{
    (void)state;
    truncate_everywhere("deepseek-coder");
}

static void test_real_spm_vocab_truncated_anywhere_is_format_error(void **state)
{
    (void)state;
    truncate_everywhere("llama-spm");
}

static void test_real_bpe_vocab_random_flips_never_crash(void **state)
{
    (void)state;
    flip_bits("deepseek-coder");
}

static void test_real_spm_vocab_random_flips_never_crash(void **state)
{
    (void)state;
    flip_bits("llama-spm");
}

/* SentencePiece vocabularies: loaded as such, and encode -> decode is the identity (text
 * without U+2581, which SentencePiece itself turns into a space). */
static void check_spm_round_trip(const char *name)
{
    static const char *const texts[] = {
        "Hello world",
        " leading space and  double  spaces ",
        "tabs\tand\nnewlines\r\n",
        "Führer naïve 日本語 한국어 кириллица",
        "emoji 🚀😶‍🌫️ and rare 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \xf0\x9f\xa6\x99",
        "    if (x) {\n        return;\n    }",
    };
    size_t n = 0;
    uint8_t *data = read_vocab(name, &n);
    text_tokenizer_t *tok = NULL;
    text_tokenizer_info_t info;
    char err[256] = "";

    if (data == NULL) {
        skip();
    }
    assert_int_equal(text_tokenizer_load_gguf_buffer(data, n, name, &tok, err, sizeof(err)),
                     TDM_OK);
    text_tokenizer_get_info(tok, &info);
    assert_int_equal(info.sentencepiece, 1);
    assert_int_equal(info.bos_id, 1);
    for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
        int32_t *ids = NULL;
        size_t n_ids = 0, n_text = 0;
        char *text = NULL;
        assert_int_equal(text_tokenizer_encode(tok, texts[i], strlen(texts[i]),
                                               TEXT_TOKENIZE_ADD_BOS, &ids, &n_ids),
                         TDM_OK);
        assert_int_equal(ids[0], 1);
        assert_int_equal(
            text_detok_decode(tok, ids, n_ids, TEXT_DETOK_SKIP_CONTROL, &text, &n_text), TDM_OK);
        assert_string_equal(text, texts[i]);
        free(text);
        text_tokens_free(ids);
    }
    print_message("vocab %s: SentencePiece round trips\n", name);
    text_tokenizer_destroy(tok);
    free(data);
}

static void test_llama_spm_vocab_round_trips(void **state)
{
    (void)state;
    check_spm_round_trip("llama-spm");
}

static void test_phi3_vocab_round_trips(void **state)
{
    (void)state;
    check_spm_round_trip("phi-3");
}

static void test_gpt_neox_vocab_without_pre_loads_with_default(void **state)
{
    size_t n = 0, n_ids = 0;
    uint8_t *data = read_vocab("gpt-neox", &n);
    text_tokenizer_t *tok = NULL;
    text_tokenizer_info_t info;
    int32_t *ids = NULL;
    char *text = NULL, err[256] = "";

    (void)state;
    if (data == NULL) {
        skip();
    }
    assert_int_equal(text_tokenizer_load_gguf_buffer(data, n, "gpt-neox", &tok, err, sizeof(err)),
                     TDM_OK);
    text_tokenizer_get_info(tok, &info);
    assert_string_equal(info.pre_name, "default");
    assert_int_equal(info.n_vocab, 50432);
    assert_int_equal(text_tokenizer_encode(tok, "Hello world  x", 14, 0, &ids, &n_ids), TDM_OK);
    assert_int_equal(text_detok_decode(tok, ids, n_ids, 0, &text, &n), TDM_OK);
    assert_string_equal(text, "Hello world  x");
    print_message("vocab gpt-neox: loads (no upstream .out vectors to check)\n");
    free(text);
    text_tokens_free(ids);
    text_tokenizer_destroy(tok);
    free(data);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_gguf_loads_and_encodes),
        cmocka_unit_test(test_tiny_gguf_truncated_at_every_offset_is_format_error),
        cmocka_unit_test(test_tiny_gguf_every_byte_flipped_never_crashes),
        cmocka_unit_test(test_header_errors_name_the_problem),
        cmocka_unit_test(test_metadata_errors_name_the_key),
        cmocka_unit_test(test_gguf_file_errors),
        cmocka_unit_test(test_real_bpe_vocab_truncated_anywhere_is_format_error),
        cmocka_unit_test(test_real_spm_vocab_truncated_anywhere_is_format_error),
        cmocka_unit_test(test_real_bpe_vocab_random_flips_never_crash),
        cmocka_unit_test(test_real_spm_vocab_random_flips_never_crash),
        cmocka_unit_test(test_llama_spm_vocab_round_trips),
        cmocka_unit_test(test_phi3_vocab_round_trips),
        cmocka_unit_test(test_gpt_neox_vocab_without_pre_loads_with_default),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
