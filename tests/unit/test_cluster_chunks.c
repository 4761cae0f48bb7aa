/* test_cluster_chunks.c - the prefill node's per-chunk puts (prefill-node/job.c) end to end, on
 * a local cluster of the tiny preset (tools/tandem local: router, 1 prefill node, 1 decode node
 * as separate processes on loopback) with small prefill chunks (TANDEM_CHUNK_TOKENS=32, the
 * --chunk-tokens fallback every node and tandem-generate read), so that a delta of a few hundred
 * tokens completes pages chunk after chunk:
 *  - two disaggregated turns of one session (the second's first reserved page is partly filled
 *    from the history) put most of their pages while the prefill still computes
 *    (tandem_prefill_chunk_puts_total, tandem_prefill_chunk_put_pages_total), the rest (each
 *    source's last page) after it, and give text identical to tandem-generate --schedule ced and
 *    to colocated service; the decode node's pages are all back (free + session = baseline, none
 *    reserved);
 *  - a client that leaves during such a prefill leaves no reserved page behind, and the prefill
 *    node serves the next request.
 * The cluster harness (starting, stopping, HTTP, /metrics, the page check) is
 * test_cluster_harness.h; every worker and tandem-generate read TANDEM_CHUNK_TOKENS.
 */
#define T_MODEL_PREFIX "cluster-chunks"
#include "test_cluster_harness.h"

#define T_CHUNK "32" /* TANDEM_CHUNK_TOKENS: prefill chunk of every node and of generate */

/* Group setup: the harness's checkpoints, and the small chunk for every process started. */
static int setup_chunk_models(void **state)
{
    if (setenv("TANDEM_CHUNK_TOKENS", T_CHUNK, 1) != 0) {
        return -1;
    }
    return setup_models(state);
}

static void test_chunk_puts_overlap_and_match_colocated(void **state)
{
    static cluster_t c; /* static: the teardown may stop it after a failed assertion */
    char *d1, *d2, *c1, *c2;
    double chunk_puts, early_pages, put_pages, prefilled, handoffs;

    (void)state;
    /* Disaggregated. Two turns (two_turns): 400 prompt ids (tiny: 200 rows of the ratio-2
     * source, 3 full pages and one of 8 rows; 400 rows of the ratio-1 source, 6 full pages and
     * one of 16 rows), 8 generated, then the history, tandem-generate's 8 ids and 300 more (the
     * ratio-2 source's first reserved page starts at row 203 and fills at 256). */
    assert_int_equal(cluster_start(&c, 1, 1, NULL, 0), 0);
    two_turns(c.http_port, "chunks-dis", 400, 300, &d1, &d2);
    chunk_puts = metric(c.prefill_port[0], "tandem_prefill_chunk_puts_total");
    early_pages = metric(c.prefill_port[0], "tandem_prefill_chunk_put_pages_total");
    put_pages = metric(c.prefill_port[0], "tandem_prefill_put_pages_total");
    prefilled = metric(c.prefill_port[0], "tandem_prefill_tokens_total");
    handoffs = metric(c.decode_port[0], "tandem_decode_handoffs_total");
    print_message("chunk puts: batches=%.0f pages during compute=%.0f of %.0f put; "
                  "prefilled=%.0f handoffs=%.0f\n",
                  chunk_puts, early_pages, put_pages, prefilled, handoffs);
    cluster_check_pages(&c, "chunk puts");
    cluster_stop(&c);
    assert_true(handoffs == 2);
    /* The second prompt carries tandem-generate's 8 ids after the first: the decode node's
     * cached history (the prompt and the first 7 generated tokens; the 8th was sampled, never
     * run) matches it, and the second delta is the 8th plus the 300 new tokens, only if the
     * first turn's tokens were generate's --schedule ced tokens. */
    assert_true(prefilled == 400 + 301);
    /* Turn 1 completes 3 + 6 pages before its last chunk (6 batches, at tokens 64, 128, ..,
     * 384); turn 2 (T = 708) completes 2 + 5 (its partly filled first pages among them; 5
     * batches). Every batch posted mid-compute carries a page, and each source's last page of
     * each turn is put only after the compute (2 + 2). */
    assert_true(chunk_puts >= 4);
    assert_true(early_pages >= chunk_puts);
    assert_true(early_pages >= 9 + 4);
    assert_true(put_pages >= early_pages + 4);
    /* Colocated: the decode node prefills both deltas (canonical start, same chunk size). */
    assert_int_equal(cluster_start(&c, 0, 1, NULL, 0), 0);
    two_turns(c.http_port, "chunks-col", 400, 300, &c1, &c2);
    cluster_stop(&c);
    expect_same_turns(d1, d2, c1, c2);
}

static void test_client_leaving_mid_prefill_returns_reserved_pages(void **state)
{
    static cluster_t c; /* static: the teardown may stop it after a failed assertion */
    char ids[8192], *resp = malloc(T_BODY), *text;
    double reserved_after;

    (void)state;
    assert_non_null(resp);
    assert_int_equal(cluster_start(&c, 1, 1, NULL, 0), 0);
    make_ids(ids, sizeof(ids), 900, 17, 1);
    /* The client leaves during the prefill (a 900-token delta in 29 chunks of 32). */
    leave_streamed_completion(c.http_port, "chunks-cancel", ids, 300, resp);
    /* The reservation comes back after the abort's fence (30 s allows a slow sanitizer run). */
    reserved_after = await_metric(c.decode_port[0], "tandem_decode_reserved_pages", 0, 30000);
    print_message("client left mid-prefill: jobs=%.0f aborted=%.0f chunk put pages=%.0f\n",
                  metric(c.prefill_port[0], "tandem_prefill_jobs_total"),
                  metric(c.prefill_port[0], "tandem_prefill_jobs_aborted_total"),
                  metric(c.prefill_port[0], "tandem_prefill_chunk_put_pages_total"));
    assert_true(reserved_after == 0);
    cluster_check_pages(&c, "client left mid-prefill");
    /* The prefill node still serves: a fresh 200-token turn is handed off. */
    make_ids(ids, sizeof(ids), 200, 5, 2);
    text = complete(c.http_port, "chunks-after", ids, 4);
    assert_true(metric(c.decode_port[0], "tandem_decode_handoffs_total") >= 1);
    free(text);
    cluster_stop(&c);
    free(resp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_chunk_puts_overlap_and_match_colocated, stop_leftovers),
        cmocka_unit_test_teardown(test_client_leaving_mid_prefill_returns_reserved_pages,
                                  stop_leftovers),
    };
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests(tests, setup_chunk_models, teardown_models);
}
