/* test_transfer_notice.c - the completion notice wire form and page check (transfer/notice.h).
 * No UCX: frames are bytes here; the two-process delivery is in test_transfer.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/hash.h"
#include "transfer/notice.h"

#define PAGE_BYTES 192u
#define POOL_PAGES 16u

static const uint32_t PAGES[3] = {5, 0, 15};
static const char PAYLOAD[] = "state record";

static xfer_notice_frame_t sample(const uint64_t *checksums)
{
    xfer_notice_frame_t frame;

    memset(&frame, 0, sizeof(frame));
    frame.job_id = 0xabcdef0123ULL;
    frame.sender_name = "prefill-2";
    frame.sender_incarnation_id = 41;
    frame.receiver_incarnation_id = 42;
    frame.receiver_pool_id = 3;
    frame.n_pages = 3;
    frame.pages = PAGES;
    frame.checksums = checksums;
    frame.payload = PAYLOAD;
    frame.payload_bytes = sizeof(PAYLOAD);
    return frame;
}

static void test_notice_round_trips(void **state)
{
    uint64_t checksums[3] = {1, 2, 0xffffffffffffffffULL};
    xfer_notice_frame_t frame = sample(checksums);
    xfer_notice_view_t view;
    uint8_t buf[512];
    size_t n = 0;

    (void)state;
    assert_int_equal(xfer_notice_encode(&frame, buf, sizeof(buf), &n), TDM_OK);
    assert_int_equal(n, xfer_notice_encoded_bytes(3, sizeof(PAYLOAD)));
    assert_int_equal(n, XFER_NOTICE_HEADER_BYTES + 3 * 12 + sizeof(PAYLOAD) + 8);
    assert_int_equal(xfer_notice_decode(buf, n, &view), TDM_OK);
    assert_true(view.job_id == frame.job_id);
    assert_string_equal(view.sender_name, "prefill-2");
    assert_true(view.sender_incarnation_id == 41);
    assert_true(view.receiver_incarnation_id == 42);
    assert_int_equal(view.receiver_pool_id, 3);
    assert_int_equal(view.n_pages, 3);
    for (uint32_t i = 0; i < 3; i++) {
        assert_int_equal(xfer_notice_frame_page(&view, i), PAGES[i]);
        assert_true(xfer_notice_frame_checksum(&view, i) == checksums[i]);
    }
    assert_int_equal(view.payload_bytes, sizeof(PAYLOAD));
    assert_memory_equal(view.payload, PAYLOAD, sizeof(PAYLOAD));
}

static void test_notice_without_pages_or_payload(void **state)
{
    xfer_notice_frame_t frame = sample(NULL);
    xfer_notice_view_t view;
    uint8_t buf[256];
    size_t n = 0;

    (void)state;
    frame.n_pages = 0;
    frame.pages = NULL;
    frame.payload = NULL;
    frame.payload_bytes = 0;
    assert_int_equal(xfer_notice_encode(&frame, buf, sizeof(buf), &n), TDM_OK);
    assert_int_equal(xfer_notice_decode(buf, n, &view), TDM_OK);
    assert_int_equal(view.n_pages, 0);
    assert_null(view.payload);
}

static void test_notice_encode_rejects_bad_frames(void **state)
{
    uint64_t checksums[3] = {0};
    xfer_notice_frame_t frame;
    uint8_t buf[512];
    uint8_t untouched[512];
    size_t n = 9;
    char long_name[80];

    (void)state;
    memset(buf, 0x33, sizeof(buf));
    memcpy(untouched, buf, sizeof(buf));
    memset(long_name, 'n', sizeof(long_name) - 1);
    long_name[sizeof(long_name) - 1] = '\0';

    frame = sample(checksums);
    frame.sender_name = "";
    assert_int_equal(xfer_notice_encode(&frame, buf, sizeof(buf), &n), TDM_ERR_INVALID_ARG);
    frame = sample(checksums);
    frame.sender_name = long_name;
    assert_int_equal(xfer_notice_encode(&frame, buf, sizeof(buf), &n), TDM_ERR_INVALID_ARG);
    frame = sample(NULL);
    assert_int_equal(xfer_notice_encode(&frame, buf, sizeof(buf), &n), TDM_ERR_INVALID_ARG);
    frame = sample(checksums);
    frame.n_pages = XFER_NOTICE_MAX_PAGES + 1;
    assert_int_equal(xfer_notice_encode(&frame, buf, sizeof(buf), &n), TDM_ERR_INVALID_ARG);
    frame = sample(checksums);
    frame.payload_bytes = XFER_NOTICE_MAX_PAYLOAD_BYTES + 1;
    assert_int_equal(xfer_notice_encode(&frame, buf, sizeof(buf), &n), TDM_ERR_INVALID_ARG);
    frame = sample(checksums);
    assert_int_equal(xfer_notice_encode(&frame, buf, 20, &n), TDM_ERR_INVALID_ARG);
    assert_memory_equal(buf, untouched, sizeof(buf));
    assert_int_equal(n, 9);
}

static void test_notice_decode_rejects_damage(void **state)
{
    uint64_t checksums[3] = {7, 8, 9};
    xfer_notice_frame_t frame = sample(checksums);
    xfer_notice_view_t view;
    xfer_notice_view_t zero;
    uint8_t buf[512];
    uint8_t bad[512];
    size_t n = 0;

    (void)state;
    memset(&view, 0, sizeof(view));
    memset(&zero, 0, sizeof(zero));
    assert_int_equal(xfer_notice_encode(&frame, buf, sizeof(buf), &n), TDM_OK);
    assert_int_equal(xfer_notice_decode(buf, 50, &view), TDM_ERR_FORMAT);
    assert_int_equal(xfer_notice_decode(buf, n + 1, &view), TDM_ERR_FORMAT);
    memcpy(bad, buf, n);
    bad[1] = 'Q';
    assert_int_equal(xfer_notice_decode(bad, n, &view), TDM_ERR_FORMAT);
    memcpy(bad, buf, n);
    bad[4] = 9;
    assert_int_equal(xfer_notice_decode(bad, n, &view), TDM_ERR_UNSUPPORTED);
    memcpy(bad, buf, n);
    bad[36] = 4; /* n_pages 4: lengths no longer add up */
    assert_int_equal(xfer_notice_decode(bad, n, &view), TDM_ERR_FORMAT);
    memcpy(bad, buf, n);
    bad[n - 20] ^= 1; /* payload byte */
    assert_int_equal(xfer_notice_decode(bad, n, &view), TDM_ERR_MISMATCH);
    memcpy(bad, buf, n);
    bad[XFER_NOTICE_HEADER_BYTES + 1] ^= 1; /* a page index */
    assert_int_equal(xfer_notice_decode(bad, n, &view), TDM_ERR_MISMATCH);
    assert_memory_equal(&view, &zero, sizeof(view));
}

static void test_check_pages_finds_the_bad_ones(void **state)
{
    uint8_t pool[PAGE_BYTES * POOL_PAGES];
    uint64_t checksums[3];
    uint32_t n_bad = 99;
    uint32_t first_bad = 99;
    uint32_t out_of_range[2] = {1, POOL_PAGES};

    (void)state;
    for (size_t i = 0; i < sizeof(pool); i++) {
        pool[i] = (uint8_t)(i * 7);
    }
    for (uint32_t i = 0; i < 3; i++) {
        checksums[i] = tdm_hash_xxh3_64(pool + PAGES[i] * PAGE_BYTES, PAGE_BYTES);
    }
    assert_int_equal(xfer_notice_check_pages(pool, PAGE_BYTES, POOL_PAGES, PAGES, checksums, 3,
                                             &n_bad, &first_bad),
                     TDM_OK);
    assert_int_equal(n_bad, 0);
    assert_int_equal(first_bad, XFER_NOTICE_NO_BAD_PAGE);

    pool[0 * PAGE_BYTES + 100] ^= 1;  /* page 0 = PAGES[1] */
    pool[15 * PAGE_BYTES + 191] ^= 1; /* last byte of page 15 = PAGES[2] */
    assert_int_equal(xfer_notice_check_pages(pool, PAGE_BYTES, POOL_PAGES, PAGES, checksums, 3,
                                             &n_bad, &first_bad),
                     TDM_ERR_MISMATCH);
    assert_int_equal(n_bad, 2);
    assert_int_equal(first_bad, 1);

    assert_int_equal(xfer_notice_check_pages(pool, PAGE_BYTES, POOL_PAGES, out_of_range, checksums,
                                             2, &n_bad, &first_bad),
                     TDM_ERR_INVALID_ARG);
    assert_int_equal(n_bad, 0);
    assert_int_equal(first_bad, XFER_NOTICE_NO_BAD_PAGE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_notice_round_trips),
        cmocka_unit_test(test_notice_without_pages_or_payload),
        cmocka_unit_test(test_notice_encode_rejects_bad_frames),
        cmocka_unit_test(test_notice_decode_rejects_damage),
        cmocka_unit_test(test_check_pages_finds_the_bad_ones),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
