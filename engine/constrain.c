/* constrain.c - token masks of byte-level constraints: per-vocabulary byte tries, the trie walk,
 * a request's constraint state (see constrain.h). */
#include "engine/constrain.h"

#include "engine/sampler.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* DeepSeek-V4's DSML markup token (encoding_dsv4.py dsml_token, U+FF5C "DSML" U+FF5C): a special
 * token the model writes inside its tool-call markup, so masks admit it as its text. */
#define DSML_MARKER TEXT_TOKENIZER_DSML

/* Longest token byte string a trie holds (node depth is 16 bits). */
#define MAX_TOKEN_BYTES 4096

/* A byte trie in depth-first order: node i has byte[i] at depth[i] (1 = a root child), its
 * subtree is [i, end[i]), and the tokens whose bytes end at it are ids[tok_off[i] ..
 * tok_off[i] + tok_n[i]). */
typedef struct {
    uint32_t n_nodes;
    uint8_t *byte;
    uint16_t *depth;
    uint32_t *end;
    uint32_t *tok_off;
    uint16_t *tok_n;
    int32_t *ids;        /* tokens of the trie, sorted by bytes */
    uint32_t *tok_first; /* [n_nodes + 1] tokens at nodes before node i (depth-first order), so
                            the tokens of node i's subtree are ids[tok_first[i] ..
                            tok_first[end[i]]) */
    uint32_t max_depth;
} trie_t;

/* Quotes of a token whose following bytes are classified (text_constraint_string_class). */
#define QUOTES_KEPT 2
#define QUOTE_NONE  UINT16_MAX

struct engine_constrain_vocab {
    int64_t n_vocab;
    uint32_t n_words;         /* (n_vocab + 63) / 64 */
    trie_t all;               /* every token with bytes */
    trie_t special;           /* tokens that leave a free string (a closing quote): walked there */
    uint64_t *plain;          /* [n_words] tokens every free string accepts without leaving it */
    uint64_t *string_decided; /* [n_words] tokens every free string accepts or every one
                                 refuses (never walked there) */
    trie_t raw_special;       /* tokens that are not plain raw-text bytes */
    uint64_t *raw;            /* [n_words] tokens that are plain raw-text bytes */
    uint32_t *tok_off; /* [n_vocab + 1] token x's bytes are pool[tok_off[x] .. tok_off[x + 1]) */
    uint8_t *pool;
    /* [n_vocab][QUOTES_KEPT]: byte index of the token's k-th '"' (QUOTE_NONE) and the class of
     * the bytes after it when that quote opens a free string (the walk's shortcut) */
    uint16_t (*quote_pos)[QUOTES_KEPT];
    uint8_t (*quote_class)[QUOTES_KEPT];
};

struct engine_constraint {
    const engine_constrain_vocab_t *vocab;
    text_constraint_t *compiled;
    text_constraint_state_t state;
    int finished;
    int mask_valid;
    uint64_t *mask; /* [n_words] */
    text_constraint_state_t
        *walk; /* [all.max_depth + 2] per-depth states of a trie walk, scratch */
    int n_stop;
    int32_t stop_ids[ENGINE_SAMPLER_MAX_STOP_IDS];
    char *source; /* engine_constraint_create_request's JSON (for clones), or NULL */
    int is_tools; /* source is a tool_calls constraint */
};

/* ---- tries --------------------------------------------------------------------------------- */

/* qsort context is not portable: the byte strings travel in an array of records. */
typedef struct {
    const uint8_t *bytes;
    uint32_t len;
    int32_t id;
} tok_rec_t;

static int compare_rec(const void *pa, const void *pb)
{
    const tok_rec_t *a = pa;
    const tok_rec_t *b = pb;
    uint32_t n = a->len < b->len ? a->len : b->len;
    int r = memcmp(a->bytes, b->bytes, n);

    if (r != 0) {
        return r;
    }
    if (a->len != b->len) {
        return a->len < b->len ? -1 : 1;
    }
    return a->id < b->id ? -1 : a->id > b->id;
}

static void trie_fini(trie_t *t)
{
    free(t->byte);
    free(t->depth);
    free(t->end);
    free(t->tok_off);
    free(t->tok_n);
    free(t->ids);
    free(t->tok_first);
    memset(t, 0, sizeof(*t));
}

/* Build a trie over recs[0..n) (sorted by compare_rec). */
static tdm_status_t trie_build(trie_t *t, const tok_rec_t *recs, uint32_t n)
{
    uint64_t cap = 0;
    uint32_t stack[MAX_TOKEN_BYTES + 1];
    uint32_t sp = 0;
    const tok_rec_t *prev = NULL;

    memset(t, 0, sizeof(*t));
    for (uint32_t i = 0; i < n; i++) {
        cap += recs[i].len;
    }
    if (cap > UINT32_MAX - 1) {
        return TDM_ERR_INVALID_ARG;
    }
    t->byte = malloc(cap + 1);
    t->depth = malloc((cap + 1) * sizeof(uint16_t));
    t->end = malloc((cap + 1) * sizeof(uint32_t));
    t->tok_off = malloc((cap + 1) * sizeof(uint32_t));
    t->tok_n = calloc(cap + 1, sizeof(uint16_t));
    t->ids = malloc(((size_t)n + 1) * sizeof(int32_t));
    t->tok_first = malloc((cap + 2) * sizeof(uint32_t));
    if (t->tok_first == NULL || t->byte == NULL || t->depth == NULL || t->end == NULL ||
        t->tok_off == NULL || t->tok_n == NULL || t->ids == NULL) {
        trie_fini(t);
        return TDM_ERR_NO_MEMORY;
    }
    for (uint32_t i = 0; i < n; i++) {
        const tok_rec_t *r = &recs[i];
        uint32_t lcp = 0;
        uint32_t node;

        if (prev != NULL) {
            uint32_t m = prev->len < r->len ? prev->len : r->len;

            while (lcp < m && prev->bytes[lcp] == r->bytes[lcp]) {
                lcp++;
            }
        }
        while (sp > lcp) {
            t->end[stack[--sp]] = t->n_nodes;
        }
        for (uint32_t k = lcp; k < r->len; k++) {
            node = t->n_nodes++;
            t->byte[node] = r->bytes[k];
            t->depth[node] = (uint16_t)(k + 1);
            t->tok_off[node] = 0;
            stack[sp++] = node;
        }
        node = stack[r->len - 1];
        if (t->tok_n[node] == 0) {
            t->tok_off[node] = i;
        }
        if (t->tok_n[node] < UINT16_MAX) {
            t->tok_n[node]++;
        }
        t->ids[i] = r->id;
        if (r->len > t->max_depth) {
            t->max_depth = r->len;
        }
        prev = r;
    }
    while (sp > 0) {
        t->end[stack[--sp]] = t->n_nodes;
    }
    for (uint32_t i = 0, seen = 0; i <= t->n_nodes; i++) {
        t->tok_first[i] = seen;
        seen += i < t->n_nodes ? t->tok_n[i] : 0;
    }
    return TDM_OK;
}

/* The trie of the tokens of recs[0..n) (sorted) whose bit in `plain` is clear. */
static tdm_status_t subset_trie(trie_t *t, const tok_rec_t *recs, uint32_t n, const uint64_t *plain)
{
    tok_rec_t *sub = malloc(((size_t)n + 1) * sizeof(*sub));
    uint32_t n_sub = 0;
    tdm_status_t st;

    if (sub == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    for (uint32_t i = 0; i < n; i++) { /* order kept: still sorted */
        int32_t x = recs[i].id;

        if ((plain[x / 64] >> (x % 64) & 1) == 0) {
            sub[n_sub++] = recs[i];
        }
    }
    st = trie_build(t, sub, n_sub);
    free(sub);
    return st;
}

/* Keep every token's bytes (advance steps the automaton by them). */
static tdm_status_t copy_bytes(engine_constrain_vocab_t *v, const uint8_t *const *bytes,
                               const size_t *lens)
{
    uint64_t total = 0;

    for (int64_t x = 0; x < v->n_vocab; x++) {
        total += bytes[x] == NULL ? 0 : lens[x];
    }
    if (total > UINT32_MAX) {
        return TDM_ERR_INVALID_ARG;
    }
    v->tok_off = malloc(((size_t)v->n_vocab + 1) * sizeof(uint32_t));
    v->pool = malloc(total + 1);
    if (v->tok_off == NULL || v->pool == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    total = 0;
    for (int64_t x = 0; x < v->n_vocab; x++) {
        v->tok_off[x] = (uint32_t)total;
        if (bytes[x] != NULL && lens[x] > 0) {
            memcpy(v->pool + total, bytes[x], lens[x]);
            total += lens[x];
        }
    }
    v->tok_off[v->n_vocab] = (uint32_t)total;
    v->quote_pos = malloc((size_t)v->n_vocab * sizeof(*v->quote_pos));
    v->quote_class = malloc((size_t)v->n_vocab * sizeof(*v->quote_class));
    if (v->quote_pos == NULL || v->quote_class == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    for (int64_t x = 0; x < v->n_vocab; x++) {
        const uint8_t *b = v->pool + v->tok_off[x];
        uint32_t n = v->tok_off[x + 1] - v->tok_off[x];
        int k = 0;

        for (int q = 0; q < QUOTES_KEPT; q++) {
            v->quote_pos[x][q] = QUOTE_NONE;
        }
        for (uint32_t i = 0; i < n && i < QUOTE_NONE && k < QUOTES_KEPT; i++) {
            if (b[i] == '"') {
                v->quote_pos[x][k] = (uint16_t)i;
                v->quote_class[x][k] =
                    i + 1 == n ? TEXT_CONSTRAINT_ACCEPTED
                               : (uint8_t)text_constraint_string_class(b + i + 1, n - i - 1);
                k++;
            }
        }
    }
    return TDM_OK;
}

tdm_status_t engine_constrain_vocab_create(int64_t n_vocab, const uint8_t *const *bytes,
                                           const size_t *lens, engine_constrain_vocab_t **vocab_out)
{
    engine_constrain_vocab_t *v;
    tok_rec_t *recs;
    uint32_t n_all = 0;
    tdm_status_t st;

    if (bytes == NULL || lens == NULL || vocab_out == NULL || n_vocab < 1 || n_vocab > INT32_MAX) {
        return TDM_ERR_INVALID_ARG;
    }
    v = calloc(1, sizeof(*v));
    recs = malloc((size_t)n_vocab * sizeof(*recs));
    if (v == NULL || recs == NULL) {
        free(v);
        free(recs);
        return TDM_ERR_NO_MEMORY;
    }
    v->n_vocab = n_vocab;
    v->n_words = (uint32_t)((n_vocab + 63) / 64);
    v->plain = calloc(v->n_words, sizeof(uint64_t));
    v->raw = calloc(v->n_words, sizeof(uint64_t));
    v->string_decided = calloc(v->n_words, sizeof(uint64_t));
    if (v->plain == NULL || v->raw == NULL || v->string_decided == NULL) {
        st = TDM_ERR_NO_MEMORY;
        goto err_free;
    }
    /* all tokens with bytes; the plain-string ones marked in the bitset */
    for (int64_t x = 0; x < n_vocab; x++) {
        if (bytes[x] == NULL || lens[x] == 0 || lens[x] > MAX_TOKEN_BYTES) {
            continue;
        }
        recs[n_all].bytes = bytes[x];
        recs[n_all].len = (uint32_t)lens[x];
        recs[n_all].id = (int32_t)x;
        n_all++;
        switch (text_constraint_string_class(bytes[x], lens[x])) {
        case TEXT_CONSTRAINT_ACCEPTED:
            v->plain[x / 64] |= (uint64_t)1 << (x % 64);
            break;
        case TEXT_CONSTRAINT_REFUSED: /* never allowed in a free string */
            v->string_decided[x / 64] |= (uint64_t)1 << (x % 64);
            break;
        default:
            break;
        }
        if (text_constraint_is_plain_raw_bytes(bytes[x], lens[x])) {
            v->raw[x / 64] |= (uint64_t)1 << (x % 64);
        }
    }
    st = copy_bytes(v, bytes, lens);
    if (st != TDM_OK) {
        goto err_free;
    }
    qsort(recs, n_all, sizeof(*recs), compare_rec);
    st = trie_build(&v->all, recs, n_all);
    if (st != TDM_OK) {
        goto err_free;
    }
    for (uint32_t w = 0; w < v->n_words; w++) { /* walked: neither always accepted nor refused */
        v->string_decided[w] |= v->plain[w];
    }
    st = subset_trie(&v->special, recs, n_all, v->string_decided);
    if (st == TDM_OK) {
        st = subset_trie(&v->raw_special, recs, n_all, v->raw);
    }
    if (st != TDM_OK) {
        goto err_free;
    }
    free(recs);
    *vocab_out = v;
    return TDM_OK;

err_free:
    free(recs);
    engine_constrain_vocab_destroy(v);
    return st;
}

tdm_status_t engine_constrain_vocab_from_tokenizer(const text_tokenizer_t *tok, int64_t n_vocab,
                                                   engine_constrain_vocab_t **vocab_out)
{
    const uint8_t **bytes;
    size_t *lens;
    int64_t n_tok;
    int32_t dsml;
    tdm_status_t st;

    if (tok == NULL || n_vocab < 1 || n_vocab > INT32_MAX) {
        return TDM_ERR_INVALID_ARG;
    }
    bytes = calloc((size_t)n_vocab, sizeof(*bytes));
    lens = calloc((size_t)n_vocab, sizeof(*lens));
    if (bytes == NULL || lens == NULL) {
        free(bytes);
        free(lens);
        return TDM_ERR_NO_MEMORY;
    }
    n_tok = text_tokenizer_n_vocab(tok);
    if (text_tokenizer_find_special(tok, DSML_MARKER, &dsml) != TDM_OK) {
        dsml = -1;
    }
    for (int64_t x = 0; x < n_vocab && x < n_tok; x++) {
        text_token_kind_t kind;

        if (text_tokenizer_token_kind(tok, (int32_t)x, &kind) != TDM_OK ||
            (kind != TEXT_TOKEN_NORMAL && kind != TEXT_TOKEN_USER_DEFINED && x != dsml)) {
            continue;
        }
        if (text_tokenizer_token_bytes(tok, (int32_t)x, &bytes[x], &lens[x]) != TDM_OK) {
            bytes[x] = NULL;
            lens[x] = 0;
        }
    }
    st = engine_constrain_vocab_create(n_vocab, bytes, lens, vocab_out);
    free(bytes);
    free(lens);
    return st;
}

void engine_constrain_vocab_destroy(engine_constrain_vocab_t *vocab)
{
    if (vocab == NULL) {
        return;
    }
    trie_fini(&vocab->all);
    trie_fini(&vocab->special);
    trie_fini(&vocab->raw_special);
    free(vocab->plain);
    free(vocab->raw);
    free(vocab->string_decided);
    free(vocab->tok_off);
    free(vocab->pool);
    free(vocab->quote_pos);
    free(vocab->quote_class);
    free(vocab);
}

void engine_constrain_vocab_stats(const engine_constrain_vocab_t *vocab,
                                  engine_constrain_vocab_stats_t *stats_out)
{
    const trie_t *t[3] = {&vocab->all, &vocab->special, &vocab->raw_special};
    uint32_t n_tokens[3] = {0, 0, 0};

    for (int k = 0; k < 3; k++) {
        for (uint32_t i = 0; i < t[k]->n_nodes; i++) {
            n_tokens[k] += t[k]->tok_n[i];
        }
    }
    stats_out->all_tokens = n_tokens[0];
    stats_out->all_nodes = t[0]->n_nodes;
    stats_out->string_tokens = n_tokens[1];
    stats_out->string_nodes = t[1]->n_nodes;
    stats_out->raw_tokens = n_tokens[2];
    stats_out->raw_nodes = t[2]->n_nodes;
}

int64_t engine_constrain_vocab_n(const engine_constrain_vocab_t *vocab)
{
    return vocab->n_vocab;
}

/* ---- a request's constraint ------------------------------------------------------------------ */

tdm_status_t engine_constraint_create_compiled(const engine_constrain_vocab_t *vocab,
                                               text_constraint_t *compiled, const int32_t *stop_ids,
                                               int n_stop_ids, engine_constraint_t **out)
{
    engine_constraint_t *c;

    if (vocab == NULL || compiled == NULL || out == NULL || stop_ids == NULL || n_stop_ids < 1 ||
        n_stop_ids > ENGINE_SAMPLER_MAX_STOP_IDS) {
        text_constraint_destroy(compiled);
        return TDM_ERR_INVALID_ARG;
    }
    for (int i = 0; i < n_stop_ids; i++) {
        if (stop_ids[i] < 0 || stop_ids[i] >= vocab->n_vocab) {
            text_constraint_destroy(compiled);
            return TDM_ERR_INVALID_ARG;
        }
    }
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        text_constraint_destroy(compiled);
        return TDM_ERR_NO_MEMORY;
    }
    c->vocab = vocab;
    c->compiled = compiled;
    c->mask = calloc(vocab->n_words, sizeof(uint64_t));
    c->walk = malloc(((size_t)vocab->all.max_depth + 2) * sizeof(text_constraint_state_t));
    if (c->mask == NULL || c->walk == NULL) {
        engine_constraint_destroy(c);
        return TDM_ERR_NO_MEMORY;
    }
    c->n_stop = n_stop_ids;
    memcpy(c->stop_ids, stop_ids, (size_t)n_stop_ids * sizeof(stop_ids[0]));
    text_constraint_start(compiled, &c->state);
    *out = c;
    return TDM_OK;
}

tdm_status_t engine_constraint_create(const engine_constrain_vocab_t *vocab, const char *json,
                                      size_t n_json, const int32_t *stop_ids, int n_stop_ids,
                                      engine_constraint_t **out, char *err, size_t err_bytes)
{
    text_constraint_t *compiled = NULL;
    tdm_status_t st;

    if (vocab == NULL || json == NULL || out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    st = text_constraint_compile(json, n_json, &compiled, err, err_bytes);
    if (st != TDM_OK) {
        return st;
    }
    st = engine_constraint_create_compiled(vocab, compiled, stop_ids, n_stop_ids, out);
    if (st == TDM_ERR_INVALID_ARG && err != NULL && err_bytes > 0) {
        snprintf(err, err_bytes, "stop_ids: need 1 to %d ids in [0, %lld)",
                 ENGINE_SAMPLER_MAX_STOP_IDS, (long long)vocab->n_vocab);
    }
    return st;
}

tdm_status_t engine_constraint_create_tool_calls(const engine_constrain_vocab_t *vocab,
                                                 const char *json, size_t n_json,
                                                 const int32_t *stop_ids, int n_stop_ids,
                                                 engine_constraint_t **out, char *err,
                                                 size_t err_bytes)
{
    text_constraint_t *compiled = NULL;
    tdm_status_t st;

    if (vocab == NULL || json == NULL || out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    st = text_constraint_compile_tool_calls(json, n_json, &compiled, err, err_bytes);
    if (st != TDM_OK) {
        return st;
    }
    return engine_constraint_create_compiled(vocab, compiled, stop_ids, n_stop_ids, out);
}

tdm_status_t engine_constraint_create_request(const engine_constrain_vocab_t *vocab,
                                              const char *response_format, const char *tool_calls,
                                              const int32_t *stop_ids, int n_stop_ids,
                                              engine_constraint_t **out, char *err,
                                              size_t err_bytes)
{
    int rf = response_format != NULL && response_format[0] != '\0';
    int tc = tool_calls != NULL && tool_calls[0] != '\0';
    tdm_status_t st;

    *out = NULL;
    if (!rf && !tc) {
        return TDM_OK;
    }
    if (rf && tc) {
        if (err != NULL && err_bytes > 0) {
            snprintf(err, err_bytes, "response_format and tool_calls: at most one constraint");
        }
        return TDM_ERR_INVALID_ARG;
    }
    if (vocab == NULL) {
        if (err != NULL && err_bytes > 0) {
            snprintf(err, err_bytes,
                     "%s: this node's checkpoint has no tokenizer.json (constrained decoding off)",
                     rf ? "response_format" : "tool_calls");
        }
        return TDM_ERR_UNSUPPORTED;
    }
    st = rf ? engine_constraint_create(vocab, response_format, strlen(response_format), stop_ids,
                                       n_stop_ids, out, err, err_bytes)
            : engine_constraint_create_tool_calls(vocab, tool_calls, strlen(tool_calls), stop_ids,
                                                  n_stop_ids, out, err, err_bytes);
    if (st != TDM_OK) {
        return st;
    }
    (*out)->source = strdup(rf ? response_format : tool_calls);
    (*out)->is_tools = !rf;
    if ((*out)->source == NULL) {
        engine_constraint_destroy(*out);
        *out = NULL;
        return TDM_ERR_NO_MEMORY;
    }
    return TDM_OK;
}

tdm_status_t engine_constraint_clone(const engine_constraint_t *c, engine_constraint_t **out)
{
    engine_constraint_mark_t mark;
    tdm_status_t st;

    *out = NULL;
    if (c->source == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    st = engine_constraint_create_request(c->vocab, c->is_tools ? "" : c->source,
                                          c->is_tools ? c->source : "", c->stop_ids, c->n_stop, out,
                                          NULL, 0);
    if (st != TDM_OK) {
        return st;
    }
    engine_constraint_mark(c, &mark);
    engine_constraint_rewind(*out, &mark);
    return TDM_OK;
}

void engine_constraint_destroy(engine_constraint_t *c)
{
    if (c == NULL) {
        return;
    }
    text_constraint_destroy(c->compiled);
    free(c->source);
    free(c->mask);
    free(c->walk);
    free(c);
}

/*
 * The subtree of node i, whose byte '"' opened a free string (state walk[d]): a token's fate is
 * that of its bytes after this quote (precomputed by class); only tokens whose bytes leave the
 * string again are stepped.
 */
static void opened_string(const engine_constrain_vocab_t *v, const trie_t *t, uint32_t i,
                          const text_constraint_t *cc, const text_constraint_state_t *open,
                          text_constraint_state_t *scratch, uint64_t *mask)
{
    uint32_t quote = t->depth[i] - 1u; /* the quote's index in every token of the subtree */

    for (uint32_t k = t->tok_first[i]; k < t->tok_first[t->end[i]]; k++) {
        int32_t x = t->ids[k];
        int cls = TEXT_CONSTRAINT_DEPENDS;
        uint32_t n = v->tok_off[x + 1] - v->tok_off[x];

        for (int q = 0; q < QUOTES_KEPT; q++) {
            if (v->quote_pos[x][q] == quote) {
                cls = v->quote_class[x][q];
            }
        }
        if (cls == TEXT_CONSTRAINT_DEPENDS) {
            text_constraint_state_copy(scratch, open);
            if (!text_constraint_step_bytes(cc, scratch, v->pool + v->tok_off[x] + quote + 1,
                                            n - quote - 1)) {
                continue;
            }
            cls = TEXT_CONSTRAINT_ACCEPTED;
        }
        if (cls == TEXT_CONSTRAINT_ACCEPTED) {
            mask[x / 64] |= (uint64_t)1 << (x % 64);
        }
    }
}

/* Walk trie t from walk[0]: every token whose bytes the automaton accepts gets its bit.
 * walk [t->max_depth + 2]: per-depth states, the last one scratch. */
static void trie_walk(const engine_constrain_vocab_t *v, const trie_t *t,
                      const text_constraint_t *cc, text_constraint_state_t *walk, uint64_t *mask)
{
    uint32_t i = 0;

    while (i < t->n_nodes) {
        uint32_t d = t->depth[i];

        text_constraint_state_copy(&walk[d], &walk[d - 1]);
        if (!text_constraint_step(cc, &walk[d], t->byte[i])) {
            i = t->end[i];
            continue;
        }
        if (t->byte[i] == '"' &&
            text_constraint_free_kind(&walk[d]) == TEXT_CONSTRAINT_FREE_STRING) {
            opened_string(v, t, i, cc, &walk[d], &walk[t->max_depth + 1], mask);
            i = t->end[i];
            continue;
        }
        for (uint32_t k = 0; k < t->tok_n[i]; k++) {
            int32_t x = t->ids[t->tok_off[i] + k];

            mask[x / 64] |= (uint64_t)1 << (x % 64);
        }
        i++;
    }
}

const uint64_t *engine_constraint_mask(engine_constraint_t *c)
{
    const engine_constrain_vocab_t *v = c->vocab;

    if (c->mask_valid) {
        return c->mask;
    }
    memset(c->mask, 0, v->n_words * sizeof(uint64_t));
    if (!c->finished) {
        text_constraint_free_t kind = text_constraint_free_kind(&c->state);

        text_constraint_state_copy(&c->walk[0], &c->state);
        if (kind == TEXT_CONSTRAINT_FREE_STRING) {
            memcpy(c->mask, v->plain, v->n_words * sizeof(uint64_t));
            trie_walk(v, &v->special, c->compiled, c->walk, c->mask);
        } else if (kind == TEXT_CONSTRAINT_FREE_RAW) {
            memcpy(c->mask, v->raw, v->n_words * sizeof(uint64_t));
            trie_walk(v, &v->raw_special, c->compiled, c->walk, c->mask);
        } else {
            trie_walk(v, &v->all, c->compiled, c->walk, c->mask);
        }
        if (text_constraint_accepting(c->compiled, &c->state)) {
            for (int i = 0; i < c->n_stop; i++) {
                c->mask[c->stop_ids[i] / 64] |= (uint64_t)1 << (c->stop_ids[i] % 64);
            }
        }
    }
    c->mask_valid = 1;
    return c->mask;
}

int engine_constraint_allows(engine_constraint_t *c, int32_t token)
{
    const uint64_t *mask;

    if (token < 0 || token >= c->vocab->n_vocab) {
        return 0;
    }
    mask = engine_constraint_mask(c);
    return (int)(mask[token / 64] >> (token % 64) & 1);
}

tdm_status_t engine_constraint_apply(engine_constraint_t *c, float *logits, int64_t n_vocab)
{
    const uint64_t *mask;
    uint64_t any = 0;

    if (logits == NULL || n_vocab != c->vocab->n_vocab) {
        return TDM_ERR_INVALID_ARG;
    }
    mask = engine_constraint_mask(c);
    for (uint32_t w = 0; w < c->vocab->n_words; w++) {
        any |= mask[w];
    }
    if (any == 0) {
        return TDM_ERR_INTERNAL;
    }
    for (uint32_t w = 0; w < c->vocab->n_words; w++) {
        uint64_t off = ~mask[w];

        if (mask[w] == 0 && (int64_t)w * 64 + 64 <= n_vocab) { /* the common word: all refused */
            float *row = logits + (int64_t)w * 64;

            for (int k = 0; k < 64; k++) {
                row[k] = -INFINITY;
            }
            continue;
        }
        while (off != 0) {
            int64_t x = (int64_t)w * 64 + __builtin_ctzll(off);

            if (x >= n_vocab) {
                break;
            }
            logits[x] = -INFINITY;
            off &= off - 1;
        }
    }
    return TDM_OK;
}

tdm_status_t engine_constraint_advance(engine_constraint_t *c, int32_t token)
{
    if (!engine_constraint_allows(c, token)) {
        return TDM_ERR_INVALID_ARG;
    }
    for (int i = 0; i < c->n_stop; i++) {
        if (c->stop_ids[i] == token) {
            c->finished = 1;
            c->mask_valid = 0;
            return TDM_OK;
        }
    }
    {
        const engine_constrain_vocab_t *v = c->vocab;
        uint32_t off = v->tok_off[token];

        if (!text_constraint_step_bytes(c->compiled, &c->state, v->pool + off,
                                        v->tok_off[token + 1] - off)) {
            return TDM_ERR_INTERNAL; /* the mask allowed it: cannot happen */
        }
    }
    c->mask_valid = 0;
    return TDM_OK;
}

int engine_constraint_finished(const engine_constraint_t *c)
{
    return c->finished;
}

void engine_constraint_mark(const engine_constraint_t *c, engine_constraint_mark_t *mark_out)
{
    text_constraint_state_copy(&mark_out->state, &c->state);
    mark_out->finished = c->finished;
}

void engine_constraint_rewind(engine_constraint_t *c, const engine_constraint_mark_t *mark)
{
    text_constraint_state_copy(&c->state, &mark->state);
    c->finished = mark->finished;
    c->mask_valid = 0;
}
