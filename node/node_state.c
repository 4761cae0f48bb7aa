/* node_state.c - the direct-state payload of a transfer notice (node_state.h). */
#include "node/node_state.h"

#include <stdlib.h>

#include "common/hash.h"

tdm_status_t node_state_pack(const Tandem__CompletionNotice *full, uint8_t **bytes_out,
                             size_t *n_bytes_out)
{
    Tandem__CompletionNotice st = TANDEM__COMPLETION_NOTICE__INIT;
    uint8_t *bytes;
    size_t n;

    if (full == NULL || bytes_out == NULL || n_bytes_out == NULL || full->state_record.len == 0 ||
        tdm_hash_xxh3_64(full->state_record.data, full->state_record.len) != full->state_checksum) {
        return TDM_ERR_INVALID_ARG;
    }
    st.request_id = full->request_id;
    st.reservation_id = full->reservation_id;
    st.attempt = full->attempt;
    st.cached_len = full->cached_len;
    st.total_len = full->total_len;
    st.page_checksums = full->page_checksums;
    st.n_page_checksums = full->n_page_checksums;
    st.n_pages = (uint32_t)full->n_page_checksums;
    st.state_record = full->state_record;
    st.state_checksum = full->state_checksum;
    n = tandem__completion_notice__get_packed_size(&st);
    bytes = malloc(n > 0 ? n : 1);
    if (bytes == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    *n_bytes_out = tandem__completion_notice__pack(&st, bytes);
    *bytes_out = bytes;
    return TDM_OK;
}

tdm_status_t node_state_unpack(const uint8_t *bytes, size_t n_bytes,
                               Tandem__CompletionNotice **state_out)
{
    Tandem__CompletionNotice *st;

    if (bytes == NULL || n_bytes == 0 || state_out == NULL) {
        return TDM_ERR_FORMAT;
    }
    st = tandem__completion_notice__unpack(NULL, n_bytes, bytes);
    if (st == NULL) {
        return TDM_ERR_FORMAT;
    }
    if (st->reservation_id == 0 || st->total_len <= st->cached_len || st->state_record.len == 0 ||
        st->n_page_checksums != st->n_pages) {
        tandem__completion_notice__free_unpacked(st, NULL);
        return TDM_ERR_FORMAT;
    }
    if (tdm_hash_xxh3_64(st->state_record.data, st->state_record.len) != st->state_checksum) {
        tandem__completion_notice__free_unpacked(st, NULL);
        return TDM_ERR_MISMATCH;
    }
    *state_out = st;
    return TDM_OK;
}

void node_state_free(Tandem__CompletionNotice *state)
{
    if (state != NULL) {
        tandem__completion_notice__free_unpacked(state, NULL);
    }
}
