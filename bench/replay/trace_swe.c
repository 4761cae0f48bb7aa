/* trace_swe.c - SWE-agent .traj trajectories as chat sessions; see trace.h. */
#include "bench/replay/trace.h"

#include "common/json.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define SWE_CHARS_PER_TOKEN 4
#define SWE_PATH_BYTES      4096

static size_t content_chars(const json_t *message)
{
    const json_t *content = json_object_get(message, "content");
    size_t n = 0;

    if (json_is_string(content)) {
        return json_string_length(content);
    }
    if (json_is_array(content)) {
        size_t i;
        const json_t *part;
        json_array_foreach(content, i, part)
        {
            const json_t *text = json_object_get(part, "text");
            if (json_is_string(text)) {
                n += json_string_length(text);
            }
        }
    }
    return n;
}

/* The OpenAI-shaped message to send for one history entry (new reference), or NULL. */
static json_t *chat_message(const json_t *entry)
{
    const json_t *role = json_object_get(entry, "role");
    const json_t *content = json_object_get(entry, "content");
    const json_t *tool_calls = json_object_get(entry, "tool_calls");
    const json_t *call_ids = json_object_get(entry, "tool_call_ids");
    json_t *message = json_object();

    if (message == NULL) {
        return NULL;
    }
    if (json_object_set(message, "role", (json_t *)role) != 0 ||
        (content != NULL && !json_is_null(content)
             ? json_object_set(message, "content", (json_t *)content)
             : json_object_set_new(message, "content", json_string(""))) != 0) {
        json_decref(message);
        return NULL;
    }
    if (strcmp(json_string_value(role), "assistant") == 0 && json_is_array(tool_calls) &&
        json_array_size(tool_calls) > 0) {
        json_object_set(message, "tool_calls", (json_t *)tool_calls);
    }
    if (strcmp(json_string_value(role), "tool") == 0 && json_is_array(call_ids) &&
        json_is_string(json_array_get(call_ids, 0))) {
        json_object_set(message, "tool_call_id", json_array_get(call_ids, 0));
    }
    return message;
}

/* Builds one session from a parsed .traj document. */
static tdm_status_t session_from_traj(const json_t *root, const char *name,
                                      bench_session_t *session, char *err, size_t err_bytes)
{
    const json_t *history = json_object_get(root, "history");
    const json_t *stats = json_object_get(json_object_get(root, "info"), "model_stats");
    json_t *messages = NULL;
    size_t n_history;
    size_t n_replies = 0;
    size_t reply_chars = 0;
    size_t context_chars = 0;
    int64_t tokens_received = -1;
    int64_t api_calls = -1;
    size_t t = 0;
    tdm_status_t status = TDM_ERR_NO_MEMORY;

    memset(session, 0, sizeof(*session));
    session->tag_message = -1;
    if (!json_is_array(history) || json_array_size(history) == 0) {
        snprintf(err, err_bytes, "%s: no \"history\" array", name);
        return TDM_ERR_FORMAT;
    }
    n_history = json_array_size(history);
    for (size_t i = 0; i < n_history; i++) {
        const json_t *entry = json_array_get(history, i);
        const char *role = json_string_value(json_object_get(entry, "role"));
        if (!json_is_object(entry) || role == NULL) {
            snprintf(err, err_bytes, "%s: history[%zu] has no \"role\"", name, i);
            return TDM_ERR_FORMAT;
        }
        if (strcmp(role, "assistant") == 0 && i > 0) {
            n_replies++;
            reply_chars += content_chars(entry);
        }
        if (session->tag_message < 0 && strcmp(role, "user") == 0 &&
            !json_is_true(json_object_get(entry, "is_demo"))) {
            session->tag_message = (long)i;
        }
    }
    if (n_replies == 0) {
        snprintf(err, err_bytes, "%s: no assistant reply after the first message", name);
        return TDM_ERR_FORMAT;
    }
    if (json_is_object(stats)) {
        tdm_json_int_exact(json_object_get(stats, "tokens_received"), &tokens_received);
        tdm_json_int_exact(json_object_get(stats, "api_calls"), &api_calls);
    }

    session->id = strdup(name);
    session->turns = calloc(n_replies, sizeof(bench_turn_t));
    messages = json_array();
    if (session->id == NULL || session->turns == NULL || messages == NULL) {
        goto err_free_session;
    }
    for (size_t i = 0; i < n_history; i++) {
        const json_t *entry = json_array_get(history, i);
        const char *role = json_string_value(json_object_get(entry, "role"));
        json_t *message;

        if (strcmp(role, "assistant") == 0 && i > 0) {
            bench_turn_t *turn = &session->turns[t++];
            size_t chars = content_chars(entry);
            turn->timestamp_ms = -1;
            turn->delay_ms = -1;
            turn->gap_ms = -1;
            turn->messages = json_deep_copy(messages);
            if (turn->messages == NULL) {
                goto err_free_session;
            }
            turn->input_length = (int64_t)(context_chars / SWE_CHARS_PER_TOKEN) + 1;
            if (tokens_received > 0 && api_calls == (int64_t)n_replies && reply_chars > 0) {
                turn->output_length =
                    (int64_t)((double)tokens_received * (double)chars / (double)reply_chars + 0.5);
            } else {
                turn->output_length = (int64_t)(chars / SWE_CHARS_PER_TOKEN);
            }
            if (turn->output_length < 1) {
                turn->output_length = 1;
            }
        }
        message = chat_message(entry);
        if (message == NULL || json_array_append_new(messages, message) != 0) {
            goto err_free_session;
        }
        context_chars += content_chars(entry);
    }
    session->n_turns = t;
    json_decref(messages);
    return TDM_OK;

err_free_session:
    json_decref(messages);
    for (size_t i = 0; i < t; i++) {
        json_decref(session->turns[i].messages);
    }
    free(session->turns);
    free(session->id);
    memset(session, 0, sizeof(*session));
    snprintf(err, err_bytes, "%s: out of memory", name);
    return status;
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The .traj files to read: `path` itself, or the folder's *.traj sorted (caller frees). */
static tdm_status_t list_files(const char *path, char ***files_out, size_t *n_files_out, char *err,
                               size_t err_bytes)
{
    struct stat st;
    char **files = NULL;
    size_t n_files = 0;
    DIR *dir;
    struct dirent *ent;

    if (stat(path, &st) != 0) {
        snprintf(err, err_bytes, "%s: %s", path, strerror(errno));
        return errno == ENOENT ? TDM_ERR_NOT_FOUND : TDM_ERR_IO;
    }
    if (!S_ISDIR(st.st_mode)) {
        files = malloc(sizeof(char *));
        if (files == NULL || (files[0] = strdup(path)) == NULL) {
            free(files);
            return TDM_ERR_NO_MEMORY;
        }
        *files_out = files;
        *n_files_out = 1;
        return TDM_OK;
    }
    dir = opendir(path);
    if (dir == NULL) {
        snprintf(err, err_bytes, "%s: %s", path, strerror(errno));
        return TDM_ERR_IO;
    }
    while ((ent = readdir(dir)) != NULL) {
        size_t n = strlen(ent->d_name);
        char full[SWE_PATH_BYTES];
        char **grown;
        if (n < 5 || strcmp(ent->d_name + n - 5, ".traj") != 0) {
            continue;
        }
        snprintf(full, sizeof(full), "%s/%s", path, ent->d_name);
        grown = realloc(files, (n_files + 1) * sizeof(char *));
        if (grown == NULL || (grown[n_files] = strdup(full)) == NULL) {
            files = grown != NULL ? grown : files;
            for (size_t i = 0; i < n_files; i++) {
                free(files[i]);
            }
            free(files);
            closedir(dir);
            return TDM_ERR_NO_MEMORY;
        }
        files = grown;
        n_files++;
    }
    closedir(dir);
    if (n_files == 0) {
        snprintf(err, err_bytes, "%s: no .traj files", path);
        return TDM_ERR_NOT_FOUND;
    }
    qsort(files, n_files, sizeof(char *), compare_names);
    *files_out = files;
    *n_files_out = n_files;
    return TDM_OK;
}

tdm_status_t bench_trace_load_swe_agent(const char *path, bench_trace_t **trace_out, char *err,
                                        size_t err_bytes)
{
    char **files = NULL;
    size_t n_files = 0;
    bench_trace_t *trace;
    tdm_status_t status;

    status = list_files(path, &files, &n_files, err, err_bytes);
    if (status != TDM_OK) {
        return status;
    }
    trace = calloc(1, sizeof(*trace));
    if (trace == NULL || (trace->sessions = calloc(n_files, sizeof(bench_session_t))) == NULL) {
        free(trace);
        status = TDM_ERR_NO_MEMORY;
        goto free_files;
    }
    trace->format = BENCH_TRACE_SWE_AGENT;
    for (size_t f = 0; f < n_files; f++) {
        const char *base = strrchr(files[f], '/');
        json_t *root = NULL;

        status = tdm_json_load_file(files[f], &root, err, err_bytes);
        if (status != TDM_OK) {
            break;
        }
        status = session_from_traj(root, base != NULL ? base + 1 : files[f], &trace->sessions[f],
                                   err, err_bytes);
        json_decref(root);
        if (status != TDM_OK) {
            break;
        }
        trace->n_sessions++;
        trace->n_requests += trace->sessions[f].n_turns;
    }
    if (status != TDM_OK) {
        bench_trace_destroy(trace);
    } else {
        *trace_out = trace;
    }

free_files:
    for (size_t i = 0; i < n_files; i++) {
        free(files[i]);
    }
    free(files);
    return status;
}
