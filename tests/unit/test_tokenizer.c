/* test_tokenizer.c - text/tokenizer.h: llama.cpp test vectors for every BPE vocabulary in
 * shared/data (through the GGUF loader, and through tokenizer.json files converted here from
 * the GGUFs by an independent reader), malformed tokenizer.json errors, split behaviours,
 * added-token options, ignore_merges, argument checks.
 * GGUF corruption: test_tokenizer_gguf.c; detokenizer: test_tokenizer_detok.c; chat encoding
 * and the synthetic writer: test_tokenizer_chat.c. */
#include <jansson.h>
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

#define CASE_SEPARATOR "\n__ggml_vocab_test__\n"
#define MAX_CASES      64
#define MAX_CASE_IDS   1024

/* ---- llama.cpp vectors ----------------------------------------------------------------------- */

/* One test string and its expected ids. */
typedef struct {
    const char *text;
    size_t n_text;
    int32_t ids[MAX_CASE_IDS];
    size_t n_ids;
} vector_case_t;

/* Parse NAME.gguf.inp / .out as llama.cpp's tests/test-tokenizer-0.cpp does: strings separated
 * by "\n__ggml_vocab_test__\n", one line of space-separated ids per string. */
static size_t load_cases(const char *name, char **inp_out, vector_case_t *cases)
{
    char path[1024];
    size_t n_inp = 0, n_out = 0, n_cases = 0, n_lines = 0;
    char *inp, *out, *pos, *line;

    assert_true(tt_vocab_path(name, ".inp", path, sizeof(path)));
    inp = tt_read_file(path, &n_inp);
    assert_true(tt_vocab_path(name, ".out", path, sizeof(path)));
    out = tt_read_file(path, &n_out);
    assert_non_null(inp);
    assert_non_null(out);
    pos = inp;
    while (pos < inp + n_inp) {
        char *next = strstr(pos, CASE_SEPARATOR);
        assert_true(n_cases < MAX_CASES);
        cases[n_cases].text = pos;
        if (next == NULL) {
            cases[n_cases++].n_text = (size_t)(inp + n_inp - pos);
            break;
        }
        cases[n_cases++].n_text = (size_t)(next - pos);
        pos = next + strlen(CASE_SEPARATOR);
    }
    line = out;
    while (line < out + n_out) {
        char *eol = memchr(line, '\n', (size_t)(out + n_out - line));
        char *p = line, *end;
        if (eol == NULL) {
            eol = out + n_out;
        }
        *eol = '\0';
        assert_true(n_lines < n_cases);
        cases[n_lines].n_ids = 0;
        for (;;) {
            long v = strtol(p, &end, 10);
            if (end == p) {
                break;
            }
            assert_true(cases[n_lines].n_ids < MAX_CASE_IDS);
            cases[n_lines].ids[cases[n_lines].n_ids++] = (int32_t)v;
            p = end;
        }
        n_lines++;
        line = eol + 1;
    }
    assert_int_equal(n_lines, n_cases);
    free(out);
    *inp_out = inp;
    return n_cases;
}

static void print_ids(const char *label, const int32_t *ids, size_t n)
{
    print_message("    %s:", label);
    for (size_t i = 0; i < n; i++) {
        print_message(" %d", ids[i]);
    }
    print_message("\n");
}

/* Encode every case of vocabulary `name` with `tok`; print the pass count; all must pass. */
static void check_vectors(const char *name, const char *loader, const text_tokenizer_t *tok)
{
    static vector_case_t cases[MAX_CASES];
    char *inp = NULL;
    size_t n_cases = load_cases(name, &inp, cases), n_pass = 0;

    for (size_t i = 0; i < n_cases; i++) {
        int32_t *ids = NULL;
        size_t n_ids = 0;
        assert_int_equal(
            text_tokenizer_encode(tok, cases[i].text, cases[i].n_text, 0, &ids, &n_ids), TDM_OK);
        if (n_ids == cases[i].n_ids &&
            (n_ids == 0 || memcmp(ids, cases[i].ids, n_ids * sizeof(*ids)) == 0)) {
            n_pass++;
        } else {
            print_message("  %s case %zu failed: \"%.*s\"\n", name, i,
                          cases[i].n_text > 80 ? 80 : (int)cases[i].n_text, cases[i].text);
            print_ids("expected", cases[i].ids, cases[i].n_ids);
            print_ids("got     ", ids, n_ids);
        }
        text_tokens_free(ids);
    }
    print_message("vocab %s (%s): %zu/%zu llama.cpp vectors pass\n", name, loader, n_pass, n_cases);
    free(inp);
    assert_int_equal(n_pass, n_cases);
}

static void run_gguf_vectors(const char *name)
{
    char path[1024], err[512] = "";
    text_tokenizer_t *tok = NULL;

    if (!tt_vocab_path(name, "", path, sizeof(path))) {
        skip();
    }
    assert_int_equal(text_tokenizer_load_gguf(path, &tok, err, sizeof(err)), TDM_OK);
    check_vectors(name, "gguf", tok);
    text_tokenizer_destroy(tok);
}

static void test_vectors_deepseek_llm_all_pass(void **state)
{
    (void)state;
    run_gguf_vectors("deepseek-llm");
}

static void test_vectors_deepseek_coder_all_pass(void **state)
{
    (void)state;
    run_gguf_vectors("deepseek-coder");
}

static void test_vectors_gpt2_all_pass(void **state)
{
    (void)state;
    run_gguf_vectors("gpt-2");
}

static void test_vectors_starcoder_all_pass(void **state)
{
    (void)state;
    run_gguf_vectors("starcoder");
}

static void test_vectors_falcon_all_pass(void **state)
{
    (void)state;
    run_gguf_vectors("falcon");
}

static void test_vectors_refact_all_pass(void **state)
{
    (void)state;
    run_gguf_vectors("refact");
}

static void test_vectors_llama_spm_all_pass(void **state)
{
    (void)state;
    run_gguf_vectors("llama-spm");
}

static void test_vectors_phi3_all_pass(void **state)
{
    (void)state;
    run_gguf_vectors("phi-3");
}

/* ---- GGUF -> tokenizer.json, written with an independent reader ----------------------------- */

/* Minimal GGUF walk for the test files: returns the string/int arrays it is asked for. */
typedef struct {
    const uint8_t *p, *end;
} walk_t;

static uint64_t walk_uint(walk_t *w, size_t n)
{
    uint64_t v = 0;

    assert_true((size_t)(w->end - w->p) >= n);
    for (size_t i = 0; i < n; i++) {
        v |= (uint64_t)w->p[i] << (8 * i);
    }
    w->p += n;
    return v;
}

static void walk_skip(walk_t *w, uint32_t type)
{
    static const uint8_t sizes[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

    assert_true(type < 13);
    if (type == 8) {
        w->p += walk_uint(w, 8);
    } else if (type == 9) {
        uint32_t elem = (uint32_t)walk_uint(w, 4);
        uint64_t n = walk_uint(w, 8);
        for (uint64_t i = 0; i < n; i++) {
            walk_skip(w, elem);
        }
    } else {
        w->p += sizes[type];
    }
    assert_true(w->p <= w->end);
}

/* Find array key `key` in the GGUF; position the walker at its first element. */
static uint64_t find_array(const uint8_t *data, size_t n, const char *key, walk_t *w_out)
{
    walk_t w = {data + 16, data + n};
    uint64_t n_kv = walk_uint(&w, 8);

    for (uint64_t i = 0; i < n_kv; i++) {
        uint64_t n_key = walk_uint(&w, 8);
        const uint8_t *k = w.p;
        uint32_t type;
        w.p += n_key;
        type = (uint32_t)walk_uint(&w, 4);
        if (type == 9 && n_key == strlen(key) && memcmp(k, key, n_key) == 0) {
            uint64_t count;
            (void)walk_uint(&w, 4);
            count = walk_uint(&w, 8);
            *w_out = w;
            return count;
        }
        walk_skip(&w, type);
    }
    fail_msg("key %s not found", key);
    return 0;
}

/* tokenizer.json for vocabulary `name`: control/user-defined tokens only in added_tokens. */
static char *gguf_to_json(const char *name, json_t *pre_tokenizer, int merges_as_pairs,
                          size_t *n_out)
{
    char path[1024];
    size_t n = 0;
    uint8_t *data;
    walk_t tokens, types, merges;
    uint64_t n_tokens, n_merges;
    json_t *root = json_object(), *model = json_object(), *vocab = json_object();
    json_t *merge_list = json_array(), *added = json_array();
    char *text;

    assert_true(tt_vocab_path(name, "", path, sizeof(path)));
    data = (uint8_t *)tt_read_file(path, &n);
    assert_non_null(data);
    n_tokens = find_array(data, n, "tokenizer.ggml.tokens", &tokens);
    assert_int_equal(find_array(data, n, "tokenizer.ggml.token_type", &types), n_tokens);
    n_merges = find_array(data, n, "tokenizer.ggml.merges", &merges);
    for (uint64_t i = 0; i < n_tokens; i++) {
        uint64_t len = walk_uint(&tokens, 8);
        int32_t type = (int32_t)walk_uint(&types, 4);
        json_t *str = json_stringn((const char *)tokens.p, len);
        assert_non_null(str);
        if (type == 3 || type == 4) {
            json_t *entry = json_object();
            json_object_set_new(entry, "id", json_integer((json_int_t)i));
            json_object_set_new(entry, "content", str);
            json_object_set_new(entry, "single_word", json_false());
            json_object_set_new(entry, "lstrip", json_false());
            json_object_set_new(entry, "rstrip", json_false());
            json_object_set_new(entry, "normalized", json_boolean(type == 4));
            json_object_set_new(entry, "special", json_boolean(type == 3));
            json_array_append_new(added, entry);
        } else {
            json_object_setn_new(vocab, (const char *)tokens.p, len, json_integer((json_int_t)i));
            json_decref(str);
        }
        tokens.p += len;
    }
    for (uint64_t i = 0; i < n_merges; i++) {
        uint64_t len = walk_uint(&merges, 8);
        const char *m = (const char *)merges.p;
        const char *space = memchr(m, ' ', len);
        assert_non_null(space);
        if (merges_as_pairs) {
            json_t *pair = json_array();
            json_array_append_new(pair, json_stringn(m, (size_t)(space - m)));
            json_array_append_new(pair, json_stringn(space + 1, len - (size_t)(space - m) - 1));
            json_array_append_new(merge_list, pair);
        } else {
            json_array_append_new(merge_list, json_stringn(m, len));
        }
        merges.p += len;
    }
    json_object_set_new(model, "type", json_string("BPE"));
    json_object_set_new(model, "dropout", json_null());
    json_object_set_new(model, "byte_fallback", json_false());
    json_object_set_new(model, "vocab", vocab);
    json_object_set_new(model, "merges", merge_list);
    json_object_set_new(root, "version", json_string("1.0"));
    json_object_set_new(root, "added_tokens", added);
    json_object_set_new(root, "normalizer", json_null());
    json_object_set_new(root, "pre_tokenizer", pre_tokenizer);
    json_object_set_new(root, "model", model);
    text = json_dumps(root, JSON_COMPACT);
    assert_non_null(text);
    json_decref(root);
    free(data);
    *n_out = strlen(text);
    return text;
}

static json_t *split_step(const char *regex)
{
    return json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", "Regex", regex,
                     "behavior", "Isolated", "invert", 0);
}

static void test_hf_json_of_gpt2_reproduces_vectors(void **state)
{
    char path[1024];
    json_t *pre;
    char *json;
    size_t n = 0;
    text_tokenizer_t *tok = NULL;
    char err[512] = "";

    (void)state;
    if (!tt_vocab_path("gpt-2", "", path, sizeof(path))) {
        skip();
    }
    /* GPT-2's own tokenizer.json: ByteLevel with its regex, merges as "a b" strings. */
    pre = json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0,
                    "trim_offsets", 1, "use_regex", 1);
    json = gguf_to_json("gpt-2", pre, 0, &n);
    assert_int_equal(text_tokenizer_load_hf_buffer(json, n, "gpt-2.json", &tok, err, sizeof(err)),
                     TDM_OK);
    check_vectors("gpt-2", "tokenizer.json", tok);
    text_tokenizer_destroy(tok);
    free(json);
}

static void test_hf_json_of_deepseek_coder_reproduces_vectors(void **state)
{
    const char *tmp = getenv("TANDEM_TEST_TMP");
    char path[1024], file[1024];
    json_t *pre;
    char *json;
    size_t n = 0;
    text_tokenizer_t *tok = NULL;
    char err[512] = "";
    FILE *f;

    (void)state;
    if (!tt_vocab_path("deepseek-coder", "", path, sizeof(path))) {
        skip();
    }
    /* DeepSeek Coder's Sequence of Splits then ByteLevel without regex; merges as pairs; the
     * file goes through the path loader. */
    pre = json_pack("{s:s, s:[o, o, o, o, o, {s:s, s:b, s:b, s:b}]}", "type", "Sequence",
                    "pretokenizers", split_step("[\r\n]"), split_step("\\s?\\p{L}+"),
                    split_step("\\s?\\p{P}+"),
                    split_step("[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"), split_step("\\p{N}"),
                    "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 0);
    assert_non_null(pre);
    json = gguf_to_json("deepseek-coder", pre, 1, &n);
    snprintf(file, sizeof(file), "%s/deepseek-coder-tokenizer.json", tmp != NULL ? tmp : "/tmp");
    f = fopen(file, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(json, 1, n, f), n);
    fclose(f);
    assert_int_equal(text_tokenizer_load_hf(file, &tok, err, sizeof(err)), TDM_OK);
    check_vectors("deepseek-coder", "tokenizer.json", tok);
    text_tokenizer_destroy(tok);
    remove(file);
    free(json);
}

/* ---- tokenizer.json errors ------------------------------------------------------------------- */

/* A tokenizer.json text with the 256 byte tokens (ids 0..255) and `extra` appended into vocab
 * (ids from 256), plus the given merges / pre_tokenizer / other top-level members. */
static char *byte_vocab_json(const char *extra_tokens[], size_t n_extra, const char *merges,
                             const char *pre_tokenizer, const char *more_model,
                             const char *more_root)
{
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap);

    assert_non_null(buf);
    n += (size_t)snprintf(buf + n, cap - n, "{%s\"model\": {\"type\": \"BPE\"%s, \"vocab\": {",
                          more_root, more_model);
    for (int b = 0; b < 256; b++) {
        char text[2];
        size_t len = tt_byte_text(b, text);
        if (text[0] == '"' || text[0] == '\\') {
            n += (size_t)snprintf(buf + n, cap - n, "%s\"\\%c\": %d", b ? ", " : "", text[0], b);
        } else {
            n += (size_t)snprintf(buf + n, cap - n, "%s\"%.*s\": %d", b ? ", " : "", (int)len, text,
                                  b);
        }
    }
    for (size_t i = 0; i < n_extra; i++) {
        n += (size_t)snprintf(buf + n, cap - n, ", \"%s\": %zu", extra_tokens[i], 256 + i);
    }
    n += (size_t)snprintf(buf + n, cap - n, "}, \"merges\": %s}, \"pre_tokenizer\": %s}", merges,
                          pre_tokenizer);
    assert_true(n < cap);
    return buf;
}

#define BYTE_LEVEL "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}"

/* Load `json`; expect `status`, `needle` in the error, and *tok_out untouched. */
static void expect_hf(const char *json, tdm_status_t status, const char *needle)
{
    text_tokenizer_t *sentinel = (text_tokenizer_t *)&sentinel, *tok = sentinel;
    char err[512] = "";

    assert_int_equal(
        text_tokenizer_load_hf_buffer(json, strlen(json), "t.json", &tok, err, sizeof(err)),
        status);
    if (status == TDM_OK) {
        text_tokenizer_destroy(tok);
        return;
    }
    assert_ptr_equal(tok, sentinel);
    if (strstr(err, needle) == NULL) {
        print_message("error \"%s\" lacks \"%s\"\n", err, needle);
    }
    assert_non_null(strstr(err, needle));
}

static void expect_hf_built(const char *extra[], size_t n_extra, const char *merges,
                            const char *pre, const char *more_model, const char *more_root,
                            tdm_status_t status, const char *needle)
{
    char *json = byte_vocab_json(extra, n_extra, merges, pre, more_model, more_root);

    expect_hf(json, status, needle);
    free(json);
}

static void test_hf_malformed_inputs_give_specific_errors(void **state)
{
    static const char *ab[] = {"ab"};

    (void)state;
    expect_hf("{\"model\": ", TDM_ERR_FORMAT, "t.json:1:");
    expect_hf("[1, 2]", TDM_ERR_FORMAT, "model: missing or not an object");
    expect_hf("{\"version\": \"1.0\"}", TDM_ERR_FORMAT, "model: missing or not an object");
    expect_hf("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", TDM_ERR_UNSUPPORTED,
              "model.type: \"WordPiece\" is not supported");
    expect_hf("{\"model\": {\"type\": \"Unigram\"}}", TDM_ERR_UNSUPPORTED, "\"Unigram\"");
    expect_hf("{\"model\": {\"type\": 3}}", TDM_ERR_FORMAT, "model.type: not a string");
    expect_hf("{\"model\": {\"type\": \"BPE\", \"merges\": []}}", TDM_ERR_FORMAT,
              "model.vocab: missing");
    expect_hf("{\"model\": {\"type\": \"BPE\", \"vocab\": {}}}", TDM_ERR_FORMAT,
              "model.merges: missing");
    expect_hf("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}, \"merges\": []}}",
              TDM_ERR_FORMAT, "token \"a\" has no valid id");
    expect_hf("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 2}, \"merges\": []},"
              " \"pre_tokenizer\": " BYTE_LEVEL "}",
              TDM_ERR_FORMAT, "id 1 of 0..2 is missing");
    /* merges */
    expect_hf_built(ab, 1, "[\"a b c\"]", BYTE_LEVEL, "", "", TDM_ERR_FORMAT,
                    "model.merges[0]: not \"left right\"");
    expect_hf_built(ab, 1, "[\"a b\", 7]", BYTE_LEVEL, "", "", TDM_ERR_FORMAT,
                    "model.merges[1]: neither");
    expect_hf_built(ab, 1, "[[\"a\"]]", BYTE_LEVEL, "", "", TDM_ERR_FORMAT,
                    "model.merges[0]: neither");
    expect_hf_built(ab, 1, "[\"a b\", \"b c\"]", BYTE_LEVEL, "", "", TDM_ERR_FORMAT,
                    "model.merges[1]: \"b\" + \"c\": a part or the result is not in the "
                    "vocabulary");
    expect_hf_built(ab, 1, "{}", BYTE_LEVEL, "", "", TDM_ERR_FORMAT, "model.merges: missing");
    /* regexes and pre-tokenizers */
    expect_hf_built(ab, 1, "[]",
                    "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
                    "\"pattern\": {\"Regex\": \"(ab\"}, \"behavior\": \"Isolated\"}, " BYTE_LEVEL
                    "]}",
                    "", "", TDM_ERR_FORMAT, "Split.pattern: bad regex at offset 3");
    expect_hf_built(ab, 1, "[]",
                    "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": "
                    "\"Sideways\"}",
                    "", "", TDM_ERR_FORMAT, "Split.behavior: not one of");
    expect_hf_built(ab, 1, "[]",
                    "{\"type\": \"Split\", \"pattern\": \"a\", \"behavior\": "
                    "\"Isolated\"}",
                    "", "", TDM_ERR_FORMAT, "Split.pattern: needs");
    expect_hf_built(ab, 1, "[]",
                    "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": "
                    "\"Isolated\"}",
                    "", "", TDM_ERR_UNSUPPORTED, "no ByteLevel step");
    expect_hf_built(ab, 1, "[]", "{\"type\": \"Whitespace\"}", "", "", TDM_ERR_UNSUPPORTED,
                    "pre_tokenizer: type \"Whitespace\" is not supported");
    expect_hf_built(ab, 1, "[]", "null", "", "", TDM_ERR_UNSUPPORTED, "pre_tokenizer: missing");
    /* normalizers and model options */
    expect_hf_built(ab, 1, "[]", BYTE_LEVEL, "", "\"normalizer\": {\"type\": \"Lowercase\"}, ",
                    TDM_ERR_UNSUPPORTED, "normalizer: type \"Lowercase\" is not supported");
    expect_hf_built(ab, 1, "[]", BYTE_LEVEL, "",
                    "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": "
                    "\"NFC\"}]}, ",
                    TDM_OK, "");
    expect_hf_built(ab, 1, "[]", BYTE_LEVEL, ", \"byte_fallback\": true", "", TDM_ERR_UNSUPPORTED,
                    "model.byte_fallback");
    expect_hf_built(ab, 1, "[]", BYTE_LEVEL, ", \"continuing_subword_prefix\": \"##\"", "",
                    TDM_ERR_UNSUPPORTED, "subword");
    expect_hf_built(ab, 1, "[]", BYTE_LEVEL, ", \"dropout\": 0.1", "", TDM_ERR_UNSUPPORTED,
                    "dropout");
    /* added tokens */
    expect_hf_built(ab, 1, "[]", BYTE_LEVEL, "",
                    "\"added_tokens\": [{\"id\": 256, \"content\": \"zz\", \"special\": true}], ",
                    TDM_ERR_FORMAT, "added_tokens[0]: token id 256 given two different texts");
    expect_hf_built(ab, 1, "[]", BYTE_LEVEL, "",
                    "\"added_tokens\": [{\"id\": 300, \"content\": \"a\", \"special\": true}], ",
                    TDM_ERR_FORMAT, "id 257 of 0..300 is missing");
    expect_hf_built(ab, 1, "[]", BYTE_LEVEL, "",
                    "\"added_tokens\": [{\"id\": 257, \"content\": \"ab\", \"special\": true}], ",
                    TDM_ERR_FORMAT, "duplicate token text at ids 256 and 257");
    expect_hf_built(ab, 1, "[]", BYTE_LEVEL, "", "\"added_tokens\": [{\"content\": \"x\"}], ",
                    TDM_ERR_FORMAT, "added_tokens: entry 0 has no valid \"id\"");
}

static void test_hf_file_errors(void **state)
{
    const char *tmp = getenv("TANDEM_TEST_TMP");
    text_tokenizer_t *tok = NULL;
    char err[512] = "";

    (void)state;
    /* A directory opens but cannot be read as JSON. */
    assert_int_equal(text_tokenizer_load_hf(tmp != NULL ? tmp : "/tmp", &tok, err, sizeof(err)),
                     TDM_ERR_IO);
    assert_null(tok);
    assert_int_equal(text_tokenizer_load_hf("/nonexistent/tokenizer.json", &tok, err, sizeof(err)),
                     TDM_ERR_NOT_FOUND);
    assert_null(tok);
    assert_int_equal(text_tokenizer_load_hf(NULL, &tok, err, sizeof(err)), TDM_ERR_INVALID_ARG);
    assert_int_equal(text_tokenizer_load_hf_buffer(NULL, 3, "x", &tok, err, sizeof(err)),
                     TDM_ERR_INVALID_ARG);
}

/* ---- pre-tokenizer and added-token behaviour ------------------------------------------------- */

static text_tokenizer_t *load_json(char *json)
{
    text_tokenizer_t *tok = NULL;
    char err[512] = "";

    if (text_tokenizer_load_hf_buffer(json, strlen(json), "t.json", &tok, err, sizeof(err)) !=
        TDM_OK) {
        print_message("load failed: %s\n", err);
    }
    free(json);
    assert_non_null(tok);
    return tok;
}

/* Expect encode(text) to give exactly the tokens whose stored texts are listed. */
static void expect_tokens(const text_tokenizer_t *tok, const char *text, uint32_t flags,
                          const char *const expected[], size_t n_expected)
{
    int32_t *ids = NULL;
    size_t n_ids = 0;

    assert_int_equal(text_tokenizer_encode(tok, text, strlen(text), flags, &ids, &n_ids), TDM_OK);
    if (n_ids != n_expected) {
        print_message("\"%s\": %zu ids, expected %zu\n", text, n_ids, n_expected);
    }
    assert_int_equal(n_ids, n_expected);
    for (size_t i = 0; i < n_ids; i++) {
        const uint8_t *bytes;
        size_t n;
        assert_int_equal(text_tokenizer_token_bytes(tok, ids[i], &bytes, &n), TDM_OK);
        if (n != strlen(expected[i]) || memcmp(bytes, expected[i], n) != 0) {
            print_message("\"%s\" token %zu is \"%.*s\", expected \"%s\"\n", text, i, (int)n,
                          (const char *)bytes, expected[i]);
        }
        assert_int_equal(n, strlen(expected[i]));
        assert_memory_equal(bytes, expected[i], n);
    }
    text_tokens_free(ids);
}

static text_tokenizer_t *split_tokenizer(const char *behavior, int invert)
{
    static const char *extra[] = {"a-", "-b", "--"};
    char pre[512];

    snprintf(pre, sizeof(pre),
             "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
             "{\"String\": \"-\"}, \"behavior\": \"%s\", \"invert\": %s}, {\"type\": "
             "\"ByteLevel\", \"use_regex\": false}]}",
             behavior, invert ? "true" : "false");
    return load_json(byte_vocab_json(extra, 3, "[\"a -\", \"- b\", \"- -\"]", pre, "", ""));
}

static void test_split_behaviors_follow_hugging_face(void **state)
{
    static const char *const isolated[] = {"a", "-", "b"}, *const removed[] = {"a", "b"},
                             *const with_prev[] = {"a-", "b"}, *const with_next[] = {"a", "-b"},
                             *const contiguous[] = {"a", "--", "b"},
                             *const apart[] = {"a", "-", "-", "b"}, *const only_dashes[] = {"-"};
    text_tokenizer_t *tok;

    (void)state;
    tok = split_tokenizer("Isolated", 0);
    expect_tokens(tok, "a-b", 0, isolated, 3);
    expect_tokens(tok, "a--b", 0, apart, 4);
    text_tokenizer_destroy(tok);
    tok = split_tokenizer("Removed", 0);
    expect_tokens(tok, "a-b", 0, removed, 2);
    text_tokenizer_destroy(tok);
    tok = split_tokenizer("MergedWithPrevious", 0);
    expect_tokens(tok, "a-b", 0, with_prev, 2);
    text_tokenizer_destroy(tok);
    tok = split_tokenizer("MergedWithNext", 0);
    expect_tokens(tok, "a-b", 0, with_next, 2);
    text_tokenizer_destroy(tok);
    tok = split_tokenizer("Contiguous", 0);
    expect_tokens(tok, "a--b", 0, contiguous, 3);
    text_tokenizer_destroy(tok);
    /* invert: the pattern marks the pieces to keep; Removed then drops "a" and "b". */
    tok = split_tokenizer("Removed", 1);
    expect_tokens(tok, "a-b", 0, only_dashes, 1);
    text_tokenizer_destroy(tok);
}

static void test_byte_level_prefix_space_and_ignore_merges(void **state)
{
    static const char *extra[] = {"\u0120a", "ab", "abc"};
    static const char *const prefixed[] = {" a"}, *const plain[] = {"a"},
                             *const merged[] = {"ab", "c"}, *const whole[] = {"abc"};
    text_tokenizer_t *tok;

    (void)state;
    tok =
        load_json(byte_vocab_json(extra, 3, "[\"\u0120 a\", \"a b\"]",
                                  "{\"type\": \"ByteLevel\", \"add_prefix_space\": true}", "", ""));
    expect_tokens(tok, "a", 0, prefixed, 1);
    expect_tokens(tok, " a", 0, prefixed, 1);
    text_tokenizer_destroy(tok);
    tok = load_json(byte_vocab_json(extra, 3, "[\"\u0120 a\", \"a b\"]", BYTE_LEVEL, "", ""));
    expect_tokens(tok, "a", 0, plain, 1);
    expect_tokens(tok, "abc", 0, merged, 2);
    text_tokenizer_destroy(tok);
    tok = load_json(byte_vocab_json(extra, 3, "[\"\u0120 a\", \"a b\"]", BYTE_LEVEL,
                                    ", \"ignore_merges\": true", ""));
    expect_tokens(tok, "abc", 0, whole, 1);
    text_tokenizer_destroy(tok);
}

static void test_added_tokens_lstrip_rstrip_and_special_flag(void **state)
{
    static const char *const stripped[] = {"x", "<mask>", "y"},
                             *const kept[] = {"x", " ", "<mask>", " ", "y"},
                             *const literal[] = {"x", " ", "<", "m", "a", "s", "k", ">", " ", "y"};
    text_tokenizer_t *tok;

    (void)state;
    tok = load_json(byte_vocab_json(NULL, 0, "[]", BYTE_LEVEL, "",
                                    "\"added_tokens\": [{\"id\": 256, \"content\": \"<mask>\", "
                                    "\"lstrip\": true, \"rstrip\": true, \"special\": true}], "));
    expect_tokens(tok, "x <mask> y", TEXT_TOKENIZE_PARSE_SPECIAL, stripped, 3);
    expect_tokens(tok, "x <mask> y", 0, literal, 10);
    text_tokenizer_destroy(tok);
    tok = load_json(byte_vocab_json(NULL, 0, "[]", BYTE_LEVEL, "",
                                    "\"added_tokens\": [{\"id\": 256, \"content\": \"<mask>\", "
                                    "\"special\": false}], "));
    expect_tokens(tok, "x <mask> y", 0, kept, 5);
    text_tokenizer_destroy(tok);
}

static void test_regex_match_failure_is_internal_error_not_a_hang(void **state)
{
    static const char text[] = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!";
    text_tokenizer_t *tok;
    int32_t *ids = (int32_t *)&tok;
    size_t n_ids = 42;

    (void)state;
    /* Nested quantifiers backtrack exponentially; PCRE2's match limit must stop them. */
    tok = load_json(byte_vocab_json(NULL, 0, "[]",
                                    "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": "
                                    "\"Split\", \"pattern\": {\"Regex\": \"(a+)+$\"}, "
                                    "\"behavior\": \"Isolated\"}, " BYTE_LEVEL "]}",
                                    "", ""));
    assert_int_equal(text_tokenizer_encode(tok, text, sizeof(text) - 1, 0, &ids, &n_ids),
                     TDM_ERR_INTERNAL);
    assert_ptr_equal(ids, (int32_t *)&tok);
    assert_int_equal(n_ids, 42);
    text_tokenizer_destroy(tok);
}

static void test_encode_rejects_bad_arguments_and_keeps_outputs(void **state)
{
    static const char *extra[] = {"ab"};
    text_tokenizer_t *tok = load_json(byte_vocab_json(extra, 1, "[\"a b\"]", BYTE_LEVEL, "", ""));
    int32_t *ids = (int32_t *)&tok, sentinel_check;
    size_t n_ids = 42;
    const uint8_t *bytes = NULL;
    size_t n = 0;
    text_token_kind_t kind;

    (void)state;
    assert_int_equal(text_tokenizer_encode(tok, NULL, 3, 0, &ids, &n_ids), TDM_ERR_INVALID_ARG);
    assert_int_equal(text_tokenizer_encode(tok, "ab", 2, 1u << 7, &ids, &n_ids),
                     TDM_ERR_INVALID_ARG);
    assert_int_equal(text_tokenizer_encode(tok, "ab", 2, TEXT_TOKENIZE_ADD_BOS, &ids, &n_ids),
                     TDM_ERR_NOT_FOUND);
    assert_ptr_equal(ids, (int32_t *)&tok);
    assert_int_equal(n_ids, 42);
    assert_int_equal(text_tokenizer_encode(tok, NULL, 0, 0, &ids, &n_ids), TDM_OK);
    assert_int_equal(n_ids, 0);
    text_tokens_free(ids);
    assert_int_equal(text_tokenizer_token_bytes(tok, 257, &bytes, &n), TDM_ERR_INVALID_ARG);
    assert_int_equal(text_tokenizer_token_bytes(tok, -1, &bytes, &n), TDM_ERR_INVALID_ARG);
    assert_null(bytes);
    assert_int_equal(text_tokenizer_token_kind(tok, 257, &kind), TDM_ERR_INVALID_ARG);
    assert_int_equal(text_tokenizer_find_special(tok, "ab", &sentinel_check),
                     TDM_ERR_NOT_FOUND); /* a normal token is not an added one */
    assert_int_equal(text_tokenizer_find_special(tok, NULL, &sentinel_check), TDM_ERR_INVALID_ARG);
    assert_int_equal(text_tokenizer_n_vocab(tok), 257);
    text_tokenizer_destroy(tok);
    text_tokenizer_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vectors_deepseek_llm_all_pass),
        cmocka_unit_test(test_vectors_deepseek_coder_all_pass),
        cmocka_unit_test(test_vectors_gpt2_all_pass),
        cmocka_unit_test(test_vectors_starcoder_all_pass),
        cmocka_unit_test(test_vectors_falcon_all_pass),
        cmocka_unit_test(test_vectors_refact_all_pass),
        cmocka_unit_test(test_vectors_llama_spm_all_pass),
        cmocka_unit_test(test_vectors_phi3_all_pass),
        cmocka_unit_test(test_hf_json_of_gpt2_reproduces_vectors),
        cmocka_unit_test(test_hf_json_of_deepseek_coder_reproduces_vectors),
        cmocka_unit_test(test_hf_malformed_inputs_give_specific_errors),
        cmocka_unit_test(test_hf_file_errors),
        cmocka_unit_test(test_split_behaviors_follow_hugging_face),
        cmocka_unit_test(test_byte_level_prefix_space_and_ignore_merges),
        cmocka_unit_test(test_added_tokens_lstrip_rstrip_and_special_flag),
        cmocka_unit_test(test_regex_match_failure_is_internal_error_not_a_hang),
        cmocka_unit_test(test_encode_rejects_bad_arguments_and_keeps_outputs),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
