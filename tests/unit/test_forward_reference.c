/* test_forward_reference.c - teacher-forced comparison of every engine layer with the independent
 * numpy reference (tests/reference/teacher_forced.py, MODEL.md 6(e) and 12.6(b)): the engine's
 * oracle forward of tiny-preset prompts is dumped in the 12.10 layout (with l.pre.f32) and the
 * reference runs each layer on the engine's inputs; it must report rel L2 <= 2^-6 and no
 * selection or expert flip outside near-ties (exit code 0). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "forward_test_util.h"

static void run_prompt(int64_t T, uint64_t seed)
{
    char model_dir[FTU_PATH_BYTES];
    char dump_dir[FTU_PATH_BYTES + 64];
    char cmd[FTU_PATH_BYTES * 6];
    const char *src = getenv("TANDEM_SOURCE_DIR");
    engine_model_params_t mp;
    engine_model_t *model = NULL;
    engine_kv_pool_t *pool = NULL;
    engine_fwd_t *fwd = NULL;
    engine_fwd_params_t fp;
    ftu_dump_t dump;
    engine_dump_sink_t sink;
    char err[256];

    if (src == NULL || access("/usr/bin/python3", X_OK) != 0) {
        print_message("no TANDEM_SOURCE_DIR or /usr/bin/python3: skipping\n");
        skip();
    }
    assert_int_equal(ftu_make_model("tiny", 1, "fwd-tiny", model_dir), 0);
    engine_model_params_default(&mp);
    assert_int_equal(engine_model_load(model_dir, &mp, &model, err, sizeof(err)), TDM_OK);
    const engine_config_t *cfg = engine_model_config(model);
    assert_int_equal(engine_kv_pool_create(cfg, engine_model_fingerprint(model), 256, &pool),
                     TDM_OK);
    engine_fwd_params_default(model, &fp);
    assert_int_equal(engine_fwd_create(model, pool, &fp, &fwd), TDM_OK);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)T);
    float *logits = malloc(sizeof(float) * (size_t)(T * cfg->vocab_size));
    ftu_prompt(seed, cfg->vocab_size, ids, T);
    ftu_dump_init(&dump, cfg, 0, T);
    sink.user = &dump;
    sink.layer = ftu_dump_cb;
    engine_fwd_set_dump(fwd, &sink);
    assert_int_equal(engine_fwd_oracle(fwd, ids, T, logits), TDM_OK);
    snprintf(dump_dir, sizeof(dump_dir), "%s/fwd-dump-%lld-%llu", getenv("TANDEM_TEST_TMP"),
             (long long)T, (unsigned long long)seed);
    assert_int_equal(ftu_dump_write(&dump, dump_dir, ids), 0);
    {
        /* logits of every position, TDLOGIT1 (12.10) */
        char lpath[FTU_PATH_BYTES + 128];
        unsigned char hdr[32] = {'T', 'D', 'L', 'O', 'G', 'I', 'T', '1'};
        uint32_t rows = (uint32_t)T, vocab = (uint32_t)cfg->vocab_size;
        memcpy(hdr + 8, &rows, 4);
        memcpy(hdr + 12, &vocab, 4);
        snprintf(lpath, sizeof(lpath), "%s/logits.bin", dump_dir);
        FILE *f = fopen(lpath, "wb");
        assert_non_null(f);
        fwrite(hdr, 1, 32, f);
        fwrite(logits, sizeof(float), (size_t)(T * cfg->vocab_size), f);
        fclose(f);
    }
    snprintf(cmd, sizeof(cmd),
             "cd %s/tests/reference && /usr/bin/python3 teacher_forced.py --model %s --dump %s "
             "--logits %s/logits.bin",
             src, model_dir, dump_dir, dump_dir);
    int rc = system(cmd);
    ftu_dump_fini(&dump);
    free(ids);
    free(logits);
    engine_fwd_destroy(fwd);
    engine_kv_pool_destroy(pool);
    engine_model_destroy(model);
    assert_int_equal(WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, 0);
}

static void test_teacher_forced_layers_match_reference_short_prompt(void **state)
{
    (void)state;
    run_prompt(12, 5);
}

static void test_teacher_forced_layers_match_reference_200_tokens(void **state)
{
    (void)state;
    run_prompt(200, 7);
}

static void test_teacher_forced_layers_match_reference_512_tokens(void **state)
{
    (void)state;
    run_prompt(512, 11);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_teacher_forced_layers_match_reference_short_prompt),
        cmocka_unit_test(test_teacher_forced_layers_match_reference_200_tokens),
        cmocka_unit_test(test_teacher_forced_layers_match_reference_512_tokens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
