/* tokenizer_test_util.h - helpers shared by the test_tokenizer*.c files (test code only).
 *
 * Reading files, locating the llama.cpp vocabularies under TANDEM_SHARED_DATA (printing why
 * when they are absent), the GPT-2 byte-level text of a byte, and a small deterministic PRNG.
 * Include after <cmocka.h>.
 */
#ifndef TANDEM_TESTS_TOKENIZER_TEST_UTIL_H
#define TANDEM_TESTS_TOKENIZER_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define TT_VOCAB_DIR "tokenizers/ggerganov-llama.cpp"

/* Whole file, NUL-terminated (caller frees), or NULL if it cannot be opened. */
static inline char *tt_read_file(const char *path, size_t *n_out)
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

/* Path of ggml-vocab-<name>.gguf<suffix> in shared data; 0 (reason printed) when unavailable. */
static inline int tt_vocab_path(const char *name, const char *suffix, char *out, size_t out_bytes)
{
    const char *data = getenv("TANDEM_SHARED_DATA");
    FILE *probe;

    if (data == NULL) {
        print_message("TANDEM_SHARED_DATA is not set: skipping\n");
        return 0;
    }
    snprintf(out, out_bytes, "%s/%s/ggml-vocab-%s.gguf%s", data, TT_VOCAB_DIR, name, suffix);
    probe = fopen(out, "rb");
    if (probe == NULL) {
        print_message("%s is missing: skipping\n", out);
        return 0;
    }
    fclose(probe);
    return 1;
}

/* The GPT-2 byte-to-unicode text of byte b as UTF-8 (1 or 2 bytes); returns its length. */
static inline size_t tt_byte_text(int b, char *out)
{
    int cp = b, n = 0;

    if (!((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff))) {
        for (int i = 0; i < b; i++) {
            n +=
                !((i >= 0x21 && i <= 0x7e) || (i >= 0xa1 && i <= 0xac) || (i >= 0xae && i <= 0xff));
        }
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xc0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
}

/* Next value of a 64-bit LCG (Knuth MMIX constants), upper bits. */
static inline uint64_t tt_rand(uint64_t *state)
{
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return *state >> 17;
}

#endif
