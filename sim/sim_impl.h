/* sim_impl.h - what sim/sim.c (setup, event loop, heartbeats, results) and sim/sim_turn.c (a
 * turn's path through placement, prefill, transfer and decode batching) share. Private to the
 * simulator; the public contract is sim/sim.h. One thread.
 */
#ifndef TANDEM_SIM_SIM_IMPL_H
#define TANDEM_SIM_SIM_IMPL_H

#include <stdint.h>

#include "router/registry.h"
#include "router/session.h"
#include "sim/evq.h"
#include "sim/sim.h"

/* Event kinds. */
enum {
    EV_TURN = 0,      /* id = agent: submit its next turn (or retry a placement) */
    EV_PREFILL = 1,   /* id = prefill instance: its running job is done */
    EV_XFER = 2,      /* id = agent: its prefilled KV reached the decode instance */
    EV_STEP = 3,      /* id = decode instance: a decode step (or a local prefill) is done */
    EV_HEARTBEAT = 4, /* every instance whose load changed sends a Load heartbeat */
};

/* Where an agent's current turn is. */
enum {
    AG_PAUSED = 0,     /* between turns (tool pause), or before its first turn */
    AG_PREFILLING = 1, /* queued on or running on a prefill instance */
    AG_XFER = 2,       /* KV moving to the decode instance */
    AG_LOCAL = 3,      /* queued for a local prefill on its decode instance */
    AG_JOINING = 4,    /* waiting for a batch slot (or KV room) on its decode instance */
    AG_RUNNING = 5,    /* in the decode batch */
    AG_DONE = 6,       /* no more turns (end of run) */
};

typedef struct {
    uint32_t session;     /* workload session */
    uint32_t turn;        /* turn within the session (current, or next when paused) */
    uint32_t round;       /* sessions this agent started (names its router session) */
    uint8_t state;        /* AG_* */
    int32_t decode;       /* decode instance holding this session, -1 none */
    int32_t prefill;      /* prefill instance of the current turn, -1 none */
    uint32_t kv_tokens;   /* this session's tokens resident on `decode` (0 evicted / none) */
    uint32_t delta;       /* prompt tokens the current turn prefills */
    uint32_t cached;      /* prompt tokens it reuses */
    uint32_t growth;      /* KV tokens the turn adds when it joins (reserved at join) */
    double ctx;           /* tokens the running sequence attends to (prompt + generated) */
    uint64_t finish_step; /* decode step number after which its reply is complete */
    uint64_t join_step;   /* the instance's step number when it joined */
    double t_submit;
    double t_join;
    double t_first;
    int32_t q_next;   /* FIFO link (prefill queue, local prefill queue, join queue) */
    int32_t lru_prev; /* idle-resident list of its decode instance */
    int32_t lru_next;
    uint8_t in_lru;
    uint8_t need_first; /* first token not yet stamped */
    uint8_t rewind;     /* its decode instance must rewind to `cached` (the reply is not in the
                           prompt) and replay the window: sim_perf_continue_s when local */
} agent_t;

typedef struct {
    int32_t head;
    int32_t tail;
    uint32_t n;
} fifo_t;

typedef struct {
    uint64_t step;
    int32_t agent;
} fin_t;

typedef struct {
    sim_role_t role;
    uint32_t rack;
    int slot; /* registry slot */
    uint64_t gen;
    char id[32];
    const sim_perf_t *perf; /* shared by every instance of the role (borrowed) */
    int busy;               /* a job or step event is pending */
    int dirty;              /* load changed since its last heartbeat */
    /* prefill: queued jobs; decode: local prefill jobs (lp) and joiners */
    fifo_t queue;
    uint64_t queued_tokens;
    fifo_t lp;
    int32_t current; /* agent of the running prefill / local prefill, -1 */
    /* decode */
    uint32_t n_running;
    double ctx_sum;
    uint64_t step_no;
    fin_t *fin; /* min-heap of running sequences by finish step [max_batch_seqs] */
    uint32_t n_fin;
    int32_t *fresh; /* agents joined for the next step (first token stamped at its end) */
    uint32_t n_fresh;
    uint64_t kv_cap;
    uint64_t kv_used;
    int32_t lru_head; /* oldest idle resident session */
    int32_t lru_tail;
    double busy_since; /* start of the pending job / step */
    double busy_s;     /* busy seconds inside the window */
    double tok_rate;   /* prefill: recent tokens/s (Load.recent_tokens_per_s) */
} inst_t;

/* A log-spaced histogram (TTFT percentiles). */
#define SIM_HIST_BUCKETS 512
typedef struct {
    uint64_t counts[SIM_HIST_BUCKETS];
    uint64_t n;
} hist_t;

typedef struct sim {
    sim_config_t cfg;
    const sim_workload_t *wl;
    sim_evq_t *evq;
    router_registry_t *registry;
    router_sessions_t *sessions;
    sim_perf_t *perf_prefill;
    sim_perf_t *perf_decode;
    inst_t *inst;
    uint32_t n_inst;
    uint32_t n_prefill_inst;
    int *inst_of_slot; /* registry slot -> instance, -1 */
    int n_slots;
    agent_t *agents;
    double now;
    double tps; /* tokens per decode step */
    uint64_t turn_seq;
    uint32_t max_batch;
    sim_result_t *res;
    hist_t ttft;
    /* window accumulators */
    double sum_agent_tok_s;
    double sum_e2e_tok_s;
    uint64_t n_window_turns;
    uint64_t window_tokens;
    uint64_t window_steps;
    uint64_t window_step_seqs;
} sim_t;

/* ---- sim_turn.c ---- */

/* turn_submit - agent a's next turn arrives now: place it and start its prefill. */
tdm_status_t turn_submit(sim_t *s, int32_t a);

/* turn_prefill_done - prefill instance i finished its running job. */
tdm_status_t turn_prefill_done(sim_t *s, uint32_t i);

/* turn_xfer_done - agent a's KV reached its decode instance: it queues to join the batch. */
tdm_status_t turn_xfer_done(sim_t *s, int32_t a);

/* turn_step_done - decode instance i finished a step or a local prefill. */
tdm_status_t turn_step_done(sim_t *s, uint32_t i);

/* ---- sim.c ---- */

/* sim_router_session - the router session of agent a's current session (added when absent). */
router_session_t *sim_router_session(sim_t *s, int32_t a, int *created_out);

/* sim_hist_add - record a sample (seconds). */
void sim_hist_add(hist_t *h, double v_s);

/* sim_window - the part of [t0, t1] inside the measured window, seconds. */
double sim_window(const sim_t *s, double t0, double t1);

#endif
