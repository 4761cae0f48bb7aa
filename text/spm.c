/* spm.c - SentencePiece-style encoding of GGUF "llama" vocabularies (Llama 2, Phi-3).
 *
 * One segment (text between added tokens) at a time: spaces become U+2581 (with one prepended
 * when the vocabulary adds a space prefix), the text starts as one piece per UTF-8 character,
 * and the adjacent pair whose joined text is the highest-scoring token merges first (ties:
 * leftmost), until no pair joins into a token. A final piece that is not a token becomes its
 * "<0xHH>" byte tokens. Source: llama.cpp src/llama-vocab.cpp (llm_tokenizer_spm_session, after
 * the original SentencePiece BPE mode), which reproduces Hugging Face's LlamaTokenizer.
 */
#include "text/tokenizer.h"

#include "text/tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

/* A piece of the escaped text: [start, start + n); n == 0 once merged into its left neighbour. */
typedef struct {
    uint32_t start;
    uint32_t n;
    int32_t prev;
    int32_t next;
} piece_t;

typedef struct {
    const text_tokenizer_t *tok;
    const uint8_t *text; /* escaped */
    piece_t *pieces;
    text_tokenizer_heap_t heap; /* candidates: -score, left, right, size */
} spm_state_t;

/* Queue the merge of pieces left and right if their joined text is a token. */
static tdm_status_t try_pair(spm_state_t *st, int32_t left, int32_t right)
{
    const piece_t *l, *r;
    int32_t id;

    if (left < 0 || right < 0) {
        return TDM_OK;
    }
    l = &st->pieces[left];
    r = &st->pieces[right];
    id = text_tokenizer_lookup_text(st->tok, (const char *)st->text + l->start, l->n + r->n);
    if (id < 0) {
        return TDM_OK;
    }
    return text_tokenizer_heap_push(&st->heap, (text_tokenizer_cand_t){
                                                   .key = -(double)st->tok->scores[id],
                                                   .left = (uint32_t)left,
                                                   .right = (uint32_t)right,
                                                   .size = l->n + r->n,
                                               });
}

/* Bytes of the UTF-8 sequence led by b, as llama.cpp's unicode_len_utf8 (ill-formed: 1). */
static uint32_t lead_length(uint8_t b)
{
    static const uint8_t lengths[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};

    return lengths[b >> 4];
}

/* Spaces to U+2581 (E2 96 81), with one prepended if asked. Returns the escaped length. */
static size_t escape(const uint8_t *text, size_t n, int prefix_space, uint8_t *out)
{
    static const uint8_t lower_block[3] = {0xe2, 0x96, 0x81};
    size_t n_out = 0;

    if (prefix_space) {
        memcpy(out, lower_block, 3);
        n_out = 3;
    }
    for (size_t i = 0; i < n; i++) {
        if (text[i] == ' ') {
            memcpy(out + n_out, lower_block, 3);
            n_out += 3;
        } else {
            out[n_out++] = text[i];
        }
    }
    return n_out;
}

/* Emit piece i: its token, or its bytes as byte tokens (bytes without a token are dropped). */
static tdm_status_t emit_piece(const spm_state_t *st, const piece_t *p, text_tokenizer_ids_t *out)
{
    int32_t id = text_tokenizer_lookup_text(st->tok, (const char *)st->text + p->start, p->n);
    tdm_status_t status = TDM_OK;

    if (id >= 0) {
        return text_tokenizer_ids_push(out, id);
    }
    for (uint32_t k = 0; k < p->n && status == TDM_OK; k++) {
        int32_t byte_id = st->tok->byte_id[st->text[p->start + k]];
        if (byte_id >= 0) {
            status = text_tokenizer_ids_push(out, byte_id);
        }
    }
    return status;
}

tdm_status_t text_tokenizer_spm_encode(const text_tokenizer_t *tok, const uint8_t *text,
                                       size_t n_bytes, int prefix_space, text_tokenizer_ids_t *out)
{
    spm_state_t st = {tok, NULL, NULL, {NULL, 0, 0}};
    uint8_t *escaped;
    size_t n_esc, n_pieces = 0;
    tdm_status_t status = TDM_OK;

    if (n_bytes > (UINT32_MAX - 3) / 3) {
        return TDM_ERR_NO_MEMORY; /* piece offsets are 32-bit */
    }
    escaped = malloc(3 * n_bytes + 3);
    if (escaped == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    n_esc = escape(text, n_bytes, prefix_space, escaped);
    st.text = escaped;
    st.pieces = malloc((n_esc > 0 ? n_esc : 1) * sizeof(*st.pieces));
    if (st.pieces == NULL) {
        free(escaped);
        return TDM_ERR_NO_MEMORY;
    }
    for (size_t pos = 0; pos < n_esc; n_pieces++) {
        uint32_t len = lead_length(escaped[pos]);
        if (len > n_esc - pos) {
            len = (uint32_t)(n_esc - pos);
        }
        st.pieces[n_pieces] = (piece_t){(uint32_t)pos, len, (int32_t)n_pieces - 1, -1};
        if (n_pieces > 0) {
            st.pieces[n_pieces - 1].next = (int32_t)n_pieces;
        }
        pos += len;
    }
    for (size_t i = 1; i < n_pieces && status == TDM_OK; i++) {
        status = try_pair(&st, (int32_t)i - 1, (int32_t)i);
    }
    while (status == TDM_OK && st.heap.n > 0) {
        text_tokenizer_cand_t c = text_tokenizer_heap_pop(&st.heap);
        piece_t *l = &st.pieces[c.left], *r = &st.pieces[c.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != c.size) {
            continue; /* stale: one side merged since this candidate was queued */
        }
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) {
            st.pieces[r->next].prev = (int32_t)c.left;
        }
        status = try_pair(&st, l->prev, (int32_t)c.left);
        if (status == TDM_OK) {
            status = try_pair(&st, (int32_t)c.left, l->next);
        }
    }
    for (int32_t i = n_pieces > 0 ? 0 : -1; i >= 0 && status == TDM_OK; i = st.pieces[i].next) {
        status = emit_piece(&st, &st.pieces[i], out);
    }
    text_tokenizer_heap_fini(&st.heap);
    free(st.pieces);
    free(escaped);
    return status;
}
