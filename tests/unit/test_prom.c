/* test_prom.c - the Prometheus text renderer (common/prom.h): HELP and TYPE per family, label and
 * HELP escaping, histogram buckets (cumulative, +Inf, _sum, _count), special values; the output
 * passes tests/unit/prom_check.h and, when promtool is on PATH, `promtool check metrics`.
 */
#include "common/prom.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "prom_check.h"

static char *render_sample_page(void)
{
    static const double bounds[] = {0.001, 0.5, 2.0};
    static const uint64_t counts[] = {1, 0, 3, 2};
    const tdm_prom_histogram_t hist = {bounds, 3, counts, 7.25};
    const tdm_prom_label_t esc[] = {{"code", "a\"b\\c\nd"}, {"status", "400"}};
    const tdm_prom_label_t op = {"op", "put"};
    tdm_prom_t *p;
    char *text = NULL;
    size_t n_bytes = 0;

    assert_int_equal(tdm_prom_create(&p), TDM_OK);
    tdm_prom_counter(p, "t_requests_total", "requests\nwith a \\ backslash", 42);
    tdm_prom_family(p, "t_errors_total", TDM_PROM_COUNTER, "errors by code");
    tdm_prom_sample_u64(p, esc, 2, UINT64_MAX);
    tdm_prom_gauge(p, "t_ratio", "a gauge", 0.25);
    tdm_prom_family(p, "t_special", TDM_PROM_GAUGE, "special values");
    tdm_prom_sample(p, &op, 1, INFINITY);
    tdm_prom_family(p, "t_latency_seconds", TDM_PROM_HISTOGRAM, "latency");
    tdm_prom_histogram(p, &op, 1, &hist);
    tdm_prom_histogram(p, NULL, 0, &hist);
    assert_int_equal(tdm_prom_finish(p, &text, &n_bytes), TDM_OK);
    assert_int_equal(n_bytes, strlen(text));
    return text;
}

static void test_renders_the_exposition_format(void **state)
{
    char *text = render_sample_page();

    (void)state;
    assert_non_null(strstr(text, "# HELP t_requests_total requests\\nwith a \\\\ backslash\n"
                                 "# TYPE t_requests_total counter\nt_requests_total 42\n"));
    assert_non_null(strstr(text, "t_errors_total{code=\"a\\\"b\\\\c\\nd\",status=\"400\"} "
                                 "18446744073709551615\n"));
    assert_non_null(strstr(text, "# TYPE t_ratio gauge\nt_ratio 0.25\n"));
    assert_non_null(strstr(text, "t_special{op=\"put\"} +Inf\n"));
    assert_non_null(strstr(text, "# TYPE t_latency_seconds histogram\n"
                                 "t_latency_seconds_bucket{op=\"put\",le=\"0.001\"} 1\n"
                                 "t_latency_seconds_bucket{op=\"put\",le=\"0.5\"} 1\n"
                                 "t_latency_seconds_bucket{op=\"put\",le=\"2\"} 4\n"
                                 "t_latency_seconds_bucket{op=\"put\",le=\"+Inf\"} 6\n"
                                 "t_latency_seconds_sum{op=\"put\"} 7.25\n"
                                 "t_latency_seconds_count{op=\"put\"} 6\n"
                                 "t_latency_seconds_bucket{le=\"0.001\"} 1\n"));
    assert_non_null(strstr(text, "t_latency_seconds_sum 7.25\nt_latency_seconds_count 6\n"));
    free(text);
}

static void test_output_passes_the_checker_and_promtool(void **state)
{
    char *text = render_sample_page();
    char err[512], out[4096], path[1024];
    const char *tmp = getenv("TANDEM_TEST_TMP");
    int status = 0, ran;

    (void)state;
    assert_null(prom_check_text(text, err, sizeof(err)));
    /* The checker itself: a family without HELP/TYPE, a counter without _total, _ms. */
    assert_non_null(prom_check_text("x_total 1\n", err, sizeof(err)));
    assert_non_null(prom_check_text("# HELP x y\n# TYPE x counter\nx 1\n", err, sizeof(err)));
    assert_non_null(
        prom_check_text("# HELP x_ms y\n# TYPE x_ms gauge\nx_ms 1\n", err, sizeof(err)));
    snprintf(path, sizeof(path), "%s/test-prom.txt", tmp != NULL ? tmp : "/tmp");
    ran = prom_check_promtool(text, path, out, sizeof(out), &status);
    assert_true(ran >= 0);
    if (ran == 0) {
        print_message("skip: promtool: %s\n", out);
    } else {
        assert_int_equal(status, 0);
        assert_string_equal(out, "");
    }
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_renders_the_exposition_format),
        cmocka_unit_test(test_output_passes_the_checker_and_promtool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
