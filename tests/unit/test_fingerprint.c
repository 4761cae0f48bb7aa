/* test_fingerprint.c - the one model fingerprint (common/fingerprint.h): its definition byte for
 * byte, its errors, and that the engine's value (engine_model_fingerprint, stamped into KV pages
 * and sent by the workers at registration) equals the router's (router_model_compat, what
 * registration is checked against) for a checkpoint of several shards, with and without
 * tokenizer.json; and the weights digest (tdm_weights_digest): every byte, its definition, and
 * its cache beside the checkpoint or elsewhere. */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "common/fingerprint.h"
#include "common/hash.h"
#include "engine/model.h"
#include "router/model.h"

#define PATH_BYTES    4096
#define FX_PATH_BYTES 1100 /* a fixture directory: $TANDEM_TEST_TMP (<= 1000) + a name */
#define ERR_BYTES     512
#define UNTOUCHED     0x7777u

/* The checkpoints the tests share (group setup). */
typedef struct {
    char sharded[FX_PATH_BYTES]; /* tiny, seed 1, 1 MiB shards, with tokenizer.json */
    char no_tok[FX_PATH_BYTES];  /* the same files without tokenizer.json */
    char seed2[FX_PATH_BYTES];   /* tiny, seed 2 */
    char scratch[FX_PATH_BYTES]; /* hand-made directories */
} fixture_t;

/* 1 if `command` ran and exited 0. */
static int shell_ok(const char *command)
{
    int rc = system(command);
    return rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 0;
}

static int setup(void **state)
{
    const char *tmp = getenv("TANDEM_TEST_TMP");
    const char *bin = getenv("TANDEM_BIN_DIR");
    char command[FX_PATH_BYTES * 16];
    fixture_t *fx;

    if (bin == NULL || tmp == NULL) {
        *state = NULL;
        return 0;
    }
    fx = calloc(1, sizeof(*fx));
    if (fx == NULL) {
        return -1;
    }
    snprintf(fx->sharded, sizeof(fx->sharded), "%.1000s/fp-sharded", tmp);
    snprintf(fx->no_tok, sizeof(fx->no_tok), "%.1000s/fp-no-tokenizer", tmp);
    snprintf(fx->seed2, sizeof(fx->seed2), "%.1000s/fp-seed2", tmp);
    snprintf(fx->scratch, sizeof(fx->scratch), "%.1000s/fp-scratch", tmp);
    snprintf(command, sizeof(command),
             "rm -rf %s %s %s %s && mkdir -p %s && "
             "%.1000s/tandem-mkmodel --log-level warn --preset tiny --seed 1 --shard-mib 1 "
             "--out %s >/dev/null && "
             "%.1000s/tandem-mkmodel --log-level warn --preset tiny --seed 2 --out %s >/dev/null "
             "&& cp -r %s %s && rm %s/tokenizer.json",
             fx->sharded, fx->no_tok, fx->seed2, fx->scratch, fx->scratch, bin, fx->sharded, bin,
             fx->seed2, fx->sharded, fx->no_tok, fx->no_tok);
    if (!shell_ok(command)) {
        free(fx);
        return -1;
    }
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *fx = *state;

    free(fx); /* the checkpoints stay in $TANDEM_TEST_TMP for a look after a failure */
    return 0;
}

static fixture_t *fixture_or_skip(void **state)
{
    if (*state == NULL) {
        print_message("TANDEM_BIN_DIR / TANDEM_TEST_TMP not set (run through ctest): skipping\n");
        skip();
    }
    return *state;
}

static size_t count_shards(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *entry;
    size_t n = 0;

    assert_non_null(d);
    while ((entry = readdir(d)) != NULL) {
        size_t len = strlen(entry->d_name);
        if (len > 12 && strcmp(entry->d_name + len - 12, ".safetensors") == 0) {
            n++;
        }
    }
    closedir(d);
    return n;
}

/* The fingerprint the engine computes when it loads `dir`. */
static uint64_t engine_fingerprint_of(const char *dir)
{
    engine_model_params_t params;
    engine_model_t *model = NULL;
    char err[ERR_BYTES] = "";
    uint64_t fp;

    engine_model_params_default(&params);
    if (engine_model_load(dir, &params, &model, err, sizeof(err)) != TDM_OK) {
        fail_msg("engine_model_load %s: %s", dir, err);
    }
    fp = engine_model_fingerprint(model);
    engine_model_destroy(model);
    return fp;
}

static void write_file(const char *dir, const char *name, const void *bytes, size_t n_bytes)
{
    char path[PATH_BYTES + 64];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bytes, 1, n_bytes, f), n_bytes);
    assert_int_equal(fclose(f), 0);
}

/* A fresh empty directory <scratch>/<name>; path_out gets it. */
static void make_dir(const fixture_t *fx, const char *name, char *path_out)
{
    char command[PATH_BYTES * 3];

    snprintf(path_out, PATH_BYTES, "%.2000s/%s", fx->scratch, name);
    snprintf(command, sizeof(command), "rm -rf %s && mkdir -p %s", path_out, path_out);
    assert_true(shell_ok(command));
}

static void test_engine_and_router_agree_on_a_sharded_checkpoint(void **state)
{
    fixture_t *fx = fixture_or_skip(state);
    router_model_params_t rp = {.model_dir = fx->sharded, .served_name = NULL, .max_context = 0};
    router_model_t *router_model = NULL;
    char err[ERR_BYTES] = "";
    uint64_t fp = 0;

    assert_true(count_shards(fx->sharded) >= 3); /* several weight shards plus the sidecar */
    assert_int_equal(tdm_model_fingerprint(fx->sharded, &fp, err, sizeof(err)), TDM_OK);
    /* what the workers stamp into pages and send in Register.model_fingerprint ... */
    assert_true(engine_fingerprint_of(fx->sharded) == fp);
    /* ... is what the router checks registrations against */
    assert_int_equal(router_model_load(&rp, &router_model, err, sizeof(err)), TDM_OK);
    assert_true(router_model_compat(router_model)->model_fingerprint == fp);
    assert_true(router_model_info(router_model)->fingerprint == fp);
    router_model_destroy(router_model);
}

static void test_tokenizer_json_is_optional_and_counted_when_present(void **state)
{
    fixture_t *fx = fixture_or_skip(state);
    char err[ERR_BYTES] = "";
    uint64_t with_tok = 0;
    uint64_t without_tok = 0;

    assert_int_equal(tdm_model_fingerprint(fx->sharded, &with_tok, err, sizeof(err)), TDM_OK);
    assert_int_equal(tdm_model_fingerprint(fx->no_tok, &without_tok, err, sizeof(err)), TDM_OK);
    assert_true(with_tok != without_tok);
    assert_true(engine_fingerprint_of(fx->no_tok) == without_tok);
}

static void test_fingerprint_is_deterministic_and_tells_seeds_apart(void **state)
{
    fixture_t *fx = fixture_or_skip(state);
    char err[ERR_BYTES] = "";
    uint64_t f1 = 0;
    uint64_t f1_again = 0;
    uint64_t f2 = 0;

    assert_int_equal(tdm_model_fingerprint(fx->sharded, &f1, err, sizeof(err)), TDM_OK);
    assert_int_equal(tdm_model_fingerprint(fx->sharded, &f1_again, err, sizeof(err)), TDM_OK);
    assert_int_equal(tdm_model_fingerprint(fx->seed2, &f2, err, sizeof(err)), TDM_OK);
    assert_true(f1 == f1_again);
    assert_true(f1 != f2);
}

/* A safetensors file: 8-byte little-endian header length, header, data. */
static void write_shard(const char *dir, const char *name, const char *header, size_t data_bytes,
                        unsigned char **bytes_out, size_t *n_bytes_out)
{
    size_t header_bytes = strlen(header);
    size_t n_bytes = 8 + header_bytes + data_bytes;
    unsigned char *bytes = malloc(n_bytes);

    assert_non_null(bytes);
    for (int i = 0; i < 8; i++) {
        bytes[i] = (unsigned char)((uint64_t)header_bytes >> (8 * i));
    }
    memcpy(bytes + 8, header, header_bytes);
    for (size_t i = 0; i < data_bytes; i++) {
        bytes[8 + header_bytes + i] = (unsigned char)(i * 7 + 3);
    }
    write_file(dir, name, bytes, n_bytes);
    *bytes_out = bytes;
    *n_bytes_out = n_bytes;
}

/* h = XXH3(piece, seed h) over pieces of at most TDM_FINGERPRINT_READ_BYTES. */
static uint64_t chain(uint64_t h, const unsigned char *bytes, size_t n_bytes)
{
    for (size_t at = 0; at < n_bytes; at += TDM_FINGERPRINT_READ_BYTES) {
        size_t n =
            n_bytes - at < TDM_FINGERPRINT_READ_BYTES ? n_bytes - at : TDM_FINGERPRINT_READ_BYTES;
        h = tdm_hash_xxh3_64_seeded(bytes + at, n, h);
    }
    return h;
}

static void test_fingerprint_follows_its_definition_byte_for_byte(void **state)
{
    fixture_t *fx = fixture_or_skip(state);
    static const char config[] = "{\"model_type\": \"test\"}";
    static const char tokenizer[] = "{\"version\": \"1.0\"}";
    const char *header_a = "{\"a\":{}}";
    const char *header_b = "{\"b\":{\"dtype\":\"F32\"}}";
    /* b's data is longer than the covered prefix, so only the prefix counts */
    size_t data_a = 3 * TDM_FINGERPRINT_READ_BYTES + 5;
    size_t data_b = TDM_FINGERPRINT_DATA_BYTES + 4096;
    unsigned char *a = NULL;
    unsigned char *b = NULL;
    size_t n_a = 0;
    size_t n_b = 0;
    char dir[PATH_BYTES];
    char err[ERR_BYTES] = "";
    uint64_t want = 0;
    uint64_t got = 0;

    make_dir(fx, "definition", dir);
    write_file(dir, "config.json", config, strlen(config));
    write_file(dir, "tokenizer.json", tokenizer, strlen(tokenizer));
    write_file(dir, "notes.txt", "not hashed", 10);
    /* written in reverse name order: the hash takes them in byte-wise name order */
    write_shard(dir, "b.safetensors", header_b, data_b, &b, &n_b);
    write_shard(dir, "a.safetensors", header_a, data_a, &a, &n_a);

    want = chain(want, (const unsigned char *)config, strlen(config));
    want = chain(want, (const unsigned char *)tokenizer, strlen(tokenizer));
    want = chain(want, a, 8);
    want = chain(want, a + 8, strlen(header_a));
    want = chain(want, a + 8 + strlen(header_a), data_a);
    want = chain(want, b, 8);
    want = chain(want, b + 8, strlen(header_b));
    want = chain(want, b + 8 + strlen(header_b), TDM_FINGERPRINT_DATA_BYTES);
    assert_int_equal(tdm_model_fingerprint(dir, &got, err, sizeof(err)), TDM_OK);
    assert_true(got == want);
    free(a);
    free(b);
}

static void test_each_error_names_the_file_and_leaves_the_output(void **state)
{
    fixture_t *fx = fixture_or_skip(state);
    static const char config[] = "{}";
    static const unsigned char short_shard[4] = {1, 2, 3, 4};
    /* header length 16, but only 4 header bytes follow */
    static const unsigned char cut_shard[12] = {16, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' '};
    /* header length 2^40 */
    static const unsigned char huge_shard[10] = {0, 0, 0, 0, 0, 1, 0, 0, '{', '}'};
    char dir[PATH_BYTES];
    char err[ERR_BYTES] = "";
    uint64_t fp = UNTOUCHED;

    assert_int_equal(tdm_model_fingerprint(NULL, &fp, err, sizeof(err)), TDM_ERR_INVALID_ARG);
    assert_int_equal(tdm_model_fingerprint(fx->sharded, NULL, err, sizeof(err)),
                     TDM_ERR_INVALID_ARG);
    assert_int_equal(tdm_model_fingerprint("/nonexistent/model", &fp, err, sizeof(err)),
                     TDM_ERR_NOT_FOUND);
    assert_non_null(strstr(err, "config.json"));

    make_dir(fx, "no-config", dir);
    write_file(dir, "model.safetensors", short_shard, sizeof(short_shard));
    assert_int_equal(tdm_model_fingerprint(dir, &fp, err, sizeof(err)), TDM_ERR_NOT_FOUND);
    assert_non_null(strstr(err, "config.json"));

    make_dir(fx, "short-shard", dir);
    write_file(dir, "config.json", config, strlen(config));
    write_file(dir, "model.safetensors", short_shard, sizeof(short_shard));
    assert_int_equal(tdm_model_fingerprint(dir, &fp, err, sizeof(err)), TDM_ERR_FORMAT);
    assert_non_null(strstr(err, "model.safetensors"));

    write_file(dir, "model.safetensors", cut_shard, sizeof(cut_shard));
    assert_int_equal(tdm_model_fingerprint(dir, &fp, err, sizeof(err)), TDM_ERR_FORMAT);
    assert_non_null(strstr(err, "header truncated"));

    write_file(dir, "model.safetensors", huge_shard, sizeof(huge_shard));
    assert_int_equal(tdm_model_fingerprint(dir, &fp, err, sizeof(err)), TDM_ERR_FORMAT);
    assert_non_null(strstr(err, "too large"));
    assert_int_equal(fp, UNTOUCHED);
}

/* The largest *.safetensors file of dir (name into name_out) and its size. */
static long largest_shard(const char *dir, char *name_out, size_t name_bytes)
{
    DIR *d = opendir(dir);
    struct dirent *entry;
    long best = -1;

    assert_non_null(d);
    while ((entry = readdir(d)) != NULL) {
        char path[PATH_BYTES + 300];
        struct stat st;
        size_t len = strlen(entry->d_name);
        if (len <= 12 || strcmp(entry->d_name + len - 12, ".safetensors") != 0) {
            continue;
        }
        snprintf(path, sizeof(path), "%s/%s", dir, entry->d_name);
        assert_int_equal(stat(path, &st), 0);
        if ((long)st.st_size > best) {
            best = (long)st.st_size;
            snprintf(name_out, name_bytes, "%s", entry->d_name);
        }
    }
    closedir(d);
    return best;
}

/* Flip the last byte of dir/name (deep in its data region). */
static void flip_last_byte(const char *dir, const char *name)
{
    char path[PATH_BYTES + 300];
    FILE *f;
    int c;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, -1, SEEK_END), 0);
    c = fgetc(f);
    assert_true(c != EOF);
    assert_int_equal(fseek(f, -1, SEEK_END), 0);
    assert_true(fputc(c ^ 0x5a, f) != EOF);
    assert_int_equal(fclose(f), 0);
}

/* Issue 16: a checkpoint with the same config and different weights past each shard's first MiB
 * has the same model fingerprint (the old check let it join) but a different weights digest. */
static void test_weights_digest_tells_apart_what_the_fingerprint_cannot(void **state)
{
    fixture_t *fx = fixture_or_skip(state);
    char dir[PATH_BYTES];
    char command[PATH_BYTES * 3];
    char shard[300];
    char err[ERR_BYTES] = "";
    uint64_t fp_a = 0;
    uint64_t fp_b = 0;
    uint64_t d_a = 0;
    uint64_t d_a_again = 0;
    uint64_t d_a_nocache = 0;
    uint64_t d_b = 0;
    long size;

    make_dir(fx, "revision", dir);
    snprintf(command, sizeof(command), "cp -r %s/. %s/ && rm -f %s/%s", fx->seed2, dir, dir,
             TDM_WEIGHTS_DIGEST_CACHE_NAME);
    assert_true(shell_ok(command));
    size = largest_shard(dir, shard, sizeof(shard));
    assert_true(size > (long)TDM_FINGERPRINT_DATA_BYTES + (1L << 16)); /* past the covered MiB */
    assert_int_equal(tdm_weights_digest(fx->seed2, 0, &d_a, err, sizeof(err)), TDM_OK);
    assert_int_equal(tdm_weights_digest(fx->seed2, 0, &d_a_again, err, sizeof(err)), TDM_OK);
    assert_int_equal(
        tdm_weights_digest(fx->seed2, TDM_WEIGHTS_DIGEST_NO_CACHE, &d_a_nocache, err, sizeof(err)),
        TDM_OK);
    assert_true(d_a == d_a_again && d_a == d_a_nocache);

    flip_last_byte(dir, shard);
    assert_int_equal(tdm_model_fingerprint(fx->seed2, &fp_a, err, sizeof(err)), TDM_OK);
    assert_int_equal(tdm_model_fingerprint(dir, &fp_b, err, sizeof(err)), TDM_OK);
    assert_true(fp_a == fp_b); /* what the registration compared before */
    assert_int_equal(tdm_weights_digest(dir, 0, &d_b, err, sizeof(err)), TDM_OK);
    assert_true(d_a != d_b);
}

static void test_weights_digest_follows_its_definition(void **state)
{
    fixture_t *fx = fixture_or_skip(state);
    const char *header_a = "{\"a\":{}}";
    const char *header_b = "{\"b\":{\"dtype\":\"F32\"}}";
    unsigned char *a = NULL;
    unsigned char *b = NULL;
    unsigned char *all;
    size_t n_a = 0;
    size_t n_b = 0;
    size_t n_all;
    char dir[PATH_BYTES];
    char err[ERR_BYTES] = "";
    uint64_t got = UNTOUCHED;

    make_dir(fx, "digest-definition", dir);
    write_file(dir, "config.json", "{}", 2);
    write_file(dir, "notes.txt", "not hashed", 10);
    write_shard(dir, "b.safetensors", header_b, TDM_WEIGHTS_DIGEST_READ_BYTES + 17, &b, &n_b);
    write_shard(dir, "a.safetensors", header_a, 3 * TDM_FINGERPRINT_DATA_BYTES + 1, &a, &n_a);
    /* (size, XXH3 of the whole file), 8 bytes LE each, shards in name order */
    n_all = 32;
    all = malloc(n_all);
    assert_non_null(all);
    for (int i = 0; i < 8; i++) {
        all[i] = (unsigned char)((uint64_t)n_a >> (8 * i));
        all[8 + i] = (unsigned char)(tdm_hash_xxh3_64(a, n_a) >> (8 * i));
        all[16 + i] = (unsigned char)((uint64_t)n_b >> (8 * i));
        all[24 + i] = (unsigned char)(tdm_hash_xxh3_64(b, n_b) >> (8 * i));
    }
    assert_int_equal(tdm_weights_digest(dir, TDM_WEIGHTS_DIGEST_NO_CACHE, &got, err, sizeof(err)),
                     TDM_OK);
    assert_true(got == tdm_hash_xxh3_64(all, n_all));

    got = UNTOUCHED;
    assert_int_equal(tdm_weights_digest(NULL, 0, &got, err, sizeof(err)), TDM_ERR_INVALID_ARG);
    assert_int_equal(tdm_weights_digest(dir, 0, NULL, err, sizeof(err)), TDM_ERR_INVALID_ARG);
    assert_int_equal(tdm_weights_digest("/nonexistent/model", 0, &got, err, sizeof(err)),
                     TDM_ERR_NOT_FOUND);
    assert_int_equal(got, UNTOUCHED);
    free(all);
    free(a);
    free(b);
}

/* Read the text of dir/name into buf (NUL-terminated); 0 when absent. */
static size_t read_text(const char *path, char *buf, size_t buf_bytes)
{
    FILE *f = fopen(path, "rb");
    size_t n;

    if (f == NULL) {
        return 0;
    }
    n = fread(buf, 1, buf_bytes - 1, f);
    buf[n] = '\0';
    fclose(f);
    return n;
}

/* The cache beside the checkpoint is used while the shards are unchanged, invalidated when one
 * changes, and moves to $TANDEM_CACHE_DIR when the checkpoint's cache path cannot be written. */
static void test_weights_digest_cache_is_keyed_by_the_shards(void **state)
{
    fixture_t *fx = fixture_or_skip(state);
    char dir[PATH_BYTES];
    char cache_dir[PATH_BYTES];
    char path[PATH_BYTES + 64];
    char text[8192];
    char command[PATH_BYTES * 6];
    char err[ERR_BYTES] = "";
    const char *header = "{\"w\":{}}";
    unsigned char *w = NULL;
    size_t n_w = 0;
    uint64_t truth = 0;
    uint64_t got = 0;
    char *line;

    make_dir(fx, "digest-cache", dir);
    write_shard(dir, "w.safetensors", header, 5000, &w, &n_w);
    assert_int_equal(tdm_weights_digest(dir, 0, &truth, err, sizeof(err)), TDM_OK);
    snprintf(path, sizeof(path), "%s/%s", dir, TDM_WEIGHTS_DIGEST_CACHE_NAME);
    assert_true(read_text(path, text, sizeof(text)) > 0);
    assert_non_null(strstr(text, "w.safetensors"));

    /* a forged digest under the same key is believed: the cache is read, not recomputed */
    line = strstr(text, "digest 0x");
    assert_non_null(line);
    snprintf(line, sizeof(text) - (size_t)(line - text), "digest 0x%016llx\n", 0x1234ull);
    write_file(dir, TDM_WEIGHTS_DIGEST_CACHE_NAME, text, strlen(text));
    assert_int_equal(tdm_weights_digest(dir, 0, &got, err, sizeof(err)), TDM_OK);
    assert_true(got == 0x1234ull);
    /* ... not with NO_CACHE */
    assert_int_equal(tdm_weights_digest(dir, TDM_WEIGHTS_DIGEST_NO_CACHE, &got, err, sizeof(err)),
                     TDM_OK);
    assert_true(got == truth);

    /* a changed shard (size and mtime) invalidates the key */
    free(w);
    write_shard(dir, "w.safetensors", header, 5001, &w, &n_w);
    assert_int_equal(tdm_weights_digest(dir, 0, &got, err, sizeof(err)), TDM_OK);
    assert_true(got != 0x1234ull && got != truth);
    assert_int_equal(tdm_weights_digest(dir, TDM_WEIGHTS_DIGEST_NO_CACHE, &truth, err,
                                        sizeof(err)),
                     TDM_OK);
    assert_true(got == truth);

    /* the checkpoint's cache path cannot be written (a directory sits there, which stops root
     * too): the digest is cached under $TANDEM_CACHE_DIR instead, and read back from there */
    snprintf(cache_dir, sizeof(cache_dir), "%.2000s/digest-cache-elsewhere", fx->scratch);
    snprintf(command, sizeof(command), "rm -rf %s %s && mkdir -p %s %s", path, cache_dir, path,
             cache_dir);
    assert_true(shell_ok(command));
    assert_int_equal(setenv("TANDEM_CACHE_DIR", cache_dir, 1), 0);
    assert_int_equal(tdm_weights_digest(dir, 0, &got, err, sizeof(err)), TDM_OK);
    assert_true(got == truth);
    snprintf(command, sizeof(command), "ls %s/weights-*.digest >/dev/null 2>&1", cache_dir);
    assert_true(shell_ok(command));
    assert_int_equal(tdm_weights_digest(dir, 0, &got, err, sizeof(err)), TDM_OK);
    assert_true(got == truth);
    unsetenv("TANDEM_CACHE_DIR");
    free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_engine_and_router_agree_on_a_sharded_checkpoint),
        cmocka_unit_test(test_tokenizer_json_is_optional_and_counted_when_present),
        cmocka_unit_test(test_fingerprint_is_deterministic_and_tells_seeds_apart),
        cmocka_unit_test(test_fingerprint_follows_its_definition_byte_for_byte),
        cmocka_unit_test(test_each_error_names_the_file_and_leaves_the_output),
        cmocka_unit_test(test_weights_digest_tells_apart_what_the_fingerprint_cannot),
        cmocka_unit_test(test_weights_digest_follows_its_definition),
        cmocka_unit_test(test_weights_digest_cache_is_keyed_by_the_shards),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
