/* constrain_dsml.c - the tool-call language of text/constrain.h as automaton frames: K_DSML (the
 * block's structure), K_CHOICE (one of a list of byte strings; its index goes to the K_DSML
 * frame) and K_RAW (free UTF-8 text up to a delimiter). A K_DSML frame always has a child on
 * top of it except after a string="false" JSON value, whose end it sees as the next byte. */
#include "text/constrain_impl.h"

#include <string.h>

/* K_DSML phases: the child whose completion the frame waits for. */
enum {
    P_THINK,
    P_PREFIX,
    P_NAME,
    P_HEADER,
    P_KEY,
    P_STR,
    P_VALUE,
    P_JSON,
    P_AFTER_PARAM,
    P_AFTER_INVOKE
};

static uint64_t all_bits(uint32_t n)
{
    return n >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << n) - 1);
}

static int push_choice(text_constraint_thread_t *t, uint32_t list, uint64_t bits)
{
    if (bits == 0 || !constraint_push(t, K_CHOICE, list)) {
        return 0;
    }
    t->f[t->depth - 1].bits = bits;
    return 1;
}

static const cspan_t *first_span(const text_constraint_t *c, uint32_t list)
{
    return &c->lits[c->clists[list].off];
}

/* After </｜DSML｜invoke>: another invoke (parallel calls) or the block's end. */
static int after_invoke(const text_constraint_t *c, text_constraint_thread_t *t,
                        text_constraint_frame_t *f)
{
    uint64_t bits = 2;

    if (c->dsml.parallel) {
        bits |= 1;
    }
    f->phase = P_AFTER_INVOKE;
    return push_choice(t, c->dsml.l_after_invoke, bits);
}

/* Options after a parameter (or the header): another parameter while one is unseen, the
 * invoke's end once every required one is seen. */
static uint64_t param_options(const ctool_t *tool, const text_constraint_frame_t *f)
{
    uint64_t bits = 0;

    if ((all_bits(tool->n_params) & ~f->bits) != 0) {
        bits |= 1;
    }
    if ((tool->required & ~f->bits) == 0) {
        bits |= 2;
    }
    return bits;
}

/* The K_DSML frame (top of t) after its child completed with `r` (a choice's index; 0 for raw
 * text): the next child. 0 when none can follow (the thread dies). */
static int dsml_next(const text_constraint_t *c, text_constraint_thread_t *t, uint32_t r)
{
    const cdsml_t *d = &c->dsml;
    text_constraint_frame_t *f = &t->f[t->depth - 1];
    const ctool_t *tool = &d->tools[f->aux];
    const cparam_t *param;

    switch (f->phase) {
    case P_THINK:
        f->phase = P_PREFIX;
        return push_choice(t, d->l_prefix, 1);
    case P_PREFIX:
    case P_AFTER_INVOKE:
        if (f->phase == P_AFTER_INVOKE && r == 1) {
            t->depth--; /* </｜DSML｜tool_calls>: the block is complete */
            return 1;
        }
        f->phase = P_NAME;
        return push_choice(t, d->l_names, all_bits(d->n_tools));
    case P_NAME:
        f->aux = (uint8_t)r;
        f->bits = 0;
        f->pos++;
        tool = &d->tools[r];
        f->phase = P_HEADER;
        return push_choice(t, d->l_after_header, param_options(tool, f));
    case P_HEADER:
    case P_AFTER_PARAM:
        if (r == 1) {
            return after_invoke(c, t, f);
        }
        f->phase = P_KEY;
        return push_choice(t, tool->keys_list, all_bits(tool->n_params) & ~f->bits);
    case P_KEY:
        f->lo = (uint8_t)r;
        f->bits |= (uint64_t)1 << r;
        param = &d->params[tool->params_off + r];
        f->phase = P_STR;
        return push_choice(t, d->l_str, (param->raw_ok ? 1u : 0u) | (param->json_ok ? 2u : 0u));
    case P_STR:
        param = &d->params[tool->params_off + f->lo];
        if (r == 1) {
            f->phase = P_JSON;
            return constraint_push(t, K_VALUE, param->node);
        }
        f->phase = P_VALUE;
        if (param->raw_list != CLIST_NONE) {
            return push_choice(t, param->raw_list, all_bits(c->clists[param->raw_list].n));
        }
        return constraint_push(t, K_RAW, d->l_param_delim);
    case P_VALUE: /* the value and its closing tag are read */
        f->phase = P_AFTER_PARAM;
        return push_choice(t, d->l_after_param, param_options(tool, f));
    default:
        return 0;
    }
}

static res_t step_choice(const text_constraint_t *c, text_constraint_thread_t *t, uint8_t b)
{
    text_constraint_frame_t *f = &t->f[t->depth - 1];
    const clist_t *list = &c->clists[f->node];
    const cspan_t *l = c->lits + list->off;
    uint64_t next = 0;
    uint32_t done = UINT32_MAX;

    for (uint32_t i = 0; i < list->n; i++) {
        if ((f->bits >> i & 1) != 0 && l[i].len > f->pos && c->pool[l[i].off + f->pos] == b) {
            next |= (uint64_t)1 << i;
            if (l[i].len == f->pos + 1) {
                done = i;
            }
        }
    }
    if (next == 0) {
        return R_REJECT;
    }
    if (done != UINT32_MAX) { /* lists are prefix-free: the choice is made */
        t->depth--;
        return dsml_next(c, t, done) ? R_TAKEN : R_REJECT;
    }
    f->bits = next;
    f->pos++;
    return R_TAKEN;
}

static res_t step_raw(const text_constraint_t *c, text_constraint_thread_t *t, uint8_t b)
{
    text_constraint_frame_t *f = &t->f[t->depth - 1];
    const cspan_t *delim = first_span(c, f->node);
    const uint8_t *dl = c->pool + delim->off;

    if (b == 0) {
        return R_REJECT;
    }
    if (f->aux > 0) {
        if (b < f->lo || b > f->hi) {
            return R_REJECT;
        }
        f->aux--;
        f->lo = 0x80;
        f->hi = 0xBF;
    } else {
        int k = constraint_utf8_lead(b, &f->lo, &f->hi);

        if (k < 0) {
            return R_REJECT;
        }
        f->aux = (uint8_t)k;
    }
    /* the delimiter's first byte '<' occurs nowhere else in it: a mismatch restarts the match
     * at this byte */
    if (b == dl[f->pos]) {
        f->pos++;
        if (f->pos == delim->len) {
            t->depth--;
            return dsml_next(c, t, 0) ? R_TAKEN : R_REJECT;
        }
        return R_TAKEN;
    }
    f->pos = b == dl[0] ? 1u : 0u;
    return R_TAKEN;
}

res_t constraint_dsml_step(const text_constraint_t *c, text_constraint_thread_t *t, uint8_t b)
{
    text_constraint_frame_t *f = &t->f[t->depth - 1];

    switch (f->kind) {
    case K_CHOICE:
        return step_choice(c, t, b);
    case K_RAW:
        return step_raw(c, t, b);
    default: /* K_DSML: only after a string="false" JSON value, at the byte that follows it */
        if (f->phase != P_JSON) {
            return R_REJECT;
        }
        f->phase = P_VALUE;
        return push_choice(t, c->dsml.l_pclose, 1) ? R_REDO : R_REJECT;
    }
}

int constraint_dsml_start(const text_constraint_t *c, text_constraint_thread_t *t)
{
    if (!constraint_push(t, K_DSML, 0)) {
        return 0;
    }
    if (c->dsml.thinking) {
        t->f[0].phase = P_THINK;
        return constraint_push(t, K_RAW, c->dsml.l_think);
    }
    t->f[0].phase = P_PREFIX;
    return push_choice(t, c->dsml.l_prefix, 1);
}

int constraint_raw_is_free(const text_constraint_frame_t *f)
{
    return f->kind == K_RAW && f->aux == 0 && f->pos == 0;
}
