/* test_transfer_lane.c - lane classes, UCX protocol descriptions and --require-transport
 * (transfer/lane.h). The description strings are UCX 1.13's, copied from real requests. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "transfer/lane.h"

static void test_transport_names_map_to_classes(void **state)
{
    (void)state;
    assert_int_equal(xfer_lane_class_of_transport("tcp", 3), XFER_LANE_TCP);
    assert_int_equal(xfer_lane_class_of_transport("sysv", 4), XFER_LANE_SHM);
    assert_int_equal(xfer_lane_class_of_transport("posix", 5), XFER_LANE_SHM);
    assert_int_equal(xfer_lane_class_of_transport("cma", 3), XFER_LANE_SHM);
    assert_int_equal(xfer_lane_class_of_transport("rc_mlx5", 7), XFER_LANE_RC);
    assert_int_equal(xfer_lane_class_of_transport("rc_verbs", 8), XFER_LANE_RC);
    assert_int_equal(xfer_lane_class_of_transport("dc_mlx5", 7), XFER_LANE_DC);
    assert_int_equal(xfer_lane_class_of_transport("cuda_ipc", 8), XFER_LANE_CUDA_IPC);
    assert_int_equal(xfer_lane_class_of_transport("rc_", 3), XFER_LANE_UNKNOWN);
    assert_int_equal(xfer_lane_class_of_transport("tcpx", 4), XFER_LANE_UNKNOWN);
    assert_int_equal(xfer_lane_class_of_transport("MB", 2), XFER_LANE_UNKNOWN);
    assert_string_equal(xfer_lane_class_name(XFER_LANE_CUDA_IPC), "cuda_ipc");
    assert_string_equal(xfer_lane_class_name((xfer_lane_class_t)77), "unknown");
}

static void test_parse_ucx_protocol_descriptions(void **state)
{
    xfer_lane_t lane;

    (void)state;
    assert_int_equal(
        xfer_lane_parse_info("flags:0x5 put() from host memory length 0 short sysv/memory -0.0 "
                             "MB/s -nan us",
                             &lane),
        TDM_OK);
    assert_int_equal(lane.cls, XFER_LANE_SHM);
    assert_int_equal(lane.classes, XFER_LANE_BIT(XFER_LANE_SHM));
    assert_int_equal(lane.flags, 0);
    assert_string_equal(lane.text, "short sysv/memory");

    assert_int_equal(
        xfer_lane_parse_info("flags:0xc4 put() from host memory length 0 software emulation "
                             "tcp/lo 0.0 MB/s -nan us",
                             &lane),
        TDM_OK);
    assert_int_equal(lane.cls, XFER_LANE_TCP);
    assert_true(lane.flags & XFER_LANE_EMULATED);
    assert_string_equal(lane.text, "software emulation tcp/lo");

    assert_int_equal(xfer_lane_parse_info("get() into host memory length 22848 copy-out "
                                          "sysv/memory 3453.1 MB/s 6.31 us",
                                          &lane),
                     TDM_OK);
    assert_string_equal(lane.text, "copy-out sysv/memory");

    /* Multi-rail: every named transport counts; the first is the class. */
    assert_int_equal(xfer_lane_parse_info("put() from cuda memory length 1048576 zcopy "
                                          "cuda_ipc/cuda 50% and rc_mlx5/mlx5_0:1 50%",
                                          &lane),
                     TDM_OK);
    assert_int_equal(lane.cls, XFER_LANE_CUDA_IPC);
    assert_int_equal(lane.classes, XFER_LANE_BIT(XFER_LANE_CUDA_IPC) | XFER_LANE_BIT(XFER_LANE_RC));

    assert_int_equal(xfer_lane_parse_info("flags:0x1 <no debug info>", &lane), TDM_ERR_FORMAT);
    assert_int_equal(lane.cls, XFER_LANE_UNKNOWN);
    assert_int_equal(lane.classes, 0);
    assert_int_equal(xfer_lane_parse_info("", &lane), TDM_ERR_FORMAT);
}

static void test_require_transport_parsing(void **state)
{
    xfer_lane_mask_t mask = 12345;

    (void)state;
    assert_int_equal(xfer_lane_mask_parse("rc,cuda_ipc", &mask), TDM_OK);
    assert_int_equal(mask, XFER_LANE_BIT(XFER_LANE_RC) | XFER_LANE_BIT(XFER_LANE_CUDA_IPC));
    assert_int_equal(xfer_lane_mask_parse("shm", &mask), TDM_OK);
    assert_int_equal(mask, XFER_LANE_BIT(XFER_LANE_SHM));
    assert_int_equal(xfer_lane_mask_parse("any", &mask), TDM_OK);
    assert_int_equal(mask, 0);
    assert_int_equal(xfer_lane_mask_parse(NULL, &mask), TDM_OK);
    assert_int_equal(mask, 0);
    mask = 777;
    assert_int_equal(xfer_lane_mask_parse("rc,nvlink", &mask), TDM_ERR_INVALID_ARG);
    assert_int_equal(xfer_lane_mask_parse("rc,,tcp", &mask), TDM_ERR_INVALID_ARG);
    assert_int_equal(xfer_lane_mask_parse("unknown", &mask), TDM_ERR_INVALID_ARG);
    assert_int_equal(mask, 777);
}

static void test_weaker_lanes_are_not_accepted(void **state)
{
    xfer_lane_t lane;
    xfer_lane_mask_t rc_or_ipc = XFER_LANE_BIT(XFER_LANE_RC) | XFER_LANE_BIT(XFER_LANE_CUDA_IPC);

    (void)state;
    memset(&lane, 0, sizeof(lane));
    assert_true(xfer_lane_accepted(&lane, 0));          /* no requirement */
    assert_false(xfer_lane_accepted(&lane, rc_or_ipc)); /* unknown never passes */
    lane.cls = XFER_LANE_TCP;
    lane.classes = XFER_LANE_BIT(XFER_LANE_TCP);
    assert_false(xfer_lane_accepted(&lane, rc_or_ipc));
    lane.cls = XFER_LANE_RC;
    lane.classes = XFER_LANE_BIT(XFER_LANE_RC);
    assert_true(xfer_lane_accepted(&lane, rc_or_ipc));
    lane.classes |= XFER_LANE_BIT(XFER_LANE_TCP); /* one rail falls back: refused */
    assert_false(xfer_lane_accepted(&lane, rc_or_ipc));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_transport_names_map_to_classes),
        cmocka_unit_test(test_parse_ucx_protocol_descriptions),
        cmocka_unit_test(test_require_transport_parsing),
        cmocka_unit_test(test_weaker_lanes_are_not_accepted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
