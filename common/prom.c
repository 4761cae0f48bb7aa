/* prom.c - Prometheus text exposition 0.0.4 (prom.h). */
#include "common/prom.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROM_NAME_BYTES 128

struct tdm_prom {
    FILE *out;
    char *text;
    size_t n_bytes;
    char family[PROM_NAME_BYTES]; /* the current family's name */
    int failed;
};

static const char *const TYPE_NAMES[] = {"counter", "gauge", "histogram"};

tdm_status_t tdm_prom_create(tdm_prom_t **prom_out)
{
    tdm_prom_t *p = calloc(1, sizeof(*p));

    if (p == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    p->out = open_memstream(&p->text, &p->n_bytes);
    if (p->out == NULL) {
        free(p);
        return TDM_ERR_NO_MEMORY;
    }
    *prom_out = p;
    return TDM_OK;
}

void tdm_prom_destroy(tdm_prom_t *prom)
{
    if (prom == NULL) {
        return;
    }
    fclose(prom->out);
    free(prom->text);
    free(prom);
}

/* Write text with the escapes of a label value (quote != 0) or of HELP text. */
static void put_escaped(tdm_prom_t *p, const char *text, int quote)
{
    for (const char *c = text != NULL ? text : ""; *c != '\0'; c++) {
        if (*c == '\\') {
            fputs("\\\\", p->out);
        } else if (*c == '\n') {
            fputs("\\n", p->out);
        } else if (*c == '"' && quote) {
            fputs("\\\"", p->out);
        } else {
            fputc(*c, p->out);
        }
    }
}

static void put_double(tdm_prom_t *p, double v)
{
    if (isnan(v)) {
        fputs("NaN", p->out);
    } else if (isinf(v)) {
        fputs(v > 0 ? "+Inf" : "-Inf", p->out);
    } else {
        fprintf(p->out, "%.15g", v);
    }
}

void tdm_prom_family(tdm_prom_t *prom, const char *name, tdm_prom_type_t type, const char *help)
{
    size_t n = strlen(name);

    if (n >= sizeof(prom->family) || (unsigned)type > TDM_PROM_HISTOGRAM) {
        prom->failed = 1;
        return;
    }
    memcpy(prom->family, name, n + 1);
    fprintf(prom->out, "# HELP %s ", name);
    put_escaped(prom, help, 0);
    fprintf(prom->out, "\n# TYPE %s %s\n", name, TYPE_NAMES[type]);
}

/* "name{a="x",b="y"" without the closing brace, or "name" alone when there are no labels and
 * no extra label follows. Returns whether a brace is open. */
static int put_name(tdm_prom_t *p, const char *suffix, const tdm_prom_label_t *labels,
                    size_t n_labels, int more)
{
    fprintf(p->out, "%s%s", p->family, suffix);
    if (n_labels == 0 && !more) {
        return 0;
    }
    fputc('{', p->out);
    for (size_t i = 0; i < n_labels; i++) {
        fprintf(p->out, "%s%s=\"", i > 0 ? "," : "", labels[i].name);
        put_escaped(p, labels[i].value, 1);
        fputc('"', p->out);
    }
    return 1;
}

static void put_labels_end(tdm_prom_t *p, int open)
{
    fputs(open ? "} " : " ", p->out);
}

void tdm_prom_sample_u64(tdm_prom_t *prom, const tdm_prom_label_t *labels, size_t n_labels,
                         uint64_t value)
{
    put_labels_end(prom, put_name(prom, "", labels, n_labels, 0));
    fprintf(prom->out, "%llu\n", (unsigned long long)value);
}

void tdm_prom_sample(tdm_prom_t *prom, const tdm_prom_label_t *labels, size_t n_labels,
                     double value)
{
    put_labels_end(prom, put_name(prom, "", labels, n_labels, 0));
    put_double(prom, value);
    fputc('\n', prom->out);
}

void tdm_prom_histogram(tdm_prom_t *prom, const tdm_prom_label_t *labels, size_t n_labels,
                        const tdm_prom_histogram_t *histogram)
{
    uint64_t cumulative = 0;

    for (size_t b = 0; b <= histogram->n_bounds; b++) {
        cumulative += histogram->counts[b];
        put_name(prom, "_bucket", labels, n_labels, 1);
        fprintf(prom->out, "%sle=\"", n_labels > 0 ? "," : "");
        if (b < histogram->n_bounds) {
            put_double(prom, histogram->bounds[b]);
        } else {
            fputs("+Inf", prom->out);
        }
        fprintf(prom->out, "\"} %llu\n", (unsigned long long)cumulative);
    }
    put_labels_end(prom, put_name(prom, "_sum", labels, n_labels, 0));
    put_double(prom, histogram->sum);
    fputc('\n', prom->out);
    put_labels_end(prom, put_name(prom, "_count", labels, n_labels, 0));
    fprintf(prom->out, "%llu\n", (unsigned long long)cumulative);
}

void tdm_prom_counter(tdm_prom_t *prom, const char *name, const char *help, uint64_t value)
{
    tdm_prom_family(prom, name, TDM_PROM_COUNTER, help);
    tdm_prom_sample_u64(prom, NULL, 0, value);
}

void tdm_prom_gauge(tdm_prom_t *prom, const char *name, const char *help, double value)
{
    tdm_prom_family(prom, name, TDM_PROM_GAUGE, help);
    tdm_prom_sample(prom, NULL, 0, value);
}

tdm_status_t tdm_prom_finish(tdm_prom_t *prom, char **text_out, size_t *n_bytes_out)
{
    int failed = prom->failed || ferror(prom->out) != 0;

    if (fclose(prom->out) != 0) {
        failed = 1;
    }
    if (failed || prom->text == NULL) {
        free(prom->text);
        free(prom);
        return TDM_ERR_NO_MEMORY;
    }
    *text_out = prom->text;
    *n_bytes_out = prom->n_bytes;
    free(prom);
    return TDM_OK;
}
