/* test_resident.c - weights in their checkpoint formats (FP8 E4M3 + 32x32 UE8M0, MXFP4 +
 * (row, 32) UE8M0, dequantized in the GEMM's registers) give the logits of the BF16-expanded
 * reference layout byte for byte (MODEL.md 3: the dequantization is exact): the small preset,
 * a 64-token prompt then 40 decode steps, greedy and sampled, under the instruction set the CPU
 * picks. Also: the resident bytes are the stored size (no BF16 copy of FP8/FP4 weights), and
 * the reference mode really expands (2 bytes per expanded parameter). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/arena.h"
#include "engine/forward.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "forward_test_util.h"

enum { PROMPT = 64, STEPS = 40, PAGES = 256 };

typedef struct {
    engine_model_t *model;
    engine_kv_pool_t *pool;
    engine_fwd_t *fwd;
} side_t;

static void side_open(side_t *s, const char *dir, int expand)
{
    engine_model_params_t mp;
    engine_fwd_params_t fp;
    char err[512];
    engine_model_params_default(&mp);
    mp.n_threads = 2;
    mp.expand_bf16 = expand;
    if (engine_model_load(dir, &mp, &s->model, err, sizeof(err)) != TDM_OK) {
        fail_msg("load %s (expand %d): %s", dir, expand, err);
    }
    const engine_config_t *c = engine_model_config(s->model);
    assert_int_equal(engine_kv_pool_create(c, engine_model_fingerprint(s->model), PAGES, &s->pool),
                     TDM_OK);
    engine_fwd_params_default(s->model, &fp);
    assert_int_equal(engine_fwd_create(s->model, s->pool, &fp, &s->fwd), TDM_OK);
}

static void side_close(side_t *s)
{
    engine_fwd_destroy(s->fwd);
    engine_kv_pool_destroy(s->pool);
    engine_model_destroy(s->model);
}

/* Prompt + STEPS decode steps on both sides, the same token fed to both; every logit row must
 * be byte-identical. temperature 0: greedy; else sampled (Gumbel-max, fixed seed). */
static void run_both(side_t *a, side_t *b, double temperature)
{
    const engine_config_t *c = engine_model_config(a->model);
    int64_t V = c->vocab_size;
    float *la = malloc(sizeof(float) * (size_t)V);
    float *lb = malloc(sizeof(float) * (size_t)V);
    int32_t ids[PROMPT];
    engine_seq_t *sa = NULL;
    engine_seq_t *sb = NULL;
    engine_sampler_params_t sp;
    tdm_arena_t arena;
    uint64_t r = 0x2545F4914F6CDD1Dull;

    assert_non_null(la);
    assert_non_null(lb);
    assert_int_equal(tdm_arena_init(&arena, engine_sampler_scratch_bytes(V) + 4096), TDM_OK);
    engine_sampler_params_default(&sp);
    sp.temperature = temperature;
    sp.seed = 7;
    for (int i = 0; i < PROMPT; i++) {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        ids[i] = (int32_t)(16 + r % (uint64_t)(V - 32));
    }
    assert_int_equal(engine_seq_create(a->model, a->pool, &sa), TDM_OK);
    assert_int_equal(engine_seq_create(b->model, b->pool, &sb), TDM_OK);
    assert_int_equal(engine_fwd_prefill(a->fwd, sa, ids, PROMPT, 0, la, NULL), TDM_OK);
    assert_int_equal(engine_fwd_prefill(b->fwd, sb, ids, PROMPT, 0, lb, NULL), TDM_OK);
    assert_memory_equal(la, lb, sizeof(float) * (size_t)V);
    for (int step = 0; step < STEPS; step++) {
        engine_sample_t smp;
        int32_t next;
        assert_int_equal(engine_sampler_sample(&sp, la, V, (uint32_t)(PROMPT + step), &arena, &smp),
                         TDM_OK);
        next = smp.token;
        assert_int_equal(engine_fwd_decode(a->fwd, &sa, &next, 1, la), TDM_OK);
        assert_int_equal(engine_fwd_decode(b->fwd, &sb, &next, 1, lb), TDM_OK);
        if (memcmp(la, lb, sizeof(float) * (size_t)V) != 0) {
            fail_msg("decode step %d (temperature %g): logits differ", step, temperature);
        }
    }
    engine_seq_destroy(sa);
    engine_seq_destroy(sb);
    tdm_arena_fini(&arena);
    free(la);
    free(lb);
}

static void test_small_logits_equal_bf16_expansion(void **state)
{
    char dir[FTU_PATH_BYTES];
    side_t stored = {0};
    side_t expanded = {0};
    engine_model_resident_t rs, re;
    (void)state;
    assert_int_equal(ftu_make_model("small", 1, "resident-small", dir), 0);
    side_open(&stored, dir, 0);
    side_open(&expanded, dir, 1);

    /* Stored formats: FP8 and MXFP4 bytes present, nothing expanded; the reference expanded
     * exactly those parameters at 2 bytes each. */
    engine_model_resident(stored.model, &rs);
    engine_model_resident(expanded.model, &re);
    assert_true(rs.fp8 > 0 && rs.mxfp4 > 0 && rs.scales > 0);
    assert_int_equal(rs.expanded, 0);
    assert_int_equal(re.fp8 + re.mxfp4 + re.scales, 0);
    assert_int_equal(re.expanded, 2 * (rs.fp8 + 2 * rs.mxfp4));
    assert_int_equal(rs.n_params, re.n_params);
    assert_true(engine_model_resident_total(&rs) < engine_model_resident_total(&re));

    run_both(&stored, &expanded, 0.0);
    run_both(&stored, &expanded, 0.8);
    side_close(&stored);
    side_close(&expanded);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_logits_equal_bf16_expansion),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
