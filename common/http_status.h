/* http_status.h - the HTTP status codes Tandem's servers answer with (RFC 9110 section 15).
 *
 * One definition for the router (router/http.c, validate.c, dispatch.c, turn.c) and the
 * workers' /health and /metrics endpoint (node/node_http.c and the pages it serves).
 * Plain constants; knows nothing of any HTTP library.
 */
#ifndef TANDEM_COMMON_HTTP_STATUS_H
#define TANDEM_COMMON_HTTP_STATUS_H

#define TDM_HTTP_OK                     200
#define TDM_HTTP_BAD_REQUEST            400
#define TDM_HTTP_UNAUTHORIZED           401
#define TDM_HTTP_NOT_FOUND              404
#define TDM_HTTP_METHOD_NOT_ALLOWED     405
#define TDM_HTTP_CONFLICT               409
#define TDM_HTTP_TOO_LARGE              413 /* Content Too Large */
#define TDM_HTTP_UNSUPPORTED_MEDIA_TYPE 415
#define TDM_HTTP_TOO_MANY_REQUESTS      429
#define TDM_HTTP_INTERNAL               500
#define TDM_HTTP_BAD_GATEWAY            502
#define TDM_HTTP_UNAVAILABLE            503
#define TDM_HTTP_GATEWAY_TIMEOUT        504

#endif
