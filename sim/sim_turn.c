/* sim_turn.c - one turn's path: the dispatcher's placement and prefill choice over the router's
 * registry and session table, prefill queues, KV transfer and continuous decode batching.
 * See sim/sim.h and sim_impl.h. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "router/placement.h"
#include "sim/sim_impl.h"

/* Seconds before a turn that found no worker asks again. */
#define SIM_RETRY_S 0.5

static void fifo_push(sim_t *s, fifo_t *q, int32_t a)
{
    s->agents[a].q_next = -1;
    if (q->tail >= 0) {
        s->agents[q->tail].q_next = a;
    } else {
        q->head = a;
    }
    q->tail = a;
    q->n++;
}

static int32_t fifo_pop(sim_t *s, fifo_t *q)
{
    int32_t a = q->head;

    if (a >= 0) {
        q->head = s->agents[a].q_next;
        if (q->head < 0) {
            q->tail = -1;
        }
        q->n--;
    }
    return a;
}

static void lru_remove(sim_t *s, inst_t *in, int32_t a)
{
    agent_t *ag = &s->agents[a];

    if (!ag->in_lru) {
        return;
    }
    if (ag->lru_prev >= 0) {
        s->agents[ag->lru_prev].lru_next = ag->lru_next;
    } else {
        in->lru_head = ag->lru_next;
    }
    if (ag->lru_next >= 0) {
        s->agents[ag->lru_next].lru_prev = ag->lru_prev;
    } else {
        in->lru_tail = ag->lru_prev;
    }
    ag->lru_prev = ag->lru_next = -1;
    ag->in_lru = 0;
}

static void lru_append(sim_t *s, inst_t *in, int32_t a)
{
    agent_t *ag = &s->agents[a];

    ag->lru_next = -1;
    ag->lru_prev = in->lru_tail;
    if (in->lru_tail >= 0) {
        s->agents[in->lru_tail].lru_next = a;
    } else {
        in->lru_head = a;
    }
    in->lru_tail = a;
    ag->in_lru = 1;
}

/*
 * The dispatcher's bookkeeping of a worker (router/dispatch.c set_decode / set_prefill): one more
 * (or one fewer) turn in flight and n_tokens more (fewer) prefill tokens handed to it. The
 * registry of this tree has a fixed worker cap (ROUTER_MAX_WORKERS) and the dispatcher edits the
 * two fields itself; the registry without the cap (issue 18 item 1) keeps placement indexes and
 * must hear of every change through router_registry_note_assigned / _released.
 */
static void note_assigned(sim_t *s, int slot, uint64_t gen, uint64_t n_tokens)
{
#ifdef ROUTER_MAX_WORKERS
    router_worker_t *w = router_registry_worker(s->registry, slot, gen);

    if (w != NULL) {
        w->n_active++;
        w->n_assigned_tokens += n_tokens;
    }
#else
    router_registry_note_assigned(s->registry, slot, gen, n_tokens);
#endif
}

static void note_released(sim_t *s, int slot, uint64_t gen, uint64_t n_tokens)
{
#ifdef ROUTER_MAX_WORKERS
    router_worker_t *w = router_registry_worker(s->registry, slot, gen);

    if (w != NULL) {
        w->n_active -= w->n_active > 0 ? 1 : 0;
        w->n_assigned_tokens -= w->n_assigned_tokens >= n_tokens ? n_tokens : w->n_assigned_tokens;
    }
#else
    router_registry_note_released(s->registry, slot, gen, n_tokens);
#endif
}

/* Release agent a's KV on its decode instance (session over, or evicted). */
static void kv_release(sim_t *s, int32_t a)
{
    agent_t *ag = &s->agents[a];
    inst_t *in;

    if (ag->decode < 0) {
        return;
    }
    in = &s->inst[ag->decode];
    lru_remove(s, in, a);
    in->kv_used -= ag->kv_tokens <= in->kv_used ? ag->kv_tokens : in->kv_used;
    ag->kv_tokens = 0;
    in->dirty = 1;
}

/* Evict idle sessions (least recently used first) until `need` tokens are free. 1 on success. */
static int kv_make_room(sim_t *s, inst_t *in, uint64_t need)
{
    while (in->kv_used + need > in->kv_cap && in->lru_head >= 0) {
        int32_t victim = in->lru_head;
        router_session_t *rs;

        kv_release(s, victim);
        rs = sim_router_session(s, victim, NULL);
        if (rs != NULL) {
            rs->cached_len = 0;
        }
        s->res->evictions++;
    }
    return in->kv_used + need <= in->kv_cap;
}

static void fin_push(inst_t *in, uint64_t step, int32_t a)
{
    uint32_t i = in->n_fin++;

    while (i > 0) {
        uint32_t p = (i - 1) / 2;
        if (in->fin[p].step < step || (in->fin[p].step == step && in->fin[p].agent < a)) {
            break;
        }
        in->fin[i] = in->fin[p];
        i = p;
    }
    in->fin[i].step = step;
    in->fin[i].agent = a;
}

static fin_t fin_pop(inst_t *in)
{
    fin_t top = in->fin[0];
    fin_t last = in->fin[--in->n_fin];
    uint32_t i = 0;

    for (;;) {
        uint32_t c = 2 * i + 1;
        if (c >= in->n_fin) {
            break;
        }
        if (c + 1 < in->n_fin &&
            (in->fin[c + 1].step < in->fin[c].step ||
             (in->fin[c + 1].step == in->fin[c].step && in->fin[c + 1].agent < in->fin[c].agent))) {
            c++;
        }
        if (in->fin[c].step > last.step ||
            (in->fin[c].step == last.step && in->fin[c].agent > last.agent)) {
            break;
        }
        in->fin[i] = in->fin[c];
        i = c;
    }
    if (in->n_fin > 0) {
        in->fin[i] = last;
    }
    return top;
}

static tdm_status_t schedule_busy(sim_t *s, uint32_t i, double dt, uint32_t kind, uint32_t id)
{
    inst_t *in = &s->inst[i];

    in->busy = 1;
    in->busy_since = s->now;
    in->busy_s += sim_window(s, s->now, s->now + dt);
    return sim_evq_push(s->evq, s->now + dt, kind, id, 0);
}

/* A prefill instance takes its next job when idle. */
static tdm_status_t prefill_kick(sim_t *s, uint32_t i)
{
    inst_t *in = &s->inst[i];
    int32_t a;
    double dt;

    if (in->busy || in->queue.n == 0) {
        return TDM_OK;
    }
    a = fifo_pop(s, &in->queue);
    in->current = a;
    dt = sim_perf_prefill_s(in->perf, s->agents[a].delta, s->agents[a].cached);
    return schedule_busy(s, i, dt, EV_PREFILL, i);
}

/* A decode instance, when idle: a local prefill first, else admit joiners and step. */
static tdm_status_t decode_kick(sim_t *s, uint32_t i)
{
    inst_t *in = &s->inst[i];
    double dt;

    if (in->busy) {
        return TDM_OK;
    }
    if (in->lp.n > 0) {
        int32_t a = fifo_pop(s, &in->lp);

        in->current = a;
        /* on the instance that holds the sequence: a continuing turn whose prompt drops the
         * reply rewinds and replays the window (MODEL.md 6(d)) */
        dt = s->agents[a].rewind
                 ? sim_perf_continue_s(in->perf, s->agents[a].delta, s->agents[a].cached)
                 : sim_perf_prefill_s(in->perf, s->agents[a].delta, s->agents[a].cached);
        s->res->local_prefills++;
        return schedule_busy(s, i, dt, EV_STEP, i);
    }
    in->current = -1;
    while (in->queue.n > 0 && in->n_running < s->max_batch) {
        int32_t a = in->queue.head;
        agent_t *ag = &s->agents[a];
        uint64_t steps;

        if (!kv_make_room(s, in, ag->growth)) {
            break; /* head-of-line: waits for a running sequence to finish */
        }
        fifo_pop(s, &in->queue);
        in->kv_used += ag->growth;
        ag->kv_tokens += ag->growth;
        ag->growth = 0;
        ag->state = AG_RUNNING;
        ag->t_join = s->now;
        ag->need_first = 1;
        steps = (uint64_t)ceil(
            (double)s->wl->turns[s->wl->sessions[ag->session].first_turn + ag->turn].output_tokens /
                s->tps -
            1e-9);
        ag->join_step = in->step_no;
        ag->finish_step = in->step_no + (steps > 0 ? steps : 1);
        fin_push(in, ag->finish_step, a);
        in->fresh[in->n_fresh++] = a;
        in->n_running++;
        in->ctx_sum += ag->ctx;
        in->dirty = 1;
    }
    if (in->n_running == 0) {
        return TDM_OK;
    }
    dt = sim_perf_decode_step_s(in->perf, in->n_running,
                                (uint64_t)(in->ctx_sum > 0.0 ? in->ctx_sum : 0.0));
    if (s->now >= s->cfg.warmup_s && s->now < s->cfg.duration_s) {
        s->window_steps++;
        s->window_step_seqs += in->n_running;
    }
    return schedule_busy(s, i, dt, EV_STEP, i);
}

tdm_status_t turn_submit(sim_t *s, int32_t a)
{
    agent_t *ag = &s->agents[a];
    const sim_session_t *ss = &s->wl->sessions[ag->session];
    const sim_turn_t *t = &s->wl->turns[ss->first_turn + ag->turn];
    router_session_t *rs;
    router_worker_t *dw = NULL;
    inst_t *din;
    uint64_t gen = 0;
    int created = 0, slot;
    uint32_t cached;

    rs = sim_router_session(s, a, &created);
    if (rs == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    (void)created;
    rs->last_used_ns = (uint64_t)(s->now * 1e9);
    if (rs->worker_slot >= 0) {
        dw = router_registry_worker(s->registry, rs->worker_slot, rs->worker_generation);
    }
    if (dw == NULL) {
        /* a new session (or one whose worker is gone): router_place_decode */
        slot = router_place_decode(s->registry, (uint64_t)t->input_tokens + t->output_tokens, &gen,
                                   NULL, NULL);
        if (slot < 0) {
            s->res->placement_misses++;
            return sim_evq_push(s->evq, s->now + SIM_RETRY_S, EV_TURN, (uint32_t)a, 0);
        }
        s->res->decode_placements++;
        if (ag->turn == 0) {
            s->res->sessions_started++;
        }
        if (ag->decode >= 0) {
            kv_release(s, a);
        }
        rs->worker_slot = slot;
        rs->worker_generation = gen;
        rs->cached_len = 0;
        dw = router_registry_worker(s->registry, slot, gen);
        ag->decode = s->inst_of_slot[slot];
        ag->kv_tokens = 0;
    }
    din = &s->inst[ag->decode];
    lru_remove(s, din, a);
    rs->active_request = ++s->turn_seq;
    note_assigned(s, rs->worker_slot, rs->worker_generation, 0); /* set_decode */
    s->res->turns_started++;
    s->res->output_tokens_started += t->output_tokens;
    ag->t_submit = s->now;

    /* what the decode instance still holds of this prompt; the rest of the old KV goes */
    cached = t->shared_tokens < ag->kv_tokens ? t->shared_tokens : ag->kv_tokens;
    if (cached >= t->input_tokens) {
        cached = t->input_tokens - 1; /* the last prompt token is always computed */
    }
    ag->rewind = cached > 0 && ag->kv_tokens > cached;
    if (ag->kv_tokens > cached) {
        din->kv_used -= ag->kv_tokens - cached;
        ag->kv_tokens = cached;
    }
    rs->cached_len = cached;
    ag->cached = cached;
    ag->delta = t->input_tokens - cached;
    ag->growth = ag->delta + t->output_tokens;
    ag->ctx = (double)t->input_tokens;
    s->res->cached_tokens += cached;
    s->res->prefill_tokens += ag->delta;
    din->dirty = 1;

    if (ag->delta >= s->cfg.local_prefill_tokens && s->n_prefill_inst > 0) {
        slot = router_place_prefill_session(s->registry, dw, t->input_tokens, 0, &gen, NULL);
        if (slot >= 0) {
            uint32_t pi = (uint32_t)s->inst_of_slot[slot];
            inst_t *pin = &s->inst[pi];

            note_assigned(s, slot, gen, ag->delta); /* the dispatcher's set_prefill */
            ag->prefill = (int32_t)pi;
            ag->state = AG_PREFILLING;
            s->res->remote_prefills++;
            if (pin->rack == din->rack) {
                s->res->rack_local_prefills++;
            }
            fifo_push(s, &pin->queue, a);
            pin->queued_tokens += ag->delta;
            pin->dirty = 1;
            return prefill_kick(s, pi);
        }
        s->res->placement_misses++; /* no prefill worker: the decode node prefills it */
    }
    ag->prefill = -1;
    ag->state = AG_LOCAL;
    fifo_push(s, &din->lp, a);
    return decode_kick(s, (uint32_t)ag->decode);
}

tdm_status_t turn_prefill_done(sim_t *s, uint32_t i)
{
    inst_t *in = &s->inst[i];
    int32_t a = in->current;
    agent_t *ag = &s->agents[a];
    const inst_t *din = &s->inst[ag->decode];
    double busy = s->now - in->busy_since;
    tdm_status_t status;

    in->busy = 0;
    in->current = -1;
    in->queued_tokens -= ag->delta;
    in->tok_rate = busy > 0.0 ? (double)ag->delta / busy : in->tok_rate;
    in->dirty = 1;
    note_released(s, in->slot, in->gen, ag->delta); /* set_prefill(-1), CompletionNotice */
    ag->state = AG_XFER;
    status = sim_evq_push(s->evq,
                          s->now + sim_perf_transfer_s(in->perf, ag->delta, in->rack == din->rack),
                          EV_XFER, (uint32_t)a, 0);
    if (status != TDM_OK) {
        return status;
    }
    return prefill_kick(s, i);
}

tdm_status_t turn_xfer_done(sim_t *s, int32_t a)
{
    agent_t *ag = &s->agents[a];
    inst_t *din = &s->inst[ag->decode];

    ag->state = AG_JOINING;
    fifo_push(s, &din->queue, a);
    din->dirty = 1;
    return decode_kick(s, (uint32_t)ag->decode);
}

/* Agent a's reply is complete: account it and schedule its next turn. */
static tdm_status_t turn_finish(sim_t *s, inst_t *in, int32_t a)
{
    agent_t *ag = &s->agents[a];
    const sim_session_t *ss = &s->wl->sessions[ag->session];
    const sim_turn_t *t = &s->wl->turns[ss->first_turn + ag->turn];
    router_session_t *rs = sim_router_session(s, a, NULL);
    double next_s;

    in->n_running--;
    in->ctx_sum -= ag->ctx + (double)(in->step_no - ag->join_step) * s->tps;
    if (in->ctx_sum < 0.0 || in->n_running == 0) {
        in->ctx_sum = 0.0;
    }
    in->dirty = 1;
    note_released(s, in->slot, in->gen, 0); /* the turn ended (end_turn) */
    s->res->turns_done++;
    s->res->output_tokens_done += t->output_tokens;
    if (s->now >= s->cfg.warmup_s && s->now <= s->cfg.duration_s) {
        double decode_s = s->now - ag->t_join;

        s->window_tokens += t->output_tokens;
        s->n_window_turns++;
        s->sum_agent_tok_s += decode_s > 0.0 ? t->output_tokens / decode_s : 0.0;
        s->sum_e2e_tok_s += t->output_tokens / (s->now - ag->t_submit);
        sim_hist_add(&s->ttft, ag->t_first - ag->t_submit);
    }
    if (rs != NULL) {
        rs->active_request = 0;
        rs->cached_len = ag->kv_tokens;
        rs->last_used_ns = (uint64_t)(s->now * 1e9);
    }
    ag->state = AG_PAUSED;
    ag->turn++;
    if (ag->turn < ss->n_turns) {
        lru_append(s, in, a); /* KV stays for the next turn (tool pause) */
        next_s = s->now + t[1].pause_ms / 1000.0;
    } else {
        kv_release(s, a); /* the session is over: its KV goes */
        ag->decode = -1;
        if (rs != NULL) {
            /* the agent's next session reuses its router session, emptied and unplaced: the
             * table holds one session per agent (as a full one would after evicting idle
             * ones) and the next turn is placed afresh (router_place_decode) */
            rs->worker_slot = -1;
            rs->worker_generation = 0;
            rs->cached_len = 0;
            if (router_sessions_set_history(s->sessions, rs, NULL, 0) != TDM_OK) {
                return TDM_ERR_NO_MEMORY;
            }
        }
        ag->round++;
        ag->turn = 0;
        ag->session = (uint32_t)((ag->session + 1) % s->wl->n_sessions);
        next_s =
            s->now + s->wl->turns[s->wl->sessions[ag->session].first_turn].pause_ms / 1000.0 + 1.0;
    }
    if (next_s >= s->cfg.duration_s) {
        ag->state = AG_DONE;
        return TDM_OK;
    }
    return sim_evq_push(s->evq, next_s, EV_TURN, (uint32_t)a, 0);
}

tdm_status_t turn_step_done(sim_t *s, uint32_t i)
{
    inst_t *in = &s->inst[i];
    tdm_status_t status = TDM_OK;

    in->busy = 0;
    if (in->current >= 0) { /* a local prefill ended: the sequence joins */
        int32_t a = in->current;

        in->current = -1;
        s->agents[a].state = AG_JOINING;
        fifo_push(s, &in->queue, a);
        return decode_kick(s, i);
    }
    in->step_no++;
    in->ctx_sum += in->n_running * s->tps;
    for (uint32_t k = 0; k < in->n_fresh; k++) {
        s->agents[in->fresh[k]].t_first = s->now;
    }
    in->n_fresh = 0;
    while (in->n_fin > 0 && in->fin[0].step <= in->step_no) {
        fin_t f = fin_pop(in);

        status = turn_finish(s, in, f.agent);
        if (status != TDM_OK) {
            return status;
        }
    }
    return decode_kick(s, i);
}
