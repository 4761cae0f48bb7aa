/* status.h - Tandem's status codes and their messages.
 *
 * Every fallible function in Tandem returns tdm_status_t. TDM_OK is 0, TDM_IN_PROGRESS (1) means
 * asynchronous work was queued, and errors are negative; each error's comment says what the
 * caller tears down. Owns nothing; knows nothing of any other module.
 */
#ifndef TANDEM_COMMON_STATUS_H
#define TANDEM_COMMON_STATUS_H

typedef enum {
    TDM_OK = 0,               /* success */
    TDM_IN_PROGRESS = 1,      /* async work queued; completion reported later */
    TDM_ERR_INVALID_ARG = -1, /* caller's input is wrong; nothing changed */
    TDM_ERR_NO_MEMORY = -2,   /* allocation failed; nothing changed */
    TDM_ERR_NO_PAGES = -3,    /* KV pool exhausted; retry or evict */
    TDM_ERR_IO = -4,          /* a system call on a file or socket failed (errno logged) */
    TDM_ERR_FORMAT = -5,      /* a file or message is malformed (truncated, bad header, bad JSON) */
    TDM_ERR_MISMATCH = -6,    /* well-formed input that contradicts what was expected
                                 (tensor shape, checksum, fingerprint, config check) */
    TDM_ERR_NOT_FOUND = -7,   /* a named file, tensor, field or peer does not exist */
    TDM_ERR_PEER_LOST = -8,   /* remote worker gone; its pending operations are void */
    TDM_ERR_UNSUPPORTED = -9, /* valid request this build or deployment cannot serve */
    TDM_ERR_TIMEOUT = -10,    /* a deadline passed; the operation was abandoned */
    TDM_ERR_INTERNAL = -11,   /* an engine invariant broke (e.g. NaN reached a top-k) */
    TDM_ERR_BUSY = -12,       /* resource temporarily unavailable; retry later */
} tdm_status_t;

/*
 * tdm_status_name - the constant's name, e.g. "TDM_ERR_NO_PAGES"; "TDM_ERR_UNKNOWN" for a value
 * outside the enum. Returns a static string; never NULL.
 */
const char *tdm_status_name(tdm_status_t status);

/*
 * tdm_status_message - a short lowercase description, e.g. "kv pool exhausted". Static string;
 * never NULL.
 */
const char *tdm_status_message(tdm_status_t status);

#endif
