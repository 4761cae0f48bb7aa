/* report.c - JSON and gnuplot output of tandem-sim. See report.h. */
#include "sim/report.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

json_t *sim_result_json(const sim_result_t *r)
{
    char pd[32];

    snprintf(pd, sizeof(pd), "%u:%u", r->prefill_per_rack, r->decode_per_rack);
    return json_pack(
        "{s:s, s:I, s:I, s:I, s:s, s:I, s:I, s:I, s:I, s:f, s:f, s:I, s:I, s:I, s:I, s:I, s:I,"
        " s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f,"
        " s:f}",
        "gpu", r->gpu, "racks", (json_int_t)r->racks, "agents", (json_int_t)r->agents, "gpus",
        (json_int_t)r->gpus_total, "pd_per_rack", pd, "prefill_group_gpus",
        (json_int_t)r->prefill_group_gpus, "decode_group_gpus", (json_int_t)r->decode_group_gpus,
        "idle_gpus_per_rack", (json_int_t)r->idle_gpus_per_rack, "decode_kv_tokens",
        (json_int_t)r->decode_kv_tokens, "window_s", r->window_s, "end_s", r->end_s,
        "turns_started", (json_int_t)r->turns_started, "turns_done", (json_int_t)r->turns_done,
        "output_tokens_started", (json_int_t)r->output_tokens_started, "output_tokens_done",
        (json_int_t)r->output_tokens_done, "prefill_tokens", (json_int_t)r->prefill_tokens,
        "cached_tokens", (json_int_t)r->cached_tokens, "local_prefills",
        (json_int_t)r->local_prefills, "remote_prefills", (json_int_t)r->remote_prefills,
        "rack_local_prefills", (json_int_t)r->rack_local_prefills, "evictions",
        (json_int_t)r->evictions, "sessions_started", (json_int_t)r->sessions_started,
        "placement_misses", (json_int_t)r->placement_misses, "events", (json_int_t)r->events,
        "output_tok_s", r->output_tok_s, "power_w", r->power_w, "tok_s_per_mw", r->tok_s_per_mw,
        "agent_tok_s", r->agent_tok_s, "agent_e2e_tok_s", r->agent_e2e_tok_s, "ttft_p50_s",
        r->ttft_p50_s, "ttft_p99_s", r->ttft_p99_s, "decode_batch_mean", r->decode_batch_mean,
        "decode_busy", r->decode_busy, "prefill_busy", r->prefill_busy, "wall_s", r->wall_s);
}

tdm_status_t sim_report_json(const char *path, const char *workload, const sim_curve_t *curves,
                             size_t n_curves, const sim_batch1_t *batch1, size_t n_batch1,
                             char *err, size_t err_bytes)
{
    json_t *root = json_object(), *jc = json_array(), *jb = json_array();
    tdm_status_t status = TDM_ERR_NO_MEMORY;

    if (root == NULL || jc == NULL || jb == NULL) {
        goto out;
    }
    for (size_t c = 0; c < n_curves; c++) {
        json_t *points = json_array(), *curve;
        char pd[32] = "";

        if (points == NULL) {
            goto out;
        }
        for (size_t p = 0; p < curves[c].n_points; p++) {
            json_array_append_new(points, sim_result_json(&curves[c].points[p]));
        }
        if (curves[c].n_points > 0) {
            snprintf(pd, sizeof(pd), "%u:%u", curves[c].points[0].prefill_per_rack,
                     curves[c].points[0].decode_per_rack);
        }
        curve = json_pack("{s:s, s:s, s:I, s:s, s:o}", "label", curves[c].label, "gpu",
                          curves[c].n_points > 0 ? curves[c].points[0].gpu : "", "racks",
                          (json_int_t)(curves[c].n_points > 0 ? curves[c].points[0].racks : 0),
                          "pd_per_rack", pd, "points", points);
        if (curve == NULL || json_array_append_new(jc, curve) != 0) {
            goto out;
        }
    }
    for (size_t b = 0; b < n_batch1; b++) {
        json_array_append_new(jb,
                              json_pack("{s:s, s:f, s:I}", "gpu", batch1[b].gpu, "tok_s",
                                        batch1[b].tok_s, "context", (json_int_t)batch1[b].context));
    }
    json_object_set_new(root, "workload", json_string(workload != NULL ? workload : ""));
    json_object_set(root, "curves", jc);
    json_object_set(root, "batch1", jb);
    if (json_dump_file(root, path, JSON_INDENT(1) | JSON_REAL_PRECISION(6)) != 0) {
        snprintf(err, err_bytes, "%s: cannot write", path);
        status = TDM_ERR_IO;
        goto out;
    }
    status = TDM_OK;
out:
    json_decref(jc);
    json_decref(jb);
    json_decref(root);
    return status;
}

/* path with its extension (after the last '.') replaced by ext, into buf. */
static void with_ext(const char *path, const char *ext, char *buf, size_t n)
{
    const char *dot = strrchr(path, '.');
    int keep = dot != NULL ? (int)(dot - path) : (int)strlen(path);

    snprintf(buf, n, "%.*s.%s", keep, path, ext);
}

/* text for a single-quoted gnuplot string: quotes and backslashes become spaces. */
static const char *gp_text(const char *text, char *buf, size_t n)
{
    size_t i = 0;

    for (; text != NULL && text[i] != '\0' && i + 1 < n; i++) {
        buf[i] = text[i] == '\'' || text[i] == '\\' ? ' ' : text[i];
    }
    buf[i] = '\0';
    return buf;
}

tdm_status_t sim_report_plot(const char *png_path, const char *title, const sim_curve_t *curves,
                             size_t n_curves, char *err, size_t err_bytes)
{
    char text[256];

    char dat[1024], gp[1024], cmd[2200];
    FILE *f;
    int rc;

    with_ext(png_path, "dat", dat, sizeof(dat));
    with_ext(png_path, "gp", gp, sizeof(gp));
    f = fopen(dat, "w");
    if (f == NULL) {
        snprintf(err, err_bytes, "%s: cannot write", dat);
        return TDM_ERR_IO;
    }
    for (size_t c = 0; c < n_curves; c++) {
        fprintf(f, "# %s\n# agent_tok_s tok_s_per_mw agents\n", curves[c].label);
        for (size_t p = 0; p < curves[c].n_points; p++) {
            fprintf(f, "%.3f %.1f %u\n", curves[c].points[p].agent_tok_s,
                    curves[c].points[p].tok_s_per_mw, curves[c].points[p].agents);
        }
        fprintf(f, "\n\n");
    }
    fclose(f);
    f = fopen(gp, "w");
    if (f == NULL) {
        snprintf(err, err_bytes, "%s: cannot write", gp);
        return TDM_ERR_IO;
    }
    fprintf(f,
            "set terminal pngcairo size 800,500 font 'sans,10'\n"
            "set output '%s'\n"
            "set title '%s'\n"
            "set xlabel 'per-agent output tokens/s'\n"
            "set ylabel 'aggregate output tokens/s per MW of GPU power'\n"
            "set grid\nset key top right\nset logscale y\n"
            "plot ",
            png_path, gp_text(title != NULL ? title : "tandem-sim", text, sizeof(text)));
    for (size_t c = 0; c < n_curves; c++) {
        fprintf(f,
                "%s'%s' index %zu using 1:2 with linespoints lw 2 title '%s', "
                "'' index %zu using 1:2:3 with labels offset 0,0.8 font ',8' notitle",
                c > 0 ? ", " : "", dat, c, gp_text(curves[c].label, text, sizeof(text)), c);
    }
    fprintf(f, "\n");
    fclose(f);
    if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
        snprintf(err, err_bytes, "gnuplot not installed: %s and %s written, no PNG", dat, gp);
        return TDM_ERR_UNSUPPORTED;
    }
    snprintf(cmd, sizeof(cmd), "gnuplot '%s'", gp);
    rc = system(cmd);
    if (rc == -1 || !WIFEXITED(rc) || WEXITSTATUS(rc) != 0) {
        snprintf(err, err_bytes, "gnuplot %s failed (status %d)", gp, rc);
        return TDM_ERR_IO;
    }
    return TDM_OK;
}
