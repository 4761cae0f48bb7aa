/* spec_dspark.c - the DSpark heads and verify length (MODEL.md 8): head logits U_i on the last
 * block's norm, the Markov head chained through the drafts, the confidence head, and
 * L = max{ j <= B : prod_{i<j} c_i >= theta_v } (at least 1). The draft forward itself is
 * engine_fwd_dspark_draft (engine/forward.c). */
#include "engine/spec_impl.h"
#include "kernels/attention.h"

#include <math.h>
#include <string.h>

#define FLOAT_BYTES(n) ((size_t)(n) * sizeof(float))

/* c_i = sigmoid(proj . [x_i || e_i]) in FP32 (R3: the confidence stays FP32), a sequential sum
 * on host copies of proj, x_i and e_i. */
static float confidence(const float *proj, const float *x, int64_t H, const float *e, int64_t r_m)
{
    float z = 0.0f;
    for (int64_t k = 0; k < H; k++) {
        z += proj[k] * x[k];
    }
    for (int64_t k = 0; k < r_m; k++) {
        z += proj[H + k] * e[k];
    }
    return 1.0f / (1.0f + kern_exp(-z)); /* the kernels' exp: every machine's libm alike */
}

/* Device-to-host copy of n floats on the spec's kernel context. */
static tdm_status_t to_host(engine_spec_t *spec, float *dst, const float *src, int64_t n)
{
    return spec->ops->mem_copy(&spec->kctx, dst, src, FLOAT_BYTES(n), KERN_COPY_D2H);
}

tdm_status_t spec_dspark_heads(engine_spec_t *spec, const float *x, int32_t anchor, int64_t a,
                               const engine_sampler_params_t *sampling, int max_drafts,
                               int32_t *drafts_out, float *dlogits_out, int *n_drafts_out)
{
    const engine_config_t *c = spec->cfg;
    const engine_model_t *model = spec->model;
    int64_t V = spec->V, H = spec->H, r_m = c->dspark_markov_rank;
    int64_t B = spec->B;
    double theta = spec->params.confidence_threshold;
    double prod = 1.0;
    int32_t prev = anchor;
    /* host staging of the confidence head: proj [H + r_m], the block's x [B, H], e_i [r_m] */
    float *proj_h = spec->conf_h, *x_h = spec->conf_h + H + r_m, *e_h = x_h + B * H;
    int L = 0;
    tdm_status_t st;

    if (max_drafts > B) {
        max_drafts = (int)B;
    }
    /* U_i = head . BF16(RMSNorm(x_i; norm of the last block)), FP32, for every block row */
    st = spec->ops->rmsnorm(&spec->kctx, x, H, B, H, model->mtp_norm, (float)c->rms_norm_eps,
                            spec->hn, H);
    if (st == TDM_OK) {
        st = spec->ops->gemm(&spec->kctx, &model->head, spec->hn, H, B, KERN_GEMM_OUT_F32, spec->U,
                             V);
    }
    if (st == TDM_OK) {
        st = to_host(spec, proj_h, model->conf_proj, H + r_m);
    }
    if (st == TDM_OK) {
        st = to_host(spec, x_h, x, B * H);
    }
    for (int j = 1; j <= max_drafts && st == TDM_OK; j++) {
        float *li = dlogits_out + (int64_t)(j - 1) * V;
        engine_sample_t s;
        /* e_i = markov.embed[prev_i], l_i = U_i + BF16(markov.head . e_i) (R3) */
        st = spec->ops->mem_copy(&spec->kctx, spec->prev, &prev, sizeof(prev), KERN_COPY_H2D);
        if (st == TDM_OK) {
            st = spec->ops->embed(&spec->kctx, model->markov_embed, V, spec->prev, 1, r_m, 1,
                                  spec->e, NULL);
        }
        if (st == TDM_OK) {
            st = to_host(spec, e_h, spec->e, r_m);
        }
        if (st != TDM_OK) {
            break;
        }
        prod *= (double)confidence(proj_h, x_h + (int64_t)(j - 1) * H, H, e_h, r_m);
        if (j > 1 && prod < theta) {
            break; /* verifying d_j is not worth it: L = j - 1 */
        }
        st = spec->ops->gemm(&spec->kctx, &model->markov_head, spec->e, r_m, 1, KERN_GEMM_OUT_BF16,
                             spec->ml, V);
        if (st == TDM_OK) {
            st = spec->ops->add(&spec->kctx, spec->U + (int64_t)(j - 1) * V, spec->ml, V, spec->ml);
        }
        if (st == TDM_OK) { /* l_i to the caller's host buffer (the sampler and q read it) */
            st = to_host(spec, li, spec->ml, V);
        }
        if (st != TDM_OK) {
            break;
        }
        /* d_j at position a + j, with the request's filters and the same G as the target */
        st = engine_sampler_sample(sampling, li, V, a + j, &spec->arena, &s);
        if (st != TDM_OK) {
            break;
        }
        drafts_out[j - 1] = s.token;
        prev = s.token;
        L = j;
    }
    if (st == TDM_OK) {
        *n_drafts_out = L;
    }
    return st;
}
