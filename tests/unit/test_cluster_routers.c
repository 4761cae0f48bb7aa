/* test_cluster_routers.c - no single point of failure (issue 18 item 3) on a real local cluster
 * (tools/tandem local --routers N: N peer routers, two decode nodes registered with every
 * router, tiny model). A replay of several multi-turn sessions spread over the routers; on the
 * router about to die, one session's long turn runs to its end (a router killed right after a
 * turn completed), then another's long turn is streamed and the router is SIGKILLed at its first
 * chunk, so that it dies mid-turn however fast the machine decodes (that HTTP stream is cut at
 * once, not hung). Every session's next turn goes through a surviving router and continues on
 * the decode node that holds its KV without recomputing it: the turn's
 * usage.prompt_tokens_details.cached_tokens covers at least the whole previous completed prompt
 * (the long completed turn's included), and every request answers within its deadline (the
 * interrupted session's node may answer "session busy" until the killed router's orphaned turn
 * ends: the client retries that, within the deadline).
 * With 2 routers the survivor knows the sessions from the
 * replicas its peer sent after each turn (tandem_router_replicas_applied_total); with 3, the
 * sessions whose owner and replica were the killed router and the third one are unknown to the
 * survivor, which learns them from the decode nodes (Load.resident_session_keys, SessionQuery ->
 * SessionHistory: tandem_router_sessions_learned_total). The kill waits until the survivor has
 * what it takes over from: every session in its index of the nodes' reports
 * (tandem_router_resident_sessions_indexed; a session is reported within a report cycle of its
 * first turn, docs/ROUTERS.md) and, with 2 routers, every replica the victim sent. With 2
 * routers the killed one is then
 * started again (same id, control endpoint and peers), empty: every session's fourth turn on it
 * is learned from the decode nodes that re-registered, again without recomputing the previous
 * prompt. A cluster that cannot start with
 * --routers is a failure, not a skip. The harness is test_cluster_harness.h.
 */
#define T_MODEL_PREFIX "cluster-routers"
#include "test_cluster_harness.h"

#include <errno.h>
#include <poll.h>

#include "router/ring.h"

#define R_SESSIONS      4
#define R_FIRST_IDS     40
#define R_MORE_IDS      5
#define R_GEN           8
#define R_DEADLINE_MS   60000 /* every turn answers within this, before and after the kill */
#define R_MAX_TURN_MS   30000 /* a turn after the kill (relearning included) takes less */
#define R_LONG_GEN      1000 /* tokens of the turn in flight at the kill (cut at its first chunk) */
#define R_DONE_GEN      400  /* tokens of the turn that completed just before the kill */

/* Start `tandem local --routers n --prefill 0 --decode 2` with the harness; fails the test (never
 * skips) when it does not come up with n routers. */
static void fleet_start(cluster_t *c, int n)
{
    int rc;

    g_routers = n;
    rc = cluster_start(c, 0, 2, NULL, 0);
    g_routers = 1;
    if (rc != 0) {
        fail_msg("tandem local --routers %d did not start (exit %d): multi-router clusters are "
                 "required (issue 18 item 3)",
                 n, rc);
    }
    if (c->n_routers != n) {
        fail_msg("tandem local --routers %d started %d routers", n, c->n_routers);
    }
}

/* One turn: POST a greedy completion of ids (max_tokens tokens) to router port `port` in
 * `session`; returns usage.prompt_tokens_details.cached_tokens; asserts 200 within
 * R_DEADLINE_MS. *ms_out: wall. */
static long turn(unsigned port, const char *session, const char *ids, int max_tokens,
                 double *ms_out)
{
    char *body = completion_body(ids, max_tokens);
    char *resp = malloc(T_BODY);
    const char *cached;
    uint64_t t0 = tdm_clock_now_ns();
    long status;
    long n_cached;
    int n_busy = 0;

    assert_non_null(resp);
    /* A 503 "session busy" is the decode node still running a turn of a killed router (it runs
     * to its end unless the node aborts it): a client retries that, within the deadline. */
    while ((status = http(port, "/v1/completions", body, session, 0, R_DEADLINE_MS, resp)) == 503 &&
           strstr(resp, "session busy") != NULL &&
           tdm_clock_now_ns() - t0 < (uint64_t)R_MAX_TURN_MS * TDM_NS_PER_MS) {
        n_busy++;
        nanosleep(&(struct timespec){0, 100 * 1000000L}, NULL);
    }
    *ms_out = (double)(tdm_clock_now_ns() - t0) / TDM_NS_PER_MS;
    if (n_busy > 0) {
        print_message("%s: %d retries of 'session busy' (an orphaned turn on its node)\n", session,
                      n_busy);
    }
    if (status != 200) {
        fail_msg("turn of %s on port %u: status=%ld after %.0f ms body=%s", session, port, status,
                 *ms_out, resp);
    }
    cached = strstr(resp, "\"cached_tokens\":");
    assert_non_null(cached);
    n_cached = atol(cached + strlen("\"cached_tokens\":"));
    free(body);
    free(resp);
    return n_cached;
}

static int count_ids(const char *ids)
{
    int n = ids[0] != '\0';

    for (const char *p = ids; *p != '\0'; p++) {
        n += *p == ',';
    }
    return n;
}

/* The model's image_token_id (config.json), which a prompt may not hold; -1 when absent. */
static int image_token_id(void)
{
    char path[T_PATH + 32];
    char line[512];
    FILE *f;
    int id = -1;

    snprintf(path, sizeof(path), "%s/config.json", g_model);
    f = fopen(path, "r");
    assert_non_null(f);
    while (fgets(line, sizeof(line), f) != NULL) {
        const char *at = strstr(line, "\"image_token_id\":");
        if (at != NULL) {
            id = atoi(at + strlen("\"image_token_id\":"));
        }
    }
    fclose(f);
    return id;
}

/* Extend ids (T_BODY bytes) with the greedy continuation (n_gen ids) the turn produced and n_more
 * new ids. A generated image token (the tiny model's random weights emit any id) cannot be sent
 * back in a prompt: it becomes id 7, and the history diverges there (the reuse then stops at it).
 */
static void next_prompt(char *ids, int n_gen, int n_more, int salt)
{
    char *gen = malloc(T_BODY);
    char more[4096];
    char token[16];
    size_t n = strlen(ids);
    int image = image_token_id();

    assert_non_null(gen);
    generate_ids(ids, n_gen, gen, T_BODY);
    snprintf(token, sizeof(token), "%d", image);
    for (char *p = gen; image >= 0 && *p != '\0';) {
        size_t len = strcspn(p, ",");
        if (len == strlen(token) && strncmp(p, token, len) == 0) {
            memset(p, ' ', len);
            p[0] = '7';
        }
        p += len + (p[len] == ',');
    }
    {
        size_t w = 0;
        for (size_t r = 0; gen[r] != '\0'; r++) { /* drop the padding: ids go on a command line */
            if (gen[r] != ' ') {
                gen[w++] = gen[r];
            }
        }
        gen[w] = '\0';
    }
    make_ids(more, sizeof(more), n_more, 17, salt);
    snprintf(ids + n, T_BODY - n, ",%s,%s", gen, more);
    free(gen);
}

/* A streamed turn on a plain socket, read by the test itself (no thread): its router is killed
 * once the first chunk of generated text has arrived, i.e. while the turn surely runs. */
typedef struct {
    int fd;
    char *got; /* what arrived, NUL-terminated; T_BODY bytes */
    size_t n;
} cut_stream_t;

/* Read what is there within timeout_ms into s->got; returns 0 at end of stream (or a reset), 1
 * when bytes arrived, -1 on timeout. */
static int stream_read(cut_stream_t *s, int timeout_ms)
{
    struct pollfd pfd = {.fd = s->fd, .events = POLLIN};
    ssize_t n;

    if (poll(&pfd, 1, timeout_ms) <= 0) {
        return -1;
    }
    if (s->n + 1 >= T_BODY) {
        return 0; /* more than a turn sends: treat as the end */
    }
    n = read(s->fd, s->got + s->n, T_BODY - 1 - s->n);
    if (n <= 0) {
        return n < 0 && errno == EINTR ? 1 : 0;
    }
    s->n += (size_t)n;
    s->got[s->n] = '\0';
    return 1;
}

/* Send a streamed greedy completion of max_tokens tokens of ids to router port `port` in
 * `session` and wait (R_DEADLINE_MS) for its first "data: {" chunk: the decode node has started
 * the turn and has most of it ahead. Fails when the stream ends first or did not answer 200. */
static void stream_start(cut_stream_t *s, unsigned port, const char *session, const char *ids,
                         int max_tokens)
{
    char *body = malloc(T_BODY);
    uint64_t t0 = tdm_clock_now_ns();

    assert_non_null(body);
    s->got = malloc(T_BODY);
    assert_non_null(s->got);
    s->got[0] = '\0';
    s->n = 0;
    snprintf(body, T_BODY,
             "{\"model\":\"%s\",\"prompt\":[%s],\"max_tokens\":%d,\"temperature\":0,"
             "\"ignore_eos\":true,\"stream\":true}",
             T_MODEL_NAME, ids, max_tokens);
    s->fd = post_on_socket(port, session, body, 1);
    free(body);
    while (strstr(s->got, "data: {") == NULL) {
        uint64_t spent_ms = (tdm_clock_now_ns() - t0) / TDM_NS_PER_MS;
        if (spent_ms >= R_DEADLINE_MS || stream_read(s, (int)(R_DEADLINE_MS - spent_ms)) != 1) {
            fail_msg("the streamed turn of %s on port %u sent no chunk: %s", session, port, s->got);
        }
    }
    if (strncmp(s->got, "HTTP/1.1 200", 12) != 0) {
        fail_msg("the streamed turn of %s on port %u: %s", session, port, s->got);
    }
    if (strstr(s->got, "data: [DONE]") != NULL) {
        fail_msg("the streamed turn of %s ended before the kill (%d tokens): raise R_LONG_GEN",
                 session, max_tokens);
    }
}

/* Read the stream to its end (R_MAX_TURN_MS at most: cut, not hung), close it; returns whether
 * it ended normally ("data: [DONE]", or the last chunk of the chunked body). *ms_out: the wait.
 */
static int stream_finish(cut_stream_t *s, double *ms_out)
{
    uint64_t t0 = tdm_clock_now_ns();
    int rc = 1;
    int done;

    while (rc == 1) {
        uint64_t spent_ms = (tdm_clock_now_ns() - t0) / TDM_NS_PER_MS;
        rc = spent_ms < R_MAX_TURN_MS ? stream_read(s, (int)(R_MAX_TURN_MS - spent_ms)) : -1;
    }
    *ms_out = (double)(tdm_clock_now_ns() - t0) / TDM_NS_PER_MS;
    assert_int_equal(rc, 0); /* the end came, not the deadline */
    done = strstr(s->got, "data: [DONE]") != NULL ||
           (s->n >= 7 && memcmp(s->got + s->n - 7, "\r\n0\r\n\r\n", 7) == 0);
    close(s->fd);
    free(s->got);
    return done;
}

/* Poll metric `name` of router port `port` until it reaches at least want (R_MAX_TURN_MS). */
static void await_at_least(unsigned port, const char *name, double want)
{
    uint64_t t0 = tdm_clock_now_ns();
    double v;

    while ((v = metric(port, name)) < want) {
        if (tdm_clock_now_ns() - t0 > (uint64_t)R_MAX_TURN_MS * TDM_NS_PER_MS) {
            fail_msg("%s on port %u: %.0f after %d ms, want %.0f", name, port, v, R_MAX_TURN_MS,
                     want);
        }
        nanosleep(&(struct timespec){0, 20 * 1000000L}, NULL);
    }
}

/* A router's command line, kept to start it again after its kill (restart_router). */
typedef struct {
    char exe[T_PATH];
    char args[8192];
    char *argv[64];
} saved_cmd_t;

/* A router the test restarted itself (not the launcher's child): stopped by the teardown. */
static pid_t g_restarted;

static void save_cmdline(pid_t pid, saved_cmd_t *cmd)
{
    char path[64];
    FILE *f;
    size_t n;
    ssize_t len;
    int argc = 0;

    snprintf(path, sizeof(path), "/proc/%d/exe", (int)pid);
    len = readlink(path, cmd->exe, sizeof(cmd->exe) - 1);
    assert_true(len > 0);
    cmd->exe[len] = '\0';
    snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
    f = fopen(path, "r");
    assert_non_null(f);
    n = fread(cmd->args, 1, sizeof(cmd->args) - 1, f);
    fclose(f);
    cmd->args[n] = '\0';
    for (size_t at = 0; at < n && argc < 63; at += strlen(cmd->args + at) + 1) {
        cmd->argv[argc++] = cmd->args + at;
    }
    cmd->argv[argc] = NULL;
}

/* Start the saved router again (same id, control endpoint and peers; a new HTTP port: the old
 * one may still be held by its closed connections); waits until its /health is 200 (a decode
 * node registered again). Returns its HTTP port. */
static unsigned restart_router(saved_cmd_t *cmd)
{
    char http_arg[64];
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    socklen_t n = sizeof(a);
    unsigned port;
    uint64_t t0 = tdm_clock_now_ns();
    char *resp = malloc(T_BODY);

    assert_non_null(resp);
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &n), 0);
    port = ntohs(a.sin_port);
    close(fd);
    snprintf(http_arg, sizeof(http_arg), "127.0.0.1:%u", port);
    for (int i = 0; cmd->argv[i] != NULL; i++) {
        if (strcmp(cmd->argv[i], "--http") == 0 && cmd->argv[i + 1] != NULL) {
            cmd->argv[i + 1] = http_arg;
        }
    }
    g_restarted = fork();
    assert_true(g_restarted >= 0);
    if (g_restarted == 0) {
        execv(cmd->exe, cmd->argv);
        _exit(127);
    }
    while (http(port, "/health", NULL, NULL, 0, 2000, resp) != 200) {
        if (tdm_clock_now_ns() - t0 > (uint64_t)R_MAX_TURN_MS * TDM_NS_PER_MS) {
            fail_msg("the restarted router was not healthy within %d ms: %s", R_MAX_TURN_MS, resp);
        }
        nanosleep(&(struct timespec){0, 50 * 1000000L}, NULL);
    }
    print_message("router restarted (pid %d, http %u): healthy after %.0f ms\n", (int)g_restarted,
                  port, (double)(tdm_clock_now_ns() - t0) / TDM_NS_PER_MS);
    free(resp);
    return port;
}

static int stop_all_leftovers(void **state)
{
    if (g_restarted > 0) {
        kill(g_restarted, SIGTERM);
        waitpid(g_restarted, NULL, 0);
        g_restarted = 0;
    }
    return stop_leftovers(state);
}

/* What replay_and_kill does around the kill. */
typedef struct {
    int victim;     /* the router SIGKILLed */
    int survivor;   /* the router that serves every session's next turn */
    int mid_turn;   /* session whose R_LONG_GEN turn is in flight on the victim when it dies; -1 */
    int done_turn;  /* session whose R_DONE_GEN turn ended on the victim just before; -1 */
    int replicated; /* the survivor receives the victim's replicas (else it learns from nodes) */
    int restart;    /* start the victim again, empty, and play a fourth turn on it */
} kill_plan_t;

/*
 * The replay: sessions[i] plays its first two turns on router served_by[i]; session
 * plan->done_turn then plays a long turn to its end on the victim (a router dying right after a
 * turn completed); once the survivor has what it needs to take the sessions over (every
 * session listed in its index of the decode nodes' reports, and with plan->replicated every
 * replica the victim sent), session plan->mid_turn starts a long streamed turn on the victim,
 * and at its first chunk the victim is SIGKILLed. Every session then plays its next turn (the
 * cut one again for mid_turn, whose client never got its answer) on the survivor. With
 * plan->restart, the victim is then started again, empty, and every session plays a fourth turn
 * on it. Asserts each turn after a kill or restart reuses at least the whole previous completed
 * prompt's KV and answers within R_MAX_TURN_MS.
 */
static void replay_and_kill(cluster_t *f, char sessions[][64], const int *served_by, int n_sessions,
                            const kill_plan_t *plan)
{
    saved_cmd_t cmd;
    static cut_stream_t cut; /* static: outlives a failed assertion's jump */
    char *ids[R_SESSIONS];
    int n_prev[R_SESSIONS];
    double ms;
    long cached;
    int n_victim_turns = 0;

    for (int i = 0; i < n_sessions; i++) {
        ids[i] = malloc(T_BODY);
        assert_non_null(ids[i]);
        make_ids(ids[i], T_BODY, R_FIRST_IDS, 3 + i, 7 * i + 1);
    }
    for (int t = 0; t < 2; t++) {
        for (int i = 0; i < n_sessions; i++) {
            cached = turn(f->router_port[served_by[i]], sessions[i], ids[i], R_GEN, &ms);
            print_message("turn %d of %s on router %d: %d prompt ids, cached %ld, %.0f ms\n", t + 1,
                          sessions[i], served_by[i], count_ids(ids[i]), cached, ms);
            if (t == 1) {
                assert_true(cached >= n_prev[i]); /* sticky on its router: the usual reuse */
            }
            n_victim_turns += served_by[i] == plan->victim;
            n_prev[i] = count_ids(ids[i]);
            next_prompt(ids[i], R_GEN, R_MORE_IDS, 4 * t + i); /* small ids: clear of specials */
        }
    }
    if (plan->done_turn >= 0) { /* a long turn that ends just before its router dies */
        int i = plan->done_turn;
        assert_int_equal(served_by[i], plan->victim);
        cached = turn(f->router_port[plan->victim], sessions[i], ids[i], R_DONE_GEN, &ms);
        print_message("long turn of %s on router %d (%d tokens, completed before the kill): %d "
                      "prompt ids, cached %ld, %.0f ms\n",
                      sessions[i], plan->victim, R_DONE_GEN, count_ids(ids[i]), cached, ms);
        assert_true(cached >= n_prev[i]);
        n_victim_turns++;
        n_prev[i] = count_ids(ids[i]);
        next_prompt(ids[i], R_DONE_GEN, R_MORE_IDS, 16 + i);
    }
    /* The survivor can take over what the decode nodes reported (a report cycle after a
     * session's first turn: DECODE_REPORT_MS plus a heartbeat) and what the victim replicated
     * (sent at each turn's end): wait for both, so that the kill finds them there. */
    await_at_least(f->router_port[plan->survivor], "tandem_router_resident_sessions_indexed",
                   n_sessions);
    if (plan->replicated) {
        await_at_least(f->router_port[plan->survivor], "tandem_router_replicas_applied_total",
                       n_victim_turns);
    }
    if (plan->mid_turn >= 0) { /* a long turn in flight on the victim when it dies */
        assert_int_equal(served_by[plan->mid_turn], plan->victim);
        stream_start(&cut, f->router_port[plan->victim], sessions[plan->mid_turn],
                     ids[plan->mid_turn], R_LONG_GEN);
    }
    save_cmdline(f->router_pid[plan->victim], &cmd);
    assert_int_equal(kill(f->router_pid[plan->victim], SIGKILL), 0);
    print_message("router %d (pid %d) SIGKILLed\n", plan->victim, (int)f->router_pid[plan->victim]);
    if (plan->mid_turn >= 0) {
        size_t n_before = cut.n;
        int done = stream_finish(&cut, &ms);
        print_message("the turn of %s in flight on router %d (%zu bytes streamed before the kill) "
                      "was cut %.0f ms after the kill\n",
                      sessions[plan->mid_turn], plan->victim, n_before, ms);
        assert_false(done);              /* cut mid-turn, not finished */
        assert_true(ms < R_MAX_TURN_MS); /* cut, not hung */
    }
    for (int i = 0; i < n_sessions; i++) {
        cached = turn(f->router_port[plan->survivor], sessions[i], ids[i], R_GEN, &ms);
        print_message("turn 3 of %s on router %d after the kill: %d prompt ids, cached %ld "
                      "(previous prompt %d), %.0f ms\n",
                      sessions[i], plan->survivor, count_ids(ids[i]), cached, n_prev[i], ms);
        assert_true(cached >= n_prev[i]); /* the previous turn's KV is not recomputed */
        assert_true(ms < R_MAX_TURN_MS);
        n_prev[i] = count_ids(ids[i]);
        next_prompt(ids[i], R_GEN, R_MORE_IDS, 8 + i);
    }
    if (plan->restart) {
        unsigned port = restart_router(&cmd);
        for (int i = 0; i < n_sessions; i++) {
            cached = turn(port, sessions[i], ids[i], R_GEN, &ms);
            print_message("turn 4 of %s on the restarted router %d: %d prompt ids, cached %ld "
                          "(previous prompt %d), %.0f ms\n",
                          sessions[i], plan->victim, count_ids(ids[i]), cached, n_prev[i], ms);
            assert_true(cached >= n_prev[i]);
            assert_true(ms < R_MAX_TURN_MS);
        }
        print_message("restarted router: sessions learned %.0f, replicas applied %.0f\n",
                      metric(port, "tandem_router_sessions_learned_total"),
                      metric(port, "tandem_router_replicas_applied_total"));
        /* it knew nothing: every session came from the decode nodes */
        assert_true(metric(port, "tandem_router_sessions_learned_total") == n_sessions);
        kill(g_restarted, SIGTERM);
        waitpid(g_restarted, NULL, 0);
        g_restarted = 0;
    }
    for (int i = 0; i < n_sessions; i++) {
        free(ids[i]);
    }
}

static void test_two_routers_one_killed(void **state)
{
    static cluster_t f; /* static: the teardown may stop it after a failed assertion */
    char sessions[R_SESSIONS][64];
    int served_by[R_SESSIONS];
    double applied;

    (void)state;
    fleet_start(&f, 2);
    for (int i = 0; i < R_SESSIONS; i++) {
        snprintf(sessions[i], sizeof(sessions[i]), "rha2-%d", i);
        served_by[i] = i % 2;
    }
    /* router 1 serves rha2-1 and rha2-3: rha2-3's long turn ends, then rha2-1's is cut */
    replay_and_kill(&f, sessions, served_by, R_SESSIONS,
                    &(kill_plan_t){.victim = 1,
                                   .survivor = 0,
                                   .mid_turn = 1,
                                   .done_turn = 3,
                                   .replicated = 1,
                                   .restart = 1});
    applied = metric(f.router_port[0], "tandem_router_replicas_applied_total");
    print_message("router 0: replicas applied %.0f, sessions learned %.0f\n", applied,
                  metric(f.router_port[0], "tandem_router_sessions_learned_total"));
    assert_true(applied >= R_SESSIONS); /* router 1's sessions, two turns each (and own echoes) */
    cluster_stop(&f);
}

static void test_three_routers_survivor_learns_from_decode_nodes(void **state)
{
    static cluster_t f;
    char sessions[R_SESSIONS][64];
    int served_by[R_SESSIONS];
    router_ring_t *ring;
    const char *owners[2];
    int n = 0;
    double learned;

    (void)state;
    /* sessions whose owner and replica are routers 2 and 1: router 0 never gets their replica */
    assert_int_equal(router_ring_create(&ring), TDM_OK);
    assert_int_equal(router_ring_add(ring, "router-0"), TDM_OK);
    assert_int_equal(router_ring_add(ring, "router-1"), TDM_OK);
    assert_int_equal(router_ring_add(ring, "router-2"), TDM_OK);
    for (int k = 0; n < R_SESSIONS && k < 10000; k++) {
        char sid[64];
        snprintf(sid, sizeof(sid), "rha3-%d", k);
        router_ring_owners(ring, router_ring_key(sid), owners, 2);
        if (strcmp(owners[0], "router-0") != 0 && strcmp(owners[1], "router-0") != 0) {
            snprintf(sessions[n], sizeof(sessions[n]), "%s", sid);
            served_by[n++] = 2;
        }
    }
    router_ring_destroy(ring);
    assert_int_equal(n, R_SESSIONS);
    fleet_start(&f, 3);
    replay_and_kill(&f, sessions, served_by, R_SESSIONS,
                    &(kill_plan_t){.victim = 2,
                                   .survivor = 0,
                                   .mid_turn = 0,
                                   .done_turn = 1,
                                   .replicated = 0,
                                   .restart = 0});
    learned = metric(f.router_port[0], "tandem_router_sessions_learned_total");
    print_message("router 0: sessions learned %.0f, queries %.0f, timeouts %.0f\n", learned,
                  metric(f.router_port[0], "tandem_router_session_queries_total"),
                  metric(f.router_port[0], "tandem_router_session_query_timeouts_total"));
    assert_true(learned >= R_SESSIONS);
    cluster_stop(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_two_routers_one_killed, stop_all_leftovers),
        cmocka_unit_test_teardown(test_three_routers_survivor_learns_from_decode_nodes,
                                  stop_all_leftovers),
    };
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests(tests, setup_models, teardown_models);
}
