/* forward_test_util.h - helpers shared by the forward-pass tests: make the tiny checkpoint with
 * the built tandem-mkmodel, load it with a page pool and a forward context (ftu_engine_t), and
 * collect --dump-layers records (MODEL.md 12.10). */
#ifndef TANDEM_TESTS_FORWARD_TEST_UTIL_H
#define TANDEM_TESTS_FORWARD_TEST_UTIL_H

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/arena.h"
#include "engine/forward.h"

#define FTU_PATH_BYTES 4096

/* Write a preset checkpoint into $TANDEM_TEST_TMP/<name> (once per tandem-mkmodel build); path_out
 * gets its directory. Tests run in parallel (ctest -j) and several use the same preset: the
 * check and the write hold an exclusive flock on <name>.lock, so a test never reads a checkpoint
 * another test is still writing.
 * Returns 0 on success. */
static inline int ftu_make_model(const char *preset, uint64_t seed, const char *name,
                                 char *path_out)
{
    char cmd[FTU_PATH_BYTES * 2];
    char marker[FTU_PATH_BYTES + 32];
    char lock_path[FTU_PATH_BYTES + 32];
    struct stat st;
    const char *tmp = getenv("TANDEM_TEST_TMP");
    const char *bin = getenv("TANDEM_BIN_DIR");
    int rc = 0;
    if (tmp == NULL || bin == NULL) {
        return -1;
    }
    snprintf(path_out, FTU_PATH_BYTES, "%s/%s", tmp, name);
    snprintf(marker, sizeof(marker), "%s/config.json", path_out);
    snprintf(lock_path, sizeof(lock_path), "%s.lock", path_out);
    int lock_fd = open(lock_path, O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    if (lock_fd < 0 || flock(lock_fd, LOCK_EX) != 0) {
        if (lock_fd >= 0) {
            close(lock_fd);
        }
        return -1;
    }
    snprintf(cmd, sizeof(cmd), "%s/tandem-mkmodel", bin);
    /* Reused while it is newer than the tandem-mkmodel that would write it: a rebuilt generator
     * (a new special token, a new tensor) makes every cached model again. */
    struct stat gen;
    if (stat(marker, &st) != 0 || (stat(cmd, &gen) == 0 && st.st_mtime < gen.st_mtime)) {
        snprintf(cmd, sizeof(cmd),
                 "%s/tandem-mkmodel --log-level warn --preset %s --seed %llu --out %s >/dev/null",
                 bin, preset, (unsigned long long)seed, path_out);
        int status = system(cmd);
        rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    flock(lock_fd, LOCK_UN);
    close(lock_fd);
    return rc;
}

/* A loaded checkpoint with its page pool and forward context: a forward test's fixture. */
typedef struct {
    engine_model_t *model;
    const engine_config_t *cfg; /* the model's; borrowed */
    engine_kv_pool_t *pool;
    engine_fwd_t *fwd;
    uint32_t free_at_start; /* pool pages free after setup: teardown checks they all came back */
    int64_t V;              /* vocab_size */
    tdm_arena_t arena;      /* scratch a test may tdm_arena_init; zeroed otherwise */
} ftu_engine_t;

/* Make (once) and load `preset` (seed 1; "tiny", "small", ...) with 2 threads on kernel table
 * `ops` (NULL: the model's default, the CPU table), a pool of n_pages pages and a forward context
 * of max_chunk_tokens per pass (0: the default) into the zeroed *e. Returns 0, or -1 after
 * printing why (*e may hold what was made: ftu_engine_close releases it). */
static inline int ftu_engine_open_preset(ftu_engine_t *e, const char *preset, uint32_t n_pages,
                                         const kern_ops_t *ops, int64_t max_chunk_tokens)
{
    char dir[FTU_PATH_BYTES];
    char name[64];
    char err[256];
    engine_model_params_t mp;
    engine_fwd_params_t fp;

    snprintf(name, sizeof(name), "fwd-%s", preset);
    if (ftu_make_model(preset, 1, name, dir) != 0) {
        return -1;
    }
    engine_model_params_default(&mp);
    mp.n_threads = 2;
    if (ops != NULL) {
        mp.ops = ops;
    }
    if (engine_model_load(dir, &mp, &e->model, err, sizeof(err)) != TDM_OK) {
        fprintf(stderr, "load: %s\n", err);
        return -1;
    }
    e->cfg = engine_model_config(e->model);
    e->V = e->cfg->vocab_size;
    /* the pages in the table's memory (host memory for the CPU table, as engine_kv_pool_create) */
    if (engine_kv_pool_create_ops(e->cfg, engine_model_fingerprint(e->model), n_pages,
                                  engine_model_ops(e->model), &e->pool) != TDM_OK) {
        return -1;
    }
    engine_fwd_params_default(e->model, &fp);
    if (max_chunk_tokens > 0) {
        fp.max_chunk_tokens = max_chunk_tokens;
    }
    if (engine_fwd_create(e->model, e->pool, &fp, &e->fwd) != TDM_OK) {
        return -1;
    }
    e->free_at_start = engine_kv_pool_n_free(e->pool);
    return 0;
}

/* ftu_engine_open_on - ftu_engine_open_preset of the tiny preset. */
static inline int ftu_engine_open_on(ftu_engine_t *e, uint32_t n_pages, const kern_ops_t *ops,
                                     int64_t max_chunk_tokens)
{
    return ftu_engine_open_preset(e, "tiny", n_pages, ops, max_chunk_tokens);
}

/* ftu_engine_open - ftu_engine_open_on with the CPU table and the default chunk size. */
static inline int ftu_engine_open(ftu_engine_t *e, uint32_t n_pages)
{
    return ftu_engine_open_on(e, n_pages, NULL, 0);
}

/* Release everything ftu_engine_open (and the test, for the arena) made. Returns 0 when every
 * pool page came back (the teardown check), else -1. */
static inline int ftu_engine_close(ftu_engine_t *e)
{
    int ok = e->pool == NULL || engine_kv_pool_n_free(e->pool) == e->free_at_start;

    tdm_arena_fini(&e->arena);
    engine_fwd_destroy(e->fwd);
    engine_kv_pool_destroy(e->pool);
    engine_model_destroy(e->model);
    return ok ? 0 : -1;
}

/* cmocka group/test setup: a calloc'ed ftu_engine_t opened with n_pages pool pages into *state.
 * Returns 0, or -1 (the test does not run). */
static inline int ftu_fixture_setup(void **state, uint32_t n_pages)
{
    ftu_engine_t *fx = calloc(1, sizeof(*fx));
    if (fx == NULL || ftu_engine_open(fx, n_pages) != 0) {
        return -1;
    }
    *state = fx;
    return 0;
}

/* cmocka teardown of ftu_fixture_setup: closes and frees *state; -1 (a failure) when a pool page
 * did not come back. */
static inline int ftu_fixture_teardown(void **state)
{
    ftu_engine_t *fx = *state;
    int ok = ftu_engine_close(fx) == 0; /* every test returns its pages */
    free(fx);
    return ok ? 0 : -1;
}

/* A new empty sequence on the fixture's model and pool (asserts success). */
static inline engine_seq_t *ftu_new_seq(ftu_engine_t *fx)
{
    engine_seq_t *seq = NULL;
    assert_int_equal(engine_seq_create(fx->model, fx->pool, &seq), TDM_OK);
    return seq;
}

/* Cosine similarity of two [n] FP32 vectors, accumulated in double. */
static inline double ftu_cosine(const float *a, const float *b, int64_t n)
{
    double ab = 0, aa = 0, bb = 0;
    for (int64_t i = 0; i < n; i++) {
        ab += (double)a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
    }
    return ab / sqrt(aa * bb + 1e-300);
}

/* Index of the largest of v[n] (the lowest index on ties). */
static inline int64_t ftu_argmax(const float *v, int64_t n)
{
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++) {
        if (v[i] > v[best]) {
            best = i;
        }
    }
    return best;
}

/* Random prompt of n ids in [3, V - 3) (no image or noise token), seeded. */
static inline void ftu_prompt(uint64_t seed, int64_t V, int32_t *ids, int64_t n)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ids[i] = (int32_t)(3 + s % (uint64_t)(V - 6));
    }
}

/* Floats ftu_run_schedule writes at most on e with n_decode decode steps. */
static inline int64_t ftu_schedule_floats(const ftu_engine_t *e, int n_decode)
{
    return (2 + 2 * (int64_t)n_decode + 2 + 1) * e->V + 2 +
           e->cfg->dspark_block_size * e->cfg->hidden_size;
}

/* The forward tests' common schedule on engine e: CED prefill of two sequences from one prompt of
 * prompt_len (<= 512) ids (the second 7 shorter), n_decode batched decode steps (<= 16), one
 * greedy step (engine_fwd_decode_greedy: its two ids as floats), verify of two tokens, a DSpark
 * draft (models with blocks) and a recovery replay of the second sequence; every logit, id and
 * draft output appended to out (ftu_schedule_floats). Returns the floats written. */
static inline int64_t ftu_run_schedule(ftu_engine_t *e, int64_t prompt_len, int n_decode,
                                       float *out)
{
    const int64_t V = e->V, H = e->cfg->hidden_size;
    int32_t prompt[512];
    int32_t next[2], greedy[2];
    int32_t hist[512 + 16 + 1]; /* the ids of sequence 1, for the replay */
    int64_t n_hist = prompt_len - 7;
    engine_seq_t *seqs[2];
    int64_t at = 0;

    assert_true(prompt_len > 7 && prompt_len <= 512 && n_decode >= 0 && n_decode <= 16);
    ftu_prompt(21, V, prompt, prompt_len);
    memcpy(hist, prompt, sizeof(int32_t) * (size_t)n_hist);
    for (int i = 0; i < 2; i++) {
        seqs[i] = ftu_new_seq(e);
        assert_int_equal(
            engine_fwd_prefill(e->fwd, seqs[i], prompt, prompt_len - 7 * i, 0, out + at, NULL),
            TDM_OK);
        next[i] = (int32_t)ftu_argmax(out + at, V);
        at += V;
    }
    for (int step = 0; step < n_decode; step++) {
        hist[n_hist++] = next[1];
        assert_int_equal(engine_fwd_decode(e->fwd, seqs, next, 2, out + at), TDM_OK);
        for (int i = 0; i < 2; i++) {
            next[i] = (int32_t)ftu_argmax(out + at + i * V, V);
        }
        at += 2 * V;
    }
    hist[n_hist++] = next[1];
    assert_int_equal(engine_fwd_decode_greedy(e->fwd, seqs, next, 2, greedy), TDM_OK);
    for (int i = 0; i < 2; i++) {
        out[at++] = (float)greedy[i]; /* only the ids leave the backend */
        next[i] = greedy[i];
    }
    assert_int_equal(engine_fwd_verify(e->fwd, seqs[0], next, 2, out + at), TDM_OK);
    at += 2 * V;
    if (e->cfg->n_blocks > 0) {
        assert_int_equal(engine_fwd_dspark_draft(e->fwd, &seqs[1], &next[1], 1, out + at), TDM_OK);
        at += e->cfg->dspark_block_size * H;
    }
    assert_int_equal(engine_seq_length(seqs[1]), n_hist);
    assert_int_equal(
        engine_fwd_replay(e->fwd, seqs[1], hist, n_hist, ENGINE_REPLAY_RECOVERY, out + at), TDM_OK);
    at += V;
    engine_seq_destroy(seqs[0]);
    engine_seq_destroy(seqs[1]);
    return at;
}

/* Layer dumps gathered in memory: per layer [T, m, H] in/out, [T, m] pre, [T, k_I], [T, K]. */
typedef struct {
    int n_layers;
    int64_t T;
    int64_t first;
    int m;
    int64_t H, k_I, K;
    float *x_in[64];
    float *x_out[64];
    float *pre[64];
    int32_t *sel[64];
    int32_t *experts[64];
    int64_t rows_seen[64];
} ftu_dump_t;

static inline void ftu_dump_init(ftu_dump_t *d, const engine_config_t *cfg, int64_t first,
                                 int64_t T)
{
    memset(d, 0, sizeof(*d));
    d->n_layers = cfg->n_layers;
    d->T = T;
    d->first = first;
    d->m = (int)cfg->hc_mult;
    d->H = cfg->hidden_size;
    d->k_I = cfg->index_topk;
    d->K = cfg->num_experts_per_tok;
    for (int l = 0; l < d->n_layers; l++) {
        d->x_in[l] = calloc((size_t)(T * d->m * d->H), sizeof(float));
        d->x_out[l] = calloc((size_t)(T * d->m * d->H), sizeof(float));
        d->pre[l] = calloc((size_t)(T * d->m), sizeof(float));
        d->sel[l] = calloc((size_t)(T * d->k_I), sizeof(int32_t));
        d->experts[l] = calloc((size_t)(T * d->K), sizeof(int32_t));
    }
}

static inline void ftu_dump_fini(ftu_dump_t *d)
{
    for (int l = 0; l < d->n_layers; l++) {
        free(d->x_in[l]);
        free(d->x_out[l]);
        free(d->pre[l]);
        free(d->sel[l]);
        free(d->experts[l]);
    }
}

static inline void ftu_dump_cb(void *user, const engine_dump_layer_t *rec)
{
    ftu_dump_t *d = user;
    int l = rec->layer;
    int64_t off = rec->first_position - d->first;
    int64_t mH = (int64_t)d->m * d->H;
    if (l < 0 || l >= d->n_layers || off < 0 || off + rec->n_rows > d->T) {
        return;
    }
    memcpy(d->x_in[l] + off * mH, rec->x_in, (size_t)(rec->n_rows * mH) * sizeof(float));
    memcpy(d->x_out[l] + off * mH, rec->x_out, (size_t)(rec->n_rows * mH) * sizeof(float));
    memcpy(d->pre[l] + off * d->m, rec->pre, (size_t)(rec->n_rows * d->m) * sizeof(float));
    memcpy(d->sel[l] + off * d->k_I, rec->sel, (size_t)(rec->n_rows * d->k_I) * sizeof(int32_t));
    memcpy(d->experts[l] + off * d->K, rec->experts,
           (size_t)(rec->n_rows * d->K) * sizeof(int32_t));
    d->rows_seen[l] += rec->n_rows;
}

static inline int ftu_write_file(const char *dir, const char *name, const void *data, size_t n)
{
    char path[FTU_PATH_BYTES * 2 + 128];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL) {
        return -1;
    }
    size_t w = fwrite(data, 1, n, f);
    fclose(f);
    return w == n ? 0 : -1;
}

/* Write the dump as a 12.10 --dump-layers directory (plus l.pre.f32 and the ids). */
static inline int ftu_dump_write(const ftu_dump_t *d, const char *dir, const int32_t *ids)
{
    char name[64];
    char path[FTU_PATH_BYTES * 2];
    mkdir(dir, 0755);
    for (int l = 0; l < d->n_layers; l++) {
        size_t nx = (size_t)(d->T * d->m * d->H) * sizeof(float);
        snprintf(name, sizeof(name), "%d.in.f32", l);
        ftu_write_file(dir, name, d->x_in[l], nx);
        snprintf(name, sizeof(name), "%d.out.f32", l);
        ftu_write_file(dir, name, d->x_out[l], nx);
        snprintf(name, sizeof(name), "%d.pre.f32", l);
        ftu_write_file(dir, name, d->pre[l], (size_t)(d->T * d->m) * sizeof(float));
        snprintf(name, sizeof(name), "%d.sel.i32", l);
        ftu_write_file(dir, name, d->sel[l], (size_t)(d->T * d->k_I) * sizeof(int32_t));
        snprintf(name, sizeof(name), "%d.experts.i32", l);
        ftu_write_file(dir, name, d->experts[l], (size_t)(d->T * d->K) * sizeof(int32_t));
    }
    snprintf(path, sizeof(path), "%s/manifest.json", dir);
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        return -1;
    }
    fprintf(f,
            "{\"format\": \"tandem-dump-layers\", \"writer\": \"tandem engine tests\", "
            "\"schedule\": \"oracle\", \"first_position\": %lld, \"T\": %lld, \"m\": %d, "
            "\"H\": %lld, \"k_I\": %lld, \"K\": %lld, \"layers\": [",
            (long long)d->first, (long long)d->T, d->m, (long long)d->H, (long long)d->k_I,
            (long long)d->K);
    for (int l = 0; l < d->n_layers; l++) {
        fprintf(f, "%s%d", l > 0 ? ", " : "", l);
    }
    fprintf(f, "], \"ids\": [");
    for (int64_t i = 0; i < d->T; i++) {
        fprintf(f, "%s%d", i > 0 ? ", " : "", ids[i]);
    }
    fprintf(f, "]}\n");
    fclose(f);
    return 0;
}

#endif
