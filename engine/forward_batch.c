/* forward_batch.c - engine_fwd_prefill_parts (engine/forward.h): the CED prefill (schedule 6(b))
 * of several parts, each of its own sequence, in one batch; engine_fwd_replay_batch: canonical
 * replays (6(d)) of several sequences in one batch.
 *
 * The parts' rows are taken in passes of at most max_chunk_tokens rows, oldest part first (a
 * part longer than what is left of a pass continues in the next one). A pass is one batch with
 * one segment per part: embedding and layers 0..c on every row, then the rows at or after each
 * part's tail start R = max(start, end - W) gathered (copied) into a second batch that runs the
 * layers above the cut with each segment's own window floor, the DSpark rings and the head.
 * Every reduction of the forward pass is per row (GEMMs, MoE experts, norms, attention), so a
 * row gets the bits it gets when its part runs alone; and since the CED rule chunks layers 0..c
 * freely and R depends only on start and end, how the passes cut a part changes nothing either
 * (test_forward: test_prefill_parts_batched_equal_each_alone).
 */
#include "engine/forward_impl.h"

#include <stdlib.h>
#include <string.h>

#define FLOAT_BYTES(n) ((size_t)(n) * sizeof(float))

/* One part's plan: its prefill's tail start, window floor above the cut, rows run so far. */
typedef struct {
    int64_t L;    /* sequence length at the call */
    int64_t R;    /* tail start of the prefill */
    int64_t lo;   /* window floor of the layers above the cut: R when R > start, else 0 */
    int64_t done; /* rows of the part run so far */
} part_plan_t;

static int n_experts_k(const engine_config_t *c)
{
    return (int)(c->num_experts_per_tok > c->dspark_num_experts_per_tok
                     ? c->num_experts_per_tok
                     : c->dspark_num_experts_per_tok);
}

/* Copy n rows of every per-row array from src row `from` to dst row `to`. */
static tdm_status_t copy_rows(engine_fwd_t *fwd, fwd_batch_t *dst, int64_t to,
                              const fwd_batch_t *src, int64_t from, int64_t n)
{
    const engine_config_t *c = fwd->cfg;
    int64_t m = c->hc_mult, H = c->hidden_size, kI = c->index_topk;
    int64_t nB = c->candidate_topk_blocks, K = n_experts_k(c);
    int64_t tap = c->n_dspark_target_layer_ids * H;
    tdm_status_t st;

    st = fwd_copy(fwd, dst->X + to * m * H, src->X + from * m * H, FLOAT_BYTES(n * m * H));
    if (st == TDM_OK) {
        st = fwd_copy(fwd, dst->pre + to * m, src->pre + from * m, FLOAT_BYTES(n * m));
    }
    for (int i = 0; i < fwd->n_index_sources && st == TDM_OK; i++) {
        st = fwd_copy(fwd, dst->sel[i] + to * kI, src->sel[i] + from * kI,
                      (size_t)(n * kI) * sizeof(int32_t));
        if (st == TDM_OK) {
            memcpy(dst->sel_h[i] + to * kI, src->sel_h[i] + from * kI,
                   (size_t)(n * kI) * sizeof(int32_t));
        }
    }
    if (st == TDM_OK) {
        st = fwd_copy(fwd, dst->pool + to * nB, src->pool + from * nB,
                      (size_t)(n * nB) * sizeof(int32_t));
    }
    if (st == TDM_OK) {
        memcpy(dst->n_pool_h + to, src->n_pool_h + from, (size_t)n * sizeof(int32_t));
    }
    if (st == TDM_OK) {
        st = fwd_copy(fwd, dst->experts + to * K, src->experts + from * K,
                      (size_t)(n * K) * sizeof(int32_t));
    }
    if (st == TDM_OK && src->taps != NULL && dst->taps != NULL) {
        st = fwd_copy(fwd, dst->taps + to * tap, src->taps + from * tap, FLOAT_BYTES(n * tap));
    }
    return st;
}

/* The head on single rows rows[0..n) of b (each the last row of a part that ends in this pass):
 * their streams and pres copied side by side, one collapse, norm and head GEMM for all (the head
 * matrix read once per pass, not once per part), each row's logits then copied to its part. */
static tdm_status_t head_gathered(engine_fwd_t *fwd, const fwd_batch_t *b, const int64_t *rows,
                                  float *const *outs, int n)
{
    const engine_config_t *c = fwd->cfg;
    int64_t m = c->hc_mult, H = c->hidden_size, V = c->vocab_size;
    fwd_batch_t g;
    fwd_seg_t none;
    const float *logits = NULL;
    tdm_status_t st = TDM_OK;

    if (n == 1) {
        return fwd_head_rows(fwd, b, rows[0], 1, outs[0]);
    }
    memset(&g, 0, sizeof(g));
    memset(&none, 0, sizeof(none));
    g.X = tdm_arena_alloc(&fwd->batch_arena, FLOAT_BYTES(n * m * H), 64);
    g.pre = tdm_arena_alloc(&fwd->batch_arena, FLOAT_BYTES(n * m), 64);
    if (g.X == NULL || g.pre == NULL) {
        st = TDM_ERR_NO_MEMORY;
    }
    for (int k = 0; k < n && st == TDM_OK; k++) {
        st = fwd_copy(fwd, g.X + k * m * H, b->X + rows[k] * m * H, FLOAT_BYTES(m * H));
        if (st == TDM_OK) {
            st = fwd_copy(fwd, g.pre + k * m, b->pre + rows[k] * m, FLOAT_BYTES(m));
        }
    }
    if (st == TDM_OK) {
        g.N = n;
        g.segs = &none;
        st = fwd_head_logits(fwd, &g, 0, n, &logits);
    }
    for (int k = 0; k < n && st == TDM_OK; k++) { /* each row to its part's host buffer */
        st = fwd->ops->mem_copy(&fwd->kctx, outs[k], logits + k * V, FLOAT_BYTES(V), KERN_COPY_D2H);
    }
    return st;
}

/* Layers above the cut, DSpark rings and head on the tail rows of the pass's batch b. */
static tdm_status_t run_upper(engine_fwd_t *fwd, engine_prefill_part_t *parts,
                              const part_plan_t *plan, fwd_batch_t *b)
{
    const engine_config_t *c = fwd->cfg;
    fwd_seg_t up_segs[ENGINE_FWD_MAX_BATCH];
    int64_t src_row[ENGINE_FWD_MAX_BATCH];
    int64_t one_rows[ENGINE_FWD_MAX_BATCH];
    float *one_outs[ENGINE_FWD_MAX_BATCH];
    fwd_batch_t up;
    fwd_batch_t *ub = b;
    int64_t N_up = 0, V = c->vocab_size;
    int n_up = 0, n_one = 0;
    tdm_status_t st = TDM_OK;

    for (int s = 0; s < b->n_segs; s++) {
        const fwd_seg_t *seg = &b->segs[s];
        const part_plan_t *pl = &plan[seg->seq_index];
        int64_t from = pl->R > seg->pos0 ? pl->R : seg->pos0;
        int64_t n = seg->pos0 + seg->n - from;
        if (n <= 0) {
            continue; /* these rows all lie before the tail */
        }
        up_segs[n_up] = (fwd_seg_t){seg->seq, seg->seq_index, from, n, N_up, pl->lo, 1,
                                    seg->ids + (from - seg->pos0), 0};
        src_row[n_up] = seg->row0 + (from - seg->pos0);
        N_up += n;
        n_up++;
    }
    if (n_up == 0) {
        return TDM_OK;
    }
    if (N_up < b->N) { /* some rows stay below the cut: the tail rows in a batch of their own */
        memset(&up, 0, sizeof(up));
        up.segs = up_segs;
        up.n_segs = n_up;
        st = fwd_batch_alloc(fwd, &up, N_up);
        for (int s = 0; s < n_up && st == TDM_OK; s++) {
            st = copy_rows(fwd, &up, up_segs[s].row0, b, src_row[s], up_segs[s].n);
        }
        ub = &up;
    } else { /* every row is a tail row: the same batch goes on */
        for (int s = 0; s < n_up; s++) {
            b->segs[s].lo = up_segs[s].lo;
        }
    }
    for (int l = c->ced_cut + 1; l < c->n_layers && st == TDM_OK; l++) {
        st = fwd_layer_run(fwd, ub, l);
    }
    if (st == TDM_OK) {
        st = fwd_dspark_rings(fwd, ub);
    }
    /* logits: every tail row of an ENGINE_PREFILL_ALL_LOGITS part straight into its buffer;
     * the last row of the other parts that end here, gathered into one head call */
    for (int s = 0; s < ub->n_segs && st == TDM_OK; s++) {
        const fwd_seg_t *seg = &ub->segs[s];
        engine_prefill_part_t *p = &parts[seg->seq_index];
        int all = (p->flags & ENGINE_PREFILL_ALL_LOGITS) != 0;
        int64_t want = all ? seg->n : (seg->pos0 + seg->n == p->end ? 1 : 0);

        if (want > 0 && p->logits_out != NULL) {
            float *dst = p->logits_out + p->n_logits * V;
            if (all) {
                st = fwd_head_rows(fwd, ub, seg->row0, want, dst);
            } else {
                one_rows[n_one] = seg->row0 + seg->n - 1;
                one_outs[n_one++] = dst;
            }
        }
        p->n_logits += want;
    }
    if (st == TDM_OK && n_one > 0) {
        st = head_gathered(fwd, ub, one_rows, one_outs, n_one);
    }
    return st;
}

/* One pass: up to max_chunk_tokens rows of parts [0, n_parts), oldest first, through every
 * layer the CED rule gives them; commits the rows. */
static tdm_status_t run_pass(engine_fwd_t *fwd, engine_prefill_part_t *parts, part_plan_t *plan,
                             int n_parts)
{
    fwd_seg_t segs[ENGINE_FWD_MAX_BATCH];
    int64_t budget = fwd->params.max_chunk_tokens;
    int64_t N = 0;
    int n_segs = 0;
    fwd_batch_t b;
    tdm_status_t st;

    for (int i = 0; i < n_parts && budget > 0; i++) {
        engine_prefill_part_t *p = &parts[i];
        int64_t left = p->n_ids - plan[i].done;
        int64_t n = left < budget ? left : budget;
        if (n <= 0) {
            continue;
        }
        segs[n_segs++] = (fwd_seg_t){p->seq, i, plan[i].L + plan[i].done, n, N, 0, 1,
                                     p->ids + plan[i].done, 0};
        N += n;
        budget -= n;
    }
    memset(&b, 0, sizeof(b));
    fwd_batch_reset(fwd);
    b.segs = segs;
    b.n_segs = n_segs;
    st = fwd_batch_alloc(fwd, &b, N);
    if (st == TDM_OK) {
        st = fwd_batch_embed(fwd, &b);
    }
    for (int l = 0; l <= fwd->cfg->ced_cut && st == TDM_OK; l++) {
        st = fwd_layer_run(fwd, &b, l);
    }
    if (st == TDM_OK) {
        st = run_upper(fwd, parts, plan, &b);
    }
    for (int s = 0; s < n_segs && st == TDM_OK; s++) {
        fwd_commit_rows(&segs[s]);
        plan[segs[s].seq_index].done += segs[s].n;
    }
    return st;
}

tdm_status_t engine_fwd_prefill_parts(engine_fwd_t *fwd, engine_prefill_part_t *parts,
                                      int n_parts)
{
    part_plan_t plan[ENGINE_FWD_MAX_BATCH];
    int n_ok = 0;
    tdm_status_t st = TDM_OK, reserved = TDM_OK;

    if (fwd == NULL || parts == NULL || n_parts < 1 || n_parts > ENGINE_FWD_MAX_BATCH) {
        return TDM_ERR_INVALID_ARG;
    }
    for (int i = 0; i < n_parts; i++) {
        const engine_prefill_part_t *p = &parts[i];
        if (p->seq == NULL || p->start < 0 || p->start > p->seq->length || p->n_ids < 1 ||
            p->seq->length + p->n_ids > p->end || p->end > fwd->cfg->max_position_embeddings) {
            return TDM_ERR_INVALID_ARG;
        }
        st = fwd_check_ids(fwd->cfg, p->ids, p->n_ids);
        if (st != TDM_OK) {
            return st;
        }
        for (int j = 0; j < i; j++) {
            if (parts[j].seq == p->seq) {
                return TDM_ERR_INVALID_ARG;
            }
        }
    }
    /* pages part by part, in order: a part that does not fit stops the call there (the parts
     * before it run, it and those after change nothing) */
    for (; n_ok < n_parts; n_ok++) {
        engine_prefill_part_t *p = &parts[n_ok];
        int64_t last = p->seq->length + p->n_ids;
        reserved = fwd_reserve_pages(fwd, &p->seq, &last, 1);
        if (reserved != TDM_OK) {
            break;
        }
        plan[n_ok].L = p->seq->length;
        plan[n_ok].R = fwd_tail_start(fwd->cfg, p->start, p->end, p->flags);
        plan[n_ok].lo = plan[n_ok].R > p->start ? plan[n_ok].R : 0;
        plan[n_ok].done = 0;
        p->n_logits = 0;
    }
    for (int i = n_ok; i < n_parts; i++) {
        parts[i].n_logits = 0;
    }
    for (int i = 0; i < n_ok && st == TDM_OK;) {
        st = run_pass(fwd, parts, plan, n_ok);
        while (i < n_ok && plan[i].done == parts[i].n_ids) {
            i++;
        }
    }
    return st != TDM_OK ? st : reserved;
}

tdm_status_t engine_fwd_replay_batch(engine_fwd_t *fwd, engine_seq_t *const *seqs,
                                     const int32_t *const *ids, const int64_t *n_ids, int n_seqs)
{
    const engine_config_t *c;
    fwd_seg_t segs[ENGINE_FWD_MAX_BATCH];
    int64_t wp[ENGINE_FWD_MAX_BATCH];
    tdm_status_t st = TDM_OK;

    if (fwd == NULL || seqs == NULL || ids == NULL || n_ids == NULL || n_seqs < 1 ||
        n_seqs > ENGINE_FWD_MAX_BATCH) {
        return TDM_ERR_INVALID_ARG;
    }
    c = fwd->cfg;
    for (int i = 0; i < n_seqs; i++) { /* every check before anything changes */
        int64_t H, need;
        if (seqs[i] == NULL || ids[i] == NULL) {
            return TDM_ERR_INVALID_ARG;
        }
        H = seqs[i]->length;
        wp[i] = H < c->sliding_window ? H : c->sliding_window;
        need = H - wp[i] < c->engram_max_ngram_size - 1 ? H : wp[i] + c->engram_max_ngram_size - 1;
        if (H == 0 || n_ids[i] < need || n_ids[i] > H || wp[i] > fwd->params.max_chunk_tokens) {
            return TDM_ERR_INVALID_ARG;
        }
        st = fwd_check_ids(c, ids[i], n_ids[i]);
        if (st != TDM_OK) {
            return st;
        }
        for (int j = 0; j < i; j++) {
            if (seqs[j] == seqs[i]) {
                return TDM_ERR_INVALID_ARG;
            }
        }
    }
    for (int i = 0; i < n_seqs; i++) {
        int64_t H = seqs[i]->length;
        for (int64_t k = 0; k < n_ids[i] && k < seqs[i]->n_ids_cap; k++) {
            engine_seq_set_id(seqs[i], H - 1 - k, ids[i][n_ids[i] - 1 - k]);
        }
    }
    /* batches of whole replays, at most max_chunk_tokens rows each (a replay is never cut) */
    for (int first = 0; first < n_seqs && st == TDM_OK;) {
        fwd_batch_t b;
        int64_t N = 0;
        int n_segs = 0;

        while (first + n_segs < n_seqs && N + wp[first + n_segs] <= fwd->params.max_chunk_tokens) {
            int i = first + n_segs;
            int64_t H = seqs[i]->length;
            segs[n_segs++] = (fwd_seg_t){seqs[i], i, H - wp[i], wp[i], N, H - wp[i], 0,
                                         ids[i] + (n_ids[i] - wp[i]), 0};
            N += wp[i];
        }
        memset(&b, 0, sizeof(b));
        fwd_batch_reset(fwd);
        b.segs = segs;
        b.n_segs = n_segs;
        st = fwd_batch_alloc(fwd, &b, N);
        if (st == TDM_OK) {
            st = fwd_batch_embed(fwd, &b);
        }
        for (int l = 0; l <= c->ced_cut && st == TDM_OK; l++) {
            st = fwd_layer_run(fwd, &b, l);
        }
        first += n_segs;
    }
    return st;
}
