/* curve.c - CurveZMQ key files (curve.h). */
#include "common/curve.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/log.h"

static const char Z85_CHARS[] =
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

/* 1 when text[0, n) is a Z85 key. */
static int key_ok_n(const char *text, size_t n)
{
    if (n != TDM_CURVE_Z85_CHARS) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (text[i] == '\0' || strchr(Z85_CHARS, text[i]) == NULL) {
            return 0;
        }
    }
    return 1;
}

int tdm_curve_key_ok(const char *text)
{
    return text != NULL && strlen(text) == TDM_CURVE_Z85_CHARS &&
           key_ok_n(text, TDM_CURVE_Z85_CHARS);
}

/* Trim the line [*start, *start + *n) of blanks and CR on both ends. */
static void trim(const char **start, size_t *n)
{
    while (*n > 0 && (**start == ' ' || **start == '\t')) {
        (*start)++;
        (*n)--;
    }
    while (*n > 0 &&
           ((*start)[*n - 1] == ' ' || (*start)[*n - 1] == '\t' || (*start)[*n - 1] == '\r')) {
        (*n)--;
    }
}

/*
 * If the trimmed line is `NAME = "VALUE"` (quotes optional), the value's start and length for
 * that name; else 0.
 */
static int named_value(const char *line, size_t n, const char *name, const char **value_out,
                       size_t *n_value_out)
{
    size_t n_name = strlen(name);
    const char *v;
    size_t nv;

    if (n <= n_name || memcmp(line, name, n_name) != 0) {
        return 0;
    }
    v = line + n_name;
    nv = n - n_name;
    trim(&v, &nv);
    if (nv == 0 || v[0] != '=') {
        return 0;
    }
    v++;
    nv--;
    trim(&v, &nv);
    if (nv >= 2 && v[0] == '"' && v[nv - 1] == '"') {
        v++;
        nv -= 2;
    }
    *value_out = v;
    *n_value_out = nv;
    return 1;
}

tdm_status_t tdm_curve_keyfile_load(const char *path, tdm_curve_keypair_t *keys_out, char *err,
                                    size_t err_bytes)
{
    tdm_buf_t file = {0};
    tdm_curve_keypair_t keys;
    const char *at;
    size_t line_no = 0;
    tdm_status_t status = TDM_OK;

    if (path == NULL || keys_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    memset(&keys, 0, sizeof(keys));
    status = tdm_buf_read_file(&file, path);
    if (status != TDM_OK) {
        if (err_bytes > 0) {
            snprintf(err, err_bytes, "cannot read %s: %s", path, tdm_status_message(status));
        }
        tdm_buf_fini(&file);
        return status;
    }
    at = file.data != NULL ? file.data : "";
    while (*at != '\0' && status == TDM_OK) {
        size_t n = strcspn(at, "\n");
        const char *line = at;
        const char *v;
        size_t nv;
        char *dest = NULL;
        line_no++;
        at += n + (at[n] != '\0');
        trim(&line, &n);
        if (named_value(line, n, "public-key", &v, &nv)) {
            dest = keys.public_z85;
        } else if (named_value(line, n, "secret-key", &v, &nv)) {
            dest = keys.secret_z85;
        }
        if (dest == NULL) {
            continue;
        }
        if (!key_ok_n(v, nv)) {
            if (err_bytes > 0) {
                snprintf(err, err_bytes, "%s line %zu: a key must be %d Z85 characters", path,
                         line_no, TDM_CURVE_Z85_CHARS);
            }
            status = TDM_ERR_FORMAT;
            break;
        }
        memcpy(dest, v, nv);
        dest[nv] = '\0';
    }
    if (status == TDM_OK && keys.public_z85[0] == '\0') {
        if (err_bytes > 0) {
            snprintf(err, err_bytes, "%s: no public-key line", path);
        }
        status = TDM_ERR_FORMAT;
    }
    if (file.data != NULL) {
        memset(file.data, 0, file.n_bytes);
    }
    tdm_buf_fini(&file);
    if (status == TDM_OK) {
        *keys_out = keys;
    }
    memset(&keys, 0, sizeof(keys));
    return status;
}

tdm_status_t tdm_curve_allowlist_load(const char *path, char (**keys_out)[TDM_CURVE_Z85_CHARS + 1],
                                      size_t *n_out, char *err, size_t err_bytes)
{
    tdm_buf_t file = {0};
    char(*keys)[TDM_CURVE_Z85_CHARS + 1] = NULL;
    size_t n_keys = 0;
    size_t cap = 0;
    size_t line_no = 0;
    const char *at;
    tdm_status_t status;

    if (path == NULL || keys_out == NULL || n_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    status = tdm_buf_read_file(&file, path);
    if (status != TDM_OK) {
        if (err_bytes > 0) {
            snprintf(err, err_bytes, "cannot read %s: %s", path, tdm_status_message(status));
        }
        tdm_buf_fini(&file);
        return status;
    }
    at = file.data != NULL ? file.data : "";
    while (*at != '\0') {
        size_t n = strcspn(at, "\n");
        const char *line = at;
        const char *v = NULL;
        size_t nv = 0;
        line_no++;
        at += n + (at[n] != '\0');
        trim(&line, &n);
        if (key_ok_n(line, n)) {
            v = line;
            nv = n;
        } else if (n == 0 || line[0] == '#' || named_value(line, n, "secret-key", &v, &nv) ||
                   (n == 5 && memcmp(line, "curve", 5) == 0)) {
            continue;
        } else if (!named_value(line, n, "public-key", &v, &nv) || !key_ok_n(v, nv)) {
            if (err_bytes > 0) {
                snprintf(err, err_bytes, "%s line %zu: expected a %d-character Z85 public key",
                         path, line_no, TDM_CURVE_Z85_CHARS);
            }
            status = TDM_ERR_FORMAT;
            goto err_free;
        }
        if (n_keys == cap) {
            void *grown = tdm_array_grow(keys, sizeof(*keys), n_keys + 1, 8, &cap);
            if (grown == NULL) {
                status = TDM_ERR_NO_MEMORY;
                goto err_free;
            }
            keys = grown;
        }
        memcpy(keys[n_keys], v, nv);
        keys[n_keys][nv] = '\0';
        n_keys++;
    }
    if (n_keys == 0) {
        if (err_bytes > 0) {
            snprintf(err, err_bytes, "%s holds no public key", path);
        }
        status = TDM_ERR_FORMAT;
        goto err_free;
    }
    tdm_buf_fini(&file);
    *keys_out = keys;
    *n_out = n_keys;
    return TDM_OK;

err_free:
    free(keys);
    tdm_buf_fini(&file);
    return status;
}

tdm_status_t tdm_curve_keyfile_write(const char *path, const tdm_curve_keypair_t *keys,
                                     int with_secret)
{
    char text[512];
    int n;
    int fd;
    tdm_status_t status = TDM_OK;

    if (path == NULL || keys == NULL || !tdm_curve_key_ok(keys->public_z85) ||
        (with_secret && !tdm_curve_key_ok(keys->secret_z85))) {
        return TDM_ERR_INVALID_ARG;
    }
    n = snprintf(text, sizeof(text),
                 "#   **** Generated by tandem keygen ****\n"
                 "#   ZeroMQ CURVE %s Certificate%s\n\n"
                 "curve\n"
                 "    public-key = \"%s\"\n"
                 "%s%s%s",
                 with_secret ? "**Secret**" : "Public",
                 with_secret ? "\n#   DO NOT PROVIDE THIS FILE TO OTHER USERS" : "",
                 keys->public_z85, with_secret ? "    secret-key = \"" : "",
                 with_secret ? keys->secret_z85 : "", with_secret ? "\"\n" : "");
    unlink(path);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_EXCL, with_secret ? 0600 : 0644);
    if (fd < 0) {
        tdm_log(TDM_LOG_ERROR, "curve", "cannot create key file: path=%s error=\"%s\"", path,
                strerror(errno));
        return TDM_ERR_IO;
    }
    if (write(fd, text, (size_t)n) != n) {
        tdm_log(TDM_LOG_ERROR, "curve", "cannot write key file: path=%s error=\"%s\"", path,
                strerror(errno));
        status = TDM_ERR_IO;
    }
    memset(text, 0, sizeof(text));
    if (close(fd) != 0 && status == TDM_OK) {
        status = TDM_ERR_IO;
    }
    return status;
}
