#include "router/session.h"

#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/hash.h"
#include "proto/proto_hash.h"

#define SESSION_MIN_BUCKETS    64u
#define BLOCK_MIN_BUCKETS      (1u << 16)
#define SESSION_INITIAL_TOKENS 256

/* One indexed block: block `block` of session `s` has chain hash `hash`. */
typedef struct block_entry {
    uint64_t hash;
    router_session_t *s;
    size_t block;
    struct block_entry *next;
} block_entry_t;

/* One session in the eviction heap, keyed by its last_used_ns when it was last sifted (callers
 * write last_used_ns directly: a stale key is refreshed when it reaches the top). */
typedef struct {
    uint64_t used_ns;
    router_session_t *s;
} lru_entry_t;

struct router_sessions {
    uint32_t max_sessions;
    uint32_t tokens_per_block;
    router_session_t **by_id; /* [n_id_buckets] chains */
    uint32_t n_id_buckets;
    lru_entry_t *all; /* [n_sessions] every session, a min-heap on used_ns (eviction) */
    size_t n_sessions;
    block_entry_t **blocks; /* [n_block_buckets] chains */
    size_t n_block_buckets; /* a power of two, doubled past two entries per bucket */
    size_t n_block_entries;
};

static uint32_t pow2_at_least(uint32_t n)
{
    uint32_t p = SESSION_MIN_BUCKETS;
    while (p < n && p < (1u << 30)) {
        p <<= 1;
    }
    return p;
}

tdm_status_t router_sessions_create(uint32_t max_sessions, uint32_t tokens_per_block,
                                    router_sessions_t **table_out)
{
    router_sessions_t *t;

    if (max_sessions == 0 || tokens_per_block == 0 || table_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    t = calloc(1, sizeof(*t));
    if (t == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    t->max_sessions = max_sessions;
    t->tokens_per_block = tokens_per_block;
    t->n_id_buckets = pow2_at_least(max_sessions);
    t->by_id = calloc(t->n_id_buckets, sizeof(*t->by_id));
    t->all = calloc(max_sessions, sizeof(*t->all));
    t->n_block_buckets = BLOCK_MIN_BUCKETS;
    t->blocks = calloc(t->n_block_buckets, sizeof(*t->blocks));
    if (t->by_id == NULL || t->all == NULL || t->blocks == NULL) {
        router_sessions_destroy(t);
        return TDM_ERR_NO_MEMORY;
    }
    *table_out = t;
    return TDM_OK;
}

static uint32_t id_bucket(const router_sessions_t *t, const char *id)
{
    return (uint32_t)(tdm_hash_xxh3_64(id, strlen(id)) & (t->n_id_buckets - 1));
}

static block_entry_t **block_chain(const router_sessions_t *t, uint64_t hash)
{
    return &t->blocks[hash & (t->n_block_buckets - 1)];
}

/* Double the block buckets once entries outnumber them twice (out of memory: chains grow), so a
 * lookup stays O(1) however many sessions are indexed. */
static void grow_blocks(router_sessions_t *t)
{
    size_t n = t->n_block_buckets * 2;
    block_entry_t **grown;

    if (t->n_block_entries <= 2 * t->n_block_buckets) {
        return;
    }
    grown = calloc(n, sizeof(*grown));
    if (grown == NULL) {
        return;
    }
    for (size_t b = 0; b < t->n_block_buckets; b++) {
        block_entry_t *e = t->blocks[b];
        while (e != NULL) {
            block_entry_t *next = e->next;
            e->next = grown[e->hash & (n - 1)];
            grown[e->hash & (n - 1)] = e;
            e = next;
        }
    }
    free(t->blocks);
    t->blocks = grown;
    t->n_block_buckets = n;
}

static void unindex_from(router_sessions_t *t, router_session_t *s, size_t first_block)
{
    for (size_t b = first_block; b < s->n_blocks; b++) {
        block_entry_t **link = block_chain(t, s->block_hashes[b]);
        while (*link != NULL) {
            block_entry_t *e = *link;
            if (e->s == s && e->block == b) {
                *link = e->next;
                free(e);
                t->n_block_entries--;
                break;
            }
            link = &e->next;
        }
    }
    s->n_blocks = first_block < s->n_blocks ? first_block : s->n_blocks;
}

static void free_session(router_sessions_t *t, router_session_t *s)
{
    unindex_from(t, s, 0);
    free(s->block_hashes);
    free(s->tokens);
    free(s);
}

void router_sessions_destroy(router_sessions_t *table)
{
    if (table == NULL) {
        return;
    }
    for (size_t i = 0; table->all != NULL && i < table->n_sessions; i++) {
        free_session(table, table->all[i].s);
    }
    free(table->blocks);
    free(table->all);
    free(table->by_id);
    free(table);
}

router_session_t *router_sessions_get(router_sessions_t *table, const char *id)
{
    router_session_t *s = table->by_id[id_bucket(table, id)];

    while (s != NULL && strcmp(s->id, id) != 0) {
        s = s->next_by_id;
    }
    return s;
}

/* ---- eviction heap: least recently used at the top ------------------------------------------ */

static void lru_swap(router_sessions_t *t, size_t a, size_t b)
{
    lru_entry_t x = t->all[a];

    t->all[a] = t->all[b];
    t->all[b] = x;
}

static void lru_down(router_sessions_t *t, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < t->n_sessions && t->all[l].used_ns < t->all[m].used_ns) {
            m = l;
        }
        if (r < t->n_sessions && t->all[r].used_ns < t->all[m].used_ns) {
            m = r;
        }
        if (m == i) {
            return;
        }
        lru_swap(t, i, m);
        i = m;
    }
}

static void lru_up(router_sessions_t *t, size_t i)
{
    while (i > 0 && t->all[(i - 1) / 2].used_ns > t->all[i].used_ns) {
        lru_swap(t, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
}

/* Take the top of the heap out (its session is the caller's). */
static router_session_t *lru_pop(router_sessions_t *t)
{
    router_session_t *s = t->all[0].s;

    t->all[0] = t->all[--t->n_sessions];
    lru_down(t, 0);
    return s;
}

static void lru_push(router_sessions_t *t, router_session_t *s)
{
    t->all[t->n_sessions].used_ns = s->last_used_ns;
    t->all[t->n_sessions].s = s;
    lru_up(t, t->n_sessions++);
}

static void remove_session(router_sessions_t *t, router_session_t *s)
{
    router_session_t **link = &t->by_id[id_bucket(t, s->id)];

    while (*link != s) {
        link = &(*link)->next_by_id;
    }
    *link = s->next_by_id;
    free_session(t, s);
}

/* Evict the least recently used idle session: stale heap keys (last_used_ns moved on) are
 * refreshed at the top, active sessions set aside and put back; O(log N) amortised. */
static tdm_status_t evict_one(router_sessions_t *t)
{
    router_session_t **kept = NULL; /* active sessions popped meanwhile, put back at the end */
    size_t n_kept = 0, cap_kept = 0;
    tdm_status_t status = TDM_ERR_BUSY;

    while (t->n_sessions > 0) {
        router_session_t *s = t->all[0].s;
        if (t->all[0].used_ns != s->last_used_ns) {
            t->all[0].used_ns = s->last_used_ns;
            lru_down(t, 0);
            continue;
        }
        s = lru_pop(t);
        if (s->active_request == 0) {
            remove_session(t, s);
            status = TDM_OK;
            break;
        }
        if (n_kept == cap_kept) {
            size_t n = cap_kept > 0 ? cap_kept * 2 : 16;
            router_session_t **grown = realloc(kept, n * sizeof(*grown));
            if (grown == NULL) {
                lru_push(t, s);
                status = TDM_ERR_NO_MEMORY;
                break;
            }
            kept = grown;
            cap_kept = n;
        }
        kept[n_kept++] = s;
    }
    for (size_t i = 0; i < n_kept; i++) {
        lru_push(t, kept[i]);
    }
    free(kept);
    return status;
}

tdm_status_t router_sessions_add(router_sessions_t *table, const char *id, uint32_t tenant,
                                 uint64_t now_ns, router_session_t **session_out)
{
    router_session_t *s;
    size_t n = id != NULL ? strlen(id) : 0;
    uint32_t bucket;
    tdm_status_t status;

    if (n == 0 || n > ROUTER_SESSION_ID_BYTES || router_sessions_get(table, id) != NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    if (table->n_sessions == table->max_sessions) {
        status = evict_one(table);
        if (status != TDM_OK) {
            return status;
        }
    }
    s = calloc(1, sizeof(*s));
    if (s == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    memcpy(s->id, id, n + 1);
    s->tenant = tenant;
    s->worker_slot = -1;
    s->last_used_ns = now_ns;
    bucket = id_bucket(table, id);
    s->next_by_id = table->by_id[bucket];
    table->by_id[bucket] = s;
    lru_push(table, s);
    *session_out = s;
    return TDM_OK;
}

size_t router_common_prefix(const int32_t *a, size_t n_a, const int32_t *b, size_t n_b)
{
    size_t n = n_a < n_b ? n_a : n_b;
    size_t i = 0;

    while (i < n && a[i] == b[i]) {
        i++;
    }
    return i;
}

router_session_t *router_sessions_match_prefix(router_sessions_t *table, uint32_t tenant,
                                               const int32_t *tokens, size_t n_tokens,
                                               size_t *matched_out)
{
    size_t n_blocks = n_tokens / table->tokens_per_block;
    uint64_t *hashes;
    router_session_t *best = NULL;

    *matched_out = 0;
    if (n_blocks == 0) {
        return NULL;
    }
    hashes = malloc(n_blocks * sizeof(*hashes));
    if (hashes == NULL) {
        return NULL;
    }
    proto_block_hashes(tokens, n_tokens, table->tokens_per_block, hashes);
    for (size_t b = n_blocks; b-- > 0 && best == NULL;) {
        size_t len = (b + 1) * table->tokens_per_block;
        for (block_entry_t *e = *block_chain(table, hashes[b]); e != NULL; e = e->next) {
            router_session_t *s = e->s;
            if (e->hash != hashes[b] || e->block != b || s->tenant != tenant || s->n_tokens < len ||
                memcmp(s->tokens, tokens, len * sizeof(*tokens)) != 0) {
                continue;
            }
            /* the first confirmed one (chains are newest first, until the index grows), not a
             * walk over every session that shares a common prefix (issue 18) */
            best = s;
            *matched_out = len;
            break;
        }
    }
    free(hashes);
    return best;
}

static tdm_status_t reserve_tokens(router_session_t *s, size_t n_tokens)
{
    int32_t *grown;

    if (n_tokens == 0) {
        return TDM_OK;
    }
    grown =
        tdm_array_grow(s->tokens, sizeof(*grown), n_tokens, SESSION_INITIAL_TOKENS, &s->cap_tokens);
    if (grown == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    s->tokens = grown;
    return TDM_OK;
}

/* Index the blocks of s->tokens beyond s->n_blocks. */
static tdm_status_t index_new_blocks(router_sessions_t *t, router_session_t *s)
{
    size_t n_blocks = s->n_tokens / t->tokens_per_block;
    uint64_t *hashes;

    if (n_blocks <= s->n_blocks) {
        return TDM_OK;
    }
    hashes = realloc(s->block_hashes, n_blocks * sizeof(*hashes));
    if (hashes == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    s->block_hashes = hashes;
    proto_block_hashes(s->tokens, n_blocks * t->tokens_per_block, t->tokens_per_block, hashes);
    for (size_t b = s->n_blocks; b < n_blocks; b++) {
        block_entry_t *e = malloc(sizeof(*e));
        block_entry_t **chain;
        if (e == NULL) {
            return TDM_ERR_NO_MEMORY;
        }
        chain = block_chain(t, hashes[b]);
        e->hash = hashes[b];
        e->s = s;
        e->block = b;
        e->next = *chain;
        *chain = e;
        s->n_blocks = b + 1;
        t->n_block_entries++;
    }
    grow_blocks(t);
    return TDM_OK;
}

tdm_status_t router_sessions_set_history(router_sessions_t *table, router_session_t *session,
                                         const int32_t *tokens, size_t n_tokens)
{
    size_t common;
    tdm_status_t status;

    status = reserve_tokens(session, n_tokens);
    if (status != TDM_OK) {
        return status;
    }
    common = router_common_prefix(session->tokens, session->n_tokens, tokens, n_tokens);
    unindex_from(table, session, common / table->tokens_per_block);
    if (n_tokens > common) {
        memcpy(session->tokens + common, tokens + common, (n_tokens - common) * sizeof(*tokens));
    }
    session->n_tokens = n_tokens;
    if (session->cached_len > common) {
        session->cached_len = common;
    }
    /* An index failure (out of memory) leaves fewer blocks indexed: a missed hint, not an
     * error. */
    index_new_blocks(table, session);
    return TDM_OK;
}

tdm_status_t router_sessions_append(router_sessions_t *table, router_session_t *session,
                                    const int32_t *tokens, size_t n_tokens)
{
    tdm_status_t status = reserve_tokens(session, session->n_tokens + n_tokens);

    if (status != TDM_OK) {
        return status;
    }
    memcpy(session->tokens + session->n_tokens, tokens, n_tokens * sizeof(*tokens));
    session->n_tokens += n_tokens;
    index_new_blocks(table, session);
    return TDM_OK;
}

size_t router_sessions_unplace_worker(router_sessions_t *table, int slot, uint64_t generation)
{
    size_t n = 0;

    for (size_t i = 0; i < table->n_sessions; i++) {
        router_session_t *s = table->all[i].s;
        if (s->worker_slot == slot && s->worker_generation == generation) {
            s->worker_slot = -1;
            s->worker_generation = 0;
            s->cached_len = 0;
            n++;
        }
    }
    return n;
}

size_t router_sessions_count(const router_sessions_t *table)
{
    return table->n_sessions;
}
