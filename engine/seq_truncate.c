/* seq_truncate.c - cut a sequence back to a shorter prefix of its history (MODEL.md 6(d)(2)):
 * the pages-only state a prefix-cache hit starts from, which engine_fwd_replay completes. */
#include <string.h>

#include "engine/seq_state_impl.h"

tdm_status_t engine_seq_truncate(engine_seq_t *seq, int64_t p)
{
    if (seq == NULL || p < 0 || p > seq->length) {
        return TDM_ERR_INVALID_ARG;
    }
    for (int s = 0; s < seq->n_sources; s++) {
        engine_kv_table_t *t = &seq->tables[s];
        /* rows of complete groups below p: n_c(p - 1) = floor(p / ratio); a ratio-2 row whose
         * second token is p goes with its pages (it depends on a cut token) */
        int64_t keep_rows = p / t->ratio;
        engine_kv_table_truncate(seq->pool, t, keep_rows < t->n_rows ? keep_rows : t->n_rows);
        /* the pending half of an odd p is rebuilt by the replay (MODEL.md 6(d)) */
        seq->has_pend[s] = 0;
        memset(seq->pend_a + (int64_t)s * seq->d, 0, (size_t)seq->d * sizeof(float));
        memset(seq->pend_b + (int64_t)s * seq->d, 0, (size_t)seq->d * sizeof(float));
    }
    /* the verify scratch belongs to the cut positions: engine_seq_rollback must not reuse it */
    for (int64_t k = 0; k < (int64_t)seq->n_sources * seq->n_keep; k++) {
        seq->keep_pos[k] = -1;
    }
    engine_seq_reset_rings(seq);
    /* ids at positions >= p are now invalid; those below p are rewritten by the replay */
    seq->length = p;
    return TDM_OK;
}
