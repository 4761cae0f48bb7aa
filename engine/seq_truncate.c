/* seq_truncate.c - cut a sequence back to a shorter prefix of its history (MODEL.md 6(d)(2)):
 * the pages-only state a prefix-cache hit starts from, which engine_fwd_replay completes. */
#include "engine/seq_state_impl.h"

tdm_status_t engine_seq_truncate(engine_seq_t *seq, int64_t p)
{
    if (seq == NULL || p < 0 || p > seq->length) {
        return TDM_ERR_INVALID_ARG;
    }
    {
        uint32_t cow = 0; /* a shared page cut into is copied first (engine/kv_cache.h) */
        for (int s = 0; s < seq->n_sources; s++) {
            int64_t keep_rows = p / seq->tables[s].ratio;
            cow += engine_kv_table_truncate_pages_needed(
                seq->pool, &seq->tables[s],
                keep_rows < seq->tables[s].n_rows ? keep_rows : seq->tables[s].n_rows);
        }
        if (cow > engine_kv_pool_n_free(seq->pool)) {
            return TDM_ERR_NO_PAGES;
        }
    }
    for (int s = 0; s < seq->n_sources; s++) {
        engine_kv_table_t *t = &seq->tables[s];
        /* rows of complete groups below p: n_c(p - 1) = floor(p / ratio); a ratio-2 row whose
         * second token is p goes with its pages (it depends on a cut token) */
        int64_t keep_rows = p / t->ratio;
        engine_kv_table_truncate(seq->pool, t, keep_rows < t->n_rows ? keep_rows : t->n_rows);
        /* the pending half of an odd p is rebuilt by the replay (MODEL.md 6(d)) */
        engine_seq_clear_pending(seq, s);
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

tdm_status_t engine_seq_relink_page(engine_seq_t *seq, int source_layer, uint32_t i,
                                    uint32_t page_id)
{
    int s = seq != NULL ? engine_seq_source_slot(seq, source_layer) : -1;

    if (s < 0) {
        return TDM_ERR_INVALID_ARG;
    }
    return engine_kv_table_relink(seq->pool, &seq->tables[s], i, page_id);
}

tdm_status_t engine_seq_share_prefix(engine_seq_t *dst, const engine_seq_t *src, int64_t p)
{
    int64_t unit = KERN_KV_PAGE_ROWS;
    tdm_status_t st = TDM_OK;
    int s;

    if (dst == NULL || src == NULL || dst == src || dst->pool != src->pool ||
        dst->model != src->model || dst->length != 0 || p <= 0 || p > src->length) {
        return TDM_ERR_INVALID_ARG;
    }
    for (s = 0; s < src->n_sources; s++) {
        int64_t u = KERN_KV_PAGE_ROWS * (int64_t)src->tables[s].ratio;
        unit = u > unit ? u : unit;
        if (dst->tables[s].n_pages != 0) {
            return TDM_ERR_INVALID_ARG;
        }
    }
    if (p % unit != 0) {
        return TDM_ERR_INVALID_ARG;
    }
    for (s = 0; s < src->n_sources && st == TDM_OK; s++) {
        st = engine_kv_table_share(dst->pool, &dst->tables[s], &src->tables[s],
                                   p / src->tables[s].ratio);
    }
    if (st != TDM_OK) {
        while (s-- > 0) {
            engine_kv_table_release(dst->pool, &dst->tables[s]);
        }
        return st;
    }
    /* the state engine_seq_truncate leaves at p: no pending half (p is even), no verify scratch,
     * empty rings; the replay rebuilds rings and ids */
    for (s = 0; s < dst->n_sources; s++) {
        engine_seq_clear_pending(dst, s);
    }
    for (int64_t k = 0; k < (int64_t)dst->n_sources * dst->n_keep; k++) {
        dst->keep_pos[k] = -1;
    }
    engine_seq_reset_rings(dst);
    dst->length = p;
    return TDM_OK;
}
