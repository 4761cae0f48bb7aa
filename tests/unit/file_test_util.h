/* file_test_util.h - file helpers shared by the checkpoint tests (test_safetensors.c,
 * test_weights.c; test code only): a scratch path under TANDEM_TEST_TMP, and whole-file reads
 * and writes that fail the test on any I/O error. Include after <cmocka.h>.
 */
#ifndef TANDEM_TESTS_FILE_TEST_UTIL_H
#define TANDEM_TESTS_FILE_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* path_out (path_bytes) = $TANDEM_TEST_TMP (or /tmp) "/" prefix name. */
static inline void fu_tmp_path(const char *prefix, const char *name, char *path_out,
                               size_t path_bytes)
{
    const char *dir = getenv("TANDEM_TEST_TMP");
    int n = snprintf(path_out, path_bytes, "%s/%s%s", dir != NULL ? dir : "/tmp", prefix, name);

    assert_true(n > 0 && (size_t)n < path_bytes);
}

/* Writes data[0..n_bytes) as the whole file at path (created or truncated). */
static inline void fu_write_bytes(const char *path, const void *data, size_t n_bytes)
{
    FILE *f = fopen(path, "wb");

    assert_non_null(f);
    if (n_bytes > 0) {
        assert_int_equal(fwrite(data, 1, n_bytes, f), n_bytes);
    }
    assert_int_equal(fclose(f), 0);
}

/* The whole file at path in a malloc'd buffer (one spare byte; caller frees); *n_bytes_out its
 * size. */
static inline uint8_t *fu_read_bytes(const char *path, size_t *n_bytes_out)
{
    FILE *f = fopen(path, "rb");
    uint8_t *data;
    long size;

    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    size = ftell(f);
    assert_true(size >= 0);
    assert_int_equal(fseek(f, 0, SEEK_SET), 0);
    data = malloc((size_t)size + 1);
    assert_non_null(data);
    assert_int_equal(fread(data, 1, (size_t)size, f), (size_t)size);
    fclose(f);
    *n_bytes_out = (size_t)size;
    return data;
}

#endif /* TANDEM_TESTS_FILE_TEST_UTIL_H */
