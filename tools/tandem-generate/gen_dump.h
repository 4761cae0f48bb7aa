/* gen_dump.h - tandem-generate's debug dumps in the MODEL.md 12.10 formats.
 *
 * Owns the open dump files: the TDLOGIT1 logits file (--dump-logits) and the per-layer files of a
 * --dump-layers directory with its manifest.json. Rows are appended as the forward pass produces
 * them (nothing is held in memory beyond one call); headers and the manifest are written at
 * finish. Knows nothing of the schedules or of sampling: the caller says which positions the rows
 * are. The directory layout is the one tests/reference/flash_ref/dumps.py reads:
 *   <l>.in.f32, <l>.out.f32   float32 [n, m, H]  residual streams entering / leaving layer l
 *   <l>.pre.f32               float32 [n, m]     the pre the attention collapse used (extension)
 *   <l>.sel.i32               int32 [n, k_I]     selected rows, ascending, -1 padded
 *   <l>.experts.i32           int32 [n, K]       routed experts, ascending
 *   manifest.json             {"format": "tandem-dump-layers", "writer", "schedule",
 *                              "first_position", "T", "m", "H", "k_I", "K", "layers", "ids",
 *                              "files": {name: {"dtype", "shape", "first_position"}}}
 * where n is the rows layer l produced (under CED, layers above the cut start at the tail R;
 * the per-file "first_position" says where). Not thread-safe.
 */
#ifndef TANDEM_TOOLS_GEN_DUMP_H
#define TANDEM_TOOLS_GEN_DUMP_H

#include <stdint.h>

#include "common/status.h"
#include "engine/config.h"
#include "engine/forward.h"

/* Schedule codes of the TDLOGIT1 header (MODEL.md 12.10). */
#define GEN_DUMP_SCHEDULE_ORACLE 0u
#define GEN_DUMP_SCHEDULE_CED    1u

/* A --dump-logits file being written; opaque. */
typedef struct gen_logits_dump gen_logits_dump_t;

/*
 * gen_logits_dump_create - create (truncate) `path` for [rows, vocab] float32 logits of the given
 * schedule (GEN_DUMP_SCHEDULE_*). The 32-byte header is written at finish.
 *
 * Returns TDM_OK and *dump_out (finish or destroy it), TDM_ERR_INVALID_ARG (NULL, vocab < 1),
 * TDM_ERR_IO (cannot create; logged with strerror) or TDM_ERR_NO_MEMORY.
 */
tdm_status_t gen_logits_dump_create(const char *path, int64_t vocab, uint32_t schedule,
                                    gen_logits_dump_t **dump_out);

/*
 * gen_logits_dump_append - append n_rows rows [n_rows, vocab] holding the logits computed at
 * positions first_position .. first_position + n_rows - 1. The first call fixes the header's
 * first_position; later calls must continue where the previous one ended (else
 * TDM_ERR_INVALID_ARG, nothing written). Returns TDM_OK or TDM_ERR_IO.
 */
tdm_status_t gen_logits_dump_append(gen_logits_dump_t *dump, int64_t first_position,
                                    const float *rows, int64_t n_rows);

/*
 * gen_logits_dump_finish - write the header (rows written so far), close and free the dump.
 * Returns TDM_OK or TDM_ERR_IO (the dump is freed either way). Accepts NULL (TDM_OK).
 */
tdm_status_t gen_logits_dump_finish(gen_logits_dump_t *dump);

/* gen_logits_dump_destroy - close and free without writing the header; accepts NULL. */
void gen_logits_dump_destroy(gen_logits_dump_t *dump);

/* A --dump-layers directory being written; opaque. */
typedef struct gen_layer_dump gen_layer_dump_t;

/*
 * gen_layer_dump_create - create the directory `dir` (and missing parents) and open the five
 * files of every backbone layer of cfg (borrowed for the call) for writing. schedule_name is
 * "oracle" or "ced" (copied into the manifest).
 *
 * Returns TDM_OK and *dump_out, TDM_ERR_INVALID_ARG, TDM_ERR_IO (logged) or TDM_ERR_NO_MEMORY.
 */
tdm_status_t gen_layer_dump_create(const char *dir, const engine_config_t *cfg,
                                   const char *schedule_name, gen_layer_dump_t **dump_out);

/*
 * gen_layer_dump_sink - the forward-pass sink (engine_fwd_set_dump) that appends each layer
 * record to the files. The sink borrows `dump`. A write error or a record that does not continue
 * the layer's previous rows is remembered and returned by gen_layer_dump_finish.
 */
void gen_layer_dump_sink(gen_layer_dump_t *dump, engine_dump_sink_t *sink_out);

/*
 * gen_layer_dump_finish - write manifest.json with the ids of the positions dumped (ids [n_ids],
 * position 0 first), close and free. Returns TDM_OK, the first error the sink met, or TDM_ERR_IO.
 * Accepts NULL (TDM_OK).
 */
tdm_status_t gen_layer_dump_finish(gen_layer_dump_t *dump, const int32_t *ids, int64_t n_ids);

/* gen_layer_dump_destroy - close and free without a manifest; accepts NULL. */
void gen_layer_dump_destroy(gen_layer_dump_t *dump);

#endif
