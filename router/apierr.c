#include "router/apierr.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>

#include "common/http_status.h"

void router_apierr_set(router_apierr_t *err, int http_status, const char *type, const char *code,
                       const char *param, const char *fmt, ...)
{
    va_list ap;

    err->http_status = http_status;
    err->type = type;
    err->code = code;
    err->param = param;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
}

static json_t *string_or_null(const char *s)
{
    return s != NULL ? json_string(s) : json_null();
}

/* Messages may quote client bytes that are not UTF-8: such bytes become '?'. */
static json_t *message_json(const char *message)
{
    char safe[ROUTER_APIERR_MESSAGE_BYTES];
    json_t *value = json_string(message);
    size_t i;

    if (value != NULL) {
        return value;
    }
    for (i = 0; message[i] != '\0' && i + 1 < sizeof(safe); i++) {
        safe[i] = (unsigned char)message[i] < 0x80 ? message[i] : '?';
    }
    safe[i] = '\0';
    return json_string(safe);
}

char *router_apierr_json(const router_apierr_t *err)
{
    json_t *inner = json_object();
    json_t *root = json_object();
    char *text = NULL;

    if (inner == NULL || root == NULL) {
        goto out;
    }
    json_object_set_new(inner, "message", message_json(err->message));
    json_object_set_new(inner, "type", string_or_null(err->type));
    json_object_set_new(inner, "param", string_or_null(err->param));
    json_object_set_new(inner, "code", string_or_null(err->code));
    json_object_set(root, "error", inner);
    text = json_dumps(root, JSON_COMPACT | JSON_ENSURE_ASCII);
out:
    json_decref(inner);
    json_decref(root);
    return text;
}

tdm_status_t router_apierr_bad(router_apierr_t *err, const char *code, const char *param,
                               const char *message)
{
    router_apierr_set(err, TDM_HTTP_BAD_REQUEST, ROUTER_APIERR_INVALID_REQUEST, code, param, "%s",
                      message);
    return TDM_ERR_INVALID_ARG;
}

tdm_status_t router_apierr_no_memory(router_apierr_t *err)
{
    router_apierr_set(err, TDM_HTTP_INTERNAL, ROUTER_APIERR_SERVER, "internal_error", NULL,
                      "out of memory");
    return TDM_ERR_NO_MEMORY;
}
