/* forward_ep.c - the routed experts of a MoE layer split over the ranks of an expert-parallel
 * group (issue 14 item 6; engine/ep.h, kernels/comm.h).
 *
 * Both forms keep the one-device sum: the outputs of a token's experts are added into its routed
 * sum in ascending expert order by the token's own rank, exactly the additions of the one-device
 * loop (forward_layer.c), and each expert's output row depends only on its own input row (the
 * GEMMs, SwiGLU and Q_act8 are batch invariant: kernels/gemm.h), whichever rows it was computed
 * with. So a rank's logits are the one-device logits bit for bit on the CPU.
 *
 * Replicated (every rank holds every token): each rank computes its own experts' rows of the
 * expert-sorted order, one contiguous block, and an all-gather brings the others' blocks.
 *
 * Data-parallel (each rank its own tokens): rounds. In a round every rank all-gathers a header
 * [state, layer, off[0..E]] (state 0 = it has rows of `layer` to place, 1 = serving only), then
 * sends each owner the expert-sorted input rows and routing weights of that owner's experts
 * (all-to-all), computes what it received per source and expert, and sends the outputs back
 * (all-to-all). A rank inside a MoE layer takes part in one round; a rank whose work is done
 * serves in rounds until a round in which every rank is serving (engine_fwd_ep_serve). Ranks may
 * be at different layers in the same round: each source names its own.
 */
#include "engine/forward_impl.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "kernels/comm.h"

#define FLOAT_BYTES(n) ((size_t)(n) * sizeof(float))
#define HDR_STATE      0 /* header words */
#define HDR_LAYER      1
#define HDR_OFF        2
#define STATE_ACTIVE   0
#define STATE_SERVING  1

/* Most routed experts of any layer of the model. */
static int64_t max_experts(const engine_fwd_t *fwd)
{
    int64_t E = 0;
    for (int l = 0; l < fwd->cfg->n_roles; l++) {
        if (fwd->model->layers[l].n_experts > E) {
            E = fwd->model->layers[l].n_experts;
        }
    }
    return E;
}

tdm_status_t fwd_ep_init(engine_fwd_t *fwd)
{
    int R = kern_comm_size(fwd->params.comm);
    size_t bytes;

    fwd->ep_hdr_words = HDR_OFF + max_experts(fwd) + 1;
    bytes = (size_t)R * (size_t)fwd->ep_hdr_words * sizeof(int64_t);
    fwd->ep_hdr_host = malloc(bytes);
    if (fwd->ep_hdr_host == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    return fwd->ops->mem_alloc(&fwd->kctx, bytes, (void **)&fwd->ep_hdr_dev);
}

void fwd_ep_fini(engine_fwd_t *fwd)
{
    fwd->ops->mem_free(&fwd->kctx, fwd->ep_hdr_dev);
    fwd->ops->mem_free(&fwd->kctx, fwd->ep_buf);
    free(fwd->ep_hdr_host);
}

/* Every rank's header [state, layer, off[0..E]] into fwd->ep_hdr_host [R, W]: this rank's from
 * (layer, off) (layer < 0: serving, no offsets), the others' by an all-gather. */
static tdm_status_t exchange_headers(engine_fwd_t *fwd, int layer, const int64_t *off)
{
    kern_comm_t *comm = fwd->params.comm;
    int R = kern_comm_size(comm), me = kern_comm_rank(comm);
    int64_t W = fwd->ep_hdr_words;
    int64_t *mine = fwd->ep_hdr_host + me * W;
    size_t *hdr_off = fwd_host_alloc(fwd, (size_t)(R + 1) * sizeof(size_t));
    tdm_status_t st;

    if (hdr_off == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    memset(mine, 0, (size_t)W * sizeof(int64_t));
    mine[HDR_STATE] = layer >= 0 ? STATE_ACTIVE : STATE_SERVING;
    mine[HDR_LAYER] = layer;
    if (layer >= 0) {
        memcpy(mine + HDR_OFF, off,
               (size_t)(fwd->model->layers[layer].n_experts + 1) * sizeof(int64_t));
    }
    for (int r = 0; r <= R; r++) {
        hdr_off[r] = (size_t)(r * W) * sizeof(int64_t);
    }
    st = fwd_to_backend(fwd, fwd->ep_hdr_dev + me * W, mine, (size_t)W * sizeof(int64_t));
    if (st == TDM_OK) {
        st = kern_comm_allgatherv(comm, &fwd->kctx, fwd->ep_hdr_dev, hdr_off);
    }
    if (st == TDM_OK) {
        st = fwd_to_host(fwd, fwd->ep_hdr_host, fwd->ep_hdr_dev, hdr_off[R]);
    }
    return st;
}

/* The replicated form: this rank's experts into Y, all-gather, then the sum. The ranks must
 * agree on the routing (the all-gather's block sizes come from it): checked first through the
 * headers, so that a disagreement is an error on every rank, never a mismatched collective. */
static tdm_status_t routed_allgather(engine_fwd_t *fwd, int layer, const float *xq,
                                     const int64_t *rows, const float *we, const int64_t *off,
                                     float *xe, float *gu, float *h, float *Y)
{
    const engine_layer_weights_t *lw = &fwd->model->layers[layer];
    int64_t H = fwd->cfg->hidden_size, E = lw->n_experts;
    int R = kern_comm_size(fwd->params.comm);
    size_t *bounds = fwd_host_alloc(fwd, (size_t)(R + 1) * sizeof(size_t));
    tdm_status_t st = TDM_OK;

    if (bounds == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    st = exchange_headers(fwd, layer, off);
    for (int r = 0; r < R && st == TDM_OK; r++) {
        if (memcmp(fwd->ep_hdr_host + r * fwd->ep_hdr_words + HDR_OFF, off,
                   (size_t)(E + 1) * sizeof(int64_t)) != 0) {
            tdm_log(TDM_LOG_ERROR, "engine",
                    "expert parallel: rank %d routed layer %d differently from rank %d "
                    "(replicated attention needs the same routing on every rank)",
                    r, layer, kern_comm_rank(fwd->params.comm));
            st = TDM_ERR_INTERNAL;
        }
    }
    for (int64_t e = lw->e_begin; e < lw->e_end && st == TDM_OK; e++) {
        int64_t ne = off[e + 1] - off[e];
        if (ne > 0) {
            st = fwd->ops->rows_gather(&fwd->kctx, xq, H, rows + off[e], ne, H, xe, H);
            if (st == TDM_OK) {
                st = fwd_expert_ffn(fwd, lw, e, xe, we + off[e], ne, gu, h, Y + off[e] * H);
            }
        }
    }
    /* rank r's block: the rows of its experts (engine_expert_range, the models' shard rule) */
    for (int r = 0; r < R; r++) {
        int e0, e1;
        engine_expert_range(E, r, R, &e0, &e1);
        bounds[r] = (size_t)off[e0] * (size_t)H * sizeof(float);
    }
    bounds[R] = (size_t)off[E] * (size_t)H * sizeof(float);
    return st == TDM_OK ? kern_comm_allgatherv(fwd->params.comm, &fwd->kctx, Y, bounds) : st;
}

/* Served rows' buffers for m rows: inputs [m, H], weights [m], outputs [m, H], gu [m, 2I],
 * h [m, I], one allocation grown on demand. */
static tdm_status_t serve_buffers(engine_fwd_t *fwd, int64_t m, float **x, float **w, float **y,
                                  float **gu, float **h)
{
    int64_t H = fwd->cfg->hidden_size, I = fwd->cfg->moe_intermediate_size;
    int64_t per_row = 2 * H + 1 + 3 * I;
    tdm_status_t st = fwd_grow_rows(fwd, &fwd->ep_buf, &fwd->ep_buf_rows, m, per_row);

    if (st != TDM_OK) {
        return st;
    }
    *x = fwd->ep_buf;
    *y = *x + fwd->ep_buf_rows * H;
    *gu = *y + fwd->ep_buf_rows * H;
    *h = *gu + fwd->ep_buf_rows * 2 * I;
    *w = *h + fwd->ep_buf_rows * I;
    return TDM_OK;
}

/*
 * One data-parallel round. Active (layer >= 0): xs [NK, H] this rank's expert-sorted input rows
 * of `layer` with weights ws [NK] and host offsets off [E+1]; their outputs come back into
 * Y [NK, H]. Serving (layer < 0): no rows. *all_serving = 1 when every rank was serving (nothing
 * moved).
 */
static tdm_status_t ep_round(engine_fwd_t *fwd, int layer, const float *xs, const float *ws,
                             const int64_t *off, float *Y, int *all_serving)
{
    kern_comm_t *comm = fwd->params.comm;
    int R = kern_comm_size(comm), me = kern_comm_rank(comm);
    int64_t H = fwd->cfg->hidden_size, W = fwd->ep_hdr_words;
    size_t *send_x = fwd_host_alloc(fwd, (size_t)(R + 1) * sizeof(size_t));
    size_t *recv_x = fwd_host_alloc(fwd, (size_t)(R + 1) * sizeof(size_t));
    size_t *send_w = fwd_host_alloc(fwd, (size_t)(R + 1) * sizeof(size_t));
    size_t *recv_w = fwd_host_alloc(fwd, (size_t)(R + 1) * sizeof(size_t));
    float *xr = NULL, *wr = NULL, *yr = NULL, *gu = NULL, *h = NULL;
    int64_t m = 0;
    tdm_status_t st;

    if (send_x == NULL || recv_x == NULL || send_w == NULL || recv_w == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    /* 1. headers */
    st = exchange_headers(fwd, layer, off);
    if (st != TDM_OK) {
        return st;
    }
    *all_serving = 1;
    for (int r = 0; r < R; r++) {
        *all_serving &= fwd->ep_hdr_host[r * W + HDR_STATE] == STATE_SERVING;
    }
    if (*all_serving) {
        return TDM_OK;
    }
    /* 2. what goes where: to owner q the rows of q's experts (contiguous in sorted order); from
     * source s the rows of s's layer routed to this rank's experts */
    send_x[0] = recv_x[0] = send_w[0] = recv_w[0] = 0;
    for (int q = 0; q < R; q++) {
        int64_t n_send = 0, n_recv = 0;
        const int64_t *hs = fwd->ep_hdr_host + q * W;
        int e0, e1;
        if (layer >= 0) {
            engine_expert_range(fwd->model->layers[layer].n_experts, q, R, &e0, &e1);
            n_send = off[e1] - off[e0];
        }
        if (hs[HDR_STATE] == STATE_ACTIVE) {
            engine_expert_range(fwd->model->layers[hs[HDR_LAYER]].n_experts, me, R, &e0, &e1);
            n_recv = hs[HDR_OFF + e1] - hs[HDR_OFF + e0];
        }
        send_x[q + 1] = send_x[q] + FLOAT_BYTES(n_send * H);
        send_w[q + 1] = send_w[q] + FLOAT_BYTES(n_send);
        recv_x[q + 1] = recv_x[q] + FLOAT_BYTES(n_recv * H);
        recv_w[q + 1] = recv_w[q] + FLOAT_BYTES(n_recv);
        m += n_recv;
    }
    st = serve_buffers(fwd, m > 0 ? m : 1, &xr, &wr, &yr, &gu, &h);
    /* 3. dispatch */
    if (st == TDM_OK) {
        st = kern_comm_alltoallv(comm, &fwd->kctx, xs, send_x, xr, recv_x);
    }
    if (st == TDM_OK) {
        st = kern_comm_alltoallv(comm, &fwd->kctx, ws, send_w, wr, recv_w);
    }
    /* 4. this rank's experts on every source's rows, source by source, expert by expert */
    int64_t at = 0;
    for (int s = 0; s < R && st == TDM_OK; s++) {
        const int64_t *hs = fwd->ep_hdr_host + s * W;
        if (hs[HDR_STATE] != STATE_ACTIVE) {
            continue;
        }
        const engine_layer_weights_t *lw = &fwd->model->layers[hs[HDR_LAYER]];
        for (int64_t e = lw->e_begin; e < lw->e_end && st == TDM_OK; e++) {
            int64_t ne = hs[HDR_OFF + e + 1] - hs[HDR_OFF + e];
            if (ne > 0) {
                st = fwd_expert_ffn(fwd, lw, e, xr + at * H, wr + at, ne, gu, h, yr + at * H);
                at += ne;
            }
        }
    }
    /* 5. combine: the outputs back to their sources, at their sorted rows */
    if (st == TDM_OK) {
        st = kern_comm_alltoallv(comm, &fwd->kctx, yr, recv_x, Y, send_x);
    }
    return st;
}

tdm_status_t fwd_ep_routed(engine_fwd_t *fwd, int layer, const float *xq, const int64_t *rows,
                           const float *we, const int64_t *off, int64_t NK, float *xe, float *gu,
                           float *h, float *acc)
{
    const engine_layer_weights_t *lw = &fwd->model->layers[layer];
    int64_t H = fwd->cfg->hidden_size, E = lw->n_experts;
    float *Y = fwd_alloc(fwd, FLOAT_BYTES(NK * H));
    tdm_status_t st;

    if (Y == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    if (fwd->params.ep_data_parallel) {
        float *xs = fwd_alloc(fwd, FLOAT_BYTES(NK * H));
        int all_serving = 0;
        if (xs == NULL) {
            return TDM_ERR_NO_MEMORY;
        }
        st = fwd->ops->rows_gather(&fwd->kctx, xq, H, rows, NK, H, xs, H);
        if (st == TDM_OK) {
            st = ep_round(fwd, layer, xs, we, off, Y, &all_serving);
        }
    } else {
        st = routed_allgather(fwd, layer, xq, rows, we, off, xe, gu, h, Y);
    }
    for (int64_t e = 0; e < E && st == TDM_OK; e++) {
        int64_t ne = off[e + 1] - off[e];
        if (ne > 0) {
            st = fwd->ops->rows_scatter_add(&fwd->kctx, Y + off[e] * H, H, rows + off[e], ne, H,
                                            acc, H);
        }
    }
    return st;
}

tdm_status_t engine_fwd_ep_serve(engine_fwd_t *fwd)
{
    tdm_status_t st = TDM_OK;
    int all_serving = 0;

    if (fwd == NULL || fwd->params.comm == NULL || !fwd->params.ep_data_parallel) {
        return TDM_ERR_INVALID_ARG;
    }
    while (st == TDM_OK && !all_serving) {
        fwd_layer_reset(fwd);
        st = ep_round(fwd, -1, NULL, NULL, NULL, NULL, &all_serving);
    }
    fwd_layer_reset(fwd);
    return st;
}

tdm_status_t engine_fwd_ep_warmup(engine_fwd_t *fwd)
{
    if (fwd == NULL || fwd->params.comm == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    return kern_comm_warmup(fwd->params.comm, &fwd->kctx);
}
