/* prom_check.h - checks a /metrics page against the Prometheus text exposition format 0.0.4
 * (common/prom.h) and Tandem's naming rules, and runs `promtool check metrics` over it when
 * promtool is on PATH. Header-only (static inline) for the tests that read /metrics pages.
 *
 * prom_check_text: every sample belongs to the family whose "# HELP" and "# TYPE" lines (in that
 * order, same name) come right before its samples; each family once; counters end in _total,
 * other families do not, nor in _count/_sum/_bucket; histograms give cumulative _bucket lines
 * with le up to "+Inf", then _sum and _count (= the +Inf bucket); label values are quoted with
 * only \\, \" and \n escapes; no name carries an abbreviated time unit (_ms, _us, _ns).
 */
#ifndef TANDEM_TESTS_PROM_CHECK_H
#define TANDEM_TESTS_PROM_CHECK_H

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define PROM_CHECK_NAME   128
#define PROM_CHECK_FAMILY 512

static inline int prom_check_ends(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);

    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Reads a name [a-zA-Z_:][a-zA-Z0-9_:]* at *p into out; 0 when there is none. */
static inline int prom_check_name(const char **p, char *out)
{
    size_t n = 0;

    if (!(isalpha((unsigned char)**p) || **p == '_' || **p == ':')) {
        return 0;
    }
    while ((isalnum((unsigned char)**p) || **p == '_' || **p == ':') && n + 1 < PROM_CHECK_NAME) {
        out[n++] = *(*p)++;
    }
    out[n] = '\0';
    return 1;
}

/*
 * prom_check_text - NULL when `text` passes, else a description of the first problem (in err,
 * err_bytes).
 */
static inline const char *prom_check_text(const char *text, char *err, size_t err_bytes)
{
    static char families[PROM_CHECK_FAMILY][PROM_CHECK_NAME];
    int n_families = 0;
    char family[PROM_CHECK_NAME] = "", type[32] = "", help_name[PROM_CHECK_NAME] = "";
    double last_bucket = 0.0, last_le = 0.0;
    int line_no = 0, hstate = 0; /* histogram series: 0 none, 1 buckets, 2 +Inf, 3 _sum */

    for (const char *line = text; *line != '\0';) {
        const char *nl = strchr(line, '\n');
        size_t len = nl != NULL ? (size_t)(nl - line) : strlen(line);
        char buf[4096], name[PROM_CHECK_NAME], want[PROM_CHECK_NAME + 16];
        const char *p = buf;
        int has_le = 0;
        double le = 0.0, value;
        char *end;

        line_no++;
        if (len >= sizeof(buf)) {
            snprintf(err, err_bytes, "line %d: too long", line_no);
            return err;
        }
        memcpy(buf, line, len);
        buf[len] = '\0';
        line = nl != NULL ? nl + 1 : line + len;
        if (strncmp(buf, "# HELP ", 7) == 0) {
            p = buf + 7;
            if (!prom_check_name(&p, help_name) || *p != ' ') {
                snprintf(err, err_bytes, "line %d: bad HELP line: %.200s", line_no, buf);
                return err;
            }
            continue;
        }
        if (strncmp(buf, "# TYPE ", 7) == 0) {
            p = buf + 7;
            if (hstate != 0) {
                snprintf(err, err_bytes, "line %d: histogram %.200s ends unfinished", line_no,
                         family);
                return err;
            }
            if (!prom_check_name(&p, family) || strcmp(family, help_name) != 0 || *p != ' ') {
                snprintf(err, err_bytes, "line %d: TYPE without its HELP line first: %.200s",
                         line_no, buf);
                return err;
            }
            snprintf(type, sizeof(type), "%s", p + 1);
            if (strcmp(type, "counter") != 0 && strcmp(type, "gauge") != 0 &&
                strcmp(type, "histogram") != 0) {
                snprintf(err, err_bytes, "line %d: unexpected type: %.200s", line_no, buf);
                return err;
            }
            for (int i = 0; i < n_families; i++) {
                if (strcmp(families[i], family) == 0) {
                    snprintf(err, err_bytes, "line %d: family %.200s twice", line_no, family);
                    return err;
                }
            }
            if (n_families < PROM_CHECK_FAMILY) {
                snprintf(families[n_families++], PROM_CHECK_NAME, "%s", family);
            }
            if (strcmp(type, "counter") == 0) {
                if (!prom_check_ends(family, "_total")) {
                    snprintf(err, err_bytes, "line %d: counter %.200s does not end in _total",
                             line_no, family);
                    return err;
                }
            } else if (prom_check_ends(family, "_total") || prom_check_ends(family, "_count") ||
                       prom_check_ends(family, "_sum") || prom_check_ends(family, "_bucket")) {
                snprintf(err, err_bytes, "line %d: %.200s %.200s ends in a reserved suffix",
                         line_no, type, family);
                return err;
            }
            if (strstr(family, "_ms_") != NULL || prom_check_ends(family, "_ms") ||
                strstr(family, "_us_") != NULL || prom_check_ends(family, "_us") ||
                strstr(family, "_ns_") != NULL || prom_check_ends(family, "_ns")) {
                snprintf(err, err_bytes, "line %d: %.200s: not a base unit", line_no, family);
                return err;
            }
            help_name[0] = '\0';
            continue;
        }
        if (buf[0] == '#' || buf[0] == '\0') {
            snprintf(err, err_bytes, "line %d: unexpected line: %.200s", line_no, buf);
            return err;
        }
        if (!prom_check_name(&p, name) || family[0] == '\0') {
            snprintf(err, err_bytes, "line %d: sample outside a family: %.200s", line_no, buf);
            return err;
        }
        if (*p == '{') {
            p++;
            while (*p != '}') {
                char label[PROM_CHECK_NAME], lval[256];
                size_t n = 0;

                if (!prom_check_name(&p, label) || *p++ != '=' || *p++ != '"') {
                    snprintf(err, err_bytes, "line %d: bad label: %.200s", line_no, buf);
                    return err;
                }
                while (*p != '"') {
                    if (*p == '\0' || (*p == '\\' && strchr("\\\"n", p[1]) == NULL) ||
                        n + 1 >= sizeof(lval)) {
                        snprintf(err, err_bytes, "line %d: bad label value: %.200s", line_no, buf);
                        return err;
                    }
                    if (*p == '\\') {
                        p++;
                    }
                    lval[n++] = *p++;
                }
                lval[n] = '\0';
                p++;
                if (strcmp(label, "le") == 0) {
                    has_le = 1;
                    le = strcmp(lval, "+Inf") == 0 ? 1e308 : strtod(lval, &end);
                }
                if (*p == ',') {
                    p++;
                } else if (*p != '}') {
                    snprintf(err, err_bytes, "line %d: bad label list: %.200s", line_no, buf);
                    return err;
                }
            }
            p++;
        }
        if (*p++ != ' ') {
            snprintf(err, err_bytes, "line %d: no value: %.200s", line_no, buf);
            return err;
        }
        value = strtod(p, &end);
        if (end == p || *end != '\0') {
            snprintf(err, err_bytes, "line %d: bad value: %.200s", line_no, buf);
            return err;
        }
        if (strcmp(type, "histogram") != 0) {
            if (strcmp(name, family) != 0) {
                snprintf(err, err_bytes, "line %d: %.200s is not a sample of family %.200s",
                         line_no, name, family);
                return err;
            }
            continue;
        }
        snprintf(want, sizeof(want), "%s_bucket", family);
        if (strcmp(name, want) == 0 && has_le && (hstate == 0 || hstate == 1)) {
            if (hstate == 1 && (le <= last_le || value < last_bucket)) {
                snprintf(err, err_bytes, "line %d: bucket out of order: %.200s", line_no, buf);
                return err;
            }
            hstate = le >= 1e308 ? 2 : 1;
            last_le = le;
            last_bucket = value;
            continue;
        }
        snprintf(want, sizeof(want), "%s_sum", family);
        if (strcmp(name, want) == 0 && hstate == 2) {
            hstate = 3;
            continue;
        }
        snprintf(want, sizeof(want), "%s_count", family);
        if (strcmp(name, want) != 0 || hstate != 3 || value != last_bucket) {
            snprintf(err, err_bytes,
                     "line %d: not the next sample of histogram %.200s (buckets up to +Inf, _sum, "
                     "_count = the +Inf bucket): %.200s",
                     line_no, family, buf);
            return err;
        }
        hstate = 0;
    }
    if (hstate != 0) {
        snprintf(err, err_bytes, "histogram %.200s ends unfinished", family);
        return err;
    }
    if (n_families == 0) {
        snprintf(err, err_bytes, "no families");
        return err;
    }
    return NULL;
}

/*
 * prom_check_promtool - run `promtool check metrics` over text. Returns 1 and leaves its output
 * (empty when clean) in out; 0 when promtool is not on PATH (out says so); -1 when it could not
 * be run.
 */
static inline int prom_check_promtool(const char *text, const char *tmp_path, char *out,
                                      size_t out_bytes, int *status_out)
{
    char cmd[2048];
    FILE *f;
    size_t n = 0;
    int status;

    out[0] = '\0';
    if (system("command -v promtool >/dev/null 2>&1") != 0) {
        snprintf(out, out_bytes, "promtool not on PATH (Debian package prometheus)");
        return 0;
    }
    f = fopen(tmp_path, "w");
    if (f == NULL || fputs(text, f) < 0 || fclose(f) != 0) {
        return -1;
    }
    snprintf(cmd, sizeof(cmd), "promtool check metrics < '%s' 2>&1", tmp_path);
    f = popen(cmd, "r");
    if (f == NULL) {
        return -1;
    }
    while (n + 1 < out_bytes && fgets(out + n, (int)(out_bytes - n), f) != NULL) {
        n += strlen(out + n);
    }
    status = pclose(f);
    *status_out = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    return 1;
}

#endif
