/* transfer_bench.c - tandem-bench-transfer: KV page put/get bandwidth and batch latency of
 * libtandem_transfer between two processes on this host, each beside ucx_perftest run at the
 * same message size and over the same transport, as a ratio.
 *
 * The benchmark re-executes itself as the receiver (a second process holding the remote page
 * pool; it only drives UCX progress, spinning like ucx_perftest's server). For each op (put,
 * get) and batch size (pages of MODEL.md's 22848 bytes), it measures:
 *   bandwidth  batches posted back to back with up to --window batches in flight for --seconds;
 *              bytes moved / time, MiB/s (ucx_perftest's "MB/s" is MiB/s too);
 *   latency    one batch at a time: the median post-to-completion time of a batch (a put batch
 *              completes when the peer's memory holds every page: the endpoint is flushed).
 * Pages go one UCX operation each unless --coalesce lets consecutive pages go as one, so every
 * message is one page, like ucx_perftest -s 22848. ucx_perftest (ucp_put_bw / ucp_get, a server
 * and a client child process, UCX_TLS and protocol selection as ours) gives the reference
 * bandwidth twice: at our message size (-s 22848: it moves the same 22 KB buffer every time,
 * cache resident) and with one message as large as the whole batch (-s N*22848: the same
 * memory footprint as our N distinct pages, so the distinct-page ratio is like for like); its
 * per-message time times the batch size gives the reference batch latency. Each case is
 * measured --reps times, alternating with ucx_perftest, and the best of each is reported.
 */
#include "common/clock.h"
#include "common/fdio.h"
#include "common/flags.h"
#include "common/log.h"
#include "common/status.h"
#include "transfer/batch.h"
#include "transfer/context.h"
#include "transfer/desc.h"
#include "transfer/lane.h"
#include "transfer/peer.h"
#include "transfer/pool.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#define MAX_SIZES           8
#define MIB                 (1024.0 * 1024.0)
#define LATENCY_SAMPLES_MAX 4096
#define PERFTEST_ATTEMPTS   200
#define PERFTEST_TIMEOUT_S  120
#define RECEIVER_FLAG       "--receiver"
#define CMD_PARK            'p' /* receiver: stop spinning (block) until CMD_RESUME */
#define CMD_RESUME          'r' /* receiver: spin on progress again */

typedef struct {
    const char *transport; /* UCX_TLS for both sides and for ucx_perftest */
    const char *sizes;     /* batch sizes in pages, comma-separated */
    const char *ops;       /* "put", "get" or "put,get" */
    uint32_t page_bytes;   /* bytes per page */
    double seconds;        /* measured time per bandwidth case and repetition */
    uint32_t reps;         /* repetitions; best of each side is reported */
    uint32_t window;       /* batches in flight in the bandwidth runs */
    const char *perftest;  /* ucx_perftest executable; "none" skips the reference */
    uint32_t port;         /* first TCP port for ucx_perftest's rendezvous */
    const char *protocols; /* "v2" (default: lane reporting) or "v1" */
    int markdown;          /* print the table as Markdown */
    uint32_t coalesce;     /* pages per UCX operation (context max_run_pages) */
    const char *require;   /* --require-transport for the sender's context */
} bench_cfg_t;

static const tdm_flag_t bench_flags[] = {
    {"transport", TDM_FLAG_STRING, "shm", offsetof(bench_cfg_t, transport),
     "UCX transports (UCX_TLS syntax), e.g. shm or tcp", 0, 0, 0},
    {"sizes", TDM_FLAG_STRING, "1,16,256,4096", offsetof(bench_cfg_t, sizes),
     "batch sizes in pages, comma-separated (each 1..65536)", 0, 0, 0},
    {"ops", TDM_FLAG_STRING, "put,get", offsetof(bench_cfg_t, ops), "put, get or put,get", 0, 0, 0},
    {"page-bytes", TDM_FLAG_U32, "22848", offsetof(bench_cfg_t, page_bytes),
     "bytes per page (MODEL.md 7: 22848 at full size)", 64, 16777216, 0},
    {"seconds", TDM_FLAG_F64, "1.0", offsetof(bench_cfg_t, seconds),
     "measured seconds per bandwidth case and repetition", 0.05, 60, 0},
    {"reps", TDM_FLAG_U32, "3", offsetof(bench_cfg_t, reps),
     "repetitions (alternating with ucx_perftest); the best of each is reported", 1, 50, 0},
    {"window", TDM_FLAG_U32, "8", offsetof(bench_cfg_t, window),
     "batches in flight in the bandwidth runs", 1, 256, 0},
    {"perftest", TDM_FLAG_STRING, "ucx_perftest", offsetof(bench_cfg_t, perftest),
     "ucx_perftest executable (PATH lookup); none skips the reference", 0, 0, 0},
    {"port", TDM_FLAG_U32, "13500", offsetof(bench_cfg_t, port),
     "first TCP port for ucx_perftest (one per run)", 1024, 60000, 0},
    {"protocols", TDM_FLAG_STRING, "v2", offsetof(bench_cfg_t, protocols),
     "UCX protocol selection: v2 (lane reporting) or v1; ucx_perftest gets the same", 0, 0, 0},
    {"markdown", TDM_FLAG_BOOL, "false", offsetof(bench_cfg_t, markdown),
     "print the results as a Markdown table", 0, 0, 0},
    {"require-transport", TDM_FLAG_STRING, "any", offsetof(bench_cfg_t, require),
     "lanes the sender accepts (rc, cuda_ipc, shm, tcp, ...); a weaker lane fails the run", 0, 0,
     0},
    {"coalesce", TDM_FLAG_U32, "1", offsetof(bench_cfg_t, coalesce),
     "pages per UCX operation (max_run_pages); ucx_perftest's message is as large", 1, 4096, 0},
};
#define N_BENCH_FLAGS (sizeof(bench_flags) / sizeof(bench_flags[0]))

/* One measured case. Plain data. */
typedef struct {
    xfer_op_t op;
    uint32_t n_pages;
    double bw_mib_s;          /* ours, distinct pages, best of reps */
    double bw_same_mib_s;     /* ours, every page of the batch is page 0 (perftest's footprint) */
    double memcpy_mib_s;      /* local memcpy of the same distinct pages: the one-copy ceiling */
    double lat_us;            /* ours, best of reps of the median */
    double pf_bw_mib_s;       /* ucx_perftest, best of reps; 0 when not run */
    double pf_msg_us;         /* ucx_perftest time per message, best of reps */
    double pf_batch_bw_mib_s; /* ucx_perftest with one message as large as the whole batch:
                                 the same memory footprint as our distinct pages */
    double pf_batch_msg_us;   /* its time per (batch-size) message, from the same run */
    xfer_lane_t lane;
} result_t;

/* Process state of the sender. */
typedef struct {
    bench_cfg_t cfg;
    uint32_t sizes[MAX_SIZES];
    uint32_t n_sizes;
    int do_put;
    int do_get;
    uint32_t max_pages;
    xfer_context_t *ctx;
    xfer_pool_t *pool;
    xfer_peer_t *peer;
    pid_t receiver_pid;
    int receiver_sock;
    uint32_t *local_pages;
    uint32_t *remote_pages;
    uint32_t *zero_pages; /* [max_pages] all 0: one page repeated */
    int same_page;        /* post from zero_pages */
    uint32_t next_port;
    uint32_t n_done; /* batches completed (callback ran) */
    tdm_status_t first_error;
    xfer_lane_t lane;
} bench_t;

/* ---- helpers ---- */

static tdm_status_t make_context(const bench_cfg_t *cfg, const char *name, xfer_context_t **ctx_out)
{
    xfer_context_params_t params;

    xfer_context_params_default(&params);
    params.name = name;
    params.transports = cfg->transport;
    params.max_batches = 1024;
    params.max_run_pages = cfg->coalesce;
    if (cfg->require != NULL &&
        xfer_lane_mask_parse(cfg->require, &params.required_lanes) != TDM_OK) {
        return TDM_ERR_INVALID_ARG;
    }
    if (strcmp(cfg->protocols, "v1") == 0) {
        params.flags |= XFER_CONTEXT_PROTO_V1;
    }
    return xfer_context_create(&params, ctx_out);
}

static tdm_status_t make_pool(xfer_context_t *ctx, uint32_t page_bytes, uint32_t n_pages,
                              xfer_pool_t **pool_out)
{
    const xfer_pool_params_t params = {
        .page_size_bytes = page_bytes, .n_pages = n_pages, .mem_type = XFER_MEM_HOST};

    return xfer_pool_create(ctx, &params, pool_out);
}

/* ---- the receiver process: holds the remote pool and spins on progress ---- */

static int receiver_main(int argc, char **argv)
{
    bench_cfg_t cfg;
    xfer_context_t *ctx = NULL;
    xfer_pool_t *pool = NULL;
    const uint8_t *desc;
    size_t desc_bytes;
    uint32_t n_desc;
    int sock;
    uint32_t n_pages;
    int parked = 0;

    if (argc < 7) {
        return 2;
    }
    memset(&cfg, 0, sizeof(cfg));
    sock = atoi(argv[2]);
    cfg.transport = argv[3];
    cfg.page_bytes = (uint32_t)strtoul(argv[4], NULL, 10);
    n_pages = (uint32_t)strtoul(argv[5], NULL, 10);
    cfg.protocols = argv[6];
    cfg.coalesce = 1;
    cfg.require = NULL;
    tdm_log_set_level(TDM_LOG_WARN);
    if (make_context(&cfg, "bench-receiver", &ctx) != TDM_OK) {
        return 3;
    }
    if (make_pool(ctx, cfg.page_bytes, n_pages, &pool) != TDM_OK) {
        xfer_context_destroy(ctx);
        return 4;
    }
    xfer_pool_descriptor(pool, &desc, &desc_bytes);
    n_desc = (uint32_t)desc_bytes;
    if (tdm_fd_write_all(sock, &n_desc, sizeof(n_desc)) != 0 ||
        tdm_fd_write_all(sock, desc, desc_bytes) != 0) {
        xfer_pool_destroy(pool);
        xfer_context_destroy(ctx);
        return 5;
    }
    /* Spin like ucx_perftest's server (emulated RMA, as over tcp, moves only when we
     * progress), except while parked: the sender parks us during ucx_perftest runs so the
     * reference gets the CPUs to itself. */
    for (;;) {
        struct pollfd pfd = {sock, POLLIN, 0};
        char command;

        if (!parked) {
            for (int i = 0; i < 256; i++) {
                xfer_context_progress(ctx);
            }
        }
        if (poll(&pfd, 1, parked ? -1 : 0) == 0) {
            continue;
        }
        if (read(sock, &command, 1) != 1) {
            break; /* the sender closed its end: done */
        }
        parked = command == CMD_PARK;
        if (tdm_fd_write_all(sock, &command, 1) != 0) {
            break;
        }
    }
    xfer_pool_destroy(pool);
    xfer_context_destroy(ctx);
    close(sock);
    return 0;
}

static tdm_status_t spawn_receiver(bench_t *b)
{
    char fd_text[16];
    char pages_text[16];
    char page_bytes_text[16];
    char *argv[] = {"tandem-bench-transfer",
                    RECEIVER_FLAG,
                    fd_text,
                    (char *)b->cfg.transport,
                    page_bytes_text,
                    pages_text,
                    (char *)b->cfg.protocols,
                    NULL};
    uint32_t n_desc = 0;
    uint8_t *desc_bytes;
    xfer_desc_t desc;
    tdm_status_t status;

    snprintf(fd_text, sizeof(fd_text), "%d", TDM_SPAWN_CHILD_FD);
    snprintf(pages_text, sizeof(pages_text), "%u", b->max_pages);
    snprintf(page_bytes_text, sizeof(page_bytes_text), "%u", b->cfg.page_bytes);
    status = tdm_spawn_self(argv, &b->receiver_pid, &b->receiver_sock);
    if (status != TDM_OK) {
        return status;
    }
    if (tdm_fd_read_all(b->receiver_sock, &n_desc, sizeof(n_desc)) != 0 || n_desc > (1u << 20)) {
        tdm_log(TDM_LOG_ERROR, "bench", "receiver did not start (see its log above)");
        return TDM_ERR_IO;
    }
    desc_bytes = malloc(n_desc);
    if (desc_bytes == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    if (tdm_fd_read_all(b->receiver_sock, desc_bytes, n_desc) != 0) {
        free(desc_bytes);
        return TDM_ERR_IO;
    }
    status = xfer_desc_parse(desc_bytes, n_desc, &desc);
    if (status == TDM_OK) {
        status = xfer_peer_connect(b->ctx, &desc, &b->peer);
    }
    free(desc_bytes);
    return status;
}

/* Park or resume the receiver and wait for its acknowledgement. */
static tdm_status_t command_receiver(bench_t *b, char command)
{
    char ack = 0;

    if (tdm_fd_write_all(b->receiver_sock, &command, 1) != 0 ||
        tdm_fd_read_all(b->receiver_sock, &ack, 1) != 0 || ack != command) {
        tdm_log(TDM_LOG_ERROR, "bench", "receiver did not acknowledge command=%c", command);
        return TDM_ERR_IO;
    }
    return TDM_OK;
}

static void stop_receiver(bench_t *b)
{
    if (b->receiver_pid <= 0) {
        return;
    }
    close(b->receiver_sock);
    waitpid(b->receiver_pid, NULL, 0);
    b->receiver_pid = 0;
}

/* ---- our measurements ---- */

static void batch_done(void *arg, const xfer_batch_result_t *result)
{
    bench_t *b = arg;

    b->n_done++;
    b->lane = result->lane;
    if (result->status != TDM_OK && b->first_error == TDM_OK) {
        b->first_error = result->status;
    }
}

static tdm_status_t post(bench_t *b, xfer_op_t op, uint32_t n_pages)
{
    xfer_batch_params_t params;

    memset(&params, 0, sizeof(params));
    params.op = op;
    params.local_pool = b->pool;
    params.local_pages = b->same_page ? b->zero_pages : b->local_pages;
    params.remote_pages = b->same_page ? b->zero_pages : b->remote_pages;
    params.n_pages = n_pages;
    params.done = batch_done;
    params.done_arg = b;
    return xfer_batch_post(b->peer, &params);
}

/* Spin on progress until `target` batches have completed. */
static tdm_status_t drain(bench_t *b, uint32_t target)
{
    uint64_t t_start_ns = tdm_clock_now_ns();

    while (b->n_done < target) {
        xfer_context_progress(b->ctx);
        if (tdm_clock_elapsed_ms(t_start_ns) > 60000.0) {
            tdm_log(TDM_LOG_ERROR, "bench", "batches stalled: done=%u target=%u", b->n_done,
                    target);
            return TDM_ERR_TIMEOUT;
        }
    }
    return b->first_error;
}

static tdm_status_t measure_bandwidth(bench_t *b, xfer_op_t op, uint32_t n_pages, double *mib_s_out)
{
    uint64_t t_start_ns;
    uint64_t n_posted = 0;
    double elapsed_s;
    tdm_status_t status;

    b->n_done = 0;
    b->first_error = TDM_OK;
    t_start_ns = tdm_clock_now_ns();
    do {
        /* The clock is read every 16 rounds: reads are not free in every VM. */
        for (int round = 0; round < 16; round++) {
            while (n_posted - b->n_done < b->cfg.window) {
                status = post(b, op, n_pages);
                if (status != TDM_IN_PROGRESS) {
                    return status;
                }
                n_posted++;
            }
            xfer_context_progress(b->ctx);
            if (b->first_error != TDM_OK) {
                return b->first_error;
            }
        }
    } while (tdm_clock_elapsed_ms(t_start_ns) < b->cfg.seconds * 1000.0);
    status = drain(b, (uint32_t)n_posted);
    if (status != TDM_OK) {
        return status;
    }
    elapsed_s = tdm_clock_elapsed_ms(t_start_ns) * 1e-3;
    *mib_s_out = (double)n_posted * n_pages * b->cfg.page_bytes / elapsed_s / MIB;
    return TDM_OK;
}

/* The one-copy ceiling for a batch of distinct pages: memcpy of the same n_pages local pages
 * into another buffer of n_pages pages, page by page, repeated for --seconds / 2. */
static tdm_status_t measure_memcpy(bench_t *b, uint32_t n_pages, double *mib_s_out)
{
    size_t page_bytes = b->cfg.page_bytes;
    uint8_t *dst = malloc((size_t)n_pages * page_bytes);
    uint64_t n_rounds = 0;
    uint64_t t_start_ns;

    if (dst == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    memset(dst, 1, (size_t)n_pages * page_bytes);
    t_start_ns = tdm_clock_now_ns();
    do {
        for (uint32_t i = 0; i < n_pages; i++) {
            memcpy(dst + i * page_bytes, xfer_pool_page(b->pool, i), page_bytes);
        }
        n_rounds++;
    } while (tdm_clock_elapsed_ms(t_start_ns) < b->cfg.seconds * 500.0);
    *mib_s_out =
        (double)n_rounds * n_pages * page_bytes / (tdm_clock_elapsed_ms(t_start_ns) * 1e-3) / MIB;
    /* Keep the copies observable so the compiler cannot drop them. */
    if (dst[page_bytes / 2] == 0xff && dst[0] == 0xff) {
        fprintf(stderr, " ");
    }
    free(dst);
    return TDM_OK;
}

static int compare_double(const void *a, const void *b)
{
    double x = *(const double *)a;
    double y = *(const double *)b;

    return x < y ? -1 : x > y;
}

static tdm_status_t measure_latency(bench_t *b, xfer_op_t op, uint32_t n_pages,
                                    double *median_us_out)
{
    static double samples_us[LATENCY_SAMPLES_MAX];
    uint32_t n_samples = 0;
    uint64_t t_start_ns = tdm_clock_now_ns();
    tdm_status_t status;

    b->n_done = 0;
    b->first_error = TDM_OK;
    while (n_samples < LATENCY_SAMPLES_MAX &&
           (n_samples < 5 || tdm_clock_elapsed_ms(t_start_ns) < b->cfg.seconds * 500.0)) {
        uint64_t t_post_ns = tdm_clock_now_ns();

        status = post(b, op, n_pages);
        if (status != TDM_IN_PROGRESS) {
            return status;
        }
        status = drain(b, n_samples + 1);
        if (status != TDM_OK) {
            return status;
        }
        samples_us[n_samples++] = (double)(tdm_clock_now_ns() - t_post_ns) * 1e-3;
    }
    qsort(samples_us, n_samples, sizeof(samples_us[0]), compare_double);
    if (getenv("BENCH_DEBUG") != NULL) {
        double sum = 0;

        for (uint32_t i = 0; i < n_samples; i++) {
            sum += samples_us[i];
        }
        fprintf(stderr,
                "latency: n=%u min=%.1f p10=%.1f p50=%.1f p90=%.1f p99=%.1f max=%.1f mean=%.1f\n",
                n_samples, samples_us[0], samples_us[n_samples / 10], samples_us[n_samples / 2],
                samples_us[n_samples * 9 / 10], samples_us[n_samples * 99 / 100],
                samples_us[n_samples - 1], sum / n_samples);
    }
    *median_us_out = samples_us[n_samples / 2];
    return TDM_OK;
}

/* ---- ucx_perftest ---- */

static pid_t spawn_perftest(const bench_t *b, char *const argv[], int stdout_fd)
{
    pid_t pid = fork();

    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);

        setenv("UCX_TLS", b->cfg.transport, 1);
        setenv("UCX_PROTO_ENABLE", strcmp(b->cfg.protocols, "v1") == 0 ? "n" : "y", 1);
        if (stdout_fd >= 0) {
            dup2(stdout_fd, STDOUT_FILENO);
        } else if (devnull >= 0) {
            dup2(devnull, STDOUT_FILENO);
        }
        if (devnull >= 0) {
            dup2(devnull, STDERR_FILENO);
        }
        close_range(3, ~0u, 0);
        alarm(PERFTEST_TIMEOUT_S); /* a stuck ucx_perftest dies instead of hanging the bench */
        execvp(argv[0], argv);
        _exit(127);
    }
    return pid;
}

/* Parse the last line of `ucx_perftest -f` output: iterations, latency 50%/avg/overall (us),
 * bandwidth avg/overall (MB/s = MiB/s), message rate avg/overall. */
static int parse_perftest(const char *text, double *bw_mib_s_out, double *msg_us_out)
{
    const char *line = text;
    const char *last = NULL;
    double v[8];

    while (*line != '\0') {
        const char *end = strchr(line, '\n');
        size_t n_chars = end != NULL ? (size_t)(end - line) : strlen(line);

        if (n_chars > 0 && sscanf(line, "%lf %lf %lf %lf %lf %lf %lf %lf", &v[0], &v[1], &v[2],
                                  &v[3], &v[4], &v[5], &v[6], &v[7]) == 8) {
            last = line;
        }
        if (end == NULL) {
            break;
        }
        line = end + 1;
    }
    if (last == NULL || sscanf(last, "%lf %lf %lf %lf %lf %lf %lf %lf", &v[0], &v[1], &v[2], &v[3],
                               &v[4], &v[5], &v[6], &v[7]) != 8) {
        return -1;
    }
    *bw_mib_s_out = v[5];
    *msg_us_out = v[3];
    return 0;
}

/* One ucx_perftest measurement: a server child, then client children until one connects (the
 * server needs a moment to listen; a refused client exits at once and is retried). */
static tdm_status_t run_perftest(bench_t *b, xfer_op_t op, uint64_t msg_bytes, uint64_t n_messages,
                                 double *bw_mib_s_out, double *msg_us_out)
{
    char port_text[16];
    char size_text[24];
    char iters_text[24];
    char warmup_text[24];
    const char *test = op == XFER_OP_PUT ? "ucp_put_bw" : "ucp_get";
    char *server_argv[] = {(char *)b->cfg.perftest, "-p", port_text, NULL};
    char *client_argv[] = {(char *)b->cfg.perftest,
                           "127.0.0.1",
                           "-p",
                           port_text,
                           "-t",
                           (char *)test,
                           "-s",
                           size_text,
                           "-n",
                           iters_text,
                           "-w",
                           warmup_text,
                           "-f",
                           NULL};
    pid_t server;
    int attempt;
    tdm_status_t status = TDM_ERR_IO;

    snprintf(port_text, sizeof(port_text), "%u", b->next_port++);
    snprintf(size_text, sizeof(size_text), "%llu", (unsigned long long)msg_bytes);
    snprintf(iters_text, sizeof(iters_text), "%llu", (unsigned long long)n_messages);
    snprintf(warmup_text, sizeof(warmup_text), "%llu", (unsigned long long)(n_messages / 10 + 1));
    server = spawn_perftest(b, server_argv, -1);
    if (server < 0) {
        return TDM_ERR_IO;
    }
    for (attempt = 0; attempt < PERFTEST_ATTEMPTS; attempt++) {
        char text[8192];
        size_t used = 0;
        int pipe_fds[2];
        int wstatus = 0;
        pid_t client;
        struct timespec backoff = {0, 10 * 1000 * 1000};

        if (pipe(pipe_fds) != 0) {
            break;
        }
        client = spawn_perftest(b, client_argv, pipe_fds[1]);
        close(pipe_fds[1]);
        for (;;) {
            ssize_t n = read(pipe_fds[0], text + used, sizeof(text) - 1 - used);

            if (n < 0 && errno == EINTR) {
                continue;
            }
            if (n <= 0) {
                break;
            }
            used += (size_t)n;
            if (used == sizeof(text) - 1) {
                memmove(text, text + used / 2, used - used / 2);
                used -= used / 2;
            }
        }
        close(pipe_fds[0]);
        text[used] = '\0';
        waitpid(client, &wstatus, 0);
        if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0 &&
            parse_perftest(text, bw_mib_s_out, msg_us_out) == 0) {
            status = TDM_OK;
            break;
        }
        if (waitpid(server, NULL, WNOHANG) == server) {
            server = 0; /* the server gave up: nothing more to try */
            break;
        }
        nanosleep(&backoff, NULL); /* not yet listening: back off, then connect again */
    }
    if (server > 0) {
        kill(server, SIGTERM);
        waitpid(server, NULL, 0);
    }
    if (status != TDM_OK) {
        tdm_log(TDM_LOG_ERROR, "bench", "ucx_perftest failed: test=%s size=%llu transport=%s", test,
                (unsigned long long)msg_bytes, b->cfg.transport);
    }
    return status;
}

/* ---- driver ---- */

static tdm_status_t parse_sizes(bench_t *b)
{
    const char *p = b->cfg.sizes;

    b->n_sizes = 0;
    b->max_pages = 1;
    while (*p != '\0') {
        char *end;
        unsigned long v = strtoul(p, &end, 10);

        if (end == p || v == 0 || v > 65536 || b->n_sizes == MAX_SIZES ||
            (*end != ',' && *end != '\0')) {
            fprintf(stderr,
                    "tandem-bench-transfer: --sizes: expected up to %d numbers "
                    "1..65536 separated by commas, got \"%s\"\n",
                    MAX_SIZES, b->cfg.sizes);
            return TDM_ERR_INVALID_ARG;
        }
        b->sizes[b->n_sizes++] = (uint32_t)v;
        if (v > b->max_pages) {
            b->max_pages = (uint32_t)v;
        }
        p = *end == ',' ? end + 1 : end;
    }
    b->do_put = strstr(b->cfg.ops, "put") != NULL;
    b->do_get = strstr(b->cfg.ops, "get") != NULL;
    if (b->n_sizes == 0 || (!b->do_put && !b->do_get) ||
        (strcmp(b->cfg.protocols, "v1") != 0 && strcmp(b->cfg.protocols, "v2") != 0)) {
        fprintf(stderr, "tandem-bench-transfer: need --sizes, --ops put and/or get, and "
                        "--protocols v1 or v2\n");
        return TDM_ERR_INVALID_ARG;
    }
    return TDM_OK;
}

static tdm_status_t run_case(bench_t *b, xfer_op_t op, uint32_t n_pages, result_t *r)
{
    tdm_status_t status;

    memset(r, 0, sizeof(*r));
    r->op = op;
    r->n_pages = n_pages;
    /* Warm up: touch every page and learn the lane. */
    status = measure_latency(b, op, n_pages, &r->lat_us);
    if (status != TDM_OK) {
        return status;
    }
    r->lat_us = 1e300;
    for (uint32_t rep = 0; rep < b->cfg.reps; rep++) {
        double bw = 0;
        double bw_same = 0;
        double bw_copy = 0;
        double lat = 0;

        status = measure_bandwidth(b, op, n_pages, &bw);
        if (status != TDM_OK) {
            return status;
        }
        r->lane = b->lane;
        if (bw > r->bw_mib_s) {
            r->bw_mib_s = bw;
        }
        b->same_page = 1;
        status = measure_bandwidth(b, op, n_pages, &bw_same);
        b->same_page = 0;
        if (status != TDM_OK) {
            return status;
        }
        if (bw_same > r->bw_same_mib_s) {
            r->bw_same_mib_s = bw_same;
        }
        status = measure_memcpy(b, n_pages, &bw_copy);
        if (status != TDM_OK) {
            return status;
        }
        if (bw_copy > r->memcpy_mib_s) {
            r->memcpy_mib_s = bw_copy;
        }
        status = measure_latency(b, op, n_pages, &lat);
        if (status != TDM_OK) {
            return status;
        }
        if (lat < r->lat_us) {
            r->lat_us = lat;
        }
        if (strcmp(b->cfg.perftest, "none") != 0) {
            double pf_bw = 0;
            double pf_us = 0;
            double pf_batch_bw = 0;
            double pf_batch_us = 0;
            uint64_t msg_bytes = (uint64_t)b->cfg.page_bytes * b->cfg.coalesce;
            uint64_t batch_bytes = (uint64_t)b->cfg.page_bytes * n_pages;
            /* As many messages as our run moved in its time, plus some. */
            uint64_t n_messages = (uint64_t)(bw * MIB * b->cfg.seconds / (double)msg_bytes) + 2000;
            uint64_t n_batch_messages =
                (uint64_t)(bw * MIB * b->cfg.seconds / (double)batch_bytes) + 5;

            status = command_receiver(b, CMD_PARK);
            if (status != TDM_OK) {
                return status;
            }
            status = run_perftest(b, op, msg_bytes, n_messages, &pf_bw, &pf_us);
            if (status == TDM_OK && batch_bytes > msg_bytes) {
                /* The like-for-like footprint: one message over the whole batch's bytes. */
                status =
                    run_perftest(b, op, batch_bytes, n_batch_messages, &pf_batch_bw, &pf_batch_us);
            } else {
                pf_batch_bw = pf_bw;
            }
            if (status != TDM_OK) {
                return status;
            }
            status = command_receiver(b, CMD_RESUME);
            if (status != TDM_OK) {
                return status;
            }
            if (pf_bw > r->pf_bw_mib_s) {
                r->pf_bw_mib_s = pf_bw;
                r->pf_msg_us = pf_us;
            }
            if (pf_batch_bw > r->pf_batch_bw_mib_s) {
                r->pf_batch_bw_mib_s = pf_batch_bw;
                r->pf_batch_msg_us = batch_bytes > msg_bytes ? pf_batch_us : 0;
            }
        }
    }
    return TDM_OK;
}

static void print_results(const bench_t *b, const result_t *results, uint32_t n_results)
{
    const char *fmt_md = "| %s | %s | %u | %.0f | %.0f | %.2f | %.0f | %.2f | %.0f | %.2f | %.0f | "
                         "%.2f | %.1f | %.1f | %.2f | %s |\n";
    const char *fmt_txt = "%-4s %-4s %5u %8.0f %8.0f %5.2f %8.0f %5.2f %8.0f %5.2f %8.0f %5.2f "
                          "%9.1f %9.1f %5.2f  %s\n";

    printf("# tandem-bench-transfer --transport %s --protocols %s --page-bytes %u --window %u "
           "--seconds %.2f --reps %u --coalesce %u (UCX %s)\n",
           b->cfg.transport, b->cfg.protocols, b->cfg.page_bytes, b->cfg.window, b->cfg.seconds,
           b->cfg.reps, b->cfg.coalesce, ucp_get_version_string());
    if (b->cfg.markdown) {
        printf("| tl | op | pages | perftest MiB/s | MiB/s | ratio | perftest MiB/s, batch-size "
               "message | ratio | MiB/s, 1 page repeated | ratio | memcpy MiB/s | vs memcpy | "
               "batch us | perftest us | lat ratio | lane |\n");
        printf("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
    } else {
        printf("%-4s %-4s %5s %8s %8s %5s %8s %5s %8s %5s %8s %5s %9s %9s %5s  %s\n", "tl", "op",
               "pages", "pf_MiB/s", "MiB/s", "ratio", "pf_batch", "ratio", "same_pg", "ratio",
               "memcpy", "vs_mc", "batch_us", "pf_us", "ratio", "lane");
    }
    for (uint32_t i = 0; i < n_results; i++) {
        const result_t *r = &results[i];
        /* the batch-size message's time (like for like); N times the page message's time when
         * there is no such run (1 page) */
        double pf_us = r->pf_batch_msg_us > 0 ? r->pf_batch_msg_us
                                              : r->pf_msg_us * r->n_pages / b->cfg.coalesce;
        double bw_ratio = r->pf_bw_mib_s > 0 ? r->bw_mib_s / r->pf_bw_mib_s : 0;
        double batch_ratio = r->pf_batch_bw_mib_s > 0 ? r->bw_mib_s / r->pf_batch_bw_mib_s : 0;
        double same_ratio = r->pf_bw_mib_s > 0 ? r->bw_same_mib_s / r->pf_bw_mib_s : 0;
        double copy_ratio = r->memcpy_mib_s > 0 ? r->bw_mib_s / r->memcpy_mib_s : 0;
        double lat_ratio = pf_us > 0 ? r->lat_us / pf_us : 0;

        printf(b->cfg.markdown ? fmt_md : fmt_txt, b->cfg.transport,
               r->op == XFER_OP_PUT ? "put" : "get", r->n_pages, r->pf_bw_mib_s, r->bw_mib_s,
               bw_ratio, r->pf_batch_bw_mib_s, batch_ratio, r->bw_same_mib_s, same_ratio,
               r->memcpy_mib_s, copy_ratio, r->lat_us, pf_us, lat_ratio, r->lane.text);
    }
}

int main(int argc, char **argv)
{
    bench_t b;
    result_t results[2 * MAX_SIZES];
    uint32_t n_results = 0;
    tdm_flags_action_t action;
    tdm_status_t status;
    int rc = 1;

    if (argc >= 2 && strcmp(argv[1], RECEIVER_FLAG) == 0) {
        return receiver_main(argc, argv);
    }
    memset(&b, 0, sizeof(b));
    status = tdm_flags_parse(bench_flags, N_BENCH_FLAGS, argc, argv, "tandem-bench-transfer",
                             "KV page put/get bandwidth and latency beside ucx_perftest", &b.cfg,
                             NULL, NULL, &action);
    if (status != TDM_OK) {
        return 2;
    }
    if (action == TDM_FLAGS_HELP) {
        return 0;
    }
    if (parse_sizes(&b) != TDM_OK) {
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    tdm_log_set_level(TDM_LOG_WARN);
    b.next_port = b.cfg.port;
    b.local_pages = malloc(b.max_pages * sizeof(*b.local_pages));
    b.remote_pages = malloc(b.max_pages * sizeof(*b.remote_pages));
    b.zero_pages = calloc(b.max_pages, sizeof(*b.zero_pages));
    if (b.local_pages == NULL || b.remote_pages == NULL || b.zero_pages == NULL) {
        goto out_free;
    }
    for (uint32_t i = 0; i < b.max_pages; i++) {
        b.local_pages[i] = i;
        b.remote_pages[i] = i; /* runs coalesce up to --coalesce pages */
    }

    status = make_context(&b.cfg, "bench-sender", &b.ctx);
    if (status != TDM_OK) {
        goto out_free;
    }
    status = make_pool(b.ctx, b.cfg.page_bytes, b.max_pages, &b.pool);
    if (status != TDM_OK) {
        goto out_destroy_ctx;
    }
    status = spawn_receiver(&b);
    if (status != TDM_OK) {
        goto out_stop_receiver;
    }
    for (int op = XFER_OP_PUT; op <= XFER_OP_GET; op++) {
        if ((op == XFER_OP_PUT && !b.do_put) || (op == XFER_OP_GET && !b.do_get)) {
            continue;
        }
        for (uint32_t i = 0; i < b.n_sizes; i++) {
            status = run_case(&b, (xfer_op_t)op, b.sizes[i], &results[n_results]);
            if (status != TDM_OK) {
                tdm_log(TDM_LOG_ERROR, "bench", "case failed: op=%s pages=%u status=%s",
                        op == XFER_OP_PUT ? "put" : "get", b.sizes[i], tdm_status_name(status));
                goto out_stop_receiver;
            }
            n_results++;
            fprintf(stderr, "done: op=%s pages=%u\n", op == XFER_OP_PUT ? "put" : "get",
                    b.sizes[i]);
        }
    }
    print_results(&b, results, n_results);
    rc = 0;

out_stop_receiver:
    xfer_peer_close(b.peer);
    stop_receiver(&b);
    xfer_pool_destroy(b.pool);
out_destroy_ctx:
    xfer_context_destroy(b.ctx);
out_free:
    free(b.local_pages);
    free(b.remote_pages);
    free(b.zero_pages);
    return rc;
}
