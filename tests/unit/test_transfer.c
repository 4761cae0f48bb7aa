/* test_transfer.c - KV page transfer between processes on loopback (transfer/).
 *
 * The test process is the initiator; each receiver is this same binary re-executed with
 * `--xfer-child` (fork + exec, so no UCX state crosses the fork), talking to the parent over a
 * socketpair: it sends its pool descriptor, fills its pool on request, verifies every notice
 * it receives bit-exactly against the pattern the payload names, and can act as a writer into
 * the parent. Nothing waits on a sleep: every wait is "progress until the event, or fail at a
 * deadline".
 *
 * Transport: TANDEM_XFER_TEST_TLS ("shm" default, or "tcp"); ctest runs the binary once per
 * transport (transfer/CMakeLists.txt adds test_transfer_tcp).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "common/clock.h"
#include "common/hash.h"
#include "common/log.h"
#include "transfer/batch.h"
#include "transfer/context.h"
#include "transfer/desc.h"
#include "transfer/metrics.h"
#include "transfer/peer.h"
#include "transfer/pool.h"

#define PAGE_BYTES         1088u /* any size works for tests (64 + 1024: not a power of two on purpose) */
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

static const char *test_tls(void)
{
    const char *tls = getenv("TANDEM_XFER_TEST_TLS");

    return tls != NULL && tls[0] != '\0' ? tls : "shm";
}

static xfer_lane_class_t expected_lane(void)
{
    return strcmp(test_tls(), "tcp") == 0 ? XFER_LANE_TCP : XFER_LANE_SHM;
}

/* The deterministic content of page `page` under `seed`. */
static void fill_pattern(uint8_t *dst, uint64_t seed, uint32_t page)
{
    uint64_t state = tdm_hash_splitmix64(seed ^ ((uint64_t)page << 32));

    for (uint32_t off = 0; off < PAGE_BYTES; off += 8) {
        uint64_t word = tdm_hash_splitmix64(state + off);

        memcpy(dst + off, &word, 8);
    }
}

static int pattern_matches(const uint8_t *page_bytes, uint64_t seed, uint32_t page)
{
    uint8_t expect[PAGE_BYTES];

    fill_pattern(expect, seed, page);
    return memcmp(expect, page_bytes, PAGE_BYTES) == 0;
}

static int write_all(int fd, const void *buf, size_t n_bytes)
{
    const uint8_t *p = buf;

    while (n_bytes > 0) {
        ssize_t n = write(fd, p, n_bytes);

        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            return -1;
        }
        p += n;
        n_bytes -= (size_t)n;
    }
    return 0;
}

static int read_all(int fd, void *buf, size_t n_bytes)
{
    uint8_t *p = buf;

    while (n_bytes > 0) {
        ssize_t n = read(fd, p, n_bytes);

        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            return -1;
        }
        p += n;
        n_bytes -= (size_t)n;
    }
    return 0;
}

static int send_msg(int fd, uint32_t type, const void *body, uint32_t n_bytes)
{
    msg_header_t header = {type, n_bytes};

    if (write_all(fd, &header, sizeof(header)) != 0) {
        return -1;
    }
    return n_bytes > 0 ? write_all(fd, body, n_bytes) : 0;
}

/* Read one message; *body_out is malloc'd (caller frees). */
static int recv_msg(int fd, msg_header_t *header_out, uint8_t **body_out)
{
    uint8_t *body;

    if (read_all(fd, header_out, sizeof(*header_out)) != 0) {
        return -1;
    }
    body = malloc(header_out->n_bytes > 0 ? header_out->n_bytes : 1);
    if (body == NULL || read_all(fd, body, header_out->n_bytes) != 0) {
        free(body);
        return -1;
    }
    *body_out = body;
    return 0;
}

static tdm_status_t make_context(const char *name, xfer_lane_mask_t required, uint32_t max_batches,
                                 xfer_notice_fn *on_notice, void *arg, xfer_context_t **ctx_out)
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
    params.on_notice = on_notice;
    params.on_notice_arg = arg;
    return xfer_context_create(&params, ctx_out);
}

static tdm_status_t make_pool(xfer_context_t *ctx, uint32_t page_bytes, xfer_pool_t **pool_out)
{
    xfer_pool_params_t params;

    memset(&params, 0, sizeof(params));
    params.page_size_bytes = page_bytes;
    params.n_pages = POOL_PAGES;
    params.mem_type = XFER_MEM_HOST;
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

static void child_on_notice(void *arg, const xfer_notice_t *notice)
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

static void child_put_done(void *arg, const xfer_batch_result_t *result)
{
    child_t *child = arg;

    child->put_done = 1;
    child->put_status = result->status;
}

/* Build a PAYLOAD_PATTERN payload naming the sources of n pages. Caller frees. */
static uint8_t *pattern_payload(uint64_t seed, const uint32_t *src, uint32_t n, size_t *n_out)
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
static tdm_status_t child_put_to(child_t *child, const uint8_t *body, uint32_t n_bytes)
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
static int child_command(child_t *child)
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

static int child_main(int argc, char **argv)
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

static void batch_done(void *arg, const xfer_batch_result_t *result)
{
    batch_wait_t *wait = arg;

    wait->done = 1;
    wait->result = *result;
}

static void parent_on_notice(void *arg, const xfer_notice_t *notice)
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

static void spawn(const char *name, remote_t *remote)
{
    int fds[2];
    char fd_text[16];
    msg_header_t header;
    pid_t pid;

    memset(remote, 0, sizeof(*remote));
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char *child_argv[5];

        /* The child keeps only stdio and its socket (as fd 3). */
        if (dup2(fds[1], 3) != 3) {
            _exit(126);
        }
        close_range(4, ~0u, 0);
        snprintf(fd_text, sizeof(fd_text), "%d", 3);
        child_argv[0] = "test_transfer";
        child_argv[1] = "--xfer-child";
        child_argv[2] = fd_text;
        child_argv[3] = (char *)name;
        child_argv[4] = NULL;
        execv("/proc/self/exe", child_argv);
        _exit(127);
    }
    close(fds[1]);
    fcntl(fds[0], F_SETFD, FD_CLOEXEC);
    remote->pid = pid;
    remote->sock = fds[0];
    assert_int_equal(recv_msg(remote->sock, &header, &remote->desc_bytes), 0);
    assert_int_equal(header.type, MSG_DESC);
    remote->desc_n_bytes = header.n_bytes;
    assert_int_equal(xfer_desc_parse(remote->desc_bytes, remote->desc_n_bytes, &remote->desc),
                     TDM_OK);
    assert_string_equal(remote->desc.name, name);
    assert_int_equal(remote->desc.n_pages, POOL_PAGES);
}

/* Wait for a message from the child while progressing our own worker. */
static void await_msg(fixture_t *fx, remote_t *remote, uint32_t type, void *body_out,
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

static void command(fixture_t *fx, remote_t *remote, uint32_t type, const void *body,
                    uint32_t n_bytes, int32_t expect_status)
{
    int32_t status = 0;

    assert_int_equal(send_msg(remote->sock, type, body, n_bytes), 0);
    await_msg(fx, remote, MSG_OK, &status, sizeof(status));
    assert_int_equal(status, expect_status);
}

static void finish(remote_t *remote)
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

static void kill_remote(remote_t *remote)
{
    int wstatus = 0;

    assert_int_equal(kill(remote->pid, SIGKILL), 0);
    assert_int_equal(waitpid(remote->pid, &wstatus, 0), remote->pid);
    assert_true(WIFSIGNALED(wstatus));
    remote->reaped = 1;
}

static void await_batch(fixture_t *fx, batch_wait_t *wait)
{
    uint64_t t_start_ns = tdm_clock_now_ns();

    while (!wait->done) {
        assert_true(tdm_clock_elapsed_ms(t_start_ns) < DEADLINE_MS);
        xfer_context_wait(fx->ctx, 100);
    }
}

/* Progress until the context holds n peer objects (dead ones are freed from progress). */
static void await_n_peers(fixture_t *fx, uint32_t n)
{
    uint64_t t_start_ns = tdm_clock_now_ns();

    while (xfer_context_n_peers(fx->ctx) != n) {
        assert_true(tdm_clock_elapsed_ms(t_start_ns) < DEADLINE_MS);
        xfer_context_wait(fx->ctx, 10);
    }
}

static int setup(void **state)
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

static int teardown(void **state)
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
static void make_layout(uint32_t n, uint32_t *local, uint32_t *remote)
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

static void put_pages_bit_exact(fixture_t *fx, remote_t *remote, xfer_peer_t *peer, uint32_t n)
{
    xfer_batch_params_t params;
    batch_wait_t wait = {0};
    notice_report_t report;
    uint32_t *local = malloc(n * sizeof(*local));
    uint32_t *slots = malloc(n * sizeof(*slots));
    uint8_t *payload;
    size_t payload_bytes = 0;

    assert_non_null(local);
    assert_non_null(slots);
    make_layout(n, local, slots);
    for (uint32_t i = 0; i < n; i++) {
        fill_pattern(xfer_pool_page(fx->pool, local[i]), fx->seed, local[i]);
    }
    payload = pattern_payload(fx->seed, local, n, &payload_bytes);
    assert_non_null(payload);

    memset(&params, 0, sizeof(params));
    params.op = XFER_OP_PUT;
    params.flags = XFER_BATCH_NOTICE;
    params.job_id = 1000 + n;
    params.local_pool = fx->pool;
    params.local_pages = local;
    params.remote_pages = slots;
    params.n_pages = n;
    params.payload = payload;
    params.payload_bytes = payload_bytes;
    params.done = batch_done;
    params.done_arg = &wait;
    assert_int_equal(xfer_batch_post(peer, &params), TDM_IN_PROGRESS);
    free(payload);
    await_batch(fx, &wait);
    assert_int_equal(wait.result.status, TDM_OK);
    assert_int_equal(wait.result.n_pages, n);
    assert_int_equal(wait.result.n_bytes, (uint64_t)n * PAGE_BYTES);
    assert_int_equal(wait.result.lane.cls, expected_lane());
    print_message("put %u pages: lane %s (%s) in %.3f ms\n", n,
                  xfer_lane_class_name(wait.result.lane.cls), wait.result.lane.text,
                  (double)wait.result.latency_ns * 1e-6);

    await_msg(fx, remote, MSG_NOTICE, &report, sizeof(report));
    assert_int_equal(report.job_id, 1000 + n);
    assert_int_equal(report.status, TDM_OK);
    assert_int_equal(report.n_pages, n);
    assert_int_equal(report.n_bad_pages, 0);
    assert_int_equal(report.n_exact_bad, 0);
    free(local);
    free(slots);
}

static void get_pages_bit_exact(fixture_t *fx, xfer_peer_t *peer, uint64_t seed, uint32_t n)
{
    xfer_batch_params_t params;
    batch_wait_t wait = {0};
    uint32_t *local = malloc(n * sizeof(*local));
    uint32_t *slots = malloc(n * sizeof(*slots));
    uint32_t n_bad = 0;

    assert_non_null(local);
    assert_non_null(slots);
    make_layout(n, local, slots);
    memset(xfer_pool_page(fx->pool, 0), 0, (size_t)PAGE_BYTES * POOL_PAGES);

    memset(&params, 0, sizeof(params));
    params.op = XFER_OP_GET;
    params.job_id = 2000 + n;
    params.local_pool = fx->pool;
    params.local_pages = local;
    params.remote_pages = slots;
    params.n_pages = n;
    params.done = batch_done;
    params.done_arg = &wait;
    assert_int_equal(xfer_batch_post(peer, &params), TDM_IN_PROGRESS);
    await_batch(fx, &wait);
    assert_int_equal(wait.result.status, TDM_OK);
    assert_int_equal(wait.result.lane.cls, expected_lane());
    for (uint32_t i = 0; i < n; i++) {
        if (!pattern_matches(xfer_pool_page(fx->pool, local[i]), seed, slots[i])) {
            n_bad++;
        }
    }
    assert_int_equal(n_bad, 0);
    print_message("get %u pages: lane %s (%s) in %.3f ms\n", n,
                  xfer_lane_class_name(wait.result.lane.cls), wait.result.lane.text,
                  (double)wait.result.latency_ns * 1e-6);
    free(local);
    free(slots);
}

static void test_put_1_7_64_4096_pages_bit_exact(void **state)
{
    fixture_t *fx = *state;
    static const uint32_t sizes[] = {1, 7, 64, 4096};
    remote_t remote;
    xfer_peer_t *peer = NULL;

    spawn("decode-put", &remote);
    assert_int_equal(xfer_peer_connect(fx->ctx, &remote.desc, &peer), TDM_OK);
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        put_pages_bit_exact(fx, &remote, peer, sizes[i]);
    }
    xfer_peer_close(peer);
    finish(&remote);
}

static void test_get_1_7_64_4096_pages_bit_exact(void **state)
{
    fixture_t *fx = *state;
    static const uint32_t sizes[] = {1, 7, 64, 4096};
    remote_t remote;
    xfer_peer_t *peer = NULL;
    uint64_t seed = fx->seed ^ 0x6e7;

    spawn("decode-get", &remote);
    command(fx, &remote, MSG_FILL, &seed, sizeof(seed), TDM_OK);
    assert_int_equal(xfer_peer_connect(fx->ctx, &remote.desc, &peer), TDM_OK);
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        get_pages_bit_exact(fx, peer, seed, sizes[i]);
    }
    xfer_peer_close(peer);
    finish(&remote);
}

static void test_notice_checksum_mismatch_is_detected(void **state)
{
    fixture_t *fx = *state;
    remote_t remote;
    xfer_peer_t *peer = NULL;
    xfer_batch_params_t params;
    batch_wait_t wait = {0};
    notice_report_t report;
    uint32_t local[8];
    uint32_t slots[8];
    uint64_t checksums[8];
    uint8_t *payload;
    size_t payload_bytes = 0;
    xfer_metrics_snapshot_t snap;

    spawn("decode-sum", &remote);
    assert_int_equal(xfer_peer_connect(fx->ctx, &remote.desc, &peer), TDM_OK);
    make_layout(8, local, slots);
    for (uint32_t i = 0; i < 8; i++) {
        fill_pattern(xfer_pool_page(fx->pool, local[i]), fx->seed, local[i]);
        checksums[i] = tdm_hash_xxh3_64(xfer_pool_page(fx->pool, local[i]), PAGE_BYTES);
    }
    checksums[3] ^= 1; /* one page's checksum disagrees with the page that lands */
    payload = pattern_payload(fx->seed, local, 8, &payload_bytes);
    assert_non_null(payload);
    memset(&params, 0, sizeof(params));
    params.op = XFER_OP_PUT;
    params.flags = XFER_BATCH_NOTICE;
    params.job_id = 77;
    params.local_pool = fx->pool;
    params.local_pages = local;
    params.remote_pages = slots;
    params.n_pages = 8;
    params.checksums = checksums;
    params.payload = payload;
    params.payload_bytes = payload_bytes;
    params.done = batch_done;
    params.done_arg = &wait;
    assert_int_equal(xfer_batch_post(peer, &params), TDM_IN_PROGRESS);
    await_batch(fx, &wait);
    assert_int_equal(wait.result.status, TDM_OK);
    await_msg(fx, &remote, MSG_NOTICE, &report, sizeof(report));
    assert_int_equal(report.job_id, 77);
    assert_int_equal(report.status, TDM_ERR_MISMATCH);
    assert_int_equal(report.n_bad_pages, 1);
    assert_int_equal(report.first_bad_index, 3);
    assert_int_equal(report.n_exact_bad, 0); /* the bytes are right; the notice is not */

    xfer_metrics_get(xfer_context_metrics(fx->ctx), &snap);
    assert_int_equal(snap.n_notices_sent, 1);
    xfer_peer_close(peer);

    /* A notice naming a pool the receiver does not have is delivered as NOT_FOUND. */
    {
        xfer_desc_t wrong_pool = remote.desc;

        wrong_pool.pool_id += 100;
        assert_int_equal(xfer_peer_connect(fx->ctx, &wrong_pool, &peer), TDM_OK);
        memset(&wait, 0, sizeof(wait));
        params.checksums = NULL;
        params.job_id = 78;
        assert_int_equal(xfer_batch_post(peer, &params), TDM_IN_PROGRESS);
        await_batch(fx, &wait);
        assert_int_equal(wait.result.status, TDM_OK);
        await_msg(fx, &remote, MSG_NOTICE, &report, sizeof(report));
        assert_int_equal(report.job_id, 78);
        assert_int_equal(report.status, TDM_ERR_NOT_FOUND);
        xfer_peer_close(peer);
    }
    free(payload);
    finish(&remote);
}

static void test_state_record_payload_arrives_whole(void **state)
{
    fixture_t *fx = *state;
    remote_t remote;
    xfer_peer_t *peer = NULL;
    xfer_batch_params_t params;
    batch_wait_t wait = {0};
    notice_report_t report;
    uint8_t *record = malloc(STATE_RECORD_BYTES);
    uint32_t kind = PAYLOAD_BLOB;

    assert_non_null(record);
    for (uint32_t i = 0; i < STATE_RECORD_BYTES; i++) {
        record[i] = (uint8_t)(i * 131u + 7u);
    }
    memcpy(record, &kind, 4);
    spawn("decode-rec", &remote);
    assert_int_equal(xfer_peer_connect(fx->ctx, &remote.desc, &peer), TDM_OK);
    memset(&params, 0, sizeof(params));
    params.op = XFER_OP_PUT;
    params.flags = XFER_BATCH_NOTICE; /* no pages: the notice carries only the record */
    params.job_id = 99;
    params.local_pool = fx->pool;
    params.payload = record;
    params.payload_bytes = STATE_RECORD_BYTES;
    params.done = batch_done;
    params.done_arg = &wait;
    assert_int_equal(xfer_batch_post(peer, &params), TDM_IN_PROGRESS);
    await_batch(fx, &wait);
    assert_int_equal(wait.result.status, TDM_OK);
    await_msg(fx, &remote, MSG_NOTICE, &report, sizeof(report));
    assert_int_equal(report.job_id, 99);
    assert_int_equal(report.status, TDM_OK);
    assert_int_equal(report.n_pages, 0);
    assert_int_equal(report.payload_bytes, STATE_RECORD_BYTES);
    assert_true(report.payload_hash == tdm_hash_xxh3_64(record, STATE_RECORD_BYTES));
    free(record);
    xfer_peer_close(peer);
    finish(&remote);
}

/* Post a put of n pages (local i -> remote i) to peer; returns xfer_batch_post's status. */
static tdm_status_t post_put(fixture_t *fx, xfer_peer_t *peer, uint32_t n, uint32_t *pages,
                             batch_wait_t *wait)
{
    xfer_batch_params_t params;

    for (uint32_t i = 0; i < n; i++) {
        pages[i] = i;
    }
    memset(wait, 0, sizeof(*wait));
    memset(&params, 0, sizeof(params));
    params.op = XFER_OP_PUT;
    params.local_pool = fx->pool;
    params.local_pages = pages;
    params.remote_pages = pages;
    params.n_pages = n;
    params.done = batch_done;
    params.done_arg = wait;
    return xfer_batch_post(peer, &params);
}

static void test_receiver_killed_mid_transfer_fails_only_that_peer(void **state)
{
    fixture_t *fx = *state;
    remote_t victim;
    remote_t bystander;
    xfer_peer_t *victim_peer = NULL;
    xfer_peer_t *bystander_peer = NULL;
    uint32_t *pages = malloc(4096 * sizeof(*pages));
    batch_wait_t big;
    batch_wait_t probe;
    xfer_metrics_snapshot_t snap;
    uint64_t t_start_ns;
    tdm_status_t status;

    assert_non_null(pages);
    spawn("decode-victim", &victim);
    spawn("decode-bystander", &bystander);
    assert_int_equal(xfer_peer_connect(fx->ctx, &victim.desc, &victim_peer), TDM_OK);
    assert_int_equal(xfer_peer_connect(fx->ctx, &bystander.desc, &bystander_peer), TDM_OK);

    /* Both connections are up and in use. */
    assert_int_equal(post_put(fx, victim_peer, 7, pages, &probe), TDM_IN_PROGRESS);
    await_batch(fx, &probe);
    assert_int_equal(probe.result.status, TDM_OK);

    /* A large put is posted, and the receiver dies before we drive it any further. */
    assert_int_equal(post_put(fx, victim_peer, 4096, pages, &big), TDM_IN_PROGRESS);
    kill_remote(&victim);
    await_batch(fx, &big);
    if (big.result.lane.flags & XFER_LANE_EMULATED) {
        /* The receiver's progress moves emulated puts: this batch cannot have finished. */
        assert_int_equal(big.result.status, TDM_ERR_PEER_LOST);
    } else {
        /* Direct shm copies may all land before the kill; either way, no hang. */
        assert_true(big.result.status == TDM_OK || big.result.status == TDM_ERR_PEER_LOST);
    }

    /* Keep writing until UCX (keepalive on shm, the socket on tcp) declares the peer lost. */
    t_start_ns = tdm_clock_now_ns();
    while (xfer_peer_status(victim_peer) == TDM_OK) {
        assert_true(tdm_clock_elapsed_ms(t_start_ns) < DEADLINE_MS);
        status = post_put(fx, victim_peer, 64, pages, &probe);
        if (status == TDM_IN_PROGRESS) {
            await_batch(fx, &probe);
        }
        xfer_context_wait(fx->ctx, KEEPALIVE_MS);
    }
    assert_int_equal(xfer_peer_status(victim_peer), TDM_ERR_PEER_LOST);
    assert_int_equal(post_put(fx, victim_peer, 64, pages, &probe), TDM_ERR_PEER_LOST);
    assert_false(probe.done);

    /* The other peer is untouched. */
    assert_int_equal(xfer_peer_status(bystander_peer), TDM_OK);
    assert_int_equal(post_put(fx, bystander_peer, 64, pages, &probe), TDM_IN_PROGRESS);
    await_batch(fx, &probe);
    assert_int_equal(probe.result.status, TDM_OK);

    xfer_metrics_get(xfer_context_metrics(fx->ctx), &snap);
    assert_int_equal(snap.n_peer_failures, 1);

    /* The dead peer is freed once unreferenced. */
    assert_int_equal(xfer_context_n_peers(fx->ctx), 2);
    xfer_peer_close(victim_peer);
    await_n_peers(fx, 1);
    xfer_peer_close(bystander_peer);
    finish(&victim);
    finish(&bystander);
    free(pages);
}

static void test_restarted_peer_reached_by_new_descriptor_old_refused(void **state)
{
    fixture_t *fx = *state;
    remote_t first;
    remote_t second;
    xfer_peer_t *old_peer = NULL;
    xfer_peer_t *new_peer = NULL;
    xfer_peer_t *again = NULL;
    uint32_t pages[7];
    batch_wait_t wait;
    xfer_metrics_snapshot_t snap;

    spawn("decode-restart", &first);
    assert_int_equal(xfer_peer_connect(fx->ctx, &first.desc, &old_peer), TDM_OK);
    assert_int_equal(post_put(fx, old_peer, 7, pages, &wait), TDM_IN_PROGRESS);
    await_batch(fx, &wait);
    assert_int_equal(wait.result.status, TDM_OK);

    kill_remote(&first);
    spawn("decode-restart", &second);
    assert_true(second.desc.incarnation_id != first.desc.incarnation_id);

    /* The new descriptor reaches the new process and retires the old incarnation. */
    assert_int_equal(xfer_peer_connect(fx->ctx, &second.desc, &new_peer), TDM_OK);
    assert_int_equal(xfer_peer_status(old_peer), TDM_ERR_PEER_LOST);
    assert_int_equal(post_put(fx, new_peer, 7, pages, &wait), TDM_IN_PROGRESS);
    await_batch(fx, &wait);
    assert_int_equal(wait.result.status, TDM_OK);

    /* The old descriptor and the old handle are refused, never executed. */
    assert_int_equal(xfer_peer_connect(fx->ctx, &first.desc, &again), TDM_ERR_PEER_LOST);
    assert_null(again);
    assert_int_equal(post_put(fx, old_peer, 7, pages, &wait), TDM_ERR_PEER_LOST);
    assert_false(wait.done);
    xfer_metrics_get(xfer_context_metrics(fx->ctx), &snap);
    assert_int_equal(snap.n_peers_refused, 2);

    /* The same descriptor again gives the cached peer. */
    assert_int_equal(xfer_peer_connect(fx->ctx, &second.desc, &again), TDM_OK);
    assert_ptr_equal(again, new_peer);
    xfer_peer_close(again);

    xfer_peer_close(old_peer);
    await_n_peers(fx, 1); /* the new one stays cached */
    xfer_peer_close(new_peer);
    finish(&first);
    finish(&second);
}

static void test_required_transport_refuses_other_lanes(void **state)
{
    fixture_t *fx = *state;
    remote_t remote;
    xfer_context_t *strict = NULL;
    xfer_pool_t *pool = NULL;
    xfer_peer_t *peer = NULL;
    xfer_peer_t *ok_peer = NULL;
    xfer_batch_params_t params;
    batch_wait_t wait = {0};
    uint32_t pages[4] = {0, 1, 2, 3};
    xfer_lane_mask_t other;
    xfer_metrics_snapshot_t snap;

    /* Requiring the lane in use is fine. */
    spawn("decode-lane", &remote);
    assert_int_equal(xfer_peer_connect(fx->ctx, &remote.desc, &ok_peer), TDM_OK);
    xfer_peer_close(ok_peer);

    /* A context whose transports cannot reach the peer at all: refused at connect. */
    {
        xfer_context_params_t params_other;
        xfer_context_t *other = NULL;
        xfer_peer_t *none = NULL;

        xfer_context_params_default(&params_other);
        params_other.name = "prefill-other";
        params_other.transports = strcmp(test_tls(), "tcp") == 0 ? "shm" : "tcp";
        assert_int_equal(xfer_context_create(&params_other, &other), TDM_OK);
        assert_int_equal(xfer_peer_connect(other, &remote.desc, &none), TDM_ERR_UNSUPPORTED);
        assert_null(none);
        assert_int_equal(xfer_context_n_peers(other), 0);
        xfer_context_destroy(other);
    }

    /* A context that accepts only rc (and cuda_ipc) must refuse shm and tcp. */
    assert_int_equal(xfer_lane_mask_parse("rc,cuda_ipc", &other), TDM_OK);
    assert_int_equal(make_context("prefill-strict", other, 8, NULL, NULL, &strict), TDM_OK);
    assert_int_equal(make_pool(strict, PAGE_BYTES, &pool), TDM_OK);
    assert_int_equal(xfer_peer_connect(strict, &remote.desc, &peer), TDM_OK);
    memset(&params, 0, sizeof(params));
    params.op = XFER_OP_PUT;
    params.local_pool = pool;
    params.local_pages = pages;
    params.remote_pages = pages;
    params.n_pages = 4;
    params.done = batch_done;
    params.done_arg = &wait;
    assert_int_equal(xfer_batch_post(peer, &params), TDM_IN_PROGRESS);
    while (!wait.done) {
        xfer_context_wait(strict, 100);
    }
    assert_int_equal(wait.result.status, TDM_ERR_UNSUPPORTED);
    assert_int_equal(wait.result.lane.cls, expected_lane());
    assert_int_equal(xfer_peer_status(peer), TDM_ERR_UNSUPPORTED);
    memset(&wait, 0, sizeof(wait));
    assert_int_equal(xfer_batch_post(peer, &params), TDM_ERR_UNSUPPORTED);
    assert_false(wait.done);
    xfer_metrics_get(xfer_context_metrics(strict), &snap);
    assert_int_equal(snap.n_lane_refusals, 1);

    xfer_peer_close(peer);
    xfer_pool_destroy(pool);
    xfer_context_destroy(strict);
    finish(&remote);
}

static void test_notice_into_parent_wakes_efd_poller(void **state)
{
    fixture_t *fx = *state;
    remote_t remote;
    const uint8_t *desc;
    size_t desc_bytes;
    put_to_t cmd;
    uint8_t *body;
    uint64_t t_start_ns;
    int32_t status = -100;

    spawn("decode-writer", &remote);
    xfer_pool_descriptor(fx->pool, &desc, &desc_bytes);
    body = malloc(sizeof(cmd) + desc_bytes);
    assert_non_null(body);
    memset(&cmd, 0, sizeof(cmd));
    cmd.seed = fx->seed ^ 0xabc;
    cmd.n_pages = 64;
    memcpy(body, &cmd, sizeof(cmd));
    memcpy(body + sizeof(cmd), desc, desc_bytes);
    assert_int_equal(send_msg(remote.sock, MSG_PUT_TO, body, (uint32_t)(sizeof(cmd) + desc_bytes)),
                     0);
    free(body);

    /* Sleep on the efd (armed) until the notice arrives; the child's reply comes after. */
    t_start_ns = tdm_clock_now_ns();
    while (fx->n_notices == 0) {
        struct pollfd pfd = {xfer_context_efd(fx->ctx), POLLIN, 0};

        assert_true(tdm_clock_elapsed_ms(t_start_ns) < DEADLINE_MS);
        xfer_context_progress(fx->ctx);
        if (fx->n_notices > 0 || xfer_context_arm(fx->ctx) == TDM_ERR_BUSY) {
            continue;
        }
        poll(&pfd, 1, (int)xfer_context_max_sleep_ms(fx->ctx));
    }
    assert_int_equal(fx->last_notice.status, TDM_OK);
    assert_int_equal(fx->last_notice.n_pages, 64);
    assert_int_equal(fx->last_notice.job_id, cmd.seed);
    assert_string_equal(fx->last_notice.sender_name, "decode-writer");
    assert_int_equal(fx->last_notice.pool_id, xfer_pool_id(fx->pool));
    assert_int_equal(fx->last_n_exact_bad, 0);
    await_msg(fx, &remote, MSG_OK, &status, sizeof(status));
    assert_int_equal(status, TDM_OK);
    finish(&remote);
}

static void test_post_errors_change_nothing(void **state)
{
    fixture_t *fx = *state;
    remote_t remote;
    xfer_peer_t *peer = NULL;
    xfer_pool_t *odd_pool = NULL;
    xfer_context_t *small = NULL;
    xfer_pool_t *small_pool = NULL;
    xfer_peer_t *small_peer = NULL;
    xfer_batch_params_t params;
    batch_wait_t wait = {0};
    batch_wait_t wait2 = {0};
    uint32_t pages[2] = {0, 1};
    uint32_t bad[2] = {0, POOL_PAGES};
    xfer_metrics_snapshot_t before;
    xfer_metrics_snapshot_t after;

    spawn("decode-err", &remote);
    assert_int_equal(xfer_peer_connect(fx->ctx, &remote.desc, &peer), TDM_OK);
    xfer_metrics_get(xfer_context_metrics(fx->ctx), &before);
    memset(&params, 0, sizeof(params));
    params.op = XFER_OP_PUT;
    params.local_pool = fx->pool;
    params.local_pages = pages;
    params.remote_pages = bad;
    params.n_pages = 2;
    params.done = batch_done;
    params.done_arg = &wait;
    assert_int_equal(xfer_batch_post(peer, &params), TDM_ERR_INVALID_ARG); /* remote index */
    params.remote_pages = pages;
    params.local_pages = bad;
    assert_int_equal(xfer_batch_post(peer, &params), TDM_ERR_INVALID_ARG); /* local index */
    params.local_pages = pages;
    params.done = NULL;
    assert_int_equal(xfer_batch_post(peer, &params), TDM_ERR_INVALID_ARG); /* no callback */
    params.done = batch_done;
    params.op = XFER_OP_GET;
    params.flags = XFER_BATCH_NOTICE;
    assert_int_equal(xfer_batch_post(peer, &params), TDM_ERR_INVALID_ARG); /* notice on get */
    params.op = XFER_OP_PUT;
    params.flags = 0;
    params.n_pages = 0;
    assert_int_equal(xfer_batch_post(peer, &params), TDM_ERR_INVALID_ARG); /* empty, no notice */
    params.n_pages = 2;

    assert_int_equal(make_pool(fx->ctx, PAGE_BYTES * 2, &odd_pool), TDM_OK);
    params.local_pool = odd_pool;
    assert_int_equal(xfer_batch_post(peer, &params), TDM_ERR_MISMATCH); /* page sizes */
    params.local_pool = fx->pool;
    xfer_pool_destroy(odd_pool);

    assert_int_equal(xfer_context_n_inflight(fx->ctx), 0);
    assert_false(wait.done);
    xfer_metrics_get(xfer_context_metrics(fx->ctx), &after);
    assert_memory_equal(&before, &after, sizeof(before));

    /* A full context says busy until progress delivers a finished batch. */
    assert_int_equal(make_context("prefill-small", 0, 1, NULL, NULL, &small), TDM_OK);
    assert_int_equal(make_pool(small, PAGE_BYTES, &small_pool), TDM_OK);
    assert_int_equal(xfer_peer_connect(small, &remote.desc, &small_peer), TDM_OK);
    params.local_pool = small_pool;
    assert_int_equal(xfer_batch_post(small_peer, &params), TDM_IN_PROGRESS);
    params.done_arg = &wait2;
    assert_int_equal(xfer_batch_post(small_peer, &params), TDM_ERR_BUSY);
    while (!wait.done) {
        xfer_context_wait(small, 100);
    }
    assert_int_equal(wait.result.status, TDM_OK);
    assert_int_equal(xfer_batch_post(small_peer, &params), TDM_IN_PROGRESS);
    while (!wait2.done) {
        xfer_context_wait(small, 100);
    }
    assert_int_equal(wait2.result.status, TDM_OK);
    xfer_peer_close(small_peer);
    xfer_pool_destroy(small_pool);
    xfer_context_destroy(small);

    /* Bad descriptors never reach UCX. */
    {
        uint8_t *copy = malloc(remote.desc_n_bytes);
        xfer_desc_t parsed;

        assert_non_null(copy);
        memcpy(copy, remote.desc_bytes, remote.desc_n_bytes);
        copy[remote.desc_n_bytes / 2] ^= 0x40;
        assert_int_equal(xfer_desc_parse(copy, remote.desc_n_bytes, &parsed), TDM_ERR_MISMATCH);
        free(copy);
    }
    xfer_peer_close(peer);
    finish(&remote);
}

static void test_metrics_render_as_prometheus_text(void **state)
{
    fixture_t *fx = *state;
    remote_t remote;
    xfer_peer_t *peer = NULL;
    uint32_t pages[7];
    batch_wait_t wait;
    char *text = NULL;
    size_t n_bytes = 0;
    char expect[160];

    spawn("decode-metrics", &remote);
    assert_int_equal(xfer_peer_connect(fx->ctx, &remote.desc, &peer), TDM_OK);
    assert_int_equal(post_put(fx, peer, 7, pages, &wait), TDM_IN_PROGRESS);
    await_batch(fx, &wait);
    assert_int_equal(wait.result.status, TDM_OK);
    assert_int_equal(xfer_metrics_render(xfer_context_metrics(fx->ctx), &text, &n_bytes), TDM_OK);
    assert_int_equal(strlen(text), n_bytes);
    assert_non_null(strstr(text, "# TYPE tandem_xfer_pages_total counter\n"));
    assert_non_null(strstr(text, "tandem_xfer_pages_total{op=\"put\"} 7\n"));
    snprintf(expect, sizeof(expect), "tandem_xfer_bytes_total{op=\"put\"} %u\n", 7 * PAGE_BYTES);
    assert_non_null(strstr(text, expect));
    snprintf(expect, sizeof(expect), "tandem_xfer_lane_batches_total{lane=\"%s\"} 1\n",
             xfer_lane_class_name(expected_lane()));
    assert_non_null(strstr(text, expect));
    assert_non_null(
        strstr(text, "tandem_xfer_batch_latency_seconds_bucket{op=\"put\",le=\"+Inf\"} 1\n"));
    assert_non_null(strstr(text, "tandem_xfer_batch_latency_seconds_count{op=\"put\"} 1\n"));
    free(text);
    xfer_peer_close(peer);
    finish(&remote);
}

static void test_create_and_connect_errors_change_nothing(void **state)
{
    fixture_t *fx = *state;
    xfer_context_params_t params;
    xfer_context_t *ctx = NULL;
    xfer_pool_params_t pool_params;
    xfer_pool_t *pool = NULL;
    xfer_peer_t *peer = NULL;
    xfer_desc_t own;
    const uint8_t *bytes;
    size_t n_bytes;
    char long_name[80];

    xfer_context_params_default(&params);
    params.name = "";
    assert_int_equal(xfer_context_create(&params, &ctx), TDM_ERR_INVALID_ARG);
    memset(long_name, 'w', sizeof(long_name) - 1);
    long_name[sizeof(long_name) - 1] = '\0';
    params.name = long_name;
    assert_int_equal(xfer_context_create(&params, &ctx), TDM_ERR_INVALID_ARG);
    params.name = "ok";
    params.max_batches = 0;
    assert_int_equal(xfer_context_create(&params, &ctx), TDM_ERR_INVALID_ARG);
    xfer_context_params_default(&params);
    params.transports = "no_such_transport";
    assert_int_equal(xfer_context_create(&params, &ctx), TDM_ERR_UNSUPPORTED);
    assert_null(ctx);

    memset(&pool_params, 0, sizeof(pool_params));
    pool_params.page_size_bytes = 0;
    pool_params.n_pages = 4;
    assert_int_equal(xfer_pool_create(fx->ctx, &pool_params, &pool), TDM_ERR_INVALID_ARG);
    pool_params.page_size_bytes = PAGE_BYTES;
    pool_params.mem_type = (xfer_mem_type_t)7;
    assert_int_equal(xfer_pool_create(fx->ctx, &pool_params, &pool), TDM_ERR_INVALID_ARG);
    if (!xfer_pool_device_memory_available()) {
        pool_params.mem_type = XFER_MEM_CUDA; /* no CUDA in the build, or no device */
        assert_int_equal(xfer_pool_create(fx->ctx, &pool_params, &pool), TDM_ERR_UNSUPPORTED);
    }
    assert_null(pool);

    /* Our own descriptor is not a peer. */
    xfer_pool_descriptor(fx->pool, &bytes, &n_bytes);
    assert_int_equal(xfer_desc_parse(bytes, n_bytes, &own), TDM_OK);
    assert_true(own.incarnation_id == xfer_context_incarnation_id(fx->ctx));
    assert_string_equal(own.name, xfer_context_name(fx->ctx));
    assert_int_equal(xfer_peer_connect(fx->ctx, &own, &peer), TDM_ERR_INVALID_ARG);
    assert_null(peer);
    assert_int_equal(xfer_context_n_peers(fx->ctx), 0);

    /* Nothing to do: waiting times out; arming succeeds. */
    assert_int_equal(xfer_context_wait(fx->ctx, 20), TDM_ERR_TIMEOUT);
    xfer_context_progress(fx->ctx);
    assert_int_equal(xfer_context_arm(fx->ctx), TDM_OK);
    xfer_context_destroy(NULL);
    xfer_pool_destroy(NULL);
    xfer_peer_close(NULL);
}

static void test_device_pool_put_and_get(void **state)
{
#ifndef TANDEM_HAVE_CUDA
    (void)state;
    print_message("built without CUDA (TANDEM_HAVE_CUDA off): skipping\n");
    skip();
#else
    fixture_t *fx = *state;
    xfer_pool_params_t pool_params;
    xfer_pool_t *device_pool = NULL;
    remote_t remote;
    xfer_peer_t *peer = NULL;
    xfer_batch_params_t params;
    batch_wait_t wait = {0};
    notice_report_t report;
    uint32_t pages[64];
    uint8_t host[PAGE_BYTES];
    uint8_t *payload;
    size_t payload_bytes = 0;
    uint64_t seed = fx->seed ^ 0xd;
    tdm_status_t status;
    uint32_t n_bad = 0;

    if (!xfer_pool_device_memory_available()) {
        print_message("no CUDA device: skipping\n");
        skip();
    }
    memset(&pool_params, 0, sizeof(pool_params));
    pool_params.page_size_bytes = PAGE_BYTES;
    pool_params.n_pages = 64;
    pool_params.mem_type = XFER_MEM_CUDA;
    status = xfer_pool_create(fx->ctx, &pool_params, &device_pool);
    if (status == TDM_ERR_UNSUPPORTED) {
        print_message("UCX cannot register CUDA memory (libucx built without CUDA): skipping\n");
        skip();
    }
    assert_int_equal(status, TDM_OK);
    for (uint32_t i = 0; i < 64; i++) {
        pages[i] = i;
        fill_pattern(host, seed, i);
        assert_int_equal(
            cudaMemcpy(xfer_pool_page(device_pool, i), host, PAGE_BYTES, cudaMemcpyHostToDevice),
            cudaSuccess);
    }

    /* Device pages -> the child's host pool, with a notice (checksums via staging copies). */
    spawn("decode-device", &remote);
    assert_int_equal(xfer_peer_connect(fx->ctx, &remote.desc, &peer), TDM_OK);
    payload = pattern_payload(seed, pages, 64, &payload_bytes);
    assert_non_null(payload);
    memset(&params, 0, sizeof(params));
    params.op = XFER_OP_PUT;
    params.flags = XFER_BATCH_NOTICE;
    params.job_id = 64;
    params.local_pool = device_pool;
    params.local_pages = pages;
    params.remote_pages = pages;
    params.n_pages = 64;
    params.payload = payload;
    params.payload_bytes = payload_bytes;
    params.done = batch_done;
    params.done_arg = &wait;
    assert_int_equal(xfer_batch_post(peer, &params), TDM_IN_PROGRESS);
    free(payload);
    await_batch(fx, &wait);
    assert_int_equal(wait.result.status, TDM_OK);
    print_message("device put: lane %s (%s)\n", xfer_lane_class_name(wait.result.lane.cls),
                  wait.result.lane.text);
    await_msg(fx, &remote, MSG_NOTICE, &report, sizeof(report));
    assert_int_equal(report.status, TDM_OK);
    assert_int_equal(report.n_exact_bad, 0);

    /* The child's host pages -> device pages. */
    seed ^= 0x77;
    command(fx, &remote, MSG_FILL, &seed, sizeof(seed), TDM_OK);
    memset(&params, 0, sizeof(params));
    memset(&wait, 0, sizeof(wait));
    params.op = XFER_OP_GET;
    params.local_pool = device_pool;
    params.local_pages = pages;
    params.remote_pages = pages;
    params.n_pages = 64;
    params.done = batch_done;
    params.done_arg = &wait;
    assert_int_equal(xfer_batch_post(peer, &params), TDM_IN_PROGRESS);
    await_batch(fx, &wait);
    assert_int_equal(wait.result.status, TDM_OK);
    for (uint32_t i = 0; i < 64; i++) {
        assert_int_equal(
            cudaMemcpy(host, xfer_pool_page(device_pool, i), PAGE_BYTES, cudaMemcpyDeviceToHost),
            cudaSuccess);
        if (!pattern_matches(host, seed, i)) {
            n_bad++;
        }
    }
    assert_int_equal(n_bad, 0);
    xfer_peer_close(peer);
    finish(&remote);
    xfer_pool_destroy(device_pool);
#endif
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_put_1_7_64_4096_pages_bit_exact, setup, teardown),
        cmocka_unit_test_setup_teardown(test_get_1_7_64_4096_pages_bit_exact, setup, teardown),
        cmocka_unit_test_setup_teardown(test_notice_checksum_mismatch_is_detected, setup, teardown),
        cmocka_unit_test_setup_teardown(test_state_record_payload_arrives_whole, setup, teardown),
        cmocka_unit_test_setup_teardown(test_receiver_killed_mid_transfer_fails_only_that_peer,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_restarted_peer_reached_by_new_descriptor_old_refused,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_required_transport_refuses_other_lanes, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_notice_into_parent_wakes_efd_poller, setup, teardown),
        cmocka_unit_test_setup_teardown(test_post_errors_change_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_metrics_render_as_prometheus_text, setup, teardown),
        cmocka_unit_test_setup_teardown(test_create_and_connect_errors_change_nothing, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_device_pool_put_and_get, setup, teardown),
    };

    if (argc >= 2 && strcmp(argv[1], "--xfer-child") == 0) {
        return child_main(argc, argv);
    }
    if (getenv("TANDEM_TEST_FILTER") != NULL) {
        cmocka_set_test_filter(getenv("TANDEM_TEST_FILTER")); /* run one test while debugging */
    }
    signal(SIGPIPE, SIG_IGN);
    tdm_log_set_level(TDM_LOG_WARN);
    print_message("transport: %s\n", test_tls());
    return cmocka_run_group_tests(tests, NULL, NULL);
}
