/* stream.h - one request's output text: detokenization, stop strings, stop tokens, max_tokens.
 *
 * Owns one streaming detokenizer (text_detok_*, UTF-8 safe: a character split across tokens
 * is released when complete; CONTROL tokens give no text unless kept) and the text produced so
 * far. Text that could still turn into a
 * stop string is held back until it cannot; a stop string ends the output before it (the stop
 * string itself is never emitted), whether it spans tokens, chunks or a split character. Knows
 * nothing of HTTP, SSE or JSON. One stream belongs to one thread at a time.
 */
#ifndef TANDEM_ROUTER_STREAM_H
#define TANDEM_ROUTER_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "text/tokenizer.h"

/* Where a stream stands. */
typedef enum {
    ROUTER_STREAM_RUNNING = 0, /* more tokens welcome */
    ROUTER_STREAM_STOP = 1,    /* a stop string or stop token ended it (finish_reason "stop") */
    ROUTER_STREAM_LENGTH = 2,  /* max_tokens reached (finish_reason "length") */
} router_stream_state_t;

/* Parameters of router_stream_create (plain data; arrays and strings borrowed for the call). */
typedef struct {
    const text_tokenizer_t *tok; /* borrowed; must outlive the stream */
    const char *const *stop;     /* [n_stop] stop strings, each stop_bytes[i] >= 1 bytes */
    const size_t *stop_bytes;
    int n_stop;
    const int32_t *stop_ids; /* [n_stop_ids] token ids that end the stream (EOS) */
    int n_stop_ids;
    uint32_t max_tokens; /* >= 1 */
    uint32_t min_tokens; /* the first min_tokens tokens neither stop (stop ids, stop strings
                            completed within them) nor are held back; 0: off */
    /* [n_keep_ids] CONTROL token ids whose text is emitted all the same (e.g. "｜DSML｜" for the
       agent output parser); every other CONTROL token produces no text. At most
       ROUTER_STREAM_MAX_KEEP_IDS. */
    const int32_t *keep_ids;
    int n_keep_ids;
} router_stream_params_t;

/* Most keep_ids of one stream. */
#define ROUTER_STREAM_MAX_KEEP_IDS 8

/* The stream; opaque. */
typedef struct router_stream router_stream_t;

/*
 * router_stream_create - a new stream. Copies the stop strings and ids. Returns TDM_OK,
 * TDM_ERR_INVALID_ARG (NULL tok, max_tokens 0, an empty stop string, counts out of range) or
 * TDM_ERR_NO_MEMORY; *stream_out written only on success.
 */
tdm_status_t router_stream_create(const router_stream_params_t *params,
                                  router_stream_t **stream_out);

/* router_stream_destroy - free the stream. Accepts NULL. */
void router_stream_destroy(router_stream_t *stream);

/*
 * router_stream_push - feed generated token `id`. *text_out / *n_bytes_out: the text now safe
 * to send (may be empty), pointing into the stream, valid until the next call on it. A token
 * pushed after the stream ended is ignored (empty text, not counted).
 *
 * Counts the token (router_stream_n_tokens); a stop id ends the stream with STOP (its text is
 * never emitted); the max_tokens-th token ends it with LENGTH. When the stream ends, held text
 * is released (up to a stop string) in the same call. Returns TDM_OK, TDM_ERR_INVALID_ARG (id
 * outside the vocabulary: nothing changed) or TDM_ERR_NO_MEMORY.
 */
tdm_status_t router_stream_push(router_stream_t *stream, int32_t id, const char **text_out,
                                size_t *n_bytes_out);

/*
 * router_stream_finish - the generator ended the stream (e.g. its own length limit): release
 * any held text (an incomplete character becomes U+FFFD) and, if still RUNNING, set the state
 * to `state_if_running` (STOP or LENGTH). Returns the released text like router_stream_push.
 */
tdm_status_t router_stream_finish(router_stream_t *stream, router_stream_state_t state_if_running,
                                  const char **text_out, size_t *n_bytes_out);

/* router_stream_state - where the stream stands. */
router_stream_state_t router_stream_state(const router_stream_t *stream);

/* router_stream_n_tokens - tokens counted (usage completion_tokens). */
uint32_t router_stream_n_tokens(const router_stream_t *stream);

/*
 * router_stream_text - everything emitted so far: *n_bytes_out bytes (borrowed, valid until the
 * next call on the stream; NUL-terminated once the stream has ended).
 */
const char *router_stream_text(const router_stream_t *stream, size_t *n_bytes_out);

#endif
