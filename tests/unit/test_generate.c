/* test_generate.c - tools/tandem-generate end to end on the tiny preset (MODEL.md 6, 8, 12.6,
 * 12.10): the built executable is run as a user would run it.
 *
 * - oracle logits (--dump-logits) against the independent numpy reference (run_oracle.py) over
 *   16 prompts of 64-512 tokens, prompt and decoded positions: statistics, never a per-row bound
 *   (12.6);
 * - CED vs oracle first-token logits for T > W over 64 prompts of 32-512 tokens (6(e) table);
 * - the token at position q is the section-8 primitive applied to the logits at q - 1 with
 *   position q; greedy is deterministic, thread-count independent and equal under oracle and CED
 *   for prompts <= W (bit-identical dumps); seeded sampling is reproducible and seed-dependent;
 * - --prompt and --chat go through the tokenizer and the DeepSeek chat encoding; the streamed
 *   text equals the whole-sequence detokenization;
 * - every bad flag or prompt exits non-zero with a message naming the cause.
 * Needs TANDEM_BIN_DIR (tandem-mkmodel, tandem-generate) and TANDEM_TEST_TMP; the reference
 * comparison also /usr/bin/python3 with numpy and TANDEM_SOURCE_DIR (skipped, saying why, without).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/arena.h"
#include "engine/config.h"
#include "engine/sampler.h"
#include "kernels/device.h"
#include "text/tokenizer.h"
#include "forward_test_util.h"

#define ROOT_BYTES   1024 /* directories from the environment */
#define PATH_BYTES   4096
#define CMD_BYTES    (6 * PATH_BYTES)
#define OUT_BYTES    (1 << 16)
#define LOGIT_HEADER 32
#define MODEL_SEED   1
#define MAX_IDS      1024

typedef struct {
    char bin[ROOT_BYTES];
    char tmp[ROOT_BYTES];
    char src[ROOT_BYTES];
    char model[ROOT_BYTES + 16];
    engine_config_t cfg;
    char out[OUT_BYTES]; /* stdout of the last run */
    char err[OUT_BYTES]; /* stderr of the last run */
} fixture_t;

/* TDLOGIT1 file (MODEL.md 12.10). */
typedef struct {
    uint32_t rows, vocab;
    int32_t first_position;
    uint32_t schedule;
    float *data; /* [rows, vocab] */
} logits_t;

static int setup(void **state)
{
    char cmd[CMD_BYTES];
    char cfg_err[256];
    struct stat st;
    const char *bin = getenv("TANDEM_BIN_DIR");
    const char *tmp = getenv("TANDEM_TEST_TMP");
    const char *src = getenv("TANDEM_SOURCE_DIR");
    fixture_t *fx = calloc(1, sizeof(*fx));

    if (fx == NULL || bin == NULL || tmp == NULL || strlen(bin) >= ROOT_BYTES ||
        strlen(tmp) >= ROOT_BYTES || (src != NULL && strlen(src) >= ROOT_BYTES)) {
        print_message("TANDEM_BIN_DIR and TANDEM_TEST_TMP must be set (run under ctest), each "
                      "shorter than %d bytes\n",
                      ROOT_BYTES);
        free(fx);
        return -1;
    }
    snprintf(fx->bin, sizeof(fx->bin), "%s", bin);
    snprintf(fx->tmp, sizeof(fx->tmp), "%s", tmp);
    snprintf(fx->src, sizeof(fx->src), "%s", src != NULL ? src : "");
    snprintf(fx->model, sizeof(fx->model), "%s/gen-tiny", tmp);
    snprintf(cmd, sizeof(cmd), "%s/config.json", fx->model);
    if (stat(cmd, &st) != 0) {
        snprintf(cmd, sizeof(cmd),
                 "'%s/tandem-mkmodel' --log-level warn --preset tiny --seed %d --out '%s' "
                 ">/dev/null",
                 bin, MODEL_SEED, fx->model);
        if (system(cmd) != 0) {
            print_message("tandem-mkmodel failed: %s\n", cmd);
            free(fx);
            return -1;
        }
    }
    if (engine_config_load(fx->model, &fx->cfg, cfg_err, sizeof(cfg_err)) != TDM_OK) {
        print_message("config: %s\n", cfg_err);
        free(fx);
        return -1;
    }
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    free(*state);
    return 0;
}

/* Read a whole file into buf (NUL-terminated, truncated to buf_bytes - 1). */
static void slurp(const char *path, char *buf, size_t buf_bytes)
{
    FILE *f = fopen(path, "rb");
    size_t n = 0;
    if (f != NULL) {
        n = fread(buf, 1, buf_bytes - 1, f);
        fclose(f);
    }
    buf[n] = '\0';
}

/* Run a shell command; stdout into fx->out, stderr into fx->err. Returns the exit status. */
static int run(fixture_t *fx, const char *cmd)
{
    char full[CMD_BYTES + PATH_BYTES];
    char err_path[PATH_BYTES + 32];
    FILE *p;
    size_t n = 0;
    int status;

    snprintf(err_path, sizeof(err_path), "%s/gen-stderr.txt", fx->tmp);
    snprintf(full, sizeof(full), "%s 2>'%s'", cmd, err_path);
    p = popen(full, "r");
    assert_non_null(p);
    n = fread(fx->out, 1, sizeof(fx->out) - 1, p);
    fx->out[n] = '\0';
    status = pclose(p);
    slurp(err_path, fx->err, sizeof(fx->err));
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Runs tandem-generate on the fixture's model with one kernel thread and the flags that
 * args_format (printf) gives; fails the test unless it exits 0. */
__attribute__((format(printf, 2, 3))) static void generate(fixture_t *fx, const char *args_format,
                                                           ...)
{
    char cmd[CMD_BYTES];
    va_list ap;
    int used;
    int rc;

    used = snprintf(cmd, sizeof(cmd), "'%s/tandem-generate' --model '%s' --threads 1 ", fx->bin,
                    fx->model);
    assert_true(used > 0 && (size_t)used < sizeof(cmd));
    va_start(ap, args_format);
    vsnprintf(cmd + used, sizeof(cmd) - (size_t)used, args_format, ap);
    va_end(ap);
    rc = run(fx, cmd);
    if (rc != 0) {
        print_message("command failed (exit %d): %s\n%s\n", rc, cmd, fx->err);
    }
    assert_int_equal(rc, 0);
}

/* Seeded prompt of n ids in [3, V - 6): no BOS/EOS/PAD, image or DSpark noise token. */
static void make_prompt(uint64_t seed, int64_t V, int32_t *ids, int64_t n)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 0x5851F42D4C957F2Dull;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ids[i] = (int32_t)(3 + s % (uint64_t)(V - 9));
    }
}

/* Write ids as "a,b,c" into $TMP/name; path_out gets the path. */
static void write_ids(fixture_t *fx, const char *name, const int32_t *ids, int64_t n,
                      char *path_out)
{
    FILE *f;
    snprintf(path_out, PATH_BYTES, "%s/%s", fx->tmp, name);
    f = fopen(path_out, "w");
    assert_non_null(f);
    for (int64_t i = 0; i < n; i++) {
        fprintf(f, "%s%d", i > 0 ? "," : "", ids[i]);
    }
    fclose(f);
}

/* Parse space-separated ids (--output ids) from fx->out. Returns the count. */
static int64_t parse_ids(const char *text, int32_t *ids, int64_t max)
{
    int64_t n = 0;
    const char *p = text;
    while (n < max) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) {
            break;
        }
        ids[n++] = (int32_t)v;
        p = end;
    }
    return n;
}

static void read_logits(const char *path, logits_t *out)
{
    unsigned char hdr[LOGIT_HEADER];
    FILE *f = fopen(path, "rb");
    size_t n;

    assert_non_null(f);
    assert_int_equal(fread(hdr, 1, sizeof(hdr), f), sizeof(hdr));
    assert_memory_equal(hdr, "TDLOGIT1", 8);
    memcpy(&out->rows, hdr + 8, 4);
    memcpy(&out->vocab, hdr + 12, 4);
    memcpy(&out->first_position, hdr + 16, 4);
    memcpy(&out->schedule, hdr + 20, 4);
    for (int i = 24; i < LOGIT_HEADER; i++) {
        assert_int_equal(hdr[i], 0);
    }
    n = (size_t)out->rows * out->vocab;
    out->data = malloc((n > 0 ? n : 1) * sizeof(float));
    assert_non_null(out->data);
    assert_int_equal(fread(out->data, sizeof(float), n, f), n);
    assert_int_equal(fgetc(f), EOF); /* nothing after the rows */
    fclose(f);
}

static double rel_l2(const float *a, const float *ref, int64_t n)
{
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        d += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
        r += (double)ref[i] * ref[i];
    }
    return sqrt(d / (r + 1e-300));
}

static int64_t argmax(const float *v, int64_t n)
{
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++) {
        if (v[i] > v[best]) {
            best = i;
        }
    }
    return best;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* prompt_tokens=N from tandem-generate's stderr summary. */
static int64_t prompt_tokens(const fixture_t *fx)
{
    const char *p = strstr(fx->err, "prompt_tokens=");
    assert_non_null(p);
    return strtoll(p + strlen("prompt_tokens="), NULL, 10);
}

static int have_reference(const fixture_t *fx)
{
    char cmd[CMD_BYTES];
    if (fx->src[0] == '\0' || access("/usr/bin/python3", X_OK) != 0) {
        print_message("no TANDEM_SOURCE_DIR or /usr/bin/python3: skipping\n");
        return 0;
    }
    snprintf(cmd, sizeof(cmd), "/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1");
    if (system(cmd) != 0) {
        print_message("/usr/bin/python3 has no numpy (Debian python3-numpy): skipping\n");
        return 0;
    }
    return 1;
}

/* ---- (a) oracle vs the numpy reference ---------------------------------------------------- */

#define REF_PROMPTS       16
#define REF_DECODE_TOKENS 4
#define REF_MAX_ROWS      (REF_PROMPTS * (512 + REF_DECODE_TOKENS))
/*
 * Thresholds (MODEL.md 12.6(c): end-to-end statistics over many prompts, never a per-row bound).
 * 12.6 says two correct implementations may differ by percents at some positions because
 * quantization codes and top-k selections turn ulp-level order differences into different
 * choices that later rows inherit. The test measures that effect on the same prompts: the
 * reference against itself with FP32 instead of FP64 GEMM accumulation (run_oracle.py --accum
 * f32; summation order is not normative, 12.6). On this random tiny model that calibration alone
 * gives mean cosine ~0.9990, median relative L2 ~2e-2 and top-1 ~95 % (issue 3's 0.999 / 2e-2 /
 * 95 % sit exactly at that level, so they cannot separate a bug from summation order here). The
 * engine is an FP32-order implementation compared with the FP64 one, so it must stay within
 * REF_CALIB_FACTOR times the calibration's deviation (1 - cosine, relative L2, top-1
 * disagreement), and above absolute floors that no correct implementation comes near. Layer by
 * layer exactness is test_forward_reference's job (teacher forcing).
 */
#define REF_CALIB_FACTOR   2.0
#define REF_FLOOR_MEAN_COS 0.995
#define REF_FLOOR_TOP1     0.85
#define REF_CEIL_MEDIAN    0.1

/* Statistics of one implementation against the FP64 reference over many logit rows. */
typedef struct {
    double cos_sum, cos_min;
    double *rel; /* [REF_MAX_ROWS] per-row relative L2 */
    int64_t n_rows, n_top1;
    double dec_cos_sum; /* rows of decoded positions */
    int64_t n_dec, n_dec_top1;
} ref_stats_t;

static void ref_stats_add(ref_stats_t *st, const logits_t *a, const logits_t *ref, int64_t T)
{
    int64_t V = ref->vocab;
    assert_int_equal(a->rows, ref->rows);
    for (int64_t r = 0; r < (int64_t)ref->rows && st->n_rows < REF_MAX_ROWS; r++) {
        const float *x = a->data + r * V;
        const float *y = ref->data + r * V;
        double c = ftu_cosine(x, y, V);
        int same = argmax(x, V) == argmax(y, V);
        st->cos_sum += c;
        st->cos_min = c < st->cos_min ? c : st->cos_min;
        st->rel[st->n_rows++] = rel_l2(x, y, V);
        st->n_top1 += same;
        if (r >= T) {
            st->dec_cos_sum += c;
            st->n_dec_top1 += same;
            st->n_dec++;
        }
    }
}

/* Mean cosine, median rel L2 (sorts st->rel) and top-1 agreement; printed with `what`. */
static void ref_stats_summary(ref_stats_t *st, const char *what, double *mean_cos_out,
                              double *median_rel_out, double *top1_out)
{
    qsort(st->rel, (size_t)st->n_rows, sizeof(double), cmp_double);
    *mean_cos_out = st->cos_sum / (double)st->n_rows;
    *median_rel_out = st->rel[st->n_rows / 2];
    *top1_out = (double)st->n_top1 / (double)st->n_rows;
    print_message("%s: %lld rows: mean cosine %.6f (min %.6f), median rel L2 %.3e (max %.3e), "
                  "top-1 %.2f %%; decoded rows: mean cosine %.6f, top-1 %.2f %%\n",
                  what, (long long)st->n_rows, *mean_cos_out, st->cos_min, *median_rel_out,
                  st->rel[st->n_rows - 1], 100.0 * *top1_out,
                  st->n_dec > 0 ? st->dec_cos_sum / (double)st->n_dec : 1.0,
                  st->n_dec > 0 ? 100.0 * (double)st->n_dec_top1 / (double)st->n_dec : 100.0);
}

static void run_reference(fixture_t *fx, const char *ids_path, const char *accum,
                          const char *out_path)
{
    char cmd[CMD_BYTES];
    snprintf(cmd, sizeof(cmd),
             "cd '%s/tests/reference' && /usr/bin/python3 run_oracle.py --model '%s' "
             "--prompt-ids @'%s' --accum %s --dump-logits '%s' >/dev/null",
             fx->src, fx->model, ids_path, accum, out_path);
    assert_int_equal(run(fx, cmd), 0);
}

static void test_oracle_logits_match_numpy_reference(void **state)
{
    fixture_t *fx = *state;
    int64_t V = fx->cfg.vocab_size;
    int32_t ids[MAX_IDS];
    char ids_path[PATH_BYTES];
    char eng_path[PATH_BYTES + 32], ref_path[PATH_BYTES + 32], f32_path[PATH_BYTES + 32];
    ref_stats_t eng_st = {0, 1, NULL, 0, 0, 0, 0, 0};
    ref_stats_t cal_st = {0, 1, NULL, 0, 0, 0, 0, 0};
    double e_cos, e_rel, e_top1, c_cos, c_rel, c_top1;
    int ok;

    if (!have_reference(fx)) {
        skip();
    }
    snprintf(eng_path, sizeof(eng_path), "%s/gen-ref-engine.bin", fx->tmp);
    snprintf(ref_path, sizeof(ref_path), "%s/gen-ref-numpy.bin", fx->tmp);
    snprintf(f32_path, sizeof(f32_path), "%s/gen-ref-numpy-f32.bin", fx->tmp);
    eng_st.rel = malloc(sizeof(double) * REF_MAX_ROWS);
    cal_st.rel = malloc(sizeof(double) * REF_MAX_ROWS);
    assert_non_null(eng_st.rel);
    assert_non_null(cal_st.rel);
    for (int k = 0; k < REF_PROMPTS; k++) {
        int64_t T = k == REF_PROMPTS - 1 ? 512 : 64 + (k * 151) % 449; /* 64 .. 512 */
        logits_t eng, ref, f32;
        int64_t n_gen;

        make_prompt(1000 + (uint64_t)k, V, ids, T);
        write_ids(fx, "gen-ref-ids.txt", ids, T, ids_path);
        generate(fx,
                 "--schedule oracle --prompt-ids @'%s' --max-tokens %d --ignore-eos --output ids "
                 "--dump-logits '%s'",
                 ids_path, REF_DECODE_TOKENS, eng_path);
        n_gen = parse_ids(fx->out, ids + T, MAX_IDS - T);
        assert_int_equal(n_gen, REF_DECODE_TOKENS);
        /* the reference runs the prompt plus the generated tokens: decoded positions too */
        write_ids(fx, "gen-ref-ids.txt", ids, T + n_gen, ids_path);
        run_reference(fx, ids_path, "f64", ref_path);
        run_reference(fx, ids_path, "f32", f32_path);
        read_logits(eng_path, &eng);
        read_logits(ref_path, &ref);
        read_logits(f32_path, &f32);
        /* rows: every prompt position, then one per generated token (12.10) */
        assert_int_equal(eng.rows, T + n_gen);
        assert_int_equal(eng.first_position, 0);
        assert_int_equal(eng.schedule, 0);
        assert_int_equal(eng.vocab, V);
        ref_stats_add(&eng_st, &eng, &ref, T);
        ref_stats_add(&cal_st, &f32, &ref, T);
        free(eng.data);
        free(ref.data);
        free(f32.data);
    }
    print_message("%d prompts of 64-512 tokens, %d decoded tokens each, against the numpy "
                  "reference (FP64 accumulation)\n",
                  REF_PROMPTS, REF_DECODE_TOKENS);
    ref_stats_summary(&eng_st, "tandem-generate --schedule oracle", &e_cos, &e_rel, &e_top1);
    ref_stats_summary(&cal_st, "calibration: reference with FP32 accumulation", &c_cos, &c_rel,
                      &c_top1);
    ok = 1 - e_cos <= REF_CALIB_FACTOR * (1 - c_cos) && e_cos >= REF_FLOOR_MEAN_COS &&
         e_rel <= REF_CALIB_FACTOR * c_rel && e_rel <= REF_CEIL_MEDIAN &&
         1 - e_top1 <= REF_CALIB_FACTOR * (1 - c_top1) && e_top1 >= REF_FLOOR_TOP1;
    print_message("bounds: 1 - cosine <= %.4g, median rel L2 <= %.4g, top-1 >= %.2f %%: %s\n",
                  REF_CALIB_FACTOR * (1 - c_cos), REF_CALIB_FACTOR * c_rel,
                  100.0 * (1 - REF_CALIB_FACTOR * (1 - c_top1)), ok ? "pass" : "FAIL");
    free(eng_st.rel);
    free(cal_st.rel);
    assert_true(1 - e_cos <= REF_CALIB_FACTOR * (1 - c_cos));
    assert_true(e_cos >= REF_FLOOR_MEAN_COS);
    assert_true(e_rel <= REF_CALIB_FACTOR * c_rel);
    assert_true(e_rel <= REF_CEIL_MEDIAN);
    assert_true(1 - e_top1 <= REF_CALIB_FACTOR * (1 - c_top1));
    assert_true(e_top1 >= REF_FLOOR_TOP1);
}

/* ---- (b) CED vs oracle beyond the window --------------------------------------------------- */

#define CED_PROMPTS  64
#define CED_MIN_COS  0.95 /* MODEL.md 6(e), tiny: mean first-token cosine */
#define CED_MIN_TOP1 0.80 /* and top-1 agreement */

static void test_ced_vs_oracle_first_token_statistics_64_prompts(void **state)
{
    fixture_t *fx = *state;
    int64_t V = fx->cfg.vocab_size, W = fx->cfg.sliding_window;
    int32_t ids[MAX_IDS];
    char ids_path[PATH_BYTES];
    char or_path[PATH_BYTES + 32], ced_path[PATH_BYTES + 32];
    double cos_sum = 0, cos_min = 1;
    int n_top1 = 0;

    snprintf(or_path, sizeof(or_path), "%s/gen-ced-oracle.bin", fx->tmp);
    snprintf(ced_path, sizeof(ced_path), "%s/gen-ced-ced.bin", fx->tmp);
    for (int k = 0; k < CED_PROMPTS; k++) {
        int64_t T = 32 + (k * 241) % 481; /* 32 .. 512, all > W */
        logits_t o, c;
        make_prompt(5000 + (uint64_t)k, V, ids, T);
        write_ids(fx, "gen-ced-ids.txt", ids, T, ids_path);
        generate(fx, "--schedule oracle --prompt-ids @'%s' --max-tokens 0 --dump-logits '%s'",
                 ids_path, or_path);
        generate(fx, "--schedule ced --prompt-ids @'%s' --max-tokens 0 --dump-logits '%s'",
                 ids_path, ced_path);
        read_logits(or_path, &o);
        read_logits(ced_path, &c);
        assert_int_equal(o.rows, T);
        /* CED dumps the tail [R, T), R = T - W (12.10) */
        assert_int_equal(c.schedule, 1);
        assert_int_equal(c.first_position, T - W);
        assert_int_equal(c.rows, W);
        {
            const float *a = o.data + (T - 1) * V;
            const float *b = c.data + (W - 1) * V;
            double cs = ftu_cosine(a, b, V);
            cos_sum += cs;
            cos_min = cs < cos_min ? cs : cos_min;
            n_top1 += argmax(a, V) == argmax(b, V);
        }
        free(o.data);
        free(c.data);
    }
    print_message("ced vs oracle (tandem-generate), %d prompts 32-512 tokens: first-token mean "
                  "cosine %.4f (min %.4f), top-1 %.1f %%\n",
                  CED_PROMPTS, cos_sum / CED_PROMPTS, cos_min, 100.0 * n_top1 / CED_PROMPTS);
    assert_true(cos_sum / CED_PROMPTS >= CED_MIN_COS);
    assert_true(n_top1 >= (int)ceil(CED_MIN_TOP1 * CED_PROMPTS));
}

/* ---- (c) determinism, schedules, sampling positions ---------------------------------------- */

#define GREEDY_TOKENS 24
#define SAMPLE_TOKENS 32

/* Byte compare two files, ignoring the TDLOGIT1 header's schedule word (bytes 20..23). */
static void assert_same_logit_rows(const char *a_path, const char *b_path)
{
    logits_t a, b;
    read_logits(a_path, &a);
    read_logits(b_path, &b);
    assert_int_equal(a.rows, b.rows);
    assert_int_equal(a.first_position, b.first_position);
    assert_memory_equal(a.data, b.data, (size_t)a.rows * a.vocab * sizeof(float));
    free(a.data);
    free(b.data);
}

static void test_greedy_is_deterministic_and_oracle_equals_ced_within_window(void **state)
{
    fixture_t *fx = *state;
    int64_t V = fx->cfg.vocab_size, W = fx->cfg.sliding_window;
    int32_t ids[MAX_IDS];
    char ids_path[PATH_BYTES];
    char first[OUT_BYTES];
    char dump[3][PATH_BYTES + 32];
    int64_t lengths[2] = {7, W}; /* T <= W: CED is exact everywhere (6(e)) */

    for (int i = 0; i < 3; i++) {
        snprintf(dump[i], sizeof(dump[i]), "%s/gen-greedy-%d.bin", fx->tmp, i);
    }
    for (int k = 0; k < 2; k++) {
        int64_t T = lengths[k];
        make_prompt(77 + (uint64_t)k, V, ids, T);
        write_ids(fx, "gen-greedy-ids.txt", ids, T, ids_path);
        generate(fx,
                 "--schedule ced --prompt-ids @'%s' --max-tokens %d --ignore-eos --output ids "
                 "--dump-logits '%s'",
                 ids_path, GREEDY_TOKENS, dump[0]);
        snprintf(first, sizeof(first), "%s", fx->out);
        assert_int_equal(parse_ids(first, ids + T, MAX_IDS - T), GREEDY_TOKENS);
        /* the same run again (ced), then the oracle schedule: the same tokens and bit-identical
         * logits at every position */
        for (int r = 1; r <= 2; r++) {
            generate(fx,
                     "--schedule %s --prompt-ids @'%s' --max-tokens %d --ignore-eos --output ids "
                     "--dump-logits '%s'",
                     r == 1 ? "ced" : "oracle", ids_path, GREEDY_TOKENS, dump[r]);
            assert_string_equal(fx->out, first);
            assert_same_logit_rows(dump[0], dump[r]);
        }
        /* more kernel threads change nothing */
        generate(fx,
                 "--schedule ced --prompt-ids @'%s' --max-tokens %d --ignore-eos --output ids "
                 "--threads 2",
                 ids_path, GREEDY_TOKENS);
        assert_string_equal(fx->out, first);
        print_message("T=%lld greedy: %s", (long long)T, first);
    }
}

/* Every generated token q equals engine_sampler_sample(logits at q - 1, position q). */
static void assert_tokens_follow_the_primitive(fixture_t *fx, const char *dump_path,
                                               const engine_sampler_params_t *params,
                                               const int32_t *gen, int64_t n_gen, int64_t T)
{
    logits_t lg;
    tdm_arena_t arena;
    int64_t V = fx->cfg.vocab_size;
    read_logits(dump_path, &lg);
    assert_int_equal(lg.first_position, 0);
    assert_int_equal(lg.rows, T + n_gen);
    assert_int_equal(tdm_arena_init(&arena, engine_sampler_scratch_bytes(V)), TDM_OK);
    for (int64_t k = 0; k < n_gen; k++) {
        engine_sample_t s;
        assert_int_equal(
            engine_sampler_sample(params, lg.data + (T - 1 + k) * V, V, T + k, &arena, &s), TDM_OK);
        assert_int_equal(s.token, gen[k]);
    }
    tdm_arena_fini(&arena);
    free(lg.data);
}

static void test_seeded_sampling_is_reproducible_at_sequence_positions(void **state)
{
    fixture_t *fx = *state;
    int64_t V = fx->cfg.vocab_size, T = 12;
    int32_t ids[MAX_IDS], gen[MAX_IDS];
    char ids_path[PATH_BYTES], dump[PATH_BYTES + 32];
    char first[OUT_BYTES];
    const char *filters = "--temperature 0.9 --top-p 0.95 --top-k 200 --min-p 0.01";
    engine_sampler_params_t params;

    snprintf(dump, sizeof(dump), "%s/gen-sample.bin", fx->tmp);
    make_prompt(91, V, ids, T);
    write_ids(fx, "gen-sample-ids.txt", ids, T, ids_path);
    generate(fx,
             "--prompt-ids @'%s' --max-tokens %d --ignore-eos --output ids %s --seed 7 "
             "--dump-logits '%s'",
             ids_path, SAMPLE_TOKENS, filters, dump);
    snprintf(first, sizeof(first), "%s", fx->out);
    assert_int_equal(parse_ids(first, gen, MAX_IDS), SAMPLE_TOKENS);
    engine_sampler_params_default(&params);
    params.temperature = 0.9;
    params.top_p = 0.95;
    params.top_k = 200;
    params.min_p = 0.01;
    params.seed = 7;
    assert_tokens_follow_the_primitive(fx, dump, &params, gen, SAMPLE_TOKENS, T);
    /* same seed: same tokens, under either schedule (T <= W) */
    generate(fx,
             "--prompt-ids @'%s' --max-tokens %d --ignore-eos --output ids %s "
             "--seed 7",
             ids_path, SAMPLE_TOKENS, filters);
    assert_string_equal(fx->out, first);
    generate(fx,
             "--prompt-ids @'%s' --max-tokens %d --ignore-eos --output ids %s "
             "--seed 7 --schedule oracle",
             ids_path, SAMPLE_TOKENS, filters);
    assert_string_equal(fx->out, first);
    /* another seed: other tokens */
    generate(fx,
             "--prompt-ids @'%s' --max-tokens %d --ignore-eos --output ids %s "
             "--seed 8",
             ids_path, SAMPLE_TOKENS, filters);
    assert_string_not_equal(fx->out, first);
    /* temperature 0 is the argmax, whatever the seed */
    generate(fx,
             "--prompt-ids @'%s' --max-tokens %d --ignore-eos --output ids --seed 5 "
             "--dump-logits '%s'",
             ids_path, SAMPLE_TOKENS, dump);
    assert_int_equal(parse_ids(fx->out, gen, MAX_IDS), SAMPLE_TOKENS);
    params.temperature = 0.0;
    assert_tokens_follow_the_primitive(fx, dump, &params, gen, SAMPLE_TOKENS, T);
    /* issue 16: a tiny positive temperature (1e-310 underflows strtod) is accepted, as the router
     * accepts it, and is the greedy limit, not NaN scores that pick token 0 */
    snprintf(first, sizeof(first), "%s", fx->out);
    generate(fx,
             "--prompt-ids @'%s' --max-tokens %d --ignore-eos --output ids --seed 9 "
             "--temperature 1e-310 %s",
             ids_path, SAMPLE_TOKENS, "--top-p 0.5");
    assert_string_equal(fx->out, first);
    generate(fx,
             "--prompt-ids @'%s' --max-tokens %d --ignore-eos --output ids --seed 9 "
             "--temperature 1e-6",
             ids_path, SAMPLE_TOKENS);
    assert_string_equal(fx->out, first);
}

/* Issue 14 item 6: --devices cpu,cpu and cpu,cpu,cpu (the tiny preset's 8 experts split 4+4 and
 * 3+3+2, an all-gather per MoE layer) generate the same sampled tokens and write the same logits
 * bytes as one device; a CUDA list without the devices or NCCL is refused by name (exit 2). */
static void test_expert_parallel_devices_match_one_device(void **state)
{
    fixture_t *fx = *state;
    int64_t T = 40;
    int32_t ids[MAX_IDS];
    char ids_path[PATH_BYTES], one[PATH_BYTES + 32], ep[PATH_BYTES + 32], first[OUT_BYTES];
    const char *sampled = "--temperature 0.8 --top-p 0.9 --seed 3";
    static const char *const lists[] = {"cpu,cpu", "cpu,cpu,cpu"};

    snprintf(one, sizeof(one), "%s/gen-ep-one.bin", fx->tmp);
    snprintf(ep, sizeof(ep), "%s/gen-ep-ranks.bin", fx->tmp);
    make_prompt(123, fx->cfg.vocab_size, ids, T);
    write_ids(fx, "gen-ep-ids.txt", ids, T, ids_path);
    generate(fx,
             "--prompt-ids @'%s' --max-tokens %d --ignore-eos --output ids %s --dump-logits '%s'",
             ids_path, SAMPLE_TOKENS, sampled, one);
    snprintf(first, sizeof(first), "%s", fx->out);
    for (size_t i = 0; i < sizeof(lists) / sizeof(lists[0]); i++) {
        generate(fx,
                 "--prompt-ids @'%s' --max-tokens %d --ignore-eos --output ids %s "
                 "--dump-logits '%s' --devices %s",
                 ids_path, SAMPLE_TOKENS, sampled, ep, lists[i]);
        assert_string_equal(fx->out, first);
        assert_same_logit_rows(one, ep);
    }
    if (kern_cuda_device_count(NULL) < 2) {
        char cmd[CMD_BYTES];
        snprintf(cmd, sizeof(cmd),
                 "'%s/tandem-generate' --model '%s' --prompt-ids @'%s' --max-tokens 1 "
                 "--devices 0,1",
                 fx->bin, fx->model, ids_path);
        assert_int_equal(run(fx, cmd), 2);
        assert_non_null(strstr(fx->err, "--devices=0,1"));
    }
}

/* A long generation stops at EOS when it is sampled: the summary says so, and EOS is last. */
static void test_generation_stops_at_eos_or_max_tokens(void **state)
{
    fixture_t *fx = *state;
    int32_t gen[MAX_IDS];
    int64_t n;

    generate(fx, "--prompt-ids 5,6,7 --max-tokens 5 --output ids");
    assert_non_null(strstr(fx->err, "generated_tokens="));
    n = parse_ids(fx->out, gen, MAX_IDS);
    if (strstr(fx->err, "stop=eos") != NULL) {
        assert_int_equal(gen[n - 1], (int32_t)fx->cfg.eos_token_id);
    } else {
        assert_int_equal(n, 5);
    }
    /* a high temperature over many tokens reaches EOS (1 of 1024 ids) in practice */
    generate(fx, "--prompt-ids 5,6,7 --max-tokens 4000 --output ids --temperature 50 --seed 3");
    n = parse_ids(fx->out, gen, MAX_IDS);
    assert_non_null(strstr(fx->err, "stop=eos"));
    assert_true(n >= 1 && n < 4000);
    assert_int_equal(gen[n - 1], (int32_t)fx->cfg.eos_token_id);
    for (int64_t i = 0; i + 1 < n; i++) {
        assert_int_not_equal(gen[i], (int32_t)fx->cfg.eos_token_id);
    }
    /* --max-tokens 0: prefill only, nothing on stdout */
    generate(fx, "--prompt-ids 5,6,7 --max-tokens 0");
    assert_string_equal(fx->out, "");
    assert_non_null(strstr(fx->err, "generated_tokens=0"));
    assert_non_null(strstr(fx->err, "prefill: 3 tokens"));
    assert_non_null(strstr(fx->err, "tok/s"));
}

/* ---- prompts through the tokenizer --------------------------------------------------------- */

static void test_text_and_chat_prompts_use_tokenizer_and_stream_utf8(void **state)
{
    fixture_t *fx = *state;
    char tok_path[PATH_BYTES + 32], chat_path[PATH_BYTES + 32];
    char err[256];
    text_tokenizer_t *tok = NULL;
    text_chat_params_t cp;
    text_chat_message_t msgs[2];
    int32_t *ids = NULL, gen[MAX_IDS];
    size_t n_ids = 0, n_text = 0;
    char *text = NULL;
    int64_t n_gen;
    const char *prompt = "def fib(n):  # caf\xc3\xa9 \xe2\x82\xac";
    FILE *f;

    snprintf(tok_path, sizeof(tok_path), "%s/tokenizer.json", fx->model);
    assert_int_equal(text_tokenizer_load_hf(tok_path, &tok, err, sizeof(err)), TDM_OK);
    /* --prompt: BOS + the encoded text */
    assert_int_equal(text_tokenizer_encode(tok, prompt, strlen(prompt), TEXT_TOKENIZE_PARSE_SPECIAL,
                                           &ids, &n_ids),
                     TDM_OK);
    generate(fx, "--prompt '%s' --max-tokens 16 --ignore-eos --output ids", prompt);
    assert_int_equal(prompt_tokens(fx), (int64_t)n_ids + 1);
    n_gen = parse_ids(fx->out, gen, MAX_IDS);
    assert_int_equal(n_gen, 16);
    text_tokens_free(ids);
    /* the streamed text equals the whole-sequence detokenization of the same tokens */
    generate(fx, "--prompt '%s' --max-tokens 16 --ignore-eos", prompt);
    assert_int_equal(
        text_detok_decode(tok, gen, (size_t)n_gen, TEXT_DETOK_SKIP_CONTROL, &text, &n_text),
        TDM_OK);
    assert_int_equal(strlen(fx->out), n_text + (n_text > 0 ? 1 : 0)); /* + final newline */
    assert_memory_equal(fx->out, text, n_text);
    free(text);
    /* --chat: the DeepSeek chat encoding of the messages */
    snprintf(chat_path, sizeof(chat_path), "%s/gen-chat.json", fx->tmp);
    f = fopen(chat_path, "w");
    assert_non_null(f);
    fputs("[{\"role\": \"system\", \"content\": \"You are terse.\"},\n"
          " {\"role\": \"user\", \"content\": \"Write a haiku about caches.\"}]\n",
          f);
    fclose(f);
    text_chat_params_default(&cp);
    memset(msgs, 0, sizeof(msgs));
    msgs[0].role = TEXT_CHAT_SYSTEM;
    msgs[0].content = "You are terse.";
    msgs[0].content_bytes = strlen(msgs[0].content);
    msgs[1].role = TEXT_CHAT_USER;
    msgs[1].content = "Write a haiku about caches.";
    msgs[1].content_bytes = strlen(msgs[1].content);
    assert_int_equal(text_chat_encode(tok, &cp, msgs, 2, &ids, &n_ids), TDM_OK);
    generate(fx, "--chat '%s' --max-tokens 8", chat_path);
    assert_int_equal(prompt_tokens(fx), (int64_t)n_ids);
    text_tokens_free(ids);
    text_tokenizer_destroy(tok);
}

/* ---- dumps --------------------------------------------------------------------------------- */

static void test_layer_dump_has_12_10_layout(void **state)
{
    fixture_t *fx = *state;
    char dir[PATH_BYTES + 32], path[2 * PATH_BYTES], args[CMD_BYTES];
    const engine_config_t *c = &fx->cfg;
    int64_t T = 40, n_gen = 3, total = T + n_gen, W = c->sliding_window;
    int32_t ids[MAX_IDS];
    char ids_path[PATH_BYTES];
    struct stat st;

    snprintf(dir, sizeof(dir), "%s/gen-layers-ced", fx->tmp);
    make_prompt(123, c->vocab_size, ids, T);
    write_ids(fx, "gen-layers-ids.txt", ids, T, ids_path);
    generate(fx,
             "--schedule ced --prompt-ids @'%s' --max-tokens %lld --ignore-eos --dump-layers "
             "'%s'",
             ids_path, (long long)n_gen, dir);
    for (int l = 0; l < c->n_layers; l++) {
        /* CED: layers <= c see every position, layers above the tail [T - W, T) (6(b)), then one
         * row per generated token */
        int64_t rows = l <= c->ced_cut ? total : W + n_gen;
        int64_t mH = c->hc_mult * c->hidden_size;
        struct {
            const char *suffix;
            int64_t per_row;
        } parts[5] = {{"in.f32", mH},
                      {"out.f32", mH},
                      {"pre.f32", c->hc_mult},
                      {"sel.i32", c->index_topk},
                      {"experts.i32", c->num_experts_per_tok}};
        for (int p = 0; p < 5; p++) {
            snprintf(path, sizeof(path), "%s/%d.%s", dir, l, parts[p].suffix);
            assert_int_equal(stat(path, &st), 0);
            assert_int_equal(st.st_size, rows * parts[p].per_row * 4);
        }
    }
    snprintf(path, sizeof(path), "%s/manifest.json", dir);
    slurp(path, fx->out, sizeof(fx->out));
    assert_non_null(strstr(fx->out, "\"schedule\": \"ced\""));
    assert_non_null(strstr(fx->out, "\"ids\""));
    assert_non_null(strstr(fx->out, "\"files\""));
    /* the reference's reader accepts it: layer 0 shape and the ids (prompt + generated) */
    if (have_reference(fx)) {
        char cmd[CMD_BYTES];
        snprintf(cmd, sizeof(cmd),
                 "cd '%s/tests/reference' && /usr/bin/python3 -c \"from flash_ref import dumps; "
                 "d = dumps.LayerDump('%s'); ids = d.ids(); "
                 "print(len(ids), d.read(0, 'in.f32').shape[0], d.read(%d, 'out.f32').shape[0], "
                 "d.read(0, 'sel.i32').shape[1])\"",
                 fx->src, dir, c->n_layers - 1);
        assert_int_equal(run(fx, cmd), 0);
        snprintf(args, sizeof(args), "%lld %lld %lld %lld\n", (long long)total, (long long)total,
                 (long long)(W + n_gen), (long long)c->index_topk);
        assert_string_equal(fx->out, args);
    }
}

/* ---- (d) errors ---------------------------------------------------------------------------- */

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_bad_flags_and_prompts_exit_nonzero_with_message(void **state)
{
    fixture_t *fx = *state;
    char empty_chat[PATH_BYTES + 32], bad_role[PATH_BYTES + 32], cmd[CMD_BYTES];
    char model_flag[PATH_BYTES + 32];
    struct {
        const char *args; /* after the executable; %M = --model <tiny> */
        const char *message;
    } cases[] = {
        {"", "--model"},
        {"%M --max-tokens 1", "exactly one of --prompt, --chat and --prompt-ids"},
        {"%M --prompt-ids 5 --prompt hi", "exactly one of"},
        {"--model /nonexistent/tandem-model --prompt-ids 5", "--model=/nonexistent/tandem-model"},
        {"%M --prompt-ids 5,1024", "outside the vocabulary [0, 1024)"},
        {"%M --prompt-ids 5,-1", "outside the vocabulary"},
        {"%M --prompt-ids 5,x7", "'x7' is not a token id"},
        {"%M --prompt-ids ''", "empty"},
        {"%M --prompt-ids ' , '", "empty prompt"},
        {"%M --prompt ''", "empty"},
        {"%M --prompt-ids @/nonexistent/ids.txt", "cannot open /nonexistent/ids.txt"},
        {"%M --prompt-ids 5,1022", "image inputs are not supported"},
        {"%M --prompt-ids 5 --schedule fast", "--schedule=fast: expected oracle or ced"},
        {"%M --prompt-ids 5 --output xml", "--output=xml"},
        {"%M --prompt-ids 5 --temperature -1", "--temperature"},
        {"%M --prompt-ids 5 --top-p 0", "--top-p"},
        {"%M --prompt-ids 5 --min-p 2", "--min-p"},
        {"%M --prompt-ids 5 --max-tokens lots", "--max-tokens"},
        {"%M --prompt-ids 5 --max-tokens 9000", "exceeds the context limit"},
        {"%M --prompt-ids 5 --frobnicate", "--frobnicate"},
        {"%M --prompt-ids 5 --thinking", "--thinking applies to --chat only"},
        {"%M --chat /nonexistent/chat.json", "--chat"},
        {"%M --chat %E", "empty prompt (no messages)"},
        {"%M --chat %R", "\"role\": system, user, assistant or tool"},
        {"%M --prompt-ids 5 --dump-logits /nonexistent/dir/l.bin", "--dump-logits"},
    };

    snprintf(empty_chat, sizeof(empty_chat), "%s/gen-chat-empty.json", fx->tmp);
    snprintf(bad_role, sizeof(bad_role), "%s/gen-chat-role.json", fx->tmp);
    write_text(empty_chat, "[]\n");
    write_text(bad_role, "[{\"role\": \"narrator\", \"content\": \"hi\"}]\n");
    snprintf(model_flag, sizeof(model_flag), "--model '%s'", fx->model);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char args[CMD_BYTES] = "";
        size_t n = 0;
        for (const char *p = cases[i].args; *p != '\0' && n + PATH_BYTES < sizeof(args); p++) {
            if (p[0] == '%' && (p[1] == 'M' || p[1] == 'E' || p[1] == 'R')) {
                const char *sub = p[1] == 'M' ? model_flag : p[1] == 'E' ? empty_chat : bad_role;
                n += (size_t)snprintf(args + n, sizeof(args) - n, "%s", sub);
                p++;
            } else {
                args[n++] = *p;
                args[n] = '\0';
            }
        }
        snprintf(cmd, sizeof(cmd), "'%s/tandem-generate' --threads 1 %s", fx->bin, args);
        int rc = run(fx, cmd);
        if (rc == 0 || strstr(fx->err, cases[i].message) == NULL) {
            print_message("case %zu: %s\nexit %d, stderr: %s\n", i, cmd, rc, fx->err);
        }
        assert_int_not_equal(rc, 0);
        assert_non_null(strstr(fx->err, cases[i].message));
        assert_string_equal(fx->out, ""); /* nothing generated */
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_flags_and_prompts_exit_nonzero_with_message),
        cmocka_unit_test(test_greedy_is_deterministic_and_oracle_equals_ced_within_window),
        cmocka_unit_test(test_seeded_sampling_is_reproducible_at_sequence_positions),
        cmocka_unit_test(test_generation_stops_at_eos_or_max_tokens),
        cmocka_unit_test(test_expert_parallel_devices_match_one_device),
        cmocka_unit_test(test_text_and_chat_prompts_use_tokenizer_and_stream_utf8),
        cmocka_unit_test(test_layer_dump_has_12_10_layout),
        cmocka_unit_test(test_oracle_logits_match_numpy_reference),
        cmocka_unit_test(test_ced_vs_oracle_first_token_statistics_64_prompts),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
