#include "engine/weights.h"

#include "common/buf.h"
#include "common/errbuf.h"
#include "common/hash.h"
#include "common/json.h"
#include "common/log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NO_ENTRY           SIZE_MAX
#define PROBLEM_TEXT_BYTES 512 /* one check problem */
#define MIN_HASH_SLOTS     16
#define SHARD_NAME_BYTES   64 /* "model-00001-of-00002.safetensors" */

typedef struct {
    const engine_st_tensor_t *tensor;
    uint32_t shard;
} entry_t;

/* One weight_map entry; name borrowed from the parsed index. */
typedef struct {
    const char *name;
    uint32_t shard;
} index_entry_t;

struct engine_weights {
    char *dir;
    engine_st_file_t **shards;
    char **shard_names; /* file names inside dir */
    size_t n_shards;
    entry_t *entries; /* every tensor, sorted by name */
    size_t n_entries;
    uint32_t *slots; /* hash table: entry index + 1, 0 = empty */
    size_t slot_mask;
    uint64_t total_bytes;
};

static const char *const scale_alias_suffixes[] = {".weight.scale", ".weight_scale_inv"};
#define SCALE_SUFFIX ".scale"

/* "dir/name", malloc'd (NULL when out of memory). */
static char *join_path(const char *dir, const char *name)
{
    size_t n_bytes = strlen(dir) + strlen(name) + 2;
    char *path = malloc(n_bytes);

    if (path != NULL) {
        snprintf(path, n_bytes, "%s/%s", dir, name);
    }
    return path;
}

static int file_exists(const char *path)
{
    struct stat st;

    return stat(path, &st) == 0;
}

/* ---- name table ------------------------------------------------------------------------ */

static int compare_entries(const void *a, const void *b)
{
    const entry_t *ea = a;
    const entry_t *eb = b;

    return strcmp(ea->tensor->name, eb->tensor->name);
}

static size_t lookup(const engine_weights_t *weights, const char *name)
{
    size_t slot;

    if (weights->slots == NULL) {
        return NO_ENTRY;
    }
    slot = (size_t)tdm_hash_xxh3_64(name, strlen(name)) & weights->slot_mask;
    while (weights->slots[slot] != 0) {
        size_t index = weights->slots[slot] - 1;
        if (strcmp(weights->entries[index].tensor->name, name) == 0) {
            return index;
        }
        slot = (slot + 1) & weights->slot_mask;
    }
    return NO_ENTRY;
}

/* Sorts the entries, rejects a name held by two shards, and builds the hash table. */
static tdm_status_t build_table(engine_weights_t *weights, char *err, size_t err_bytes)
{
    size_t n_slots = MIN_HASH_SLOTS;

    if (weights->n_entries >= UINT32_MAX / 2) {
        tdm_errbuf_set(err, err_bytes, "%s: %zu tensors are more than supported", weights->dir,
                       weights->n_entries);
        return TDM_ERR_UNSUPPORTED;
    }
    if (weights->n_entries > 1) {
        qsort(weights->entries, weights->n_entries, sizeof(*weights->entries), compare_entries);
    }
    for (size_t i = 1; i < weights->n_entries; i++) {
        const entry_t *a = &weights->entries[i - 1];
        const entry_t *b = &weights->entries[i];
        if (strcmp(a->tensor->name, b->tensor->name) == 0) {
            tdm_errbuf_set(err, err_bytes, "%s: tensor '%s' is in both shard %s and shard %s",
                           weights->dir, a->tensor->name, weights->shard_names[a->shard],
                           weights->shard_names[b->shard]);
            return TDM_ERR_MISMATCH;
        }
    }
    while (n_slots < 2 * weights->n_entries) {
        n_slots *= 2;
    }
    weights->slots = calloc(n_slots, sizeof(*weights->slots));
    if (weights->slots == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    weights->slot_mask = n_slots - 1;
    for (size_t i = 0; i < weights->n_entries; i++) {
        const char *name = weights->entries[i].tensor->name;
        size_t slot = (size_t)tdm_hash_xxh3_64(name, strlen(name)) & weights->slot_mask;
        while (weights->slots[slot] != 0) {
            slot = (slot + 1) & weights->slot_mask;
        }
        weights->slots[slot] = (uint32_t)(i + 1);
    }
    return TDM_OK;
}

/* Appends every tensor of every open shard to weights->entries. */
static tdm_status_t collect_entries(engine_weights_t *weights)
{
    size_t n_entries = 0;

    for (size_t s = 0; s < weights->n_shards; s++) {
        n_entries += engine_st_file_n_tensors(weights->shards[s]);
    }
    weights->entries = calloc(n_entries > 0 ? n_entries : 1, sizeof(*weights->entries));
    if (weights->entries == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    for (size_t s = 0; s < weights->n_shards; s++) {
        size_t n = engine_st_file_n_tensors(weights->shards[s]);
        for (size_t i = 0; i < n; i++) {
            entry_t *entry = &weights->entries[weights->n_entries++];
            entry->tensor = engine_st_file_tensor_at(weights->shards[s], i);
            entry->shard = (uint32_t)s;
            weights->total_bytes += entry->tensor->n_bytes;
        }
    }
    return TDM_OK;
}

/* ---- open ------------------------------------------------------------------------------ */

/* Index of shard file `name`, added (not yet opened) when new; NO_ENTRY when out of memory. */
static size_t shard_slot(engine_weights_t *weights, const char *name, size_t *cap)
{
    char **grown_names;
    engine_st_file_t **grown_shards;

    for (size_t s = weights->n_shards; s > 0; s--) {
        if (strcmp(weights->shard_names[s - 1], name) == 0) {
            return s - 1;
        }
    }
    if (weights->n_shards == *cap) {
        size_t cap_names = *cap;
        size_t cap_shards = *cap;
        grown_names = tdm_array_grow(weights->shard_names, sizeof(*grown_names),
                                     weights->n_shards + 1, 8, &cap_names);
        if (grown_names == NULL) {
            return NO_ENTRY;
        }
        weights->shard_names = grown_names;
        grown_shards = tdm_array_grow(weights->shards, sizeof(*grown_shards), weights->n_shards + 1,
                                      8, &cap_shards);
        if (grown_shards == NULL) {
            return NO_ENTRY;
        }
        weights->shards = grown_shards;
        *cap = cap_shards; /* both arrays now hold at least this many */
    }
    weights->shard_names[weights->n_shards] = strdup(name);
    if (weights->shard_names[weights->n_shards] == NULL) {
        return NO_ENTRY;
    }
    weights->shards[weights->n_shards] = NULL;
    return weights->n_shards++;
}

static int shard_name_valid(const json_t *value)
{
    const char *name;

    if (!json_is_string(value)) {
        return 0;
    }
    name = json_string_value(value);
    return name[0] != '\0' && strlen(name) == json_string_length(value) &&
           strchr(name, '/') == NULL && strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
}

/* Opens shard s; `example` is a tensor the index places there (for the message). */
static tdm_status_t open_shard(engine_weights_t *weights, size_t s, const char *index_path,
                               const char *example, char *err, size_t err_bytes)
{
    char *path = join_path(weights->dir, weights->shard_names[s]);
    tdm_status_t status;

    if (path == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    if (example != NULL && !file_exists(path)) {
        tdm_errbuf_set(err, err_bytes,
                       "%s: weight_map maps '%s' to shard %s, which does not exist (%s)",
                       index_path, example, weights->shard_names[s], path);
        free(path);
        return TDM_ERR_NOT_FOUND;
    }
    status = engine_st_file_open(path, &weights->shards[s], err, err_bytes);
    free(path);
    return status;
}

/* Reads and validates index metadata.total_size into *total_size_out (-1 when absent). */
static tdm_status_t read_total_size(const json_t *root, const char *index_path,
                                    int64_t *total_size_out, char *err, size_t err_bytes)
{
    const json_t *metadata = json_object_get(root, "metadata");
    const json_t *total;

    *total_size_out = -1;
    if (metadata == NULL || json_is_null(metadata)) {
        return TDM_OK;
    }
    if (!json_is_object(metadata)) {
        tdm_errbuf_set(err, err_bytes, "%s: \"metadata\" is not an object", index_path);
        return TDM_ERR_FORMAT;
    }
    total = json_object_get(metadata, "total_size");
    if (total == NULL) {
        return TDM_OK;
    }
    if (tdm_json_int_exact(total, total_size_out) != TDM_OK || *total_size_out < 0) {
        tdm_errbuf_set(err, err_bytes, "%s: metadata.total_size is not a non-negative integer",
                       index_path);
        return TDM_ERR_FORMAT;
    }
    return TDM_OK;
}

/* Checks every weight_map entry against the shards and every shard tensor against the index. */
static tdm_status_t match_index(engine_weights_t *weights, const index_entry_t *index_entries,
                                size_t n_index_entries, const char *index_path, char *err,
                                size_t err_bytes)
{
    unsigned char *seen = calloc(weights->n_entries > 0 ? weights->n_entries : 1, 1);
    tdm_status_t status = TDM_OK;

    if (seen == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    for (size_t k = 0; k < n_index_entries; k++) {
        const index_entry_t *ie = &index_entries[k];
        size_t index = lookup(weights, ie->name);
        if (index == NO_ENTRY) {
            tdm_errbuf_set(err, err_bytes,
                           "%s: '%s': the index maps it to shard %s, which does not hold it",
                           index_path, ie->name, weights->shard_names[ie->shard]);
            status = TDM_ERR_MISMATCH;
            goto out_free_seen;
        }
        if (weights->entries[index].shard != ie->shard) {
            tdm_errbuf_set(err, err_bytes,
                           "%s: '%s': the index maps it to shard %s but it is in %s", index_path,
                           ie->name, weights->shard_names[ie->shard],
                           weights->shard_names[weights->entries[index].shard]);
            status = TDM_ERR_MISMATCH;
            goto out_free_seen;
        }
        seen[index] = 1;
    }
    for (size_t i = 0; i < weights->n_entries; i++) {
        if (!seen[i]) {
            tdm_errbuf_set(err, err_bytes, "%s: '%s' is in shard %s but not in the index",
                           index_path, weights->entries[i].tensor->name,
                           weights->shard_names[weights->entries[i].shard]);
            status = TDM_ERR_MISMATCH;
            goto out_free_seen;
        }
    }

out_free_seen:
    free(seen);
    return status;
}

/* Reads weight_map into index_entries (one per key, in file order) and the shard names. */
static tdm_status_t read_weight_map(engine_weights_t *weights, const json_t *weight_map,
                                    const char *index_path, index_entry_t *index_entries, char *err,
                                    size_t err_bytes)
{
    size_t cap_shards = 0;
    size_t k = 0;

    for (void *it = json_object_iter((json_t *)weight_map); it != NULL;
         it = json_object_iter_next((json_t *)weight_map, it)) {
        const char *name = json_object_iter_key(it);
        const json_t *value = json_object_iter_value(it);
        size_t s;
        if (!shard_name_valid(value)) {
            tdm_errbuf_set(err, err_bytes, "%s: weight_map['%s'] is not a shard file name in %s",
                           index_path, name, weights->dir);
            return TDM_ERR_FORMAT;
        }
        s = shard_slot(weights, json_string_value(value), &cap_shards);
        if (s == NO_ENTRY) {
            return TDM_ERR_NO_MEMORY;
        }
        index_entries[k].name = name;
        index_entries[k].shard = (uint32_t)s;
        k++;
    }
    return TDM_OK;
}

static tdm_status_t open_indexed(engine_weights_t *weights, const char *index_path, char *err,
                                 size_t err_bytes)
{
    json_t *root = NULL;
    const json_t *weight_map;
    index_entry_t *index_entries = NULL;
    size_t n_index_entries;
    const char **first_name = NULL; /* per shard: a tensor the index places there */
    int64_t total_size;
    tdm_status_t status;

    status = tdm_json_load_file(index_path, &root, err, err_bytes);
    if (status != TDM_OK) {
        return status;
    }
    weight_map = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(weight_map) || json_object_size(weight_map) == 0) {
        tdm_errbuf_set(err, err_bytes, "%s: \"weight_map\" missing, not an object or empty",
                       index_path);
        status = TDM_ERR_FORMAT;
        goto out_free;
    }
    status = read_total_size(root, index_path, &total_size, err, err_bytes);
    if (status != TDM_OK) {
        goto out_free;
    }
    n_index_entries = json_object_size(weight_map);
    index_entries = calloc(n_index_entries, sizeof(*index_entries));
    if (index_entries == NULL) {
        status = TDM_ERR_NO_MEMORY;
        goto out_free;
    }
    status = read_weight_map(weights, weight_map, index_path, index_entries, err, err_bytes);
    if (status != TDM_OK) {
        goto out_free;
    }
    first_name = calloc(weights->n_shards, sizeof(*first_name));
    if (first_name == NULL) {
        status = TDM_ERR_NO_MEMORY;
        goto out_free;
    }
    for (size_t k = n_index_entries; k > 0; k--) {
        first_name[index_entries[k - 1].shard] = index_entries[k - 1].name;
    }
    for (size_t s = 0; s < weights->n_shards; s++) {
        status = open_shard(weights, s, index_path, first_name[s], err, err_bytes);
        if (status != TDM_OK) {
            goto out_free;
        }
    }

    status = collect_entries(weights);
    if (status == TDM_OK) {
        status = build_table(weights, err, err_bytes);
    }
    if (status == TDM_OK) {
        status = match_index(weights, index_entries, n_index_entries, index_path, err, err_bytes);
    }
    if (status == TDM_OK && total_size >= 0 && (uint64_t)total_size != weights->total_bytes) {
        tdm_log(TDM_LOG_WARN, "weights",
                "index total_size differs from the tensors: path=%s total_size=%lld "
                "tensor_bytes=%llu",
                index_path, (long long)total_size, (unsigned long long)weights->total_bytes);
    }

out_free:
    free(first_name);
    free(index_entries);
    json_decref(root);
    return status;
}

static tdm_status_t open_single(engine_weights_t *weights, char *err, size_t err_bytes)
{
    size_t cap_shards = 0;
    tdm_status_t status;

    if (shard_slot(weights, ENGINE_WEIGHTS_SINGLE_FILE, &cap_shards) == NO_ENTRY) {
        return TDM_ERR_NO_MEMORY;
    }
    status = open_shard(weights, 0, NULL, NULL, err, err_bytes);
    if (status == TDM_OK) {
        status = collect_entries(weights);
    }
    if (status == TDM_OK) {
        status = build_table(weights, err, err_bytes);
    }
    return status;
}

tdm_status_t engine_weights_open(const char *dir, engine_weights_t **weights_out, char *err,
                                 size_t err_bytes)
{
    engine_weights_t *weights;
    char *index_path = NULL;
    char *single_path = NULL;
    tdm_status_t status;

    if (dir == NULL || weights_out == NULL) {
        tdm_errbuf_set(err, err_bytes, "engine_weights_open: dir and weights_out are required");
        return TDM_ERR_INVALID_ARG;
    }
    weights = calloc(1, sizeof(*weights));
    if (weights == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    weights->dir = strdup(dir);
    index_path = join_path(dir, ENGINE_WEIGHTS_INDEX_FILE);
    single_path = join_path(dir, ENGINE_WEIGHTS_SINGLE_FILE);
    if (weights->dir == NULL || index_path == NULL || single_path == NULL) {
        status = TDM_ERR_NO_MEMORY;
        goto err_close;
    }
    if (file_exists(index_path)) {
        status = open_indexed(weights, index_path, err, err_bytes);
    } else if (file_exists(single_path)) {
        status = open_single(weights, err, err_bytes);
    } else {
        tdm_errbuf_set(err, err_bytes, "%s: neither %s nor %s exists", dir,
                       ENGINE_WEIGHTS_INDEX_FILE, ENGINE_WEIGHTS_SINGLE_FILE);
        status = TDM_ERR_NOT_FOUND;
    }
    if (status != TDM_OK) {
        goto err_close;
    }
    free(single_path);
    free(index_path);
    tdm_log(TDM_LOG_INFO, "weights", "checkpoint opened: dir=%s shards=%zu tensors=%zu bytes=%llu",
            dir, weights->n_shards, weights->n_entries, (unsigned long long)weights->total_bytes);
    *weights_out = weights;
    return TDM_OK;

err_close:
    if (status == TDM_ERR_NO_MEMORY) {
        tdm_errbuf_set(err, err_bytes, "%s: out of memory", dir);
    }
    free(single_path);
    free(index_path);
    engine_weights_close(weights);
    return status;
}

void engine_weights_close(engine_weights_t *weights)
{
    if (weights == NULL) {
        return;
    }
    for (size_t s = 0; s < weights->n_shards; s++) {
        engine_st_file_close(weights->shards[s]);
        free(weights->shard_names[s]);
    }
    free(weights->shards);
    free(weights->shard_names);
    free(weights->entries);
    free(weights->slots);
    free(weights->dir);
    free(weights);
}

size_t engine_weights_n_tensors(const engine_weights_t *weights)
{
    return weights->n_entries;
}

const engine_st_tensor_t *engine_weights_tensor_at(const engine_weights_t *weights, size_t i)
{
    if (i >= weights->n_entries) {
        return NULL;
    }
    return weights->entries[i].tensor;
}

tdm_status_t engine_weights_copy_resident(engine_weights_t *weights, uint64_t *huge_bytes_out,
                                          char *err, size_t err_bytes)
{
    uint64_t total = 0;

    if (weights == NULL) {
        tdm_errbuf_set(err, err_bytes, "engine_weights_copy_resident: weights is required");
        return TDM_ERR_INVALID_ARG;
    }
    for (size_t s = 0; s < weights->n_shards; s++) {
        uint64_t huge = 0;
        tdm_status_t st = engine_st_file_copy_resident(weights->shards[s], &huge, err, err_bytes);
        if (st != TDM_OK) {
            return st;
        }
        total += huge;
    }
    if (huge_bytes_out != NULL) {
        *huge_bytes_out = total;
    }
    return TDM_OK;
}

size_t engine_weights_n_shards(const engine_weights_t *weights)
{
    return weights->n_shards;
}

uint64_t engine_weights_total_bytes(const engine_weights_t *weights)
{
    return weights->total_bytes;
}

/* ---- find and check -------------------------------------------------------------------- */

/* Entry index of `name`, trying the MODEL.md 12.2 scale aliases; NO_ENTRY if absent. */
static size_t find_entry(const engine_weights_t *weights, const char *name)
{
    char alias[ENGINE_WEIGHTS_ALIAS_NAME_BYTES];
    size_t name_bytes;
    size_t module_bytes;
    size_t index = lookup(weights, name);

    if (index != NO_ENTRY) {
        return index;
    }
    name_bytes = strlen(name);
    if (name_bytes <= strlen(SCALE_SUFFIX) ||
        strcmp(name + name_bytes - strlen(SCALE_SUFFIX), SCALE_SUFFIX) != 0) {
        return NO_ENTRY;
    }
    module_bytes = name_bytes - strlen(SCALE_SUFFIX);
    for (size_t a = 0; a < sizeof(scale_alias_suffixes) / sizeof(scale_alias_suffixes[0]); a++) {
        const char *suffix = scale_alias_suffixes[a];
        if (module_bytes + strlen(suffix) + 1 > sizeof(alias)) {
            return NO_ENTRY;
        }
        memcpy(alias, name, module_bytes);
        memcpy(alias + module_bytes, suffix, strlen(suffix) + 1);
        index = lookup(weights, alias);
        if (index != NO_ENTRY) {
            return index;
        }
    }
    return NO_ENTRY;
}

const engine_st_tensor_t *engine_weights_find(const engine_weights_t *weights, const char *name)
{
    size_t index = find_entry(weights, name);

    return index == NO_ENTRY ? NULL : weights->entries[index].tensor;
}

static int has_prefix(const char *name, const char *prefix)
{
    return strncmp(name, prefix, strlen(prefix)) == 0;
}

int engine_weights_name_is_vision(const char *name)
{
    static const char *const prefixes[] = {"vision.", "aligner.", "image_start", "image_end",
                                           "image_newline"};
    static const char bias_vl_suffix[] = ".ffn.gate.bias_vl";
    size_t name_bytes = strlen(name);

    for (size_t p = 0; p < sizeof(prefixes) / sizeof(prefixes[0]); p++) {
        if (has_prefix(name, prefixes[p])) {
            return 1;
        }
    }
    return name_bytes >= sizeof(bias_vl_suffix) - 1 &&
           strcmp(name + name_bytes - (sizeof(bias_vl_suffix) - 1), bias_vl_suffix) == 0;
}

/* Collects check problems: the first one's status and text, and a count. */
typedef struct {
    tdm_status_t first_status;
    char first_text[PROBLEM_TEXT_BYTES];
    size_t n_problems;
} problems_t;

static void add_problem(problems_t *problems, tdm_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void add_problem(problems_t *problems, tdm_status_t status, const char *fmt, ...)
{
    char text[PROBLEM_TEXT_BYTES];
    va_list args;

    va_start(args, fmt);
    vsnprintf(text, sizeof(text), fmt, args);
    va_end(args);
    tdm_log(TDM_LOG_ERROR, "weights", "checkpoint check: %s", text);
    if (problems->n_problems == 0) {
        problems->first_status = status;
        memcpy(problems->first_text, text, sizeof(text));
    }
    problems->n_problems++;
}

static int spec_dtype_matches(const engine_tensor_spec_t *spec, engine_dtype_t dtype)
{
    if ((spec->flags & ENGINE_SPEC_FP4_PACKED) != 0) {
        return dtype == ENGINE_DTYPE_I8 || dtype == ENGINE_DTYPE_U8;
    }
    return dtype == spec->dtype;
}

static int shape_matches(const engine_tensor_spec_t *spec, const engine_st_tensor_t *t)
{
    if (spec->n_dims != t->n_dims) {
        return 0;
    }
    for (int d = 0; d < spec->n_dims; d++) {
        if (spec->shape[d] != t->shape[d]) {
            return 0;
        }
    }
    return 1;
}

/* Checks one spec; marks the entry it matched in `used`. */
static void check_spec(const engine_weights_t *weights, const engine_tensor_spec_t *spec,
                       unsigned char *used, problems_t *problems)
{
    char have[ENGINE_ST_SHAPE_TEXT_BYTES];
    char want[ENGINE_ST_SHAPE_TEXT_BYTES];
    const engine_st_tensor_t *t;
    size_t index;

    if (memchr(spec->name, '\0', sizeof(spec->name)) == NULL ||
        engine_dtype_size_bytes(spec->dtype) == 0 || spec->n_dims < 0 ||
        spec->n_dims > ENGINE_TENSOR_MAX_DIMS) {
        add_problem(problems, TDM_ERR_INVALID_ARG, "%.*s: malformed spec (dtype %d, n_dims %d)",
                    (int)sizeof(spec->name) - 1, spec->name, (int)spec->dtype, spec->n_dims);
        return;
    }
    index = find_entry(weights, spec->name);
    if (index == NO_ENTRY) {
        add_problem(problems, TDM_ERR_NOT_FOUND, "%s: missing from the checkpoint", spec->name);
        return;
    }
    t = weights->entries[index].tensor;
    if (used[index]) {
        add_problem(problems, TDM_ERR_INVALID_ARG, "%s: listed by two specs", spec->name);
        return;
    }
    used[index] = 1;
    if (!spec_dtype_matches(spec, t->dtype)) {
        add_problem(problems, TDM_ERR_MISMATCH, "%s: dtype %s expected %s", t->name,
                    engine_dtype_name(t->dtype),
                    (spec->flags & ENGINE_SPEC_FP4_PACKED) != 0 ? "I8 or U8 (packed FP4)"
                                                                : engine_dtype_name(spec->dtype));
    }
    if (!shape_matches(spec, t)) {
        engine_st_shape_format(t->n_dims, t->shape, have, sizeof(have));
        engine_st_shape_format(spec->n_dims, spec->shape, want, sizeof(want));
        add_problem(problems, TDM_ERR_MISMATCH, "%s: shape %s expected %s", t->name, have, want);
    }
}

tdm_status_t engine_weights_check(const engine_weights_t *weights,
                                  const engine_tensor_spec_t *specs, size_t n_specs, char *err,
                                  size_t err_bytes)
{
    unsigned char *used;
    problems_t problems;

    if (weights == NULL || (specs == NULL && n_specs > 0)) {
        tdm_errbuf_set(err, err_bytes, "engine_weights_check: weights and specs are required");
        return TDM_ERR_INVALID_ARG;
    }
    used = calloc(weights->n_entries > 0 ? weights->n_entries : 1, 1);
    if (used == NULL) {
        tdm_errbuf_set(err, err_bytes, "%s: out of memory", weights->dir);
        return TDM_ERR_NO_MEMORY;
    }
    memset(&problems, 0, sizeof(problems));
    for (size_t i = 0; i < n_specs; i++) {
        check_spec(weights, &specs[i], used, &problems);
    }
    for (size_t i = 0; i < weights->n_entries; i++) {
        const char *name = weights->entries[i].tensor->name;
        if (!used[i] && !engine_weights_name_is_vision(name)) {
            add_problem(&problems, TDM_ERR_MISMATCH, "%s: in the checkpoint but not expected",
                        name);
        }
    }
    free(used);
    if (problems.n_problems == 0) {
        return TDM_OK;
    }
    if (problems.n_problems == 1) {
        tdm_errbuf_set(err, err_bytes, "%s", problems.first_text);
    } else {
        tdm_errbuf_set(err, err_bytes, "%s (and %zu more problems, all logged)",
                       problems.first_text, problems.n_problems - 1);
    }
    return problems.first_status;
}

/* ---- sharded writer -------------------------------------------------------------------- */

static int compare_tensor_ptr_names(const void *a, const void *b)
{
    const engine_st_tensor_t *ta = *(const engine_st_tensor_t *const *)a;
    const engine_st_tensor_t *tb = *(const engine_st_tensor_t *const *)b;

    return strcmp(ta->name, tb->name);
}

/* Checks one writer input record; the writer checks again, this names the problem in err. */
static tdm_status_t validate_record(const engine_st_tensor_t *t, char *err, size_t err_bytes)
{
    uint64_t n_bytes;

    if (t->name == NULL || t->name[0] == '\0') {
        tdm_errbuf_set(err, err_bytes, "write_sharded: a tensor has no name");
        return TDM_ERR_INVALID_ARG;
    }
    if (engine_st_shape_bytes(t->dtype, t->n_dims, t->shape, &n_bytes) != TDM_OK) {
        tdm_errbuf_set(err, err_bytes, "%s: bad dtype %d, n_dims %d or shape", t->name,
                       (int)t->dtype, t->n_dims);
        return TDM_ERR_INVALID_ARG;
    }
    if (n_bytes != t->n_bytes || (t->data == NULL && t->n_bytes > 0)) {
        tdm_errbuf_set(err, err_bytes, "%s: n_bytes %zu but shape and dtype need %llu", t->name,
                       t->n_bytes, (unsigned long long)n_bytes);
        return TDM_ERR_INVALID_ARG;
    }
    return TDM_OK;
}

static tdm_status_t write_shard(const char *path, const engine_st_tensor_t *const *sorted,
                                size_t begin, size_t end, char *err, size_t err_bytes)
{
    engine_st_writer_t *writer = NULL;
    tdm_status_t status;

    status = engine_st_writer_create(path, &writer);
    for (size_t i = begin; i < end && status == TDM_OK; i++) {
        const engine_st_tensor_t *t = sorted[i];
        status = engine_st_writer_add(writer, t->name, t->dtype, t->n_dims, t->shape, t->data,
                                      t->n_bytes);
    }
    if (status == TDM_OK) {
        status = engine_st_writer_finish(writer);
    }
    engine_st_writer_destroy(writer);
    if (status != TDM_OK) {
        tdm_errbuf_set(err, err_bytes, "%s: write failed: %s (details logged)", path,
                       tdm_status_name(status));
    }
    return status;
}

/* Writes text to path via a temporary file and rename. */
static tdm_status_t write_text_file(const char *path, const char *text, char *err, size_t err_bytes)
{
    size_t tmp_bytes = strlen(path) + 32;
    char *tmp_path = malloc(tmp_bytes);
    FILE *f;
    int failed;

    if (tmp_path == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    snprintf(tmp_path, tmp_bytes, "%s.tmp.%ld", path, (long)getpid());
    f = fopen(tmp_path, "wb");
    if (f == NULL) {
        tdm_errbuf_set(err, err_bytes, "%s: cannot create: %s", tmp_path, strerror(errno));
        free(tmp_path);
        return TDM_ERR_IO;
    }
    failed = fputs(text, f) == EOF;
    failed = fclose(f) != 0 || failed;
    failed = failed || rename(tmp_path, path) != 0;
    if (failed) {
        tdm_errbuf_set(err, err_bytes, "%s: write failed: %s", path, strerror(errno));
        unlink(tmp_path);
        free(tmp_path);
        return TDM_ERR_IO;
    }
    free(tmp_path);
    return TDM_OK;
}

/* The index JSON text (caller frees) for the sorted tensors and their shard numbers. */
static char *build_index_json(const engine_st_tensor_t *const *sorted, const size_t *shard_of,
                              size_t n_tensors, size_t n_shards)
{
    json_t *root = json_object();
    json_t *metadata = json_object();
    json_t *weight_map = json_object();
    uint64_t total_bytes = 0;
    char *text = NULL;
    int failed = root == NULL || metadata == NULL || weight_map == NULL;

    for (size_t i = 0; i < n_tensors && !failed; i++) {
        char shard_name[SHARD_NAME_BYTES];
        snprintf(shard_name, sizeof(shard_name), "model-%05zu-of-%05zu.safetensors",
                 shard_of[i] + 1, n_shards);
        failed = json_object_set_new(weight_map, sorted[i]->name, json_string(shard_name)) != 0;
        total_bytes += sorted[i]->n_bytes;
    }
    failed =
        failed ||
        json_object_set_new(metadata, "total_size", json_integer((json_int_t)total_bytes)) != 0 ||
        json_object_set(root, "metadata", metadata) != 0 ||
        json_object_set(root, "weight_map", weight_map) != 0;
    if (!failed) {
        char *body = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
        if (body != NULL) {
            size_t n_bytes = strlen(body) + 2;
            text = malloc(n_bytes);
            if (text != NULL) {
                snprintf(text, n_bytes, "%s\n", body);
            }
            free(body);
        }
    }
    json_decref(weight_map);
    json_decref(metadata);
    json_decref(root);
    return text;
}

static tdm_status_t make_dir(const char *dir, char *err, size_t err_bytes)
{
    struct stat st;

    if (mkdir(dir, 0755) == 0) {
        return TDM_OK;
    }
    if (errno == EEXIST && stat(dir, &st) == 0 && S_ISDIR(st.st_mode)) {
        return TDM_OK;
    }
    tdm_errbuf_set(err, err_bytes, "%s: cannot create the directory: %s", dir, strerror(errno));
    return TDM_ERR_IO;
}

tdm_status_t engine_weights_write_sharded(const char *dir, const engine_st_tensor_t *tensors,
                                          size_t n_tensors, size_t max_shard_bytes, char *err,
                                          size_t err_bytes)
{
    const engine_st_tensor_t **sorted;
    size_t *shard_of;
    size_t n_shards = 0;
    size_t shard_bytes = 0;
    char *text = NULL;
    char *path = NULL;
    tdm_status_t status = TDM_OK;

    if (dir == NULL || tensors == NULL || n_tensors == 0 || max_shard_bytes == 0) {
        tdm_errbuf_set(err, err_bytes,
                       "write_sharded: dir, >= 1 tensors and max_shard_bytes > 0 "
                       "are required");
        return TDM_ERR_INVALID_ARG;
    }
    for (size_t i = 0; i < n_tensors; i++) {
        status = validate_record(&tensors[i], err, err_bytes);
        if (status != TDM_OK) {
            return status;
        }
    }
    sorted = malloc(n_tensors * sizeof(*sorted));
    shard_of = malloc(n_tensors * sizeof(*shard_of));
    if (sorted == NULL || shard_of == NULL) {
        status = TDM_ERR_NO_MEMORY;
        goto out_free;
    }
    for (size_t i = 0; i < n_tensors; i++) {
        sorted[i] = &tensors[i];
    }
    if (n_tensors > 1) {
        qsort(sorted, n_tensors, sizeof(*sorted), compare_tensor_ptr_names);
    }
    for (size_t i = 0; i < n_tensors; i++) {
        if (i > 0 && strcmp(sorted[i - 1]->name, sorted[i]->name) == 0) {
            tdm_errbuf_set(err, err_bytes, "%s: tensor named twice", sorted[i]->name);
            status = TDM_ERR_INVALID_ARG;
            goto out_free;
        }
        if (n_shards == 0 ||
            (shard_bytes > 0 && sorted[i]->n_bytes > max_shard_bytes - shard_bytes)) {
            n_shards++;
            shard_bytes = 0;
        }
        shard_of[i] = n_shards - 1;
        shard_bytes += sorted[i]->n_bytes < max_shard_bytes ? sorted[i]->n_bytes : max_shard_bytes;
    }

    status = make_dir(dir, err, err_bytes);
    for (size_t begin = 0; begin < n_tensors && status == TDM_OK;) {
        char shard_name[SHARD_NAME_BYTES];
        size_t end = begin;
        while (end < n_tensors && shard_of[end] == shard_of[begin]) {
            end++;
        }
        snprintf(shard_name, sizeof(shard_name), "model-%05zu-of-%05zu.safetensors",
                 shard_of[begin] + 1, n_shards);
        path = join_path(dir, shard_name);
        status = path == NULL ? TDM_ERR_NO_MEMORY
                              : write_shard(path, sorted, begin, end, err, err_bytes);
        free(path);
        path = NULL;
        begin = end;
    }
    if (status != TDM_OK) {
        goto out_free;
    }

    text = build_index_json(sorted, shard_of, n_tensors, n_shards);
    path = join_path(dir, ENGINE_WEIGHTS_INDEX_FILE);
    if (text == NULL || path == NULL) {
        status = TDM_ERR_NO_MEMORY;
        goto out_free;
    }
    status = write_text_file(path, text, err, err_bytes);

out_free:
    if (status == TDM_ERR_NO_MEMORY) {
        tdm_errbuf_set(err, err_bytes, "%s: out of memory", dir);
    }
    free(path);
    free(text);
    free(shard_of);
    free(sorted);
    return status;
}
