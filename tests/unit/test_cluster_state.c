/* test_cluster_state.c - sequence state off the router (issue 18 item 4), end to end: a local
 * cluster of the tiny preset (tools/tandem local: router, 1 prefill node, 1 decode node as
 * separate processes on loopback, UCX between the nodes) serves the same disaggregated turns
 * twice: with the prefill node on the in-band path (TANDEM_STATE_INBAND=1: the state record and
 * page checksums ride in the CompletionNotice through the router, as before) and on the direct
 * path (the default: they go to the decode node in a UCX transfer notice, and a continued
 * session's record at H goes to the prefill node in staged pages of the reservation that it gets
 * over UCX, instead of inside the reservation descriptor the router relays). Both give the same
 * text; on the direct path the decode node counts one state notice per handoff, and the router's
 * control socket (tandem_router_control_bytes_total) carries per remote turn less than the
 * in-band path by at least the state record and checksums, twice (in from the prefill node, out
 * to the decode node), and under CONTROL_BYTES_PER_TURN_MAX: small control messages only.
 */
#define T_MODEL_PREFIX "cluster-state"
#include "test_cluster_harness.h"

#define N_TURNS 4
/* Router control bytes (in + out) per remote turn on the direct path: the ReservePages /
 * PageReservation (with the reservation descriptor) / PrefillJob (with the prompt ids) /
 * CompletionNotice / DecodeRequest (with the ids) / TokenChunk / Finish of a 200-token prompt
 * and the heartbeats meanwhile, a few KB; the state record alone is larger on every preset. */
#define CONTROL_BYTES_PER_TURN_MAX 32768.0

typedef struct {
    double per_turn;     /* router control bytes in + out per remote turn */
    double handoffs;     /* decode node: handoffs adopted */
    double notices;      /* decode node: state notices received */
    double notice_bytes; /* decode node: their record + checksum bytes */
    char *texts[N_TURNS];
} run_t;

static double control_bytes(unsigned port)
{
    double in = metric(port, "tandem_router_control_bytes_total{direction=\"in\"}");
    double out = metric(port, "tandem_router_control_bytes_total{direction=\"out\"}");

    assert_true(in > 0 && out > 0); /* registrations and heartbeats at least */
    return in + out;
}

static void run_turns(int inband, run_t *r)
{
    static cluster_t c; /* static: the teardown may stop it after a failed assertion */
    char session[32];
    double before;

    if (inband) {
        assert_int_equal(setenv("TANDEM_STATE_INBAND", "1", 1), 0);
    } else {
        unsetenv("TANDEM_STATE_INBAND");
    }
    assert_int_equal(cluster_start(&c, 1, 1, NULL, 0), 0);
    unsetenv("TANDEM_STATE_INBAND");
    before = control_bytes(c.http_port);
    for (int i = 0; i < N_TURNS; i += 2) {
        /* two turns of a session, both over --local-prefill-tokens (remote): the second
         * continues at H > 0, so its record at H travels too (staged pages, descriptor v3) */
        snprintf(session, sizeof(session), "state-%d", i);
        two_turns(c.http_port, session, 200 + 8 * i, 40, &r->texts[i], &r->texts[i + 1]);
    }
    r->per_turn = (control_bytes(c.http_port) - before) / N_TURNS;
    r->handoffs = metric(c.decode_port[0], "tandem_decode_handoffs_total");
    r->notices = metric(c.decode_port[0], "tandem_decode_state_notices_total");
    r->notice_bytes = metric(c.decode_port[0], "tandem_decode_state_notice_bytes_total");
    assert_int_equal(metric(c.decode_port[0], "tandem_decode_state_notice_timeouts_total"), 0);
    cluster_check_pages(&c, inband ? "state-inband" : "state-direct");
    cluster_stop(&c);
    print_message("%s: router control bytes per remote turn %.0f, handoffs %.0f, state notices "
                  "%.0f (%.0f bytes)\n",
                  inband ? "in-band" : "direct", r->per_turn, r->handoffs, r->notices,
                  r->notice_bytes);
}

static void test_direct_state_keeps_the_router_small(void **state)
{
    run_t inband, direct;
    double record_per_turn;

    (void)state;
    memset(&inband, 0, sizeof(inband));
    memset(&direct, 0, sizeof(direct));
    run_turns(1, &inband);
    run_turns(0, &direct);
    assert_int_equal(inband.handoffs, N_TURNS);
    assert_int_equal(inband.notices, 0);
    assert_int_equal(direct.handoffs, N_TURNS);
    assert_int_equal(direct.notices, N_TURNS);
    for (int i = 0; i < N_TURNS; i++) {
        assert_string_equal(inband.texts[i], direct.texts[i]);
        free(inband.texts[i]);
        free(direct.texts[i]);
    }
    record_per_turn = direct.notice_bytes / N_TURNS;
    assert_true(record_per_turn > 0);
    print_message("state record + checksums per turn %.0f bytes; router bytes per turn in-band "
                  "%.0f, direct %.0f (%.1fx less)\n",
                  record_per_turn, inband.per_turn, direct.per_turn,
                  inband.per_turn / direct.per_turn);
    /* the record at T and the checksums crossed the router twice per turn in-band (and, for a
     * continued session, the record at H twice more), never on the direct path */
    assert_true(direct.per_turn + 1.5 * record_per_turn < inband.per_turn);
    assert_true(direct.per_turn < record_per_turn);
    assert_true(direct.per_turn < CONTROL_BYTES_PER_TURN_MAX);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_direct_state_keeps_the_router_small, stop_leftovers),
    };

    return cmocka_run_group_tests(tests, setup_models, teardown_models);
}
