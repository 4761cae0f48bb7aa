/* workload.h - tandem-sim's workload: agent sessions as compact turn lists.
 *
 * Owns a table of sessions, each an ordered run of turns: the prompt the model reads, how much
 * of it repeats the previous turn's prompt and reply (what a sticky decode instance still holds
 * in KV), the reply length and the tool (or think) pause before the turn. Built from the bundled
 * agent traces through tandem-bench's trace parser (bench/replay/trace.h: Mooncake JSONL, whose
 * sessions are rebuilt from hash-id prefix chains, and SWE-agent .traj), or synthesised when no
 * trace is at hand. The simulator (sim/sim.h) scales it to N concurrent agents by cycling each
 * agent through the sessions. Knows nothing of time, instances or the router.
 */
#ifndef TANDEM_SIM_WORKLOAD_H
#define TANDEM_SIM_WORKLOAD_H

#include <stddef.h>
#include <stdint.h>

#include "bench/replay/trace.h"
#include "common/status.h"

/* One model call of a session (plain data). */
typedef struct {
    uint32_t input_tokens;  /* prompt tokens (the whole context the model reads), >= 1 */
    uint32_t shared_tokens; /* leading prompt tokens equal to the previous turn's prompt + reply
                               (0 on a session's first turn), <= input_tokens */
    uint32_t output_tokens; /* reply tokens, >= 1 */
    uint32_t pause_ms;      /* pause after the previous turn's reply ends (tool run, or the
                               trace's gap capped); 0 on a first turn */
} sim_turn_t;

/* One session: turns [first_turn, first_turn + n_turns) of the workload. */
typedef struct {
    uint32_t first_turn;
    uint32_t n_turns; /* >= 1 */
} sim_session_t;

/* A workload (plain data; owned by whoever created it, freed with sim_workload_destroy). */
typedef struct {
    sim_turn_t *turns;
    size_t n_turns;
    sim_session_t *sessions;
    size_t n_sessions;
    char source[256]; /* what it was built from, e.g. "mooncake:bench/traces/...(53 sessions)" */
} sim_workload_t;

/* How trace timing becomes pauses (plain data; sim_workload_opts_default fills it). */
typedef struct {
    uint32_t max_pause_ms;  /* Mooncake: the gap between two turns' timestamps (human chat time)
                               is capped at this; default 10,000 (tandem-bench's --max-pause) */
    uint32_t tool_pause_ms; /* SWE-agent and synthetic: mean tool pause, ms; default 3,000 */
    uint32_t max_context;   /* prompts are clipped to this many tokens; default 1,048,576 */
} sim_workload_opts_t;

/* sim_workload_opts_default - the defaults above. Cannot fail. */
void sim_workload_opts_default(sim_workload_opts_t *opts);

/*
 * sim_workload_from_trace - the sessions of a parsed trace (borrowed) as a workload.
 * Mooncake: shared_tokens = the common hash-id prefix with the previous turn x 512, capped by
 * the previous prompt + reply; pause = the timestamp gap capped at max_pause_ms. SWE-agent:
 * shared_tokens = the previous prompt + reply (the chat history only grows), capped by the
 * prompt; pause = tool_pause_ms spread deterministically over [0.25, 1.75] x the mean by turn.
 * Returns TDM_OK with *workload_out, TDM_ERR_FORMAT (no sessions) or TDM_ERR_NO_MEMORY.
 */
tdm_status_t sim_workload_from_trace(const bench_trace_t *trace, const sim_workload_opts_t *opts,
                                     const char *what, sim_workload_t **workload_out);

/*
 * sim_workload_load - parse the trace at `path` (Mooncake JSONL, or a SWE-agent .traj file or
 * folder: bench_trace_format_parse "auto") and convert it. Returns what bench_trace_load and
 * sim_workload_from_trace return; err (err_bytes, may be 0) says why on failure.
 */
tdm_status_t sim_workload_load(const char *path, const sim_workload_opts_t *opts,
                               sim_workload_t **workload_out, char *err, size_t err_bytes);

/*
 * sim_workload_synthetic - n_sessions (>= 1) coding-agent sessions drawn from `seed`: 8 to 40
 * turns, a first prompt of 4k to 24k tokens growing 500 to 3,000 tokens a turn (tool output)
 * plus the previous reply, replies of 100 to 900 tokens, tool pauses around tool_pause_ms.
 * Deterministic for a seed. Returns TDM_OK, TDM_ERR_INVALID_ARG or TDM_ERR_NO_MEMORY.
 */
tdm_status_t sim_workload_synthetic(uint64_t seed, size_t n_sessions,
                                    const sim_workload_opts_t *opts, sim_workload_t **workload_out);

/*
 * sim_workload_default - the bundled mix: the Mooncake conversation trace and the SWE-agent
 * sessions of `shared_dir` (../shared/data; may be NULL) when present, else the slices bundled in
 * `bundled_dir` (bench/traces; may be NULL); the synthetic workload (seed 1, 64 sessions) when
 * neither has a trace. Returns TDM_OK or a loader's error (err says which file).
 */
tdm_status_t sim_workload_default(const char *bundled_dir, const char *shared_dir,
                                  const sim_workload_opts_t *opts, sim_workload_t **workload_out,
                                  char *err, size_t err_bytes);

/* sim_workload_append - append src's sessions (copied) to dst. Returns TDM_OK or
 * TDM_ERR_NO_MEMORY (dst unchanged). */
tdm_status_t sim_workload_append(sim_workload_t *dst, const sim_workload_t *src);

/* sim_workload_totals - sums over every turn: prompt tokens, shared tokens and reply tokens
 * (any out pointer may be NULL). */
void sim_workload_totals(const sim_workload_t *workload, uint64_t *input_out, uint64_t *shared_out,
                         uint64_t *output_out);

/* sim_workload_destroy - free. Accepts NULL. */
void sim_workload_destroy(sim_workload_t *workload);

#endif
