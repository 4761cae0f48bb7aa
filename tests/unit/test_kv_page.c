/* test_kv_page.c - KV page layout, header bytes, row round trips, seal and check
 * (kernels/kv_page.h, MODEL.md section 7). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/hash.h"
#include "common/status.h"
#include "kernels/codec.h"
#include "kernels/kv_page.h"

#define FULL_D          512
#define FULL_D_I        128
#define FULL_PAGE       22848
#define LOG_CAPTURE_MAX 4096

static const kern_kv_page_params_t full_params = {
    .source_layer = 20,
    .first_row = 0x0102030405060740ull, /* a multiple of 64 */
    .ratio = 1,
    .d = FULL_D,
    .d_I = FULL_D_I,
    .fingerprint = 0x1122334455667788ull,
};

/* ---- stderr capture: check that a failure's log line names the field --------------------- */

typedef struct {
    FILE *file;
    int saved_fd;
    char text[LOG_CAPTURE_MAX];
} capture_t;

static void capture_begin(capture_t *cap)
{
    fflush(stderr);
    cap->file = tmpfile();
    assert_non_null(cap->file);
    cap->saved_fd = dup(STDERR_FILENO);
    assert_true(cap->saved_fd >= 0);
    assert_true(dup2(fileno(cap->file), STDERR_FILENO) >= 0);
}

static void capture_end(capture_t *cap)
{
    size_t n;

    fflush(stderr);
    assert_true(dup2(cap->saved_fd, STDERR_FILENO) >= 0);
    close(cap->saved_fd);
    rewind(cap->file);
    n = fread(cap->text, 1, sizeof(cap->text) - 1, cap->file);
    cap->text[n] = '\0';
    fclose(cap->file);
    fputs(cap->text, stderr); /* keep it visible in the test output */
}

/* Runs kern_kv_page_check and asserts its status and that its log line contains `needle`. */
static void check_fails(const uint8_t *page, size_t page_bytes,
                        const kern_kv_page_params_t *expected, int check_checksum,
                        tdm_status_t want, const char *needle)
{
    capture_t cap;
    tdm_status_t got;

    capture_begin(&cap);
    got = kern_kv_page_check(page, page_bytes, expected, check_checksum);
    capture_end(&cap);
    assert_int_equal(got, want);
    if (strstr(cap.text, needle) == NULL) {
        fail_msg("log line does not name %s: %s", needle, cap.text);
    }
}

static uint8_t *new_full_page(void)
{
    uint8_t *page = malloc(FULL_PAGE);

    assert_non_null(page);
    assert_int_equal(kern_kv_page_init(page, FULL_PAGE, &full_params), TDM_OK);
    return page;
}

/* ---- layout ------------------------------------------------------------------------------ */

static void test_layout_full_size_matches_model_md(void **state)
{
    kern_kv_page_layout_t layout;
    (void)state;

    assert_int_equal(kern_kv_page_layout(FULL_D, FULL_D_I, &layout), TDM_OK);
    /* 64 + 64*256 = 16448; + 64*32 = 18496; + 64*64 = 22592; + 64*4 = 22848 */
    assert_int_equal(layout.main_codes_offset, 64);
    assert_int_equal(layout.main_scales_offset, 16448);
    assert_int_equal(layout.index_codes_offset, 18496);
    assert_int_equal(layout.index_scales_offset, 22592);
    assert_int_equal(layout.page_bytes, FULL_PAGE);
    assert_int_equal(layout.main_codes_row_bytes, 256);
    assert_int_equal(layout.main_scales_row_bytes, 32);
    assert_int_equal(layout.index_codes_row_bytes, 64);
    assert_int_equal(layout.index_scales_row_bytes, 4);
    /* 356 B per row (MODEL.md 7) */
    assert_int_equal(layout.main_codes_row_bytes + layout.main_scales_row_bytes +
                         layout.index_codes_row_bytes + layout.index_scales_row_bytes,
                     356);
}

static void test_layout_tiny(void **state)
{
    kern_kv_page_layout_t layout;
    (void)state;

    /* d = 64, d_I = 32: 64 + 64*32 = 2112; + 64*4 = 2368; + 64*16 = 3392; + 64*1 = 3456 */
    assert_int_equal(kern_kv_page_layout(64, 32, &layout), TDM_OK);
    assert_int_equal(layout.main_codes_offset, 64);
    assert_int_equal(layout.main_scales_offset, 2112);
    assert_int_equal(layout.index_codes_offset, 2368);
    assert_int_equal(layout.index_scales_offset, 3392);
    assert_int_equal(layout.page_bytes, 3456);
    /* d_I = 0: no index regions */
    assert_int_equal(kern_kv_page_layout(16, 0, &layout), TDM_OK);
    assert_int_equal(layout.main_scales_offset, 64 + 64 * 8);
    assert_int_equal(layout.index_codes_offset, 64 + 64 * 8 + 64);
    assert_int_equal(layout.page_bytes, 64 + 64 * 8 + 64);
}

static void test_layout_rejects_bad_dims(void **state)
{
    kern_kv_page_layout_t layout;
    kern_kv_page_layout_t before;
    (void)state;

    memset(&layout, 0x5A, sizeof(layout));
    before = layout;
    assert_int_equal(kern_kv_page_layout(0, 32, &layout), TDM_ERR_INVALID_ARG);
    assert_int_equal(kern_kv_page_layout(24, 32, &layout), TDM_ERR_INVALID_ARG);
    assert_int_equal(kern_kv_page_layout(64, 48, &layout), TDM_ERR_INVALID_ARG);
    assert_int_equal(kern_kv_page_layout(65536, 32, &layout), TDM_ERR_INVALID_ARG);
    assert_int_equal(kern_kv_page_layout(64, 32, NULL), TDM_ERR_INVALID_ARG);
    assert_memory_equal(&layout, &before, sizeof(layout));
}

/* The header-only pair the router uses (kern_kv_page_dims_valid, kern_kv_page_layout_of) agrees
 * with the checked kern_kv_page_layout on every dims pair around the limits. */
static void test_layout_of_matches_checked_layout(void **state)
{
    static const uint32_t dims[] = {0, 16, 24, 32, 48, 64, 128, 512, 65520, 65535, 65536};
    (void)state;

    for (size_t i = 0; i < sizeof(dims) / sizeof(dims[0]); i++) {
        for (size_t j = 0; j < sizeof(dims) / sizeof(dims[0]); j++) {
            kern_kv_page_layout_t checked;
            kern_kv_page_layout_t pure;
            int valid = kern_kv_page_dims_valid(dims[i], dims[j]);

            assert_int_equal(kern_kv_page_layout(dims[i], dims[j], &checked),
                             valid ? TDM_OK : TDM_ERR_INVALID_ARG);
            if (valid) {
                pure = kern_kv_page_layout_of(dims[i], dims[j]);
                assert_memory_equal(&pure, &checked, sizeof(pure));
            }
        }
    }
}

static void test_geometry_and_page_count(void **state)
{
    kern_kv_geometry_t geometry;
    kern_kv_geometry_t before;
    (void)state;

    assert_int_equal(kern_kv_geometry(FULL_D, FULL_D_I, 2, &geometry), TDM_OK);
    assert_int_equal(geometry.rows_per_page, 64);
    assert_int_equal(geometry.page_bytes, FULL_PAGE);
    assert_int_equal(geometry.tokens_per_block, 128);
    assert_int_equal(kern_kv_geometry(64, 32, 1, &geometry), TDM_OK);
    assert_int_equal(geometry.page_bytes, 3456);
    assert_int_equal(geometry.tokens_per_block, 64);
    memset(&geometry, 0x5A, sizeof(geometry));
    before = geometry;
    assert_int_equal(kern_kv_geometry(24, 32, 1, &geometry), TDM_ERR_INVALID_ARG);
    assert_int_equal(kern_kv_geometry(64, 32, 0, &geometry), TDM_ERR_INVALID_ARG);
    assert_int_equal(kern_kv_geometry(64, 32, UINT32_MAX, &geometry), TDM_ERR_INVALID_ARG);
    assert_int_equal(kern_kv_geometry(64, 32, 1, NULL), TDM_ERR_INVALID_ARG);
    assert_memory_equal(&geometry, &before, sizeof(geometry));

    assert_int_equal(kern_kv_page_count(-5), 0);
    assert_int_equal(kern_kv_page_count(0), 0);
    assert_int_equal(kern_kv_page_count(1), 1);
    assert_int_equal(kern_kv_page_count(64), 1);
    assert_int_equal(kern_kv_page_count(65), 2);
    assert_int_equal(kern_kv_page_count(128), 2);
}

/* ---- header ------------------------------------------------------------------------------ */

static void test_init_writes_header_byte_by_byte(void **state)
{
    static const uint8_t zeros[FULL_PAGE - 64];
    uint8_t want[64] = {
        'T',  'D',  'K',  'V',                          /* 0: magic */
        0x01, 0x00,                                     /* 4: format_version 1 */
        0x14, 0x00,                                     /* 6: source_layer 20 */
        0x40, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, /* 8: first_row */
        0x00, 0x00,                                     /* 16: row_count 0 */
        0x40, 0x00,                                     /* 18: rows_per_page 64 */
        0x01,                                           /* 20: ratio 1 */
        0x00,                                           /* 21: flags */
        0x00, 0x02,                                     /* 22: d 512 */
        0x80, 0x00,                                     /* 24: d_I 128 */
        0,    0,    0,    0,    0,    0,                /* 26: zero */
        0,    0,    0,    0,    0,    0,    0,    0,    /* 32: checksum, filled below */
        0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, /* 40: fingerprint */
        0,    0,    0,    0,    0,    0,    0,    0,    0, 0, 0, 0, 0, 0, 0, 0, /* 48: zero */
    };
    uint64_t checksum = tdm_hash_xxh3_64(zeros, sizeof(zeros));
    uint8_t *page = malloc(FULL_PAGE + 16);
    kern_kv_page_header_t header;
    (void)state;

    assert_non_null(page);
    memset(page, 0xEE, FULL_PAGE + 16);
    assert_int_equal(kern_kv_page_init(page, FULL_PAGE + 16, &full_params), TDM_OK);
    for (int i = 0; i < 8; i++) {
        want[32 + i] = (uint8_t)(checksum >> (8 * i));
    }
    for (int i = 0; i < 64; i++) {
        if (page[i] != want[i]) {
            fail_msg("header byte %d: got 0x%02x want 0x%02x", i, page[i], want[i]);
        }
    }
    assert_memory_equal(page + 64, zeros, sizeof(zeros));
    assert_int_equal(page[FULL_PAGE], 0); /* the whole buffer is zeroed */
    assert_int_equal(kern_kv_page_check(page, FULL_PAGE, &full_params, KERN_KV_PAGE_CHECK_CHECKSUM),
                     TDM_OK);
    assert_int_equal(kern_kv_page_header_read(page, FULL_PAGE, &header), TDM_OK);
    assert_int_equal(header.first_row, full_params.first_row);
    assert_int_equal(header.checksum, checksum);
    free(page);
}

static void test_init_rejects_bad_params_and_leaves_page_untouched(void **state)
{
    uint8_t *page = malloc(FULL_PAGE);
    uint8_t *copy = malloc(FULL_PAGE);
    kern_kv_page_params_t params = full_params;
    (void)state;

    assert_non_null(page);
    assert_non_null(copy);
    memset(page, 0xEE, FULL_PAGE);
    memcpy(copy, page, FULL_PAGE);
    assert_int_equal(kern_kv_page_init(page, FULL_PAGE - 1, &params), TDM_ERR_INVALID_ARG);
    params.first_row = 65;
    assert_int_equal(kern_kv_page_init(page, FULL_PAGE, &params), TDM_ERR_INVALID_ARG);
    params = full_params;
    params.ratio = 0;
    assert_int_equal(kern_kv_page_init(page, FULL_PAGE, &params), TDM_ERR_INVALID_ARG);
    params = full_params;
    params.d = 100;
    assert_int_equal(kern_kv_page_init(page, FULL_PAGE, &params), TDM_ERR_INVALID_ARG);
    assert_int_equal(kern_kv_page_init(NULL, FULL_PAGE, &full_params), TDM_ERR_INVALID_ARG);
    assert_int_equal(kern_kv_page_init(page, FULL_PAGE, NULL), TDM_ERR_INVALID_ARG);
    assert_memory_equal(page, copy, FULL_PAGE);
    free(copy);
    free(page);
}

/* ---- rows -------------------------------------------------------------------------------- */

static void fill_pattern(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) {
        p[i] = (uint8_t)(seed * 31u + i * 7u + 1u);
    }
}

/* One row's records: main codes and scales, index codes and scales. */
typedef struct {
    uint8_t main_codes[256], main_scales[32], index_codes[64], index_scales[4];
} row_t;

/* The pattern row of `slot`: each record from its own seed. */
static void fill_row(row_t *row, uint32_t slot)
{
    fill_pattern(row->main_codes, sizeof(row->main_codes), slot);
    fill_pattern(row->main_scales, sizeof(row->main_scales), slot + 100);
    fill_pattern(row->index_codes, sizeof(row->index_codes), slot + 200);
    fill_pattern(row->index_scales, sizeof(row->index_scales), slot + 300);
}

static void test_rows_round_trip_and_row_count_grows(void **state)
{
    uint8_t *page = new_full_page();
    row_t want;
    row_t got;
    static const uint32_t slots[] = {5, 0, 63};
    kern_kv_page_header_t header;
    (void)state;

    for (size_t k = 0; k < 3; k++) {
        fill_row(&want, slots[k]);
        assert_int_equal(kern_kv_page_write_row(page, slots[k], want.main_codes, want.main_scales,
                                                want.index_codes, want.index_scales),
                         TDM_OK);
        assert_int_equal(kern_kv_page_header_read(page, FULL_PAGE, &header), TDM_OK);
        assert_int_equal(header.row_count, k == 0 ? 6 : (k == 1 ? 6 : 64));
        assert_int_equal(header.flags, KERN_KV_PAGE_FLAG_STALE);
    }
    for (size_t k = 0; k < 3; k++) {
        fill_row(&want, slots[k]);
        assert_int_equal(kern_kv_page_read_row(page, slots[k], got.main_codes, got.main_scales,
                                               got.index_codes, got.index_scales),
                         TDM_OK);
        assert_memory_equal(got.main_codes, want.main_codes, sizeof(want.main_codes));
        assert_memory_equal(got.main_scales, want.main_scales, sizeof(want.main_scales));
        assert_memory_equal(got.index_codes, want.index_codes, sizeof(want.index_codes));
        assert_memory_equal(got.index_scales, want.index_scales, sizeof(want.index_scales));
    }
    /* records land at offset + slot * row_bytes: slot 5's first main scale byte */
    assert_int_equal(page[16448 + 5 * 32], (uint8_t)(105u * 31u + 1u));
    /* an unwritten slot below row_count reads as zeros */
    assert_int_equal(kern_kv_page_read_row(page, 1, got.main_codes, got.main_scales,
                                           got.index_codes, got.index_scales),
                     TDM_OK);
    memset(want.main_codes, 0, sizeof(want.main_codes));
    assert_memory_equal(got.main_codes, want.main_codes, sizeof(want.main_codes));
    free(page);
}

/* Rows copied into their regions plus kern_kv_page_mark_rows on a copy of the header (the
 * device writer's path) give the bytes of kern_kv_page_write_row on each slot; the header alone
 * is enough, and a bad call changes nothing. */
static void test_mark_rows_equals_write_row(void **state)
{
    uint8_t *direct = new_full_page();
    uint8_t *copied = new_full_page();
    kern_kv_page_layout_t ly = kern_kv_page_layout_of(FULL_D, FULL_D_I);
    uint8_t header[KERN_KV_PAGE_HEADER_BYTES];
    uint8_t before[KERN_KV_PAGE_HEADER_BYTES];
    row_t row;
    /* slots 3..9, then 0..1: row_count must stay 10 after the second run */
    static const uint32_t runs[2][2] = {{3, 7}, {0, 2}};
    (void)state;

    for (int r = 0; r < 2; r++) {
        for (uint32_t s = runs[r][0]; s < runs[r][0] + runs[r][1]; s++) {
            fill_row(&row, s);
            assert_int_equal(kern_kv_page_write_row(direct, s, row.main_codes, row.main_scales,
                                                    row.index_codes, row.index_scales),
                             TDM_OK);
            memcpy(copied + ly.main_codes_offset + s * ly.main_codes_row_bytes, row.main_codes,
                   ly.main_codes_row_bytes);
            memcpy(copied + ly.main_scales_offset + s * ly.main_scales_row_bytes, row.main_scales,
                   ly.main_scales_row_bytes);
            memcpy(copied + ly.index_codes_offset + s * ly.index_codes_row_bytes, row.index_codes,
                   ly.index_codes_row_bytes);
            memcpy(copied + ly.index_scales_offset + s * ly.index_scales_row_bytes,
                   row.index_scales, ly.index_scales_row_bytes);
        }
        memcpy(header, copied, sizeof(header));
        assert_int_equal(kern_kv_page_mark_rows(header, runs[r][0] + runs[r][1]), TDM_OK);
        memcpy(copied, header, sizeof(header));
    }
    assert_memory_equal(copied, direct, FULL_PAGE);
    assert_int_equal(copied[16], 10); /* row_count */
    assert_int_equal(copied[21], KERN_KV_PAGE_FLAG_STALE);

    memcpy(before, header, sizeof(header));
    assert_int_equal(kern_kv_page_mark_rows(header, 0), TDM_ERR_INVALID_ARG);
    assert_int_equal(kern_kv_page_mark_rows(header, 65), TDM_ERR_INVALID_ARG);
    assert_int_equal(kern_kv_page_mark_rows(NULL, 1), TDM_ERR_INVALID_ARG);
    assert_memory_equal(header, before, sizeof(header));
    header[0] ^= 0xffu; /* no magic: not a page */
    memcpy(before, header, sizeof(header));
    assert_int_equal(kern_kv_page_mark_rows(header, 1), TDM_ERR_INVALID_ARG);
    assert_memory_equal(header, before, sizeof(header));
    free(copied);
    free(direct);
}

static void test_row_errors_change_nothing(void **state)
{
    uint8_t *page = new_full_page();
    uint8_t *copy = malloc(FULL_PAGE);
    uint8_t rec[256] = {0};
    uint8_t out[256];
    uint8_t out_before[256];
    float main_row[FULL_D] = {0};
    float out_f[FULL_D];
    (void)state;

    assert_non_null(copy);
    memcpy(copy, page, FULL_PAGE);
    memset(out, 0x77, sizeof(out));
    memcpy(out_before, out, sizeof(out));
    assert_int_equal(kern_kv_page_write_row(page, 64, rec, rec, rec, rec), TDM_ERR_INVALID_ARG);
    assert_int_equal(kern_kv_page_write_row(page, 0, NULL, rec, rec, rec), TDM_ERR_INVALID_ARG);
    assert_int_equal(kern_kv_page_write_row(page, 0, rec, rec, NULL, rec), TDM_ERR_INVALID_ARG);
    assert_int_equal(kern_kv_page_encode_row(page, 64, main_row, main_row), TDM_ERR_INVALID_ARG);
    assert_int_equal(kern_kv_page_encode_row(page, 0, main_row, NULL), TDM_ERR_INVALID_ARG);
    assert_memory_equal(page, copy, FULL_PAGE);
    /* reads beyond row_count (0 here) */
    assert_int_equal(kern_kv_page_read_row(page, 0, out, out, out, out), TDM_ERR_INVALID_ARG);
    assert_int_equal(kern_kv_page_decode_row(page, 0, out_f, out_f), TDM_ERR_INVALID_ARG);
    assert_memory_equal(out, out_before, sizeof(out));
    /* a buffer that is not a page */
    memset(copy, 0, FULL_PAGE);
    assert_int_equal(kern_kv_page_write_row(copy, 0, rec, rec, rec, rec), TDM_ERR_INVALID_ARG);
    assert_int_equal(kern_kv_page_seal(copy), TDM_ERR_INVALID_ARG);
    assert_int_equal(kern_kv_page_seal(NULL), TDM_ERR_INVALID_ARG);
    free(copy);
    free(page);
}

static void test_encode_decode_matches_quantizers(void **state)
{
    uint8_t *page = new_full_page();
    float main_row[FULL_D], index_key[FULL_D_I];
    float main_out[FULL_D], index_out[FULL_D_I];
    float main_want[FULL_D], index_want[FULL_D_I];
    uint8_t codes[256], scales[32], index_codes[64], index_scales[4];
    uint8_t got_codes[256], got_scales[32], got_index_codes[64], got_index_scales[4];
    uint64_t seed = 11;
    (void)state;

    for (uint32_t slot = 0; slot < 64; slot += 9) {
        for (int i = 0; i < FULL_D; i++) {
            main_row[i] = (float)((int64_t)(tdm_hash_splitmix64(seed++) % 20001) - 10000) / 997.0f;
        }
        for (int i = 0; i < FULL_D_I; i++) {
            index_key[i] = (float)((int64_t)(tdm_hash_splitmix64(seed++) % 2001) - 1000) / 313.0f;
        }
        assert_int_equal(kern_kv_page_encode_row(page, slot, main_row, index_key), TDM_OK);
        assert_int_equal(kern_quant_ckv_cpu(NULL, main_row, 1, FULL_D, codes, scales), TDM_OK);
        assert_int_equal(
            kern_quant_mx4_cpu(NULL, index_key, 1, FULL_D_I, index_codes, index_scales), TDM_OK);
        assert_int_equal(kern_kv_page_read_row(page, slot, got_codes, got_scales, got_index_codes,
                                               got_index_scales),
                         TDM_OK);
        assert_memory_equal(got_codes, codes, sizeof(codes));
        assert_memory_equal(got_scales, scales, sizeof(scales));
        assert_memory_equal(got_index_codes, index_codes, sizeof(index_codes));
        assert_memory_equal(got_index_scales, index_scales, sizeof(index_scales));
        assert_int_equal(kern_kv_page_decode_row(page, slot, main_out, index_out), TDM_OK);
        assert_int_equal(kern_dequant_ckv_cpu(NULL, codes, scales, 1, FULL_D, main_want), TDM_OK);
        assert_int_equal(
            kern_dequant_mx4_cpu(NULL, index_codes, index_scales, 1, FULL_D_I, index_want), TDM_OK);
        assert_memory_equal(main_out, main_want, sizeof(main_want));
        assert_memory_equal(index_out, index_want, sizeof(index_want));
    }
    assert_int_equal(kern_kv_page_seal(page), TDM_OK);
    assert_int_equal(kern_kv_page_check(page, FULL_PAGE, &full_params, KERN_KV_PAGE_CHECK_CHECKSUM),
                     TDM_OK);
    free(page);
}

static void test_page_without_index_key(void **state)
{
    kern_kv_page_params_t params = {
        .source_layer = 2, .first_row = 128, .ratio = 2, .d = 32, .d_I = 0, .fingerprint = 9};
    kern_kv_page_layout_t layout;
    float row[32];
    float out[32];
    uint8_t *page;
    (void)state;

    assert_int_equal(kern_kv_page_layout(32, 0, &layout), TDM_OK);
    page = malloc(layout.page_bytes);
    assert_non_null(page);
    for (int i = 0; i < 32; i++) {
        row[i] = (float)(i - 16) / 4.0f;
    }
    assert_int_equal(kern_kv_page_init(page, layout.page_bytes, &params), TDM_OK);
    assert_int_equal(kern_kv_page_encode_row(page, 3, row, NULL), TDM_OK);
    assert_int_equal(kern_kv_page_decode_row(page, 3, out, NULL), TDM_OK);
    /* amax 4 -> fl(4/6) = 0.6667 -> E4M3 0.6875 (1.375 * 2^-1); -4 / 0.6875 = -5.82 -> -6;
     * dequantized -6 * 0.6875 = -4.125 */
    assert_true(out[0] == -4.125f);
    assert_int_equal(kern_kv_page_seal(page), TDM_OK);
    assert_int_equal(
        kern_kv_page_check(page, layout.page_bytes, &params, KERN_KV_PAGE_CHECK_CHECKSUM), TDM_OK);
    free(page);
}

/* ---- seal and check ---------------------------------------------------------------------- */

static void test_checksum_detects_a_flipped_byte_and_a_stale_page(void **state)
{
    uint8_t *page = new_full_page();
    float row[FULL_D] = {1.0f, -2.0f};
    float key[FULL_D_I] = {0.5f};
    (void)state;

    assert_int_equal(kern_kv_page_encode_row(page, 7, row, key), TDM_OK);
    /* written but not sealed: the header still checks, the checksum does not */
    assert_int_equal(kern_kv_page_check(page, FULL_PAGE, &full_params, KERN_KV_PAGE_CHECK_HEADER),
                     TDM_OK);
    check_fails(page, FULL_PAGE, &full_params, KERN_KV_PAGE_CHECK_CHECKSUM, TDM_ERR_MISMATCH,
                "field=checksum stale");
    assert_int_equal(kern_kv_page_seal(page), TDM_OK);
    assert_int_equal(page[21], 0); /* stale flag cleared */
    assert_int_equal(kern_kv_page_check(page, FULL_PAGE, &full_params, KERN_KV_PAGE_CHECK_CHECKSUM),
                     TDM_OK);
    /* flip one bit in each region and in the last byte */
    static const size_t offsets[] = {64, 16448 + 7 * 32, 18496 + 100, 22592 + 3, FULL_PAGE - 1};
    for (size_t i = 0; i < sizeof(offsets) / sizeof(offsets[0]); i++) {
        page[offsets[i]] ^= 0x10;
        check_fails(page, FULL_PAGE, &full_params, KERN_KV_PAGE_CHECK_CHECKSUM, TDM_ERR_MISMATCH,
                    "field=checksum");
        assert_int_equal(
            kern_kv_page_check(page, FULL_PAGE, &full_params, KERN_KV_PAGE_CHECK_HEADER), TDM_OK);
        page[offsets[i]] ^= 0x10;
        assert_int_equal(
            kern_kv_page_check(page, FULL_PAGE, &full_params, KERN_KV_PAGE_CHECK_CHECKSUM), TDM_OK);
    }
    /* a corrupted stored checksum */
    page[33] ^= 0x01;
    check_fails(page, FULL_PAGE, NULL, KERN_KV_PAGE_CHECK_CHECKSUM, TDM_ERR_MISMATCH,
                "field=checksum");
    free(page);
}

typedef struct {
    size_t offset; /* header byte to change */
    uint8_t value;
    tdm_status_t want;
    const char *field;
} corruption_t;

static void test_each_check_failure_returns_its_status_and_names_the_field(void **state)
{
    static const corruption_t corruptions[] = {
        {0, 'X', TDM_ERR_FORMAT, "field=magic"},
        {4, 2, TDM_ERR_FORMAT, "field=version"},
        {16, 65, TDM_ERR_FORMAT, "field=row_count"},
        {18, 32, TDM_ERR_FORMAT, "field=rows_per_page"},
        {21, 0x80, TDM_ERR_FORMAT, "field=flags"},
        {27, 1, TDM_ERR_FORMAT, "field=reserved"},
        {63, 1, TDM_ERR_FORMAT, "field=reserved"},
        {22, 0x08, TDM_ERR_FORMAT, "field=d "},  /* d = 0x208 = 520: not a multiple of 16 */
        {24, 0x90, TDM_ERR_FORMAT, "field=d_I"}, /* d_I = 144: not a multiple of 32 */
        {6, 21, TDM_ERR_MISMATCH, "field=source_layer"},
        {8, 0x80, TDM_ERR_MISMATCH, "field=first_row"},
        {20, 2, TDM_ERR_MISMATCH, "field=ratio"},
        {23, 0x01, TDM_ERR_MISMATCH, "field=d "},  /* d = 256: valid, but not the expected */
        {24, 0x40, TDM_ERR_MISMATCH, "field=d_I"}, /* d_I = 64 */
        {40, 0x89, TDM_ERR_MISMATCH, "field=fingerprint"},
    };
    uint8_t *page = new_full_page();
    uint8_t *copy = malloc(FULL_PAGE);
    (void)state;

    assert_non_null(copy);
    for (size_t i = 0; i < sizeof(corruptions) / sizeof(corruptions[0]); i++) {
        memcpy(copy, page, FULL_PAGE);
        copy[corruptions[i].offset] = corruptions[i].value;
        check_fails(copy, FULL_PAGE, &full_params, KERN_KV_PAGE_CHECK_CHECKSUM, corruptions[i].want,
                    corruptions[i].field);
        assert_memory_equal(copy + 64, page + 64, FULL_PAGE - 64); /* check only reads */
    }
    /* truncated: shorter than the header, shorter than the page its dims describe */
    check_fails(page, 63, &full_params, KERN_KV_PAGE_CHECK_HEADER, TDM_ERR_FORMAT,
                "field=page_bytes truncated");
    check_fails(page, FULL_PAGE - 1, &full_params, KERN_KV_PAGE_CHECK_HEADER, TDM_ERR_FORMAT,
                "field=page_bytes truncated");
    /* identity checks are skipped without expected params */
    memcpy(copy, page, FULL_PAGE);
    copy[6] = 3;
    assert_int_equal(kern_kv_page_check(copy, FULL_PAGE, NULL, KERN_KV_PAGE_CHECK_CHECKSUM),
                     TDM_OK);
    assert_int_equal(kern_kv_page_check(NULL, FULL_PAGE, NULL, KERN_KV_PAGE_CHECK_HEADER),
                     TDM_ERR_INVALID_ARG);
    /* the reader's own expected identity must describe a valid page */
    kern_kv_page_params_t bad_expected = full_params;
    bad_expected.d = 24;
    assert_int_equal(kern_kv_page_check(page, FULL_PAGE, &bad_expected, KERN_KV_PAGE_CHECK_HEADER),
                     TDM_ERR_INVALID_ARG);
    kern_kv_page_header_t header;
    memset(&header, 0x5A, sizeof(header));
    kern_kv_page_header_t header_before = header;
    assert_int_equal(kern_kv_page_header_read(page, FULL_PAGE, NULL), TDM_ERR_INVALID_ARG);
    assert_int_equal(kern_kv_page_header_read(copy, 10, &header), TDM_ERR_FORMAT);
    assert_memory_equal(&header, &header_before, sizeof(header));
    free(copy);
    free(page);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_full_size_matches_model_md),
        cmocka_unit_test(test_layout_tiny),
        cmocka_unit_test(test_layout_rejects_bad_dims),
        cmocka_unit_test(test_geometry_and_page_count),
        cmocka_unit_test(test_layout_of_matches_checked_layout),
        cmocka_unit_test(test_init_writes_header_byte_by_byte),
        cmocka_unit_test(test_init_rejects_bad_params_and_leaves_page_untouched),
        cmocka_unit_test(test_rows_round_trip_and_row_count_grows),
        cmocka_unit_test(test_mark_rows_equals_write_row),
        cmocka_unit_test(test_row_errors_change_nothing),
        cmocka_unit_test(test_encode_decode_matches_quantizers),
        cmocka_unit_test(test_page_without_index_key),
        cmocka_unit_test(test_checksum_detects_a_flipped_byte_and_a_stale_page),
        cmocka_unit_test(test_each_check_failure_returns_its_status_and_names_the_field),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
