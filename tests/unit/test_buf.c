/* test_buf.c - the growable byte buffer (common/buf.h): growth by doubling, NUL termination,
 * printf, consume, take, read_file, and allocation failure leaving the buffer unchanged; the
 * same growth for typed arrays (tdm_array_grow).
 *
 * This test links with -Wl,--wrap=realloc,--wrap=malloc (tests/CMakeLists.txt): __wrap_realloc
 * and __wrap_malloc fail when fail_reallocs is set, so the failure path of every growing call
 * runs for real. (malloc too: an optimizing compiler may turn common/buf.c's realloc of a
 * pointer it knows is NULL into a malloc, as GCC -O2 does inlining tdm_buf_take.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/buf.h"

#define PATH_BYTES 1100

void *__real_realloc(void *ptr, size_t n_bytes);
void *__wrap_realloc(void *ptr, size_t n_bytes);
void *__real_malloc(size_t n_bytes);
void *__wrap_malloc(size_t n_bytes);

static int fail_reallocs; /* test switch: the next reallocs fail while set */
static int n_reallocs;    /* reallocs seen (failed ones included) */

void *__wrap_realloc(void *ptr, size_t n_bytes)
{
    n_reallocs++;
    if (fail_reallocs) {
        return NULL;
    }
    return __real_realloc(ptr, n_bytes);
}

void *__wrap_malloc(size_t n_bytes)
{
    if (fail_reallocs) {
        return NULL;
    }
    return __real_malloc(n_bytes);
}

static int reset_switches(void **state)
{
    (void)state;
    fail_reallocs = 0;
    n_reallocs = 0;
    return 0;
}

static void test_zeroed_buffer_is_empty_and_fini_accepts_it(void **state)
{
    tdm_buf_t buf = {0};
    (void)state;

    tdm_buf_reset(&buf);
    tdm_buf_consume(&buf, 10);
    assert_null(buf.data);
    tdm_buf_fini(&buf);
    assert_null(buf.data);
    assert_int_equal(buf.n_bytes, 0);
    assert_int_equal(buf.capacity, 0);
}

static void test_append_grows_by_doubling_and_keeps_a_nul(void **state)
{
    tdm_buf_t buf = {0};
    char piece[100];
    (void)state;

    memset(piece, 'x', sizeof(piece));
    assert_int_equal(tdm_buf_append(&buf, "", 0), TDM_OK);
    assert_non_null(buf.data);
    assert_string_equal(buf.data, "");
    assert_int_equal(buf.capacity, TDM_BUF_MIN_CAPACITY);
    for (int i = 0; i < 10; i++) {
        assert_int_equal(tdm_buf_append(&buf, piece, sizeof(piece)), TDM_OK);
        assert_int_equal(buf.n_bytes, (size_t)(i + 1) * sizeof(piece));
        assert_int_equal(buf.data[buf.n_bytes], '\0');
        assert_true(buf.capacity >= buf.n_bytes + 1);
    }
    /* 1000 bytes + NUL: 256 -> 512 -> 1024 */
    assert_int_equal(buf.capacity, 1024);
    assert_int_equal(strlen(buf.data), 1000);
    /* exactly full (n_bytes + 1 == capacity) does not grow */
    assert_int_equal(tdm_buf_append(&buf, piece, 23), TDM_OK);
    assert_int_equal(buf.capacity, 1024);
    assert_int_equal(tdm_buf_append(&buf, "y", 1), TDM_OK);
    assert_int_equal(buf.capacity, 2048);
    assert_int_equal(buf.data[1023], 'y');
    tdm_buf_fini(&buf);
}

static void test_reserve_makes_room_without_changing_contents(void **state)
{
    tdm_buf_t buf = {0};
    (void)state;

    assert_int_equal(tdm_buf_append(&buf, "abc", 3), TDM_OK);
    assert_int_equal(tdm_buf_reserve(&buf, 5000), TDM_OK);
    assert_true(buf.capacity >= 5004);
    assert_int_equal(buf.n_bytes, 3);
    assert_string_equal(buf.data, "abc");
    tdm_buf_fini(&buf);
}

static void test_printf_appends_formatted_text(void **state)
{
    tdm_buf_t buf = {0};
    char long_text[600];
    (void)state;

    memset(long_text, 'z', sizeof(long_text) - 1);
    long_text[sizeof(long_text) - 1] = '\0';
    assert_int_equal(tdm_buf_printf(&buf, "%s=%d", "n", 42), TDM_OK);
    assert_int_equal(tdm_buf_printf(&buf, ",%s", long_text), TDM_OK);
    assert_int_equal(buf.n_bytes, 4 + 1 + 599);
    assert_memory_equal(buf.data, "n=42,zzz", 8);
    assert_int_equal(buf.data[buf.n_bytes], '\0');
    tdm_buf_fini(&buf);
}

static void test_consume_and_truncate_keep_the_storage(void **state)
{
    tdm_buf_t buf = {0};
    size_t capacity;
    (void)state;

    assert_int_equal(tdm_buf_append(&buf, "hello world", 11), TDM_OK);
    capacity = buf.capacity;
    tdm_buf_consume(&buf, 6);
    assert_string_equal(buf.data, "world");
    assert_int_equal(buf.n_bytes, 5);
    tdm_buf_truncate(&buf, 9);
    assert_string_equal(buf.data, "world");
    tdm_buf_truncate(&buf, 3);
    assert_string_equal(buf.data, "wor");
    assert_int_equal(buf.n_bytes, 3);
    tdm_buf_consume(&buf, 99);
    assert_string_equal(buf.data, "");
    assert_int_equal(buf.n_bytes, 0);
    assert_int_equal(buf.capacity, capacity);
    tdm_buf_fini(&buf);
}

static void test_take_hands_over_the_storage(void **state)
{
    tdm_buf_t buf = {0};
    size_t n = 99;
    char *text;
    (void)state;

    text = tdm_buf_take(&buf, &n); /* empty: a new "" */
    assert_non_null(text);
    assert_string_equal(text, "");
    assert_int_equal(n, 0);
    free(text);

    assert_int_equal(tdm_buf_printf(&buf, "id-%u", 7u), TDM_OK);
    text = tdm_buf_take(&buf, &n);
    assert_string_equal(text, "id-7");
    assert_int_equal(n, 4);
    assert_null(buf.data);
    assert_int_equal(buf.n_bytes, 0);
    assert_int_equal(buf.capacity, 0);
    free(text);
}

static void test_failed_growth_returns_no_memory_and_changes_nothing(void **state)
{
    tdm_buf_t buf = {0};
    tdm_buf_t before;
    char big[TDM_BUF_MIN_CAPACITY];
    (void)state;

    /* first allocation fails: still a zeroed buffer */
    fail_reallocs = 1;
    assert_int_equal(tdm_buf_append(&buf, "a", 1), TDM_ERR_NO_MEMORY);
    assert_null(buf.data);
    assert_int_equal(buf.n_bytes, 0);
    assert_int_equal(buf.capacity, 0);
    assert_null(tdm_buf_take(&buf, NULL));
    fail_reallocs = 0;

    assert_int_equal(tdm_buf_append(&buf, "abc", 3), TDM_OK);
    before = buf;
    memset(big, 'b', sizeof(big));
    fail_reallocs = 1;
    n_reallocs = 0;
    assert_int_equal(tdm_buf_append(&buf, big, sizeof(big)), TDM_ERR_NO_MEMORY);
    assert_int_equal(tdm_buf_reserve(&buf, 4096), TDM_ERR_NO_MEMORY);
    assert_int_equal(tdm_buf_printf(&buf, "%0300d", 1), TDM_ERR_NO_MEMORY);
    assert_int_equal(n_reallocs, 3); /* each really tried to grow */
    assert_memory_equal(&buf, &before, sizeof(buf));
    assert_string_equal(buf.data, "abc");
    /* a size past SIZE_MAX fails without allocating */
    n_reallocs = 0;
    assert_int_equal(tdm_buf_reserve(&buf, SIZE_MAX - 2), TDM_ERR_NO_MEMORY);
    assert_int_equal(n_reallocs, 0);
    assert_memory_equal(&buf, &before, sizeof(buf));
    fail_reallocs = 0;
    /* room that already exists needs no allocation, so it cannot fail */
    fail_reallocs = 1;
    assert_int_equal(tdm_buf_append(&buf, "d", 1), TDM_OK);
    fail_reallocs = 0;
    assert_string_equal(buf.data, "abcd");
    tdm_buf_fini(&buf);
}

static void test_array_grow_doubles_and_a_failure_keeps_the_array(void **state)
{
    int32_t *ids = NULL;
    int32_t *grown;
    size_t capacity = 0;
    (void)state;

    ids = tdm_array_grow(ids, sizeof(*ids), 1, 8, &capacity);
    assert_non_null(ids);
    assert_int_equal(capacity, 8);
    for (int32_t i = 0; i < 8; i++) {
        ids[i] = i;
    }
    assert_ptr_equal(tdm_array_grow(ids, sizeof(*ids), 8, 8, &capacity), ids); /* has room */
    ids = tdm_array_grow(ids, sizeof(*ids), 9, 8, &capacity);
    assert_non_null(ids);
    assert_int_equal(capacity, 16);
    ids = tdm_array_grow(ids, sizeof(*ids), 100, 8, &capacity);
    assert_non_null(ids);
    assert_int_equal(capacity, 128);
    for (int32_t i = 0; i < 8; i++) {
        assert_int_equal(ids[i], i);
    }

    fail_reallocs = 1;
    n_reallocs = 0;
    grown = tdm_array_grow(ids, sizeof(*ids), 129, 8, &capacity);
    assert_null(grown);
    assert_int_equal(n_reallocs, 1);
    assert_int_equal(capacity, 128);
    assert_int_equal(ids[7], 7); /* still the caller's, still valid */
    fail_reallocs = 0;
    assert_null(tdm_array_grow(ids, sizeof(*ids), SIZE_MAX / 2, 8, &capacity)); /* overflows */
    assert_int_equal(capacity, 128);
    free(ids);
}

static void test_read_file_replaces_the_contents(void **state)
{
    const char *tmp = getenv("TANDEM_TEST_TMP");
    char path[PATH_BYTES];
    tdm_buf_t buf = {0};
    FILE *f;
    (void)state;

    if (tmp == NULL) {
        print_message("TANDEM_TEST_TMP not set (run through ctest): skipping\n");
        skip();
    }
    snprintf(path, sizeof(path), "%.1000s/test_buf.txt", tmp);
    f = fopen(path, "wb");
    assert_non_null(f);
    assert_true(fputs("line one\nline two\n", f) >= 0);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(tdm_buf_append(&buf, "old", 3), TDM_OK);
    assert_int_equal(tdm_buf_read_file(&buf, path), TDM_OK);
    assert_string_equal(buf.data, "line one\nline two\n");

    f = fopen(path, "wb"); /* an empty file reads as "" */
    assert_non_null(f);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(tdm_buf_read_file(&buf, path), TDM_OK);
    assert_non_null(buf.data);
    assert_string_equal(buf.data, "");

    assert_int_equal(tdm_buf_append(&buf, "old", 3), TDM_OK);
    snprintf(path, sizeof(path), "%.1000s/test_buf_missing.txt", tmp);
    remove(path);
    assert_int_equal(tdm_buf_read_file(&buf, path), TDM_ERR_NOT_FOUND);
    assert_int_equal(buf.n_bytes, 0);
    tdm_buf_fini(&buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_zeroed_buffer_is_empty_and_fini_accepts_it, reset_switches),
        cmocka_unit_test_setup(test_append_grows_by_doubling_and_keeps_a_nul, reset_switches),
        cmocka_unit_test_setup(test_reserve_makes_room_without_changing_contents, reset_switches),
        cmocka_unit_test_setup(test_printf_appends_formatted_text, reset_switches),
        cmocka_unit_test_setup(test_consume_and_truncate_keep_the_storage, reset_switches),
        cmocka_unit_test_setup(test_take_hands_over_the_storage, reset_switches),
        cmocka_unit_test_setup(test_failed_growth_returns_no_memory_and_changes_nothing,
                               reset_switches),
        cmocka_unit_test_setup(test_array_grow_doubles_and_a_failure_keeps_the_array,
                               reset_switches),
        cmocka_unit_test_setup(test_read_file_replaces_the_contents, reset_switches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
