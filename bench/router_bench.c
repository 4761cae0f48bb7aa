/* router_bench.c - tandem-bench-router: what one placement decision costs the router at fleet
 * scale (issue 18), in process, no sockets. A registry of --workers workers in --racks racks
 * (a quarter of each rack prefill, the rest decode; random loads from heartbeats) and a session
 * table of --sessions live sessions; one decision = look the session up by id, place its decode
 * worker (router_place_decode), place its prefill job (router_place_prefill_session), and note
 * both as assigned (router_registry_note_assigned), releasing the oldest of --inflight earlier
 * ones; a heartbeat of a random worker comes every --beat-every decisions (not timed). Baseline,
 * in the same run, alternating A/B rounds: the policy before issue 18, a scan of every worker
 * and, per decode worker, of every worker again for its rack's prefill backlog (O(N^2); kept
 * here verbatim over the same registry). Prints placements/s (one core), decision latency p50 /
 * p99 and the ratio to the baseline, then how both grow from 100 to --workers workers. Results
 * go into docs/BENCHMARKS.md.
 */
#include "common/clock.h"
#include "common/flags.h"
#include "common/log.h"
#include "common/status.h"
#include "proto/proto.h"
#include "proto/proto_hash.h"
#include "router/placement.h"
#include "router/registry.h"
#include "router/session.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    uint32_t workers;
    uint32_t racks;
    uint32_t sessions;
    uint32_t decisions;
    uint32_t baseline_decisions;
    uint32_t inflight;
    uint32_t beat_every;
    uint32_t rounds;
} bench_cfg_t;

static const tdm_flag_t bench_flags[] = {
    {"workers", TDM_FLAG_U32, "10000", offsetof(bench_cfg_t, workers),
     "workers of the largest fleet (the growth table runs 100, 1000, ... up to it)", 4, 1u << 20,
     0},
    {"racks", TDM_FLAG_U32, "140", offsetof(bench_cfg_t, racks),
     "racks of the largest fleet (smaller fleets keep its workers per rack)", 1, 1u << 16, 0},
    {"sessions", TDM_FLAG_U32, "100000", offsetof(bench_cfg_t, sessions), "live sessions", 1,
     1u << 24, 0},
    {"decisions", TDM_FLAG_U32, "200000", offsetof(bench_cfg_t, decisions),
     "timed decisions per round (indexed placement)", 100, 1u << 30, 0},
    {"baseline-decisions", TDM_FLAG_U32, "200", offsetof(bench_cfg_t, baseline_decisions),
     "timed decisions per round of the O(N^2) baseline at the largest fleet (more at smaller)", 10,
     1u << 30, 0},
    {"inflight", TDM_FLAG_U32, "20000", offsetof(bench_cfg_t, inflight),
     "assignments outstanding (the oldest is released per decision)", 1, 1u << 24, 0},
    {"beat-every", TDM_FLAG_U32, "5", offsetof(bench_cfg_t, beat_every),
     "decisions per heartbeat of a random worker (5: 10,000 workers at the router's default "
     "250 ms heartbeat interval send 40,000/s, one per 5 placements at 200,000/s)",
     1, 1u << 20, 0},
    {"rounds", TDM_FLAG_U32, "3", offsetof(bench_cfg_t, rounds),
     "alternating A/B rounds (medians reported)", 1, 99, 0},
};
#define N_BENCH_FLAGS (sizeof(bench_flags) / sizeof(bench_flags[0]))

static const char *const kv_formats[2] = {PROTO_KV_FORMAT_MAIN, PROTO_KV_FORMAT_INDEX};
static const proto_compat_t compat = {
    .model_fingerprint = 0x1234,
    .page_format_version = 1,
    .page_rows = 64,
    .page_bytes = 4096,
    .tokens_per_block = 64,
    .kv_formats = kv_formats,
    .n_kv_formats = 2,
    .max_context = 1 << 20,
    .protocol_version = PROTO_VERSION,
};

static uint64_t next_rand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 17;
}

/* ---- the policy before issue 18 (router/placement.c at 404a213), the baseline ------------ */

static double old_backlog_s(const router_worker_t *w)
{
    double queued = (double)(w->queued_prefill_tokens + w->n_assigned_tokens);

    return w->recent_tokens_per_s > 0.0 ? queued / w->recent_tokens_per_s : queued / 1000.0;
}

static double old_rack_backlog_s(router_registry_t *r, const char *rack)
{
    double best = -1.0;

    for (int i = router_registry_next(r, -1); i >= 0; i = router_registry_next(r, i)) {
        const router_worker_t *w = router_registry_worker(r, i, 0);
        if (!router_registry_placeable(w) || w->role != TANDEM__ROLE__ROLE_PREFILL ||
            strcmp(w->rack, rack) != 0) {
            continue;
        }
        if (best < 0.0 || old_backlog_s(w) < best) {
            best = old_backlog_s(w);
        }
    }
    return best;
}

static int old_place_decode(router_registry_t *r, uint64_t n_tokens)
{
    int have_prefill = 0, best = -1;
    double best_score = 0.0;
    uint32_t best_active = 0;

    for (int i = router_registry_next(r, -1); i >= 0 && !have_prefill;
         i = router_registry_next(r, i)) {
        const router_worker_t *w = router_registry_worker(r, i, 0);
        have_prefill = router_registry_placeable(w) && w->role == TANDEM__ROLE__ROLE_PREFILL;
    }
    for (int i = router_registry_next(r, -1); i >= 0; i = router_registry_next(r, i)) {
        const router_worker_t *w = router_registry_worker(r, i, 0);
        double occupancy = 0.0, score, rack;
        if (w->role != TANDEM__ROLE__ROLE_DECODE || !router_registry_placeable(w) ||
            !router_worker_holds(w, n_tokens)) {
            continue;
        }
        if (w->total_pages > 0) {
            uint32_t f = w->free_pages < w->total_pages ? w->free_pages : w->total_pages;
            occupancy = 1.0 - (double)f / (double)w->total_pages;
        }
        score = occupancy + (double)(w->running_sequences + w->n_active) /
                                (double)(w->max_sequences > 0 ? w->max_sequences : 1);
        if (have_prefill) {
            rack = old_rack_backlog_s(r, w->rack);
            score +=
                rack < 0.0
                    ? ROUTER_PLACE_NO_PREFILL_PENALTY
                    : ROUTER_PLACE_BACKLOG_WEIGHT_PER_S *
                          (rack < ROUTER_PLACE_BACKLOG_CAP_S ? rack : ROUTER_PLACE_BACKLOG_CAP_S);
        }
        if (best < 0 || score < best_score || (score == best_score && w->n_active < best_active)) {
            best = i;
            best_score = score;
            best_active = w->n_active;
        }
    }
    return best;
}

static int old_place_prefill(router_registry_t *r, const router_worker_t *decode, uint64_t n_tokens,
                             uint64_t session_key)
{
    int best = -1, holder = -1, best_same = 0, holder_same = 0;
    double best_b = 0.0, holder_b = 0.0;

    for (int i = router_registry_next(r, -1); i >= 0; i = router_registry_next(r, i)) {
        const router_worker_t *w = router_registry_worker(r, i, 0);
        int same;
        double b;
        if (w->role != TANDEM__ROLE__ROLE_PREFILL || !router_registry_placeable(w) ||
            !router_registry_transports_shared(w, decode) || !router_worker_holds(w, n_tokens)) {
            continue;
        }
        same = strcmp(w->rack, decode->rack) == 0;
        b = old_backlog_s(w);
        if (best < 0 || same > best_same || (same == best_same && b < best_b)) {
            best = i;
            best_same = same;
            best_b = b;
        }
        if (router_worker_holds_session(w, session_key) &&
            (holder < 0 || same > holder_same || (same == holder_same && b < holder_b))) {
            holder = i;
            holder_same = same;
            holder_b = b;
        }
    }
    if (holder >= 0 && holder_same == best_same &&
        holder_b <= best_b + ROUTER_PLACE_HISTORY_SLACK_S) {
        best = holder;
    }
    return best;
}

/* ---- the fleet ---------------------------------------------------------------------------- */

typedef struct {
    router_registry_t *reg;
    router_sessions_t *sessions;
    uint32_t n_workers;
    uint32_t n_racks;
    uint32_t n_sessions;
    char (*ids)[64];       /* [n_workers] */
    int *slots;            /* [n_workers] */
    int (*ring)[2];        /* [inflight] decode, prefill slot of an outstanding decision */
    uint64_t *ring_tokens; /* [inflight] */
    uint32_t n_ring, ring_at;
    uint64_t rng;
} fleet_t;

static void beat(fleet_t *f, uint32_t i)
{
    Tandem__Heartbeat hb = TANDEM__HEARTBEAT__INIT;
    Tandem__Load load = TANDEM__LOAD__INIT;
    int prefill = i % 4 == 0;

    load.total_pages = 4096;
    load.free_pages = (uint32_t)(next_rand(&f->rng) % 4097);
    load.running_sequences = prefill ? 0 : (uint32_t)(next_rand(&f->rng) % 64);
    load.queued_prefill_tokens = prefill ? next_rand(&f->rng) % 40000 : 0;
    load.recent_tokens_per_s = prefill ? 20000.0 + (double)(next_rand(&f->rng) % 20000) : 0.0;
    hb.seq = 1;
    hb.load = &load;
    router_registry_heartbeat(f->reg, f->ids[i], &hb, 2);
}

static int fleet_make(fleet_t *f, uint32_t n_workers, uint32_t n_racks, uint32_t n_sessions,
                      uint32_t inflight)
{
    Tandem__Register r = TANDEM__REGISTER__INIT;
    Tandem__PageFormat pf = TANDEM__PAGE_FORMAT__INIT;
    Tandem__Capacity cap = TANDEM__CAPACITY__INIT;
    char reason[256], rack[32], id[64];
    int32_t tokens[256];

    memset(f, 0, sizeof(*f));
    f->rng = 42;
    f->n_workers = n_workers;
    f->n_racks = n_racks;
    f->n_sessions = n_sessions;
    f->ids = calloc(n_workers, sizeof(*f->ids));
    f->slots = calloc(n_workers, sizeof(*f->slots));
    f->ring = calloc(inflight, sizeof(*f->ring));
    f->ring_tokens = calloc(inflight, sizeof(*f->ring_tokens));
    f->n_ring = inflight;
    if (f->ids == NULL || f->slots == NULL || f->ring == NULL || f->ring_tokens == NULL ||
        router_registry_create(&compat, 1500, &f->reg) != TDM_OK ||
        router_sessions_create(n_sessions, 64, &f->sessions) != TDM_OK) {
        return -1;
    }
    for (uint32_t k = 0; k < inflight; k++) {
        f->ring[k][0] = f->ring[k][1] = -1;
    }
    pf.version = compat.page_format_version;
    pf.rows_per_page = compat.page_rows;
    pf.page_bytes = compat.page_bytes;
    pf.tokens_per_block = compat.tokens_per_block;
    cap.total_pages = 4096;
    cap.max_sequences = 64;
    r.incarnation_id = id;
    r.rack = rack;
    r.node = (char *)"host";
    r.model_fingerprint = compat.model_fingerprint;
    r.page_format = &pf;
    r.kv_formats = (char **)kv_formats;
    r.n_kv_formats = 2;
    r.max_context = compat.max_context;
    r.protocol_version = PROTO_VERSION;
    r.capacity = &cap;
    for (uint32_t i = 0; i < n_workers; i++) {
        uint32_t k = (uint32_t)((uint64_t)i * n_racks / n_workers);
        snprintf(id, sizeof(id), "w%u", i);
        snprintf(rack, sizeof(rack), "nvl72-%u", k);
        snprintf(f->ids[i], sizeof(f->ids[i]), "%s", id);
        r.role = i % 4 == 0 ? TANDEM__ROLE__ROLE_PREFILL : TANDEM__ROLE__ROLE_DECODE;
        if (router_registry_register(f->reg, id, &r, 1, &f->slots[i], reason, sizeof(reason)) !=
            TDM_OK) {
            fprintf(stderr, "tandem-bench-router: register %s: %s\n", id, reason);
            return -1;
        }
        beat(f, i);
    }
    for (uint32_t s = 0; s < n_sessions; s++) {
        router_session_t *session;
        snprintf(id, sizeof(id), "session-%u", s);
        if (router_sessions_add(f->sessions, id, 0, s + 1, &session) != TDM_OK) {
            return -1;
        }
        for (size_t t = 0; t < sizeof(tokens) / sizeof(tokens[0]); t++) {
            tokens[t] = (int32_t)(next_rand(&f->rng) % 100000);
        }
        router_sessions_set_history(f->sessions, session, tokens,
                                    sizeof(tokens) / sizeof(tokens[0]));
    }
    return 0;
}

static void fleet_free(fleet_t *f)
{
    router_sessions_destroy(f->sessions);
    router_registry_destroy(f->reg);
    free(f->ids);
    free(f->slots);
    free(f->ring);
    free(f->ring_tokens);
}

/* One decision (timed) and its bookkeeping; old: the baseline policy. Returns 0 or -1 when no
 * worker was found. */
static int decide(fleet_t *f, int old, uint64_t *ns_out)
{
    char id[64];
    router_session_t *s;
    const router_worker_t *dw;
    uint64_t gen = 0, t0, key, n_tokens;
    int d, p;
    int *slot_pair;

    snprintf(id, sizeof(id), "session-%u", (uint32_t)(next_rand(&f->rng) % f->n_sessions));
    n_tokens = 512 + next_rand(&f->rng) % 8192;
    t0 = tdm_clock_now_ns();
    s = router_sessions_get(f->sessions, id);
    key = s != NULL ? proto_session_hash(s->id) : 0;
    d = old ? old_place_decode(f->reg, n_tokens)
            : router_place_decode(f->reg, n_tokens, &gen, NULL, NULL);
    dw = router_registry_worker(f->reg, d, 0);
    if (dw == NULL) {
        return -1;
    }
    p = old ? old_place_prefill(f->reg, dw, n_tokens, key)
            : router_place_prefill_session(f->reg, dw, n_tokens, key, &gen, NULL);
    slot_pair = f->ring[f->ring_at];
    router_registry_note_released(f->reg, slot_pair[0], 0, 0);
    router_registry_note_released(f->reg, slot_pair[1], 0, f->ring_tokens[f->ring_at]);
    router_registry_note_assigned(f->reg, d, 0, 0);
    router_registry_note_assigned(f->reg, p, 0, n_tokens);
    *ns_out = tdm_clock_now_ns() - t0;
    if (s != NULL) {
        s->worker_slot = d;
    }
    slot_pair[0] = d;
    slot_pair[1] = p;
    f->ring_tokens[f->ring_at] = n_tokens;
    f->ring_at = (f->ring_at + 1) % f->n_ring;
    return 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

    return x < y ? -1 : x > y;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

typedef struct {
    double per_s;      /* decisions per CPU second of this thread (heartbeats included) */
    double wall_per_s; /* decisions per second of their own wall time */
    double p50_us, p99_us;
} result_t;

static uint64_t thread_cpu_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* One round of n decisions: placements per CPU second (one core: time this thread ran, so other
 * processes on a shared host do not count; the heartbeats in between are included), per second
 * of the decisions' wall time, and wall latency p50 and p99. */
static int run_round(fleet_t *f, int old, uint32_t n, uint32_t beat_every, uint64_t *lat,
                     result_t *out)
{
    uint64_t total = 0;
    uint64_t cpu0 = thread_cpu_ns();

    for (uint32_t i = 0; i < n; i++) {
        if (decide(f, old, &lat[i]) != 0) {
            return -1;
        }
        total += lat[i];
        if (i % beat_every == 0) {
            beat(f, (uint32_t)(next_rand(&f->rng) % f->n_workers));
        }
    }
    out->per_s = (double)n * 1e9 / (double)(thread_cpu_ns() - cpu0);
    qsort(lat, n, sizeof(*lat), cmp_u64);
    out->wall_per_s = (double)n * 1e9 / (double)total;
    out->p50_us = (double)lat[n / 2] / 1e3;
    out->p99_us = (double)lat[(size_t)((double)n * 0.99)] / 1e3;
    return 0;
}

static double median(double *v, uint32_t n)
{
    qsort(v, n, sizeof(*v), cmp_double);
    return v[n / 2];
}

/* A/B rounds at one fleet size; medians into *a (indexed) and *b (baseline). */
static int measure(const bench_cfg_t *cfg, uint32_t n_workers, uint32_t n_racks, uint32_t n_a,
                   uint32_t n_b, result_t *a, result_t *b)
{
    fleet_t f;
    uint64_t *lat = malloc((n_a > n_b ? n_a : n_b) * sizeof(*lat));
    double av[4][99], bv[4][99];
    int rc = 0;

    if (lat == NULL || fleet_make(&f, n_workers, n_racks, cfg->sessions,
                                  cfg->inflight < n_workers ? cfg->inflight : n_workers) != 0) {
        fprintf(stderr, "tandem-bench-router: out of memory building the fleet\n");
        free(lat);
        return -1;
    }
    for (uint32_t r = 0; r < cfg->rounds && rc == 0; r++) {
        result_t x = {0, 0, 0, 0}, y = {0, 0, 0, 0};
        rc = run_round(&f, 0, n_a, cfg->beat_every, lat, &x);
        rc = rc != 0 ? rc : run_round(&f, 1, n_b, cfg->beat_every, lat, &y);
        av[0][r] = x.per_s, av[1][r] = x.p50_us, av[2][r] = x.p99_us, av[3][r] = x.wall_per_s;
        bv[0][r] = y.per_s, bv[1][r] = y.p50_us, bv[2][r] = y.p99_us, bv[3][r] = y.wall_per_s;
    }
    if (rc == 0) {
        a->per_s = median(av[0], cfg->rounds), a->p50_us = median(av[1], cfg->rounds);
        a->p99_us = median(av[2], cfg->rounds);
        a->wall_per_s = median(av[3], cfg->rounds);
        b->wall_per_s = median(bv[3], cfg->rounds);
        b->per_s = median(bv[0], cfg->rounds), b->p50_us = median(bv[1], cfg->rounds);
        b->p99_us = median(bv[2], cfg->rounds);
    }
    fleet_free(&f);
    free(lat);
    return rc;
}

int main(int argc, char **argv)
{
    bench_cfg_t cfg;
    tdm_flags_action_t action;
    double per_rack;
    result_t a, b;

    if (tdm_flags_parse(bench_flags, N_BENCH_FLAGS, argc, argv, "tandem-bench-router",
                        "Router placement decisions per second at fleet scale, beside the "
                        "O(N^2) policy it replaced.",
                        &cfg, NULL, NULL, &action) != TDM_OK) {
        return 2;
    }
    if (action == TDM_FLAGS_HELP) {
        return 0;
    }
    tdm_log_set_level(TDM_LOG_ERROR);
    per_rack = (double)cfg.workers / (double)cfg.racks;
    printf("tandem-bench-router: %u workers in %u racks, %u live sessions, %u in flight, one "
           "heartbeat per %u decisions, %u A/B rounds (medians)\n",
           cfg.workers, cfg.racks, cfg.sessions, cfg.inflight, cfg.beat_every, cfg.rounds);
    printf("placements/s per CPU second of the bench thread (heartbeats included); wall/s: over "
           "the decisions' wall time (other processes' time slices included); latency is wall\n");
    printf("%8s %6s | %12s %12s %8s %8s | %10s %10s %10s | %9s\n", "workers", "racks", "indexed /s",
           "wall /s", "p50 us", "p99 us", "O(N^2) /s", "p50 us", "p99 us", "ratio");
    for (uint32_t n = 100;; n = n * 10 < cfg.workers ? n * 10 : cfg.workers) {
        uint32_t racks = (uint32_t)((double)n / per_rack + 0.5);
        /* the baseline costs ~N^2: fewer decisions at larger fleets, at least 10 */
        uint64_t nb = (uint64_t)cfg.baseline_decisions * cfg.workers / n * cfg.workers / n;
        racks = racks > 0 ? racks : 1;
        nb = nb > cfg.decisions ? cfg.decisions : nb;
        if (measure(&cfg, n, racks, cfg.decisions, (uint32_t)nb, &a, &b) != 0) {
            return 1;
        }
        printf("%8u %6u | %12.0f %12.0f %8.2f %8.2f | %10.1f %10.0f %10.0f | %8.0fx\n", n, racks,
               a.per_s, a.wall_per_s, a.p50_us, a.p99_us, b.per_s, b.p50_us, b.p99_us,
               a.per_s / b.per_s);
        fflush(stdout);
        if (n >= cfg.workers) {
            break;
        }
    }
    printf("goal at %u workers: >= 200000 placements/s, p99 < 50 us: %s\n", cfg.workers,
           a.per_s >= 200000.0 && a.p99_us < 50.0 ? "met" : "NOT met");
    return 0;
}
