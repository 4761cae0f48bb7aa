/* log.h - leveled, one-line-per-event key=value logging to stderr.
 *
 * Format: `2025-03-02T10:15:04.120Z W xfer put failed: peer=decode-3 pages=12`. The threshold is
 * process-wide and set once by main() (tdm_log_set_level); the write of one line is atomic with
 * respect to other threads (one fputs of a formatted buffer). Owns no other state.
 */
#ifndef TANDEM_COMMON_LOG_H
#define TANDEM_COMMON_LOG_H

#include "common/status.h"

typedef enum {
    TDM_LOG_TRACE = 0, /* per page or token; off by default */
    TDM_LOG_DEBUG = 1, /* per request */
    TDM_LOG_INFO = 2,  /* lifecycle: start, listen, register, stop */
    TDM_LOG_WARN = 3,  /* unexpected but handled */
    TDM_LOG_ERROR = 4, /* a request or component failed */
    TDM_LOG_OFF = 5,   /* nothing is written */
} tdm_log_level_t;

/* tdm_log_set_level - lines below `level` are dropped. Call from main() before threads start. */
void tdm_log_set_level(tdm_log_level_t level);

/* tdm_log_get_level - the current threshold. */
tdm_log_level_t tdm_log_get_level(void);

/*
 * tdm_log_level_parse - "trace", "debug", "info", "warn" or "error" (or "off") into *level_out.
 * Returns TDM_OK, or TDM_ERR_INVALID_ARG for any other text (*level_out untouched).
 */
tdm_status_t tdm_log_level_parse(const char *text, tdm_log_level_t *level_out);

/*
 * tdm_log - format one event and write it as one line to stderr, prefixed with an ISO-8601 UTC
 * time, the level letter and `module`. `fmt` is printf-style; lines over 2 KiB are truncated.
 */
void tdm_log(tdm_log_level_t level, const char *module, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
