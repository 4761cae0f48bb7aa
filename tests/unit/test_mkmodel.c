/* test_mkmodel.c - tandem-mkmodel: determinism, the MODEL.md section 9 figures, sharding, and
 * that what it writes loads back through the engine's loaders. Runs the built executable
 * (TANDEM_BIN_DIR) into TANDEM_TEST_TMP. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "engine/config.h"
#include "engine/inventory.h"
#include "engine/weights.h"

#define PATH_BYTES 4096
#define OUTPUT_BYTES 8192

static const char *env_or_skip(const char *name)
{
    const char *value = getenv(name);
    if (value == NULL) {
        print_message("%s not set (run through ctest): skipping\n", name);
    }
    return value;
}

/* $TANDEM_TEST_TMP when it and TANDEM_BIN_DIR are set (ctest sets both); skips the test
 * otherwise. */
static const char *tmp_or_skip(void)
{
    const char *tmp = env_or_skip("TANDEM_TEST_TMP");

    if (tmp == NULL || env_or_skip("TANDEM_BIN_DIR") == NULL) {
        skip();
    }
    return tmp;
}

/* Run tandem-mkmodel with `args`, then `--out $TANDEM_TEST_TMP/<out>` unless out is NULL; stdout
 * into output (may be NULL). Returns the exit status. */
static int run_mkmodel(const char *args, const char *out, char *output, size_t output_bytes)
{
    char command[PATH_BYTES * 2];
    FILE *pipe;
    size_t used = 0;
    int rc;

    snprintf(command, sizeof(command), "%s/tandem-mkmodel --log-level warn %s%s%s%s%s 2>/dev/null",
             getenv("TANDEM_BIN_DIR"), args, out != NULL ? " --out " : "",
             out != NULL ? getenv("TANDEM_TEST_TMP") : "", out != NULL ? "/" : "",
             out != NULL ? out : "");
    pipe = popen(command, "r");
    assert_non_null(pipe);
    if (output != NULL) {
        used = fread(output, 1, output_bytes - 1, pipe);
        output[used] = '\0';
    } else {
        char sink[512];
        while (fread(sink, 1, sizeof(sink), pipe) > 0) {
        }
    }
    rc = pclose(pipe);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static int run_shell(const char *command)
{
    int rc = system(command);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* The integer printed after `label` in mkmodel's figures. */
static long long figure(const char *output, const char *label)
{
    const char *at = strstr(output, label);
    assert_non_null(at);
    return strtoll(at + strlen(label), NULL, 10);
}

static double figure_f(const char *output, const char *label)
{
    const char *at = strstr(output, label);
    assert_non_null(at);
    return strtod(at + strlen(label), NULL);
}

/* |value - table| within half a unit of the table's last printed digit. */
static void assert_rounds_to(long long value, double table_value, double unit)
{
    double diff = (double)value - table_value;
    if (diff < 0) {
        diff = -diff;
    }
    if (diff > unit / 2) {
        fail_msg("%lld does not round to %.3f (unit %g)", value, table_value, unit);
    }
}

static void test_same_seed_same_bytes_other_seed_differs(void **state)
{
    char command[PATH_BYTES * 2];
    const char *tmp;
    (void)state;

    tmp = tmp_or_skip();
    assert_int_equal(run_mkmodel("--preset tiny --seed 7", "mk_a", NULL, 0), 0);
    assert_int_equal(run_mkmodel("--preset tiny --seed 7", "mk_b", NULL, 0), 0);
    assert_int_equal(run_mkmodel("--preset tiny --seed 8", "mk_c", NULL, 0), 0);

    snprintf(command, sizeof(command), "diff -r %s/mk_a %s/mk_b >/dev/null", tmp, tmp);
    assert_int_equal(run_shell(command), 0);
    snprintf(command, sizeof(command),
             "cmp -s %s/mk_a/model-00001-of-00001.safetensors "
             "%s/mk_c/model-00001-of-00001.safetensors",
             tmp, tmp);
    assert_int_not_equal(run_shell(command), 0);
    /* Config and tokenizer do not depend on the seed. */
    snprintf(command, sizeof(command), "cmp -s %s/mk_a/tokenizer.json %s/mk_c/tokenizer.json",
             tmp, tmp);
    assert_int_equal(run_shell(command), 0);
}

/* What tandem-mkmodel prints of a preset: MODEL.md section 9's column for it. */
typedef struct {
    const char *args; /* beside --out */
    const char *out;
    double backbone, engram, dspark, total, active; /* params, to `rounding` (active: 0.1 M) */
    double rounding;
    long kv_row_bytes;
    double kv_rows_per_token, kv_bytes_per_token;
    long ring_entry_bytes; /* window ring entry */
} figures_t;

static void expect_figures(const figures_t *want)
{
    char output[OUTPUT_BYTES];

    (void)tmp_or_skip();
    assert_int_equal(run_mkmodel(want->args, want->out, output, sizeof(output)), 0);
    assert_rounds_to(figure(output, "params backbone"), want->backbone, want->rounding);
    assert_rounds_to(figure(output, "params Engram tables"), want->engram, want->rounding);
    assert_rounds_to(figure(output, "params DSpark"), want->dspark, want->rounding);
    assert_rounds_to(figure(output, "params total"), want->total, want->rounding);
    assert_rounds_to(figure(output, "active decode / token"), want->active, 0.1e6);
    assert_int_equal(figure(output, "KV bytes per row"), want->kv_row_bytes);
    assert_true(figure_f(output, "KV rows per token") == want->kv_rows_per_token);
    assert_true(figure_f(output, "KV bytes per token") == want->kv_bytes_per_token);
    assert_int_equal(figure(output, "window ring entry B"), want->ring_entry_bytes);
}

static void test_tiny_figures_match_model_md_section_9(void **state)
{
    /* 2.05 M / 0.40 M / 0.49 M / 2.94 M; active 1.3 M; KV 53 B/row, 1.5 rows/token,
     * 79.5 B/token; ring entry 66 B. */
    static const figures_t tiny = {"--preset tiny --seed 1",
                                   "mk_tiny",
                                   2.05e6,
                                   0.40e6,
                                   0.49e6,
                                   2.94e6,
                                   1.3e6,
                                   0.01e6,
                                   53,
                                   1.5,
                                   79.5,
                                   66};
    (void)state;

    expect_figures(&tiny);
}

static void test_small_figures_match_model_md_section_9(void **state)
{
    /* 93.9 M / 6.4 M / 8.0 M / 108.3 M; active 44.0 M; KV 106 B/row, 2.0 rows/token,
     * 212 B/token; ring entry 132 B. */
    static const figures_t small = {
        "--preset small --seed 1 --shard-mib 32", "mk_small", 93.9e6, 6.4e6, 8.0e6, 108.3e6,
        44.0e6, 0.1e6, 106, 2.0, 212.0, 132};
    (void)state;

    expect_figures(&small);
}

static void test_sharded_checkpoint_loads_and_matches_inventory(void **state)
{
    char dir[PATH_BYTES];
    char err[512] = "";
    engine_config_t *cfg;
    engine_weights_t *weights = NULL;
    engine_tensor_spec_t *specs = NULL;
    size_t n_specs = 0;
    const char *tmp;
    (void)state;

    tmp = tmp_or_skip();
    snprintf(dir, sizeof(dir), "%s/mk_sharded", tmp);
    assert_int_equal(run_mkmodel("--preset tiny --seed 3 --shard-mib 1", "mk_sharded", NULL, 0), 0);

    cfg = calloc(1, sizeof(*cfg));
    assert_non_null(cfg);
    assert_int_equal(engine_config_load(dir, cfg, err, sizeof(err)), TDM_OK);
    assert_int_equal(cfg->vocab_size, 1024);
    assert_int_equal(cfg->ced_cut, 4);
    assert_int_equal(engine_weights_open(dir, &weights, err, sizeof(err)), TDM_OK);
    assert_true(engine_weights_n_shards(weights) >= 3);
    assert_int_equal(engine_inventory_build(cfg, &specs, &n_specs), TDM_OK);
    assert_int_equal(engine_weights_check(weights, specs, n_specs, err, sizeof(err)), TDM_OK);
    assert_int_equal(engine_weights_n_tensors(weights), n_specs);
    /* The FP8 dense weight has its 32x32 UE8M0 scale; experts are packed FP4. */
    const engine_st_tensor_t *wq_a = engine_weights_find(weights, "layers.3.attn.wq_a.weight");
    const engine_st_tensor_t *wq_a_scale = engine_weights_find(weights, "layers.3.attn.wq_a.scale");
    const engine_st_tensor_t *w1 = engine_weights_find(weights, "layers.3.ffn.experts.5.w1.weight");
    assert_non_null(wq_a);
    assert_non_null(wq_a_scale);
    assert_non_null(w1);
    assert_int_equal(wq_a->dtype, ENGINE_DTYPE_F8_E4M3);
    assert_int_equal(wq_a_scale->shape[0], 2); /* ceil(64 / 32) */
    assert_int_equal(wq_a_scale->shape[1], 4); /* ceil(128 / 32) */
    assert_int_equal(w1->shape[0], 32);
    assert_int_equal(w1->shape[1], 64); /* H/2 packed pairs */
    engine_weights_close(weights);
    free(specs);
    free(cfg);
}

static void test_bad_flags_are_refused(void **state)
{
    (void)state;
    (void)tmp_or_skip();
    assert_int_equal(run_mkmodel("--preset huge", "mk_bad", NULL, 0), 2);
    assert_int_equal(run_mkmodel("--preset tiny", NULL, NULL, 0), 2); /* --out is required */
    assert_int_equal(run_mkmodel("--preset tiny --shard-mib 0", "mk_bad", NULL, 0), 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_seed_same_bytes_other_seed_differs),
        cmocka_unit_test(test_tiny_figures_match_model_md_section_9),
        cmocka_unit_test(test_small_figures_match_model_md_section_9),
        cmocka_unit_test(test_sharded_checkpoint_loads_and_matches_inventory),
        cmocka_unit_test(test_bad_flags_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
