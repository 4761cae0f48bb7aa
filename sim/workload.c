/* workload.c - agent sessions from traces or synthesised. See workload.h. */
#include "sim/workload.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void sim_workload_opts_default(sim_workload_opts_t *opts)
{
    opts->max_pause_ms = 10000;
    opts->tool_pause_ms = 3000;
    opts->max_context = 1048576;
}

static sim_workload_t *workload_new(size_t n_sessions, size_t n_turns)
{
    sim_workload_t *wl = calloc(1, sizeof(*wl));

    if (wl == NULL) {
        return NULL;
    }
    wl->sessions = calloc(n_sessions > 0 ? n_sessions : 1, sizeof(*wl->sessions));
    wl->turns = calloc(n_turns > 0 ? n_turns : 1, sizeof(*wl->turns));
    if (wl->sessions == NULL || wl->turns == NULL) {
        sim_workload_destroy(wl);
        return NULL;
    }
    return wl;
}

void sim_workload_destroy(sim_workload_t *workload)
{
    if (workload == NULL) {
        return;
    }
    free(workload->sessions);
    free(workload->turns);
    free(workload);
}

static uint32_t clip_u32(int64_t v, uint32_t lo, uint32_t hi)
{
    if (v < (int64_t)lo) {
        return lo;
    }
    if (v > (int64_t)hi) {
        return hi;
    }
    return (uint32_t)v;
}

/* The deterministic spread of a tool pause: [0.25, 1.75] x mean by a hash of the turn. */
static uint32_t tool_pause(uint32_t mean_ms, uint64_t key)
{
    uint64_t h = key * 0x9E3779B97F4A7C15ull;

    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    return (uint32_t)((double)mean_ms * (0.25 + 1.5 * (double)(h % 10000u) / 10000.0));
}

static size_t common_hash_prefix(const bench_turn_t *a, const bench_turn_t *b)
{
    size_t n = a->n_hash_ids < b->n_hash_ids ? a->n_hash_ids : b->n_hash_ids;
    size_t i = 0;

    while (i < n && a->hash_ids[i] == b->hash_ids[i]) {
        i++;
    }
    return i;
}

tdm_status_t sim_workload_from_trace(const bench_trace_t *trace, const sim_workload_opts_t *opts,
                                     const char *what, sim_workload_t **workload_out)
{
    sim_workload_t *wl;
    size_t n_turns = 0;

    for (size_t s = 0; s < trace->n_sessions; s++) {
        n_turns += trace->sessions[s].n_turns;
    }
    if (trace->n_sessions == 0 || n_turns == 0) {
        return TDM_ERR_FORMAT;
    }
    wl = workload_new(trace->n_sessions, n_turns);
    if (wl == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    for (size_t s = 0; s < trace->n_sessions; s++) {
        const bench_session_t *bs = &trace->sessions[s];
        sim_session_t *ss = &wl->sessions[wl->n_sessions];

        if (bs->n_turns == 0) {
            continue;
        }
        ss->first_turn = (uint32_t)wl->n_turns;
        ss->n_turns = (uint32_t)bs->n_turns;
        for (size_t k = 0; k < bs->n_turns; k++) {
            const bench_turn_t *bt = &bs->turns[k];
            sim_turn_t *t = &wl->turns[wl->n_turns];

            t->input_tokens = clip_u32(bt->input_length, 1, opts->max_context);
            t->output_tokens = clip_u32(bt->output_length, 1, 1u << 20);
            if (k > 0) {
                const sim_turn_t *prev = t - 1;
                uint64_t prev_len = (uint64_t)prev->input_tokens + prev->output_tokens;
                uint64_t shared;

                if (trace->format == BENCH_TRACE_MOONCAKE) {
                    shared = (uint64_t)common_hash_prefix(bt, &bs->turns[k - 1]) *
                             BENCH_TRACE_BLOCK_TOKENS;
                    t->pause_ms = bt->gap_ms < 0 ? opts->max_pause_ms
                                                 : clip_u32(bt->gap_ms, 0, opts->max_pause_ms);
                } else {
                    shared = prev_len;
                    t->pause_ms = tool_pause(opts->tool_pause_ms, wl->n_turns);
                }
                if (shared > prev_len) {
                    shared = prev_len;
                }
                if (shared > t->input_tokens) {
                    shared = t->input_tokens;
                }
                t->shared_tokens = (uint32_t)shared;
            }
            wl->n_turns++;
        }
        wl->n_sessions++;
    }
    snprintf(wl->source, sizeof(wl->source), "%s:%s (%zu sessions, %zu turns)",
             bench_trace_format_name(trace->format), what, wl->n_sessions, wl->n_turns);
    *workload_out = wl;
    return TDM_OK;
}

tdm_status_t sim_workload_load(const char *path, const sim_workload_opts_t *opts,
                               sim_workload_t **workload_out, char *err, size_t err_bytes)
{
    bench_trace_format_t format;
    bench_trace_t *trace = NULL;
    tdm_status_t status;

    status = bench_trace_format_parse("auto", path, &format);
    if (status != TDM_OK) {
        return status;
    }
    status = bench_trace_load(path, format, &trace, err, err_bytes);
    if (status != TDM_OK) {
        return status;
    }
    status = sim_workload_from_trace(trace, opts, path, workload_out);
    if (status == TDM_ERR_FORMAT && err_bytes > 0) {
        snprintf(err, err_bytes, "%s: no sessions", path);
    }
    bench_trace_destroy(trace);
    return status;
}

/* splitmix64: the synthetic workload's generator. */
static uint64_t next_u64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);

    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint32_t uniform(uint64_t *state, uint32_t lo, uint32_t hi)
{
    return lo + (uint32_t)(next_u64(state) % (uint64_t)(hi - lo + 1));
}

tdm_status_t sim_workload_synthetic(uint64_t seed, size_t n_sessions,
                                    const sim_workload_opts_t *opts, sim_workload_t **workload_out)
{
    uint64_t state = seed;
    uint32_t *turns_of;
    size_t n_turns = 0;
    sim_workload_t *wl;

    if (n_sessions == 0 || n_sessions > (1u << 24)) {
        return TDM_ERR_INVALID_ARG;
    }
    turns_of = malloc(n_sessions * sizeof(*turns_of));
    if (turns_of == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    for (size_t s = 0; s < n_sessions; s++) {
        turns_of[s] = uniform(&state, 8, 40);
        n_turns += turns_of[s];
    }
    wl = workload_new(n_sessions, n_turns);
    if (wl == NULL) {
        free(turns_of);
        return TDM_ERR_NO_MEMORY;
    }
    for (size_t s = 0; s < n_sessions; s++) {
        sim_session_t *ss = &wl->sessions[wl->n_sessions++];
        uint64_t len = uniform(&state, 4096, 24576);

        ss->first_turn = (uint32_t)wl->n_turns;
        ss->n_turns = turns_of[s];
        for (uint32_t k = 0; k < turns_of[s]; k++) {
            sim_turn_t *t = &wl->turns[wl->n_turns++];

            if (k > 0) {
                uint64_t prev_len = (uint64_t)t[-1].input_tokens + t[-1].output_tokens;

                len = prev_len + uniform(&state, 500, 3000);
                t->shared_tokens =
                    (uint32_t)(prev_len < opts->max_context ? prev_len : opts->max_context);
                t->pause_ms = uniform(&state, opts->tool_pause_ms / 4,
                                      opts->tool_pause_ms + opts->tool_pause_ms * 3 / 4);
            }
            t->input_tokens = (uint32_t)(len < opts->max_context ? len : opts->max_context);
            if (t->shared_tokens > t->input_tokens) {
                t->shared_tokens = t->input_tokens;
            }
            t->output_tokens = uniform(&state, 100, 900);
        }
    }
    free(turns_of);
    snprintf(wl->source, sizeof(wl->source), "synthetic:seed %llu (%zu sessions, %zu turns)",
             (unsigned long long)seed, wl->n_sessions, wl->n_turns);
    *workload_out = wl;
    return TDM_OK;
}

tdm_status_t sim_workload_append(sim_workload_t *dst, const sim_workload_t *src)
{
    sim_session_t *sessions;
    sim_turn_t *turns;
    size_t base = dst->n_turns;

    sessions = realloc(dst->sessions, (dst->n_sessions + src->n_sessions) * sizeof(*sessions));
    if (sessions == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    dst->sessions = sessions;
    turns = realloc(dst->turns, (dst->n_turns + src->n_turns) * sizeof(*turns));
    if (turns == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    dst->turns = turns;
    memcpy(dst->turns + dst->n_turns, src->turns, src->n_turns * sizeof(*turns));
    for (size_t s = 0; s < src->n_sessions; s++) {
        dst->sessions[dst->n_sessions + s] = src->sessions[s];
        dst->sessions[dst->n_sessions + s].first_turn += (uint32_t)base;
    }
    dst->n_sessions += src->n_sessions;
    dst->n_turns += src->n_turns;
    {
        size_t used = strlen(dst->source);

        if (used + 3 < sizeof(dst->source)) {
            int room = (int)(sizeof(dst->source) - used - 4);

            snprintf(dst->source + used, sizeof(dst->source) - used, " + %.*s", room, src->source);
        }
    }
    return TDM_OK;
}

void sim_workload_totals(const sim_workload_t *workload, uint64_t *input_out, uint64_t *shared_out,
                         uint64_t *output_out)
{
    uint64_t in = 0, shared = 0, out = 0;

    for (size_t i = 0; i < workload->n_turns; i++) {
        in += workload->turns[i].input_tokens;
        shared += workload->turns[i].shared_tokens;
        out += workload->turns[i].output_tokens;
    }
    if (input_out != NULL) {
        *input_out = in;
    }
    if (shared_out != NULL) {
        *shared_out = shared;
    }
    if (output_out != NULL) {
        *output_out = out;
    }
}

static int path_exists(const char *path)
{
    struct stat st;

    return stat(path, &st) == 0;
}

/* The first of two candidate paths (dir_a/name_a, dir_b/name_b) that exists, into buf; 0 none. */
static int pick(const char *dir_a, const char *name_a, const char *dir_b, const char *name_b,
                char *buf, size_t n)
{
    if (dir_a != NULL) {
        snprintf(buf, n, "%s/%s", dir_a, name_a);
        if (path_exists(buf)) {
            return 1;
        }
    }
    if (dir_b != NULL) {
        snprintf(buf, n, "%s/%s", dir_b, name_b);
        if (path_exists(buf)) {
            return 1;
        }
    }
    return 0;
}

tdm_status_t sim_workload_default(const char *bundled_dir, const char *shared_dir,
                                  const sim_workload_opts_t *opts, sim_workload_t **workload_out,
                                  char *err, size_t err_bytes)
{
    char path[1024];
    sim_workload_t *wl = NULL, *part = NULL;
    tdm_status_t status;

    if (pick(shared_dir, "mooncake-traces/conversation_trace.jsonl", bundled_dir,
             "mooncake-conversation-slice.jsonl", path, sizeof(path))) {
        status = sim_workload_load(path, opts, &wl, err, err_bytes);
        if (status != TDM_OK) {
            return status;
        }
    }
    if (pick(shared_dir, "swe-agent-trajectories", bundled_dir, "swe-agent__test-repo-i1.traj",
             path, sizeof(path))) {
        status = sim_workload_load(path, opts, &part, err, err_bytes);
        if (status != TDM_OK) {
            sim_workload_destroy(wl);
            return status;
        }
        if (wl == NULL) {
            wl = part;
            part = NULL;
        } else {
            status = sim_workload_append(wl, part);
            sim_workload_destroy(part);
            if (status != TDM_OK) {
                sim_workload_destroy(wl);
                return status;
            }
        }
    }
    if (wl == NULL) {
        return sim_workload_synthetic(1, 64, opts, workload_out);
    }
    *workload_out = wl;
    return TDM_OK;
}
