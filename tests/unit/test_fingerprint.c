/* test_fingerprint.c - the one model fingerprint (common/fingerprint.h): its definition byte for
 * byte, its errors, and that the engine's value (engine_model_fingerprint, stamped into KV pages
 * and sent by the workers at registration) equals the router's (router_model_compat, what
 * registration is checked against) for a checkpoint of several shards, with and without
 * tokenizer.json. */
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_engine_and_router_agree_on_a_sharded_checkpoint),
        cmocka_unit_test(test_tokenizer_json_is_optional_and_counted_when_present),
        cmocka_unit_test(test_fingerprint_is_deterministic_and_tells_seeds_apart),
        cmocka_unit_test(test_fingerprint_follows_its_definition_byte_for_byte),
        cmocka_unit_test(test_each_error_names_the_file_and_leaves_the_output),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
