/* chat_json.c - JSON text exactly as Python's json.dumps(value, ensure_ascii=False) writes it.
 *
 * DeepSeek-V4's encoder (encoding_dsv4.py to_json) puts tool schemas and non-string tool-call
 * arguments into the prompt with json.dumps, so the prompt bytes depend on its formatting:
 * ", " and ": " separators, raw UTF-8, and float repr. Sources: CPython Lib/json/encoder.py
 * (ESCAPE table, py_encode_basestring), Objects/floatobject.c float_repr and
 * Python/pystrtod.c format_float_short ('r' mode: shortest round-trip digits, positional when
 * -4 <= exponent < 16, Py_DTSF_ADD_DOT_0).
 */
#include "text/chat_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64

static tdm_status_t put(tdm_buf_t *out, const char *s)
{
    return tdm_buf_append(out, s, strlen(s));
}

/* A JSON string literal: only '"', '\\' and control characters are escaped. */
static tdm_status_t put_string(tdm_buf_t *out, const char *s, size_t n)
{
    tdm_status_t status = tdm_buf_append(out, "\"", 1);
    size_t run = 0;

    for (size_t i = 0; i < n && status == TDM_OK; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        if (c >= 0x20 && c != '"' && c != '\\') {
            continue;
        }
        status = tdm_buf_append(out, s + run, i - run);
        run = i + 1;
        switch (c) {
        case '"':
            strcpy(esc, "\\\"");
            break;
        case '\\':
            strcpy(esc, "\\\\");
            break;
        case '\n':
            strcpy(esc, "\\n");
            break;
        case '\r':
            strcpy(esc, "\\r");
            break;
        case '\t':
            strcpy(esc, "\\t");
            break;
        case '\b':
            strcpy(esc, "\\b");
            break;
        case '\f':
            strcpy(esc, "\\f");
            break;
        default:
            snprintf(esc, sizeof(esc), "\\u%04x", c);
            break;
        }
        if (status == TDM_OK) {
            status = put(out, esc);
        }
    }
    if (status == TDM_OK) {
        status = tdm_buf_append(out, s + run, n - run);
    }
    return status == TDM_OK ? tdm_buf_append(out, "\"", 1) : status;
}

/* Python's repr of a finite double. */
static tdm_status_t put_real(tdm_buf_t *out, double x)
{
    char sci[40], digits[24], text[64];
    int n_digits = 0, exp10 = 0, decpt, pos = 0;
    const char *p;

    if (!isfinite(x)) {
        return TDM_ERR_INVALID_ARG;
    }
    /* Shortest mantissa that reads back as x (%.*e rounds correctly, so the first precision
     * that round-trips gives the digits closest to x). */
    for (int prec = 0; prec < 17; prec++) {
        snprintf(sci, sizeof(sci), "%.*e", prec, fabs(x));
        if (strtod(sci, NULL) == fabs(x)) {
            break;
        }
    }
    for (p = sci; *p != 'e'; p++) {
        if (*p >= '0' && *p <= '9') {
            digits[n_digits++] = *p;
        }
    }
    exp10 = atoi(p + 1);
    while (n_digits > 1 && digits[n_digits - 1] == '0') {
        n_digits--;
    }
    digits[n_digits] = '\0';
    decpt = exp10 + 1; /* x = 0.DIGITS * 10^decpt */
    if (signbit(x)) {
        text[pos++] = '-';
    }
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            pos += snprintf(text + pos, sizeof(text) - (size_t)pos, "0.%.*s%s", -decpt, "0000",
                            digits);
        } else if (decpt >= n_digits) {
            pos += snprintf(text + pos, sizeof(text) - (size_t)pos, "%s%.*s.0", digits,
                            decpt - n_digits, "0000000000000000");
        } else {
            pos += snprintf(text + pos, sizeof(text) - (size_t)pos, "%.*s.%s", decpt, digits,
                            digits + decpt);
        }
    } else {
        pos += snprintf(text + pos, sizeof(text) - (size_t)pos, "%c%s%se%c%02d", digits[0],
                        n_digits > 1 ? "." : "", digits + 1, exp10 < 0 ? '-' : '+',
                        exp10 < 0 ? -exp10 : exp10);
    }
    (void)pos;
    return put(out, text);
}

static tdm_status_t dump(const json_t *v, tdm_buf_t *out, int depth)
{
    tdm_status_t status = TDM_OK;
    char num[32];

    if (depth > MAX_DEPTH) {
        return TDM_ERR_INVALID_ARG;
    }
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *key;
        json_t *item;
        int first = 1;
        status = put(out, "{");
        json_object_foreach((json_t *)v, key, item)
        {
            if (status == TDM_OK && !first) {
                status = put(out, ", ");
            }
            first = 0;
            if (status == TDM_OK) {
                status = put_string(out, key, strlen(key));
            }
            if (status == TDM_OK) {
                status = put(out, ": ");
            }
            if (status == TDM_OK) {
                status = dump(item, out, depth + 1);
            }
        }
        return status == TDM_OK ? put(out, "}") : status;
    }
    case JSON_ARRAY:
        status = put(out, "[");
        for (size_t i = 0; i < json_array_size(v) && status == TDM_OK; i++) {
            if (i > 0) {
                status = put(out, ", ");
            }
            if (status == TDM_OK) {
                status = dump(json_array_get(v, i), out, depth + 1);
            }
        }
        return status == TDM_OK ? put(out, "]") : status;
    case JSON_STRING:
        return put_string(out, json_string_value(v), json_string_length(v));
    case JSON_INTEGER:
        snprintf(num, sizeof(num), "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return put(out, num);
    case JSON_REAL:
        return put_real(out, json_real_value(v));
    case JSON_TRUE:
        return put(out, "true");
    case JSON_FALSE:
        return put(out, "false");
    case JSON_NULL:
        return put(out, "null");
    }
    return TDM_ERR_INVALID_ARG;
}

tdm_status_t chat_json_dumps_py(const json_t *value, tdm_buf_t *out)
{
    if (value == NULL || out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    return dump(value, out, 0);
}
