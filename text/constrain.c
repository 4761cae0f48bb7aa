/* constrain.c - the byte automaton of text/constrain.h: a pushdown automaton over JSON text
 * whose frames follow the compiled schema nodes, run as up to TEXT_CONSTRAINT_MAX_THREADS
 * parallel threads (anyOf). */
#include "text/constrain_impl.h"

#include <string.h>

/* Threads created by anyOf forks while one byte is fed, waiting for that byte. */
typedef struct {
    text_constraint_thread_t t[TEXT_CONSTRAINT_MAX_THREADS];
    uint32_t n;
} pending_t;

static int is_ws(uint8_t b)
{
    return b == ' ' || b == '\n' || b == '\r' || b == '\t';
}

static int is_digit(uint8_t b)
{
    return b >= '0' && b <= '9';
}

static int is_hex(uint8_t b)
{
    return is_digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F');
}

static uint32_t hex_value(uint8_t b)
{
    if (is_digit(b)) {
        return (uint32_t)(b - '0');
    }
    return (uint32_t)((b | 0x20) - 'a' + 10);
}

/* One whitespace byte in a frame where JSON allows it: counted, bounded. */
static res_t take_ws(text_constraint_frame_t *f)
{
    if (f->ws >= TEXT_CONSTRAINT_MAX_WS) {
        return R_REJECT;
    }
    f->ws++;
    return R_TAKEN;
}

void constraint_frame_init(text_constraint_frame_t *f, uint8_t kind, uint32_t node)
{
    memset(f, 0, sizeof(*f));
    f->kind = kind;
    f->node = (uint16_t)node;
}

int constraint_push(text_constraint_thread_t *t, uint8_t kind, uint32_t node)
{
    if (t->depth >= TEXT_CONSTRAINT_MAX_DEPTH) {
        return 0;
    }
    constraint_frame_init(&t->f[t->depth], kind, node);
    t->depth++;
    return 1;
}

/* ---- literals (enum / const values and the words true, false, null) ------------------------- */

static const cspan_t *lit_list(const text_constraint_t *c, const text_constraint_frame_t *f,
                               uint32_t *n_out)
{
    const cnode_t *nd = &c->nodes[f->node];

    if (f->kind == K_ENUM) {
        *n_out = nd->n_enum;
        return c->lits + nd->enum_off;
    }
    *n_out = nd->n_words;
    return c->lits + nd->words_off;
}

/* Nonzero when some candidate of the frame is complete at pos. */
static int lit_complete(const text_constraint_t *c, const text_constraint_frame_t *f)
{
    uint32_t n;
    const cspan_t *l = lit_list(c, f, &n);

    for (uint32_t i = 0; i < n; i++) {
        if ((f->bits >> i & 1) != 0 && l[i].len == f->pos) {
            return 1;
        }
    }
    return 0;
}

static res_t step_literal(const text_constraint_t *c, text_constraint_frame_t *f, uint8_t b)
{
    uint32_t n;
    const cspan_t *l = lit_list(c, f, &n);
    uint64_t next = 0;

    for (uint32_t i = 0; i < n; i++) {
        if ((f->bits >> i & 1) != 0 && l[i].len > f->pos && c->pool[l[i].off + f->pos] == b) {
            next |= (uint64_t)1 << i;
        }
    }
    if (next != 0) {
        f->bits = next;
        f->pos++;
        return R_TAKEN;
    }
    return lit_complete(c, f) ? R_REFEED : R_REJECT;
}

/* ---- strings ----------------------------------------------------------------------------- */

int constraint_utf8_lead(uint8_t b, uint8_t *lo_out, uint8_t *hi_out)
{
    *lo_out = 0x80;
    *hi_out = 0xBF;
    if (b < 0x80) {
        return 0;
    }
    if (b >= 0xC2 && b <= 0xDF) {
        return 1;
    }
    if (b >= 0xE0 && b <= 0xEF) {
        *lo_out = b == 0xE0 ? 0xA0 : 0x80;
        *hi_out = b == 0xED ? 0x9F : 0xBF;
        return 2;
    }
    if (b >= 0xF0 && b <= 0xF4) {
        *lo_out = b == 0xF0 ? 0x90 : 0x80;
        *hi_out = b == 0xF4 ? 0x8F : 0xBF;
        return 3;
    }
    return -1;
}

static res_t step_string(text_constraint_frame_t *f, uint8_t b, int *popped)
{
    if (f->phase == ST_ESCAPE) {
        if (b == 'u') {
            f->phase = ST_HEX;
            f->pos = 0;
            f->aux = 0;
            return R_TAKEN;
        }
        if (b == '"' || b == '\\' || b == '/' || b == 'b' || b == 'f' || b == 'n' || b == 'r' ||
            b == 't') {
            f->phase = ST_BODY;
            return R_TAKEN;
        }
        return R_REJECT;
    }
    if (f->phase == ST_HEX) {
        uint32_t v;

        if (!is_hex(b)) {
            return R_REJECT;
        }
        v = f->pos << 4 | hex_value(b);
        f->aux++;
        /* refuse U+0000 and the surrogates D800-DFFF as early as their digits show it */
        if ((f->aux == 2 && (v & 0xF8) == 0xD8) || (f->aux == 4 && v == 0)) {
            return R_REJECT;
        }
        f->pos = v;
        if (f->aux == 4) {
            f->phase = ST_BODY;
            f->aux = 0;
        }
        return R_TAKEN;
    }
    if (f->aux > 0) { /* inside a UTF-8 sequence */
        if (b < f->lo || b > f->hi) {
            return R_REJECT;
        }
        f->aux--;
        f->lo = 0x80;
        f->hi = 0xBF;
        return R_TAKEN;
    }
    if (b == '"') {
        *popped = 1;
        return R_TAKEN;
    }
    if (b == '\\') {
        f->phase = ST_ESCAPE;
        return R_TAKEN;
    }
    if (b < 0x20) {
        return R_REJECT;
    }
    {
        int n = constraint_utf8_lead(b, &f->lo, &f->hi);

        if (n < 0) {
            return R_REJECT;
        }
        f->aux = (uint8_t)n;
    }
    return R_TAKEN;
}

/* ---- numbers ----------------------------------------------------------------------------- */

static int number_complete(uint8_t sub)
{
    return sub == N_ZERO || sub == N_INT || sub == N_FRAC || sub == N_EXP_DIGITS;
}

static res_t step_number(const text_constraint_t *c, text_constraint_frame_t *f, uint8_t b)
{
    int integer_only = (c->nodes[f->node].types & CT_NUMBER) == 0;
    uint8_t next = 0xff;

    switch (f->aux) {
    case N_START:
        next = b == '-' ? N_SIGN : b == '0' ? N_ZERO : is_digit(b) ? N_INT : 0xff;
        break;
    case N_SIGN:
        next = b == '0' ? N_ZERO : is_digit(b) ? N_INT : 0xff;
        break;
    case N_ZERO:
    case N_INT:
        if (f->aux == N_INT && is_digit(b)) {
            next = N_INT;
        } else if (b == '.' && !integer_only) {
            next = N_DOT;
        } else if ((b == 'e' || b == 'E') && !integer_only) {
            next = N_E;
        }
        break;
    case N_DOT:
    case N_FRAC:
        next = is_digit(b) ? N_FRAC : 0xff;
        if (f->aux == N_FRAC && (b == 'e' || b == 'E')) {
            next = N_E;
        }
        break;
    case N_E:
        next = (b == '+' || b == '-') ? N_E_SIGN : is_digit(b) ? N_EXP_DIGITS : 0xff;
        break;
    case N_E_SIGN:
    case N_EXP_DIGITS:
        next = is_digit(b) ? N_EXP_DIGITS : 0xff;
        break;
    default:
        break;
    }
    if (next != 0xff) {
        f->aux = next;
        return R_TAKEN;
    }
    return number_complete(f->aux) ? R_REFEED : R_REJECT;
}

/* ---- containers -------------------------------------------------------------------------- */

/* Mask of the object's declared properties. */
static uint64_t all_props(const cnode_t *nd)
{
    return nd->n_props >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << nd->n_props) - 1);
}

static int object_may_close(const cnode_t *nd, const text_constraint_frame_t *f)
{
    return (nd->required & ~f->bits) == 0;
}

/* A key may follow: declared objects with an unseen property, or generic open objects. */
static int object_may_add_key(const cnode_t *nd, const text_constraint_frame_t *f)
{
    if (nd->n_props == 0) {
        return !nd->generic_closed;
    }
    return (all_props(nd) & ~f->bits) != 0;
}

static res_t step_object(const text_constraint_t *c, text_constraint_thread_t *t, uint8_t b)
{
    text_constraint_frame_t *f = &t->f[t->depth - 1];
    const cnode_t *nd = &c->nodes[f->node];
    uint32_t node = f->node;

    if (is_ws(b)) {
        return take_ws(f);
    }
    switch (f->phase) {
    case OB_FIRST:
    case OB_COMMA:
        if (b == '}' && f->phase == OB_FIRST && object_may_close(nd, f)) {
            t->depth--;
            return R_TAKEN;
        }
        if (b != '"' || !object_may_add_key(nd, f)) {
            return R_REJECT;
        }
        f->phase = OB_COLON;
        f->ws = 0;
        if (!constraint_push(t, nd->n_props > 0 ? K_KEY : K_STRING, node)) {
            return R_REJECT;
        }
        t->f[t->depth - 1].bits = all_props(nd) & ~f->bits;
        return R_TAKEN;
    case OB_COLON:
        if (b != ':') {
            return R_REJECT;
        }
        f->phase = OB_AFTER_VALUE;
        f->ws = 0;
        if (!constraint_push(t, K_VALUE,
                             nd->n_props > 0 ? c->props[nd->props_off + f->pos].node
                                             : nd->additional)) {
            return R_REJECT;
        }
        return R_TAKEN;
    case OB_AFTER_VALUE:
        if (b == ',' && object_may_add_key(nd, f)) {
            f->phase = OB_COMMA;
            f->ws = 0;
            return R_TAKEN;
        }
        if (b == '}' && object_may_close(nd, f)) {
            t->depth--;
            return R_TAKEN;
        }
        return R_REJECT;
    default:
        return R_REJECT;
    }
}

/* A declared key: candidates = unseen properties; on the closing quote the parent object
 * records the property. */
static res_t step_key(const text_constraint_t *c, text_constraint_thread_t *t, uint8_t b)
{
    text_constraint_frame_t *f = &t->f[t->depth - 1];
    text_constraint_frame_t *obj = &t->f[t->depth - 2];
    const cnode_t *nd = &c->nodes[f->node];
    const cprop_t *props = c->props + nd->props_off;
    uint64_t next = 0;
    uint32_t done = UINT32_MAX;

    for (uint32_t i = 0; i < nd->n_props; i++) {
        if ((f->bits >> i & 1) != 0 && props[i].key.len > f->pos &&
            c->pool[props[i].key.off + f->pos] == b) {
            next |= (uint64_t)1 << i;
            if (props[i].key.len == f->pos + 1) {
                done = i;
            }
        }
    }
    if (next == 0) {
        return R_REJECT;
    }
    if (done != UINT32_MAX) { /* the key's closing quote: no other key continues past it */
        obj->pos = done;
        obj->bits |= (uint64_t)1 << done;
        t->depth--;
        return R_TAKEN;
    }
    f->bits = next;
    f->pos++;
    return R_TAKEN;
}

static res_t step_array(const text_constraint_t *c, text_constraint_thread_t *t, uint8_t b)
{
    text_constraint_frame_t *f = &t->f[t->depth - 1];
    uint32_t items = c->nodes[f->node].items;

    if (is_ws(b)) {
        return take_ws(f);
    }
    if (f->phase == AR_AFTER_VALUE) {
        if (b == ',') {
            f->phase = AR_COMMA;
            f->ws = 0;
            return R_TAKEN;
        }
        if (b == ']') {
            t->depth--;
            return R_TAKEN;
        }
        return R_REJECT;
    }
    if (b == ']' && f->phase == AR_FIRST) {
        t->depth--;
        return R_TAKEN;
    }
    f->phase = AR_AFTER_VALUE;
    f->ws = 0;
    return constraint_push(t, K_VALUE, items) ? R_REDO : R_REJECT;
}

/* The first byte of a value: fork anyOf, or become the value's kind. */
static res_t step_value(const text_constraint_t *c, text_constraint_thread_t *t, uint8_t b,
                        pending_t *pending)
{
    text_constraint_frame_t *f = &t->f[t->depth - 1];
    const cnode_t *nd = &c->nodes[f->node];

    if (is_ws(b)) { /* none before the top-level value, nor before a tool parameter's */
        return t->depth == 1 || t->f[t->depth - 2].kind == K_DSML ? R_REJECT : take_ws(f);
    }
    if (nd->n_alts > 0) {
        for (uint32_t i = 1; i < nd->n_alts && pending->n < TEXT_CONSTRAINT_MAX_THREADS; i++) {
            text_constraint_thread_t *copy = &pending->t[pending->n++];

            copy->depth = t->depth;
            memcpy(copy->f, t->f, t->depth * sizeof(t->f[0]));
            copy->f[t->depth - 1].node = (uint16_t)c->alts[nd->alts_off + i];
        }
        f->node = (uint16_t)c->alts[nd->alts_off];
        return R_REDO;
    }
    if (nd->n_enum > 0) {
        constraint_frame_init(f, K_ENUM, f->node);
        f->bits = nd->n_enum >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << nd->n_enum) - 1);
        return R_REDO;
    }
    if (b == '{' && (nd->types & CT_OBJECT) != 0) {
        constraint_frame_init(f, K_OBJECT, f->node);
        f->phase = OB_FIRST;
        return R_TAKEN;
    }
    if (b == '[' && (nd->types & CT_ARRAY) != 0) {
        constraint_frame_init(f, K_ARRAY, f->node);
        f->phase = AR_FIRST;
        return R_TAKEN;
    }
    if (b == '"' && (nd->types & CT_STRING) != 0) {
        constraint_frame_init(f, K_STRING, f->node);
        return R_TAKEN;
    }
    if ((b == '-' || is_digit(b)) && (nd->types & (CT_NUMBER | CT_INTEGER)) != 0) {
        constraint_frame_init(f, K_NUMBER, f->node);
        return R_REDO;
    }
    if ((b == 't' || b == 'f' || b == 'n') && nd->n_words > 0) {
        constraint_frame_init(f, K_WORD, f->node);
        f->bits = ((uint64_t)1 << nd->n_words) - 1;
        return R_REDO;
    }
    return R_REJECT;
}

/* Feed b to one thread. */
static int step_thread(const text_constraint_t *c, text_constraint_thread_t *t, uint8_t b,
                       pending_t *pending)
{
    for (;;) {
        text_constraint_frame_t *f;
        res_t r;
        int popped = 0;

        if (t->depth == 0) {
            return 0; /* the value is complete: nothing may follow */
        }
        f = &t->f[t->depth - 1];
        switch (f->kind) {
        case K_VALUE:
            r = step_value(c, t, b, pending);
            break;
        case K_OBJECT:
            r = step_object(c, t, b);
            break;
        case K_KEY:
            r = step_key(c, t, b);
            break;
        case K_ARRAY:
            r = step_array(c, t, b);
            break;
        case K_STRING:
            r = step_string(f, b, &popped);
            if (popped) {
                t->depth--;
            }
            break;
        case K_NUMBER:
            r = step_number(c, f, b);
            if (r == R_REFEED) {
                t->depth--;
            }
            break;
        case K_DSML:
        case K_CHOICE:
        case K_RAW:
            r = constraint_dsml_step(c, t, b);
            break;
        default: /* K_ENUM, K_WORD */
            r = step_literal(c, f, b);
            if (r == R_REFEED) {
                t->depth--;
            }
            break;
        }
        if (r == R_REJECT) {
            return 0;
        }
        if (r == R_TAKEN) {
            return 1;
        }
        /* R_REFEED, R_REDO: the byte goes to the (new) top frame */
    }
}

/* ---- public ------------------------------------------------------------------------------ */

static void thread_copy(text_constraint_thread_t *dst, const text_constraint_thread_t *src)
{
    dst->depth = src->depth;
    memcpy(dst->f, src->f, src->depth * sizeof(src->f[0]));
}

static int thread_equal(const text_constraint_thread_t *a, const text_constraint_thread_t *b)
{
    return a->depth == b->depth && memcmp(a->f, b->f, a->depth * sizeof(a->f[0])) == 0;
}

void text_constraint_start(const text_constraint_t *c, text_constraint_state_t *state_out)
{
    state_out->n_threads = 1;
    state_out->t[0].depth = 0;
    if (c->dsml.on) {
        (void)constraint_dsml_start(c, &state_out->t[0]);
        return;
    }
    constraint_push(&state_out->t[0], K_VALUE, c->root);
}

void text_constraint_state_copy(text_constraint_state_t *dst, const text_constraint_state_t *src)
{
    dst->n_threads = src->n_threads;
    for (uint32_t i = 0; i < src->n_threads; i++) {
        thread_copy(&dst->t[i], &src->t[i]);
    }
}

int text_constraint_step(const text_constraint_t *c, text_constraint_state_t *state, uint8_t byte)
{
    pending_t pending;
    uint32_t n_out = 0;

    pending.n = 0;
    /* threads are stepped in place in order; survivors are compacted to the front; threads
     * forked by anyOf wait in `pending` and take the same byte after */
    for (uint32_t i = 0; i < state->n_threads; i++) {
        text_constraint_thread_t *t = &state->t[i];

        if (step_thread(c, t, byte, &pending)) {
            if (n_out != i) {
                thread_copy(&state->t[n_out], t);
            }
            n_out++;
        }
    }
    for (uint32_t i = 0; i < pending.n; i++) {
        text_constraint_thread_t *t = &pending.t[i];
        int dup = 0;

        if (!step_thread(c, t, byte, &pending)) {
            continue;
        }
        for (uint32_t j = 0; j < n_out && !dup; j++) {
            dup = thread_equal(&state->t[j], t);
        }
        if (!dup && n_out < TEXT_CONSTRAINT_MAX_THREADS) {
            thread_copy(&state->t[n_out++], t);
        }
    }
    state->n_threads = n_out;
    return n_out > 0;
}

int text_constraint_step_bytes(const text_constraint_t *c, text_constraint_state_t *state,
                               const uint8_t *bytes, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!text_constraint_step(c, state, bytes[i])) {
            return 0;
        }
    }
    return 1;
}

int text_constraint_accepting(const text_constraint_t *c, const text_constraint_state_t *state)
{
    for (uint32_t i = 0; i < state->n_threads; i++) {
        const text_constraint_thread_t *t = &state->t[i];
        const text_constraint_frame_t *f;

        if (t->depth == 0) {
            return 1;
        }
        if (t->depth > 1) {
            continue;
        }
        f = &t->f[0];
        if (f->kind == K_NUMBER && number_complete(f->aux)) {
            return 1;
        }
        if ((f->kind == K_ENUM || f->kind == K_WORD) && lit_complete(c, f)) {
            return 1;
        }
    }
    return 0;
}

text_constraint_free_t text_constraint_free_kind(const text_constraint_state_t *state)
{
    const text_constraint_frame_t *f;

    if (state->n_threads != 1 || state->t[0].depth == 0) {
        return TEXT_CONSTRAINT_FREE_NONE;
    }
    f = &state->t[0].f[state->t[0].depth - 1];
    if (f->kind == K_STRING && f->phase == ST_BODY && f->aux == 0) {
        return TEXT_CONSTRAINT_FREE_STRING;
    }
    if (f->kind == K_RAW && constraint_raw_is_free(f)) {
        return TEXT_CONSTRAINT_FREE_RAW;
    }
    return TEXT_CONSTRAINT_FREE_NONE;
}

/* 1 when bytes[0..n) are complete valid UTF-8 characters with none of `refused` (n >= 1). */
static int plain_bytes(const uint8_t *bytes, size_t n, int json_string)
{
    size_t i = 0;

    if (n == 0) {
        return 0;
    }
    while (i < n) {
        uint8_t lo;
        uint8_t hi;
        uint8_t b = bytes[i];
        int k = constraint_utf8_lead(b, &lo, &hi);

        if (k < 0 || i + (size_t)k >= n) {
            return 0;
        }
        if (json_string ? (b < 0x20 || b == '"' || b == '\\') : (b == 0 || b == '<')) {
            return 0;
        }
        for (int j = 1; j <= k; j++) {
            if (bytes[i + (size_t)j] < lo || bytes[i + (size_t)j] > hi) {
                return 0;
            }
            lo = 0x80;
            hi = 0xBF;
        }
        i += (size_t)k + 1;
    }
    return 1;
}

int text_constraint_is_plain_string_bytes(const uint8_t *bytes, size_t n)
{
    return plain_bytes(bytes, n, 1);
}

text_constraint_class_t text_constraint_string_class(const uint8_t *bytes, size_t n)
{
    text_constraint_frame_t f;

    if (n == 0) {
        return TEXT_CONSTRAINT_REFUSED;
    }
    constraint_frame_init(&f, K_STRING, 0);
    for (size_t i = 0; i < n; i++) {
        int popped = 0;

        if (step_string(&f, bytes[i], &popped) == R_REJECT) {
            return TEXT_CONSTRAINT_REFUSED;
        }
        if (popped) {
            return TEXT_CONSTRAINT_DEPENDS;
        }
    }
    return TEXT_CONSTRAINT_ACCEPTED;
}

int text_constraint_is_plain_raw_bytes(const uint8_t *bytes, size_t n)
{
    return plain_bytes(bytes, n, 0);
}
