/* test_sim_run.c - sim/sim.h over the real cost model (sim/perf.h) and the router's placement:
 * a small run drained to the end decodes every token of every turn it started (conservation);
 * the same seed gives the same run and another seed a different one; on two racks every remote
 * prefill stays in its decode instance's rack (NVLink) while the rack has a prefill instance;
 * bad configs are refused with a reason. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "sim/perf.h"
#include "sim/sim.h"
#include "sim/workload.h"

static sim_workload_t *synthetic(void)
{
    sim_workload_opts_t opts;
    sim_workload_t *wl = NULL;

    sim_workload_opts_default(&opts);
    opts.tool_pause_ms = 1000;
    assert_int_equal(sim_workload_synthetic(3, 32, &opts, &wl), TDM_OK);
    return wl;
}

static void small_config(sim_config_t *cfg, const char *gpu, uint32_t racks, uint32_t agents)
{
    sim_config_default(cfg);
    cfg->perf.gpu = sim_gpu_find(gpu);
    assert_non_null(cfg->perf.gpu);
    cfg->racks = racks;
    cfg->agents = agents;
    cfg->duration_s = 120.0;
    cfg->warmup_s = 10.0;
    cfg->ramp_s = 5.0;
}

static void test_drained_run_conserves_tokens(void **state)
{
    sim_workload_t *wl = synthetic();
    sim_config_t cfg;
    sim_result_t r;
    char err[256] = "";

    (void)state;
    small_config(&cfg, "gb300", 1, 200);
    cfg.drain = 1;
    assert_int_equal(sim_run(&cfg, wl, &r, err, sizeof(err)), TDM_OK);
    assert_true(r.turns_started > 200);
    assert_int_equal(r.turns_done, r.turns_started);
    assert_int_equal(r.output_tokens_done, r.output_tokens_started);
    assert_true(r.end_s >= cfg.duration_s - 1.0);
    /* every prompt token is either prefilled or reused from KV */
    assert_true(r.prefill_tokens > 0 && r.cached_tokens > 0);
    assert_int_equal(r.local_prefills + r.remote_prefills, r.turns_started);
    assert_true(r.output_tok_s > 0.0 && r.power_w > 0.0 && r.tok_s_per_mw > 0.0);
    assert_true(r.agent_tok_s > 0.0 && r.ttft_p50_s > 0.0 && r.ttft_p99_s >= r.ttft_p50_s);
    assert_true(r.decode_batch_mean >= 1.0);
    assert_int_equal(r.gpus_total, 72);
    assert_true(r.prefill_per_rack >= 1 && r.decode_per_rack >= 1);
    sim_workload_destroy(wl);
}

/* Everything but the host wall time. */
static void assert_same_run(const sim_result_t *a, const sim_result_t *b)
{
    sim_result_t x, y;

    memcpy(&x, a, sizeof(x));
    memcpy(&y, b, sizeof(y));

    x.wall_s = y.wall_s = 0.0;
    assert_memory_equal(&x, &y, sizeof(x));
}

static void test_deterministic_for_a_seed(void **state)
{
    sim_workload_t *wl = synthetic();
    sim_config_t cfg;
    sim_result_t a, b, c;
    char err[256] = "";

    (void)state;
    small_config(&cfg, "h200", 1, 40);
    assert_int_equal(sim_run(&cfg, wl, &a, err, sizeof(err)), TDM_OK);
    assert_int_equal(sim_run(&cfg, wl, &b, err, sizeof(err)), TDM_OK);
    assert_same_run(&a, &b);
    cfg.seed = 2;
    assert_int_equal(sim_run(&cfg, wl, &c, err, sizeof(err)), TDM_OK);
    assert_true(a.turns_started != c.turns_started ||
                a.output_tokens_done != c.output_tokens_done || a.events != c.events);
    sim_workload_destroy(wl);
}

static void test_prefill_stays_in_the_rack(void **state)
{
    sim_workload_t *wl = synthetic();
    sim_config_t cfg;
    sim_result_t r;
    char err[256] = "";

    (void)state;
    small_config(&cfg, "b300", 3, 60);
    assert_int_equal(sim_run(&cfg, wl, &r, err, sizeof(err)), TDM_OK);
    assert_true(r.prefill_per_rack >= 1);
    assert_true(r.remote_prefills > 0);
    assert_int_equal(r.rack_local_prefills, r.remote_prefills);
    assert_int_equal(r.gpus_total, 24);
    sim_workload_destroy(wl);
}

static void test_bad_config_refused(void **state)
{
    sim_workload_t *wl = synthetic();
    sim_config_t cfg;
    sim_result_t r;
    char err[256] = "";

    (void)state;
    small_config(&cfg, "gb300", 0, 10);
    assert_int_equal(sim_run(&cfg, wl, &r, err, sizeof(err)), TDM_ERR_INVALID_ARG);
    assert_true(strlen(err) > 0);
    small_config(&cfg, "gb300", 1, 10);
    cfg.perf.gpu = NULL;
    assert_int_equal(sim_run(&cfg, wl, &r, err, sizeof(err)), TDM_ERR_INVALID_ARG);
    small_config(&cfg, "gb300", 1, 10);
    cfg.warmup_s = cfg.duration_s;
    assert_int_equal(sim_run(&cfg, wl, &r, err, sizeof(err)), TDM_ERR_INVALID_ARG);
    sim_workload_destroy(wl);
}

static void test_batch1_speed(void **state)
{
    sim_perf_params_t params;
    char err[256] = "";
    double h200, gb300;

    (void)state;
    sim_perf_params_default(&params);
    params.gpu = sim_gpu_find("h200");
    h200 = sim_batch1_tok_s(&params, 32768, err, sizeof(err));
    params.gpu = sim_gpu_find("gb300");
    gb300 = sim_batch1_tok_s(&params, 32768, err, sizeof(err));
    assert_true(h200 > 1.0 && gb300 > 1.0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_drained_run_conserves_tokens),
        cmocka_unit_test(test_deterministic_for_a_seed),
        cmocka_unit_test(test_prefill_stays_in_the_rack),
        cmocka_unit_test(test_bad_config_refused),
        cmocka_unit_test(test_batch1_speed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
