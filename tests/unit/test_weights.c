/* test_weights.c - checkpoint directories: sharded writing, opening (index or single file),
 * lookup with scale aliases, the check against tensor specs, and index/shard disagreements. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <dirent.h>
#include <jansson.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/status.h"
#include "engine/safetensors.h"
#include "engine/tensor.h"
#include "file_test_util.h"
#include "engine/weights.h"

#define PATH_BYTES         1024
#define ERR_BYTES          1024
#define MAX_SAMPLE         16
#define SAMPLE_SHARD_BYTES 40     /* splits the sample into 4 shards (worked out in the test) */
#define N_MANY             100000 /* about the full model's 96K tensors */

static engine_weights_t *const untouched_weights = (engine_weights_t *)(uintptr_t)0x5a5a5a50;

/* Backing bytes for the sample tensors: each tensor reads a prefix. */
static uint8_t sample_bytes[64];

typedef struct {
    engine_st_tensor_t tensors[MAX_SAMPLE];
    size_t n_tensors;
    engine_tensor_spec_t specs[MAX_SAMPLE];
    size_t n_specs;
} sample_t;

static void tmp_dir(const char *name, char *path_out)
{
    fu_tmp_path("weights_", name, path_out, PATH_BYTES);
}

/* Removes dir's files and dir itself (one level; ignores a missing dir). */
static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[PATH_BYTES * 2];

    if (d == NULL) {
        return;
    }
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) {
            continue;
        }
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        assert_int_equal(unlink(path), 0);
    }
    closedir(d);
    assert_int_equal(rmdir(dir), 0);
}

static void join(const char *dir, const char *name, char *path_out)
{
    int n = snprintf(path_out, PATH_BYTES, "%s/%s", dir, name);

    assert_true(n > 0 && n < PATH_BYTES);
}

static void add_tensor(sample_t *s, const char *name, engine_dtype_t dtype, int64_t d0, int64_t d1,
                       int n_dims)
{
    engine_st_tensor_t *t = &s->tensors[s->n_tensors++];
    uint64_t n_bytes;

    assert_true(s->n_tensors <= MAX_SAMPLE);
    memset(t, 0, sizeof(*t));
    t->name = name;
    t->dtype = dtype;
    t->n_dims = n_dims;
    t->shape[0] = d0;
    t->shape[1] = d1;
    assert_int_equal(engine_st_shape_bytes(dtype, n_dims, t->shape, &n_bytes), TDM_OK);
    assert_true(n_bytes <= sizeof(sample_bytes));
    t->n_bytes = (size_t)n_bytes;
    t->data = sample_bytes + (s->n_tensors % 8); /* different tensors, different bytes */
    if (n_bytes + (s->n_tensors % 8) > sizeof(sample_bytes)) {
        t->data = sample_bytes;
    }
}

static void add_spec(sample_t *s, const char *name, engine_dtype_t dtype, int64_t d0, int64_t d1,
                     int n_dims, uint32_t flags)
{
    engine_tensor_spec_t *spec = &s->specs[s->n_specs++];

    assert_true(s->n_specs <= MAX_SAMPLE);
    memset(spec, 0, sizeof(*spec));
    snprintf(spec->name, sizeof(spec->name), "%s", name);
    spec->dtype = dtype;
    spec->n_dims = n_dims;
    spec->shape[0] = d0;
    spec->shape[1] = d1;
    spec->flags = flags;
    spec->layer = -1;
}

/*
 * The sample checkpoint: seven text tensors with their specs (one FP8 module, one FP4 expert
 * stored as U8, both with .scale), four vision tensors without specs.
 */
static void make_sample(sample_t *s, const char *wq_a_scale_name, const char *w1_scale_name)
{
    memset(s, 0, sizeof(*s));
    for (size_t i = 0; i < sizeof(sample_bytes); i++) {
        sample_bytes[i] = (uint8_t)(i * 37u + 11u);
    }
    add_tensor(s, "embed.weight", ENGINE_DTYPE_BF16, 8, 4, 2);
    add_tensor(s, "norm.weight", ENGINE_DTYPE_BF16, 4, 0, 1);
    add_tensor(s, "layers.0.attn.wq_a.weight", ENGINE_DTYPE_F8_E4M3, 4, 4, 2);
    add_tensor(s, wq_a_scale_name, ENGINE_DTYPE_F8_E8M0, 1, 1, 2);
    add_tensor(s, "layers.0.ffn.experts.0.w1.weight", ENGINE_DTYPE_U8, 4, 2, 2);
    add_tensor(s, w1_scale_name, ENGINE_DTYPE_F8_E8M0, 4, 1, 2);
    add_tensor(s, "layers.0.hc_attn_scale", ENGINE_DTYPE_F32, 3, 0, 1);
    add_tensor(s, "vision.patch_embed.weight", ENGINE_DTYPE_BF16, 2, 2, 2);
    add_tensor(s, "aligner.proj.weight", ENGINE_DTYPE_BF16, 2, 0, 1);
    add_tensor(s, "image_newline", ENGINE_DTYPE_BF16, 4, 0, 1);
    add_tensor(s, "layers.0.ffn.gate.bias_vl", ENGINE_DTYPE_F32, 2, 0, 1);

    add_spec(s, "embed.weight", ENGINE_DTYPE_BF16, 8, 4, 2, 0);
    add_spec(s, "norm.weight", ENGINE_DTYPE_BF16, 4, 0, 1, 0);
    add_spec(s, "layers.0.attn.wq_a.weight", ENGINE_DTYPE_F8_E4M3, 4, 4, 2, 0);
    add_spec(s, "layers.0.attn.wq_a.scale", ENGINE_DTYPE_F8_E8M0, 1, 1, 2, ENGINE_SPEC_SCALE);
    add_spec(s, "layers.0.ffn.experts.0.w1.weight", ENGINE_DTYPE_I8, 4, 2, 2,
             ENGINE_SPEC_FP4_PACKED);
    add_spec(s, "layers.0.ffn.experts.0.w1.scale", ENGINE_DTYPE_F8_E8M0, 4, 1, 2,
             ENGINE_SPEC_SCALE);
    add_spec(s, "layers.0.hc_attn_scale", ENGINE_DTYPE_F32, 3, 0, 1, 0);
}

static void make_canonical_sample(sample_t *s)
{
    make_sample(s, "layers.0.attn.wq_a.scale", "layers.0.ffn.experts.0.w1.scale");
}

/* Writes the canonical sample, sharded, into a fresh dir. */
static void write_sample_dir(const char *name, sample_t *s, char *dir_out)
{
    char err[ERR_BYTES] = "";

    make_canonical_sample(s);
    tmp_dir(name, dir_out);
    remove_dir(dir_out);
    assert_int_equal(engine_weights_write_sharded(dir_out, s->tensors, s->n_tensors,
                                                  SAMPLE_SHARD_BYTES, err, sizeof(err)),
                     TDM_OK);
}

static engine_weights_t *open_ok(const char *dir)
{
    engine_weights_t *w = NULL;
    char err[ERR_BYTES] = "";
    tdm_status_t status = engine_weights_open(dir, &w, err, sizeof(err));

    if (status != TDM_OK) {
        fail_msg("open %s: %s: %s", dir, tdm_status_name(status), err);
    }
    return w;
}

/* write_sample_dir, then opens the dir. */
static engine_weights_t *open_sample(const char *name, sample_t *s, char *dir_out)
{
    write_sample_dir(name, s, dir_out);
    return open_ok(dir_out);
}

static void expect_open_fails(const char *dir, tdm_status_t status, const char *needle1,
                              const char *needle2)
{
    engine_weights_t *w = untouched_weights;
    char err[ERR_BYTES] = "";

    assert_int_equal(engine_weights_open(dir, &w, err, sizeof(err)), status);
    assert_ptr_equal(w, untouched_weights);
    if ((needle1 != NULL && strstr(err, needle1) == NULL) ||
        (needle2 != NULL && strstr(err, needle2) == NULL)) {
        fail_msg("err '%s' lacks '%s' or '%s'", err, needle1, needle2 ? needle2 : "");
    }
}

/* Runs check, expecting `status` and an err containing `needle` (when not NULL). */
static void check_expecting(const engine_weights_t *w, const engine_tensor_spec_t *specs,
                            size_t n_specs, tdm_status_t status, const char *needle)
{
    char err[ERR_BYTES] = "";
    tdm_status_t got = engine_weights_check(w, specs, n_specs, err, sizeof(err));

    if (got != status || (needle != NULL && strstr(err, needle) == NULL)) {
        fail_msg("check: %s '%s', expected %s with '%s'", tdm_status_name(got), err,
                 tdm_status_name(status), needle != NULL ? needle : "");
    }
}

/* Loads the index JSON (caller decrefs). */
static json_t *load_index(const char *dir)
{
    char path[PATH_BYTES];
    json_error_t error;
    json_t *root;

    join(dir, ENGINE_WEIGHTS_INDEX_FILE, path);
    root = json_load_file(path, 0, &error);
    assert_non_null(root);
    return root;
}

/* Writes tensors[0..n) as one safetensors file at path. */
static void write_file(const char *path, const engine_st_tensor_t *tensors, size_t n)
{
    engine_st_writer_t *writer = NULL;

    assert_int_equal(engine_st_writer_create(path, &writer), TDM_OK);
    for (size_t i = 0; i < n; i++) {
        const engine_st_tensor_t *t = &tensors[i];
        assert_int_equal(engine_st_writer_add(writer, t->name, t->dtype, t->n_dims, t->shape,
                                              t->data, t->n_bytes),
                         TDM_OK);
    }
    assert_int_equal(engine_st_writer_finish(writer), TDM_OK);
    engine_st_writer_destroy(writer);
}

/* A BF16 vector tensor [n] over data. */
static engine_st_tensor_t bf16_vector(const char *name, const uint16_t *data, int64_t n)
{
    engine_st_tensor_t t;

    memset(&t, 0, sizeof(t));
    t.name = name;
    t.dtype = ENGINE_DTYPE_BF16;
    t.n_dims = 1;
    t.shape[0] = n;
    t.data = data;
    t.n_bytes = (size_t)n * sizeof(*data);
    return t;
}

/* Replaces the file at path with text. */
static void write_text(const char *path, const char *text)
{
    fu_write_bytes(path, text, strlen(text));
}

static void store_index(const char *dir, json_t *root)
{
    char path[PATH_BYTES];

    join(dir, ENGINE_WEIGHTS_INDEX_FILE, path);
    assert_int_equal(json_dump_file(root, path, JSON_INDENT(2)), 0);
}

static void test_write_sharded_then_open_finds_every_tensor(void **state)
{
    char dir[PATH_BYTES];
    char path[PATH_BYTES];
    sample_t s;
    engine_weights_t *w;
    json_t *index;
    json_t *weight_map;
    const char *prev = "";
    uint64_t total = 0;
    (void)state;

    w = open_sample("sharded", &s, dir);
    /* sorted sizes 4 | 64 | 8 1 16 4 8 | 8 12 8 8 with at most 40 bytes a shard */
    assert_int_equal(engine_weights_n_shards(w), 4);
    join(dir, "model-00004-of-00004.safetensors", path);
    assert_int_equal(access(path, F_OK), 0);
    assert_int_equal(engine_weights_n_tensors(w), s.n_tensors);
    for (size_t i = 0; i < s.n_tensors; i++) {
        const engine_st_tensor_t *want = &s.tensors[i];
        const engine_st_tensor_t *got = engine_weights_find(w, want->name);
        assert_non_null(got);
        assert_string_equal(got->name, want->name);
        assert_int_equal(got->dtype, want->dtype);
        assert_int_equal(got->n_dims, want->n_dims);
        assert_memory_equal(got->shape, want->shape, sizeof(want->shape));
        assert_int_equal(got->n_bytes, want->n_bytes);
        assert_memory_equal(got->data, want->data, want->n_bytes);
        total += want->n_bytes;
    }
    for (size_t i = 0; i < engine_weights_n_tensors(w); i++) {
        const engine_st_tensor_t *t = engine_weights_tensor_at(w, i);
        assert_true(strcmp(prev, t->name) < 0);
        prev = t->name;
    }
    assert_null(engine_weights_tensor_at(w, s.n_tensors));
    assert_int_equal(engine_weights_total_bytes(w), total);
    assert_null(engine_weights_find(w, "missing.weight"));
    assert_null(engine_weights_find(w, "missing.scale"));
    assert_null(engine_weights_find(w, ".scale"));
    engine_weights_close(w);

    index = load_index(dir);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(index, "metadata"), "total_size")),
        (json_int_t)total);
    weight_map = json_object_get(index, "weight_map");
    assert_int_equal(json_object_size(weight_map), s.n_tensors);
    assert_string_equal(json_string_value(json_object_get(weight_map, "embed.weight")),
                        "model-00002-of-00004.safetensors");
    assert_string_equal(json_string_value(json_object_get(weight_map, "aligner.proj.weight")),
                        "model-00001-of-00004.safetensors");
    prev = "";
    for (void *it = json_object_iter(weight_map); it != NULL;
         it = json_object_iter_next(weight_map, it)) {
        assert_true(strcmp(prev, json_object_iter_key(it)) < 0); /* keys sorted in the file */
        prev = json_object_iter_key(it);
    }
    json_decref(index);
    engine_weights_close(NULL);
}

static void test_write_sharded_is_deterministic_whatever_the_input_order(void **state)
{
    static const char *const files[] = {
        ENGINE_WEIGHTS_INDEX_FILE, "model-00001-of-00004.safetensors",
        "model-00002-of-00004.safetensors", "model-00003-of-00004.safetensors",
        "model-00004-of-00004.safetensors"};
    char dir_a[PATH_BYTES];
    char dir_b[PATH_BYTES];
    char err[ERR_BYTES] = "";
    sample_t s;
    engine_st_tensor_t reversed[MAX_SAMPLE];
    (void)state;

    write_sample_dir("det_a", &s, dir_a);
    for (size_t i = 0; i < s.n_tensors; i++) {
        reversed[i] = s.tensors[s.n_tensors - 1 - i];
    }
    tmp_dir("det_b", dir_b);
    remove_dir(dir_b);
    assert_int_equal(engine_weights_write_sharded(dir_b, reversed, s.n_tensors, SAMPLE_SHARD_BYTES,
                                                  err, sizeof(err)),
                     TDM_OK);
    for (size_t f = 0; f < sizeof(files) / sizeof(files[0]); f++) {
        char path_a[PATH_BYTES];
        char path_b[PATH_BYTES];
        size_t n_a;
        size_t n_b;
        uint8_t *a;
        uint8_t *b;
        join(dir_a, files[f], path_a);
        join(dir_b, files[f], path_b);
        a = fu_read_bytes(path_a, &n_a);
        b = fu_read_bytes(path_b, &n_b);
        assert_int_equal(n_a, n_b);
        assert_memory_equal(a, b, n_a);
        if (f == 0) {
            assert_int_equal(a[n_a - 1], '\n');
        }
        free(a);
        free(b);
    }
}

static void test_vision_tensor_names_are_recognised(void **state)
{
    (void)state;
    assert_int_equal(engine_weights_name_is_vision("vision.blocks.0.attn.qkv.weight"), 1);
    assert_int_equal(engine_weights_name_is_vision("aligner.layers.0.weight"), 1);
    assert_int_equal(engine_weights_name_is_vision("image_start"), 1);
    assert_int_equal(engine_weights_name_is_vision("image_end_embed"), 1);
    assert_int_equal(engine_weights_name_is_vision("image_newline"), 1);
    assert_int_equal(engine_weights_name_is_vision("layers.7.ffn.gate.bias_vl"), 1);
    assert_int_equal(engine_weights_name_is_vision("layers.7.ffn.gate.bias"), 0);
    assert_int_equal(engine_weights_name_is_vision("visionary.weight"), 0);
    assert_int_equal(engine_weights_name_is_vision("embed.weight"), 0);
}

static void test_scale_aliases_are_found_and_checked_under_the_canonical_name(void **state)
{
    char dir[PATH_BYTES];
    char err[ERR_BYTES] = "";
    sample_t s;
    engine_weights_t *w;
    const engine_st_tensor_t *t;
    (void)state;

    make_sample(&s, "layers.0.attn.wq_a.weight.scale",
                "layers.0.ffn.experts.0.w1.weight_scale_inv");
    tmp_dir("alias", dir);
    remove_dir(dir);
    assert_int_equal(
        engine_weights_write_sharded(dir, s.tensors, s.n_tensors, 1u << 20, err, sizeof(err)),
        TDM_OK);
    w = open_ok(dir);
    assert_int_equal(engine_weights_n_shards(w), 1);
    t = engine_weights_find(w, "layers.0.attn.wq_a.scale");
    assert_non_null(t);
    assert_string_equal(t->name, "layers.0.attn.wq_a.weight.scale");
    t = engine_weights_find(w, "layers.0.ffn.experts.0.w1.scale");
    assert_non_null(t);
    assert_string_equal(t->name, "layers.0.ffn.experts.0.w1.weight_scale_inv");
    assert_int_equal(t->shape[0], 4);
    assert_null(engine_weights_find(w, "layers.0.attn.wq_b.scale"));
    check_expecting(w, s.specs, s.n_specs, TDM_OK, NULL);
    engine_weights_close(w);
}

/* One spec edit of the canonical sample and what the check says of it. */
typedef enum {
    EDIT_NONE,        /* the exact specs (the vision tensors have none: skipped) */
    EDIT_ADD_ABSENT,  /* a spec for a tensor the checkpoint lacks */
    EDIT_NORM_DTYPE,  /* norm.weight expected F32 */
    EDIT_EMBED_SHAPE, /* embed.weight expected [8, 5] */
    EDIT_NORM_N_DIMS, /* norm.weight [4] expected [4, 0] */
    EDIT_DROP_LAST,   /* no spec for the last tensor, layers.0.hc_attn_scale */
} spec_edit_t;

static void test_check_accepts_exact_specs_and_reports_each_mismatch(void **state)
{
    static const struct {
        spec_edit_t edit;
        tdm_status_t status;
        const char *needle;
    } cases[] = {
        {EDIT_NONE, TDM_OK, NULL},
        {EDIT_ADD_ABSENT, TDM_ERR_NOT_FOUND,
         "layers.0.attn.wkv.weight: missing from the checkpoint"},
        {EDIT_NORM_DTYPE, TDM_ERR_MISMATCH, "norm.weight: dtype BF16 expected F32"},
        {EDIT_EMBED_SHAPE, TDM_ERR_MISMATCH, "embed.weight: shape [8, 4] expected [8, 5]"},
        {EDIT_NORM_N_DIMS, TDM_ERR_MISMATCH, "norm.weight: shape [4] expected [4, 0]"},
        {EDIT_DROP_LAST, TDM_ERR_MISMATCH,
         "layers.0.hc_attn_scale: in the checkpoint but not expected"},
    };
    char dir[PATH_BYTES];
    sample_t s;
    engine_weights_t *w;
    (void)state;

    w = open_sample("check_edits", &s, dir);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        size_t n_specs;

        make_canonical_sample(&s);
        n_specs = s.n_specs;
        switch (cases[i].edit) {
        case EDIT_NONE:
            break;
        case EDIT_ADD_ABSENT:
            add_spec(&s, "layers.0.attn.wkv.weight", ENGINE_DTYPE_F8_E4M3, 4, 4, 2, 0);
            n_specs = s.n_specs;
            break;
        case EDIT_NORM_DTYPE:
            s.specs[1].dtype = ENGINE_DTYPE_F32;
            break;
        case EDIT_EMBED_SHAPE:
            s.specs[0].shape[1] = 5;
            break;
        case EDIT_NORM_N_DIMS:
            s.specs[1].n_dims = 2;
            break;
        case EDIT_DROP_LAST:
            n_specs = s.n_specs - 1;
            break;
        }
        check_expecting(w, s.specs, n_specs, cases[i].status, cases[i].needle);
    }
    engine_weights_close(w);
}

static void test_check_counts_further_problems_and_rejects_bad_specs(void **state)
{
    char dir[PATH_BYTES];
    char err[ERR_BYTES] = "";
    sample_t s;
    engine_weights_t *w;
    (void)state;

    w = open_sample("check_many", &s, dir);
    s.specs[0].dtype = ENGINE_DTYPE_F32;
    s.specs[0].shape[0] = 9;
    /* dtype and shape of embed.weight, then hc_attn_scale unexpected */
    check_expecting(w, s.specs, s.n_specs - 1, TDM_ERR_MISMATCH, "(and 2 more problems");
    make_canonical_sample(&s);
    s.specs[2] = s.specs[1]; /* norm.weight twice, wq_a.weight unexpected */
    check_expecting(w, s.specs, s.n_specs, TDM_ERR_INVALID_ARG, "norm.weight: listed by two specs");
    make_canonical_sample(&s);
    s.specs[0].n_dims = 5;
    check_expecting(w, s.specs, s.n_specs, TDM_ERR_INVALID_ARG, "embed.weight: malformed spec");
    assert_int_equal(engine_weights_check(NULL, s.specs, s.n_specs, err, sizeof(err)),
                     TDM_ERR_INVALID_ARG);
    engine_weights_close(w);
}

static void test_fp4_specs_accept_i8_or_u8_only(void **state)
{
    char dir[PATH_BYTES];
    char path[PATH_BYTES];
    sample_t s;
    engine_weights_t *w;
    (void)state;

    /* the sample stores the FP4 expert as U8: accepted under an I8 spec flagged FP4 */
    w = open_sample("fp4_u8", &s, dir);
    check_expecting(w, s.specs, s.n_specs, TDM_OK, NULL);
    s.specs[4].flags = 0; /* plain I8 spec: U8 is now a mismatch */
    check_expecting(w, s.specs, s.n_specs, TDM_ERR_MISMATCH,
                    "layers.0.ffn.experts.0.w1.weight: dtype U8 expected I8");
    s.specs[4].flags = ENGINE_SPEC_FP4_PACKED;
    s.specs[4].dtype = ENGINE_DTYPE_U8;
    check_expecting(w, s.specs, s.n_specs, TDM_OK, NULL);
    engine_weights_close(w);

    /* a single model.safetensors storing it as I8 passes; BF16 does not */
    make_canonical_sample(&s);
    tmp_dir("fp4_i8", dir);
    remove_dir(dir);
    assert_int_equal(mkdir(dir, 0755), 0);
    join(dir, ENGINE_WEIGHTS_SINGLE_FILE, path);
    for (size_t i = 0; i < s.n_tensors; i++) {
        if (s.tensors[i].dtype == ENGINE_DTYPE_U8) {
            s.tensors[i].dtype = ENGINE_DTYPE_I8;
        }
    }
    write_file(path, s.tensors, s.n_tensors);
    w = open_ok(dir);
    assert_int_equal(engine_weights_n_shards(w), 1);
    assert_int_equal(engine_weights_find(w, "layers.0.ffn.experts.0.w1.weight")->dtype,
                     ENGINE_DTYPE_I8);
    check_expecting(w, s.specs, s.n_specs, TDM_OK, NULL);
    s.specs[4].dtype = ENGINE_DTYPE_BF16;
    s.specs[4].flags = 0;
    check_expecting(w, s.specs, s.n_specs, TDM_ERR_MISMATCH, "dtype I8 expected BF16");
    engine_weights_close(w);
}

static void test_index_disagreeing_with_its_shards_fails(void **state)
{
    /* Each case edits a fresh sample: removes the shard file `removed`, or sets the weight_map
     * entry `name` to `shard`, or deletes that entry when shard is NULL. */
    static const struct {
        const char *removed, *dir, *name, *shard;
        tdm_status_t status;
        const char *needle1, *needle2; /* what the error names */
    } cases[] = {
        {"model-00002-of-00004.safetensors", "missing_shard", NULL, NULL, TDM_ERR_NOT_FOUND,
         "model-00002-of-00004.safetensors", "'embed.weight'"},
        {NULL, "ghost", "ghost.weight", "model-00001-of-00004.safetensors", TDM_ERR_MISMATCH,
         "'ghost.weight'", "does not hold it"},
        {NULL, "unindexed", "norm.weight", NULL, TDM_ERR_MISMATCH, "'norm.weight'",
         "not in the index"},
        {NULL, "wrong_shard", "norm.weight", "model-00001-of-00004.safetensors", TDM_ERR_MISMATCH,
         "'norm.weight'", "but it is in model-00004-of-00004.safetensors"},
        {NULL, "bad_index", "norm.weight", "../model-00004-of-00004.safetensors", TDM_ERR_FORMAT,
         "weight_map['norm.weight']", NULL},
    };
    (void)state;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char dir[PATH_BYTES];
        sample_t s;
        json_t *index;
        json_t *weight_map;

        write_sample_dir(cases[i].dir, &s, dir);
        if (cases[i].removed != NULL) {
            char path[PATH_BYTES];

            join(dir, cases[i].removed, path);
            assert_int_equal(unlink(path), 0);
            expect_open_fails(dir, cases[i].status, cases[i].needle1, cases[i].needle2);
            continue;
        }
        index = load_index(dir);
        weight_map = json_object_get(index, "weight_map");
        if (cases[i].shard != NULL) {
            json_object_set_new(weight_map, cases[i].name, json_string(cases[i].shard));
        } else {
            json_object_del(weight_map, cases[i].name);
        }
        store_index(dir, index);
        json_decref(index);
        expect_open_fails(dir, cases[i].status, cases[i].needle1, cases[i].needle2);
    }
}

static void test_tensor_in_two_shards_fails(void **state)
{
    static const uint16_t two[2] = {1, 2};
    static const uint16_t four[4] = {1, 2, 3, 4};
    const engine_st_tensor_t shard1[2] = {bf16_vector("aligner.proj.weight", two, 2),
                                          bf16_vector("norm.weight", four, 4)};
    char dir[PATH_BYTES];
    char path[PATH_BYTES];
    sample_t s;
    (void)state;

    /* shard 1 rewritten to hold norm.weight (the index's shard 4 holds it too) */
    write_sample_dir("two_shards", &s, dir);
    join(dir, "model-00001-of-00004.safetensors", path);
    write_file(path, shard1, 2);
    expect_open_fails(dir, TDM_ERR_MISMATCH, "'norm.weight' is in both shard", NULL);
}

static void test_bad_directories_and_indexes_fail(void **state)
{
    char dir[PATH_BYTES];
    char path[PATH_BYTES];
    sample_t s;
    json_t *index;
    engine_weights_t *w = untouched_weights;
    (void)state;

    tmp_dir("empty", dir);
    remove_dir(dir);
    assert_int_equal(mkdir(dir, 0755), 0);
    expect_open_fails(dir, TDM_ERR_NOT_FOUND, "neither", NULL);
    assert_int_equal(engine_weights_open(NULL, &w, NULL, 0), TDM_ERR_INVALID_ARG);
    assert_ptr_equal(w, untouched_weights);

    join(dir, ENGINE_WEIGHTS_INDEX_FILE, path);
    write_text(path, "{\"weight_map\": {\"a\": ");
    expect_open_fails(dir, TDM_ERR_FORMAT, ENGINE_WEIGHTS_INDEX_FILE, NULL);

    write_text(path, "{\"metadata\": {}}");
    expect_open_fails(dir, TDM_ERR_FORMAT, "weight_map", NULL);

    write_sample_dir("bad_total", &s, dir);
    index = load_index(dir);
    json_object_set_new(json_object_get(index, "metadata"), "total_size", json_string("big"));
    store_index(dir, index);
    expect_open_fails(dir, TDM_ERR_FORMAT, "total_size", NULL);
    /* a wrong but well-formed total only warns */
    json_object_set_new(json_object_get(index, "metadata"), "total_size", json_integer(7));
    store_index(dir, index);
    json_decref(index);
    w = open_ok(dir);
    engine_weights_close(w);

    /* a malformed shard: its own error, naming the shard file */
    join(dir, "model-00003-of-00004.safetensors", path);
    write_text(path, "abc");
    expect_open_fails(dir, TDM_ERR_FORMAT, "model-00003-of-00004.safetensors", "shorter");
}

static void test_write_sharded_rejects_bad_input_and_writes_nothing(void **state)
{
    char dir[PATH_BYTES];
    char err[ERR_BYTES] = "";
    sample_t s;
    struct stat st;
    (void)state;

    make_canonical_sample(&s);
    tmp_dir("write_bad", dir);
    remove_dir(dir);
    assert_int_equal(engine_weights_write_sharded(dir, s.tensors, 0, 100, err, sizeof(err)),
                     TDM_ERR_INVALID_ARG);
    assert_int_equal(engine_weights_write_sharded(dir, s.tensors, s.n_tensors, 0, err, sizeof(err)),
                     TDM_ERR_INVALID_ARG);
    s.tensors[3].name = "embed.weight";
    assert_int_equal(
        engine_weights_write_sharded(dir, s.tensors, s.n_tensors, 100, err, sizeof(err)),
        TDM_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "embed.weight: tensor named twice"));
    make_canonical_sample(&s);
    s.tensors[2].n_bytes--;
    assert_int_equal(
        engine_weights_write_sharded(dir, s.tensors, s.n_tensors, 100, err, sizeof(err)),
        TDM_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "layers.0.attn.wq_a.weight"));
    assert_int_equal(stat(dir, &st), -1); /* nothing written, not even the directory */
}

static void test_unwritable_directory_and_unreadable_shard_are_io_errors(void **state)
{
    char dir[PATH_BYTES];
    char file_path[PATH_BYTES];
    char path[PATH_BYTES];
    char err[ERR_BYTES] = "";
    sample_t s;
    (void)state;

    /* a directory "inside" a regular file cannot be created */
    make_canonical_sample(&s);
    tmp_dir("plain_file", file_path);
    remove(file_path);
    join(file_path, "sub", dir);
    assert_int_equal(
        engine_weights_write_sharded(file_path, s.tensors, s.n_tensors, 100, err, sizeof(err)),
        TDM_OK);
    join(file_path, ENGINE_WEIGHTS_INDEX_FILE, path);
    join(path, "sub", dir);
    assert_int_equal(
        engine_weights_write_sharded(dir, s.tensors, s.n_tensors, 100, err, sizeof(err)),
        TDM_ERR_IO);
    assert_non_null(strstr(err, dir));
    remove_dir(file_path);

    /* a shard that is a directory */
    write_sample_dir("shard_is_dir", &s, dir);
    join(dir, "model-00003-of-00004.safetensors", path);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(mkdir(path, 0755), 0);
    expect_open_fails(dir, TDM_ERR_IO, "model-00003-of-00004.safetensors", "not a regular file");
    assert_int_equal(rmdir(path), 0);
}

static double seconds_since(const struct timespec *t0)
{
    struct timespec t1;

    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) +
           (double)(t1.tv_nsec - t0->tv_nsec) / (double)TDM_NS_PER_S;
}

static void test_100k_tensors_open_find_and_check(void **state)
{
    char dir[PATH_BYTES];
    char err[ERR_BYTES] = "";
    engine_st_tensor_t *tensors = calloc(N_MANY, sizeof(*tensors));
    engine_tensor_spec_t *specs = calloc(N_MANY, sizeof(*specs));
    char(*names)[ENGINE_TENSOR_NAME_BYTES] = calloc(N_MANY, sizeof(*names));
    uint8_t *data = malloc(N_MANY);
    engine_weights_t *w;
    struct timespec t0;
    double write_s;
    double open_s;
    double find_s;
    double check_s;
    (void)state;

    assert_non_null(tensors);
    assert_non_null(specs);
    assert_non_null(names);
    assert_non_null(data);
    for (size_t i = 0; i < N_MANY; i++) {
        snprintf(names[i], sizeof(names[i]), "layers.%zu.ffn.experts.%zu.w1.%s", i / 512, i % 512,
                 i % 2 == 0 ? "weight" : "scale");
        data[i] = (uint8_t)i;
        tensors[i].name = names[i];
        tensors[i].dtype = i % 2 == 0 ? ENGINE_DTYPE_U8 : ENGINE_DTYPE_F8_E8M0;
        tensors[i].n_dims = 1;
        tensors[i].shape[0] = 1;
        tensors[i].data = &data[i];
        tensors[i].n_bytes = 1;
        memcpy(specs[i].name, names[i], sizeof(names[i]));
        specs[i].dtype = i % 2 == 0 ? ENGINE_DTYPE_I8 : ENGINE_DTYPE_F8_E8M0;
        specs[i].flags = i % 2 == 0 ? ENGINE_SPEC_FP4_PACKED : ENGINE_SPEC_SCALE;
        specs[i].n_dims = 1;
        specs[i].shape[0] = 1;
    }
    tmp_dir("many", dir);
    remove_dir(dir);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(
        engine_weights_write_sharded(dir, tensors, N_MANY, N_MANY / 4, err, sizeof(err)), TDM_OK);
    write_s = seconds_since(&t0);

    clock_gettime(CLOCK_MONOTONIC, &t0);
    w = open_ok(dir);
    open_s = seconds_since(&t0);
    assert_int_equal(engine_weights_n_shards(w), 4);
    assert_int_equal(engine_weights_n_tensors(w), N_MANY);

    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (size_t i = 0; i < N_MANY; i++) {
        const engine_st_tensor_t *t = engine_weights_find(w, names[i]);
        assert_non_null(t);
        assert_int_equal(*(const uint8_t *)t->data, (uint8_t)i);
    }
    find_s = seconds_since(&t0);

    clock_gettime(CLOCK_MONOTONIC, &t0);
    check_expecting(w, specs, N_MANY, TDM_OK, NULL);
    check_s = seconds_since(&t0);
    print_message("%d tensors: write %.3f s, open %.3f s, %d finds %.3f s, check %.3f s\n", N_MANY,
                  write_s, open_s, N_MANY, find_s, check_s);
    engine_weights_close(w);
    remove_dir(dir);
    free(data);
    free(names);
    free(specs);
    free(tensors);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_write_sharded_then_open_finds_every_tensor),
        cmocka_unit_test(test_write_sharded_is_deterministic_whatever_the_input_order),
        cmocka_unit_test(test_vision_tensor_names_are_recognised),
        cmocka_unit_test(test_scale_aliases_are_found_and_checked_under_the_canonical_name),
        cmocka_unit_test(test_check_accepts_exact_specs_and_reports_each_mismatch),
        cmocka_unit_test(test_check_counts_further_problems_and_rejects_bad_specs),
        cmocka_unit_test(test_fp4_specs_accept_i8_or_u8_only),
        cmocka_unit_test(test_index_disagreeing_with_its_shards_fails),
        cmocka_unit_test(test_tensor_in_two_shards_fails),
        cmocka_unit_test(test_bad_directories_and_indexes_fail),
        cmocka_unit_test(test_write_sharded_rejects_bad_input_and_writes_nothing),
        cmocka_unit_test(test_unwritable_directory_and_unreadable_shard_are_io_errors),
        cmocka_unit_test(test_100k_tensors_open_find_and_check),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
