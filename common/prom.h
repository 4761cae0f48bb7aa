/* prom.h - the one Prometheus text renderer: every /metrics page of every process.
 *
 * Writes the Prometheus text exposition format, version 0.0.4 (prometheus.io/docs/instrumenting/
 * exposition_formats, "Text-based format"; served as "text/plain; version=0.0.4"). Every family
 * starts with its "# HELP name text" and "# TYPE name counter|gauge|histogram" lines; its samples
 * follow, named after the family (a histogram writes name_bucket{...,le="..."} cumulatively up to
 * le="+Inf", then name_sum and name_count). Label values are escaped as the format says
 * (backslash, double quote and line feed as \\, \" and \n); HELP text escapes backslash and
 * line feed. Values: integers exactly, doubles with 15 significant digits, +Inf, -Inf and NaN.
 * Naming conventions (prometheus.io/docs/practices/naming) are the caller's: base units
 * (_seconds, _bytes), counters end in _total; tests/unit/test_cluster_metrics.c checks every
 * process's page with them and with `promtool check metrics`.
 *
 * Owns the text being built. Not thread-safe: one renderer per page; the caller copies its
 * counters under its own lock. An allocation failure sticks and tdm_prom_finish reports it, so
 * callers write without checking each call. Knows nothing of HTTP or of what is measured.
 */
#ifndef TANDEM_COMMON_PROM_H
#define TANDEM_COMMON_PROM_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* The family types used here. */
typedef enum {
    TDM_PROM_COUNTER = 0,
    TDM_PROM_GAUGE = 1,
    TDM_PROM_HISTOGRAM = 2,
} tdm_prom_type_t;

/* One label of a sample: name (matches [a-zA-Z_][a-zA-Z0-9_]*) and value (any UTF-8). */
typedef struct {
    const char *name;
    const char *value;
} tdm_prom_label_t;

/* One histogram sample: n_bounds upper bounds (ascending, +Inf implied) and n_bounds + 1 counts
 * per bucket, NOT cumulative (the last is above every bound). Plain data. */
typedef struct {
    const double *bounds;
    size_t n_bounds;
    const uint64_t *counts;
    double sum;
} tdm_prom_histogram_t;

/* The renderer; opaque. */
typedef struct tdm_prom tdm_prom_t;

/* tdm_prom_create - an empty page. TDM_OK or TDM_ERR_NO_MEMORY. */
tdm_status_t tdm_prom_create(tdm_prom_t **prom_out);

/*
 * tdm_prom_family - start family `name` of `type` with its HELP and TYPE lines. The samples
 * written next belong to it. Each family once per page.
 */
void tdm_prom_family(tdm_prom_t *prom, const char *name, tdm_prom_type_t type, const char *help);

/* tdm_prom_sample_u64 / tdm_prom_sample - one sample of the current counter or gauge family, with
 * n_labels labels (labels may be NULL when n_labels is 0). */
void tdm_prom_sample_u64(tdm_prom_t *prom, const tdm_prom_label_t *labels, size_t n_labels,
                         uint64_t value);
void tdm_prom_sample(tdm_prom_t *prom, const tdm_prom_label_t *labels, size_t n_labels,
                     double value);

/* tdm_prom_histogram - one sample of the current histogram family: _bucket lines (labels plus
 * le), _sum and _count. */
void tdm_prom_histogram(tdm_prom_t *prom, const tdm_prom_label_t *labels, size_t n_labels,
                        const tdm_prom_histogram_t *histogram);

/* Shorthands: a family of one unlabelled sample. */
void tdm_prom_counter(tdm_prom_t *prom, const char *name, const char *help, uint64_t value);
void tdm_prom_gauge(tdm_prom_t *prom, const char *name, const char *help, double value);

/*
 * tdm_prom_finish - end the page and free the renderer. *text_out: NUL-terminated, caller frees
 * with free(); *n_bytes_out excludes the NUL. Returns TDM_OK, or TDM_ERR_NO_MEMORY if any write
 * failed (outputs untouched).
 */
tdm_status_t tdm_prom_finish(tdm_prom_t *prom, char **text_out, size_t *n_bytes_out);

/* tdm_prom_destroy - drop an unfinished page. Accepts NULL. */
void tdm_prom_destroy(tdm_prom_t *prom);

#endif
