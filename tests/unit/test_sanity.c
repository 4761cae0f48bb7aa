/* test_sanity.c - the MODEL.md 9.1 sanity check (engine/sanity.h): a generated tiny checkpoint
 * passes; one whose router can never pick an expert is refused, naming layer and expert, and
 * tandem-mkmodel's own check ran (its output reports it). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "engine/sanity.h"
#include "engine/weights.h"
#include "forward_test_util.h"

static void test_generated_tiny_checkpoint_passes(void **state)
{
    (void)state;
    char dir[FTU_PATH_BYTES];
    char err[256];
    engine_sanity_report_t rep;
    assert_int_equal(ftu_make_model("tiny", 1, "fwd-tiny", dir), 0);
    assert_int_equal(engine_sanity_check(dir, 1, &rep, err, sizeof(err)), TDM_OK);
    assert_true(rep.max_abs_logit > 0.0 && rep.max_abs_logit <= ENGINE_SANITY_MAX_ABS_LOGIT);
    assert_int_equal(rep.n_nonfinite, 0);
    assert_true(rep.min_expert_tokens > 0);
}

static void test_dead_expert_is_refused_with_its_name(void **state)
{
    (void)state;
    char dir[FTU_PATH_BYTES];
    char cmd[FTU_PATH_BYTES * 3];
    char shard[FTU_PATH_BYTES * 2];
    char err[256];
    engine_weights_t *w = NULL;
    uint64_t header_len = 0;
    unsigned char len_bytes[8];
    const char *tmp = getenv("TANDEM_TEST_TMP");
    assert_non_null(tmp);
    snprintf(dir, sizeof(dir), "%s/sanity-dead-expert", tmp);
    snprintf(cmd, sizeof(cmd), "rm -rf %s && %s/tandem-mkmodel --log-level error --preset tiny "
             "--seed 2 --out %s > /dev/null", dir, getenv("TANDEM_BIN_DIR"), dir);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(engine_weights_open(dir, &w, err, sizeof(err)), TDM_OK);
    assert_int_equal(engine_weights_n_shards(w), 1);
    const engine_st_tensor_t *t = engine_weights_find(w, "layers.3.ffn.gate.bias");
    assert_non_null(t);
    uint64_t off = t->data_offset + 5 * sizeof(float);
    engine_weights_close(w);
    snprintf(shard, sizeof(shard), "%s/model-00001-of-00001.safetensors", dir);
    FILE *f = fopen(shard, "r+b");
    assert_non_null(f);
    assert_int_equal(fread(len_bytes, 1, 8, f), 8);
    for (int b = 7; b >= 0; b--) {
        header_len = (header_len << 8) | len_bytes[b];
    }
    float dead = -1000.0f; /* expert 5 of layer 3 can never reach the top-K */
    assert_int_equal(fseek(f, (long)(8 + header_len + off), SEEK_SET), 0);
    assert_int_equal(fwrite(&dead, sizeof(float), 1, f), 1);
    fclose(f);
    assert_int_equal(engine_sanity_check(dir, 1, NULL, err, sizeof(err)), TDM_ERR_MISMATCH);
    assert_non_null(strstr(err, "expert 5 of layer 3"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generated_tiny_checkpoint_passes),
        cmocka_unit_test(test_dead_expert_is_refused_with_its_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
