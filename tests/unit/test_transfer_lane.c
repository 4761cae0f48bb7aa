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

/* ucp_ep_print_info of a UCX 1.13.1 endpoint between two processes with UCX_TLS=shm and
 * MM_ERROR_HANDLING=y (copied from a real run). */
static const char ep_info_shm[] =
    "#\n"
    "# UCP endpoint \n"
    "#\n"
    "#               peer: <no debug data>\n"
    "#                 lane[0]:  0:sysv/memory.0 md[0]           -> md[0]/sysv/sysdev[255] am "
    "am_bw#0 keepalive\n"
    "#                 lane[1]:  1:posix/memory.0 md[1]          -> md[1]/posix/sysdev[255]\n"
    "#\n"
    "#                 am_send: 0..<egr/short>..93..<egr/bcopy>..8256..<rndv>..(inf)\n"
    "#                  put[0]: 0..<short>..4294967296..<bcopy>..(inf)\n"
    "#                  get[0]: 0..<bcopy>..(inf)\n"
    "#                  put[1]: 0..<short>..4294967296..<bcopy>..(inf)\n"
    "#                  get[1]: 0..<bcopy>..(inf)\n"
    "#\n"
    "#                  rma_bw: mds rndv_rkey_size 9\n"
    "#\n";

/* The same over UCX_TLS=tcp: no RMA lane at all (real run). */
static const char ep_info_tcp[] =
    "#\n"
    "# UCP endpoint \n"
    "#\n"
    "#               peer: <no debug data>\n"
    "#                 lane[0]:  1:tcp/lo.0 md[0]                -> md[0]/tcp/sysdev[255] am "
    "am_bw#0 keepalive wireup\n"
    "#\n"
    "#                 am_send: 0..<egr/short>..8185..<egr/zcopy>..20553..<rndv>..(inf)\n"
    "#\n"
    "#                  rma_bw: mds rndv_rkey_size 9\n"
    "#\n";

/* An RDMA host, written in the same format (no RDMA device here to copy from): rc RMA lanes to
 * two remote memory domains, tcp for active messages. */
static const char ep_info_rc[] =
    "#                 lane[0]:  2:tcp/eth0.0 md[0]              -> md[0]/tcp/sysdev[255] am "
    "keepalive\n"
    "#                 lane[1]:  3:rc_mlx5/mlx5_0:1.0 md[1]      -> md[1]/ib/sysdev[255] rma_bw#0 "
    "am_bw#0\n"
    "#                 lane[2]:  5:rc_mlx5/mlx5_1:1.0 md[2]      -> md[2]/ib/sysdev[255] rma_bw#1\n"
    "#                  put[1]: 0..<short>..125..<bcopy>..8256..<zcopy>..(inf)\n"
    "#                  put[2]: 0..<short>..125..<bcopy>..8256..<zcopy>..(inf)\n";

static void test_ep_info_lanes_under_v1(void **state)
{
    xfer_lane_t lane;
    uint64_t sysv_and_cma = 0x5; /* a UCX-allocated shm pool: sysv md 0 and cma md 2 */
    uint64_t cma_only = 0x4;     /* caller memory: only cma (not a lane with error handling) */
    uint64_t md2 = 0x4;

    (void)state;
    /* shm: the put goes "short" over sysv, the md the pool's rkey has a key for */
    assert_int_equal(xfer_lane_parse_ep_info(ep_info_shm, 0, 22848, &sysv_and_cma, &lane), TDM_OK);
    assert_int_equal(lane.cls, XFER_LANE_SHM);
    assert_int_equal(lane.classes, XFER_LANE_BIT(XFER_LANE_SHM));
    assert_int_equal(lane.flags, 0);
    assert_string_equal(lane.text, "short sysv/memory");
    assert_int_equal(xfer_lane_parse_ep_info(ep_info_shm, 1, 22848, &sysv_and_cma, &lane), TDM_OK);
    assert_string_equal(lane.text, "bcopy sysv/memory");
    /* past the short threshold the next protocol is named */
    assert_int_equal(xfer_lane_parse_ep_info(ep_info_shm, 0, 4294967296ull, &sysv_and_cma, &lane),
                     TDM_OK);
    assert_string_equal(lane.text, "bcopy sysv/memory");
    /* no RMA lane reaches the rkey: emulated over the active-message lane */
    assert_int_equal(xfer_lane_parse_ep_info(ep_info_shm, 0, 22848, &cma_only, &lane), TDM_OK);
    assert_int_equal(lane.cls, XFER_LANE_SHM);
    assert_int_equal(lane.flags, XFER_LANE_EMULATED);
    assert_string_equal(lane.text, "software emulation sysv/memory");

    /* tcp: no RMA lane, always emulated */
    assert_int_equal(xfer_lane_parse_ep_info(ep_info_tcp, 0, 22848, &sysv_and_cma, &lane), TDM_OK);
    assert_int_equal(lane.cls, XFER_LANE_TCP);
    assert_int_equal(lane.flags, XFER_LANE_EMULATED);
    assert_string_equal(lane.text, "software emulation tcp/lo");
    assert_int_equal(xfer_lane_parse_ep_info(ep_info_tcp, 1, 22848, NULL, &lane), TDM_OK);
    assert_int_equal(lane.classes, XFER_LANE_BIT(XFER_LANE_TCP));

    /* rc: the first RMA lane whose remote md the rkey covers; tcp only carries AM */
    assert_int_equal(xfer_lane_parse_ep_info(ep_info_rc, 0, 22848, &md2, &lane), TDM_OK);
    assert_int_equal(lane.cls, XFER_LANE_RC);
    assert_int_equal(lane.classes, XFER_LANE_BIT(XFER_LANE_RC));
    assert_string_equal(lane.text, "zcopy rc_mlx5/mlx5_1:1");
    assert_true(xfer_lane_accepted(&lane, XFER_LANE_BIT(XFER_LANE_RC)));
    /* unknown rkey: rc or the tcp emulation could carry it, so requiring rc must refuse */
    assert_int_equal(xfer_lane_parse_ep_info(ep_info_rc, 0, 64, NULL, &lane), TDM_OK);
    assert_int_equal(lane.cls, XFER_LANE_RC);
    assert_string_equal(lane.text, "short rc_mlx5/mlx5_0:1");
    assert_int_equal(lane.classes, XFER_LANE_BIT(XFER_LANE_RC) | XFER_LANE_BIT(XFER_LANE_TCP));
    assert_false(xfer_lane_accepted(&lane, XFER_LANE_BIT(XFER_LANE_RC)));
    /* gets: no get lines printed, so the get is emulated over tcp */
    assert_int_equal(xfer_lane_parse_ep_info(ep_info_rc, 1, 22848, &md2, &lane), TDM_OK);
    assert_int_equal(lane.cls, XFER_LANE_TCP);
    assert_int_equal(lane.flags, XFER_LANE_EMULATED);

    /* nothing recognisable */
    assert_int_equal(xfer_lane_parse_ep_info("", 0, 1, NULL, &lane), TDM_ERR_FORMAT);
    assert_int_equal(lane.cls, XFER_LANE_UNKNOWN);
    assert_false(xfer_lane_accepted(&lane, XFER_LANE_BIT(XFER_LANE_SHM)));
    assert_int_equal(xfer_lane_parse_ep_info("# lane[0]:  0:foo/bar.0 md[0] -> md[0]/x am\n"
                                             "# put[0]: 0..<short>..(inf)\n"
                                             "# lane[99]: put[x]: lane[: put[0] 0..<\n",
                                             0, 1, NULL, &lane),
                     TDM_ERR_FORMAT);
}

static void test_rkey_md_map(void **state)
{
    /* packed rkeys of UCX 1.13.1 (real): caller memory (cma md 2, empty key) and a
     * UCX-allocated sysv segment (sysv md 0 with a 12-byte key, cma md 2) */
    static const uint8_t caller[] = {0x04, 0, 0, 0, 0, 0, 0, 0, 0x00, 0x00};
    static const uint8_t allocated[] = {0x05, 0,    0,    0,    0,    0,    0,    0,
                                        0x00, 0x0c, 0x25, 0x80, 0x70, 0x00, 0x00, 0x30,
                                        0x07, 0xe1, 0x58, 0x7f, 0x00, 0x00, 0x00};
    uint64_t md_map = 77;

    (void)state;
    assert_int_equal(xfer_lane_rkey_md_map(caller, sizeof(caller), &md_map), TDM_OK);
    assert_int_equal(md_map, 0x4);
    assert_int_equal(xfer_lane_rkey_md_map(allocated, sizeof(allocated), &md_map), TDM_OK);
    assert_int_equal(md_map, 0x5);
    md_map = 77;
    /* truncated, trailing bytes, no md, too short: not an rkey we understand */
    assert_int_equal(xfer_lane_rkey_md_map(allocated, sizeof(allocated) - 1, &md_map),
                     TDM_ERR_FORMAT);
    assert_int_equal(xfer_lane_rkey_md_map(allocated, 12, &md_map), TDM_ERR_FORMAT);
    {
        uint8_t longer[sizeof(caller) + 1];

        memcpy(longer, caller, sizeof(caller));
        longer[sizeof(caller)] = 0;
        assert_int_equal(xfer_lane_rkey_md_map(longer, sizeof(longer), &md_map), TDM_ERR_FORMAT);
    }
    {
        static const uint8_t none[] = {0, 0, 0, 0, 0, 0, 0, 0, 0};

        assert_int_equal(xfer_lane_rkey_md_map(none, sizeof(none), &md_map), TDM_ERR_FORMAT);
    }
    assert_int_equal(xfer_lane_rkey_md_map(caller, 8, &md_map), TDM_ERR_FORMAT);
    assert_int_equal(xfer_lane_rkey_md_map(NULL, 0, &md_map), TDM_ERR_FORMAT);
    assert_int_equal(md_map, 77);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_transport_names_map_to_classes),
        cmocka_unit_test(test_parse_ucx_protocol_descriptions),
        cmocka_unit_test(test_require_transport_parsing),
        cmocka_unit_test(test_weaker_lanes_are_not_accepted),
        cmocka_unit_test(test_ep_info_lanes_under_v1),
        cmocka_unit_test(test_rkey_md_map),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
