/* calib.c - sim_perf_calibrate: measured costs replace the analytic ones (sim/perf.h; the file
 * formats are in docs/SIM.md "Calibration").
 *
 * Two inputs:
 *   - a step-cost file (`tandem-calib 1`, written by `tandem-bench-engine --calib FILE`): lines
 *     `prefill CACHED NEW SECONDS`, `continue CACHED NEW SECONDS` (a continuing turn: rewind,
 *     window replay, prefill) and `decode N_SEQS CONTEXT_PER_SEQ SECONDS_PER_STEP`; each
 *     kind present is fitted by weighted least squares (relative residuals, coefficients >= 0)
 *     to  prefill = p0 + p1 new + p2 new (cached + new / 2)  and  decode = d0 + d1 n + d2 sum_ctx,
 *     and replaces that analytic cost;
 *   - a scripts/gpu-check log (no `tandem-calib` header): its `summary:` line's
 *     gemm_decode_best_GBps and gemm_prefill_best_TFLOPs replace the achieved HBM rate and GEMM
 *     rate (datasheet x efficiency) of the analytic model.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim/perf.h"
#include "sim/perf_impl.h"

#define CALIB_MAX_POINTS 4096
#define CALIB_LINE_BYTES 1024

typedef struct {
    double a, b, s; /* regressors (see fit) and the measured seconds */
} calib_point_t;

typedef struct {
    calib_point_t *pts;
    int n;
} calib_set_t;

/* Solve the k x k system a x = y (Gaussian elimination, partial pivoting). 0 on success. */
static int solve(double a[3][3], double y[3], int k, double x[3])
{
    for (int c = 0; c < k; c++) {
        int piv = c;
        for (int r = c + 1; r < k; r++) {
            if (fabs(a[r][c]) > fabs(a[piv][c])) {
                piv = r;
            }
        }
        if (fabs(a[piv][c]) < 1e-300) {
            return -1;
        }
        for (int j = 0; j < k; j++) {
            double t = a[c][j];
            a[c][j] = a[piv][j];
            a[piv][j] = t;
        }
        double t = y[c];
        y[c] = y[piv];
        y[piv] = t;
        for (int r = c + 1; r < k; r++) {
            double f = a[r][c] / a[c][c];
            for (int j = c; j < k; j++) {
                a[r][j] -= f * a[c][j];
            }
            y[r] -= f * y[c];
        }
    }
    for (int r = k - 1; r >= 0; r--) {
        double s = y[r];
        for (int j = r + 1; j < k; j++) {
            s -= a[r][j] * x[j];
        }
        x[r] = s / a[r][r];
    }
    return 0;
}

/*
 * Fit s = c0 + c1 a + c2 b over the points, minimising sum ((pred - s) / s)^2 with every c >= 0:
 * every subset of the three terms is solved and the best feasible one kept (a tiny active set).
 * 0 on success, -1 when no subset is solvable.
 */
static int fit(const calib_set_t *set, sim_perf_fit_t *out)
{
    double best_err = INFINITY;
    double best[3] = {0, 0, 0};

    for (int mask = 1; mask < 8; mask++) {
        int idx[3], k = 0;
        double ata[3][3] = {{0}}, aty[3] = {0}, x[3] = {0};
        for (int j = 0; j < 3; j++) {
            if (mask & (1 << j)) {
                idx[k++] = j;
            }
        }
        if (k > set->n) {
            continue;
        }
        for (int i = 0; i < set->n; i++) {
            const calib_point_t *p = &set->pts[i];
            double row[3] = {1.0, p->a, p->b};
            double w = 1.0 / (p->s * p->s);
            for (int r = 0; r < k; r++) {
                for (int c = 0; c < k; c++) {
                    ata[r][c] += w * row[idx[r]] * row[idx[c]];
                }
                aty[r] += w * row[idx[r]] * p->s;
            }
        }
        if (solve(ata, aty, k, x) != 0) {
            continue;
        }
        double coef[3] = {0, 0, 0};
        int ok = 1;
        for (int r = 0; r < k; r++) {
            if (!(x[r] >= 0.0) || !isfinite(x[r])) {
                ok = 0;
            }
            coef[idx[r]] = x[r];
        }
        if (!ok) {
            continue;
        }
        double err = 0;
        for (int i = 0; i < set->n; i++) {
            const calib_point_t *p = &set->pts[i];
            double pred = coef[0] + coef[1] * p->a + coef[2] * p->b;
            err += (pred - p->s) * (pred - p->s) / (p->s * p->s);
        }
        if (err < best_err * (1.0 - 1e-12)) {
            best_err = err;
            memcpy(best, coef, sizeof(best));
        }
    }
    if (!isfinite(best_err)) {
        return -1;
    }
    out->have = 1;
    memcpy(out->coef, best, sizeof(best));
    out->n_points = set->n;
    out->rms_rel = sqrt(best_err / set->n);
    return 0;
}

/* Parse a non-negative finite number token; 0 on success. */
static int parse_num(const char *tok, double *out)
{
    char *end = NULL;
    if (tok == NULL) {
        return -1;
    }
    errno = 0;
    double v = strtod(tok, &end);
    if (end == tok || *end != '\0' || errno != 0 || !isfinite(v) || v < 0) {
        return -1;
    }
    *out = v;
    return 0;
}

/* The value of `key=` in a gpu-check summary line, or -1. */
static double summary_value(const char *line, const char *key)
{
    const char *at = strstr(line, key);
    char *end = NULL;
    if (at == NULL) {
        return -1;
    }
    double v = strtod(at + strlen(key), &end);
    return end == at + strlen(key) || !isfinite(v) ? -1 : v;
}

static tdm_status_t fail(char *err, size_t err_bytes, const char *path, int line, const char *why,
                         FILE *f, calib_set_t *sets)
{
    if (err != NULL && err_bytes > 0) {
        if (line > 0) {
            snprintf(err, err_bytes, "%s:%d: %s", path, line, why);
        } else {
            snprintf(err, err_bytes, "%s: %s", path, why);
        }
    }
    if (f != NULL) {
        fclose(f);
    }
    free(sets[0].pts);
    free(sets[1].pts);
    free(sets[2].pts);
    return TDM_ERR_FORMAT;
}

tdm_status_t sim_perf_calibrate(sim_perf_t *perf, const char *path, char *err, size_t err_bytes)
{
    char line[CALIB_LINE_BYTES];
    calib_set_t sets[3] = {{NULL, 0}, {NULL, 0}, {NULL, 0}}; /* prefill, decode, continue */
    int line_no = 0, header = 0, significant = 0;
    double gbps = -1, tflops = -1;
    sim_perf_fit_t fits[3];
    FILE *f;

    if (perf == NULL || path == NULL) {
        if (err != NULL && err_bytes > 0) {
            snprintf(err, err_bytes, "no model or path");
        }
        return TDM_ERR_INVALID_ARG;
    }
    f = fopen(path, "r");
    if (f == NULL) {
        if (err != NULL && err_bytes > 0) {
            snprintf(err, err_bytes, "%s: %s", path, strerror(errno));
        }
        return errno == ENOENT ? TDM_ERR_NOT_FOUND : TDM_ERR_INVALID_ARG;
    }
    sets[0].pts = calloc(CALIB_MAX_POINTS, sizeof(calib_point_t));
    sets[1].pts = calloc(CALIB_MAX_POINTS, sizeof(calib_point_t));
    sets[2].pts = calloc(CALIB_MAX_POINTS, sizeof(calib_point_t));
    if (sets[0].pts == NULL || sets[1].pts == NULL || sets[2].pts == NULL) {
        fail(err, err_bytes, path, 0, "out of memory", f, sets);
        return TDM_ERR_NO_MEMORY;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        char *save = NULL, *kw, *t1, *t2, *t3, *extra;
        size_t len = strlen(line);
        line_no++;
        if (len == sizeof(line) - 1 && line[len - 1] != '\n') {
            return fail(err, err_bytes, path, line_no, "line longer than 1023 bytes", f, sets);
        }
        if (strncmp(line, "summary:", 8) == 0 && !header) {
            /* scripts/gpu-check (tandem-bench-kernels) */
            double g = summary_value(line, "gemm_decode_best_GBps=");
            double t = summary_value(line, "gemm_prefill_best_TFLOPs=");
            if (g <= 0 || t <= 0) {
                return fail(err, err_bytes, path, line_no,
                            "gpu-check summary without positive gemm_decode_best_GBps and "
                            "gemm_prefill_best_TFLOPs (a run without CUDA?)",
                            f, sets);
            }
            gbps = g;
            tflops = t;
            continue;
        }
        kw = strtok_r(line, " \t\r\n", &save);
        if (kw == NULL || kw[0] == '#') {
            continue;
        }
        if (!significant) {
            significant = 1;
            if (strcmp(kw, "tandem-calib") == 0) {
                t1 = strtok_r(NULL, " \t\r\n", &save);
                if (t1 == NULL || strcmp(t1, "1") != 0) {
                    return fail(err, err_bytes, path, line_no,
                                "unsupported calibration version (expected `tandem-calib 1`)", f,
                                sets);
                }
                header = 1;
                continue;
            }
        }
        if (!header) {
            continue; /* a gpu-check log: only its summary line counts */
        }
        if (strcmp(kw, "source") == 0 || strcmp(kw, "preset") == 0 || strcmp(kw, "model") == 0 ||
            strcmp(kw, "threads") == 0 || strcmp(kw, "cpu") == 0) {
            continue; /* descriptive */
        }
        int kind = strcmp(kw, "prefill") == 0    ? 0
                   : strcmp(kw, "decode") == 0   ? 1
                   : strcmp(kw, "continue") == 0 ? 2
                                                 : -1;
        if (kind < 0) {
            char why[160];
            snprintf(why, sizeof(why),
                     "unknown record `%.40s` (expected prefill, continue or decode)", kw);
            return fail(err, err_bytes, path, line_no, why, f, sets);
        }
        double v1, v2, v3;
        t1 = strtok_r(NULL, " \t\r\n", &save);
        t2 = strtok_r(NULL, " \t\r\n", &save);
        t3 = strtok_r(NULL, " \t\r\n", &save);
        extra = strtok_r(NULL, " \t\r\n", &save);
        if (parse_num(t1, &v1) != 0 || parse_num(t2, &v2) != 0 || parse_num(t3, &v3) != 0 ||
            (extra != NULL && extra[0] != '#')) {
            return fail(err, err_bytes, path, line_no,
                        kind == 1 ? "expected `decode N_SEQS CONTEXT SECONDS` (numbers >= 0)"
                                  : "expected `prefill|continue CACHED NEW SECONDS` (numbers >= "
                                    "0)",
                        f, sets);
        }
        if (v3 <= 0 || (kind != 1 && v2 < 1) || (kind == 1 && v1 < 1)) {
            return fail(err, err_bytes, path, line_no,
                        kind != 1 ? "NEW must be >= 1 and SECONDS > 0"
                                  : "N_SEQS must be >= 1 and SECONDS > 0",
                        f, sets);
        }
        if (sets[kind].n == CALIB_MAX_POINTS) {
            return fail(err, err_bytes, path, line_no, "more than 4096 records of one kind", f,
                        sets);
        }
        calib_point_t *p = &sets[kind].pts[sets[kind].n++];
        if (kind != 1) {
            p->a = v2;                   /* new */
            p->b = v2 * (v1 + v2 / 2.0); /* new x mid context */
        } else {
            p->a = v1;      /* sequences */
            p->b = v1 * v2; /* summed context */
        }
        p->s = v3;
    }
    if (ferror(f)) {
        return fail(err, err_bytes, path, 0, "read error", f, sets);
    }
    if (!header && gbps < 0) {
        return fail(err, err_bytes, path, line_no > 0 ? 1 : 0,
                    "neither a `tandem-calib 1` file nor a gpu-check log with a summary: line", f,
                    sets);
    }
    if (header && sets[0].n == 0 && sets[1].n == 0 && sets[2].n == 0) {
        return fail(err, err_bytes, path, 0, "no prefill or decode records", f, sets);
    }
    memset(fits, 0, sizeof(fits));
    for (int k = 0; k < 3; k++) {
        if (sets[k].n > 0 && fit(&sets[k], &fits[k]) != 0) {
            return fail(err, err_bytes, path, 0,
                        k == 0   ? "the prefill records admit no fit"
                        : k == 1 ? "the decode records admit no fit"
                                 : "the continue records admit no fit",
                        f, sets);
        }
    }
    fclose(f);
    free(sets[0].pts);
    free(sets[1].pts);
    free(sets[2].pts);
    if (header) {
        if (fits[0].have) {
            perf->prefill_fit = fits[0];
        }
        if (fits[1].have) {
            perf->decode_fit = fits[1];
        }
        if (fits[2].have) {
            perf->continue_fit = fits[2];
        }
    } else {
        perf->measured_hbm_bytes_per_s = gbps * 1e9;
        perf->measured_flops = tflops * 1e12;
    }
    return TDM_OK;
}

tdm_status_t sim_perf_calibration_fit(const sim_perf_t *perf, sim_role_t role, double coef[3],
                                      double *rms_rel)
{
    const sim_perf_fit_t *fit_of;
    if (perf == NULL || coef == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    fit_of = role == SIM_ROLE_PREFILL ? &perf->prefill_fit : &perf->decode_fit;
    if (!fit_of->have) {
        return TDM_ERR_NOT_FOUND;
    }
    memcpy(coef, fit_of->coef, 3 * sizeof(double));
    if (rms_rel != NULL) {
        *rms_rel = fit_of->rms_rel;
    }
    return TDM_OK;
}
