/* trace.c - Mooncake JSONL parsing and session rebuilding; see trace.h. */
#include "bench/replay/trace.h"

#include "bench/replay/u64map.h"
#include "common/buf.h"
#include "common/errbuf.h"
#include "common/hash.h"
#include "common/json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define TRACE_SESSION_ID_BYTES 64
#define TRACE_NO_SESSION       SIZE_MAX

/* One parsed line before sessions are known. */
typedef struct {
    bench_turn_t turn;
    char *session_id; /* from the trace, or NULL */
    size_t session;   /* assigned session index */
} raw_request_t;

/* Sessions while they are being assigned. */
typedef struct {
    size_t *latest;  /* latest request index per session */
    size_t *n_turns; /* turns per session */
    size_t *first;   /* first request index per session */
    size_t n_sessions;
    size_t capacity;
} session_table_t;

static void turn_fini(bench_turn_t *turn)
{
    free(turn->hash_ids);
    turn->hash_ids = NULL;
    turn->n_hash_ids = 0;
    if (turn->messages != NULL) {
        json_decref(turn->messages);
        turn->messages = NULL;
    }
}

void bench_trace_destroy(bench_trace_t *trace)
{
    if (trace == NULL) {
        return;
    }
    for (size_t s = 0; s < trace->n_sessions; s++) {
        bench_session_t *session = &trace->sessions[s];
        for (size_t t = 0; t < session->n_turns; t++) {
            turn_fini(&session->turns[t]);
        }
        free(session->turns);
        free(session->id);
    }
    free(trace->sessions);
    free(trace);
}

const char *bench_trace_format_name(bench_trace_format_t format)
{
    return format == BENCH_TRACE_SWE_AGENT ? "swe-agent" : "mooncake";
}

tdm_status_t bench_trace_format_parse(const char *text, const char *path,
                                      bench_trace_format_t *format_out)
{
    struct stat st;
    size_t n;

    if (text == NULL || strcmp(text, "auto") == 0) {
        if (path == NULL) {
            return TDM_ERR_INVALID_ARG;
        }
        n = strlen(path);
        if ((stat(path, &st) == 0 && S_ISDIR(st.st_mode)) ||
            (n >= 5 && strcmp(path + n - 5, ".traj") == 0)) {
            *format_out = BENCH_TRACE_SWE_AGENT;
        } else {
            *format_out = BENCH_TRACE_MOONCAKE;
        }
        return TDM_OK;
    }
    if (strcmp(text, "mooncake") == 0) {
        *format_out = BENCH_TRACE_MOONCAKE;
        return TDM_OK;
    }
    if (strcmp(text, "swe-agent") == 0) {
        *format_out = BENCH_TRACE_SWE_AGENT;
        return TDM_OK;
    }
    return TDM_ERR_INVALID_ARG;
}

/* Reads an optional integer field >= min; *value_out stays as given when absent. */
static tdm_status_t read_int(const json_t *obj, const char *key, int64_t min, int required,
                             int64_t *value_out, char *reason, size_t reason_bytes)
{
    const json_t *value = json_object_get(obj, key);
    int64_t v;

    if (value == NULL || json_is_null(value)) {
        if (required) {
            snprintf(reason, reason_bytes, "missing \"%s\"", key);
            return TDM_ERR_FORMAT;
        }
        return TDM_OK;
    }
    if (tdm_json_int_exact(value, &v) != TDM_OK) {
        snprintf(reason, reason_bytes, "\"%s\" is not an integer", key);
        return TDM_ERR_FORMAT;
    }
    if (v < min) {
        snprintf(reason, reason_bytes, "\"%s\" is %lld; must be >= %lld", key, (long long)v,
                 (long long)min);
        return TDM_ERR_FORMAT;
    }
    *value_out = v;
    return TDM_OK;
}

/* Fills `req` from one JSON object; on error writes the reason (no line prefix). */
static tdm_status_t parse_request(const json_t *obj, raw_request_t *req, char *reason,
                                  size_t reason_bytes)
{
    const json_t *ids;
    const json_t *sid;
    tdm_status_t status;

    memset(req, 0, sizeof(*req));
    req->turn.timestamp_ms = -1;
    req->turn.delay_ms = -1;
    req->turn.gap_ms = -1;
    req->session = TRACE_NO_SESSION;
    if (!json_is_object(obj)) {
        snprintf(reason, reason_bytes, "not a JSON object");
        return TDM_ERR_FORMAT;
    }
    status = read_int(obj, "timestamp", 0, 0, &req->turn.timestamp_ms, reason, reason_bytes);
    if (status == TDM_OK) {
        status = read_int(obj, "input_length", 1, 1, &req->turn.input_length, reason, reason_bytes);
    }
    if (status == TDM_OK) {
        status =
            read_int(obj, "output_length", 1, 1, &req->turn.output_length, reason, reason_bytes);
    }
    if (status == TDM_OK) {
        status = read_int(obj, "delay", 0, 0, &req->turn.delay_ms, reason, reason_bytes);
    }
    if (status != TDM_OK) {
        return status;
    }

    ids = json_object_get(obj, "hash_ids");
    if (ids != NULL && !json_is_null(ids)) {
        if (!json_is_array(ids)) {
            snprintf(reason, reason_bytes, "\"hash_ids\" is not an array");
            return TDM_ERR_FORMAT;
        }
        req->turn.n_hash_ids = json_array_size(ids);
        if (req->turn.n_hash_ids > 0) {
            req->turn.hash_ids = malloc(req->turn.n_hash_ids * sizeof(int64_t));
            if (req->turn.hash_ids == NULL) {
                return TDM_ERR_NO_MEMORY;
            }
        }
        for (size_t i = 0; i < req->turn.n_hash_ids; i++) {
            int64_t v;
            if (tdm_json_int_exact(json_array_get(ids, i), &v) != TDM_OK || v < 0) {
                snprintf(reason, reason_bytes, "\"hash_ids\"[%zu] is not an integer >= 0", i);
                turn_fini(&req->turn);
                return TDM_ERR_FORMAT;
            }
            req->turn.hash_ids[i] = v;
        }
    }

    sid = json_object_get(obj, "session_id");
    if (sid != NULL && !json_is_null(sid)) {
        char text[TRACE_SESSION_ID_BYTES];
        if (json_is_string(sid)) {
            req->session_id = strdup(json_string_value(sid));
        } else if (json_is_integer(sid)) {
            snprintf(text, sizeof(text), "%lld", (long long)json_integer_value(sid));
            req->session_id = strdup(text);
        } else {
            snprintf(reason, reason_bytes, "\"session_id\" is not a string or integer");
            turn_fini(&req->turn);
            return TDM_ERR_FORMAT;
        }
        if (req->session_id == NULL) {
            turn_fini(&req->turn);
            return TDM_ERR_NO_MEMORY;
        }
    }
    return TDM_OK;
}

static void raw_requests_free(raw_request_t *reqs, size_t n_reqs)
{
    for (size_t i = 0; i < n_reqs; i++) {
        turn_fini(&reqs[i].turn);
        free(reqs[i].session_id);
    }
    free(reqs);
}

static void session_table_fini(session_table_t *table)
{
    free(table->latest);
    free(table->n_turns);
    free(table->first);
    memset(table, 0, sizeof(*table));
}

static tdm_status_t session_table_add(session_table_t *table, size_t req_index, size_t *session_out)
{
    if (table->n_sessions == table->capacity) {
        /* three parallel arrays: each grows from the stored capacity, which is set at the end */
        size_t **arrays[] = {&table->latest, &table->n_turns, &table->first};
        size_t capacity = table->capacity;
        for (size_t i = 0; i < sizeof(arrays) / sizeof(arrays[0]); i++) {
            size_t *grown;
            capacity = table->capacity;
            grown =
                tdm_array_grow(*arrays[i], sizeof(*grown), table->n_sessions + 1, 64, &capacity);
            if (grown == NULL) {
                return TDM_ERR_NO_MEMORY;
            }
            *arrays[i] = grown;
        }
        table->capacity = capacity;
    }
    table->latest[table->n_sessions] = req_index;
    table->n_turns[table->n_sessions] = 1;
    table->first[table->n_sessions] = req_index;
    *session_out = table->n_sessions++;
    return TDM_OK;
}

static void session_table_extend(session_table_t *table, size_t session, size_t req_index)
{
    table->latest[session] = req_index;
    table->n_turns[session]++;
}

static uint64_t chain_step(uint64_t previous, int64_t id)
{
    return tdm_hash_xxh3_64_seeded(&id, sizeof(id), previous);
}

/* 1 when some block of ids[0..n) was first seen in `session`. */
static int prefix_owned_by(const bench_u64map_t *owners, const int64_t *ids, size_t n,
                           size_t session)
{
    for (size_t i = 0; i < n; i++) {
        size_t cursor = 0;
        uint64_t owner;
        if (bench_u64map_next(owners, (uint64_t)ids[i], &cursor, &owner) &&
            owner == (uint64_t)session) {
            return 1;
        }
    }
    return 0;
}

/*
 * The session that request `index` continues, or TRACE_NO_SESSION. `chain` holds the prefix
 * hashes of reqs[index] (chain[k-1] covers its first k ids). Longest shared prefix wins; ties go
 * to the most recent earlier request.
 */
static size_t find_parent(const raw_request_t *reqs, size_t index, const uint64_t *chain,
                          const bench_u64map_t *latest_keys, const bench_u64map_t *owners,
                          const session_table_t *table)
{
    const bench_turn_t *turn = &reqs[index].turn;

    for (size_t k = turn->n_hash_ids; k >= 1; k--) {
        size_t cursor = 0;
        uint64_t candidate;
        size_t best = TRACE_NO_SESSION;
        size_t best_req = 0;

        while (bench_u64map_next(latest_keys, chain[k - 1], &cursor, &candidate)) {
            const raw_request_t *prev = &reqs[candidate];
            size_t session = prev->session;
            size_t m = prev->turn.n_hash_ids;

            if (table->latest[session] != candidate || (k != m && k + 1 != m) ||
                turn->input_length <= prev->turn.input_length ||
                memcmp(prev->turn.hash_ids, turn->hash_ids, k * sizeof(int64_t)) != 0 ||
                !prefix_owned_by(owners, turn->hash_ids, k, session)) {
                continue;
            }
            if (best == TRACE_NO_SESSION || candidate > best_req) {
                best = session;
                best_req = candidate;
            }
        }
        if (best != TRACE_NO_SESSION) {
            return best;
        }
    }
    return TRACE_NO_SESSION;
}

/* Records request `index` as the latest turn of its session and its blocks' owners. */
static tdm_status_t index_request(const raw_request_t *reqs, size_t index, const uint64_t *chain,
                                  bench_u64map_t *latest_keys, bench_u64map_t *owners)
{
    const bench_turn_t *turn = &reqs[index].turn;
    size_t n = turn->n_hash_ids;
    tdm_status_t status;

    if (n == 0) {
        return TDM_OK;
    }
    status = bench_u64map_insert(latest_keys, chain[n - 1], index);
    if (status == TDM_OK && n >= 2) {
        status = bench_u64map_insert(latest_keys, chain[n - 2], index);
    }
    for (size_t i = 0; i < n && status == TDM_OK; i++) {
        size_t cursor = 0;
        uint64_t owner;
        if (!bench_u64map_next(owners, (uint64_t)turn->hash_ids[i], &cursor, &owner)) {
            status = bench_u64map_insert(owners, (uint64_t)turn->hash_ids[i], reqs[index].session);
        }
    }
    return status;
}

/* Gives every request a session: by session_id, else by prefix chain. */
static tdm_status_t assign_sessions(raw_request_t *reqs, size_t n_reqs, session_table_t *table,
                                    size_t *n_rebuilt_out)
{
    bench_u64map_t by_id = {0};
    bench_u64map_t latest_keys = {0};
    bench_u64map_t owners = {0};
    uint64_t *chain = NULL;
    size_t chain_capacity = 0;
    size_t n_rebuilt = 0;
    tdm_status_t status = TDM_OK;

    for (size_t i = 0; i < n_reqs && status == TDM_OK; i++) {
        raw_request_t *req = &reqs[i];
        size_t session = TRACE_NO_SESSION;

        if (req->session_id != NULL) {
            uint64_t key = tdm_hash_xxh3_64(req->session_id, strlen(req->session_id));
            size_t cursor = 0;
            uint64_t candidate;
            while (bench_u64map_next(&by_id, key, &cursor, &candidate)) {
                if (strcmp(reqs[table->first[candidate]].session_id, req->session_id) == 0) {
                    session = candidate;
                    break;
                }
            }
            if (session == TRACE_NO_SESSION) {
                status = session_table_add(table, i, &session);
                if (status == TDM_OK) {
                    status = bench_u64map_insert(&by_id, key, session);
                }
            } else {
                session_table_extend(table, session, i);
            }
            req->session = session;
            continue;
        }

        if (req->turn.n_hash_ids > chain_capacity) {
            uint64_t *grown = realloc(chain, req->turn.n_hash_ids * sizeof(uint64_t));
            if (grown == NULL) {
                status = TDM_ERR_NO_MEMORY;
                break;
            }
            chain = grown;
            chain_capacity = req->turn.n_hash_ids;
        }
        for (size_t k = 0; k < req->turn.n_hash_ids; k++) {
            chain[k] = chain_step(k == 0 ? 0 : chain[k - 1], req->turn.hash_ids[k]);
        }
        session = find_parent(reqs, i, chain, &latest_keys, &owners, table);
        if (session == TRACE_NO_SESSION) {
            status = session_table_add(table, i, &session);
            n_rebuilt++;
        } else {
            session_table_extend(table, session, i);
        }
        req->session = session;
        if (status == TDM_OK) {
            status = index_request(reqs, i, chain, &latest_keys, &owners);
        }
    }
    free(chain);
    bench_u64map_fini(&owners);
    bench_u64map_fini(&latest_keys);
    bench_u64map_fini(&by_id);
    *n_rebuilt_out = n_rebuilt;
    return status;
}

/* Moves the requests' turns into sessions (ownership of hash_ids passes to the trace). */
static tdm_status_t build_trace(raw_request_t *reqs, size_t n_reqs, const session_table_t *table,
                                size_t n_rebuilt, bench_trace_t **trace_out)
{
    bench_trace_t *trace = calloc(1, sizeof(*trace));

    if (trace == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    trace->format = BENCH_TRACE_MOONCAKE;
    trace->sessions = calloc(table->n_sessions, sizeof(bench_session_t));
    if (trace->sessions == NULL) {
        free(trace);
        return TDM_ERR_NO_MEMORY;
    }
    trace->n_sessions = table->n_sessions;
    for (size_t s = 0; s < table->n_sessions; s++) {
        bench_session_t *session = &trace->sessions[s];
        const raw_request_t *first = &reqs[table->first[s]];
        char id[TRACE_SESSION_ID_BYTES];

        session->tag_message = -1;
        session->turns = calloc(table->n_turns[s], sizeof(bench_turn_t));
        if (first->session_id != NULL) {
            session->id = strdup(first->session_id);
        } else {
            snprintf(id, sizeof(id), "r%zu", first->turn.line);
            session->id = strdup(id);
        }
        if (session->turns == NULL || session->id == NULL) {
            bench_trace_destroy(trace);
            return TDM_ERR_NO_MEMORY;
        }
    }
    for (size_t i = 0; i < n_reqs; i++) {
        bench_session_t *session = &trace->sessions[reqs[i].session];
        bench_turn_t *turn = &session->turns[session->n_turns];

        *turn = reqs[i].turn;
        memset(&reqs[i].turn, 0, sizeof(reqs[i].turn));
        if (session->n_turns > 0) {
            const bench_turn_t *prev = &session->turns[session->n_turns - 1];
            if (prev->timestamp_ms >= 0 && turn->timestamp_ms >= 0) {
                turn->gap_ms = turn->timestamp_ms - prev->timestamp_ms;
                if (turn->gap_ms < 0) {
                    turn->gap_ms = 0;
                }
            }
        }
        session->n_turns++;
    }
    trace->n_requests = n_reqs;
    trace->n_rebuilt_sessions = n_rebuilt;
    *trace_out = trace;
    return TDM_OK;
}

tdm_status_t bench_trace_parse_mooncake(const char *text, size_t n_bytes, const char *what,
                                        bench_trace_t **trace_out, char *err, size_t err_bytes)
{
    raw_request_t *reqs = NULL;
    size_t n_reqs = 0;
    size_t capacity = 0;
    size_t line = 0;
    size_t pos = 0;
    session_table_t table = {0};
    size_t n_rebuilt = 0;
    tdm_status_t status = TDM_OK;

    while (pos < n_bytes) {
        const char *start = text + pos;
        const char *newline = memchr(start, '\n', n_bytes - pos);
        size_t n_line = newline != NULL ? (size_t)(newline - start) : n_bytes - pos;
        size_t n_blank = 0;
        json_error_t jerr;
        json_t *obj;
        char reason[256];

        pos += n_line + (newline != NULL ? 1 : 0);
        line++;
        if (n_line > 0 && start[n_line - 1] == '\r') {
            n_line--;
        }
        while (n_blank < n_line && (start[n_blank] == ' ' || start[n_blank] == '\t')) {
            n_blank++;
        }
        if (n_blank == n_line) {
            continue;
        }
        obj = json_loadb(start, n_line, JSON_DECODE_ANY, &jerr);
        if (obj == NULL) {
            tdm_errbuf_set(err, err_bytes, "%s:%zu: bad JSON: %s", what, line, jerr.text);
            status = TDM_ERR_FORMAT;
            goto free_requests;
        }
        if (n_reqs == capacity) {
            raw_request_t *grown = tdm_array_grow(reqs, sizeof(*grown), n_reqs + 1, 256, &capacity);
            if (grown == NULL) {
                json_decref(obj);
                status = TDM_ERR_NO_MEMORY;
                goto free_requests;
            }
            reqs = grown;
        }
        status = parse_request(obj, &reqs[n_reqs], reason, sizeof(reason));
        json_decref(obj);
        if (status != TDM_OK) {
            tdm_errbuf_set(err, err_bytes, "%s:%zu: %s", what, line, reason);
            goto free_requests;
        }
        reqs[n_reqs].turn.line = line;
        n_reqs++;
    }
    if (n_reqs == 0) {
        tdm_errbuf_set(err, err_bytes, "%s: no requests", what);
        status = TDM_ERR_FORMAT;
        goto free_requests;
    }

    status = assign_sessions(reqs, n_reqs, &table, &n_rebuilt);
    if (status != TDM_OK) {
        goto fini_table;
    }
    status = build_trace(reqs, n_reqs, &table, n_rebuilt, trace_out);

fini_table:
    session_table_fini(&table);
free_requests:
    raw_requests_free(reqs, n_reqs);
    return status;
}

tdm_status_t bench_trace_load(const char *path, bench_trace_format_t format,
                              bench_trace_t **trace_out, char *err, size_t err_bytes)
{
    tdm_buf_t text = {0};
    tdm_status_t status;

    if (format == BENCH_TRACE_SWE_AGENT) {
        return bench_trace_load_swe_agent(path, trace_out, err, err_bytes);
    }
    status = tdm_buf_read_file(&text, path);
    if (status != TDM_OK) {
        tdm_errbuf_set(err, err_bytes, "%s: %s", path,
                       status == TDM_ERR_NOT_FOUND ? "no such file" : tdm_status_message(status));
        return status;
    }
    status = bench_trace_parse_mooncake(text.data, text.n_bytes, path, trace_out, err, err_bytes);
    tdm_buf_fini(&text);
    return status;
}
