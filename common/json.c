#include "common/json.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

tdm_status_t tdm_json_load_file(const char *path, json_t **root_out, char *err, size_t err_bytes)
{
    json_error_t error;
    json_t *root;

    if (access(path, F_OK) != 0) {
        if (err_bytes > 0) {
            snprintf(err, err_bytes, "%s: %s", path, strerror(errno));
        }
        return errno == ENOENT ? TDM_ERR_NOT_FOUND : TDM_ERR_IO;
    }
    root = json_load_file(path, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &error);
    if (root == NULL) {
        if (err_bytes > 0) {
            snprintf(err, err_bytes, "%s:%d:%d: %s", path, error.line, error.column, error.text);
        }
        return error.line <= 0 && error.position == 0 ? TDM_ERR_IO : TDM_ERR_FORMAT;
    }
    *root_out = root;
    return TDM_OK;
}

tdm_status_t tdm_json_load_text(const char *text, size_t n_bytes, const char *what,
                                json_t **root_out, char *err, size_t err_bytes)
{
    json_error_t error;
    json_t *root = json_loadb(text, n_bytes, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &error);

    if (root == NULL) {
        if (err_bytes > 0) {
            snprintf(err, err_bytes, "%s:%d:%d: %s", what, error.line, error.column, error.text);
        }
        return TDM_ERR_FORMAT;
    }
    *root_out = root;
    return TDM_OK;
}

tdm_status_t tdm_json_int_exact(const json_t *value, int64_t *value_out)
{
    if (json_is_integer(value)) {
        *value_out = (int64_t)json_integer_value(value);
        return TDM_OK;
    }
    if (json_is_real(value)) {
        double v = json_real_value(value);
        if (isfinite(v) && v == floor(v) && fabs(v) < 9.0e15) {
            *value_out = (int64_t)v;
            return TDM_OK;
        }
    }
    return TDM_ERR_FORMAT;
}
