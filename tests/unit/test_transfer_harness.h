/* test_transfer_harness.h - the two-process harness of test_transfer.c and
 * test_transfer_peer.c (transfer/ over loopback).
 *
 * The test process is the initiator; each receiver is the same test binary re-executed with
 * `--xfer-child` (fork + exec, so no UCX state crosses the fork), talking to the parent over a
 * socketpair: it sends its pool descriptor, fills its pool on request, verifies every notice it
 * receives bit-exactly against the pattern the payload names, and can act as a writer into the
 * parent. Nothing waits on a sleep: every wait is "progress until the event, or fail at a
 * deadline". Header-only (static inline) so each test binary carries its own copy.
 *
 * Transport: TANDEM_XFER_TEST_TLS ("shm" default, or "tcp"); ctest runs each binary once per
 * transport (transfer/CMakeLists.txt adds the *_tcp runs). TANDEM_TEST_FILTER selects tests.
 */
#ifndef TANDEM_TESTS_TEST_TRANSFER_HARNESS_H
#define TANDEM_TESTS_TEST_TRANSFER_HARNESS_H

#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/clock.h"
#include "common/fdio.h"
#include "common/hash.h"
#include "common/log.h"
#include "transfer/batch.h"
#include "transfer/context.h"
#include "transfer/desc.h"
#include "transfer/metrics.h"
#include "transfer/peer.h"
#include "transfer/pool.h"

#define PAGE_BYTES         1088u /* any size works (64 + 1024: not a power of two on purpose) */
#define POOL_PAGES         4100u
#define KEEPALIVE_MS       100u
#define CONNECT_TIMEOUT_MS 3000u
#define MAX_RUN_PAGES      8u /* coalesce runs (the default is one operation per page) */
#define DEADLINE_MS        20000u
#define STATE_RECORD_BYTES 2906112u /* MODEL.md 7: the handoff state record */

enum {
    MSG_DESC = 1,   /* child -> parent: descriptor bytes */
    MSG_FILL = 2,   /* parent -> child: u64 seed; fill every pool page */
    MSG_OK = 3,     /* child -> parent: i32 status */
    MSG_NOTICE = 4, /* child -> parent: notice_report_t */
    MSG_EXIT = 5,   /* parent -> child: clean up and exit */
    MSG_PUT_TO = 6, /* parent -> child: put_to_t + descriptor; child writes into the parent */
};

enum { PAYLOAD_PATTERN = 1, PAYLOAD_BLOB = 2 };

typedef struct {
    uint32_t type;
    uint32_t n_bytes;
} msg_header_t;

typedef struct {
    uint64_t job_id;
    int32_t status;
    uint32_t n_pages;
    uint32_t n_bad_pages;
    uint32_t first_bad_index;
    uint32_t n_exact_bad; /* pages whose bytes differ from the payload's pattern */
    uint32_t payload_kind;
    uint64_t payload_bytes;
    uint64_t payload_hash;
} notice_report_t;

typedef struct {
    uint64_t seed;
    uint32_t n_pages;
    uint32_t pad;
} put_to_t;

/* ---- shared helpers ---- */

static inline const char *test_tls(void)
{
    const char *tls = getenv("TANDEM_XFER_TEST_TLS");

    return tls != NULL && tls[0] != '\0' ? tls : "shm";
}

/* The UCX protocol generation under test: TANDEM_XFER_TEST_PROTO=v1 runs every context with
 * XFER_CONTEXT_PROTO_V1 (the nodes' setting), anything else with the library default (v2). */
static inline uint32_t test_context_flags(void)
{
    const char *proto = getenv("TANDEM_XFER_TEST_PROTO");

    return proto != NULL && strcmp(proto, "v1") == 0 ? XFER_CONTEXT_PROTO_V1 : 0u;
}

static inline xfer_lane_class_t expected_lane(void)
{
    return strcmp(test_tls(), "tcp") == 0 ? XFER_LANE_TCP : XFER_LANE_SHM;
}

/* The deterministic content of page `page` under `seed`. */
static inline void fill_pattern(uint8_t *dst, uint64_t seed, uint32_t page)
{
    uint64_t state = tdm_hash_splitmix64(seed ^ ((uint64_t)page << 32));

    for (uint32_t off = 0; off < PAGE_BYTES; off += 8) {
        uint64_t word = tdm_hash_splitmix64(state + off);

        memcpy(dst + off, &word, 8);
    }
}

static inline int pattern_matches(const uint8_t *page_bytes, uint64_t seed, uint32_t page)
{
    uint8_t expect[PAGE_BYTES];

    fill_pattern(expect, seed, page);
    return memcmp(expect, page_bytes, PAGE_BYTES) == 0;
}

static inline int send_msg(int fd, uint32_t type, const void *body, uint32_t n_bytes)
{
    msg_header_t header = {type, n_bytes};

    if (tdm_fd_write_all(fd, &header, sizeof(header)) != 0) {
        return -1;
    }
    return n_bytes > 0 ? tdm_fd_write_all(fd, body, n_bytes) : 0;
}

/* Read one message; *body_out is malloc'd (caller frees). */
static inline int recv_msg(int fd, msg_header_t *header_out, uint8_t **body_out)
{
    uint8_t *body;

    if (tdm_fd_read_all(fd, header_out, sizeof(*header_out)) != 0) {
        return -1;
    }
    body = malloc(header_out->n_bytes > 0 ? header_out->n_bytes : 1);
    if (body == NULL || tdm_fd_read_all(fd, body, header_out->n_bytes) != 0) {
        free(body);
        return -1;
    }
    *body_out = body;
    return 0;
}

static inline tdm_status_t make_context(const char *name, xfer_lane_mask_t required,
                                        uint32_t max_batches, xfer_notice_fn *on_notice, void *arg,
                                        xfer_context_t **ctx_out)
{
    xfer_context_params_t params;

    xfer_context_params_default(&params);
    params.name = name;
    params.transports = test_tls();
    params.required_lanes = required;
    params.keepalive_interval_ms = KEEPALIVE_MS;
    params.connect_timeout_ms = CONNECT_TIMEOUT_MS;
    params.max_run_pages = MAX_RUN_PAGES;
    params.max_batches = max_batches;
    params.flags = test_context_flags();
    params.on_notice = on_notice;
    params.on_notice_arg = arg;
    return xfer_context_create(&params, ctx_out);
}

static inline tdm_status_t make_pool(xfer_context_t *ctx, uint32_t page_bytes,
                                     xfer_pool_t **pool_out)
{
    const xfer_pool_params_t params = {
        .page_size_bytes = page_bytes, .n_pages = POOL_PAGES, .mem_type = XFER_MEM_HOST};

    return xfer_pool_create(ctx, &params, pool_out);
}

/* ---- the child (receiver) ---- */

typedef struct {
    int sock;
    xfer_context_t *ctx;
    xfer_pool_t *pool;
    int failed;
    int put_done;
    tdm_status_t put_status;
} child_t;

static inline void child_on_notice(void *arg, const xfer_notice_t *notice)
{
    child_t *child = arg;
    notice_report_t report;

    memset(&report, 0, sizeof(report));
    report.job_id = notice->job_id;
    report.status = notice->status;
    report.n_pages = notice->n_pages;
    report.n_bad_pages = notice->n_bad_pages;
    report.first_bad_index = notice->first_bad_index;
    report.payload_bytes = notice->payload_bytes;
    report.payload_hash = tdm_hash_xxh3_64(notice->payload, notice->payload_bytes);
    if (notice->payload_bytes >= 4) {
        memcpy(&report.payload_kind, notice->payload, 4);
    }
    if (report.payload_kind == PAYLOAD_PATTERN && notice->payload_bytes >= 16) {
        uint32_t n;
        uint64_t seed;

        memcpy(&n, notice->payload + 4, 4);
        memcpy(&seed, notice->payload + 8, 8);
        if (n != notice->n_pages || notice->payload_bytes != 16 + (size_t)n * 4) {
            report.n_exact_bad = UINT32_MAX;
        } else {
            for (uint32_t i = 0; i < n; i++) {
                uint32_t src;
                const uint8_t *page = xfer_pool_page(child->pool, notice->pages[i]);

                memcpy(&src, notice->payload + 16 + (size_t)i * 4, 4);
                if (page == NULL || !pattern_matches(page, seed, src)) {
                    report.n_exact_bad++;
                }
            }
        }
    }
    if (send_msg(child->sock, MSG_NOTICE, &report, sizeof(report)) != 0) {
        child->failed = 1;
    }
}

static inline void child_put_done(void *arg, const xfer_batch_result_t *result)
{
    child_t *child = arg;

    child->put_done = 1;
    child->put_status = result->status;
}

/* Build a PAYLOAD_PATTERN payload naming the sources of n pages. Caller frees. */
static inline uint8_t *pattern_payload(uint64_t seed, const uint32_t *src, uint32_t n,
                                       size_t *n_out)
{
    size_t n_bytes = 16 + (size_t)n * 4;
    uint8_t *payload = malloc(n_bytes);
    uint32_t kind = PAYLOAD_PATTERN;

    if (payload == NULL) {
        return NULL;
    }
    memcpy(payload, &kind, 4);
    memcpy(payload + 4, &n, 4);
    memcpy(payload + 8, &seed, 8);
    memcpy(payload + 16, src, (size_t)n * 4);
    *n_out = n_bytes;
    return payload;
}

/* Child as writer: fill local pages 0..n-1, put them into the parent's pages 0..n-1, notice. */
static inline tdm_status_t child_put_to(child_t *child, const uint8_t *body, uint32_t n_bytes)
{
    put_to_t cmd;
    xfer_desc_t desc;
    xfer_peer_t *peer = NULL;
    xfer_batch_params_t params;
    uint32_t *pages;
    uint8_t *payload;
    size_t payload_bytes = 0;
    tdm_status_t status;
    uint64_t t_start_ns = tdm_clock_now_ns();

    if (n_bytes < sizeof(cmd)) {
        return TDM_ERR_FORMAT;
    }
    memcpy(&cmd, body, sizeof(cmd));
    status = xfer_desc_parse(body + sizeof(cmd), n_bytes - sizeof(cmd), &desc);
    if (status != TDM_OK) {
        return status;
    }
    status = xfer_peer_connect(child->ctx, &desc, &peer);
    if (status != TDM_OK) {
        return status;
    }
    pages = malloc((size_t)cmd.n_pages * sizeof(*pages));
    if (pages == NULL) {
        xfer_peer_close(peer);
        return TDM_ERR_NO_MEMORY;
    }
    for (uint32_t i = 0; i < cmd.n_pages; i++) {
        pages[i] = i;
        fill_pattern(xfer_pool_page(child->pool, i), cmd.seed, i);
    }
    payload = pattern_payload(cmd.seed, pages, cmd.n_pages, &payload_bytes);
    memset(&params, 0, sizeof(params));
    params.op = XFER_OP_PUT;
    params.flags = XFER_BATCH_NOTICE;
    params.job_id = cmd.seed;
    params.local_pool = child->pool;
    params.local_pages = pages;
    params.remote_pages = pages;
    params.n_pages = cmd.n_pages;
    params.payload = payload;
    params.payload_bytes = payload_bytes;
    params.done = child_put_done;
    params.done_arg = child;
    child->put_done = 0;
    status = payload == NULL ? TDM_ERR_NO_MEMORY : xfer_batch_post(peer, &params);
    if (status == TDM_IN_PROGRESS) {
        while (!child->put_done && tdm_clock_elapsed_ms(t_start_ns) < DEADLINE_MS) {
            xfer_context_wait(child->ctx, 100);
        }
        status = child->put_done ? child->put_status : TDM_ERR_TIMEOUT;
    }
    free(payload);
    free(pages);
    xfer_peer_close(peer);
    return status;
}

/* Handle one command; returns 1 when the child should exit. */
static inline int child_command(child_t *child)
{
    msg_header_t header;
    uint8_t *body = NULL;
    int32_t status = TDM_OK;
    int quit = 0;

    if (recv_msg(child->sock, &header, &body) != 0) {
        return 1; /* parent gone */
    }
    switch (header.type) {
    case MSG_FILL: {
        uint64_t seed = 0;

        memcpy(&seed, body, header.n_bytes >= 8 ? 8 : 0);
        for (uint32_t p = 0; p < POOL_PAGES; p++) {
            fill_pattern(xfer_pool_page(child->pool, p), seed, p);
        }
        break;
    }
    case MSG_PUT_TO:
        status = child_put_to(child, body, header.n_bytes);
        break;
    case MSG_EXIT:
        quit = 1;
        break;
    default:
        status = TDM_ERR_INVALID_ARG;
        break;
    }
    free(body);
    if (!quit && send_msg(child->sock, MSG_OK, &status, sizeof(status)) != 0) {
        return 1;
    }
    return quit;
}

static inline int child_main(int argc, char **argv)
{
    child_t child;
    const uint8_t *desc;
    size_t desc_bytes;
    int quit = 0;

    memset(&child, 0, sizeof(child));
    if (argc < 4) {
        return 2;
    }
    tdm_log_set_level(TDM_LOG_WARN);
    child.sock = atoi(argv[2]);
    if (make_context(argv[3], 0, 64, child_on_notice, &child, &child.ctx) != TDM_OK) {
        return 3;
    }
    if (make_pool(child.ctx, PAGE_BYTES, &child.pool) != TDM_OK) {
        xfer_context_destroy(child.ctx);
        return 4;
    }
    xfer_pool_descriptor(child.pool, &desc, &desc_bytes);
    if (send_msg(child.sock, MSG_DESC, desc, (uint32_t)desc_bytes) != 0) {
        quit = 1;
    }
    while (!quit && !child.failed) {
        struct pollfd fds[2];

        xfer_context_progress(child.ctx);
        if (xfer_context_arm(child.ctx) == TDM_ERR_BUSY) {
            continue;
        }
        fds[0].fd = child.sock;
        fds[0].events = POLLIN;
        fds[1].fd = xfer_context_efd(child.ctx);
        fds[1].events = POLLIN;
        fds[0].revents = fds[1].revents = 0;
        if (poll(fds, 2, (int)xfer_context_max_sleep_ms(child.ctx)) < 0 && errno != EINTR) {
            break;
        }
        if (fds[0].revents != 0) {
            quit = child_command(&child);
        }
    }
    xfer_pool_destroy(child.pool);
    xfer_context_destroy(child.ctx);
    close(child.sock);
    return child.failed ? 5 : 0;
}

/* ---- the parent side ---- */

typedef struct {
    pid_t pid;
    int sock;
    uint8_t *desc_bytes;
    size_t desc_n_bytes;
    xfer_desc_t desc;
    int reaped;
} remote_t;

typedef struct {
    int done;
    xfer_batch_result_t result;
} batch_wait_t;

typedef struct {
    xfer_context_t *ctx;
    xfer_pool_t *pool;
    int n_notices;
    xfer_notice_t last_notice;
    uint64_t last_payload_hash;
    uint32_t last_n_exact_bad;
    uint64_t seed;
} fixture_t;

static inline void batch_done(void *arg, const xfer_batch_result_t *result)
{
    batch_wait_t *wait = arg;

    wait->done = 1;
    wait->result = *result;
}

static inline void parent_on_notice(void *arg, const xfer_notice_t *notice)
{
    fixture_t *fx = arg;
    uint64_t seed = 0;

    fx->n_notices++;
    fx->last_notice = *notice;
    fx->last_notice.pages = NULL;
    fx->last_notice.checksums = NULL;
    fx->last_notice.payload = NULL;
    fx->last_payload_hash = tdm_hash_xxh3_64(notice->payload, notice->payload_bytes);
    fx->last_n_exact_bad = 0;
    if (notice->payload_bytes >= 16) {
        memcpy(&seed, notice->payload + 8, 8);
    }
    for (uint32_t i = 0; i < notice->n_pages; i++) {
        if (!pattern_matches(xfer_pool_page(fx->pool, notice->pages[i]), seed, i)) {
            fx->last_n_exact_bad++;
        }
    }
}

static inline void spawn(const char *name, remote_t *remote)
{
    char fd_text[16];
    char *child_argv[] = {"test_transfer", "--xfer-child", fd_text, (char *)name, NULL};
    msg_header_t header;

    memset(remote, 0, sizeof(*remote));
    snprintf(fd_text, sizeof(fd_text), "%d", TDM_SPAWN_CHILD_FD);
    assert_int_equal(tdm_spawn_self(child_argv, &remote->pid, &remote->sock), TDM_OK);
    assert_int_equal(recv_msg(remote->sock, &header, &remote->desc_bytes), 0);
    assert_int_equal(header.type, MSG_DESC);
    remote->desc_n_bytes = header.n_bytes;
    assert_int_equal(xfer_desc_parse(remote->desc_bytes, remote->desc_n_bytes, &remote->desc),
                     TDM_OK);
    assert_string_equal(remote->desc.name, name);
    assert_int_equal(remote->desc.n_pages, POOL_PAGES);
}

/* Wait for a message from the child while progressing our own worker. */
static inline void await_msg(fixture_t *fx, remote_t *remote, uint32_t type, void *body_out,
                             size_t n_body_bytes)
{
    uint64_t t_start_ns = tdm_clock_now_ns();
    msg_header_t header;
    uint8_t *body = NULL;

    for (;;) {
        struct pollfd pfd = {remote->sock, POLLIN, 0};

        xfer_context_progress(fx->ctx);
        if (poll(&pfd, 1, 0) == 1) {
            break;
        }
        assert_true(tdm_clock_elapsed_ms(t_start_ns) < DEADLINE_MS);
        if (xfer_context_arm(fx->ctx) == TDM_OK) {
            struct pollfd fds[2] = {{remote->sock, POLLIN, 0},
                                    {xfer_context_efd(fx->ctx), POLLIN, 0}};

            poll(fds, 2, (int)xfer_context_max_sleep_ms(fx->ctx));
        }
    }
    assert_int_equal(recv_msg(remote->sock, &header, &body), 0);
    assert_int_equal(header.type, type);
    assert_int_equal(header.n_bytes, n_body_bytes);
    memcpy(body_out, body, n_body_bytes);
    free(body);
}

static inline void command(fixture_t *fx, remote_t *remote, uint32_t type, const void *body,
                           uint32_t n_bytes, int32_t expect_status)
{
    int32_t status = 0;

    assert_int_equal(send_msg(remote->sock, type, body, n_bytes), 0);
    await_msg(fx, remote, MSG_OK, &status, sizeof(status));
    assert_int_equal(status, expect_status);
}

static inline void finish(remote_t *remote)
{
    int wstatus = 0;

    if (!remote->reaped) {
        assert_int_equal(send_msg(remote->sock, MSG_EXIT, NULL, 0), 0);
        assert_int_equal(waitpid(remote->pid, &wstatus, 0), remote->pid);
        assert_true(WIFEXITED(wstatus));
        assert_int_equal(WEXITSTATUS(wstatus), 0);
        remote->reaped = 1;
    }
    close(remote->sock);
    free(remote->desc_bytes);
}

static inline void kill_remote(remote_t *remote)
{
    int wstatus = 0;

    assert_int_equal(kill(remote->pid, SIGKILL), 0);
    assert_int_equal(waitpid(remote->pid, &wstatus, 0), remote->pid);
    assert_true(WIFSIGNALED(wstatus));
    remote->reaped = 1;
}

/* Progress ctx until the batch of *wait completes (fails the test after DEADLINE_MS). */
static inline void await_batch_on(xfer_context_t *ctx, batch_wait_t *wait)
{
    uint64_t t_start_ns = tdm_clock_now_ns();

    while (!wait->done) {
        assert_true(tdm_clock_elapsed_ms(t_start_ns) < DEADLINE_MS);
        xfer_context_wait(ctx, 100);
    }
}

static inline void await_batch(fixture_t *fx, batch_wait_t *wait)
{
    await_batch_on(fx->ctx, wait);
}

/* Progress until the context holds n peer objects (dead ones are freed from progress). */
static inline void await_n_peers(fixture_t *fx, uint32_t n)
{
    uint64_t t_start_ns = tdm_clock_now_ns();

    while (xfer_context_n_peers(fx->ctx) != n) {
        assert_true(tdm_clock_elapsed_ms(t_start_ns) < DEADLINE_MS);
        xfer_context_wait(fx->ctx, 10);
    }
}

static inline int setup(void **state)
{
    fixture_t *fx = calloc(1, sizeof(*fx));

    if (fx == NULL ||
        make_context("prefill-test", 0, 64, parent_on_notice, fx, &fx->ctx) != TDM_OK) {
        free(fx);
        return -1;
    }
    if (make_pool(fx->ctx, PAGE_BYTES, &fx->pool) != TDM_OK) {
        xfer_context_destroy(fx->ctx);
        free(fx);
        return -1;
    }
    fx->seed = 0x5eed0000u + (uint64_t)getpid();
    *state = fx;
    return 0;
}

static inline int teardown(void **state)
{
    fixture_t *fx = *state;

    /* Baseline: nothing in flight, no peer referenced once progress collected the dead. */
    xfer_context_progress(fx->ctx);
    assert_int_equal(xfer_context_n_inflight(fx->ctx), 0);
    xfer_pool_destroy(fx->pool);
    xfer_context_destroy(fx->ctx);
    free(fx);
    return 0;
}

/* Remote slots for n pages: the first half consecutive (one coalesced operation), the second
 * half scattered (one operation per page). Injective within POOL_PAGES. */
static inline void make_layout(uint32_t n, uint32_t *local, uint32_t *remote)
{
    uint32_t half = n / 2;
    uint32_t span = POOL_PAGES - 1 - half;

    for (uint32_t i = 0; i < n; i++) {
        local[i] = i;
        if (i < half || n == 1) {
            remote[i] = 1 + i;
        } else {
            remote[i] = 1 + half + (uint32_t)(((uint64_t)(i - half) * 7919u) % span);
        }
    }
}

/* The params of a batch of n pages of pool (local[i] -> remote[i] for a put, the reverse for a
 * get) whose completion lands in *wait (zeroed here); flags, job id, checksums and payload are
 * the caller's to add. */
static inline xfer_batch_params_t batch_params(xfer_op_t op, xfer_pool_t *pool,
                                               const uint32_t *local, const uint32_t *remote,
                                               uint32_t n, batch_wait_t *wait)
{
    const xfer_batch_params_t params = {.op = op,
                                        .local_pool = pool,
                                        .local_pages = local,
                                        .remote_pages = remote,
                                        .n_pages = n,
                                        .done = batch_done,
                                        .done_arg = wait};

    memset(wait, 0, sizeof(*wait));
    return params;
}

/* Post a put of n pages (local i -> remote i) to peer; returns xfer_batch_post's status. */
static inline tdm_status_t post_put(fixture_t *fx, xfer_peer_t *peer, uint32_t n, uint32_t *pages,
                                    batch_wait_t *wait)
{
    xfer_batch_params_t params;

    for (uint32_t i = 0; i < n; i++) {
        pages[i] = i;
    }
    params = batch_params(XFER_OP_PUT, fx->pool, pages, pages, n, wait);
    return xfer_batch_post(peer, &params);
}

/* harness_is_child - whether this process was started as a receiver (`--xfer-child`): main()
 * then returns child_main(argc, argv) instead of running tests. */
static inline int harness_is_child(int argc, char **argv)
{
    return argc >= 2 && strcmp(argv[1], "--xfer-child") == 0;
}

/* harness_prepare - before the tests: TANDEM_TEST_FILTER, SIGPIPE ignored, log level, banner. */
static inline void harness_prepare(void)
{
    if (getenv("TANDEM_TEST_FILTER") != NULL) {
        cmocka_set_test_filter(getenv("TANDEM_TEST_FILTER")); /* run one test while debugging */
    }
    signal(SIGPIPE, SIG_IGN);
    tdm_log_set_level(TDM_LOG_WARN);
    print_message("transport: %s\n", test_tls());
}

#endif
