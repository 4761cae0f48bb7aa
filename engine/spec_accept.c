/* spec_accept.c - acceptance of verified drafts (MODEL.md 8): the coupled rule (default,
 * token-identical to non-speculative decoding) and the standard rejection rule (option,
 * lossless in distribution). */
#include "engine/spec_impl.h"

#include <math.h>
#include <string.h>

/* The rejection rule's Philox counter word 2 [tandem]: (q, 0, 1, 0), never the primitive's
 * (q, x, 0, 0). */
#define SPEC_PHILOX_STREAM_REJECTION 1u

/* Two uniforms in (0, 1) for position q: words 0 and 1 of Philox(seed, (q, 0, 1, 0)). */
static void rejection_uniforms(uint64_t seed, int64_t q, double *u0_out, double *u1_out)
{
    uint32_t ctr[4] = {(uint32_t)q, 0u, SPEC_PHILOX_STREAM_REJECTION, 0u};
    uint32_t key[2] = {(uint32_t)(seed & 0xFFFFFFFFu), (uint32_t)(seed >> 32)};
    uint32_t out[4];
    engine_sampler_philox4x32_10(ctr, key, out);
    *u0_out = ((double)out[0] + 0.5) * (1.0 / 4294967296.0);
    *u1_out = ((double)out[1] + 0.5) * (1.0 / 4294967296.0);
}

/* ln softmax(logits)[token] in double (the model's distribution, as engine_sample_t reports). */
static double raw_logprob(const float *logits, int64_t V, int32_t token)
{
    double mx = -INFINITY;
    double z = 0.0;
    for (int64_t v = 0; v < V; v++) {
        mx = logits[v] > mx ? logits[v] : mx;
    }
    for (int64_t v = 0; v < V; v++) {
        z += exp((double)logits[v] - mx);
    }
    return (double)logits[token] - mx - log(z);
}

/* A sample record for `token` at position q of the target row (alternatives from the row). */
static tdm_status_t sample_as(engine_spec_t *spec, const float *row, int64_t q,
                              const engine_sampler_params_t *sampling, int32_t token,
                              engine_sample_t *out)
{
    tdm_status_t st = engine_sampler_sample(sampling, row, spec->V, q, &spec->arena, out);
    if (st == TDM_OK && out->token != token) {
        out->token = token;
        out->logprob = sampling->n_logprobs == ENGINE_SAMPLER_LOGPROBS_OFF
                           ? 0.0
                           : raw_logprob(row, spec->V, token);
    }
    return st;
}

/*
 * Constrained decoding: the verify row of the position the constraint's state has reached gets
 * -inf outside the mask (so p is the masked distribution and a draft outside the language is
 * never kept). No-op without a constraint.
 */
static tdm_status_t constrain_row(engine_spec_t *spec, engine_constraint_t *c, float *row)
{
    return c == NULL ? TDM_OK : engine_constraint_apply(c, row, spec->V);
}

/* A kept draft moves the constraint's state on; *stop_out = 1 once it took a stop id (nothing
 * after it is emitted, and nothing is allowed after it). */
static tdm_status_t constrain_keep(engine_constraint_t *c, int32_t token, int *stop_out)
{
    tdm_status_t st;

    *stop_out = 0;
    if (c == NULL) {
        return TDM_OK;
    }
    st = engine_constraint_advance(c, token);
    *stop_out = engine_constraint_finished(c);
    return st;
}

static tdm_status_t accept_coupled(engine_spec_t *spec, float *logits, const int32_t *drafts, int L,
                                   int64_t a, const engine_sampler_params_t *sampling,
                                   engine_constraint_t *c, engine_sample_t *samples_out,
                                   int *n_accepted_out)
{
    int64_t V = spec->V;
    tdm_status_t st;
    int stop = 0;

    for (int i = 1; i <= L; i++) {
        /* the target's own token at a + i, from p_i (the verify row at a + i - 1) */
        st = constrain_row(spec, c, logits + (int64_t)(i - 1) * V);
        if (st == TDM_OK) {
            st = engine_sampler_sample(sampling, logits + (int64_t)(i - 1) * V, V, a + i,
                                       &spec->arena, &samples_out[i - 1]);
        }
        if (st != TDM_OK) {
            return st;
        }
        if (samples_out[i - 1].token != drafts[i - 1]) {
            *n_accepted_out = i - 1;
            return TDM_OK;
        }
        st = constrain_keep(c, drafts[i - 1], &stop);
        if (st != TDM_OK || stop) {
            *n_accepted_out = i - 1; /* samples 0 .. i - 1 written, the last the stop id */
            return st;
        }
    }
    *n_accepted_out = L;
    st = constrain_row(spec, c, logits + (int64_t)L * V);
    if (st != TDM_OK) {
        return st;
    }
    return engine_sampler_sample(sampling, logits + (int64_t)L * V, V, a + L + 1, &spec->arena,
                                 &samples_out[L]);
}

static tdm_status_t accept_rejection(engine_spec_t *spec, float *logits, const int32_t *drafts,
                                     int L, const float *dlogits, int64_t a,
                                     const engine_sampler_params_t *sampling,
                                     engine_constraint_t *c, engine_sample_t *samples_out,
                                     int *n_accepted_out)
{
    int64_t V = spec->V;
    tdm_status_t st;
    int stop = 0;

    for (int i = 1; i <= L; i++) {
        float *row = logits + (int64_t)(i - 1) * V;
        int32_t d = drafts[i - 1];
        double u0, u1, qd, z = 0.0;
        int32_t token = -1;

        st = constrain_row(spec, c, row);
        if (st == TDM_OK) {
            st = engine_sampler_filtered_probs(sampling, row, V, &spec->arena, spec->p);
        }
        if (st == TDM_OK && dlogits != NULL) {
            st = engine_sampler_filtered_probs(sampling, dlogits + (int64_t)(i - 1) * V, V,
                                               &spec->arena, spec->q);
        } else if (st == TDM_OK) {
            memset(spec->q, 0, (size_t)V * sizeof(double)); /* a point-mass draft */
            spec->q[d] = 1.0;
        }
        if (st != TDM_OK) {
            return st;
        }
        qd = spec->q[d];
        rejection_uniforms(sampling->seed, a + i, &u0, &u1);
        if (qd > 0.0 && u0 * qd < spec->p[d]) {
            st = sample_as(spec, row, a + i, sampling, d, &samples_out[i - 1]);
            if (st == TDM_OK) {
                st = constrain_keep(c, d, &stop);
            }
            if (st != TDM_OK || stop) {
                *n_accepted_out = i - 1; /* samples 0 .. i - 1 written, the last the stop id */
                return st;
            }
            continue;
        }
        /* rejected: draw from normalize(max(0, p - q)), ascending ids, inverse CDF with u1 */
        for (int64_t v = 0; v < V; v++) {
            double r = spec->p[v] - spec->q[v];
            spec->q[v] = r > 0.0 ? r : 0.0;
            z += spec->q[v];
        }
        if (z > 0.0) {
            double target = u1 * z, run = 0.0;
            for (int64_t v = 0; v < V && token < 0; v++) {
                run += spec->q[v];
                if (spec->q[v] > 0.0 && run >= target) {
                    token = (int32_t)v;
                }
            }
            for (int64_t v = V - 1; v >= 0 && token < 0; v--) {
                token = spec->q[v] > 0.0 ? (int32_t)v : -1; /* rounding left target past run */
            }
        }
        if (token < 0) {
            st = engine_sampler_sample(sampling, row, V, a + i, &spec->arena, &samples_out[i - 1]);
        } else {
            st = sample_as(spec, row, a + i, sampling, token, &samples_out[i - 1]);
        }
        *n_accepted_out = i - 1;
        return st;
    }
    *n_accepted_out = L;
    st = constrain_row(spec, c, logits + (int64_t)L * V);
    if (st != TDM_OK) {
        return st;
    }
    return engine_sampler_sample(sampling, logits + (int64_t)L * V, V, a + L + 1, &spec->arena,
                                 &samples_out[L]);
}

tdm_status_t spec_accept(engine_spec_t *spec, float *logits, const int32_t *drafts, int L,
                         const float *dlogits, int64_t a, const engine_sampler_params_t *sampling,
                         engine_constraint_t *constraint, engine_sample_t *samples_out,
                         int *n_accepted_out)
{
    engine_constraint_mark_t mark;
    tdm_status_t st;

    /* the constraint walks along the kept drafts here; its owner advances it by what is
     * emitted, so the state is given back as it came */
    if (constraint != NULL) {
        engine_constraint_mark(constraint, &mark);
    }
    if (spec->params.accept == ENGINE_SPEC_ACCEPT_REJECTION) {
        st = accept_rejection(spec, logits, drafts, L, dlogits, a, sampling, constraint,
                              samples_out, n_accepted_out);
    } else {
        st = accept_coupled(spec, logits, drafts, L, a, sampling, constraint, samples_out,
                            n_accepted_out);
    }
    if (constraint != NULL) {
        engine_constraint_rewind(constraint, &mark);
    }
    return st;
}
