/* evq.h - tandem-sim's event queue: a binary min-heap of timed events.
 *
 * Owns the pending events of one simulation. Events pop in order of time, and events of equal
 * time in the order they were pushed (a sequence number breaks ties), so a run is deterministic.
 * An event is plain data: a kind and two integers the event loop interprets (sim/sim.c). Knows
 * nothing of what the events mean. Not thread-safe (one event loop owns it).
 */
#ifndef TANDEM_SIM_EVQ_H
#define TANDEM_SIM_EVQ_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* One event (plain data). */
typedef struct {
    double t_s;    /* simulated time, seconds from the start */
    uint64_t seq;  /* push order (set by sim_evq_push) */
    uint32_t kind; /* the event loop's event kind */
    uint32_t id;   /* e.g. an agent or instance index */
    uint64_t arg;  /* e.g. a generation number, to drop stale events */
} sim_event_t;

/* The queue; opaque. */
typedef struct sim_evq sim_evq_t;

/* sim_evq_create - an empty queue with room for `initial_cap` events (it grows). Returns TDM_OK,
 * or TDM_ERR_NO_MEMORY. */
tdm_status_t sim_evq_create(size_t initial_cap, sim_evq_t **evq_out);

/* sim_evq_destroy - free. Accepts NULL. */
void sim_evq_destroy(sim_evq_t *evq);

/* sim_evq_push - add an event at time t_s (finite, >= 0). Returns TDM_OK, TDM_ERR_INVALID_ARG
 * (t_s negative or not finite; queue unchanged) or TDM_ERR_NO_MEMORY (queue unchanged). */
tdm_status_t sim_evq_push(sim_evq_t *evq, double t_s, uint32_t kind, uint32_t id, uint64_t arg);

/* sim_evq_pop - remove the earliest event (ties: earliest pushed) into *event_out. Returns 1, or
 * 0 when the queue is empty (*event_out untouched). */
int sim_evq_pop(sim_evq_t *evq, sim_event_t *event_out);

/* sim_evq_size - events pending. */
size_t sim_evq_size(const sim_evq_t *evq);

/* sim_evq_pushed - events pushed since creation (for the progress line). */
uint64_t sim_evq_pushed(const sim_evq_t *evq);

#endif
