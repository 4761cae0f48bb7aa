/* json.h - small helpers over jansson for reading Tandem's JSON inputs (config.json, index
 * files, tokenizer.json) with errors that name the file, line and field.
 *
 * Returned json_t references are owned by the caller (json_decref). Knows nothing of what the
 * documents mean.
 */
#ifndef TANDEM_COMMON_JSON_H
#define TANDEM_COMMON_JSON_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/*
 * tdm_json_load_file - parse the JSON file at `path` into *root_out (caller decrefs).
 * On failure writes "path:line:column: reason" into err (err_bytes, may be 0) and returns
 * TDM_ERR_NOT_FOUND (no such file), TDM_ERR_IO (unreadable) or TDM_ERR_FORMAT (bad JSON).
 */
tdm_status_t tdm_json_load_file(const char *path, json_t **root_out, char *err, size_t err_bytes);

/*
 * tdm_json_load_text - parse `n_bytes` of JSON text into *root_out (caller decrefs); `what`
 * names the source in err. Returns TDM_OK or TDM_ERR_FORMAT.
 */
tdm_status_t tdm_json_load_text(const char *text, size_t n_bytes, const char *what,
                                json_t **root_out, char *err, size_t err_bytes);

/*
 * tdm_json_int_exact - *value_out = the integer held by `value`, which must be a JSON integer, or
 * a real with an exact integral value. Returns TDM_OK or TDM_ERR_FORMAT (value untouched).
 */
tdm_status_t tdm_json_int_exact(const json_t *value, int64_t *value_out);

#endif
