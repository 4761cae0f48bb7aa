/* apierr.h - OpenAI-shaped API errors: HTTP status, type, code, param and message.
 *
 * Owns nothing but the plain error struct; renders it as
 * {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}. Knows nothing of HTTP
 * transport or of what went wrong.
 */
#ifndef TANDEM_ROUTER_APIERR_H
#define TANDEM_ROUTER_APIERR_H

#include <stddef.h>

#include "common/status.h"

/* Bytes of an error message, NUL included. */
#define ROUTER_APIERR_MESSAGE_BYTES 512

/* Error types (OpenAI "type"). */
#define ROUTER_APIERR_INVALID_REQUEST "invalid_request_error"
#define ROUTER_APIERR_NOT_FOUND       "not_found_error"
#define ROUTER_APIERR_SERVER          "server_error"
#define ROUTER_APIERR_OVERLOADED      "overloaded_error"
#define ROUTER_APIERR_RATE_LIMIT      "requests" /* OpenAI's type of a 429 */

/*
 * One API error (plain data). type, code and param point at static strings (param and code may
 * be NULL: rendered as JSON null).
 */
typedef struct {
    int http_status;   /* 400, 404, 405, 409, 413, 415, 500, 503, ... */
    const char *type;  /* ROUTER_APIERR_* */
    const char *code;  /* machine-readable, e.g. "unsupported_input"; also the metrics label */
    const char *param; /* the request field at fault, or NULL */
    char message[ROUTER_APIERR_MESSAGE_BYTES];
} router_apierr_t;

/* router_apierr_set - fill *err; message is printf-style and truncated to fit. */
void router_apierr_set(router_apierr_t *err, int http_status, const char *type, const char *code,
                       const char *param, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/*
 * router_apierr_bad - fill *err as a 400 invalid_request_error with `code`, `param` (static
 * storage or NULL) and `message`; returns TDM_ERR_INVALID_ARG, so a check can
 * `return router_apierr_bad(...)`.
 */
tdm_status_t router_apierr_bad(router_apierr_t *err, const char *code, const char *param,
                               const char *message);

/* router_apierr_no_memory - fill *err as a 500 internal_error "out of memory"; returns
 * TDM_ERR_NO_MEMORY. */
tdm_status_t router_apierr_no_memory(router_apierr_t *err);

/*
 * router_apierr_json - the error as a NUL-terminated JSON object (caller frees with free()), or
 * NULL when out of memory.
 */
char *router_apierr_json(const router_apierr_t *err);

#endif
