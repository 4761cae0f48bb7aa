/* node_progress.h - a worker's liveness from progress (docs/PROTOCOL.md 2, issue 16 item 4).
 *
 * Owns a few counters the worker's compute thread advances and any other thread reads: steps
 * completed (monotonic: decode steps, prefill loop passes and chunk boundaries), the work that
 * waits on that thread (its requests or jobs, plus control messages the link received and the
 * thread has not taken), the monotonic time of the last completed step, and the draining flag.
 * From them, without the compute thread's help, the link's I/O thread fills the heartbeat's
 * Load.{steps_completed, pending_work, stalled, draining} and the HTTP thread answers /health: a
 * worker with pending work and no completed step for stall_ms is stalled (503), however well its
 * I/O thread keeps heart-beating. Knows nothing of the engine, the network or what a step does.
 * All functions are thread-safe (C11 atomics; no locks); the clock is CLOCK_MONOTONIC.
 */
#ifndef TANDEM_NODE_PROGRESS_H
#define TANDEM_NODE_PROGRESS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* --stall-timeout-ms's default: work pending and no step for this long is a stall. */
#define NODE_PROGRESS_DEFAULT_STALL_MS 30000u

/* The shared counters. Initialise with node_progress_init before another thread reads them. */
typedef struct {
    atomic_uint_fast64_t steps_completed;
    atomic_uint_fast64_t last_step_ns; /* tdm_clock_now_ns() of the last step (or the init) */
    atomic_uint_fast32_t pending_work; /* the compute thread's own, as of its last step */
    atomic_int_fast32_t inbox;         /* messages received for it and not yet taken */
    atomic_int draining;
    uint32_t stall_ms; /* 0: never stalled */
} node_progress_t;

/* What a reader sees at one instant (plain data). */
typedef struct {
    uint64_t steps_completed;
    uint32_t pending_work;  /* the compute thread's pending work plus the untaken messages */
    uint64_t since_step_ms; /* milliseconds since the last completed step */
    int stalled;            /* pending_work > 0 and since_step_ms >= stall_ms (stall_ms > 0) */
    int draining;
} node_progress_view_t;

/* node_progress_init - zero counters, the last step "now", stall limit stall_ms (0: off). */
void node_progress_init(node_progress_t *p, uint32_t stall_ms);

/*
 * node_progress_step - the compute thread completed a step (or an idle pass of its loop, which
 * shows it is not wedged); pending_work: requests or jobs still waiting on it afterwards.
 * Called by the compute thread only.
 */
void node_progress_step(node_progress_t *p, uint32_t pending_work);

/*
 * node_progress_tick - the compute thread is inside a long step and just finished a piece of it
 * (a layer pass of a prefill chunk): counts as a completed step, pending work unchanged. Called
 * by the compute thread only; NULL p: nothing.
 */
void node_progress_tick(node_progress_t *p);

/* node_progress_inbox - delta messages (+1 received by the link, -1 taken by the compute thread)
 * wait on the compute thread. Any thread. NULL p: nothing. */
void node_progress_inbox(node_progress_t *p, int delta);

/* node_progress_set_draining - the worker stopped admitting work (SIGTERM); sticky. */
void node_progress_set_draining(node_progress_t *p);

/* node_progress_read - the counters at now_ns (tdm_clock_now_ns()) into *view_out. */
void node_progress_read(const node_progress_t *p, uint64_t now_ns, node_progress_view_t *view_out);

#endif
