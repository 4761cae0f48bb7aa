/* report.h - tandem-sim's outputs: the AgentPerf-style curve as JSON and as a gnuplot PNG.
 *
 * A curve is one deployment (GPU kind, racks) swept over concurrency levels (agents): each point
 * is a sim_result_t. The JSON carries every measured field of every point plus the batch-1
 * single-agent speed per GPU kind and the P:D ratio chosen; the PNG plots aggregate output
 * tokens/s per MW of GPU power (y) against per-agent output tokens/s (x), one line per curve,
 * each point labelled with its agent count. Owns nothing past a call; runs gnuplot (Debian
 * package gnuplot-nox) as a child process for the PNG.
 */
#ifndef TANDEM_SIM_REPORT_H
#define TANDEM_SIM_REPORT_H

#include <jansson.h>
#include <stddef.h>

#include "common/status.h"
#include "sim/sim.h"

/* One curve (borrowed data). */
typedef struct {
    const char *label;          /* e.g. "GB300 NVL72 x 16 racks" */
    const sim_result_t *points; /* n_points results, in order of agents */
    size_t n_points;
} sim_curve_t;

/* Batch-1 speed of one GPU kind (plain data). */
typedef struct {
    const char *gpu;  /* sim_gpu_t.name */
    double tok_s;     /* sim_batch1_tok_s */
    uint64_t context; /* context tokens it was measured at */
} sim_batch1_t;

/* sim_result_json - one point as a new JSON object (NULL when out of memory). */
json_t *sim_result_json(const sim_result_t *result);

/*
 * sim_report_json - write {"workload", "curves": [{"label", "gpu", "racks", "pd", "points":
 * [...]}], "batch1": [{"gpu", "tok_s", "context"}]} to `path`. Returns TDM_OK, TDM_ERR_IO or
 * TDM_ERR_NO_MEMORY (reason in err, err_bytes may be 0).
 */
tdm_status_t sim_report_json(const char *path, const char *workload, const sim_curve_t *curves,
                             size_t n_curves, const sim_batch1_t *batch1, size_t n_batch1,
                             char *err, size_t err_bytes);

/*
 * sim_report_plot - write `png_path` (800 x 500, small) through gnuplot, with its data and script
 * next to it (png_path with .dat / .gp). Returns TDM_OK, TDM_ERR_UNSUPPORTED (gnuplot not
 * installed: the .dat and .gp are still written) or TDM_ERR_IO.
 */
tdm_status_t sim_report_plot(const char *png_path, const char *title, const sim_curve_t *curves,
                             size_t n_curves, char *err, size_t err_bytes);

#endif
