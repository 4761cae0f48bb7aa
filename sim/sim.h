/* sim.h - tandem-sim: a discrete-event simulation of agents served by racks of GPUs.
 *
 * Owns one run: the racks' instances (prefill and decode expert-parallel groups of one GPU kind,
 * each a worker registered in the router's own registry, router/registry.h), the router's
 * session table (router/session.h) and its placement policy (router/placement.h), linked
 * unchanged, plus N agents that replay a workload (sim/workload.h): each agent runs a session's
 * turns with their tool pauses, then the next session. A turn follows the dispatcher's flow
 * (router/dispatch.h): sticky decode placement of the session (router_place_decode for a new
 * one), the delta the decode instance lacks prefilled locally when shorter than the local
 * prefill threshold (512 tokens) or remotely on the prefill instance router_place_prefill_session
 * picks (CED cost after the cached prefix, sim_perf_prefill_s), its KV moved over NVLink inside
 * a rack or RDMA across racks (sim_perf_transfer_s), then continuous batching of DSpark verify
 * steps on the decode instance (sim_perf_decode_step_s, sim_perf_tokens_per_step) within the
 * engine's batch limit and the instance's KV capacity (sim_perf_kv_tokens; idle sessions are
 * evicted least recently used first when a turn needs room). Instances report Load heartbeats to
 * the registry; the router's own counters (n_active, n_assigned_tokens) are kept as the
 * dispatcher keeps them. Every cost comes from sim/perf.h. Deterministic for a seed.
 * Not thread-safe: one run, one thread.
 */
#ifndef TANDEM_SIM_SIM_H
#define TANDEM_SIM_SIM_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "sim/perf.h"
#include "sim/workload.h"

/* Most racks one run models. */
#define SIM_MAX_RACKS 64
/* Tokens per KV page the simulated workers declare to the registry (page accounting only). */
#define SIM_PAGE_TOKENS 256

/* What to simulate (plain data; sim_config_default fills it). */
typedef struct {
    sim_perf_params_t perf;        /* cost model parameters; perf.gpu is the GPU kind (required) */
    uint32_t racks;                /* 1..SIM_MAX_RACKS NVLink domains */
    uint32_t gpus_per_rack;        /* 0: perf.gpu->domain_gpus (72 for NVL72, 8 for HGX) */
    uint32_t agents;               /* concurrent agents, >= 1 */
    double duration_s;             /* simulated seconds during which agents start turns (> 0) */
    double warmup_s;               /* start of the measured window (< duration_s) */
    double ramp_s;                 /* agents start spread over [0, ramp_s] */
    uint64_t seed;                 /* agent start times and session order */
    uint32_t prefill_per_rack;     /* prefill instances per rack; 0: chosen from the workload */
    uint32_t local_prefill_tokens; /* deltas below this prefill on the decode instance (512) */
    double heartbeat_s;            /* period of the simulated workers' Load heartbeats (0.25) */
    int drain;                     /* 1: after duration_s start nothing new and run until every
                                      turn in flight has finished (token conservation checks) */
    const char *calibration;       /* NULL, or a sim_perf_calibrate file for every instance */
    /* progress: called about every 2 % of simulated time (may be NULL) */
    void (*progress)(void *ctx, double t_s, double duration_s, uint64_t events);
    void *progress_ctx;
} sim_config_t;

/* sim_config_default - 1 rack, 100 agents, 600 s with a 60 s warm-up and 30 s ramp, seed 1,
 * P:D automatic, 512-token local prefill, 0.25 s heartbeats, perf defaults (gpu NULL: the caller
 * sets it). Cannot fail. */
void sim_config_default(sim_config_t *config);

/* What a run measured (plain data). Rates are over the window [warmup_s, duration_s]. */
typedef struct {
    char gpu[16];
    uint32_t racks;
    uint32_t agents;
    uint32_t gpus_total;         /* racks x gpus_per_rack */
    uint32_t prefill_group_gpus; /* GPUs of one prefill instance */
    uint32_t decode_group_gpus;  /* GPUs of one decode instance */
    uint32_t prefill_per_rack;   /* the P:D ratio chosen: P instances ... */
    uint32_t decode_per_rack;    /* ... to D instances per rack */
    uint32_t idle_gpus_per_rack; /* GPUs left over by the instance sizes (idle power counted) */
    uint64_t decode_kv_tokens;   /* KV tokens of one decode instance */
    double window_s;             /* measured seconds */
    double end_s;                /* simulated time at the end (past duration_s when draining) */
    /* every turn of the run */
    uint64_t turns_started;
    uint64_t turns_done;
    uint64_t output_tokens_started; /* reply tokens of every turn started */
    uint64_t output_tokens_done;    /* reply tokens decoded (== started once drained) */
    uint64_t prefill_tokens;        /* prompt tokens prefilled (local + remote) */
    uint64_t cached_tokens;         /* prompt tokens served from a decode instance's KV */
    uint64_t local_prefills;        /* turns prefilled on their decode instance */
    uint64_t remote_prefills;       /* turns prefilled on a prefill instance ... */
    uint64_t rack_local_prefills;   /* ... in the decode instance's rack (NVLink) */
    uint64_t evictions;             /* idle sessions evicted from a decode instance's KV */
    uint64_t sessions_started;      /* trace sessions begun (their first turn placed) */
    uint64_t decode_placements;     /* router_place_decode calls that found an instance */
    uint64_t placement_misses;      /* router_place_* calls that found none (turn retried) */
    uint64_t events;
    /* the window */
    double output_tok_s;    /* aggregate output tokens/s (turns finished in the window) */
    double power_w;         /* mean GPU power of all racks, W */
    double tok_s_per_mw;    /* output_tok_s / (power_w / 1e6) */
    double agent_tok_s;     /* mean per-agent output speed: reply tokens / decode time */
    double agent_e2e_tok_s; /* reply tokens / (finish - submit), mean over turns */
    double ttft_p50_s;      /* submit -> first token */
    double ttft_p99_s;
    double decode_batch_mean; /* sequences per decode step */
    double decode_busy;       /* fraction of decode instance time stepping */
    double prefill_busy;      /* fraction of prefill instance time prefilling */
    double wall_s;            /* host seconds the run took */
} sim_result_t;

/*
 * sim_run - simulate `config` over `workload` (borrowed; >= 1 session). Returns TDM_OK with
 * *result_out, TDM_ERR_INVALID_ARG (bad config: reason in err), TDM_ERR_UNSUPPORTED (the model
 * does not fit the GPU kind's group, or more workers than the router's registry tracks; err
 * says which), an error of sim_perf_calibrate, or TDM_ERR_NO_MEMORY. err: err_bytes, may be 0.
 */
tdm_status_t sim_run(const sim_config_t *config, const sim_workload_t *workload,
                     sim_result_t *result_out, char *err, size_t err_bytes);

/*
 * sim_batch1_tok_s - output tokens/s of one agent alone on a decode instance of `params`
 * (a context of context_tokens): tokens per step / one-sequence step time. Returns 0 when the
 * model cannot be created for params (reason in err).
 */
double sim_batch1_tok_s(const sim_perf_params_t *params, uint64_t context_tokens, char *err,
                        size_t err_bytes);

#endif
