/* test_safetensors.c - the safetensors reader and writer: round trips, determinism, every
 * malformation the reader rejects, truncation and header corruption without crashes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/status.h"
#include "engine/safetensors.h"
#include "engine/tensor.h"
#include "file_test_util.h"

#define PATH_BYTES       1024
#define ERR_BYTES        512
#define N_FLIP_TRIALS    3000
#define BIG_TENSOR_BYTES (32u * 1024u * 1024u) /* three of them: ~100 MB */

/* A sentinel no open call may write: outputs stay untouched on error. */
static engine_st_file_t *const untouched_file = (engine_st_file_t *)(uintptr_t)0x5a5a5a50;

static void tmp_path(const char *name, char *path_out)
{
    fu_tmp_path("st_", name, path_out, PATH_BYTES);
}

/* Writes a file with length field = strlen(header), the header, then n_data zero bytes. */
static void write_raw(const char *path, const char *header, size_t n_data)
{
    size_t header_bytes = strlen(header);
    size_t n_bytes = 8 + header_bytes + n_data;
    uint8_t *buf = calloc(1, n_bytes);

    assert_non_null(buf);
    for (int b = 0; b < 8; b++) {
        buf[b] = (uint8_t)((uint64_t)header_bytes >> (8 * b));
    }
    memcpy(buf + 8, header, header_bytes);
    fu_write_bytes(path, buf, n_bytes);
    free(buf);
}

/* Opens a file expected to be rejected with `status`; err must contain path and `needle`. */
static void expect_open_fails(const char *path, tdm_status_t status, const char *needle)
{
    engine_st_file_t *file = untouched_file;
    char err[ERR_BYTES] = "";

    assert_int_equal(engine_st_file_open(path, &file, err, sizeof(err)), status);
    assert_ptr_equal(file, untouched_file);
    if (strstr(err, path) == NULL || (needle != NULL && strstr(err, needle) == NULL)) {
        fail_msg("err '%s' lacks the path or '%s'", err, needle != NULL ? needle : "");
    }
}

static void expect_header_fails(const char *name, const char *header, size_t n_data,
                                tdm_status_t status, const char *needle)
{
    char path[PATH_BYTES];

    tmp_path(name, path);
    write_raw(path, header, n_data);
    expect_open_fails(path, status, needle);
}

/* Sum of every data byte: touches all of them so ASan sees any read past the mapping. */
static uint64_t touch_all(const engine_st_file_t *file)
{
    uint64_t sum = 0;

    for (size_t i = 0; i < engine_st_file_n_tensors(file); i++) {
        const engine_st_tensor_t *t = engine_st_file_tensor_at(file, i);
        const uint8_t *p = t->data;
        for (size_t b = 0; b < t->n_bytes; b++) {
            sum += p[b];
        }
        sum += strlen(t->name);
    }
    return sum;
}

/* The sample file: five tensors of several dtypes and ranks, two metadata keys. */
static const uint16_t bf16_data[6] = {0x3f80, 0x4000, 0x4040, 0x4080, 0x40a0, 0x40c0};
static const float f32_data[4] = {1.0f, -2.5f, 3.25f, 0.0f};
static const int8_t i8_scalar = -7;
static const uint8_t u8_data[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};

static void write_sample(const char *path, int reverse)
{
    engine_st_writer_t *w = NULL;
    const int64_t bf16_shape[2] = {2, 3};
    const int64_t f32_shape[1] = {4};
    const int64_t empty_shape[2] = {0, 5};
    const int64_t u8_shape[4] = {3, 1, 2, 2};

    assert_int_equal(engine_st_writer_create(path, &w), TDM_OK);
    if (reverse) {
        assert_int_equal(engine_st_writer_set_metadata(w, "origin", "test"), TDM_OK);
        assert_int_equal(engine_st_writer_set_metadata(w, "format", "pt"), TDM_OK);
        assert_int_equal(
            engine_st_writer_add(w, "z.u8", ENGINE_DTYPE_U8, 4, u8_shape, u8_data, sizeof(u8_data)),
            TDM_OK);
        assert_int_equal(
            engine_st_writer_add(w, "m.empty", ENGINE_DTYPE_F32, 2, empty_shape, NULL, 0), TDM_OK);
        assert_int_equal(
            engine_st_writer_add(w, "layers.0.scalar", ENGINE_DTYPE_I8, 0, NULL, &i8_scalar, 1),
            TDM_OK);
        assert_int_equal(engine_st_writer_add(w, "b.f32", ENGINE_DTYPE_F32, 1, f32_shape, f32_data,
                                              sizeof(f32_data)),
                         TDM_OK);
        assert_int_equal(engine_st_writer_add(w, "a.bf16", ENGINE_DTYPE_BF16, 2, bf16_shape,
                                              bf16_data, sizeof(bf16_data)),
                         TDM_OK);
    } else {
        assert_int_equal(engine_st_writer_set_metadata(w, "format", "old"), TDM_OK);
        assert_int_equal(engine_st_writer_add(w, "a.bf16", ENGINE_DTYPE_BF16, 2, bf16_shape,
                                              bf16_data, sizeof(bf16_data)),
                         TDM_OK);
        assert_int_equal(engine_st_writer_add(w, "b.f32", ENGINE_DTYPE_F32, 1, f32_shape, f32_data,
                                              sizeof(f32_data)),
                         TDM_OK);
        assert_int_equal(
            engine_st_writer_add(w, "layers.0.scalar", ENGINE_DTYPE_I8, 0, NULL, &i8_scalar, 1),
            TDM_OK);
        assert_int_equal(
            engine_st_writer_add(w, "m.empty", ENGINE_DTYPE_F32, 2, empty_shape, NULL, 0), TDM_OK);
        assert_int_equal(
            engine_st_writer_add(w, "z.u8", ENGINE_DTYPE_U8, 4, u8_shape, u8_data, sizeof(u8_data)),
            TDM_OK);
        assert_int_equal(engine_st_writer_set_metadata(w, "origin", "test"), TDM_OK);
        assert_int_equal(engine_st_writer_set_metadata(w, "format", "pt"), TDM_OK);
    }
    assert_int_equal(engine_st_writer_finish(w), TDM_OK);
    engine_st_writer_destroy(w);
}

static void test_round_trip_preserves_tensors_and_metadata(void **state)
{
    char path[PATH_BYTES];
    char err[ERR_BYTES] = "";
    engine_st_file_t *file = NULL;
    const engine_st_tensor_t *t;
    const char *key;
    const char *value;
    (void)state;

    tmp_path("sample.safetensors", path);
    write_sample(path, 0);
    assert_int_equal(engine_st_file_open(path, &file, err, sizeof(err)), TDM_OK);
    assert_string_equal(engine_st_file_path(file), path);
    assert_int_equal(engine_st_file_n_tensors(file), 5);
    assert_int_equal(engine_st_file_header_bytes(file) % ENGINE_ST_HEADER_ALIGN_BYTES, 0);

    /* tensor_at is in name order */
    assert_string_equal(engine_st_file_tensor_at(file, 0)->name, "a.bf16");
    assert_string_equal(engine_st_file_tensor_at(file, 1)->name, "b.f32");
    assert_string_equal(engine_st_file_tensor_at(file, 2)->name, "layers.0.scalar");
    assert_string_equal(engine_st_file_tensor_at(file, 3)->name, "m.empty");
    assert_string_equal(engine_st_file_tensor_at(file, 4)->name, "z.u8");
    assert_null(engine_st_file_tensor_at(file, 5));

    t = engine_st_file_find(file, "a.bf16");
    assert_non_null(t);
    assert_int_equal(t->dtype, ENGINE_DTYPE_BF16);
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(t->shape[0], 2);
    assert_int_equal(t->shape[1], 3);
    assert_int_equal(t->n_bytes, sizeof(bf16_data));
    assert_int_equal(t->data_offset, 0);
    assert_memory_equal(t->data, bf16_data, sizeof(bf16_data));

    t = engine_st_file_find(file, "b.f32");
    assert_non_null(t);
    assert_int_equal(t->data_offset, sizeof(bf16_data));
    assert_memory_equal(t->data, f32_data, sizeof(f32_data));

    t = engine_st_file_find(file, "layers.0.scalar");
    assert_non_null(t);
    assert_int_equal(t->n_dims, 0);
    assert_int_equal(t->n_bytes, 1);
    assert_int_equal(*(const int8_t *)t->data, -7);

    t = engine_st_file_find(file, "m.empty");
    assert_non_null(t);
    assert_int_equal(t->n_bytes, 0);
    assert_int_equal(t->shape[0], 0);
    assert_int_equal(t->shape[1], 5);

    t = engine_st_file_find(file, "z.u8");
    assert_non_null(t);
    assert_int_equal(t->n_dims, 4);
    assert_memory_equal(t->data, u8_data, sizeof(u8_data));
    assert_null(engine_st_file_find(file, "missing"));
    assert_null(engine_st_file_find(file, "a.bf1"));

    assert_int_equal(engine_st_file_n_metadata(file), 2);
    assert_string_equal(engine_st_file_metadata(file, "format"), "pt");
    assert_string_equal(engine_st_file_metadata(file, "origin"), "test");
    assert_null(engine_st_file_metadata(file, "other"));
    assert_int_equal(engine_st_file_metadata_at(file, 0, &key, &value), TDM_OK);
    assert_string_equal(key, "format");
    assert_string_equal(value, "pt");
    assert_int_equal(engine_st_file_metadata_at(file, 2, &key, &value), TDM_ERR_INVALID_ARG);
    engine_st_file_close(file);
}

static void test_copy_resident_moves_every_tensor_into_aligned_memory(void **state)
{
    char path[PATH_BYTES];
    char err[ERR_BYTES] = "";
    engine_st_file_t *file = NULL;
    const uint8_t *before[5];
    uint8_t bytes[5][64];
    uint64_t huge = 1;
    (void)state;

    tmp_path("resident.safetensors", path);
    write_sample(path, 1);
    assert_int_equal(engine_st_file_open(path, &file, err, sizeof(err)), TDM_OK);
    uint64_t sum = touch_all(file);
    for (size_t i = 0; i < 5; i++) {
        const engine_st_tensor_t *t = engine_st_file_tensor_at(file, i);
        assert_true(t->n_bytes <= sizeof(bytes[i]));
        before[i] = t->data;
        memcpy(bytes[i], t->data, t->n_bytes);
    }
    assert_int_equal(engine_st_file_copy_resident(file, &huge, err, sizeof(err)), TDM_OK);
    /* advice taken (whole huge pages) or refused (0): both leave a working copy */
    assert_int_equal(huge % ENGINE_ST_HUGE_PAGE_BYTES, 0);
    for (size_t i = 0; i < 5; i++) {
        const engine_st_tensor_t *t = engine_st_file_tensor_at(file, i);
        const uint8_t *start =
            (const uint8_t *)t->data - t->data_offset - 8 - engine_st_file_header_bytes(file);
        assert_ptr_not_equal(t->data, before[i]);
        assert_memory_equal(t->data, bytes[i], t->n_bytes);
        assert_int_equal((uintptr_t)start % ENGINE_ST_HUGE_PAGE_BYTES, 0);
    }
    assert_int_equal(touch_all(file), sum);
    assert_ptr_equal(engine_st_file_find(file, "a.bf16"), engine_st_file_tensor_at(file, 0));
    assert_memory_equal(engine_st_file_find(file, "b.f32")->data, f32_data, sizeof(f32_data));
    assert_string_equal(engine_st_file_metadata(file, "origin"), "test");
    /* a second call changes nothing */
    const void *moved = engine_st_file_tensor_at(file, 0)->data;
    assert_int_equal(engine_st_file_copy_resident(file, &huge, err, sizeof(err)), TDM_OK);
    assert_int_equal(huge, 0);
    assert_ptr_equal(engine_st_file_tensor_at(file, 0)->data, moved);
    engine_st_file_close(file);

    assert_int_equal(engine_st_file_copy_resident(NULL, NULL, err, sizeof(err)),
                     TDM_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "engine_st_file_copy_resident"));
}

static void test_writer_output_is_deterministic_and_matches_the_spec_layout(void **state)
{
    char path_a[PATH_BYTES];
    char path_b[PATH_BYTES];
    uint8_t *a;
    uint8_t *b;
    size_t n_a;
    size_t n_b;
    const char *expected = "{\"__metadata__\":{\"format\":\"pt\",\"origin\":\"test\"},"
                           "\"a.bf16\":{\"dtype\":\"BF16\",\"shape\":[2,3],"
                           "\"data_offsets\":[0,12]},";
    uint64_t header_bytes = 0;
    (void)state;

    tmp_path("det_a.safetensors", path_a);
    tmp_path("det_b.safetensors", path_b);
    write_sample(path_a, 0);
    write_sample(path_b, 1);
    a = fu_read_bytes(path_a, &n_a);
    b = fu_read_bytes(path_b, &n_b);
    assert_int_equal(n_a, n_b);
    assert_memory_equal(a, b, n_a);

    for (int i = 0; i < 8; i++) {
        header_bytes |= (uint64_t)a[i] << (8 * i);
    }
    assert_int_equal(header_bytes % 8, 0);
    assert_int_equal(n_a, 8 + header_bytes + 12 + 16 + 1 + 0 + 12);
    assert_memory_equal(a + 8, expected, strlen(expected));
    {
        /* the JSON text ends in '}' and only spaces pad it to the 8-byte boundary */
        size_t end = 8 + (size_t)header_bytes;
        while (a[end - 1] == ' ') {
            end--;
        }
        assert_int_equal(a[end - 1], '}');
        assert_true(8 + header_bytes - end < 8);
    }
    assert_memory_equal(a + 8 + header_bytes, bf16_data, sizeof(bf16_data));
    free(a);
    free(b);
}

static void test_rewrite_of_a_read_file_is_byte_identical(void **state)
{
    char path[PATH_BYTES];
    char copy_path[PATH_BYTES];
    char err[ERR_BYTES] = "";
    engine_st_file_t *file = NULL;
    engine_st_writer_t *w = NULL;
    uint8_t *a;
    uint8_t *b;
    size_t n_a;
    size_t n_b;
    (void)state;

    tmp_path("rewrite_src.safetensors", path);
    tmp_path("rewrite_dst.safetensors", copy_path);
    write_sample(path, 0);
    assert_int_equal(engine_st_file_open(path, &file, err, sizeof(err)), TDM_OK);
    assert_int_equal(engine_st_writer_create(copy_path, &w), TDM_OK);
    for (size_t i = engine_st_file_n_tensors(file); i > 0; i--) {
        const engine_st_tensor_t *t = engine_st_file_tensor_at(file, i - 1);
        assert_int_equal(
            engine_st_writer_add(w, t->name, t->dtype, t->n_dims, t->shape, t->data, t->n_bytes),
            TDM_OK);
    }
    for (size_t i = 0; i < engine_st_file_n_metadata(file); i++) {
        const char *key;
        const char *value;
        assert_int_equal(engine_st_file_metadata_at(file, i, &key, &value), TDM_OK);
        assert_int_equal(engine_st_writer_set_metadata(w, key, value), TDM_OK);
    }
    engine_st_file_close(file);
    assert_int_equal(engine_st_writer_finish(w), TDM_OK);
    engine_st_writer_destroy(w);

    a = fu_read_bytes(path, &n_a);
    b = fu_read_bytes(copy_path, &n_b);
    assert_int_equal(n_a, n_b);
    assert_memory_equal(a, b, n_a);
    free(a);
    free(b);
}

static void test_empty_file_without_tensors_round_trips(void **state)
{
    char path[PATH_BYTES];
    char err[ERR_BYTES] = "";
    engine_st_writer_t *w = NULL;
    engine_st_file_t *file = NULL;
    uint8_t *bytes;
    size_t n_bytes;
    (void)state;

    tmp_path("empty.safetensors", path);
    assert_int_equal(engine_st_writer_create(path, &w), TDM_OK);
    assert_int_equal(engine_st_writer_finish(w), TDM_OK);
    engine_st_writer_destroy(w);
    bytes = fu_read_bytes(path, &n_bytes);
    assert_int_equal(n_bytes, 16);
    assert_memory_equal(bytes + 8, "{}      ", 8);
    free(bytes);
    assert_int_equal(engine_st_file_open(path, &file, err, sizeof(err)), TDM_OK);
    assert_int_equal(engine_st_file_n_tensors(file), 0);
    assert_null(engine_st_file_find(file, "x"));
    assert_int_equal(engine_st_file_n_metadata(file), 0);
    engine_st_file_close(file);
}

static void test_writer_handles_100_megabytes(void **state)
{
    char path[PATH_BYTES];
    char err[ERR_BYTES] = "";
    engine_st_writer_t *w = NULL;
    engine_st_file_t *file = NULL;
    uint8_t *data = malloc(BIG_TENSOR_BYTES);
    const int64_t shape[2] = {BIG_TENSOR_BYTES / 1024, 1024};
    (void)state;

    assert_non_null(data);
    tmp_path("big.safetensors", path);
    assert_int_equal(engine_st_writer_create(path, &w), TDM_OK);
    for (int k = 0; k < 3; k++) {
        char name[32];
        for (size_t i = 0; i < BIG_TENSOR_BYTES; i++) {
            data[i] = (uint8_t)(i * 31u + (size_t)k * 7u);
        }
        snprintf(name, sizeof(name), "big.%d", k);
        assert_int_equal(
            engine_st_writer_add(w, name, ENGINE_DTYPE_U8, 2, shape, data, BIG_TENSOR_BYTES),
            TDM_OK);
    }
    assert_int_equal(engine_st_writer_finish(w), TDM_OK);
    engine_st_writer_destroy(w);

    assert_int_equal(engine_st_file_open(path, &file, err, sizeof(err)), TDM_OK);
    assert_int_equal(engine_st_file_n_tensors(file), 3);
    for (int k = 0; k < 3; k++) {
        const engine_st_tensor_t *t = engine_st_file_tensor_at(file, (size_t)k);
        const uint8_t *p = t->data;
        assert_int_equal(t->n_bytes, BIG_TENSOR_BYTES);
        assert_int_equal(t->data_offset, (uint64_t)k * BIG_TENSOR_BYTES);
        for (size_t i = 0; i < BIG_TENSOR_BYTES; i += 4097) {
            assert_int_equal(p[i], (uint8_t)(i * 31u + (size_t)k * 7u));
        }
        assert_int_equal(p[BIG_TENSOR_BYTES - 1],
                         (uint8_t)((BIG_TENSOR_BYTES - 1) * 31u + (size_t)k * 7u));
    }
    engine_st_file_close(file);
    free(data);
    remove(path);
}

static void test_writer_rejects_bad_input_and_changes_nothing(void **state)
{
    char path[PATH_BYTES];
    engine_st_writer_t *w = NULL;
    engine_st_file_t *file = NULL;
    char err[ERR_BYTES] = "";
    const int64_t shape[2] = {2, 2};
    const int64_t negative[1] = {-1};
    const int64_t five[5] = {1, 1, 1, 1, 1};
    const float data[4] = {0};
    (void)state;

    tmp_path("writer_bad.safetensors", path);
    remove(path);
    assert_int_equal(engine_st_writer_create(NULL, &w), TDM_ERR_INVALID_ARG);
    assert_null(w);
    assert_int_equal(engine_st_writer_create(path, &w), TDM_OK);
    assert_int_equal(engine_st_writer_add(w, "", ENGINE_DTYPE_F32, 2, shape, data, 16),
                     TDM_ERR_INVALID_ARG);
    assert_int_equal(engine_st_writer_add(w, "__metadata__", ENGINE_DTYPE_F32, 2, shape, data, 16),
                     TDM_ERR_INVALID_ARG);
    assert_int_equal(engine_st_writer_add(w, "bad\xff", ENGINE_DTYPE_F32, 2, shape, data, 16),
                     TDM_ERR_INVALID_ARG);
    assert_int_equal(engine_st_writer_add(w, "x", ENGINE_DTYPE_COUNT, 2, shape, data, 16),
                     TDM_ERR_INVALID_ARG);
    assert_int_equal(engine_st_writer_add(w, "x", ENGINE_DTYPE_F32, 2, shape, data, 12),
                     TDM_ERR_INVALID_ARG);
    assert_int_equal(engine_st_writer_add(w, "x", ENGINE_DTYPE_F32, 1, negative, data, 0),
                     TDM_ERR_INVALID_ARG);
    assert_int_equal(engine_st_writer_add(w, "x", ENGINE_DTYPE_F32, 5, five, data, 4),
                     TDM_ERR_INVALID_ARG);
    assert_int_equal(engine_st_writer_set_metadata(w, "", "v"), TDM_ERR_INVALID_ARG);
    assert_int_equal(engine_st_writer_add(w, "x", ENGINE_DTYPE_F32, 2, shape, data, 16), TDM_OK);
    assert_int_equal(engine_st_writer_finish(w), TDM_OK);
    assert_int_equal(engine_st_writer_finish(w), TDM_ERR_INVALID_ARG);
    assert_int_equal(engine_st_writer_add(w, "y", ENGINE_DTYPE_F32, 2, shape, data, 16),
                     TDM_ERR_INVALID_ARG);
    engine_st_writer_destroy(w);
    engine_st_writer_destroy(NULL);
    assert_int_equal(engine_st_file_open(path, &file, err, sizeof(err)), TDM_OK);
    assert_int_equal(engine_st_file_n_tensors(file), 1);
    engine_st_file_close(file);
    engine_st_file_close(NULL);
}

static void test_writer_refuses_duplicate_names_and_writes_no_file(void **state)
{
    char path[PATH_BYTES];
    engine_st_writer_t *w = NULL;
    const int64_t shape[1] = {1};
    const float one = 1.0f;
    FILE *f;
    (void)state;

    tmp_path("writer_dup.safetensors", path);
    remove(path);
    assert_int_equal(engine_st_writer_create(path, &w), TDM_OK);
    assert_int_equal(engine_st_writer_add(w, "x", ENGINE_DTYPE_F32, 1, shape, &one, 4), TDM_OK);
    assert_int_equal(engine_st_writer_add(w, "x", ENGINE_DTYPE_F32, 1, shape, &one, 4), TDM_OK);
    assert_int_equal(engine_st_writer_finish(w), TDM_ERR_INVALID_ARG);
    engine_st_writer_destroy(w);
    f = fopen(path, "rb");
    assert_null(f);
}

static void test_writer_finish_into_a_missing_directory_is_an_io_error(void **state)
{
    char path[PATH_BYTES];
    engine_st_writer_t *w = NULL;
    const int64_t shape[1] = {1};
    const float one = 1.0f;
    (void)state;

    tmp_path("no_such_dir/x.safetensors", path);
    assert_int_equal(engine_st_writer_create(path, &w), TDM_OK);
    assert_int_equal(engine_st_writer_add(w, "x", ENGINE_DTYPE_F32, 1, shape, &one, 4), TDM_OK);
    assert_int_equal(engine_st_writer_finish(w), TDM_ERR_IO);
    engine_st_writer_destroy(w);
}

static void test_open_missing_file_and_directory_fail(void **state)
{
    char path[PATH_BYTES];
    const char *dir = getenv("TANDEM_TEST_TMP");
    engine_st_file_t *file = untouched_file;
    char err[ERR_BYTES] = "";
    (void)state;

    tmp_path("does_not_exist.safetensors", path);
    expect_open_fails(path, TDM_ERR_NOT_FOUND, NULL);
    expect_open_fails(dir != NULL ? dir : "/tmp", TDM_ERR_IO, "regular");
    assert_int_equal(engine_st_file_open(NULL, &file, err, sizeof(err)), TDM_ERR_INVALID_ARG);
    assert_ptr_equal(file, untouched_file);
    /* err may be omitted */
    assert_int_equal(engine_st_file_open(path, &file, NULL, 0), TDM_ERR_NOT_FOUND);
}

static void test_file_shorter_than_length_field_is_rejected(void **state)
{
    char path[PATH_BYTES];
    const uint8_t bytes[7] = {2, 0, 0, 0, 0, 0, 0};
    (void)state;

    tmp_path("short.safetensors", path);
    for (size_t n = 0; n < sizeof(bytes); n++) {
        fu_write_bytes(path, bytes, n);
        expect_open_fails(path, TDM_ERR_FORMAT, "shorter");
    }
}

static void test_header_length_past_end_or_over_limit_is_rejected(void **state)
{
    char path[PATH_BYTES];
    uint8_t bytes[16] = {0};
    (void)state;

    tmp_path("len.safetensors", path);
    bytes[0] = 9; /* 9 > 8 header bytes present */
    memcpy(bytes + 8, "{}      ", 8);
    fu_write_bytes(path, bytes, sizeof(bytes));
    expect_open_fails(path, TDM_ERR_FORMAT, "runs past the end");

    memset(bytes, 0, 8);
    bytes[0] = 0x01; /* 100,000,001 = 0x05F5E101 */
    bytes[1] = 0xE1;
    bytes[2] = 0xF5;
    bytes[3] = 0x05;
    fu_write_bytes(path, bytes, sizeof(bytes));
    expect_open_fails(path, TDM_ERR_FORMAT, "exceeds");

    memset(bytes, 0xff, 8); /* 2^64 - 1: no overflow in the check */
    fu_write_bytes(path, bytes, sizeof(bytes));
    expect_open_fails(path, TDM_ERR_FORMAT, "exceeds");

    memset(bytes, 0, 8); /* zero-length header */
    fu_write_bytes(path, bytes, sizeof(bytes));
    expect_open_fails(path, TDM_ERR_FORMAT, "'{'");
}

static void test_header_not_json_or_not_object_is_rejected(void **state)
{
    (void)state;
    expect_header_fails("notjson.safetensors", "{\"a\": ", 0, TDM_ERR_FORMAT, NULL);
    expect_header_fails("garbage.safetensors", "{xyz}   ", 0, TDM_ERR_FORMAT, NULL);
    expect_header_fails("array.safetensors", "[1, 2]  ", 0, TDM_ERR_FORMAT, "'{'");
    expect_header_fails("leading.safetensors", " {}     ", 0, TDM_ERR_FORMAT, "'{'");
    expect_header_fails("trailing.safetensors", "{}xx", 0, TDM_ERR_FORMAT, NULL);
    expect_header_fails("badutf8.safetensors", "{\"\xc3\x28\":1}", 0, TDM_ERR_FORMAT, NULL);
    expect_header_fails("nul.safetensors", "{\"a\\u0000b\":{}}", 0, TDM_ERR_FORMAT, NULL);
}

static void test_bad_tensor_entries_are_rejected_naming_the_tensor(void **state)
{
    (void)state;
    expect_header_fails("entry_num.safetensors", "{\"w.x\":5}", 0, TDM_ERR_FORMAT, "w.x");
    expect_header_fails("no_dtype.safetensors", "{\"w.x\":{\"shape\":[1],\"data_offsets\":[0,1]}}",
                        1, TDM_ERR_FORMAT, "w.x");
    expect_header_fails("dtype_num.safetensors",
                        "{\"w.x\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
                        TDM_ERR_FORMAT, "dtype");
    expect_header_fails("empty_name.safetensors",
                        "{\"\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
                        TDM_ERR_FORMAT, "empty name");
}

static void test_unknown_dtype_is_unsupported(void **state)
{
    (void)state;
    expect_header_fails("dtype.safetensors",
                        "{\"layers.0.w\":{\"dtype\":\"F8_E5M2\",\"shape\":[2],"
                        "\"data_offsets\":[0,2]}}",
                        2, TDM_ERR_UNSUPPORTED, "layers.0.w");
    expect_header_fails("dtype_lower.safetensors",
                        "{\"w\":{\"dtype\":\"bf16\",\"shape\":[1],\"data_offsets\":[0,2]}}", 2,
                        TDM_ERR_UNSUPPORTED, "bf16");
    expect_header_fails("dtype_nul.safetensors",
                        "{\"w\":{\"dtype\":\"U8\\u0000x\",\"shape\":[1],\"data_offsets\":[0,1]}}",
                        1, TDM_ERR_UNSUPPORTED, "w");
}

static void test_bad_shapes_are_rejected(void **state)
{
    (void)state;
    expect_header_fails("shape_num.safetensors",
                        "{\"w\":{\"dtype\":\"U8\",\"shape\":5,\"data_offsets\":[0,5]}}", 5,
                        TDM_ERR_FORMAT, "shape");
    expect_header_fails("shape_missing.safetensors",
                        "{\"w\":{\"dtype\":\"U8\",\"data_offsets\":[0,5]}}", 5, TDM_ERR_FORMAT,
                        "shape");
    expect_header_fails("shape_neg.safetensors",
                        "{\"w\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,0]}}", 0,
                        TDM_ERR_FORMAT, "shape entry 0");
    expect_header_fails("shape_real.safetensors",
                        "{\"w\":{\"dtype\":\"U8\",\"shape\":[1.5],\"data_offsets\":[0,1]}}", 1,
                        TDM_ERR_FORMAT, "shape entry 0");
    expect_header_fails("shape_str.safetensors",
                        "{\"w\":{\"dtype\":\"U8\",\"shape\":[1,\"2\"],\"data_offsets\":[0,2]}}", 2,
                        TDM_ERR_FORMAT, "shape entry 1");
    expect_header_fails("shape_5d.safetensors",
                        "{\"w5\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1],"
                        "\"data_offsets\":[0,1]}}",
                        1, TDM_ERR_UNSUPPORTED, "w5");
}

static void test_bad_data_offsets_are_rejected(void **state)
{
    (void)state;
    expect_header_fails("off_missing.safetensors", "{\"w\":{\"dtype\":\"U8\",\"shape\":[2]}}", 2,
                        TDM_ERR_FORMAT, "data_offsets");
    expect_header_fails("off_three.safetensors",
                        "{\"w\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,1,2]}}", 2,
                        TDM_ERR_FORMAT, "data_offsets");
    expect_header_fails("off_neg.safetensors",
                        "{\"w\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[-2,0]}}", 2,
                        TDM_ERR_FORMAT, "data_offsets");
    expect_header_fails("off_reversed.safetensors",
                        "{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[2,1]}}", 2,
                        TDM_ERR_FORMAT, "end before begin");
    expect_header_fails("off_past.safetensors",
                        "{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 3,
                        TDM_ERR_FORMAT, "past the 3-byte data region");
    expect_header_fails("off_huge.safetensors",
                        "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],"
                        "\"data_offsets\":[9223372036854775806,9223372036854775807]}}",
                        3, TDM_ERR_FORMAT, "past");
}

static void test_byte_count_must_match_shape_without_overflow(void **state)
{
    (void)state;
    expect_header_fails("count.safetensors",
                        "{\"w.f32\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 8,
                        TDM_ERR_FORMAT, "hold 4 bytes, shape [2] of F32 needs 8");
    expect_header_fails("count_scalar.safetensors",
                        "{\"s\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,4]}}", 8,
                        TDM_ERR_FORMAT, "needs 8");
    /* 2^62 * 2^62 elements: the product overflows 64 bits */
    expect_header_fails("overflow.safetensors",
                        "{\"w\":{\"dtype\":\"BF16\",\"shape\":[4611686018427387904,"
                        "4611686018427387904],\"data_offsets\":[0,0]}}",
                        0, TDM_ERR_FORMAT, "overflows");
    /* 2^32 * 2^32 * 2 bytes wraps to 0 without the check */
    expect_header_fails("overflow_wrap.safetensors",
                        "{\"w\":{\"dtype\":\"BF16\",\"shape\":[4294967296,4294967296],"
                        "\"data_offsets\":[0,0]}}",
                        0, TDM_ERR_FORMAT, "overflows");
    /* 2^63 elements of 2 bytes: product exactly 2^64 */
    expect_header_fails("overflow_edge.safetensors",
                        "{\"w\":{\"dtype\":\"BF16\",\"shape\":[9223372036854775807,1,1,2],"
                        "\"data_offsets\":[0,0]}}",
                        0, TDM_ERR_FORMAT, "overflows");
}

static void test_overlapping_tensors_are_rejected(void **state)
{
    (void)state;
    expect_header_fails("overlap.safetensors",
                        "{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},"
                        "\"b\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[4,12]}}",
                        12, TDM_ERR_FORMAT, "overlap");
    expect_header_fails("overlap_inside.safetensors",
                        "{\"a\":{\"dtype\":\"U8\",\"shape\":[12],\"data_offsets\":[0,12]},"
                        "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[4,6]},"
                        "\"c\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[8,10]}}",
                        12, TDM_ERR_FORMAT, "'a'");
    expect_header_fails("overlap_same.safetensors",
                        "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                        "\"b\":{\"dtype\":\"I8\",\"shape\":[4],\"data_offsets\":[0,4]}}",
                        4, TDM_ERR_FORMAT, "overlap");
}

static void test_gaps_empty_tensors_and_unknown_keys_are_accepted(void **state)
{
    char path[PATH_BYTES];
    char err[ERR_BYTES] = "";
    engine_st_file_t *file = NULL;
    (void)state;

    tmp_path("gaps.safetensors", path);
    write_raw(path,
              "{\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[6,8],\"extra\":1},"
              "\"e\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[7,7]},"
              "\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}   ",
              10);
    assert_int_equal(engine_st_file_open(path, &file, err, sizeof(err)), TDM_OK);
    assert_int_equal(engine_st_file_n_tensors(file), 3);
    assert_string_equal(engine_st_file_tensor_at(file, 0)->name, "a");
    assert_int_equal(engine_st_file_find(file, "b")->data_offset, 6);
    engine_st_file_close(file);
}

static void test_duplicate_names_are_rejected(void **state)
{
    (void)state;
    expect_header_fails("dup.safetensors",
                        "{\"layers.1.w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                        "\"layers.1.w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
                        2, TDM_ERR_FORMAT, "duplicate object key near '\"layers.1.w\"'");
}

static void test_bad_metadata_is_rejected(void **state)
{
    (void)state;
    expect_header_fails("meta_str.safetensors", "{\"__metadata__\":\"x\"}", 0, TDM_ERR_FORMAT,
                        "__metadata__");
    expect_header_fails("meta_num.safetensors", "{\"__metadata__\":{\"k\":1}}", 0, TDM_ERR_FORMAT,
                        "\"k\"");
    expect_header_fails("meta_nul.safetensors", "{\"__metadata__\":{\"k\":\"a\\u0000b\"}}", 0,
                        TDM_ERR_FORMAT, "\"k\"");
}

/* Every prefix of a valid file: the length field, the header and some data offsets. */
static void test_truncation_anywhere_is_an_error_never_a_crash(void **state)
{
    char path[PATH_BYTES];
    char cut_path[PATH_BYTES];
    uint8_t *bytes;
    size_t n_bytes;
    uint64_t header_bytes = 0;
    size_t data_start;
    (void)state;

    tmp_path("trunc_src.safetensors", path);
    tmp_path("trunc_cut.safetensors", cut_path);
    write_sample(path, 0);
    bytes = fu_read_bytes(path, &n_bytes);
    for (int i = 0; i < 8; i++) {
        header_bytes |= (uint64_t)bytes[i] << (8 * i);
    }
    data_start = 8 + (size_t)header_bytes;

    /* plain truncation at every length short of the end */
    for (size_t n = 0; n < n_bytes; n++) {
        if (n > data_start && n % 3 != 0 && n != n_bytes - 1) {
            continue; /* data offsets: every third is enough */
        }
        fu_write_bytes(cut_path, bytes, n);
        expect_open_fails(cut_path, TDM_ERR_FORMAT, NULL);
    }

    /* header cut at every byte with the length field rewritten to match */
    for (size_t k = 0; k < header_bytes; k++) {
        uint8_t *cut = malloc(8 + k + 1);
        engine_st_file_t *file = NULL;
        char err[ERR_BYTES] = "";
        tdm_status_t status;
        assert_non_null(cut);
        for (int b = 0; b < 8; b++) {
            cut[b] = (uint8_t)((uint64_t)k >> (8 * b));
        }
        memcpy(cut + 8, bytes + 8, k);
        fu_write_bytes(cut_path, cut, 8 + k);
        free(cut);
        status = engine_st_file_open(cut_path, &file, err, sizeof(err));
        if (status == TDM_OK) {
            /* only a cut inside the trailing padding parses, and then offsets are past the end */
            fail_msg("header cut at %zu parsed", k);
        }
        assert_non_null(strstr(err, cut_path));
    }
    free(bytes);
}

/* xorshift64 for reproducible corruption. */
static uint64_t next_random(uint64_t *state)
{
    uint64_t x = *state;

    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    return x;
}

static void test_random_header_byte_flips_never_crash(void **state)
{
    char path[PATH_BYTES];
    char flip_path[PATH_BYTES];
    uint8_t *bytes;
    uint8_t *copy;
    size_t n_bytes;
    uint64_t header_bytes = 0;
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    size_t n_ok = 0;
    uint64_t sum = 0;
    (void)state;

    tmp_path("flip_src.safetensors", path);
    tmp_path("flip.safetensors", flip_path);
    write_sample(path, 0);
    bytes = fu_read_bytes(path, &n_bytes);
    copy = malloc(n_bytes);
    assert_non_null(copy);
    for (int i = 0; i < 8; i++) {
        header_bytes |= (uint64_t)bytes[i] << (8 * i);
    }
    for (int trial = 0; trial < N_FLIP_TRIALS; trial++) {
        engine_st_file_t *file = NULL;
        char err[ERR_BYTES] = "";
        int n_flips = 1 + (int)(next_random(&rng) % 3);
        memcpy(copy, bytes, n_bytes);
        for (int f = 0; f < n_flips; f++) {
            size_t at = (size_t)(next_random(&rng) % (8 + header_bytes));
            if (next_random(&rng) % 2 == 0) {
                copy[at] ^= (uint8_t)(1u << (next_random(&rng) % 8));
            } else {
                /* structural characters hurt the parser more than random bits */
                static const char pick[] = "{}[],:\"0123456789-.e \\";
                copy[at] = (uint8_t)pick[next_random(&rng) % (sizeof(pick) - 1)];
            }
        }
        fu_write_bytes(flip_path, copy, n_bytes);
        if (engine_st_file_open(flip_path, &file, err, sizeof(err)) == TDM_OK) {
            sum += touch_all(file);
            n_ok++;
            engine_st_file_close(file);
        } else {
            assert_true(err[0] != '\0');
        }
    }
    print_message("%zu of %d corrupted headers still parsed (checksum %llu)\n", n_ok, N_FLIP_TRIALS,
                  (unsigned long long)sum);
    free(copy);
    free(bytes);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_preserves_tensors_and_metadata),
        cmocka_unit_test(test_copy_resident_moves_every_tensor_into_aligned_memory),
        cmocka_unit_test(test_writer_output_is_deterministic_and_matches_the_spec_layout),
        cmocka_unit_test(test_rewrite_of_a_read_file_is_byte_identical),
        cmocka_unit_test(test_empty_file_without_tensors_round_trips),
        cmocka_unit_test(test_writer_handles_100_megabytes),
        cmocka_unit_test(test_writer_rejects_bad_input_and_changes_nothing),
        cmocka_unit_test(test_writer_refuses_duplicate_names_and_writes_no_file),
        cmocka_unit_test(test_writer_finish_into_a_missing_directory_is_an_io_error),
        cmocka_unit_test(test_open_missing_file_and_directory_fail),
        cmocka_unit_test(test_file_shorter_than_length_field_is_rejected),
        cmocka_unit_test(test_header_length_past_end_or_over_limit_is_rejected),
        cmocka_unit_test(test_header_not_json_or_not_object_is_rejected),
        cmocka_unit_test(test_bad_tensor_entries_are_rejected_naming_the_tensor),
        cmocka_unit_test(test_unknown_dtype_is_unsupported),
        cmocka_unit_test(test_bad_shapes_are_rejected),
        cmocka_unit_test(test_bad_data_offsets_are_rejected),
        cmocka_unit_test(test_byte_count_must_match_shape_without_overflow),
        cmocka_unit_test(test_overlapping_tensors_are_rejected),
        cmocka_unit_test(test_gaps_empty_tensors_and_unknown_keys_are_accepted),
        cmocka_unit_test(test_duplicate_names_are_rejected),
        cmocka_unit_test(test_bad_metadata_is_rejected),
        cmocka_unit_test(test_truncation_anywhere_is_an_error_never_a_crash),
        cmocka_unit_test(test_random_header_byte_flips_never_crash),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
