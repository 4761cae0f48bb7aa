/* test_decode_device.c - the decode node with its engine's KV pages in backend memory (issue 14
 * item 5; node/node_pages.h), driven in process as test_decode_sched.c drives it.
 *
 * The backend is the guard table (kernels/guard.h): the CPU kernels over memory that is
 * PROT_NONE outside an op, so any host read or write of an engine page by the node (a seal, a
 * hash, a memcpy of a handoff's pages) kills the test with SIGSEGV at that line. The same script
 * runs against a decode node over the CPU table, and everything the router would see must be
 * the same bits: two remote turns (the second continuing at the H the node holds, so its history
 * pages are downloaded into their staging copies, sealed and digested, and its state record is
 * staged there for the prefill node's get) and a local turn after them; the tokens, the
 * reservations' history digests and the staged records are compared. The prefill side is the
 * test's own CPU engine writing the pages where a prefill node's puts land (dtu_remote_turn).
 * A session sharing a donor's prefix pages keeps them shared across a remote turn, as on the CPU
 * (the engine's pages are sealed like their staging copies, so the relink compares equal). The
 * node_pages module itself: layouts, download, refusals. Every page and every backend byte comes
 * back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/hash.h"
#include "decode_test_util.h"
#include "decode-node/pool.h"
#include "decode-node/sched.h"
#include "engine/seq_state.h"
#include "forward_test_util.h"
#include "kernels/guard.h"
#include "kernels/kv_page.h"
#include "node/node_handoff.h"
#include "node/node_pages.h"
#include "proto/proto.h"

#define GUARD_BYTES  ((size_t)512 << 20) /* reserved, not committed (MAP_NORESERVE) */
#define NODE_PAGES   96u
#define PREFILL_PAGE 64u
#define PROMPT       90
#define TURN1_MAX    6
#define TURN2_NEW    70
#define TURN3_NEW    9
#define MAX_TOKENS   8
#define MAX_STEPS    96
#define MAX_SUMS     DTU_MAX_SUMS

/* What one node gave back for the script (compared between the CPU and the guard node). */
typedef struct {
    int32_t tokens[3][MAX_TOKENS];
    int n_tokens[3];
    uint64_t digests[MAX_SUMS]; /* turn 2's history digests, sources concatenated */
    uint32_t n_digests;
    uint8_t *record; /* turn 2's staged record, read where the prefill node gets it */
    size_t n_record;
    int staged;            /* node_pages_staged of the node's pool */
    uint64_t staged_pages; /* the node's staged_pages_total after the script */
} script_out_t;

/* Each test's engines: the tiny preset on the CPU table (the prefill side, and the reference
 * node's model) and on the guard table (a fresh guard region per test). */
typedef struct {
    ftu_engine_t cpu;
    ftu_engine_t grd;
} engines_t;

static int engines_setup(void **state)
{
    engines_t *e = calloc(1, sizeof(*e));
    const kern_ops_t *guard = NULL;

    if (e == NULL || ftu_engine_open_on(&e->cpu, PREFILL_PAGE, kern_ops_cpu(), 32) != 0 ||
        kern_guard_create(GUARD_BYTES, &guard) != TDM_OK ||
        ftu_engine_open_on(&e->grd, 16, guard, 32) != 0) {
        return -1;
    }
    *state = e;
    return 0;
}

/* Closes both engines; fails the test unless every page came back and the guard region had no
 * allocation left (every backend byte freed). */
static int engines_teardown(void **state)
{
    engines_t *e = *state;
    int ok = ftu_engine_close(&e->grd) == 0;

    ok = kern_guard_destroy() == 0 && ok;
    ok = ftu_engine_close(&e->cpu) == 0 && ok;
    free(e);
    return ok ? 0 : -1;
}

/* dtu_desc_fn of turn 2: what the prefill node would check its history cache against (the
 * digests) and the record at H it gets from the staged pages (on a device: the staging copies the
 * node wrote), into the script_out_t arg. */
static void keep_history(void *arg, dtu_node_t *node, const node_resv_desc_t *desc)
{
    script_out_t *out = arg;
    node_pages_t *pages = decode_pool_pages(node->pool);
    size_t page_bytes = engine_kv_pool_page_bytes(decode_pool_engine(node->pool));

    for (uint32_t i = 0; i < desc->n_sources; i++) {
        assert_non_null(desc->src[i].history_digests);
        for (uint32_t j = 0; j < desc->src[i].n_history; j++) {
            assert_true(out->n_digests < MAX_SUMS);
            out->digests[out->n_digests++] = desc->src[i].history_digests[j];
        }
    }
    assert_true(desc->n_stage > 0);
    out->record = malloc((size_t)desc->n_stage * page_bytes);
    assert_non_null(out->record);
    for (uint32_t i = 0; i < desc->n_stage; i++) {
        memcpy(out->record + (size_t)i * page_bytes, node_pages_host(pages, desc->stage[i]),
               page_bytes);
    }
    out->n_record = desc->n_record;
    assert_true(out->n_record <= (size_t)desc->n_stage * page_bytes);
    assert_true(tdm_hash_xxh3_64(out->record, out->n_record) == desc->record_checksum);
}

/* The script on a decode node over `model` (the CPU table's or the guard table's): remote turn
 * 1 (H = 0), remote turn 2 at the H turn 1 left, local turn 3 after that. */
static void run_script(ftu_engine_t *cpu, const engine_model_t *model, script_out_t *out)
{
    int32_t ids[PROMPT + TURN1_MAX + TURN2_NEW + MAX_TOKENS + TURN3_NEW];
    engine_seq_t *pre = ftu_new_seq(cpu); /* the prefill node's sequence of the session */
    decode_sched_params_t sp;
    Tandem__SamplingParams greedy;
    Tandem__DecodeRequest dr;
    const Tandem__Finish *f;
    decode_stats_t st;
    dtu_node_t node;
    uint64_t T;

    memset(out, 0, sizeof(*out));
    dtu_sched_params(&sp);
    dtu_node_open(&node, model, NODE_PAGES, &sp);
    out->staged = node_pages_staged(decode_pool_pages(node.pool));
    ftu_prompt(7, cpu->V, ids, PROMPT);

    assert_int_equal(
        dtu_remote_turn(cpu, pre, &node, 1, "agent", 0, ids, PROMPT, TURN1_MAX, NULL, NULL), 0);
    f = dtu_run_to_end(&node, 1, MAX_STEPS);
    assert_non_null(f);
    out->n_tokens[0] = dtu_tokens_of(&node, 1, out->tokens[0], MAX_TOKENS);
    assert_int_equal(out->n_tokens[0], TURN1_MAX);
    assert_int_equal(f->cached_len, PROMPT + TURN1_MAX - 1);

    /* turn 2: the tool's output after what the model said; the node still holds [0, H) */
    memcpy(ids + PROMPT, out->tokens[0], TURN1_MAX * sizeof(int32_t));
    ftu_prompt(8, cpu->V, ids + PROMPT + TURN1_MAX, TURN2_NEW);
    T = PROMPT + TURN1_MAX + TURN2_NEW;
    assert_int_equal(dtu_remote_turn(cpu, pre, &node, 2, "agent", f->cached_len, ids, T, MAX_TOKENS,
                                     keep_history, out),
                     0);
    assert_true(out->n_digests > 0); /* the node held [0, H) and said so */
    f = dtu_run_to_end(&node, 2, MAX_STEPS);
    assert_non_null(f);
    out->n_tokens[1] = dtu_tokens_of(&node, 2, out->tokens[1], MAX_TOKENS);
    assert_int_equal(out->n_tokens[1], MAX_TOKENS);

    /* turn 3 prefilled on the node itself, continuing what turn 2 left */
    memcpy(ids + T, out->tokens[1], MAX_TOKENS * sizeof(int32_t));
    ftu_prompt(9, cpu->V, ids + T + MAX_TOKENS, TURN3_NEW);
    dtu_sampling(&greedy, 0.0, 0);
    dtu_request(&dr, 3, "agent", f->cached_len, ids + f->cached_len,
                (size_t)(T + MAX_TOKENS + TURN3_NEW - f->cached_len), MAX_TOKENS, &greedy);
    dtu_send_request(&node, &dr);
    assert_non_null(dtu_run_to_end(&node, 3, MAX_STEPS));
    out->n_tokens[2] = dtu_tokens_of(&node, 3, out->tokens[2], MAX_TOKENS);
    assert_int_equal(out->n_tokens[2], MAX_TOKENS);

    decode_sched_stats(node.sched, &st);
    out->staged_pages = st.staged_pages_total;
    engine_seq_destroy(pre);
    assert_true(dtu_node_close(&node)); /* every page back, none reserved or shared */
}

/* The guard node gives the CPU node's tokens, digests and staged record, touching its engine's
 * pages only through the kernel table. */
static void test_device_pages_serve_as_the_cpu_pages(void **state)
{
    engines_t *e = *state;
    script_out_t want, got;

    run_script(&e->cpu, e->cpu.model, &want);
    run_script(&e->cpu, e->grd.model, &got);
    assert_int_equal(want.staged, 0);
    assert_int_equal(got.staged, 1);
    /* /metrics' tandem_decode_staged_pages_total: none on the CPU, at least turn 2's history */
    assert_int_equal(want.staged_pages, 0);
    assert_true(got.staged_pages >= got.n_digests);
    for (int t = 0; t < 3; t++) {
        assert_int_equal(got.n_tokens[t], want.n_tokens[t]);
        assert_memory_equal(got.tokens[t], want.tokens[t], sizeof(want.tokens[t]));
    }
    assert_true(want.n_digests > 0);
    assert_int_equal(got.n_digests, want.n_digests);
    assert_memory_equal(got.digests, want.digests, want.n_digests * sizeof(uint64_t));
    assert_int_equal(got.n_record, want.n_record);
    assert_memory_equal(got.record, want.record, want.n_record);
    free(want.record);
    free(got.record);
}

/* node_pages: the two layouts, download, refusals. */
static void test_node_pages_layouts_and_download(void **state)
{
    engines_t *e = *state;
    node_pages_t *host = NULL, *staged = NULL;
    uint32_t ids[2] = {3, 5}, bad[2] = {1, 8};
    size_t page_bytes;
    uint8_t *pattern;

    assert_int_equal(node_pages_create(e->cpu.model, 0, NULL, &host), TDM_ERR_INVALID_ARG);
    assert_int_equal(node_pages_create(NULL, 8, NULL, &host), TDM_ERR_INVALID_ARG);
    assert_int_equal(node_pages_create(e->cpu.model, 8, NULL, NULL), TDM_ERR_INVALID_ARG);
    assert_null(host);

    /* host layout: the transfer bytes are the engine's pages */
    assert_int_equal(node_pages_create(e->cpu.model, 8, NULL, &host), TDM_OK);
    assert_int_equal(node_pages_staged(host), 0);
    assert_null(node_pages_xfer(host));
    assert_ptr_equal(node_pages_host(host, 5), engine_kv_pool_page(node_pages_engine(host), 5));
    assert_ptr_equal(node_pages_host_base(host), node_pages_host(host, 0));
    assert_null(node_pages_host(host, 8));
    assert_int_equal(node_pages_download(host, bad, 2), TDM_OK); /* nothing to copy */
    assert_int_equal(node_pages_n_downloaded(host), 0);

    /* staged layout: separate host copies, filled only by a download */
    assert_int_equal(node_pages_create(e->grd.model, 8, NULL, &staged), TDM_OK);
    assert_int_equal(node_pages_staged(staged), 1);
    assert_false(kern_guard_contains(node_pages_host(staged, 0), 8 * 64));
    page_bytes = engine_kv_pool_page_bytes(node_pages_engine(staged));
    assert_ptr_equal(node_pages_host(staged, 1), node_pages_host_base(staged) + page_bytes);
    assert_null(node_pages_host(staged, 8));
    pattern = malloc(page_bytes);
    assert_non_null(pattern);
    for (size_t i = 0; i < page_bytes; i++) {
        pattern[i] = (uint8_t)(i * 7 + 1);
    }
    assert_int_equal(engine_kv_pool_write_page(node_pages_engine(staged), 3, pattern), TDM_OK);
    pattern[0] ^= 0xFF;
    assert_int_equal(engine_kv_pool_write_page(node_pages_engine(staged), 5, pattern), TDM_OK);
    assert_int_equal(node_pages_host(staged, 3)[0], 0); /* not downloaded yet */
    assert_int_equal(node_pages_download(staged, ids, 2), TDM_OK);
    assert_int_equal(node_pages_n_downloaded(staged), 2);
    assert_memory_equal(node_pages_host(staged, 5), pattern, page_bytes);
    pattern[0] ^= 0xFF;
    assert_memory_equal(node_pages_host(staged, 3), pattern, page_bytes);
    assert_int_equal(node_pages_download(staged, bad, 2), TDM_ERR_INVALID_ARG);
    /* sealing: the pattern is no page (no header) and ids are checked; a page the pool handed
     * out is sealed in the engine and in its staging copy alike (a second download: same bytes) */
    assert_int_equal(node_pages_seal(staged, ids, 1), TDM_ERR_INVALID_ARG);
    assert_int_equal(node_pages_seal(staged, bad + 1, 1), TDM_ERR_INVALID_ARG);
    {
        const engine_config_t *cfg = engine_model_config(e->grd.model);
        engine_kv_table_t t;
        uint8_t *sealed = malloc(page_bytes);

        assert_non_null(sealed);
        assert_int_equal(engine_kv_table_init(&t, (int)cfg->kv_source_layer_ids[0], 1), TDM_OK);
        assert_int_equal(engine_kv_table_reserve(node_pages_engine(staged), &t, 1), TDM_OK);
        assert_int_equal(node_pages_seal(staged, t.page_ids, 1), TDM_OK);
        memcpy(sealed, node_pages_host(staged, t.page_ids[0]), page_bytes);
        assert_int_equal(kern_kv_page_check(sealed, page_bytes, NULL, KERN_KV_PAGE_CHECK_CHECKSUM),
                         TDM_OK);
        memset(node_pages_host(staged, t.page_ids[0]), 0, page_bytes);
        assert_int_equal(node_pages_download(staged, t.page_ids, 1), TDM_OK);
        assert_memory_equal(node_pages_host(staged, t.page_ids[0]), sealed, page_bytes);
        engine_kv_table_release(node_pages_engine(staged), &t);
        free(sealed);
    }
    free(pattern);

    node_pages_destroy(staged);
    node_pages_destroy(host);
    node_pages_destroy(NULL);
}

/* A session sharing a donor's locally written prefix pages (prefix_share) takes a remote turn:
 * the handoff holds the shared pages across the import and relinks them to the imported copies
 * when their bytes are equal (engine_kv_table_relink). That needs the engine's own pages sealed
 * as the staging copies are (node_pages_seal): on the guard node as many pages stay shared and
 * free as on the CPU node. */
static void prefix_script(ftu_engine_t *cpu, const engine_model_t *model, decode_stats_t *st_out)
{
    enum { P = 128, OWN = 20, GEN = 4, MORE = 30 };
    int32_t prompt[P + 10], ids[P + OWN + GEN + MORE];
    engine_seq_t *pre = ftu_new_seq(cpu);
    decode_sched_params_t sp;
    Tandem__SamplingParams greedy;
    Tandem__DecodeRequest dr;
    const Tandem__Finish *f;
    decode_stats_t st;
    dtu_node_t node;
    uint64_t T;

    dtu_sched_params(&sp);
    sp.prefix_share = 1;
    dtu_node_open(&node, model, 256, &sp);
    ftu_prompt(21, cpu->V, prompt, P + 10);
    dtu_sampling(&greedy, 0.0, 42);
    dtu_request(&dr, 1, "donor", 0, prompt, P + 10, 2, &greedy);
    dtu_send_request(&node, &dr);
    assert_non_null(dtu_run_to_end(&node, 1, MAX_STEPS));
    memcpy(ids, prompt, P * sizeof(int32_t));
    ftu_prompt(22, cpu->V, ids + P, OWN);
    dtu_request(&dr, 2, "new", P, ids + P, OWN, GEN, &greedy);
    dr.prefix_session_id = (char *)"donor";
    dr.prefix_ids = prompt;
    dr.n_prefix_ids = P;
    dtu_send_request(&node, &dr);
    f = dtu_run_to_end(&node, 2, MAX_STEPS);
    assert_non_null(f);
    assert_int_equal(dtu_tokens_of(&node, 2, ids + P + OWN, GEN), GEN);
    decode_sched_stats(node.sched, &st);
    assert_true(st.shared_pages > 0);
    T = f->cached_len + MORE;
    ftu_prompt(23, cpu->V, ids + f->cached_len, MORE);
    assert_int_equal(
        dtu_remote_turn(cpu, pre, &node, 3, "new", f->cached_len, ids, T, 2, NULL, NULL), 0);
    assert_non_null(dtu_run_to_end(&node, 3, MAX_STEPS));
    decode_sched_stats(node.sched, st_out);
    engine_seq_destroy(pre);
    assert_true(dtu_node_close(&node));
}

static void test_shared_prefix_pages_stay_shared_across_a_handoff(void **state)
{
    engines_t *e = *state;
    decode_stats_t want, got;

    prefix_script(&e->cpu, e->cpu.model, &want);
    prefix_script(&e->cpu, e->grd.model, &got);
    assert_true(want.shared_pages > 0);
    assert_int_equal(got.shared_pages, want.shared_pages);
    assert_int_equal(got.free_pages, want.free_pages);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_node_pages_layouts_and_download, engines_setup,
                                        engines_teardown),
        cmocka_unit_test_setup_teardown(test_device_pages_serve_as_the_cpu_pages, engines_setup,
                                        engines_teardown),
        cmocka_unit_test_setup_teardown(test_shared_prefix_pages_stay_shared_across_a_handoff,
                                        engines_setup, engines_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
