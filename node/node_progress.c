/* node_progress.c - a worker's liveness from progress (node_progress.h). */
#include "node/node_progress.h"

#include "common/clock.h"

void node_progress_init(node_progress_t *p, uint32_t stall_ms)
{
    atomic_init(&p->steps_completed, 0);
    atomic_init(&p->last_step_ns, tdm_clock_now_ns());
    atomic_init(&p->pending_work, 0);
    atomic_init(&p->inbox, 0);
    atomic_init(&p->draining, 0);
    p->stall_ms = stall_ms;
}

void node_progress_step(node_progress_t *p, uint32_t pending_work)
{
    atomic_store(&p->pending_work, pending_work);
    atomic_store(&p->last_step_ns, tdm_clock_now_ns());
    atomic_fetch_add(&p->steps_completed, 1);
}

void node_progress_tick(node_progress_t *p)
{
    if (p != NULL) {
        atomic_store(&p->last_step_ns, tdm_clock_now_ns());
        atomic_fetch_add(&p->steps_completed, 1);
    }
}

void node_progress_inbox(node_progress_t *p, int delta)
{
    if (p != NULL) {
        atomic_fetch_add(&p->inbox, delta);
    }
}

void node_progress_set_draining(node_progress_t *p)
{
    atomic_store(&p->draining, 1);
}

void node_progress_read(const node_progress_t *p, uint64_t now_ns, node_progress_view_t *view_out)
{
    node_progress_view_t v;
    uint64_t last = atomic_load(&p->last_step_ns);
    int_fast32_t inbox = atomic_load(&p->inbox);

    v.steps_completed = atomic_load(&p->steps_completed);
    v.pending_work = (uint32_t)atomic_load(&p->pending_work) + (uint32_t)(inbox > 0 ? inbox : 0);
    v.since_step_ms = now_ns > last ? (now_ns - last) / TDM_NS_PER_MS : 0;
    v.stalled = p->stall_ms > 0 && v.pending_work > 0 && v.since_step_ms >= p->stall_ms;
    v.draining = atomic_load(&p->draining);
    *view_out = v;
}
