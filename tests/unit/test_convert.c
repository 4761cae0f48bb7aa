/* test_convert.c - tandem-convert and what it is built from: numpy's default_rng reproduced
 * (engine/np_random.h, MODEL.md 9.2's multiplier constants), the token normaliser
 * (engine/engram_tokmap.h), a sidecar-less tandem-mkmodel checkpoint that refuses to load and,
 * converted, loads with mkmodel's own sidecar tensors and logits, refusals naming the missing
 * shard or the bad tensor, and the full-size memory plan of MODEL.md 10. Runs the built
 * executables (TANDEM_BIN_DIR) into TANDEM_TEST_TMP. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/config.h"
#include "engine/engram_hash.h"
#include "engine/engram_tokmap.h"
#include "engine/model.h"
#include "engine/np_random.h"
#include "engine/safetensors.h"
#include "engine/weights.h"

#define PATH_BYTES   1024
#define ARG_BYTES    4096
#define CMD_BYTES    16384
#define OUTPUT_BYTES 16384

/* Run `command` through the shell; stdout and stderr into output. Returns the exit status. */
static int run_capture(const char *command, char *output, size_t output_bytes)
{
    char full[CMD_BYTES + 16];
    FILE *pipe;
    size_t used;
    int rc;

    snprintf(full, sizeof(full), "%s 2>&1", command);
    pipe = popen(full, "r");
    assert_non_null(pipe);
    used = fread(output, 1, output_bytes - 1, pipe);
    output[used] = '\0';
    while (fread(full, 1, sizeof(full), pipe) > 0) {
    }
    rc = pclose(pipe);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* The TANDEM_BIN_DIR and TANDEM_TEST_TMP folders, or skip (run through ctest). */
static void need_env(const char **bin_out, const char **tmp_out)
{
    *bin_out = getenv("TANDEM_BIN_DIR");
    *tmp_out = getenv("TANDEM_TEST_TMP");
    if (*bin_out == NULL || *tmp_out == NULL) {
        print_message("TANDEM_BIN_DIR / TANDEM_TEST_TMP not set (run through ctest): skipping\n");
        skip();
    }
}

/* A tiny tandem-mkmodel checkpoint in tmp/name (with or without the sidecar). */
static void make_tiny(const char *bin, const char *tmp, const char *name, const char *extra)
{
    char command[CMD_BYTES];
    char output[OUTPUT_BYTES];

    snprintf(command, sizeof(command),
             "rm -rf '%s/%s' && '%s/tandem-mkmodel' --log-level warn --preset tiny --seed 5 %s "
             "--out '%s/%s'",
             tmp, name, bin, extra, tmp, name);
    assert_int_equal(run_capture(command, output, sizeof(output)), 0);
}

static int run_convert(const char *bin, const char *args, char *output, size_t output_bytes)
{
    char command[2 * CMD_BYTES];
    snprintf(command, sizeof(command), "'%s/tandem-convert' --log-level warn %s", bin, args);
    return run_capture(command, output, output_bytes);
}

/* ---- numpy's generator ---------------------------------------------------------------------- */

static void test_release_multipliers_equal_model_md_constants(void **state)
{
    /* MODEL.md 9.2: numpy default_rng(10007*l).integers(0, b_mu, size=4, dtype=int64)*2+1 */
    static const int64_t layer1[4] = {76632096046245LL, 4839876093313LL, 35959672319349LL,
                                      73987337458391LL};
    static const int64_t layer14[4] = {67716810739261LL, 51510806800915LL, 30921347202721LL,
                                       82619226485591LL};
    engine_config_t *cfg = calloc(1, sizeof(*cfg));
    int64_t mult[2 * 4];
    (void)state;

    assert_non_null(cfg);
    assert_int_equal(engine_config_preset("full", cfg), TDM_OK);
    assert_int_equal(cfg->n_engram_layer_ids, 2);
    assert_int_equal(cfg->engram_max_ngram_size, 4);
    assert_int_equal(engine_engram_mult_bound(cfg->engram_compressed_vocab_size), 46539438283891LL);
    engine_engram_release_multipliers(cfg, mult);
    assert_memory_equal(mult, layer1, sizeof(layer1));
    assert_memory_equal(mult + 4, layer14, sizeof(layer14));
    free(cfg);
}

static void test_np_rng_matches_numpy_on_every_bounded_path(void **state)
{
    /* Values printed by numpy 1.24: default_rng(seed).integers(0, high, size=n, dtype=int64). */
    static const int64_t small_range[4] = {670, 805, 22, 807}; /* (5, 1000) */
    static const int64_t u32_range[4] = {2881021351LL, 3457461229LL, 97294836LL,
                                         3470079268LL}; /* (5, 2^32-1) */
    static const int64_t two_word_seed[2] = {406235465101464LL, 707335636485302LL}; /* 2^40 */
    int64_t got[4];
    engine_np_rng_t rng;
    (void)state;

    engine_np_rng_seed(5, &rng);
    assert_int_equal(engine_np_rng_integers_i64(&rng, 0, 1000, 4, got), TDM_OK);
    assert_memory_equal(got, small_range, sizeof(small_range));
    engine_np_rng_seed(5, &rng);
    assert_int_equal(engine_np_rng_integers_i64(&rng, 0, 4294967295LL, 4, got), TDM_OK);
    assert_memory_equal(got, u32_range, sizeof(u32_range));
    engine_np_rng_seed(1ULL << 40, &rng);
    assert_int_equal(engine_np_rng_integers_i64(&rng, 0, 1LL << 50, 2, got), TDM_OK);
    assert_memory_equal(got, two_word_seed, sizeof(two_word_seed));
    assert_int_equal(engine_np_rng_integers_i64(&rng, 3, 3, 1, got), TDM_ERR_INVALID_ARG);
}

/* ---- normaliser ------------------------------------------------------------------------------ */

static void expect_norm(const char *text, const char *want)
{
    char *norm = NULL;
    size_t n_norm = 0;

    assert_int_equal(engine_engram_normalize(text, strlen(text), &norm, &n_norm), TDM_OK);
    assert_int_equal(n_norm, strlen(want));
    assert_memory_equal(norm, want, n_norm);
    free(norm);
}

static void test_normalizer_follows_model_md_9_2(void **state)
{
    (void)state;
    expect_norm(" Hello", "hello");            /* lowercase, strip */
    expect_norm("  A\t\r\nB  ", "a b");        /* runs of [ \t\r\n] to one space */
    expect_norm(" ", " ");                     /* a lone space survives the strip */
    expect_norm("\n\t", " ");                  /* ... also after collapsing */
    expect_norm("Caf\xC3\xA9", "cafe");        /* NFD + strip accents */
    expect_norm("\xEF\xAC\x81", "fi");         /* NFKC: U+FB01 ligature */
    expect_norm("\xEF\xBC\xA1", "a");          /* NFKC: fullwidth A */
    expect_norm("\xC2\xA0x\xE3\x80\x80", "x"); /* NBSP, ideographic space: stripped */
    expect_norm("\xEE\x80\x80", " ");          /* U+E000 becomes a space (sentinel) */
    expect_norm("", "");
    {
        char *norm = NULL;
        size_t n_norm = 0;
        assert_int_equal(engine_engram_normalize("\xFF", 1, &norm, &n_norm), TDM_ERR_FORMAT);
        assert_null(norm);
    }
}

/* ---- the converter on tiny checkpoints ------------------------------------------------------ */

static void test_sidecarless_checkpoint_refuses_to_load_naming_the_sidecar(void **state)
{
    const char *bin;
    const char *tmp;
    char dir[PATH_BYTES];
    char err[1024] = "";
    engine_model_params_t params;
    engine_model_t *model = NULL;
    (void)state;

    need_env(&bin, &tmp);
    make_tiny(bin, tmp, "cv_nosidecar", "--no-sidecar");
    snprintf(dir, sizeof(dir), "%s/cv_nosidecar/%s", tmp, ENGINE_ENGRAM_SIDECAR_FILE);
    assert_int_not_equal(access(dir, F_OK), 0);
    snprintf(dir, sizeof(dir), "%s/cv_nosidecar", tmp);
    engine_model_params_default(&params);
    params.n_threads = 1;
    assert_int_equal(engine_model_load(dir, &params, &model, err, sizeof(err)), TDM_ERR_NOT_FOUND);
    assert_null(model);
    assert_non_null(strstr(err, ENGINE_ENGRAM_SIDECAR_FILE));
    assert_non_null(strstr(err, "tandem-convert"));
}

/* Tensor `name` of the sidecar in dir: its bytes copied into a new buffer (caller frees). */
static void *sidecar_tensor(const char *dir, const char *name, size_t *n_bytes_out)
{
    char path[PATH_BYTES];
    char err[512];
    engine_st_file_t *file = NULL;
    const engine_st_tensor_t *tensor;
    void *copy;

    snprintf(path, sizeof(path), "%s/%s", dir, ENGINE_ENGRAM_SIDECAR_FILE);
    assert_int_equal(engine_st_file_open(path, &file, err, sizeof(err)), TDM_OK);
    tensor = engine_st_file_find(file, name);
    assert_non_null(tensor);
    copy = malloc(tensor->n_bytes + 1);
    assert_non_null(copy);
    memcpy(copy, tensor->data, tensor->n_bytes);
    *n_bytes_out = tensor->n_bytes;
    engine_st_file_close(file);
    return copy;
}

static void test_converted_checkpoint_equals_mkmodel_sidecar_and_logits(void **state)
{
    static const char *const names[] = {"token_map", "multipliers", "primes", "offsets"};
    const char *bin;
    const char *tmp;
    char ref[PATH_BYTES];
    char conv[PATH_BYTES];
    char args[ARG_BYTES];
    char command[CMD_BYTES];
    char output[OUTPUT_BYTES];
    (void)state;

    need_env(&bin, &tmp);
    make_tiny(bin, tmp, "cv_ref", "");
    make_tiny(bin, tmp, "cv_conv", "--no-sidecar");
    snprintf(ref, sizeof(ref), "%s/cv_ref", tmp);
    snprintf(conv, sizeof(conv), "%s/cv_conv", tmp);

    /* the default (release) rule refuses a random checkpoint's tokenizer: 598 keys != 520 */
    snprintf(args, sizeof(args), "--model '%s'", conv);
    assert_int_equal(run_convert(bin, args, output, sizeof(output)), 1);
    assert_non_null(strstr(output, "engram_compressed_vocab_size is 520"));

    snprintf(args, sizeof(args), "--model '%s' --random-weights", conv);
    assert_int_equal(run_convert(bin, args, output, sizeof(output)), 0);
    assert_non_null(strstr(output, "compressed_vocab_size=520"));
    assert_non_null(strstr(output, "loaded weights total"));
    /* a second run refuses to replace it without --force */
    assert_int_equal(run_convert(bin, args, output, sizeof(output)), 1);
    assert_non_null(strstr(output, "--force"));

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        size_t n_ref = 0;
        size_t n_conv = 0;
        void *a = sidecar_tensor(ref, names[i], &n_ref);
        void *b = sidecar_tensor(conv, names[i], &n_conv);
        assert_int_equal(n_ref, n_conv);
        assert_memory_equal(a, b, n_ref);
        free(a);
        free(b);
    }

    snprintf(command, sizeof(command), "%s/tandem-generate", bin);
    if (access(command, X_OK) != 0) {
        print_message("%s not built: logits comparison skipped\n", command);
        return;
    }
    snprintf(command, sizeof(command),
             "for d in cv_ref cv_conv; do '%s/tandem-generate' --log-level warn --threads 1 "
             "--model '%s'/$d --prompt 'def fib(n):' --max-tokens 4 "
             "--dump-logits '%s'/$d.logits >/dev/null || exit 1; done && "
             "cmp '%s/cv_ref.logits' '%s/cv_conv.logits'",
             bin, tmp, tmp, tmp, tmp);
    assert_int_equal(run_capture(command, output, sizeof(output)), 0);
}

static void test_missing_shard_is_refused_naming_it(void **state)
{
    const char *bin;
    const char *tmp;
    char command[CMD_BYTES];
    char output[OUTPUT_BYTES];
    (void)state;

    need_env(&bin, &tmp);
    make_tiny(bin, tmp, "cv_shard", "--no-sidecar --shard-mib 1");
    snprintf(command, sizeof(command), "rm '%s/cv_shard/model-00002-of-00004.safetensors'", tmp);
    assert_int_equal(run_capture(command, output, sizeof(output)), 0);
    snprintf(command, sizeof(command), "--model '%s/cv_shard' --random-weights", tmp);
    assert_int_equal(run_convert(bin, command, output, sizeof(output)), 1);
    assert_non_null(strstr(output, "model-00002-of-00004.safetensors"));
    snprintf(command, sizeof(command), "%s/cv_shard/%s", tmp, ENGINE_ENGRAM_SIDECAR_FILE);
    assert_int_not_equal(access(command, F_OK), 0);
}

/*
 * Rewrite the tiny checkpoint `from` into `to` with tensor `name` changed: its dtype to
 * new_dtype (same element size) or its two dimensions swapped. config.json and tokenizer.json
 * are copied.
 */
static void rewrite_with(const char *tmp, const char *from, const char *to, const char *name,
                         int new_dtype, int swap_dims)
{
    char src[PATH_BYTES];
    char dst[PATH_BYTES];
    char err[512] = "";
    char command[CMD_BYTES];
    char output[OUTPUT_BYTES];
    engine_weights_t *weights = NULL;
    engine_st_tensor_t *tensors;
    size_t n;
    int found = 0;

    snprintf(src, sizeof(src), "%s/%s", tmp, from);
    snprintf(dst, sizeof(dst), "%s/%s", tmp, to);
    snprintf(command, sizeof(command),
             "rm -rf '%s' && mkdir -p '%s' && cp '%s/config.json' '%s/tokenizer.json' '%s/'", dst,
             dst, src, src, dst);
    assert_int_equal(run_capture(command, output, sizeof(output)), 0);
    assert_int_equal(engine_weights_open(src, &weights, err, sizeof(err)), TDM_OK);
    n = engine_weights_n_tensors(weights);
    tensors = calloc(n, sizeof(*tensors));
    assert_non_null(tensors);
    for (size_t i = 0; i < n; i++) {
        tensors[i] = *engine_weights_tensor_at(weights, i);
        if (strcmp(tensors[i].name, name) == 0) {
            found = 1;
            if (new_dtype >= 0) {
                tensors[i].dtype = (engine_dtype_t)new_dtype;
            }
            if (swap_dims) {
                int64_t d0 = tensors[i].shape[0];
                assert_int_equal(tensors[i].n_dims, 2);
                tensors[i].shape[0] = tensors[i].shape[1];
                tensors[i].shape[1] = d0;
            }
        }
    }
    assert_true(found);
    assert_int_equal(engine_weights_write_sharded(dst, tensors, n, 64u << 20, err, sizeof(err)),
                     TDM_OK);
    free(tensors);
    engine_weights_close(weights);
}

static void test_wrong_dtype_and_shape_are_refused_naming_the_tensor(void **state)
{
    const char *bin;
    const char *tmp;
    char args[ARG_BYTES];
    char output[OUTPUT_BYTES];
    (void)state;

    need_env(&bin, &tmp);
    make_tiny(bin, tmp, "cv_src", "--no-sidecar");

    rewrite_with(tmp, "cv_src", "cv_dtype", "norm.weight", ENGINE_DTYPE_F16, 0);
    snprintf(args, sizeof(args), "--model '%s/cv_dtype' --random-weights", tmp);
    assert_int_equal(run_convert(bin, args, output, sizeof(output)), 1);
    assert_non_null(strstr(output, "norm.weight"));
    assert_non_null(strstr(output, "F16"));

    rewrite_with(tmp, "cv_src", "cv_shape", "layers.3.attn.wq_a.weight", -1, 1);
    snprintf(args, sizeof(args), "--model '%s/cv_shape' --random-weights", tmp);
    assert_int_equal(run_convert(bin, args, output, sizeof(output)), 1);
    assert_non_null(strstr(output, "layers.3.attn.wq_a.weight"));
    assert_non_null(strstr(output, "shape"));
}

/* ---- sizing -------------------------------------------------------------------------------- */

/* The "<bytes> B <GB> GB" after `label` in the plan; checks the GB text too. */
static long long plan_bytes(const char *output, const char *label, const char *want_gb)
{
    const char *at = strstr(output, label);
    long long n_bytes = 0;
    char gb[32] = "";

    assert_non_null(at);
    assert_int_equal(sscanf(at + strlen(label), " %lld B %31s GB", &n_bytes, gb), 2);
    assert_string_equal(gb, want_gb);
    return n_bytes;
}

static void test_full_preset_plan_matches_model_md_10(void **state)
{
    const char *bin;
    const char *tmp;
    char output[OUTPUT_BYTES];
    (void)state;

    need_env(&bin, &tmp);
    assert_int_equal(run_convert(bin, "--preset full --pages 1024", output, sizeof(output)), 0);
    /* MODEL.md 10: 307.53 GB = FP8 7.40 + FP4 278.59 + E8M0 17.42 + BF16 3.95 + F32 0.17;
     * 306.56 GB text-only; Engram tables 202.76 GB */
    assert_int_equal(plan_bytes(output, "release weights total", "307.53"), 307527990600LL);
    plan_bytes(output, "release FP8 E4M3 codes", "7.40");
    plan_bytes(output, "release FP4 experts (packed E2M1)", "278.59");
    plan_bytes(output, "release E8M0 scales", "17.42");
    plan_bytes(output, "release BF16", "3.95");
    plan_bytes(output, "release F32", "0.17");
    plan_bytes(output, "loaded weights total", "306.56");
    plan_bytes(output, "of which DSpark blocks", "7.93");
    assert_int_equal(plan_bytes(output, "Engram tables (host memory)", "202.76"),
                     768022850LL * 264);
    /* KV: 22,848-byte pages (d 512, d_I 128) */
    assert_int_equal(plan_bytes(output, "KV pool", "0.02"), 22848LL * 1024);
    assert_int_equal(run_convert(bin, "--preset huge", output, sizeof(output)), 2);
    assert_int_equal(run_convert(bin, "", output, sizeof(output)), 2);
}

/* --gpu: the layout from the config alone; a set that cannot hold the model is refused with its
 * minimum (exit 1), bad layout flags are usage errors (exit 2). */
static void test_gpu_plan_fits_or_names_the_minimum(void **state)
{
    const char *bin;
    const char *tmp;
    char output[OUTPUT_BYTES];
    (void)state;

    need_env(&bin, &tmp);
    assert_int_equal(run_convert(bin, "--preset full --gpu b300 --gpus 2", output, sizeof(output)),
                     0);
    assert_non_null(strstr(output, "384 over 2 GPUs: 192 on each"));
    plan_bytes(output, "resident weights (one copy)", "306.56");
    assert_non_null(strstr(output, "fits: "));
    assert_int_equal(run_convert(bin, "--preset full --gpu h200 --gpus 1", output, sizeof(output)),
                     1);
    assert_non_null(strstr(output, "does not fit"));
    assert_non_null(strstr(output, "minimum: 3 x h200"));
    assert_int_equal(run_convert(bin, "--preset full --gpu h200", output, sizeof(output)), 0);
    assert_non_null(strstr(output, ": 3 x h200"));
    assert_int_equal(run_convert(bin, "--preset full --gpu tpu", output, sizeof(output)), 2);
    assert_int_equal(
        run_convert(bin, "--preset full --gpu h200 --gpus 8 --group 3", output, sizeof(output)), 2);
    assert_int_equal(
        run_convert(bin, "--preset tiny --gpu h200 --context 9000", output, sizeof(output)), 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_release_multipliers_equal_model_md_constants),
        cmocka_unit_test(test_np_rng_matches_numpy_on_every_bounded_path),
        cmocka_unit_test(test_normalizer_follows_model_md_9_2),
        cmocka_unit_test(test_sidecarless_checkpoint_refuses_to_load_naming_the_sidecar),
        cmocka_unit_test(test_converted_checkpoint_equals_mkmodel_sidecar_and_logits),
        cmocka_unit_test(test_missing_shard_is_refused_naming_it),
        cmocka_unit_test(test_wrong_dtype_and_shape_are_refused_naming_the_tensor),
        cmocka_unit_test(test_full_preset_plan_matches_model_md_10),
        cmocka_unit_test(test_gpu_plan_fits_or_names_the_minimum),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
