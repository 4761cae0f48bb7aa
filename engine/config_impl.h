/* config_impl.h - private helpers shared by the engine/config*.c files.
 *
 * Not part of the public API: only engine/config*.c include it. config.c owns the JSON field
 * table and records where each field's value came from; config_check.c runs the cross-field checks
 * of MODEL.md section 2 and derives the roles; config_presets.c holds the values of sections 2 and
 * 9; config_sizes.c the sizing helpers. Checks name a field by its byte offset in
 * engine_config_t, which config.c turns into the JSON path it was read from.
 */
#ifndef TANDEM_ENGINE_CONFIG_IMPL_H
#define TANDEM_ENGINE_CONFIG_IMPL_H

#include <stddef.h>

#include "common/status.h"
#include "engine/config.h"

/* The only quantization block edge Tandem reads (MODEL.md 3): FP8 blocks, scale groups. */
#define ENGINE_CONFIG_QUANT_BLOCK 32
/* Bytes of a field's JSON path, e.g. "text_config.rope_scaling.original_max_position_embeddings".
 */
#define ENGINE_CONFIG_WHERE_BYTES 96
/* Bytes of a field's location in a message: path, "[index]", "(missing: full-size default)". */
#define ENGINE_CONFIG_WHERE_TEXT_BYTES (ENGINE_CONFIG_WHERE_BYTES + 48)
/* Capacity of a where-table: at least the number of fields in config.c's table. */
#define ENGINE_CONFIG_MAX_FIELDS 96

/* Byte offset of a member of engine_config_t (how checks name a field). */
#define ENGINE_CONFIG_OFFSET(member) offsetof(engine_config_t, member)

/* Where one field's value came from; a where-table is indexed like config.c's field table. */
typedef struct {
    char path[ENGINE_CONFIG_WHERE_BYTES]; /* e.g. "text_config.hidden_size" or "dim" */
    int defaulted; /* 1: missing from the JSON, the full-size value was used */
} engine_config_where_t;

/* Where failed checks are reported: the source's name, its where-table, the caller's buffer. */
typedef struct {
    const char *what;                   /* e.g. "config.json" or a path */
    const engine_config_where_t *where; /* [ENGINE_CONFIG_MAX_FIELDS] */
    char *err;                          /* err_bytes, may be 0 */
    size_t err_bytes;
} engine_config_report_t;

/* engine_config_fill_full/tiny/small - every field of a preset (MODEL.md 2 and 9), memset first;
 * roles not derived. */
void engine_config_fill_full(engine_config_t *cfg);
void engine_config_fill_tiny(engine_config_t *cfg);
void engine_config_fill_small(engine_config_t *cfg);

/*
 * engine_config_fail - write "what: where: reason" (or "what: reason" when where is NULL or
 * empty) into err (err_bytes, may be 0) and return `status`. fmt is printf-style.
 */
tdm_status_t engine_config_fail(const char *what, const char *where, char *err, size_t err_bytes,
                                tdm_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/*
 * engine_config_field_where - the location of the field at byte `offset` of engine_config_t:
 * its path from the where-table, "[index]" when index >= 0, and " (missing: full-size default)"
 * when defaulted. text: text_bytes (ENGINE_CONFIG_WHERE_TEXT_BYTES suffices), written.
 */
void engine_config_field_where(const engine_config_where_t *where, size_t offset, int index,
                               char *text, size_t text_bytes);

/*
 * engine_config_check_and_derive - every cross-field check of MODEL.md section 2 on *cfg (plain
 * field ranges were checked by the reader), then fill the derived block (roles, n_layers, ced_cut).
 * Returns TDM_OK, or TDM_ERR_MISMATCH with one line in report->err naming the field (cfg's
 * derived block then unspecified; callers work on a copy).
 */
tdm_status_t engine_config_check_and_derive(engine_config_t *cfg,
                                            const engine_config_report_t *report);

#endif
