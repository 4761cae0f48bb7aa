/* test_tokenizer.c - engine/tokenizer.h: llama.cpp test vectors for every BPE vocabulary in
 * shared/data, tokenizer.json loading and its errors, encode details, token queries.
 * GGUF corruption: test_tokenizer_gguf.c; detokenizer: test_tokenizer_detok.c; chat encoding
 * and the synthetic writer: test_tokenizer_chat.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/tokenizer.h"

#define VOCAB_DIR "tokenizers/ggerganov-llama.cpp"
#define CASE_SEPARATOR "\n__ggml_vocab_test__\n"
#define MAX_CASES 64

/* ---- helpers --------------------------------------------------------------------------------- */

static char *read_file(const char *path, size_t *n_out)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    long size;

    if (f == NULL) {
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    size = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc((size_t)size + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)size, f), (size_t)size);
    buf[size] = '\0';
    fclose(f);
    *n_out = (size_t)size;
    return buf;
}

/* The vocabulary folder, or NULL (and a printed reason) when the shared data is absent. */
static const char *vocab_dir(char *buf, size_t n)
{
    const char *data = getenv("TANDEM_SHARED_DATA");
    FILE *probe;

    if (data == NULL) {
        print_message("TANDEM_SHARED_DATA is not set: skipping\n");
        return NULL;
    }
    snprintf(buf, n, "%s/%s/ggml-vocab-gpt-2.gguf", data, VOCAB_DIR);
    probe = fopen(buf, "rb");
    if (probe == NULL) {
        print_message("%s is missing: skipping\n", buf);
        return NULL;
    }
    fclose(probe);
    snprintf(buf, n, "%s/%s", data, VOCAB_DIR);
    return buf;
}

/* One test string and its expected ids. */
typedef struct {
    const char *text;
    size_t n_text;
    int32_t ids[1024];
    size_t n_ids;
} vector_case_t;

/* Parse NAME.gguf.inp / .out as llama.cpp's test-tokenizer-0 does. Returns the case count. */
static size_t load_cases(const char *dir, const char *name, char **inp_out, vector_case_t *cases)
{
    char path[1400];
    size_t n_inp, n_out, n_cases = 0, n_lines = 0;
    char *inp, *out, *pos, *line;

    snprintf(path, sizeof(path), "%s/ggml-vocab-%s.gguf.inp", dir, name);
    inp = read_file(path, &n_inp);
    assert_non_null(inp);
    snprintf(path, sizeof(path), "%s/ggml-vocab-%s.gguf.out", dir, name);
    out = read_file(path, &n_out);
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

static int ids_equal(const int32_t *a, size_t n_a, const int32_t *b, size_t n_b)
{
    return n_a == n_b && (n_a == 0 || memcmp(a, b, n_a * sizeof(*a)) == 0);
}

static void print_ids(const char *label, const int32_t *ids, size_t n)
{
    print_message("    %s:", label);
    for (size_t i = 0; i < n; i++) {
        print_message(" %d", ids[i]);
    }
    print_message("\n");
}

/* Encode every case of one vocabulary; print and return the pass count. */
static void run_vectors(const char *name)
{
    static vector_case_t cases[MAX_CASES];
    char dir_buf[1024], path[1200], err[512];
    const char *dir = vocab_dir(dir_buf, sizeof(dir_buf));
    engine_tokenizer_t *tok = NULL;
    char *inp = NULL;
    size_t n_cases, n_pass = 0;

    if (dir == NULL) {
        skip();
    }
    snprintf(path, sizeof(path), "%s/ggml-vocab-%s.gguf", dir, name);
    assert_int_equal(engine_tokenizer_load_gguf(path, &tok, err, sizeof(err)), TDM_OK);
    n_cases = load_cases(dir, name, &inp, cases);
    for (size_t i = 0; i < n_cases; i++) {
        int32_t *ids = NULL;
        size_t n_ids = 0;
        assert_int_equal(engine_tokenizer_encode(tok, cases[i].text, cases[i].n_text, 0, &ids,
                                                 &n_ids),
                         TDM_OK);
        if (ids_equal(ids, n_ids, cases[i].ids, cases[i].n_ids)) {
            n_pass++;
        } else {
            print_message("  %s case %zu failed: \"%.*s\"\n", name, i,
                          cases[i].n_text > 80 ? 80 : (int)cases[i].n_text, cases[i].text);
            print_ids("expected", cases[i].ids, cases[i].n_ids);
            print_ids("got     ", ids, n_ids);
        }
        engine_tokens_free(ids);
    }
    print_message("vocab %s: %zu/%zu llama.cpp vectors pass\n", name, n_pass, n_cases);
    free(inp);
    engine_tokenizer_destroy(tok);
    assert_int_equal(n_pass, n_cases);
}

/* ---- llama.cpp vectors ----------------------------------------------------------------------- */

static void test_vectors_deepseek_llm_all_pass(void **state)
{
    (void)state;
    run_vectors("deepseek-llm");
}

static void test_vectors_deepseek_coder_all_pass(void **state)
{
    (void)state;
    run_vectors("deepseek-coder");
}

static void test_vectors_gpt2_all_pass(void **state)
{
    (void)state;
    run_vectors("gpt-2");
}

static void test_vectors_starcoder_all_pass(void **state)
{
    (void)state;
    run_vectors("starcoder");
}

static void test_vectors_falcon_all_pass(void **state)
{
    (void)state;
    run_vectors("falcon");
}

static void test_vectors_refact_all_pass(void **state)
{
    (void)state;
    run_vectors("refact");
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
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
