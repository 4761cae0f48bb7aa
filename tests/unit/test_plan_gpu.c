/* test_plan_gpu.c - tandem-convert's GPU layout plan (tools/tandem-convert/plan_gpu.h): the
 * full-size model laid out over expert-parallel GPU groups from its config alone: per-GPU bytes
 * add up to the resident total, layouts that do not fit are refused with their minimum, the KV
 * pool shrinks as the reserves grow, and the expert split covers every expert once (MODEL.md 7,
 * 10; issue 14 item 6).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/config.h"
#include "engine/inventory.h"
#include "tools/tandem-convert/plan_gpu.h"

#define GB 1000000000LL

/* The full-size config, its inventory and counts. */
typedef struct {
    engine_config_t *cfg;
    engine_tensor_spec_t *specs;
    size_t n_specs;
    engine_param_counts_t counts;
} fixture_t;

static int build_fixture(fixture_t *f, int64_t n_routed_experts)
{
    memset(f, 0, sizeof(*f));
    f->cfg = calloc(1, sizeof(*f->cfg));
    if (f->cfg == NULL || engine_config_preset("full", f->cfg) != TDM_OK) {
        return -1;
    }
    if (n_routed_experts > 0) {
        f->cfg->n_routed_experts = n_routed_experts;
    }
    if (engine_inventory_build(f->cfg, &f->specs, &f->n_specs) != TDM_OK ||
        engine_inventory_count(f->cfg, f->specs, f->n_specs, &f->counts) != TDM_OK) {
        return -1;
    }
    return 0;
}

static void free_fixture(fixture_t *f)
{
    free(f->specs);
    free(f->cfg);
}

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof(*f));

    if (f == NULL || build_fixture(f, 0) != 0) {
        return -1;
    }
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;

    free_fixture(f);
    free(f);
    return 0;
}

static plan_gpu_params_t params_for(const char *kind, uint32_t n_gpus, uint32_t group_gpus)
{
    plan_gpu_params_t params;

    plan_gpu_params_default(&params);
    params.kind = plan_gpu_kind_find(kind);
    assert_non_null(params.kind);
    params.n_gpus = n_gpus;
    params.group_gpus = group_gpus;
    return params;
}

/* A heap plan (the struct is ~10 KB). */
static plan_gpu_t *build(const fixture_t *f, const plan_gpu_params_t *params)
{
    plan_gpu_t *plan = calloc(1, sizeof(*plan));

    assert_non_null(plan);
    assert_int_equal(plan_gpu_build(f->cfg, f->specs, f->n_specs, params, plan), TDM_OK);
    return plan;
}

static void test_full_on_2_b300_per_gpu_bytes_sum_to_the_resident_total(void **state)
{
    const fixture_t *f = *state;
    plan_gpu_params_t params = params_for("b300", 2, 2);
    plan_gpu_t *plan = build(f, &params);
    int64_t replicated = plan_formats_total(&plan->replicated);
    int64_t expert_sum = 0;

    /* one copy of the replicated weights plus each GPU's own experts = what the loader holds */
    for (uint32_t g = 0; g < 2; g++) {
        expert_sum += plan->gpus[g].weight_bytes - replicated;
        assert_int_equal(plan->gpus[g].weight_bytes, plan_formats_total(&plan->gpus[g].weights));
    }
    assert_int_equal(replicated + expert_sum, f->counts.resident_bytes);
    assert_int_equal(plan->resident_bytes, f->counts.resident_bytes);
    /* by format too: FP4 lives only in the experts, halved exactly */
    assert_int_equal(plan->gpus[0].weights.fp4 + plan->gpus[1].weights.fp4, f->counts.fp4_bytes);
    assert_int_equal(plan->gpus[0].weights.fp4, plan->gpus[1].weights.fp4);
    /* the DSpark blocks: replicated part on both, experts split */
    assert_int_equal(plan->gpus[0].dspark_bytes + plan->gpus[1].dspark_bytes -
                         plan->dspark_replicated_bytes,
                     f->counts.dspark_bytes);
    /* Engram tables never on a GPU: 202.76 GB of host memory (MODEL.md 10) */
    assert_int_equal(plan->engram_host_bytes, f->counts.engram_table_bytes);
    assert_true(plan->fits);
    assert_int_equal(plan->n_groups, 1);
    assert_true(plan->gpus[0].n_sessions >= 1);
    free(plan);
}

static void test_full_on_1_h200_is_refused_with_the_minimum(void **state)
{
    const fixture_t *f = *state;
    plan_gpu_params_t params = params_for("h200", 1, 1);
    plan_gpu_t *plan = build(f, &params);
    plan_gpu_t *at_min;
    plan_gpu_t *below_min;
    uint32_t min;

    assert_false(plan->fits);
    assert_true(plan->gpus[0].free_bytes < 0);
    assert_int_equal(plan->gpus[0].kv_pages, 0);
    assert_int_equal(plan->gpus[0].n_sessions, 0);
    min = plan->min_group_gpus;
    assert_true(min > 1 && min <= 8);
    /* the minimum fits, one GPU fewer does not */
    params = params_for("h200", min, min);
    at_min = build(f, &params);
    assert_true(at_min->fits);
    params = params_for("h200", min - 1, min - 1);
    below_min = build(f, &params);
    assert_false(below_min->fits);
    free(below_min);
    free(at_min);
    free(plan);
}

static void test_full_on_8_h200_fits(void **state)
{
    const fixture_t *f = *state;
    plan_gpu_params_t params = params_for("h200", 8, 8);
    plan_gpu_t *plan = build(f, &params);

    assert_true(plan->fits);
    for (uint32_t g = 0; g < 8; g++) {
        const plan_gpu_dev_t *dev = &plan->gpus[g];
        assert_true(dev->weight_bytes < 141 * GB);
        assert_int_equal(dev->free_bytes, 141 * GB - dev->weight_bytes - params.reserve_bytes -
                                              params.cuda_reserve_bytes);
        assert_int_equal(dev->kv_pages, dev->free_bytes / plan->page_bytes);
        assert_true(dev->n_sessions >= 1);
        /* the --pages pool leaves room for the sessions' state and holds their pages */
        assert_true(dev->pool_pages * plan->page_bytes + dev->n_sessions * plan->state_bytes <=
                    dev->free_bytes);
        assert_true(dev->pool_pages >= dev->n_sessions * plan->session_pages);
    }
    free(plan);
}

static void test_kv_pages_fall_as_the_reserve_grows(void **state)
{
    const fixture_t *f = *state;
    plan_gpu_params_t params = params_for("b300", 2, 2);
    int64_t last_pages = INT64_MAX;
    int64_t last_sessions = INT64_MAX;
    int64_t first_pages = -1;

    for (int64_t reserve = 0; reserve <= 100 * GB; reserve += 5 * GB) {
        plan_gpu_t *plan;
        params.reserve_bytes = reserve;
        plan = build(f, &params);
        assert_true(plan->gpus[0].kv_pages <= last_pages);
        assert_true(plan->gpus[0].n_sessions <= last_sessions);
        assert_true(plan->gpus[0].kv_tokens >= 0);
        if (first_pages < 0) {
            first_pages = plan->gpus[0].kv_pages;
        }
        last_pages = plan->gpus[0].kv_pages;
        last_sessions = plan->gpus[0].n_sessions;
        free(plan);
    }
    /* 100 GB of reserve costs 100e9 / page bytes pages, give or take one */
    assert_true(first_pages - last_pages >= 100 * GB / 22848 - 1);
}

/* Every group size 1..72: the experts of a layer (and of a block) are covered once, in
 * contiguous ranges whose sizes differ by at most one, larger ones first. */
static void check_split(const fixture_t *f, const char *kind)
{
    for (uint32_t n = 1; n <= PLAN_GPU_MAX_GROUP; n++) {
        plan_gpu_params_t params = params_for(kind, n, n);
        plan_gpu_t *plan = build(f, &params);
        int64_t next = 0;
        int64_t next_dspark = 0;

        for (uint32_t g = 0; g < n; g++) {
            const plan_gpu_dev_t *dev = &plan->gpus[g];
            assert_int_equal(dev->first_expert, next);
            assert_int_equal(dev->first_dspark_expert, next_dspark);
            assert_true(dev->n_experts == f->cfg->n_routed_experts / n ||
                        dev->n_experts == f->cfg->n_routed_experts / n + 1);
            assert_true(g == 0 || dev->n_experts <= plan->gpus[g - 1].n_experts);
            next += dev->n_experts;
            next_dspark += dev->n_dspark_experts;
        }
        assert_int_equal(next, f->cfg->n_routed_experts);
        assert_int_equal(next_dspark, f->cfg->dspark_n_routed_experts);
        free(plan);
    }
}

static void test_expert_split_covers_the_config_expert_counts(void **state)
{
    const fixture_t *f = *state;
    fixture_t odd;
    plan_gpu_params_t params = params_for("h200", 8, 8);
    plan_gpu_t *plan;

    check_split(f, "gb300");
    /* an expert count that does not divide: 385 over 8 GPUs is 49 on GPU 0, 48 on the rest */
    assert_int_equal(build_fixture(&odd, f->cfg->n_routed_experts + 1), 0);
    check_split(&odd, "gb300");
    plan = build(&odd, &params);
    assert_int_equal(plan->n_experts, f->cfg->n_routed_experts + 1);
    assert_int_equal(plan->gpus[0].n_experts, (plan->n_experts + 7) / 8);
    assert_int_equal(plan->gpus[7].n_experts, plan->n_experts / 8);
    assert_true(plan->gpus[0].weight_bytes > plan->gpus[7].weight_bytes);
    assert_int_equal(plan->resident_bytes, odd.counts.resident_bytes);
    free(plan);
    free_fixture(&odd);
}

static void test_session_pages_and_state_follow_model_md_7(void **state)
{
    const fixture_t *f = *state;

    /* sources 2, 8, 14 at ratio 2 and 20 at ratio 1, 64 rows a page */
    assert_int_equal(plan_gpu_session_pages(f->cfg, 131072), 3 * 1024 + 2048);
    assert_int_equal(plan_gpu_session_pages(f->cfg, 1048576), 3 * 8192 + 16384);
    assert_int_equal(plan_gpu_session_pages(f->cfg, 1), 1);
    assert_int_equal(plan_gpu_session_pages(f->cfg, 0), 0);
    /* 43 rings x 134 x 528 B + 3 pending halves x 4096 B + 28 B */
    assert_int_equal(plan_gpu_state_bytes(f->cfg), 3042336 + 12288 + 28);
}

static void test_bad_params_are_refused_and_change_nothing(void **state)
{
    const fixture_t *f = *state;
    plan_gpu_params_t params = params_for("b300", 8, 3);
    plan_gpu_t *plan = calloc(1, sizeof(*plan));
    plan_gpu_t *before = calloc(1, sizeof(*plan));

    assert_non_null(plan);
    assert_non_null(before);
    memset(plan, 0x5a, sizeof(*plan));
    memcpy(before, plan, sizeof(*plan));
    /* a group that does not divide the GPUs */
    assert_int_equal(plan_gpu_build(f->cfg, f->specs, f->n_specs, &params, plan),
                     TDM_ERR_INVALID_ARG);
    /* a group above one NVLink domain */
    params = params_for("gb300", 144, 144);
    assert_int_equal(plan_gpu_build(f->cfg, f->specs, f->n_specs, &params, plan),
                     TDM_ERR_INVALID_ARG);
    /* no group left to decode */
    params = params_for("gb300", 72, 4);
    params.n_prefill_groups = 18;
    assert_int_equal(plan_gpu_build(f->cfg, f->specs, f->n_specs, &params, plan),
                     TDM_ERR_INVALID_ARG);
    /* a context past max_position_embeddings, a negative reserve, no kind */
    params = params_for("b300", 2, 2);
    params.context_tokens = f->cfg->max_position_embeddings + 1;
    assert_int_equal(plan_gpu_build(f->cfg, f->specs, f->n_specs, &params, plan),
                     TDM_ERR_INVALID_ARG);
    params = params_for("b300", 2, 2);
    params.reserve_bytes = -1;
    assert_int_equal(plan_gpu_build(f->cfg, f->specs, f->n_specs, &params, plan),
                     TDM_ERR_INVALID_ARG);
    params.reserve_bytes = 0;
    params.kind = NULL;
    assert_int_equal(plan_gpu_build(f->cfg, f->specs, f->n_specs, &params, plan),
                     TDM_ERR_INVALID_ARG);
    assert_memory_equal(plan, before, sizeof(*plan));
    assert_null(plan_gpu_kind_find("tpu"));
    assert_null(plan_gpu_kind_find(NULL));
    free(before);
    free(plan);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_on_2_b300_per_gpu_bytes_sum_to_the_resident_total),
        cmocka_unit_test(test_full_on_1_h200_is_refused_with_the_minimum),
        cmocka_unit_test(test_full_on_8_h200_fits),
        cmocka_unit_test(test_kv_pages_fall_as_the_reserve_grows),
        cmocka_unit_test(test_expert_split_covers_the_config_expert_counts),
        cmocka_unit_test(test_session_pages_and_state_follow_model_md_7),
        cmocka_unit_test(test_bad_params_are_refused_and_change_nothing),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
