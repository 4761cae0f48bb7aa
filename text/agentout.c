#include "text/agentout.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/hash.h"
#include "text/tokenizer.h"

#define DSML TEXT_TOKENIZER_DSML

static const char THINK_END[] = "</think>";

#define LIT_LEN(lit) (sizeof(lit) - 1)

/* A string and its length. */
typedef struct {
    const char *s;
    size_t n;
} lit_t;

#define LIT(x)                                                                                     \
    {                                                                                              \
        x, LIT_LEN(x)                                                                              \
    }

/*
 * The tag names of one DSML dialect. A block's opener picks the dialect of its invokes and
 * parameters. The block opener is also recognised after one or two newlines (the encoder writes
 * "\n\n" before it; they belong to the markup).
 */
typedef struct {
    lit_t open[3]; /* "\n\n<B>", "\n<B>", "<B>" */
    lit_t close;
    lit_t invoke_open;
    lit_t invoke_close;
    lit_t param_open;
    lit_t param_close;
} dsml_dialect_t;

#define DIALECT(block, invoke, param)                                                              \
    {                                                                                              \
        {LIT("\n\n<" DSML block ">"), LIT("\n<" DSML block ">"), LIT("<" DSML block ">")},         \
            LIT("</" DSML block ">"), LIT("<" DSML invoke), LIT("</" DSML invoke ">"),             \
            LIT("<" DSML param), LIT("</" DSML param ">")                                          \
    }

/* DeepSeek-V4 (encoding_dsv4.py) and DeepSeek-V4.1 (leading space in the tag names). */
static const dsml_dialect_t DIALECTS[2] = {
    DIALECT("tool_calls", "invoke", "parameter"),
    DIALECT(" calls", " invoke", " parameter"),
};
#define N_DIALECTS 2

/* An invoke shorter than this is re-parsed on every push, so a malformed header is released
 * early; a longer one only once its closing tag has arrived (keeps the work linear). */
#define AGENT_EARLY_PARSE_BYTES 1024
/* Most parameters of one call. */
#define AGENT_MAX_PARAMS 256

typedef enum {
    ST_REASONING = 0, /* before "</think>" */
    ST_CONTENT = 1,   /* content; block openers recognised when TOOLS */
    ST_BLOCK = 2,     /* inside <｜DSML｜tool_calls>, between invokes */
    ST_INVOKE = 3,    /* pend starts with an invoke that is not complete yet */
} agent_state_t;

/* One released event; text is store[off, off + n). */
typedef struct {
    text_agent_event_kind_t kind;
    uint32_t index;
    size_t off;
    size_t n;
    char id[TEXT_AGENT_CALL_ID_BYTES];
} agent_rec_t;

struct text_agentout {
    uint32_t flags;
    uint64_t id_seed;
    agent_state_t state;
    tdm_buf_t pend; /* text not decided yet */
    tdm_buf_t raw;  /* markup taken from pend in BLOCK (opener, whitespace), not committed */
    size_t scanned; /* ST_INVOKE: the closing tag is not in pend before this offset */
    const dsml_dialect_t *dialect; /* of the current block */
    uint32_t block_calls;          /* complete calls in the current block */
    uint32_t n_calls;
    int finished;
    int unfinished;
    tdm_status_t error; /* sticky TDM_ERR_NO_MEMORY */
    tdm_buf_t store;    /* the text of this call's events */
    agent_rec_t *recs;
    size_t n_recs;
    size_t cap_recs;
    text_agent_event_t *events;
    size_t cap_events;
};

/* One parameter of a parsed invoke: offsets into the invoke text. */
typedef struct {
    size_t key_off, key_n;
    size_t value_off, value_n;
    int is_string;
} agent_param_t;

/* A parsed invoke. */
typedef struct {
    size_t name_off, name_n;
    agent_param_t params[AGENT_MAX_PARAMS];
    size_t n_params;
    size_t n_bytes; /* through the closing tag */
} agent_call_t;

typedef enum { PARSE_MORE = 0, PARSE_DONE = 1, PARSE_BAD = 2 } parse_t;

tdm_status_t text_agentout_create(uint32_t flags, uint64_t id_seed, text_agentout_t **parser_out)
{
    text_agentout_t *p;

    if (parser_out == NULL || (flags & ~(uint32_t)(TEXT_AGENT_THINKING | TEXT_AGENT_TOOLS)) != 0) {
        return TDM_ERR_INVALID_ARG;
    }
    p = calloc(1, sizeof(*p));
    if (p == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    p->flags = flags;
    p->id_seed = id_seed;
    p->state = (flags & TEXT_AGENT_THINKING) != 0 ? ST_REASONING : ST_CONTENT;
    *parser_out = p;
    return TDM_OK;
}

void text_agentout_destroy(text_agentout_t *parser)
{
    if (parser == NULL) {
        return;
    }
    tdm_buf_fini(&parser->pend);
    tdm_buf_fini(&parser->raw);
    tdm_buf_fini(&parser->store);
    free(parser->recs);
    free(parser->events);
    free(parser);
}

/* ---- small text helpers ---- */

static int is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Whether s[pos, n) starts with lit: 1 yes, 0 s ends while it still matches, -1 no. */
static int match_at(const char *s, size_t n, size_t pos, const char *lit, size_t n_lit)
{
    size_t k = 0;

    while (k < n_lit && pos + k < n) {
        if (s[pos + k] != lit[k]) {
            return -1;
        }
        k++;
    }
    return k == n_lit ? 1 : 0;
}

/* First offset >= from of lit in s[0, n), or SIZE_MAX. */
static size_t find_lit(const char *s, size_t n, size_t from, const char *lit, size_t n_lit)
{
    for (size_t at = from; at + n_lit <= n; at++) {
        if (s[at] == lit[0] && memcmp(s + at, lit, n_lit) == 0) {
            return at;
        }
    }
    return SIZE_MAX;
}

/* Length of the longest suffix of s[0, n) that is a proper prefix of lit. */
static size_t prefix_suffix(const char *s, size_t n, const char *lit, size_t n_lit)
{
    size_t k = n_lit - 1 < n ? n_lit - 1 : n;

    for (; k > 0; k--) {
        if (memcmp(s + n - k, lit, k) == 0) {
            return k;
        }
    }
    return 0;
}

/* Bytes at the end of s[0, n) that start a UTF-8 character not complete yet (0..3). */
static size_t utf8_tail(const char *s, size_t n)
{
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char c = (unsigned char)s[n - back];
        size_t need;

        if ((c & 0xC0) == 0x80) {
            continue; /* continuation byte: look further back */
        }
        need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
        return need > back ? back : 0;
    }
    return 0;
}

/* ---- events ---- */

static void set_oom(text_agentout_t *p)
{
    p->error = TDM_ERR_NO_MEMORY;
}

static agent_rec_t *add_rec(text_agentout_t *p, text_agent_event_kind_t kind, uint32_t index)
{
    agent_rec_t *rec;

    if (p->n_recs == p->cap_recs) {
        void *grown = tdm_array_grow(p->recs, sizeof(*p->recs), p->n_recs + 1, 8, &p->cap_recs);
        if (grown == NULL) {
            set_oom(p);
            return NULL;
        }
        p->recs = grown;
    }
    rec = &p->recs[p->n_recs++];
    memset(rec, 0, sizeof(*rec));
    rec->kind = kind;
    rec->index = index;
    rec->off = p->store.n_bytes;
    return rec;
}

/* Store bytes for the last record. */
static void rec_append(text_agentout_t *p, const char *bytes, size_t n)
{
    if (p->error != TDM_OK || n == 0) {
        return;
    }
    if (tdm_buf_append(&p->store, bytes, n) != TDM_OK) {
        set_oom(p);
        return;
    }
    p->recs[p->n_recs - 1].n += n;
}

/* Release reasoning or content text (merged with the previous event of the same kind). */
static void emit_text(text_agentout_t *p, text_agent_event_kind_t kind, const char *bytes, size_t n)
{
    if (n == 0 || p->error != TDM_OK) {
        return;
    }
    if (p->n_recs == 0 || p->recs[p->n_recs - 1].kind != kind) {
        if (add_rec(p, kind, 0) == NULL) {
            return;
        }
    }
    rec_append(p, bytes, n);
}

/* Append bytes as the inside of a JSON string (RFC 8259 7: quote, backslash, controls escaped). */
static void append_json_chars(text_agentout_t *p, const char *s, size_t n)
{
    char esc[8];
    size_t run = 0;

    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *rep = NULL;

        if (c == '"') {
            rep = "\\\"";
        } else if (c == '\\') {
            rep = "\\\\";
        } else if (c == '\n') {
            rep = "\\n";
        } else if (c == '\r') {
            rep = "\\r";
        } else if (c == '\t') {
            rep = "\\t";
        } else if (c < 0x20) {
            snprintf(esc, sizeof(esc), "\\u%04x", c);
            rep = esc;
        }
        if (rep != NULL) {
            rec_append(p, s + i - run, run);
            rec_append(p, rep, strlen(rep));
            run = 0;
        } else {
            run++;
        }
    }
    rec_append(p, s + n - run, run);
}

static void append_json_string(text_agentout_t *p, const char *s, size_t n)
{
    rec_append(p, "\"", 1);
    append_json_chars(p, s, n);
    rec_append(p, "\"", 1);
}

/* Release a parsed call: begin, one argument fragment per parameter, end. `s` is its text. */
static void emit_call(text_agentout_t *p, const char *s, const agent_call_t *call)
{
    uint32_t index = p->n_calls;
    uint64_t h = tdm_hash_splitmix64(p->id_seed ^ ((uint64_t)index * 0x9E3779B97F4A7C15ull));
    agent_rec_t *rec = add_rec(p, TEXT_AGENT_CALL_BEGIN, index);

    if (rec == NULL) {
        return;
    }
    snprintf(rec->id, sizeof(rec->id), "call_%016" PRIx64 "%08" PRIx32, h,
             (uint32_t)tdm_hash_splitmix64(h));
    rec_append(p, s + call->name_off, call->name_n);
    if (call->n_params == 0) {
        if (add_rec(p, TEXT_AGENT_CALL_ARGS, index) != NULL) {
            rec_append(p, "{}", 2);
        }
    }
    for (size_t i = 0; i < call->n_params; i++) {
        const agent_param_t *prm = &call->params[i];
        size_t v_off = prm->value_off;
        size_t v_n = prm->value_n;

        if (add_rec(p, TEXT_AGENT_CALL_ARGS, index) == NULL) {
            return;
        }
        rec_append(p, i == 0 ? "{" : ", ", i == 0 ? 1 : 2);
        append_json_string(p, s + prm->key_off, prm->key_n);
        rec_append(p, ": ", 2);
        if (prm->is_string) {
            append_json_string(p, s + v_off, v_n);
        } else {
            while (v_n > 0 && is_ws(s[v_off])) {
                v_off++;
                v_n--;
            }
            while (v_n > 0 && is_ws(s[v_off + v_n - 1])) {
                v_n--;
            }
            rec_append(p, s + v_off, v_n);
        }
        if (i + 1 == call->n_params) {
            rec_append(p, "}", 1);
        }
    }
    if (add_rec(p, TEXT_AGENT_CALL_END, index) != NULL) {
        p->n_calls++;
        p->block_calls++;
    }
}

/* ---- the invoke element ---- */

/* Skip whitespace from *pos; 0 when s ended. */
static int skip_ws(const char *s, size_t n, size_t *pos)
{
    while (*pos < n && is_ws(s[*pos])) {
        (*pos)++;
    }
    return *pos < n;
}

/* Match lit at *pos and step over it; returns PARSE_DONE, PARSE_MORE or PARSE_BAD. */
static parse_t expect(const char *s, size_t n, size_t *pos, const char *lit, size_t n_lit)
{
    int r = match_at(s, n, *pos, lit, n_lit);

    if (r == 1) {
        *pos += n_lit;
        return PARSE_DONE;
    }
    return r == 0 ? PARSE_MORE : PARSE_BAD;
}

/* At least one whitespace byte, then any more. */
static parse_t expect_ws(const char *s, size_t n, size_t *pos)
{
    if (*pos >= n) {
        return PARSE_MORE;
    }
    if (!is_ws(s[*pos])) {
        return PARSE_BAD;
    }
    return skip_ws(s, n, pos) ? PARSE_DONE : PARSE_MORE;
}

/* `attr="value"`: *off_out and *n_out the value (non-empty, no control bytes, bounded). */
static parse_t expect_attr(const char *s, size_t n, size_t *pos, const char *attr, size_t n_attr,
                           size_t *off_out, size_t *n_out)
{
    parse_t r = expect(s, n, pos, attr, n_attr);
    size_t start = *pos;

    if (r != PARSE_DONE) {
        return r;
    }
    while (*pos < n && s[*pos] != '"') {
        if ((unsigned char)s[*pos] < 0x20 || *pos - start >= TEXT_AGENT_MAX_NAME_BYTES) {
            return PARSE_BAD;
        }
        (*pos)++;
    }
    if (*pos >= n) {
        return PARSE_MORE;
    }
    if (*pos == start) {
        return PARSE_BAD;
    }
    *off_out = start;
    *n_out = *pos - start;
    (*pos)++;
    return PARSE_DONE;
}

/* Optional whitespace, then ">". */
static parse_t expect_close(const char *s, size_t n, size_t *pos)
{
    if (!skip_ws(s, n, pos)) {
        return PARSE_MORE;
    }
    return expect(s, n, pos, ">", 1);
}

/* One parameter element from *pos (just after "<｜DSML｜parameter"). */
static parse_t parse_param(const dsml_dialect_t *d, const char *s, size_t n, size_t *pos,
                           agent_call_t *call)
{
    agent_param_t *prm = &call->params[call->n_params];
    size_t end;
    parse_t r;
    int rt;
    int rf;

    if (call->n_params == AGENT_MAX_PARAMS) {
        return PARSE_BAD;
    }
    if ((r = expect_ws(s, n, pos)) != PARSE_DONE ||
        (r = expect_attr(s, n, pos, "name=\"", 6, &prm->key_off, &prm->key_n)) != PARSE_DONE ||
        (r = expect_ws(s, n, pos)) != PARSE_DONE ||
        (r = expect(s, n, pos, "string=\"", 8)) != PARSE_DONE) {
        return r;
    }
    rt = match_at(s, n, *pos, "true\"", 5);
    rf = match_at(s, n, *pos, "false\"", 6);
    if (rt == 1 || rf == 1) {
        prm->is_string = rt == 1;
        *pos += rt == 1 ? 5 : 6;
    } else {
        return rt == 0 || rf == 0 ? PARSE_MORE : PARSE_BAD;
    }
    if ((r = expect_close(s, n, pos)) != PARSE_DONE) {
        return r;
    }
    end = find_lit(s, n, *pos, d->param_close.s, d->param_close.n);
    if (end == SIZE_MAX) {
        return PARSE_MORE;
    }
    prm->value_off = *pos;
    prm->value_n = end - *pos;
    *pos = end + d->param_close.n;
    for (size_t i = 0; i < call->n_params; i++) {
        if (call->params[i].key_n == prm->key_n &&
            memcmp(s + call->params[i].key_off, s + prm->key_off, prm->key_n) == 0) {
            return PARSE_BAD; /* the encoder refuses a repeated parameter name too */
        }
    }
    if (!prm->is_string && !text_agentout_json_valid(s + prm->value_off, prm->value_n)) {
        return PARSE_BAD;
    }
    call->n_params++;
    return PARSE_DONE;
}

/* The invoke element at the start of s[0, n) (which starts with "<｜DSML｜invoke"). */
static parse_t parse_invoke(const dsml_dialect_t *d, const char *s, size_t n, agent_call_t *call)
{
    size_t pos = d->invoke_open.n;
    parse_t r;

    call->n_params = 0;
    if ((r = expect_ws(s, n, &pos)) != PARSE_DONE ||
        (r = expect_attr(s, n, &pos, "name=\"", 6, &call->name_off, &call->name_n)) != PARSE_DONE ||
        (r = expect_close(s, n, &pos)) != PARSE_DONE) {
        return r;
    }
    for (;;) {
        int r_param;
        int r_end;

        if (!skip_ws(s, n, &pos)) {
            return PARSE_MORE;
        }
        r_end = match_at(s, n, pos, d->invoke_close.s, d->invoke_close.n);
        if (r_end == 1) {
            call->n_bytes = pos + d->invoke_close.n;
            return PARSE_DONE;
        }
        r_param = match_at(s, n, pos, d->param_open.s, d->param_open.n);
        if (r_param != 1) {
            return r_param == 0 || r_end == 0 ? PARSE_MORE : PARSE_BAD;
        }
        pos += d->param_open.n;
        r = parse_param(d, s, n, &pos, call);
        if (r != PARSE_DONE) {
            return r;
        }
    }
}

/* ---- the state machine ---- */

/* Take n bytes off the front of pend into raw. */
static void pend_to_raw(text_agentout_t *p, size_t n)
{
    if (tdm_buf_append(&p->raw, p->pend.data, n) != TDM_OK) {
        set_oom(p);
        return;
    }
    tdm_buf_consume(&p->pend, n);
}

/* Markup that is not a call after all: raw goes out as content; back to content. */
static void release_raw(text_agentout_t *p)
{
    emit_text(p, TEXT_AGENT_CONTENT, p->raw.data, p->raw.n_bytes);
    tdm_buf_reset(&p->raw);
    p->state = ST_CONTENT;
}

/* Text state (reasoning or content): release what cannot start a marker; 1 when a marker was
 * consumed (the state changed), 0 when more text is needed. */
static int step_text(text_agentout_t *p, int final)
{
    const char *s = p->pend.data;
    size_t n = p->pend.n_bytes;
    size_t hold = 0;
    size_t at = SIZE_MAX;
    size_t n_marker = 0;

    if (p->state == ST_REASONING) {
        at = find_lit(s, n, 0, THINK_END, LIT_LEN(THINK_END));
        n_marker = LIT_LEN(THINK_END);
        if (at != SIZE_MAX) {
            emit_text(p, TEXT_AGENT_REASONING, s, at);
            tdm_buf_consume(&p->pend, at + n_marker);
            p->state = ST_CONTENT;
            return 1;
        }
        hold = prefix_suffix(s, n, THINK_END, LIT_LEN(THINK_END));
    } else if ((p->flags & TEXT_AGENT_TOOLS) != 0) {
        const dsml_dialect_t *dialect = NULL;
        for (int d = 0; d < N_DIALECTS; d++) {
            for (int i = 0; i < 3; i++) {
                const lit_t *o = &DIALECTS[d].open[i];
                size_t found = find_lit(s, n, 0, o->s, o->n);
                size_t k = prefix_suffix(s, n, o->s, o->n);
                if (found < at) {
                    at = found;
                    n_marker = o->n;
                    dialect = &DIALECTS[d];
                }
                hold = k > hold ? k : hold;
            }
        }
        if (at != SIZE_MAX) {
            p->dialect = dialect;
            emit_text(p, TEXT_AGENT_CONTENT, s, at);
            tdm_buf_consume(&p->pend, at);
            pend_to_raw(p, n_marker);
            p->state = ST_BLOCK;
            p->block_calls = 0;
            return 1;
        }
    }
    if (final) {
        hold = 0;
    } else if (hold == 0) {
        hold = utf8_tail(s, n);
    }
    emit_text(p, p->state == ST_REASONING ? TEXT_AGENT_REASONING : TEXT_AGENT_CONTENT, s, n - hold);
    tdm_buf_consume(&p->pend, n - hold);
    return 0;
}

/* Between invokes: whitespace is markup; an invoke or the closing tag goes on; else not a call. */
static int step_block(text_agentout_t *p)
{
    size_t i = 0;
    int r_inv;
    int r_end;

    while (i < p->pend.n_bytes && is_ws(p->pend.data[i])) {
        i++;
    }
    pend_to_raw(p, i);
    if (p->pend.n_bytes == 0 || p->error != TDM_OK) {
        return 0;
    }
    r_inv = match_at(p->pend.data, p->pend.n_bytes, 0, p->dialect->invoke_open.s,
                     p->dialect->invoke_open.n);
    r_end = match_at(p->pend.data, p->pend.n_bytes, 0, p->dialect->close.s, p->dialect->close.n);
    if (r_inv == 1) {
        p->state = ST_INVOKE;
        p->scanned = 0;
        return 1;
    }
    if (r_end == 1) {
        tdm_buf_consume(&p->pend, p->dialect->close.n);
        tdm_buf_reset(&p->raw);
        p->state = ST_CONTENT;
        return 1;
    }
    if (r_inv == 0 || r_end == 0) {
        return 0;
    }
    release_raw(p);
    return 1;
}

static int step_invoke(text_agentout_t *p)
{
    const dsml_dialect_t *d = p->dialect;
    agent_call_t *call;
    size_t closer;
    parse_t r;

    closer =
        find_lit(p->pend.data, p->pend.n_bytes, p->scanned, d->invoke_close.s, d->invoke_close.n);
    if (closer == SIZE_MAX && p->pend.n_bytes >= AGENT_EARLY_PARSE_BYTES) {
        p->scanned = p->pend.n_bytes - (d->invoke_close.n - 1);
        return 0;
    }
    call = malloc(sizeof(*call));
    if (call == NULL) {
        set_oom(p);
        return 0;
    }
    r = parse_invoke(d, p->pend.data, p->pend.n_bytes, call);
    if (r == PARSE_DONE) {
        emit_call(p, p->pend.data, call);
        tdm_buf_consume(&p->pend, call->n_bytes);
        tdm_buf_reset(&p->raw);
        p->state = ST_BLOCK;
    } else if (r == PARSE_BAD) {
        release_raw(p); /* pend (the invoke's text) is scanned as content next */
    } else if (closer != SIZE_MAX) {
        p->scanned = closer + 1; /* that closing tag was inside a value */
    } else if (p->pend.n_bytes >= d->invoke_close.n) {
        p->scanned = p->pend.n_bytes - (d->invoke_close.n - 1);
    }
    free(call);
    return r != PARSE_MORE;
}

static void run(text_agentout_t *p)
{
    int progress = 1;

    while (progress && p->error == TDM_OK) {
        switch (p->state) {
        case ST_REASONING:
        case ST_CONTENT:
            progress = step_text(p, 0);
            break;
        case ST_BLOCK:
            progress = step_block(p);
            break;
        case ST_INVOKE:
            progress = step_invoke(p);
            break;
        }
    }
}

/* Point the events at the stored text. */
static tdm_status_t publish(text_agentout_t *p, const text_agent_event_t **events_out,
                            size_t *n_events_out)
{
    *events_out = NULL;
    *n_events_out = 0;
    if (p->error != TDM_OK) {
        return p->error;
    }
    if (p->n_recs > p->cap_events) {
        void *grown = tdm_array_grow(p->events, sizeof(*p->events), p->n_recs, 8, &p->cap_events);
        if (grown == NULL) {
            set_oom(p);
            return p->error;
        }
        p->events = grown;
    }
    for (size_t i = 0; i < p->n_recs; i++) {
        const agent_rec_t *rec = &p->recs[i];
        text_agent_event_t *ev = &p->events[i];
        ev->kind = rec->kind;
        ev->index = rec->index;
        ev->text = rec->n > 0 ? p->store.data + rec->off : NULL;
        ev->n_text = rec->n;
        ev->id = rec->kind == TEXT_AGENT_CALL_BEGIN ? rec->id : NULL;
    }
    *events_out = p->events;
    *n_events_out = p->n_recs;
    return TDM_OK;
}

static void start_call(text_agentout_t *p)
{
    tdm_buf_reset(&p->store);
    p->n_recs = 0;
}

tdm_status_t text_agentout_push(text_agentout_t *parser, const char *bytes, size_t n_bytes,
                                const text_agent_event_t **events_out, size_t *n_events_out)
{
    text_agentout_t *p = parser;

    *events_out = NULL;
    *n_events_out = 0;
    if ((bytes == NULL && n_bytes > 0) || p->finished) {
        return TDM_ERR_INVALID_ARG;
    }
    if (p->error != TDM_OK) {
        return p->error;
    }
    start_call(p);
    if (tdm_buf_append(&p->pend, bytes, n_bytes) != TDM_OK) {
        set_oom(p);
        return p->error;
    }
    run(p);
    return publish(p, events_out, n_events_out);
}

tdm_status_t text_agentout_finish(text_agentout_t *parser, const text_agent_event_t **events_out,
                                  size_t *n_events_out)
{
    text_agentout_t *p = parser;
    agent_call_t *call;

    *events_out = NULL;
    *n_events_out = 0;
    if (p->error != TDM_OK) {
        return p->error;
    }
    start_call(p);
    if (p->finished) {
        return publish(p, events_out, n_events_out);
    }
    p->finished = 1;
    run(p);
    /* Each pass consumes held text or ends: a state change re-runs the machine once more. */
    while (p->error == TDM_OK) {
        if (p->state == ST_REASONING || p->state == ST_CONTENT) {
            if (step_text(p, 1) == 0) {
                break;
            }
            run(p);
        } else if (p->state == ST_BLOCK) {
            if (p->block_calls > 0 && match_at(p->pend.data, p->pend.n_bytes, 0,
                                               p->dialect->close.s, p->dialect->close.n) == 0) {
                tdm_buf_reset(&p->pend); /* complete calls, then part of the closing tag */
                break;
            }
            p->unfinished = 1;
            release_raw(p);
        } else {
            call = malloc(sizeof(*call));
            if (call == NULL) {
                set_oom(p);
                break;
            }
            if (parse_invoke(p->dialect, p->pend.data, p->pend.n_bytes, call) == PARSE_MORE) {
                p->unfinished = 1;
            }
            free(call);
            release_raw(p); /* the invoke's text is content now */
            emit_text(p, TEXT_AGENT_CONTENT, p->pend.data, p->dialect->invoke_open.n);
            tdm_buf_consume(&p->pend, p->dialect->invoke_open.n);
        }
    }
    return publish(p, events_out, n_events_out);
}

uint32_t text_agentout_n_calls(const text_agentout_t *parser)
{
    return parser->n_calls;
}

int text_agentout_unfinished(const text_agentout_t *parser)
{
    return parser->unfinished;
}
