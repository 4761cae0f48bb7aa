/* tandem - the local-cluster launcher: `tandem local --model DIR --prefill N --decode M
 * [--http HOST:PORT] [--routers R] [--racks R]` starts R routers (peers of each other:
 * --router-id router-i, --peers; every worker gets all their control endpoints; the launcher runs
 * while one lives, docs/ROUTERS.md), N prefill nodes and M decode nodes on loopback (the
 * executables next to this one), waits until each answers /health with 200 within a deadline,
 * prints the endpoint and one "started:" line per process (role, pid, /health address), and on
 * SIGINT or SIGTERM stops them all (SIGTERM by PID, then SIGKILL after a grace period) and reaps
 * them. With --racks R, decode node i and prefill node i register in rack "rack{i mod R}" (the
 * router keeps a session's prefill in its decode node's rack). A worker that exits while starting
 * (exit 3: the router refused its registration, e.g. a model fingerprint mismatch) stops the launch
 * with its reason. A child that dies while starting because another process took a port this
 * launcher picked for it (between the pick and the child's bind) makes the launcher stop the
 * attempt and start the whole cluster again on fresh ports (LAUNCH_START_TRIES attempts); the
 * "started:" lines are printed once an attempt is over, so they name only the last attempt's
 * processes, and an "exited: role=R pid=P status=S" line only ever follows its process's
 * "started:" line (the processes of an attempt given up are named on stderr only). Owns only
 * child processes.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/flags.h"
#include "common/startup.h"
#include "kernels/device.h"
#include "keygen.h"

#define LAUNCH_MAX_ROUTERS 8
/* --relearn-warmup-ms of each router of a fleet (docs/ROUTERS.md): a restarted one waits this
 * long for its workers' reports before a session it does not know starts over */
#define LAUNCH_RELEARN_WARMUP_MS "3000"
#define LAUNCH_MAX_PROCS         (LAUNCH_MAX_ROUTERS + 64)
#define LAUNCH_ARG_BYTES         256
#define LAUNCH_POLL_MS           50
#define LAUNCH_GRACE_MS          5000
#define LAUNCH_HEALTH_READ_MS    2000 /* health_status's wait for a reply */
#define LAUNCH_EXIT_REFUSED      3
/* Attempts at starting a cluster when a child lost a picked port to another process. */
#define LAUNCH_START_TRIES 3
/* start_cluster's result when a child died because another process holds one of its ports. */
#define LAUNCH_PORT_TAKEN (-2)

typedef struct {
    const char *model_dir;
    uint32_t n_prefill;
    uint32_t n_decode;
    uint32_t n_routers;
    const char *http;
    uint32_t local_prefill_tokens;
    uint32_t threads;
    uint32_t pages;
    uint32_t health_timeout_ms;
    const char *worker_model_dir;
    const char *log_level;
    uint32_t n_racks;
    const char *prefill_device; /* --device of every prefill node (NULL: theirs) */
    const char *decode_device;  /* --device of every decode node (NULL: theirs) */
} launch_cfg_t;

static const tdm_flag_t launch_flags[] = {
    {"model", TDM_FLAG_PATH, NULL, offsetof(launch_cfg_t, model_dir), "model directory", 0, 0, 1},
    {"prefill", TDM_FLAG_U32, "1", offsetof(launch_cfg_t, n_prefill), "prefill nodes", 0, 32, 0},
    {"decode", TDM_FLAG_U32, "1", offsetof(launch_cfg_t, n_decode), "decode nodes", 1, 32, 0},
    {"routers", TDM_FLAG_U32, "1", offsetof(launch_cfg_t, n_routers),
     "routers of one fleet (issue 18: peers of each other, every worker registers with all; "
     "the first serves --http, the others free ports, each printed as started: role=router)",
     1, LAUNCH_MAX_ROUTERS, 0},
    {"http", TDM_FLAG_STRING, "127.0.0.1:8000", offsetof(launch_cfg_t, http),
     "HOST:PORT of the OpenAI API (port 0: any free port)", 0, 0, 0},
    {"local-prefill-tokens", TDM_FLAG_U32, "512", offsetof(launch_cfg_t, local_prefill_tokens),
     "router: deltas shorter than this prefill on the decode node", 1, 4294967295.0, 0},
    {"threads", TDM_FLAG_U32, "0", offsetof(launch_cfg_t, threads),
     "kernel threads per worker (0: every online CPU)", 0, 1024, 0},
    {"pages", TDM_FLAG_U32, "4096", offsetof(launch_cfg_t, pages), "KV pages per worker", 16,
     16777216, 0},
    {"health-timeout-ms", TDM_FLAG_U32, "120000", offsetof(launch_cfg_t, health_timeout_ms),
     "deadline for every process to answer /health", 100, 3600000, 0},
    {"worker-model", TDM_FLAG_PATH, NULL, offsetof(launch_cfg_t, worker_model_dir),
     "model directory the workers load (default --model; tests use it to provoke a refusal)", 0, 0,
     0},
    {"log-level", TDM_FLAG_STRING, "info", offsetof(launch_cfg_t, log_level),
     "log level of every process", 0, 0, 0},
    {"racks", TDM_FLAG_U32, "1", offsetof(launch_cfg_t, n_racks),
     "racks (NVLink domains) the workers are spread over: decode node i and prefill node i go to "
     "rack{i mod N}",
     1, 32, 0},
    {"prefill-device", TDM_FLAG_STRING, NULL, offsetof(launch_cfg_t, prefill_device),
     "--device of every prefill node: cpu, cuda, cuda:N or guard (default: the nodes' own, "
     "TANDEM_DEVICE or cpu); with --decode-device, a cluster whose pages cross between backends",
     0, 0, 0},
    {"decode-device", TDM_FLAG_STRING, NULL, offsetof(launch_cfg_t, decode_device),
     "--device of every decode node (as --prefill-device)", 0, 0, 0},
};

typedef struct {
    const char *role;
    pid_t pid;
    uint16_t http_port;
    uint16_t picked[2]; /* ports this launcher picked for the child (0: none): HTTP, control */
    int exited;
    int status;
    int announced; /* its "started:" line is out (announce), so its "exited:" line may follow */
} proc_t;

typedef struct {
    proc_t procs[LAUNCH_MAX_PROCS];
    int n_procs;
    char bin_dir[PATH_MAX];
} launch_t;

/* Bind a loopback TCP socket to `port` (0: the kernel picks one) and release it; returns the
 * port bound, or 0 when the bind failed. */
static uint16_t try_port(uint16_t port)
{
    struct sockaddr_in a;
    socklen_t n = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    uint16_t bound = 0;

    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &n) == 0) {
        bound = ntohs(a.sin_port);
    }
    if (fd >= 0) {
        close(fd);
    }
    return bound;
}

/* Ports free_port handed out in this process (LAUNCH_PORTS_KEPT at most), never handed out
 * again: each is released before its child binds it, so a later pick could find it free and
 * return it twice (two children of one cluster on one port). */
#define LAUNCH_PORTS_KEPT 256
static uint16_t g_ports_given[LAUNCH_PORTS_KEPT];
static int g_n_ports_given;

/* port, remembered in g_ports_given; 0 when port is 0 or was handed out before. */
static uint16_t port_new(uint16_t port)
{
    for (int i = 0; i < g_n_ports_given && port != 0; i++) {
        if (g_ports_given[i] == port) {
            return 0;
        }
    }
    if (port != 0 && g_n_ports_given < LAUNCH_PORTS_KEPT) {
        g_ports_given[g_n_ports_given++] = port;
    }
    return port;
}

/* A free loopback TCP port for a child to bind, never one this process handed out before. The
 * port is released before the child binds it, so it is picked below the kernel's ephemeral range
 * (net.ipv4.ip_local_port_range), at random from up to 20000 ports: there the kernel never hands
 * it to another process's connect() or bind(0) meanwhile (the race that made a worker fail with
 * "address already in use" while other clusters ran); what remains is another launcher picking
 * the same port in the milliseconds before its child binds it. Falls back to a kernel-picked
 * port when no such range is free. */
static uint16_t free_port(void)
{
    static uint64_t rng;
    unsigned lo = 32768, hi = 60999;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");

    if (f != NULL) {
        if (fscanf(f, "%u %u", &lo, &hi) != 2) {
            lo = 32768;
        }
        fclose(f);
    }
    if (rng == 0) {
        rng = tdm_clock_now_ns() ^ ((uint64_t)getpid() << 32) ^ 0x9e3779b97f4a7c15ull;
    }
    if (lo > 12000) {
        unsigned base = lo > 30000 ? lo - 20000 : 10000; /* [base, lo): outside the range */
        for (int tries = 0; tries < 64; tries++) {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            uint16_t port = port_new(try_port((uint16_t)(base + rng % (lo - base))));
            if (port != 0) {
                return port;
            }
        }
    }
    for (int tries = 0; tries < 64; tries++) {
        uint16_t port = port_new(try_port(0));
        if (port != 0) {
            return port;
        }
    }
    return 0;
}

/* HTTP status of GET /health on 127.0.0.1:port, or -1 when nothing answers (within
 * LAUNCH_HEALTH_READ_MS of the request: a listener that never replies, such as another process
 * holding the port, must not stall the launch). */
static int health_status(uint16_t port)
{
    struct sockaddr_in a;
    char buf[256];
    static const char req[] = "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int status = -1;
    ssize_t n;

    struct timeval timeout = {LAUNCH_HEALTH_READ_MS / 1000, (LAUNCH_HEALTH_READ_MS % 1000) * 1000};

    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout)) == 0 &&
        connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        write(fd, req, sizeof(req) - 1) == (ssize_t)(sizeof(req) - 1)) {
        n = read(fd, buf, sizeof(buf) - 1);
        if (n > 12) {
            buf[n] = '\0';
            status = atoi(buf + 9);
        }
    }
    if (fd >= 0) {
        close(fd);
    }
    return status;
}

/* Start child `exe` (from the launcher's directory) as process l->n_procs, answering /health on
 * http_port; picked_http and picked_control are the ports this launcher picked for it (0: none;
 * port_taken checks them). Its "started:" line is printed by announce. Returns 0 or -1. */
static int spawn(launch_t *l, const char *role, const char *exe, char *const *argv,
                 uint16_t http_port, uint16_t picked_http, uint16_t picked_control)
{
    char path[PATH_MAX + 64];
    pid_t pid;

    snprintf(path, sizeof(path), "%s/%s", l->bin_dir, exe);
    pid = fork();
    if (pid < 0) {
        fprintf(stderr, "tandem local: fork failed: %s\n", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        execv(path, argv);
        fprintf(stderr, "tandem local: cannot run %s: %s\n", path, strerror(errno));
        _exit(127);
    }
    l->procs[l->n_procs].role = role;
    l->procs[l->n_procs].pid = pid;
    l->procs[l->n_procs].http_port = http_port;
    l->procs[l->n_procs].picked[0] = picked_http;
    l->procs[l->n_procs].picked[1] = picked_control;
    l->n_procs++;
    return 0;
}

/* "exited: role=R pid=P status=S" on stdout for child p when it is both announced and exited
 * (S: the exit status, or 128 + the signal; a drained decode node exits 0). Called where either
 * becomes true (announce; reap and stop_all's reaping), each of which happens once, so the line
 * comes out once. */
static void say_exit(const proc_t *p)
{
    if (!p->announced || !p->exited) {
        return;
    }
    printf("exited: role=%s pid=%d status=%d\n", p->role, (int)p->pid,
           WIFEXITED(p->status) ? WEXITSTATUS(p->status)
                                : 128 + (WIFSIGNALED(p->status) ? WTERMSIG(p->status) : 0));
    fflush(stdout);
}

/* One "started: role=R pid=P health=127.0.0.1:PORT" line per child, in start order, then the
 * "exited:" lines of those that have exited already (a child that died while the cluster
 * started): stdout names a process's exit only after its start. The children of an attempt
 * given up for fresh ports (main) are never announced, so stdout names none of them. */
static void announce(launch_t *l)
{
    for (int i = 0; i < l->n_procs; i++) {
        printf("started: role=%s pid=%d health=127.0.0.1:%u\n", l->procs[i].role,
               (int)l->procs[i].pid, (unsigned)l->procs[i].http_port);
        l->procs[i].announced = 1;
    }
    fflush(stdout);
    for (int i = 0; i < l->n_procs; i++) {
        say_exit(&l->procs[i]);
    }
}

/* Reap exited children (say_exit for the announced ones); report the first that died. Returns
 * its index or -1. */
static int reap(launch_t *l)
{
    int died = -1;

    for (int i = 0; i < l->n_procs; i++) {
        proc_t *p = &l->procs[i];
        if (!p->exited && waitpid(p->pid, &p->status, WNOHANG) == p->pid) {
            p->exited = 1;
            say_exit(p);
            if (died < 0) {
                died = i;
            }
        }
    }
    return died;
}

static void describe_exit(const proc_t *p)
{
    if (WIFEXITED(p->status) && WEXITSTATUS(p->status) == LAUNCH_EXIT_REFUSED) {
        fprintf(stderr,
                "tandem local: %s (pid %d) was refused at registration (see its log line "
                "above: model fingerprint, page format, KV formats or max context mismatch)\n",
                p->role, (int)p->pid);
    } else if (WIFEXITED(p->status)) {
        fprintf(stderr, "tandem local: %s (pid %d) exited with status %d\n", p->role, (int)p->pid,
                WEXITSTATUS(p->status));
    } else if (WIFSIGNALED(p->status)) {
        fprintf(stderr, "tandem local: %s (pid %d) was killed by signal %d\n", p->role, (int)p->pid,
                WTERMSIG(p->status));
    }
}

/* A port this launcher picked for child p that another process holds now (p has exited, so
 * its own sockets are closed: a port that still cannot be bound was taken between the pick and
 * the child's bind, the child's "address already in use"); 0 when none. */
static uint16_t port_taken(const proc_t *p)
{
    for (int i = 0; i < 2; i++) {
        if (p->picked[i] != 0 && try_port(p->picked[i]) != p->picked[i]) {
            return p->picked[i];
        }
    }
    return 0;
}

/* After child `died` exited while starting: LAUNCH_PORT_TAKEN when another process holds one
 * of its picked ports (said on stderr), else -1 with the exit described. */
static int start_failed(const launch_t *l, int died)
{
    uint16_t port = port_taken(&l->procs[died]);

    if (port != 0) {
        fprintf(stderr,
                "tandem local: %s (pid %d) exited: port %u was taken by another process before "
                "it could bind it\n",
                l->procs[died].role, (int)l->procs[died].pid, (unsigned)port);
        return LAUNCH_PORT_TAKEN;
    }
    describe_exit(&l->procs[died]);
    return -1;
}

/* Wait until process i answers /health 200. Returns 0, -1 (deadline, a child died) or
 * LAUNCH_PORT_TAKEN (start_failed). */
static int await_healthy(launch_t *l, int i, uint64_t deadline_ns)
{
    while (tdm_clock_now_ns() < deadline_ns) {
        struct timespec ts = {0, (long)(LAUNCH_POLL_MS * TDM_NS_PER_MS)};
        int died = reap(l);

        if (died >= 0) {
            return start_failed(l, died);
        }
        if (health_status(l->procs[i].http_port) == 200) {
            return 0;
        }
        nanosleep(&ts, NULL);
    }
    fprintf(stderr, "tandem local: %s (pid %d) not healthy before the deadline\n", l->procs[i].role,
            (int)l->procs[i].pid);
    return -1;
}

/* Stop every child: SIGTERM newest first, then SIGKILL after the grace period; reap all. */
static void stop_all(launch_t *l)
{
    uint64_t deadline;

    for (int i = l->n_procs - 1; i >= 0; i--) {
        if (!l->procs[i].exited) {
            kill(l->procs[i].pid, SIGTERM);
        }
    }
    deadline = tdm_clock_now_ns() + LAUNCH_GRACE_MS * TDM_NS_PER_MS;
    for (;;) {
        int alive = 0;
        struct timespec ts = {0, (long)(20 * TDM_NS_PER_MS)};

        reap(l);
        for (int i = 0; i < l->n_procs; i++) {
            alive += !l->procs[i].exited;
        }
        if (alive == 0) {
            break;
        }
        if (tdm_clock_now_ns() >= deadline) {
            for (int i = 0; i < l->n_procs; i++) {
                if (!l->procs[i].exited) {
                    kill(l->procs[i].pid, SIGKILL);
                    waitpid(l->procs[i].pid, &l->procs[i].status, 0);
                    l->procs[i].exited = 1;
                    say_exit(&l->procs[i]);
                }
            }
            break;
        }
        nanosleep(&ts, NULL);
    }
}

/* Start the routers, then every worker, each healthy before the next (c's deadline); the API on
 * http_host:http_port (http_picked: this launcher picked that port). Returns 0, -1 (a child failed
 * or missed the deadline; said on stderr) or LAUNCH_PORT_TAKEN (start_failed). */
static int start_cluster(launch_t *l, const launch_cfg_t *c, uint16_t http_port, int http_picked,
                         const char *http_host)
{
    char controls[LAUNCH_MAX_ROUTERS * LAUNCH_ARG_BYTES] = "";
    char peers[LAUNCH_MAX_ROUTERS * (LAUNCH_ARG_BYTES + 16)] = "";
    char control[LAUNCH_MAX_ROUTERS][LAUNCH_ARG_BYTES];
    char http[LAUNCH_ARG_BYTES + 8], lpt[32], threads[32], pages[32], rid[32];
    char whttp[LAUNCH_ARG_BYTES], rack[32];
    uint16_t router_http[LAUNCH_MAX_ROUTERS], router_control[LAUNCH_MAX_ROUTERS];
    uint64_t deadline = tdm_clock_now_ns() + (uint64_t)c->health_timeout_ms * TDM_NS_PER_MS;
    const char *wmodel = c->worker_model_dir != NULL ? c->worker_model_dir : c->model_dir;

    for (uint32_t r = 0; r < c->n_routers; r++) {
        size_t n_controls = strlen(controls);
        size_t n_peers = strlen(peers);
        router_control[r] = free_port();
        snprintf(control[r], sizeof(control[r]), "tcp://127.0.0.1:%u", (unsigned)router_control[r]);
        router_http[r] = r == 0 ? http_port : free_port();
        snprintf(controls + n_controls, sizeof(controls) - n_controls, "%s%s", r > 0 ? "," : "",
                 control[r]);
        snprintf(peers + n_peers, sizeof(peers) - n_peers, "%srouter-%u=%s", r > 0 ? "," : "",
                 (unsigned)r, control[r]);
    }
    snprintf(lpt, sizeof(lpt), "%u", c->local_prefill_tokens);
    snprintf(threads, sizeof(threads), "%u", c->threads);
    snprintf(pages, sizeof(pages), "%u", c->pages);
    for (uint32_t r = 0; r < c->n_routers; r++) {
        char *argv[] = {"tandem-router",
                        "--model",
                        (char *)c->model_dir,
                        "--http",
                        http,
                        "--control",
                        control[r],
                        "--local-prefill-tokens",
                        lpt,
                        "--log-level",
                        (char *)c->log_level,
                        c->n_routers > 1 ? "--router-id" : NULL,
                        rid,
                        "--peers",
                        peers,
                        "--relearn-warmup-ms",
                        LAUNCH_RELEARN_WARMUP_MS,
                        NULL};
        snprintf(http, sizeof(http), "%s:%u", r == 0 ? http_host : "127.0.0.1",
                 (unsigned)router_http[r]);
        snprintf(rid, sizeof(rid), "router-%u", (unsigned)r);
        if (spawn(l, "router", "tandem-router", argv, router_http[r],
                  r > 0 || http_picked ? router_http[r] : 0, router_control[r]) != 0) {
            return -1;
        }
        /* A router answers /health (503 until a decode node registers) once it listens. */
        while (health_status(router_http[r]) < 0) {
            struct timespec ts = {0, (long)(LAUNCH_POLL_MS * TDM_NS_PER_MS)};
            int died = reap(l);
            if (died >= 0) {
                return start_failed(l, died);
            }
            if (tdm_clock_now_ns() >= deadline) {
                fprintf(stderr, "tandem local: router (pid %d) not listening before the deadline\n",
                        (int)l->procs[l->n_procs - 1].pid);
                return -1;
            }
            nanosleep(&ts, NULL);
        }
    }
    for (uint32_t i = 0; i < c->n_decode + c->n_prefill; i++) {
        int is_decode = i < c->n_decode;
        uint16_t port = free_port();
        /* every router's control endpoint, comma-separated (one: the single-router form) */
        char *argv[] = {is_decode ? "tandem-decode" : "tandem-prefill",
                        "--model",
                        (char *)wmodel,
                        "--router",
                        controls,
                        "--http",
                        whttp,
                        "--threads",
                        threads,
                        "--pages",
                        pages,
                        "--log-level",
                        (char *)c->log_level,
                        "--rack",
                        rack,
                        NULL,
                        NULL,
                        NULL};
        const char *device = is_decode ? c->decode_device : c->prefill_device;
        if (device != NULL) {
            argv[15] = "--device";
            argv[16] = (char *)device;
        }
        snprintf(whttp, sizeof(whttp), "127.0.0.1:%u", (unsigned)port);
        snprintf(rack, sizeof(rack), "rack%u", (is_decode ? i : i - c->n_decode) % c->n_racks);
        if (spawn(l, is_decode ? "decode" : "prefill", argv[0], argv, port, port, 0) != 0) {
            return -1;
        }
        int rc = await_healthy(l, l->n_procs - 1, deadline);
        if (rc != 0) {
            return rc;
        }
    }
    for (uint32_t r = 0; r < c->n_routers; r++) {
        int rc = await_healthy(l, (int)r, deadline);
        if (rc != 0) {
            return rc;
        }
    }
    return 0;
}

static void print_usage(FILE *out)
{
    fprintf(out, "usage: tandem COMMAND [FLAGS]\n"
                 "\n"
                 "commands:\n"
                 "  local   run a router, N prefill nodes and M decode nodes on loopback until\n"
                 "          SIGINT/SIGTERM: tandem local --model DIR --prefill N --decode M\n"
                 "          [--http HOST:PORT] (flags: tandem local --help)\n"
                 "  keygen  make the keys of a secured cluster: --curve OUT/NAME (a CurveZMQ\n"
                 "          key pair) or --api-key [NAME] (docs/DEPLOY.md Security)\n"
                 "\n"
                 "Each process of a cluster is also its own executable (tandem-router,\n"
                 "tandem-prefill, tandem-decode; each takes --help).\n");
}

int main(int argc, char **argv)
{
    static const char summary[] =
        "tandem local: run a router, prefill and decode nodes on loopback until SIGINT/SIGTERM";
    static const tdm_main_spec_t spec = {"tandem local", summary, launch_flags,
                                         sizeof(launch_flags) / sizeof(launch_flags[0]),
                                         offsetof(launch_cfg_t, log_level)};
    launch_t l;
    launch_cfg_t cfg;
    tdm_flags_action_t action;
    char host[LAUNCH_ARG_BYTES];
    const char *colon;
    uint16_t port;
    int http_picked, started = -1;
    sigset_t signals;
    int sig = 0;
    ssize_t n;
    int rc = 0;

    memset(&l, 0, sizeof(l));
    memset(&cfg, 0, sizeof(cfg));
    if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
                      strcmp(argv[1], "help") == 0)) {
        print_usage(stdout);
        return 0;
    }
    if (argc >= 2 && strcmp(argv[1], "keygen") == 0) {
        return tandem_keygen_main(argc - 1, argv + 1);
    }
    if (argc < 2 || strcmp(argv[1], "local") != 0) {
        if (argc >= 2) {
            fprintf(stderr, "tandem: unknown command '%s'\n", argv[1]);
        }
        print_usage(stderr);
        return 2;
    }
    if (tdm_main_start(&spec, argc - 1, argv + 1, &cfg, &action) != TDM_OK) {
        return 2;
    }
    if (action == TDM_FLAGS_HELP) {
        return 0;
    }
    /* a typo in a role's --device fails here, not as N node start-ups (no hardware checked:
     * each node opens its device itself and names what is missing) */
    for (int role = 0; role < 2; role++) {
        const char *text = role == 0 ? cfg.prefill_device : cfg.decode_device;
        kern_device_t dev;
        char err[160];

        if (text != NULL && kern_device_parse(text, &dev, err, sizeof(err)) != TDM_OK) {
            fprintf(stderr, "tandem local: --%s-device: %s\n", role == 0 ? "prefill" : "decode",
                    err);
            return 2;
        }
    }
    colon = strrchr(cfg.http, ':');
    if (colon == NULL || (size_t)(colon - cfg.http) >= sizeof(host) || colon == cfg.http) {
        fprintf(stderr, "tandem local: --http=%s is invalid: expected HOST:PORT\n", cfg.http);
        return 2;
    }
    memcpy(host, cfg.http, (size_t)(colon - cfg.http));
    host[colon - cfg.http] = '\0';
    port = (uint16_t)atoi(colon + 1);
    http_picked = port == 0;
    if (!http_picked) {
        (void)port_new(port); /* never picked for another child */
    }
    n = readlink("/proc/self/exe", l.bin_dir, sizeof(l.bin_dir) - 1);
    if (n <= 0) {
        fprintf(stderr, "tandem local: cannot find my own executable: %s\n", strerror(errno));
        return 1;
    }
    l.bin_dir[n] = '\0';
    *strrchr(l.bin_dir, '/') = '\0';

    /* Signals arrive synchronously here; children unblock them after fork. */
    if (tdm_signals_block(TDM_SIGNALS_CHILD, &signals) != TDM_OK) {
        return 1;
    }
    for (int attempt = 1; attempt <= LAUNCH_START_TRIES; attempt++) {
        if (http_picked) {
            port = free_port();
        }
        started = start_cluster(&l, &cfg, port, http_picked, host);
        if (started != LAUNCH_PORT_TAKEN || attempt == LAUNCH_START_TRIES) {
            break;
        }
        fprintf(stderr, "tandem local: starting again on fresh ports (attempt %d of %d)\n",
                attempt + 1, LAUNCH_START_TRIES);
        stop_all(&l);
        memset(l.procs, 0, sizeof(l.procs));
        l.n_procs = 0;
    }
    announce(&l);
    if (started != 0) {
        stop_all(&l);
        return 1;
    }
    printf("ready: http://%s:%u/v1 prefill=%u decode=%u routers=%u\n", host, (unsigned)port,
           cfg.n_prefill, cfg.n_decode, cfg.n_routers);
    fflush(stdout);
    for (;;) {
        int died;
        sigwait(&signals, &sig);
        if (sig != SIGCHLD) {
            break;
        }
        died = reap(&l);
        if (died >= 0) {
            describe_exit(&l.procs[died]);   /* keep serving: the router handles lost workers */
            if (died < (int)cfg.n_routers) { /* a router: stop when none is left */
                int routers_left = 0;
                for (uint32_t r = 0; r < cfg.n_routers; r++) {
                    routers_left += !l.procs[r].exited;
                }
                if (routers_left == 0) {
                    rc = 1;
                    break;
                }
            }
        }
    }
    fprintf(stderr, "tandem local: stopping (signal %d)\n", sig);
    stop_all(&l);
    return rc;
}
