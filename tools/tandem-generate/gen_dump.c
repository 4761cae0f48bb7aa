/* gen_dump.c - the MODEL.md 12.10 dump writers of tandem-generate (gen_dump.h). */
#include "gen_dump.h"

#include "common/json.h"
#include "common/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define GEN_DUMP_MAGIC        "TDLOGIT1"
#define GEN_DUMP_MAGIC_BYTES  8
#define GEN_DUMP_HEADER_BYTES 32
#define GEN_DUMP_PATH_BYTES   4096
#define GEN_DUMP_SCHED_BYTES  16

/* ---- --dump-logits ---------------------------------------------------------------------- */

struct gen_logits_dump {
    FILE *file;
    char *path;
    int64_t vocab;
    uint32_t schedule;
    int64_t first_position; /* of row 0; valid once n_rows > 0 */
    int64_t n_rows;
};

static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) {
        p[i] = (unsigned char)(v >> (8 * i));
    }
}

tdm_status_t gen_logits_dump_create(const char *path, int64_t vocab, uint32_t schedule,
                                    gen_logits_dump_t **dump_out)
{
    unsigned char header[GEN_DUMP_HEADER_BYTES] = {0};
    gen_logits_dump_t *dump;

    if (path == NULL || dump_out == NULL || vocab < 1 || vocab > (int64_t)UINT32_MAX) {
        return TDM_ERR_INVALID_ARG;
    }
    dump = calloc(1, sizeof(*dump));
    if (dump == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    dump->path = strdup(path);
    if (dump->path == NULL) {
        free(dump);
        return TDM_ERR_NO_MEMORY;
    }
    dump->file = fopen(path, "wb");
    if (dump->file == NULL) {
        tdm_log(TDM_LOG_ERROR, "generate", "cannot create logits dump: path=%s error=%s", path,
                strerror(errno));
        free(dump->path);
        free(dump);
        return TDM_ERR_IO;
    }
    dump->vocab = vocab;
    dump->schedule = schedule;
    /* placeholder header (rows 0), rewritten at finish */
    if (fwrite(header, 1, sizeof(header), dump->file) != sizeof(header)) {
        gen_logits_dump_destroy(dump);
        return TDM_ERR_IO;
    }
    *dump_out = dump;
    return TDM_OK;
}

tdm_status_t gen_logits_dump_append(gen_logits_dump_t *dump, int64_t first_position,
                                    const float *rows, int64_t n_rows)
{
    size_t n_floats;

    if (dump == NULL || rows == NULL || n_rows < 0) {
        return TDM_ERR_INVALID_ARG;
    }
    if (dump->n_rows > 0 && first_position != dump->first_position + dump->n_rows) {
        tdm_log(TDM_LOG_ERROR, "generate",
                "logits dump rows not contiguous: expected_position=%lld got=%lld",
                (long long)(dump->first_position + dump->n_rows), (long long)first_position);
        return TDM_ERR_INVALID_ARG;
    }
    if (n_rows == 0) {
        return TDM_OK;
    }
    if (dump->n_rows == 0) {
        dump->first_position = first_position;
    }
    /* float32 little-endian: the host layout on every platform Tandem builds for */
    n_floats = (size_t)n_rows * (size_t)dump->vocab;
    if (fwrite(rows, sizeof(float), n_floats, dump->file) != n_floats) {
        tdm_log(TDM_LOG_ERROR, "generate", "logits dump write failed: path=%s error=%s", dump->path,
                strerror(errno));
        return TDM_ERR_IO;
    }
    dump->n_rows += n_rows;
    return TDM_OK;
}

tdm_status_t gen_logits_dump_finish(gen_logits_dump_t *dump)
{
    unsigned char header[GEN_DUMP_HEADER_BYTES] = {0};
    tdm_status_t status = TDM_OK;

    if (dump == NULL) {
        return TDM_OK;
    }
    memcpy(header, GEN_DUMP_MAGIC, GEN_DUMP_MAGIC_BYTES);
    put_u32(header + 8, (uint32_t)dump->n_rows);
    put_u32(header + 12, (uint32_t)dump->vocab);
    put_u32(header + 16, (uint32_t)(int32_t)dump->first_position);
    put_u32(header + 20, dump->schedule);
    if (fseek(dump->file, 0, SEEK_SET) != 0 ||
        fwrite(header, 1, sizeof(header), dump->file) != sizeof(header)) {
        status = TDM_ERR_IO;
    }
    if (fclose(dump->file) != 0) {
        status = TDM_ERR_IO;
    }
    if (status != TDM_OK) {
        tdm_log(TDM_LOG_ERROR, "generate", "logits dump write failed: path=%s error=%s", dump->path,
                strerror(errno));
    }
    free(dump->path);
    free(dump);
    return status;
}

void gen_logits_dump_destroy(gen_logits_dump_t *dump)
{
    if (dump == NULL) {
        return;
    }
    if (dump->file != NULL) {
        fclose(dump->file);
    }
    free(dump->path);
    free(dump);
}

/* ---- --dump-layers ---------------------------------------------------------------------- */

enum { PART_IN, PART_OUT, PART_PRE, PART_SEL, PART_EXPERTS, N_PARTS };

static const char *const part_suffix[N_PARTS] = {"in.f32", "out.f32", "pre.f32", "sel.i32",
                                                 "experts.i32"};

struct gen_layer_dump {
    char dir[GEN_DUMP_PATH_BYTES];
    char schedule[GEN_DUMP_SCHED_BYTES];
    int n_layers;
    int m;
    int64_t H, k_I, K;
    FILE *files[ENGINE_CONFIG_MAX_LAYERS][N_PARTS];
    int64_t first[ENGINE_CONFIG_MAX_LAYERS]; /* position of the layer's first row */
    int64_t n_rows[ENGINE_CONFIG_MAX_LAYERS];
    tdm_status_t error; /* first error met by the sink */
};

/* mkdir -p */
static tdm_status_t make_dirs(const char *dir)
{
    char path[GEN_DUMP_PATH_BYTES];
    size_t n = strlen(dir);

    if (n == 0 || n >= sizeof(path)) {
        return TDM_ERR_INVALID_ARG;
    }
    memcpy(path, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (path[i] == '/' || path[i] == '\0') {
            char saved = path[i];
            path[i] = '\0';
            if (mkdir(path, 0755) != 0 && errno != EEXIST) {
                tdm_log(TDM_LOG_ERROR, "generate", "cannot create directory: path=%s error=%s",
                        path, strerror(errno));
                return TDM_ERR_IO;
            }
            path[i] = saved;
        }
    }
    return TDM_OK;
}

static void part_name(int layer, int part, char *out, size_t out_bytes)
{
    snprintf(out, out_bytes, "%d.%s", layer, part_suffix[part]);
}

static void close_files(gen_layer_dump_t *dump, tdm_status_t *status)
{
    for (int l = 0; l < dump->n_layers; l++) {
        for (int p = 0; p < N_PARTS; p++) {
            if (dump->files[l][p] != NULL && fclose(dump->files[l][p]) != 0 && *status == TDM_OK) {
                *status = TDM_ERR_IO;
            }
            dump->files[l][p] = NULL;
        }
    }
}

tdm_status_t gen_layer_dump_create(const char *dir, const engine_config_t *cfg,
                                   const char *schedule_name, gen_layer_dump_t **dump_out)
{
    char name[64];
    char path[GEN_DUMP_PATH_BYTES + 64];
    gen_layer_dump_t *dump;
    tdm_status_t status;

    if (dir == NULL || cfg == NULL || schedule_name == NULL || dump_out == NULL ||
        strlen(dir) >= GEN_DUMP_PATH_BYTES || strlen(schedule_name) >= GEN_DUMP_SCHED_BYTES ||
        cfg->n_layers < 1 || cfg->n_layers > ENGINE_CONFIG_MAX_LAYERS) {
        return TDM_ERR_INVALID_ARG;
    }
    status = make_dirs(dir);
    if (status != TDM_OK) {
        return status;
    }
    dump = calloc(1, sizeof(*dump));
    if (dump == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    snprintf(dump->dir, sizeof(dump->dir), "%s", dir);
    snprintf(dump->schedule, sizeof(dump->schedule), "%s", schedule_name);
    dump->n_layers = cfg->n_layers;
    dump->m = (int)cfg->hc_mult;
    dump->H = cfg->hidden_size;
    dump->k_I = cfg->index_topk;
    dump->K = cfg->num_experts_per_tok;
    for (int l = 0; l < dump->n_layers; l++) {
        for (int p = 0; p < N_PARTS; p++) {
            part_name(l, p, name, sizeof(name));
            snprintf(path, sizeof(path), "%s/%s", dir, name);
            dump->files[l][p] = fopen(path, "wb");
            if (dump->files[l][p] == NULL) {
                tdm_log(TDM_LOG_ERROR, "generate", "cannot create layer dump: path=%s error=%s",
                        path, strerror(errno));
                gen_layer_dump_destroy(dump);
                return TDM_ERR_IO;
            }
        }
    }
    *dump_out = dump;
    return TDM_OK;
}

static void sink_error(gen_layer_dump_t *dump, tdm_status_t status)
{
    if (dump->error == TDM_OK) {
        dump->error = status;
    }
}

static int write_part(gen_layer_dump_t *dump, int l, int part, const void *data, size_t elem_bytes,
                      size_t n_elems)
{
    if (fwrite(data, elem_bytes, n_elems, dump->files[l][part]) != n_elems) {
        tdm_log(TDM_LOG_ERROR, "generate", "layer dump write failed: dir=%s layer=%d error=%s",
                dump->dir, l, strerror(errno));
        sink_error(dump, TDM_ERR_IO);
        return -1;
    }
    return 0;
}

/* engine_dump_sink_t.layer: append one record to the layer's files. */
static void on_layer(void *user, const engine_dump_layer_t *rec)
{
    gen_layer_dump_t *dump = user;
    int l = rec->layer;
    size_t n = (size_t)rec->n_rows;
    size_t mH = (size_t)dump->m * (size_t)dump->H;

    if (dump->error != TDM_OK) {
        return;
    }
    if (l < 0 || l >= dump->n_layers || rec->n_rows < 0 || rec->m != dump->m || rec->H != dump->H ||
        rec->k_I != dump->k_I || rec->K != dump->K) {
        tdm_log(TDM_LOG_ERROR, "generate", "layer dump record rejected: layer=%d shape differs", l);
        sink_error(dump, TDM_ERR_INTERNAL);
        return;
    }
    if (dump->n_rows[l] == 0) {
        dump->first[l] = rec->first_position;
    } else if (rec->first_position != dump->first[l] + dump->n_rows[l]) {
        tdm_log(TDM_LOG_ERROR, "generate",
                "layer dump rows not contiguous: layer=%d expected_position=%lld got=%lld", l,
                (long long)(dump->first[l] + dump->n_rows[l]), (long long)rec->first_position);
        sink_error(dump, TDM_ERR_INTERNAL);
        return;
    }
    if (write_part(dump, l, PART_IN, rec->x_in, sizeof(float), n * mH) != 0 ||
        write_part(dump, l, PART_OUT, rec->x_out, sizeof(float), n * mH) != 0 ||
        write_part(dump, l, PART_PRE, rec->pre, sizeof(float), n * (size_t)dump->m) != 0 ||
        write_part(dump, l, PART_SEL, rec->sel, sizeof(int32_t), n * (size_t)dump->k_I) != 0 ||
        write_part(dump, l, PART_EXPERTS, rec->experts, sizeof(int32_t), n * (size_t)dump->K) !=
            0) {
        return;
    }
    dump->n_rows[l] += rec->n_rows;
}

void gen_layer_dump_sink(gen_layer_dump_t *dump, engine_dump_sink_t *sink_out)
{
    sink_out->user = dump;
    sink_out->layer = on_layer;
}

/* {"dtype": ..., "shape": [n, ...], "first_position": p} of one file. */
static json_t *file_entry(const gen_layer_dump_t *dump, int l, int part)
{
    json_t *shape = json_array();
    json_t *entry = json_object();
    int is_f32 = part == PART_IN || part == PART_OUT || part == PART_PRE;

    if (shape == NULL || entry == NULL) {
        json_decref(shape);
        json_decref(entry);
        return NULL;
    }
    json_array_append_new(shape, json_integer(dump->n_rows[l]));
    switch (part) {
    case PART_IN:
    case PART_OUT:
        json_array_append_new(shape, json_integer(dump->m));
        json_array_append_new(shape, json_integer(dump->H));
        break;
    case PART_PRE:
        json_array_append_new(shape, json_integer(dump->m));
        break;
    case PART_SEL:
        json_array_append_new(shape, json_integer(dump->k_I));
        break;
    default:
        json_array_append_new(shape, json_integer(dump->K));
        break;
    }
    json_object_set_new(entry, "dtype", json_string(is_f32 ? "f32" : "i32"));
    json_object_set_new(entry, "shape", shape);
    json_object_set_new(entry, "first_position", json_integer(dump->first[l]));
    return entry;
}

static tdm_status_t write_manifest(const gen_layer_dump_t *dump, const int32_t *ids, int64_t n_ids)
{
    char name[64];
    char path[GEN_DUMP_PATH_BYTES + 64];
    json_t *root = json_object();
    json_t *layers = json_array();
    json_t *id_list = json_array();
    json_t *files = json_object();
    tdm_status_t status = TDM_OK;

    if (root == NULL || layers == NULL || id_list == NULL || files == NULL) {
        json_decref(root);
        json_decref(layers);
        json_decref(id_list);
        json_decref(files);
        return TDM_ERR_NO_MEMORY;
    }
    json_object_set_new(root, "format", json_string("tandem-dump-layers"));
    json_object_set_new(root, "writer", json_string("tandem-generate"));
    json_object_set_new(root, "schedule", json_string(dump->schedule));
    json_object_set_new(root, "first_position", json_integer(dump->first[0]));
    json_object_set_new(root, "T", json_integer(dump->n_rows[0]));
    json_object_set_new(root, "m", json_integer(dump->m));
    json_object_set_new(root, "H", json_integer(dump->H));
    json_object_set_new(root, "k_I", json_integer(dump->k_I));
    json_object_set_new(root, "K", json_integer(dump->K));
    for (int l = 0; l < dump->n_layers; l++) {
        json_array_append_new(layers, json_integer(l));
        for (int p = 0; p < N_PARTS; p++) {
            json_t *entry = file_entry(dump, l, p);
            if (entry == NULL) {
                status = TDM_ERR_NO_MEMORY;
                break;
            }
            part_name(l, p, name, sizeof(name));
            json_object_set_new(files, name, entry);
        }
    }
    for (int64_t i = 0; i < n_ids; i++) {
        json_array_append_new(id_list, json_integer(ids[i]));
    }
    json_object_set_new(root, "layers", layers);
    json_object_set_new(root, "ids", id_list);
    json_object_set_new(root, "files", files);
    snprintf(path, sizeof(path), "%s/manifest.json", dump->dir);
    if (status == TDM_OK && json_dump_file(root, path, JSON_INDENT(1) | JSON_PRESERVE_ORDER) != 0) {
        tdm_log(TDM_LOG_ERROR, "generate", "cannot write manifest: path=%s", path);
        status = TDM_ERR_IO;
    }
    json_decref(root);
    return status;
}

tdm_status_t gen_layer_dump_finish(gen_layer_dump_t *dump, const int32_t *ids, int64_t n_ids)
{
    tdm_status_t status;

    if (dump == NULL) {
        return TDM_OK;
    }
    status = dump->error;
    close_files(dump, &status);
    if (status == TDM_OK) {
        status = write_manifest(dump, ids, n_ids);
    }
    free(dump);
    return status;
}

void gen_layer_dump_destroy(gen_layer_dump_t *dump)
{
    tdm_status_t ignored = TDM_OK;

    if (dump == NULL) {
        return;
    }
    close_files(dump, &ignored);
    free(dump);
}
