/* test_router_handshake.c - issue 16, "the handshake covers what the pair must agree on", and
 * the router's side of liveness:
 *   - the registry and placement alone, on a fake clock: a router that itself stalls never
 *     declares its workers dead on resume (silence counts only while its loop runs); a worker
 *     reporting Load.stalled is not placed on and is lost only after its grace; placement never
 *     pairs a prefill worker and a decode worker that share no transport, nor sends a worker a
 *     sequence longer than its declared Capacity.max_tokens;
 *   - a router on loopback with fake workers (test_router_fake.h): a worker of another checkpoint
 *     revision (same fingerprint, other weights digest) or another KV layout cannot register; a
 *     prefill worker on tcp and a decode worker on shm: turns prefill on the decode node (200,
 *     not 503), counted in /metrics; a prefill worker too small for a prompt is never sent it,
 *     one that answers ERROR_TOO_LARGE makes the turn fall back to local prefill at once; a
 *     prompt longer than every decode worker declares is a clean 400 naming the limit, not
 *     retries.
 * Waits are polls with deadlines, never sleeps. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>

#include "common/clock.h"
#include "common/log.h"
#include "router/model.h"
#include "router/placement.h"
#include "router/registry.h"
#include "router/router.h"
#include "router_test_util.h"
#include "test_router_fake.h"

#define PATH_BYTES           4096
#define ERR_BYTES            512
#define LOCAL_PREFILL_TOKENS 64
#define MS                   TDM_NS_PER_MS

/* ---- registry and placement on a fake clock ----------------------------------------------- */

typedef struct {
    Tandem__Register reg;
    Tandem__PageFormat pf;
    Tandem__Capacity cap;
    char *kv[2];
    char *transports[4];
} reg_msg_t;

static const proto_compat_t *test_compat(void)
{
    static const char *kv[2] = {PROTO_KV_FORMAT_MAIN, PROTO_KV_FORMAT_INDEX};
    static proto_compat_t c;

    memset(&c, 0, sizeof(c));
    c.model_fingerprint = 0x1234;
    c.weights_digest = 0x5678;
    c.page_format_version = KERN_KV_PAGE_VERSION;
    c.page_rows = KERN_KV_PAGE_ROWS;
    c.page_bytes = 1000;
    c.tokens_per_block = 128;
    c.kv_formats = kv;
    c.n_kv_formats = 2;
    c.kv_layout = "tandem-kv1:test";
    c.max_context = 4096;
    c.protocol_version = PROTO_VERSION;
    return &c;
}

/* A Register of worker `id` matching test_compat, with transports (comma-free names, NULL
 * terminated) and max_tokens. */
static void make_reg(reg_msg_t *m, const char *id, Tandem__Role role, const char *const *names,
                     uint64_t max_tokens)
{
    tandem__register__init(&m->reg);
    tandem__page_format__init(&m->pf);
    tandem__capacity__init(&m->cap);
    m->kv[0] = PROTO_KV_FORMAT_MAIN;
    m->kv[1] = PROTO_KV_FORMAT_INDEX;
    m->pf.version = KERN_KV_PAGE_VERSION;
    m->pf.rows_per_page = KERN_KV_PAGE_ROWS;
    m->pf.page_bytes = 1000;
    m->pf.tokens_per_block = 128;
    m->cap.total_pages = role == TANDEM__ROLE__ROLE_DECODE ? 100 : 0;
    m->cap.max_sequences = 8;
    m->cap.max_tokens = max_tokens;
    m->reg.role = role;
    m->reg.incarnation_id = (char *)id;
    m->reg.rack = "rack0";
    m->reg.node = "host";
    m->reg.model_fingerprint = 0x1234;
    m->reg.weights_digest = 0x5678;
    m->reg.kv_layout = "tandem-kv1:test";
    m->reg.page_format = &m->pf;
    m->reg.kv_formats = m->kv;
    m->reg.n_kv_formats = 2;
    m->reg.max_context = 4096;
    m->reg.protocol_version = PROTO_VERSION;
    m->reg.capacity = &m->cap;
    m->reg.n_transports = 0;
    for (size_t i = 0; names != NULL && names[i] != NULL && i < 4; i++) {
        m->transports[i] = (char *)names[i];
        m->reg.n_transports = i + 1;
    }
    m->reg.transports = m->transports;
}

static int add_worker_on(router_registry_t *r, const char *id, Tandem__Role role,
                         const char *const *names, uint64_t max_tokens, const char *node,
                         uint64_t now_ns)
{
    reg_msg_t m;
    char reason[ERR_BYTES] = "";
    int slot = -1;

    make_reg(&m, id, role, names, max_tokens);
    m.reg.node = (char *)node;
    assert_int_equal(router_registry_register(r, id, &m.reg, now_ns, &slot, reason, sizeof(reason)),
                     TDM_OK);
    return slot;
}

static int add_worker(router_registry_t *r, const char *id, Tandem__Role role,
                      const char *const *names, uint64_t max_tokens, uint64_t now_ns)
{
    return add_worker_on(r, id, role, names, max_tokens, "host", now_ns);
}

static void heartbeat(router_registry_t *r, const char *id, int stalled, uint32_t free_pages,
                      uint64_t now_ns)
{
    Tandem__Heartbeat hb = TANDEM__HEARTBEAT__INIT;
    Tandem__Load load = TANDEM__LOAD__INIT;

    load.stalled = stalled;
    load.pending_work = stalled ? 1 : 0;
    load.free_pages = free_pages;
    load.total_pages = 100;
    hb.load = &load;
    assert_int_equal(router_registry_heartbeat(r, id, &hb, now_ns), TDM_OK);
}

/* Issue 16: the router's loop not running for 2.5 s (descheduled, SIGSTOP, a long GC-like pause)
 * is the router's stall, not its workers' silence: on resume nobody is declared lost; silence
 * while the router runs still is. Fails on the old registry, which counted the gap. */
static void test_router_stall_is_not_counted_against_workers(void **state)
{
    router_registry_t *r = NULL;
    const char *why = NULL;
    uint64_t t = 1000 * MS;
    router_registry_stats_t st;
    int slot;

    (void)state;
    assert_int_equal(router_registry_create(test_compat(), 1500, &r), TDM_OK);
    router_registry_tick(r, t);
    slot = add_worker(r, "decode-a", TANDEM__ROLE__ROLE_DECODE, NULL, 0, t);
    /* running normally: ticks every 10 ms, heartbeats every 250 ms, for a second */
    for (int i = 1; i <= 100; i++) {
        t += 10 * MS;
        router_registry_tick(r, t);
        if (i % 25 == 0) {
            heartbeat(r, "decode-a", 0, 50, t);
        }
        assert_int_equal(router_registry_expire(r, t, &why), -1);
    }
    /* the router stalls for 2.5 s, longer than the 1.5 s timeout; its worker's heartbeats of that
     * time are lost to it (a real socket would still hold them; the worst case is none) */
    t += 2500 * MS;
    assert_true(router_registry_tick(r, t) > 0);
    assert_int_equal(router_registry_expire(r, t, &why), -1);
    router_registry_stats(r, &st);
    assert_int_equal(st.n_decode, 1);
    assert_true(st.router_stall_ms_total >= 2000);
    /* silence while the router runs still counts: 1.5 s of it (less the one 100 ms tick the gap
     * counted as running) and the worker is lost */
    for (int i = 0; i < 135; i++) {
        t += 10 * MS;
        router_registry_tick(r, t);
        assert_int_equal(router_registry_expire(r, t, &why), -1);
    }
    t += 200 * MS;
    router_registry_tick(r, t);
    for (int i = 0; i < 10 && router_registry_expire(r, t, &why) < 0; i++) {
        t += 10 * MS;
        router_registry_tick(r, t);
    }
    assert_int_equal(router_registry_expire(r, t, &why), slot);
    assert_string_equal(why, "heartbeat timeout");
    router_registry_destroy(r);
}

/* A worker that reports Load.stalled gets no new work at once and is lost after its grace, while
 * its heartbeats keep coming (its I/O thread is fine; its compute thread is wedged). */
static void test_stalled_worker_is_skipped_then_lost_after_its_grace(void **state)
{
    router_registry_t *r = NULL;
    const char *why = NULL;
    uint64_t t = 1000 * MS;
    uint64_t gen = 0;
    router_place_miss_t miss = ROUTER_PLACE_MISS_NONE;
    router_registry_stats_t st;
    int busy;
    int wedged;

    (void)state;
    assert_int_equal(router_registry_create(test_compat(), 1500, &r), TDM_OK);
    router_registry_set_stall_grace(r, 2000);
    router_registry_tick(r, t);
    busy = add_worker(r, "decode-busy", TANDEM__ROLE__ROLE_DECODE, NULL, 0, t);
    wedged = add_worker(r, "decode-wedged", TANDEM__ROLE__ROLE_DECODE, NULL, 0, t);
    heartbeat(r, "decode-busy", 0, 10, t);   /* 90% occupied */
    heartbeat(r, "decode-wedged", 0, 99, t); /* nearly empty: placement's favourite */
    assert_int_equal(router_place_decode(r, 10, &gen, NULL, NULL), wedged);
    heartbeat(r, "decode-wedged", 1, 99, t);
    assert_int_equal(router_place_decode(r, 10, &gen, NULL, NULL), busy);
    router_registry_stats(r, &st);
    assert_int_equal(st.n_stalled, 1);
    /* heartbeats keep it from the silence timeout; the stall grace (2 s) runs */
    for (int i = 1; i <= 190; i++) {
        t += 10 * MS;
        router_registry_tick(r, t);
        if (i % 25 == 0) {
            heartbeat(r, "decode-busy", 0, 10, t);
            heartbeat(r, "decode-wedged", 1, 99, t);
        }
        assert_int_equal(router_registry_expire(r, t, &why), -1);
    }
    for (int i = 0; i < 20 && router_registry_expire(r, t, &why) < 0; i++) {
        t += 10 * MS;
        router_registry_tick(r, t);
    }
    assert_int_equal(router_registry_expire(r, t, &why), wedged);
    assert_non_null(strstr(why, "stalled"));
    router_registry_remove(r, wedged, ROUTER_REGISTRY_LOST, why);
    /* only stalled decode workers left: the miss says so */
    heartbeat(r, "decode-busy", 1, 10, t);
    assert_int_equal(router_place_decode(r, 10, &gen, &miss, NULL), -1);
    assert_int_equal(miss, ROUTER_PLACE_MISS_STALLED);
    router_registry_destroy(r);
}

static void test_placement_pairs_only_shared_transports_and_declared_capacity(void **state)
{
    static const char *const shm[] = {"shm", NULL};
    static const char *const tcp[] = {"tcp", NULL};
    static const char *const both[] = {"tcp", "shm", NULL};
    router_registry_t *r = NULL;
    router_registry_stats_t st;
    router_place_miss_t miss = ROUTER_PLACE_MISS_NONE;
    uint64_t gen = 0;
    uint64_t largest = 0;
    const router_worker_t *dec;
    int d;
    int p_tcp;
    int p_small;

    (void)state;
    assert_int_equal(router_registry_create(test_compat(), 1500, &r), TDM_OK);
    d = add_worker(r, "decode-shm", TANDEM__ROLE__ROLE_DECODE, shm, 1000, 1);
    p_tcp = add_worker(r, "prefill-tcp", TANDEM__ROLE__ROLE_PREFILL, tcp, 0, 1);
    dec = router_registry_worker(r, d, 0);
    router_registry_stats(r, &st);
    assert_int_equal(st.n_transport_mismatch_total, 1); /* flagged at registration */
    assert_int_equal(router_place_prefill(r, dec, 100, &gen, &miss), -1);
    assert_int_equal(miss, ROUTER_PLACE_MISS_TRANSPORT);
    /* without a decode worker to reach (no pairing) any prefill worker would do */
    assert_int_equal(router_place_prefill(r, NULL, 100, &gen, NULL), p_tcp);

    p_small = add_worker(r, "prefill-small", TANDEM__ROLE__ROLE_PREFILL, both, 256, 1);
    assert_int_equal(router_place_prefill(r, dec, 256, &gen, &miss), p_small);
    miss = ROUTER_PLACE_MISS_NONE;
    assert_int_equal(router_place_prefill(r, dec, 257, &gen, &miss), -1);
    assert_int_equal(miss, ROUTER_PLACE_MISS_CAPACITY); /* capacity outranks transport */

    /* decode workers: never a sequence past max_tokens; the miss names the largest */
    assert_int_equal(router_place_decode(r, 1000, &gen, NULL, NULL), d);
    assert_int_equal(router_place_decode(r, 1001, &gen, &miss, &largest), -1);
    assert_int_equal(miss, ROUTER_PLACE_MISS_CAPACITY);
    assert_int_equal(largest, 1000);
    /* a worker that declared nothing (0) holds what its max_context allows */
    assert_int_equal(router_place_decode(r, 1001, &gen, NULL, NULL), -1);
    add_worker(r, "decode-any", TANDEM__ROLE__ROLE_DECODE, NULL, 0, 1);
    assert_true(router_place_decode(r, 1001, &gen, NULL, NULL) >= 0);
    router_registry_destroy(r);

    /* shared memory reaches only the same host: shm-only workers on two hosts never pair */
    assert_int_equal(router_registry_create(test_compat(), 1500, &r), TDM_OK);
    d = add_worker_on(r, "decode-host1", TANDEM__ROLE__ROLE_DECODE, shm, 0, "host1", 1);
    p_tcp = add_worker_on(r, "prefill-host2", TANDEM__ROLE__ROLE_PREFILL, shm, 0, "host2", 1);
    dec = router_registry_worker(r, d, 0);
    assert_int_equal(router_place_prefill(r, dec, 100, &gen, &miss), -1);
    assert_int_equal(miss, ROUTER_PLACE_MISS_TRANSPORT);
    p_small = add_worker_on(r, "prefill-host1", TANDEM__ROLE__ROLE_PREFILL, shm, 0, "host1", 1);
    assert_int_equal(router_place_prefill(r, dec, 100, &gen, NULL), p_small);
    router_registry_stats(r, &st);
    assert_int_equal(st.n_transport_mismatch_total, 1);
    router_registry_destroy(r);
}

/* ---- a router with fake workers ----------------------------------------------------------- */

typedef rtu_router_t fixture_t; /* router_test_util.h */

typedef struct {
    long status;
    char *body;
    size_t n_body;
} http_resp_t;

static size_t on_body(char *data, size_t size, size_t n, void *arg)
{
    http_resp_t *r = arg;
    char *grown = realloc(r->body, r->n_body + size * n + 1);

    if (grown == NULL) {
        return 0;
    }
    r->body = grown;
    memcpy(r->body + r->n_body, data, size * n);
    r->n_body += size * n;
    r->body[r->n_body] = '\0';
    return size * n;
}

static void http_do(int port, const char *path, const char *body, http_resp_t *out)
{
    CURL *curl = curl_easy_init();
    struct curl_slist *headers = NULL;
    char url[256];

    memset(out, 0, sizeof(*out));
    assert_non_null(curl);
    snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", port, path);
    curl_easy_setopt(curl, CURLOPT_URL, url);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, out);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT, 30L);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    if (body != NULL) {
        headers = curl_slist_append(headers, "Content-Type: application/json");
        curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    }
    assert_int_equal(curl_easy_perform(curl), CURLE_OK);
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &out->status);
    curl_slist_free_all(headers);
    curl_easy_cleanup(curl);
    if (out->body == NULL) {
        out->body = calloc(1, 1);
    }
}

static int setup_router(void **state)
{
    fixture_t *fx =
        rtu_router_start("handshake-model", FAKE_HEARTBEAT_MS, 2000, LOCAL_PREFILL_TOKENS);

    if (fx == NULL) {
        return -1;
    }
    *state = fx;
    return 0;
}

/* Real workers started and not yet stopped: teardown stops them when a test fails half-way. */
#define MAX_SPAWNED 8
static pid_t g_spawned[MAX_SPAWNED];
static void stop_worker(pid_t pid);

static int teardown_router(void **state)
{
    fixture_t *fx = *state;

    for (size_t i = 0; i < MAX_SPAWNED; i++) {
        if (g_spawned[i] != 0) {
            stop_worker(g_spawned[i]);
        }
    }
    rtu_router_stop(fx);
    return 0;
}

static void start_fake(fake_worker_t *w)
{
    fake_start(w);
    assert_int_equal(fake_wait_registered(w, 5000), 1);
}

static void stop_fake(fake_worker_t *w)
{
    fake_kill(w);
    fake_fini(w);
}

/* A /v1/completions body of n prompt ids (none special) and max_tokens 4. */
static char *ids_body(size_t n)
{
    char *body = malloc(n * 8 + 128);
    size_t used = (size_t)sprintf(body, "{\"model\":\"tiny\",\"max_tokens\":4,\"prompt\":[");

    for (size_t i = 0; i < n; i++) {
        used += (size_t)sprintf(body + used, "%s%d", i > 0 ? "," : "", (int)(50 + i % 200));
    }
    sprintf(body + used, "]}");
    return body;
}

static void post_ids(const fixture_t *fx, size_t n, http_resp_t *r)
{
    char *body = ids_body(n);

    http_do(fx->port, "/v1/completions", body, r);
    free(body);
}

/* The sample of /metrics on the line starting `line_prefix` (e.g.
 * "tandem_x{reason=\"transport\"} "), or -1. */
static double metric(const fixture_t *fx, const char *line_prefix)
{
    char want[256];
    http_resp_t r;
    const char *at;
    double v = -1.0;

    snprintf(want, sizeof(want), "\n%s", line_prefix);
    http_do(fx->port, "/metrics", NULL, &r);
    at = strstr(r.body, want);
    if (at != NULL) {
        v = strtod(at + strlen(want), NULL);
    }
    free(r.body);
    return v;
}

/* Issue 16: two checkpoints with the same config (same model fingerprint) and different weights
 * cannot join the same cluster; nor can a worker of another KV layout. */
static void test_other_weights_or_kv_layout_cannot_register(void **state)
{
    fixture_t *fx = *state;
    fake_worker_t other_weights;
    fake_worker_t other_layout;
    fake_worker_t good;
    char want[64];

    assert_true(fx->compat->weights_digest != 0);
    assert_non_null(fx->compat->kv_layout);
    assert_non_null(strstr(fx->compat->kv_layout, "tandem-kv1:"));

    fake_init(&other_weights, "decode-other-weights", TANDEM__ROLE__ROLE_DECODE, "rack0",
              fx->compat, fx->endpoint);
    other_weights.weights_digest ^= 0x40;
    fake_start(&other_weights);
    assert_int_equal(fake_wait_registered(&other_weights, 5000), -1);
    assert_non_null(strstr(other_weights.refuse_reason, "weights digest mismatch"));
    snprintf(want, sizeof(want), "router 0x%016llx",
             (unsigned long long)fx->compat->weights_digest);
    assert_non_null(strstr(other_weights.refuse_reason, want));
    snprintf(want, sizeof(want), "worker 0x%016llx",
             (unsigned long long)(fx->compat->weights_digest ^ 0x40));
    assert_non_null(strstr(other_weights.refuse_reason, want));

    fake_init(&other_layout, "prefill-other-layout", TANDEM__ROLE__ROLE_PREFILL, "rack0",
              fx->compat, fx->endpoint);
    snprintf(other_layout.kv_layout, sizeof(other_layout.kv_layout), "tandem-kv1:src=999");
    fake_start(&other_layout);
    assert_int_equal(fake_wait_registered(&other_layout, 5000), -1);
    assert_non_null(strstr(other_layout.refuse_reason, "kv layout mismatch"));
    assert_non_null(strstr(other_layout.refuse_reason, "src=999"));

    fake_init(&good, "decode-same", TANDEM__ROLE__ROLE_DECODE, "rack0", fx->compat, fx->endpoint);
    start_fake(&good);
    assert_true(metric(fx, "tandem_router_registrations_refused_total ") >= 2.0);
    stop_fake(&other_weights);
    stop_fake(&other_layout);
    stop_fake(&good);
}

/* Issue 16, end to end with the real executable: a copy of the router's checkpoint whose weights
 * differ only past the first MiB of a shard (same config, same model fingerprint) cannot join:
 * tandem-decode exits 3 (refused) naming the weights digests. */
static void test_real_worker_of_another_revision_is_refused(void **state)
{
    fixture_t *fx = *state;
    const char *bin = getenv("TANDEM_BIN_DIR");
    const char *tmp = getenv("TANDEM_TEST_TMP");
    char dir[PATH_BYTES];
    char log_path[PATH_BYTES];
    char command[PATH_BYTES * 6];
    char text[8192] = "";
    FILE *f;
    size_t n;

    snprintf(dir, sizeof(dir), "%.2000s/handshake-model-revision", tmp);
    snprintf(log_path, sizeof(log_path), "%.2000s/handshake-revision.log", tmp);
    /* flip the last byte of the largest shard: deep in its data, past the fingerprint's MiB */
    snprintf(command, sizeof(command),
             "rm -rf %s && cp -r %s %s && rm -f %s/.tandem-weights-digest && "
             "s=$(ls -S %s/*.safetensors | head -1) && "
             "python3 -c \"import sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); "
             "b[-1]^=0x5a; open(p,'wb').write(b)\" $s",
             dir, fx->model_dir, dir, dir, dir);
    if (rtu_run_shell("command -v python3 >/dev/null") != 0) {
        print_message("python3 not found: skipping the real-worker check\n");
        skip();
    }
    assert_int_equal(rtu_run_shell(command), 0);
    snprintf(command, sizeof(command),
             "timeout 120 %s/tandem-decode --model %s --router %s --http 127.0.0.1:0 --pages 64 "
             "--threads 1 --register-timeout-ms 20000 --log-level warn >%s 2>&1",
             bin, dir, fx->endpoint, log_path);
    assert_int_equal(rtu_run_shell(command), 3); /* NODE_EXIT_REFUSED */
    f = fopen(log_path, "rb");
    assert_non_null(f);
    n = fread(text, 1, sizeof(text) - 1, f);
    text[n] = '\0';
    fclose(f);
    if (strstr(text, "weights digest mismatch") == NULL) {
        print_message("tandem-decode said: %s\n", text);
    }
    assert_non_null(strstr(text, "weights digest mismatch"));
}

/* ---- real workers -------------------------------------------------------------------------- */

/* Start `exe` (in $TANDEM_BIN_DIR) with the model, the router and `extra` (NULL-terminated),
 * output into $TANDEM_TEST_TMP/<log_name>; returns the child's pid. */
static pid_t spawn_worker(const fixture_t *fx, const char *exe, const char *const *extra,
                          const char *log_name)
{
    const char *bin = getenv("TANDEM_BIN_DIR");
    const char *tmp = getenv("TANDEM_TEST_TMP");
    char path[PATH_BYTES];
    char log_path[PATH_BYTES];
    const char *argv[32];
    size_t n = 0;
    pid_t pid;

    snprintf(path, sizeof(path), "%.2000s/%s", bin, exe);
    snprintf(log_path, sizeof(log_path), "%.2000s/%s", tmp, log_name);
    argv[n++] = path;
    argv[n++] = "--model";
    argv[n++] = fx->model_dir;
    argv[n++] = "--router";
    argv[n++] = fx->endpoint;
    argv[n++] = "--http";
    argv[n++] = "127.0.0.1:0";
    argv[n++] = "--threads";
    argv[n++] = "1";
    argv[n++] = "--log-level";
    argv[n++] = "info";
    for (size_t i = 0; extra[i] != NULL && n + 1 < sizeof(argv) / sizeof(argv[0]); i++) {
        argv[n++] = extra[i];
    }
    argv[n] = NULL;
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        FILE *f = freopen(log_path, "w", stderr);
        (void)f;
        execv(path, (char *const *)argv);
        _exit(127);
    }
    for (size_t i = 0; i < MAX_SPAWNED; i++) {
        if (g_spawned[i] == 0) {
            g_spawned[i] = pid;
            break;
        }
    }
    return pid;
}

static void stop_worker(pid_t pid)
{
    int st = 0;

    kill(pid, SIGTERM);
    waitpid(pid, &st, 0);
    for (size_t i = 0; i < MAX_SPAWNED; i++) {
        if (g_spawned[i] == pid) {
            g_spawned[i] = 0;
        }
    }
}

/* Poll /health until it shows `want` (e.g. "\"prefill\":1,\"decode\":1") or 30 s pass. */
static int wait_health(const fixture_t *fx, const char *want)
{
    uint64_t end = tdm_clock_now_ns() + 30000 * MS;

    while (tdm_clock_now_ns() < end) {
        http_resp_t r;
        int ok;
        http_do(fx->port, "/health", NULL, &r);
        ok = strstr(r.body, want) != NULL;
        free(r.body);
        if (ok) {
            return 1;
        }
        zmq_poll(NULL, 0, 50);
    }
    return 0;
}

/* Issue 16 with the real executables: tandem-prefill --transports tcp and tandem-decode
 * --transports sm,self declare what they can use, and the router prefills those turns on the
 * decode node (200; the old router's remote turns failed). Then a prefill node with --pages 16
 * declares what 16 pages hold: a longer prompt prefills locally, a shorter one remotely, and
 * nothing is retried. */
static void test_real_workers_declare_transports_and_capacity(void **state)
{
    fixture_t *fx = *state;
    static const char *const decode_shm[] = {"--transports", "sm,self", "--pages", "512", NULL};
    static const char *const prefill_tcp[] = {"--transports", "tcp", "--pages", "512", NULL};
    static const char *const decode_any[] = {"--pages", "512", NULL};
    static const char *const prefill_small[] = {"--pages", "16", NULL};
    http_resp_t r;
    pid_t dec;
    pid_t pre;

    dec = spawn_worker(fx, "tandem-decode", decode_shm, "handshake-decode-shm.log");
    pre = spawn_worker(fx, "tandem-prefill", prefill_tcp, "handshake-prefill-tcp.log");
    assert_true(wait_health(fx, "\"prefill\":1,\"decode\":1"));
    post_ids(fx, 200, &r);
    assert_int_equal(r.status, 200);
    free(r.body);
    assert_true(metric(fx, "tandem_router_prefill_fallbacks_total{reason=\"transport\"} ") == 1.0);
    assert_true(metric(fx, "tandem_router_prefill_tokens_total{mode=\"remote\"} ") == 0.0);
    assert_true(metric(fx, "tandem_router_transport_mismatch_pairs_total ") == 1.0);
    stop_worker(pre);
    stop_worker(dec);
    assert_true(wait_health(fx, "\"prefill\":0,\"decode\":0"));

    dec = spawn_worker(fx, "tandem-decode", decode_any, "handshake-decode.log");
    pre = spawn_worker(fx, "tandem-prefill", prefill_small, "handshake-prefill-small.log");
    assert_true(wait_health(fx, "\"prefill\":1,\"decode\":1"));
    post_ids(fx, 1000, &r); /* 16 pages hold 641 tokens of the tiny preset */
    assert_int_equal(r.status, 200);
    free(r.body);
    assert_true(metric(fx, "tandem_router_prefill_fallbacks_total{reason=\"capacity\"} ") == 1.0);
    assert_true(metric(fx, "tandem_router_prefill_tokens_total{mode=\"remote\"} ") == 0.0);
    {
        char *body = malloc(600 * 8 + 128);
        size_t used = (size_t)sprintf(body, "{\"model\":\"tiny\",\"max_tokens\":4,\"prompt\":[");
        for (size_t i = 0; i < 600; i++) { /* another prefix: a new session */
            used += (size_t)sprintf(body + used, "%s%d", i > 0 ? "," : "", (int)(7 + i % 300));
        }
        sprintf(body + used, "]}");
        http_do(fx->port, "/v1/completions", body, &r);
        free(body);
    }
    assert_int_equal(r.status, 200);
    free(r.body);
    assert_true(metric(fx, "tandem_router_prefill_tokens_total{mode=\"remote\"} ") == 600.0);
    assert_true(metric(fx, "tandem_router_retries_total ") == 0.0);
    stop_worker(pre);
    stop_worker(dec);
}

/* Issue 16: a prefill node on tcp and a decode node on shm share no transport: the old router
 * sent every large turn to the prefill node, which could not reach the decode node's pages
 * (503 on every remote turn while both were healthy). Now the turn prefills on the decode node,
 * and the mismatch is flagged in /metrics. */
static void test_prefill_worker_without_a_shared_transport_is_never_paired(void **state)
{
    fixture_t *fx = *state;
    fake_worker_t dec;
    fake_worker_t pre;
    fake_record_t rec;
    http_resp_t r;

    fake_init(&dec, "decode-on-shm", TANDEM__ROLE__ROLE_DECODE, "rack0", fx->compat, fx->endpoint);
    dec.transports[0] = "shm";
    dec.n_transports = 1;
    dec.script[0] = 70;
    dec.n_script = 1;
    fake_init(&pre, "prefill-on-tcp", TANDEM__ROLE__ROLE_PREFILL, "rack0", fx->compat,
              fx->endpoint);
    pre.transports[0] = "tcp";
    pre.n_transports = 1;
    start_fake(&dec);
    start_fake(&pre);

    post_ids(fx, 200, &r);
    assert_int_equal(r.status, 200);
    free(r.body);
    assert_int_equal(fake_n_records(&pre, TANDEM__ENVELOPE__BODY_PREFILL_JOB), 0);
    assert_int_equal(fake_n_records(&dec, TANDEM__ENVELOPE__BODY_RESERVE_PAGES), 0);
    assert_true(fake_last(&dec, TANDEM__ENVELOPE__BODY_DECODE_REQUEST, &rec));
    assert_int_equal(rec.mode, TANDEM__PREFILL_MODE__PREFILL_LOCAL);
    assert_int_equal(rec.n_delta, 200);
    assert_true(metric(fx, "tandem_router_prefill_fallbacks_total{reason=\"transport\"} ") == 1.0);
    assert_true(metric(fx, "tandem_router_transport_mismatch_pairs_total ") == 1.0);
    stop_fake(&pre);
    stop_fake(&dec);
}

/* Issue 16: a prefill node with a small --pages declared the model's full context, and prompts
 * it could not hold failed four times (503 retries_exhausted) although the decode node could
 * serve them. Now: declared too small -> never sent; not declared but answering ERROR_TOO_LARGE
 * -> the same turn prefills locally at once, and the next one is not sent there. */
static void test_prefill_worker_too_small_falls_back_to_local_prefill(void **state)
{
    fixture_t *fx = *state;
    fake_worker_t dec;
    fake_worker_t small;
    fake_worker_t refusing;
    fake_record_t rec;
    http_resp_t r;

    fake_init(&dec, "decode-roomy", TANDEM__ROLE__ROLE_DECODE, "rack0", fx->compat, fx->endpoint);
    dec.script[0] = 70;
    dec.n_script = 1;
    fake_init(&small, "prefill-small", TANDEM__ROLE__ROLE_PREFILL, "rack0", fx->compat,
              fx->endpoint);
    small.max_tokens = 150;
    start_fake(&dec);
    start_fake(&small);

    post_ids(fx, 200, &r); /* 200 tokens > 150 declared */
    assert_int_equal(r.status, 200);
    free(r.body);
    assert_int_equal(fake_n_records(&small, TANDEM__ENVELOPE__BODY_PREFILL_JOB), 0);
    assert_true(fake_last(&dec, TANDEM__ENVELOPE__BODY_DECODE_REQUEST, &rec));
    assert_int_equal(rec.mode, TANDEM__PREFILL_MODE__PREFILL_LOCAL);
    assert_true(metric(fx, "tandem_router_prefill_fallbacks_total{reason=\"capacity\"} ") == 1.0);

    post_ids(fx, 100, &r); /* a new session that fits: remote as before */
    assert_int_equal(r.status, 200);
    free(r.body);
    assert_int_equal(fake_n_records(&small, TANDEM__ENVELOPE__BODY_PREFILL_JOB), 1);
    assert_true(fake_last(&dec, TANDEM__ENVELOPE__BODY_DECODE_REQUEST, &rec));
    assert_int_equal(rec.mode, TANDEM__PREFILL_MODE__PREFILL_REMOTE);
    stop_fake(&small);

    /* one that declared nothing but refuses: one job, then local; no retries */
    {
        fake_init(&refusing, "prefill-refusing", TANDEM__ROLE__ROLE_PREFILL, "rack0", fx->compat,
                  fx->endpoint);
        refusing.error_jobs = TANDEM__ERROR_CODE__ERROR_TOO_LARGE;
        start_fake(&refusing);
        post_ids(fx, 300, &r);
        if (r.status != 200) {
            print_message("got %ld: %s\n", r.status, r.body);
        }
        assert_int_equal(r.status, 200);
        free(r.body);
        assert_int_equal(fake_n_records(&refusing, TANDEM__ENVELOPE__BODY_PREFILL_JOB), 1);
        assert_true(fake_n_aborts(&dec) >= 1); /* the reservation was given back */
        assert_true(fake_last(&dec, TANDEM__ENVELOPE__BODY_DECODE_REQUEST, &rec));
        assert_int_equal(rec.mode, TANDEM__PREFILL_MODE__PREFILL_LOCAL);
        /* (not asserted: retries. The fake answers the reservation's Abort with a Finish, which
         * a real decode node does not send before its DecodeRequest; the router may count that
         * as one retry, which again prefills locally. The old router sent all four attempts to
         * the refusing worker.) */
        post_ids(fx, 310, &r); /* learnt: not sent there again */
        assert_int_equal(r.status, 200);
        free(r.body);
        assert_int_equal(fake_n_records(&refusing, TANDEM__ENVELOPE__BODY_PREFILL_JOB), 1);
        stop_fake(&refusing);
    }
    stop_fake(&dec);
}

/* Issue 16: a prompt no decode worker can hold is refused cleanly (400, naming the limit) without
 * being sent anywhere, not retried into a 503. */
static void test_prompt_longer_than_every_decode_worker_holds_is_a_clean_400(void **state)
{
    fixture_t *fx = *state;
    fake_worker_t a;
    fake_worker_t b;
    http_resp_t r;

    fake_init(&a, "decode-120", TANDEM__ROLE__ROLE_DECODE, "rack0", fx->compat, fx->endpoint);
    a.max_tokens = 120;
    fake_init(&b, "decode-90", TANDEM__ROLE__ROLE_DECODE, "rack0", fx->compat, fx->endpoint);
    b.max_tokens = 90;
    a.script[0] = b.script[0] = 70;
    a.n_script = b.n_script = 1;
    start_fake(&a);
    start_fake(&b);

    post_ids(fx, 200, &r);
    assert_int_equal(r.status, 400);
    assert_non_null(strstr(r.body, "context_length_exceeded"));
    assert_non_null(strstr(r.body, "120")); /* the largest declared limit */
    free(r.body);
    assert_int_equal(fake_n_records(&a, TANDEM__ENVELOPE__BODY_DECODE_REQUEST), 0);
    assert_int_equal(fake_n_records(&b, TANDEM__ENVELOPE__BODY_DECODE_REQUEST), 0);
    assert_true(metric(fx, "tandem_router_retries_total ") == 0.0);

    post_ids(fx, 100, &r); /* fits a only */
    assert_int_equal(r.status, 200);
    free(r.body);
    assert_int_equal(fake_n_records(&a, TANDEM__ENVELOPE__BODY_DECODE_REQUEST), 1);
    assert_int_equal(fake_n_records(&b, TANDEM__ENVELOPE__BODY_DECODE_REQUEST), 0);
    stop_fake(&a);
    stop_fake(&b);
}

/* A decode worker whose heartbeats say stalled (its I/O thread alive, its compute thread wedged)
 * gets no new session; /health counts it. */
static void test_stalled_decode_worker_gets_no_new_session(void **state)
{
    fixture_t *fx = *state;
    fake_worker_t wedged;
    fake_worker_t fine;
    http_resp_t r;
    uint64_t end;
    int seen = 0;

    fake_init(&wedged, "decode-wedged", TANDEM__ROLE__ROLE_DECODE, "rack0", fx->compat,
              fx->endpoint);
    fake_init(&fine, "decode-fine", TANDEM__ROLE__ROLE_DECODE, "rack0", fx->compat, fx->endpoint);
    wedged.script[0] = fine.script[0] = 70;
    wedged.n_script = fine.n_script = 1;
    atomic_store(&wedged.stalled, 1);
    start_fake(&wedged);
    start_fake(&fine);
    end = tdm_clock_now_ns() + 5000 * MS;
    while (!seen && tdm_clock_now_ns() < end) { /* until a heartbeat said so */
        http_do(fx->port, "/health", NULL, &r);
        seen = strstr(r.body, "\"stalled\":1") != NULL;
        free(r.body);
        zmq_poll(NULL, 0, 10);
    }
    assert_true(seen);
    for (int i = 0; i < 4; i++) {
        post_ids(fx, 10 + (size_t)i, &r);
        assert_int_equal(r.status, 200);
        free(r.body);
    }
    assert_int_equal(fake_n_records(&wedged, TANDEM__ENVELOPE__BODY_DECODE_REQUEST), 0);
    assert_int_equal(fake_n_records(&fine, TANDEM__ENVELOPE__BODY_DECODE_REQUEST), 4);
    stop_fake(&wedged);
    stop_fake(&fine);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_router_stall_is_not_counted_against_workers),
        cmocka_unit_test(test_stalled_worker_is_skipped_then_lost_after_its_grace),
        cmocka_unit_test(test_placement_pairs_only_shared_transports_and_declared_capacity),
        cmocka_unit_test_setup_teardown(test_other_weights_or_kv_layout_cannot_register,
                                        setup_router, teardown_router),
        cmocka_unit_test_setup_teardown(test_real_worker_of_another_revision_is_refused,
                                        setup_router, teardown_router),
        cmocka_unit_test_setup_teardown(
            test_prefill_worker_without_a_shared_transport_is_never_paired, setup_router,
            teardown_router),
        cmocka_unit_test_setup_teardown(test_prefill_worker_too_small_falls_back_to_local_prefill,
                                        setup_router, teardown_router),
        cmocka_unit_test_setup_teardown(
            test_prompt_longer_than_every_decode_worker_holds_is_a_clean_400, setup_router,
            teardown_router),
        cmocka_unit_test_setup_teardown(test_stalled_decode_worker_gets_no_new_session,
                                        setup_router, teardown_router),
        cmocka_unit_test_setup_teardown(test_real_workers_declare_transports_and_capacity,
                                        setup_router, teardown_router),
    };

    tdm_log_set_level(TDM_LOG_WARN);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    {
        int rc = cmocka_run_group_tests(tests, NULL, NULL);
        curl_global_cleanup();
        return rc;
    }
}
