/* detok.c - ids -> UTF-8 text, streaming (text_detok_t) and whole-sequence.
 *
 * Token bytes are concatenated and passed through one UTF-8 validator that emits only complete
 * well-formed characters, holds an incomplete trailing prefix (at most 3 bytes) until the next
 * token, and replaces each maximal ill-formed subpart with U+FFFD as soon as it is certain.
 * Source: Unicode 15.0 section 3.9 (table 3-7 well-formed byte sequences, "U+FFFD substitution
 * of maximal subparts"), RFC 3629.
 */
#include "text/tokenizer.h"

#include "text/tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

/* U+FFFD REPLACEMENT CHARACTER in UTF-8. */
static const uint8_t replacement[3] = {0xef, 0xbf, 0xbd};

struct text_detok {
    const text_tokenizer_t *tok;
    uint32_t flags;
    int started;     /* a token has produced bytes in this stream */
    uint8_t held[4]; /* incomplete character carried to the next push */
    size_t n_held;
    uint8_t *in; /* held bytes + the new token's bytes */
    size_t cap_in;
    uint8_t *out; /* text returned by the last call (up to 3 bytes per input byte) */
    size_t cap_out;
};

/* Allowed range of the second byte after lead b0, and the sequence length (0: not a lead). */
static size_t lead_info(uint8_t b0, uint8_t *lo_out, uint8_t *hi_out)
{
    *lo_out = 0x80;
    *hi_out = 0xbf;
    if (b0 < 0x80) {
        return 1;
    }
    if (b0 >= 0xc2 && b0 <= 0xdf) {
        return 2;
    }
    if (b0 >= 0xe0 && b0 <= 0xef) {
        *lo_out = b0 == 0xe0 ? 0xa0 : 0x80;
        *hi_out = b0 == 0xed ? 0x9f : 0xbf;
        return 3;
    }
    if (b0 >= 0xf0 && b0 <= 0xf4) {
        *lo_out = b0 == 0xf0 ? 0x90 : 0x80;
        *hi_out = b0 == 0xf4 ? 0x8f : 0xbf;
        return 4;
    }
    return 0;
}

/*
 * Validate in[0..n) into out (capacity >= 3n). Returns bytes written; *n_used_out = bytes
 * consumed. Unless `final`, an incomplete but so-far valid sequence at the end is not consumed.
 */
static size_t sanitize(const uint8_t *in, size_t n, int final, uint8_t *out, size_t *n_used_out)
{
    size_t i = 0, n_out = 0;

    while (i < n) {
        uint8_t lo, hi;
        size_t len = lead_info(in[i], &lo, &hi), k;
        if (len == 0) {
            memcpy(out + n_out, replacement, 3);
            n_out += 3;
            i++;
            continue;
        }
        for (k = 1; k < len && i + k < n; k++) {
            uint8_t b = in[i + k];
            if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xbf)) {
                break;
            }
        }
        if (k == len) {
            memcpy(out + n_out, in + i, len);
            n_out += len;
            i += len;
        } else if (i + k == n && !final) {
            break; /* valid so far, waiting for more bytes */
        } else {
            memcpy(out + n_out, replacement, 3);
            n_out += 3;
            i += k; /* the maximal subpart: lead plus the continuation bytes that fit */
        }
    }
    *n_used_out = i;
    return n_out;
}

/* SentencePiece vocabularies that add a space prefix drop it again from the first token that
 * produces bytes (as SentencePiece decoding does). */
static void strip_spm_prefix(const text_tokenizer_t *tok, int *started, const uint8_t **bytes,
                             size_t *n)
{
    if (*started || *n == 0) {
        return;
    }
    *started = 1;
    if (tok->spm && tok->add_space_prefix && (*bytes)[0] == ' ') {
        (*bytes)++;
        (*n)--;
    }
}

static tdm_status_t reserve(uint8_t **buf, size_t *cap, size_t need)
{
    uint8_t *p;

    if (need <= *cap) {
        return TDM_OK;
    }
    p = realloc(*buf, need);
    if (p == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    *buf = p;
    *cap = need;
    return TDM_OK;
}

tdm_status_t text_detok_create(const text_tokenizer_t *tok, uint32_t flags,
                               text_detok_t **detok_out)
{
    text_detok_t *detok;

    if (tok == NULL || detok_out == NULL || (flags & ~(uint32_t)TEXT_DETOK_SKIP_CONTROL) != 0) {
        return TDM_ERR_INVALID_ARG;
    }
    detok = calloc(1, sizeof(*detok));
    if (detok == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    detok->tok = tok;
    detok->flags = flags;
    *detok_out = detok;
    return TDM_OK;
}

/* Run held bytes + bytes[0..n) through the validator into detok->out. */
static tdm_status_t feed(text_detok_t *detok, const uint8_t *bytes, size_t n, int final,
                         const char **text_out, size_t *n_bytes_out)
{
    size_t n_in = detok->n_held + n, n_used, n_text;
    tdm_status_t status = reserve(&detok->in, &detok->cap_in, n_in + 1);

    if (status == TDM_OK) {
        status = reserve(&detok->out, &detok->cap_out, 3 * n_in + 1);
    }
    if (status != TDM_OK) {
        return status;
    }
    memcpy(detok->in, detok->held, detok->n_held);
    if (n > 0) {
        memcpy(detok->in + detok->n_held, bytes, n);
    }
    n_text = sanitize(detok->in, n_in, final, detok->out, &n_used);
    detok->n_held = n_in - n_used; /* at most 3: an incomplete sequence */
    memcpy(detok->held, detok->in + n_used, detok->n_held);
    detok->out[n_text] = '\0';
    *text_out = (const char *)detok->out;
    *n_bytes_out = n_text;
    return TDM_OK;
}

tdm_status_t text_detok_push(text_detok_t *detok, int32_t id, const char **text_out,
                             size_t *n_bytes_out)
{
    const uint8_t *bytes;
    size_t n;
    text_token_kind_t kind;

    if (detok == NULL || text_out == NULL || n_bytes_out == NULL ||
        text_tokenizer_token_bytes(detok->tok, id, &bytes, &n) != TDM_OK) {
        return TDM_ERR_INVALID_ARG;
    }
    (void)text_tokenizer_token_kind(detok->tok, id, &kind);
    if ((detok->flags & TEXT_DETOK_SKIP_CONTROL) != 0 && kind == TEXT_TOKEN_CONTROL) {
        n = 0;
    }
    strip_spm_prefix(detok->tok, &detok->started, &bytes, &n);
    return feed(detok, bytes, n, 0, text_out, n_bytes_out);
}

tdm_status_t text_detok_flush(text_detok_t *detok, const char **text_out, size_t *n_bytes_out)
{
    if (detok == NULL || text_out == NULL || n_bytes_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    detok->started = 0;
    return feed(detok, NULL, 0, 1, text_out, n_bytes_out);
}

void text_detok_reset(text_detok_t *detok)
{
    if (detok != NULL) {
        detok->n_held = 0;
        detok->started = 0;
    }
}

void text_detok_destroy(text_detok_t *detok)
{
    if (detok == NULL) {
        return;
    }
    free(detok->in);
    free(detok->out);
    free(detok);
}

tdm_status_t text_detok_decode(const text_tokenizer_t *tok, const int32_t *ids, size_t n_ids,
                               uint32_t flags, char **text_out, size_t *n_bytes_out)
{
    uint8_t *raw, *text;
    size_t n_raw = 0, n_text, n_used;
    int started = 0;

    if (tok == NULL || text_out == NULL || n_bytes_out == NULL || (ids == NULL && n_ids > 0) ||
        (flags & ~(uint32_t)TEXT_DETOK_SKIP_CONTROL) != 0) {
        return TDM_ERR_INVALID_ARG;
    }
    for (size_t i = 0; i < n_ids; i++) {
        if (ids[i] < 0 || (uint32_t)ids[i] >= tok->n_vocab) {
            return TDM_ERR_INVALID_ARG;
        }
        if ((flags & TEXT_DETOK_SKIP_CONTROL) == 0 || tok->kind[ids[i]] != TEXT_TOKEN_CONTROL) {
            n_raw += tok->bytes_offset[ids[i] + 1] - tok->bytes_offset[ids[i]];
        }
    }
    raw = malloc(n_raw + 1);
    text = malloc(3 * n_raw + 1);
    if (raw == NULL || text == NULL) {
        free(raw);
        free(text);
        return TDM_ERR_NO_MEMORY;
    }
    n_raw = 0;
    for (size_t i = 0; i < n_ids; i++) {
        const uint8_t *bytes = tok->bytes_pool + tok->bytes_offset[ids[i]];
        size_t n = tok->bytes_offset[ids[i] + 1] - tok->bytes_offset[ids[i]];
        if ((flags & TEXT_DETOK_SKIP_CONTROL) != 0 && tok->kind[ids[i]] == TEXT_TOKEN_CONTROL) {
            continue;
        }
        strip_spm_prefix(tok, &started, &bytes, &n);
        memcpy(raw + n_raw, bytes, n);
        n_raw += n;
    }
    n_text = sanitize(raw, n_raw, 1, text, &n_used);
    free(raw);
    text[n_text] = '\0';
    *text_out = (char *)text;
    *n_bytes_out = n_text;
    return TDM_OK;
}
