/* rope.c - RoPE tables and rotation (kernels/rope.h). */
#include "kernels/rope.h"

#include "kernels/codec.h"
#include "kernels/cpu/cpu_simd.h"
#include "kernels/cpu/vec_isa.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define ROPE_CACHE_MAX_SLOTS (1 << 20)

/* One frequency table's rows: slot k holds position tags[k] (-1: empty) as d_r/2 cosines then
 * d_r/2 sines at rows + k * d_r. */
typedef struct {
    int d_r; /* 0: unused */
    float freqs[KERN_ROPE_MAX_DIMS / 2];
    int64_t *tags;
    float *rows;
} rope_table_t;

struct kern_rope_cache {
    int64_t n_slots;
    int next_victim; /* the table replaced when a new one does not fit */
    rope_table_t t[KERN_ROPE_CACHE_TABLES];
};

tdm_status_t kern_rope_freqs(int d_r, double theta, const kern_rope_yarn_t *yarn, float *freqs_out)
{
    double lo = 0.0;
    double hi = 0.0;
    int use_yarn = yarn != NULL && yarn->factor > 0.0;

    if (freqs_out == NULL || d_r <= 0 || d_r % 2 != 0 || d_r > KERN_ROPE_MAX_DIMS ||
        !(theta > 1.0)) {
        return TDM_ERR_INVALID_ARG;
    }
    if (use_yarn) {
        double c_fast = d_r * log(yarn->original_max_position / (2.0 * M_PI * yarn->beta_fast)) /
                        (2.0 * log(theta));
        double c_slow = d_r * log(yarn->original_max_position / (2.0 * M_PI * yarn->beta_slow)) /
                        (2.0 * log(theta));
        lo = floor(c_fast);
        if (lo < 0.0) {
            lo = 0.0;
        }
        hi = ceil(c_slow);
        if (hi > d_r - 1) {
            hi = d_r - 1;
        }
    }
    for (int i = 0; i < d_r / 2; i++) {
        double f = pow(theta, -2.0 * i / d_r);
        if (use_yarn) {
            double span = hi - lo > 0.001 ? hi - lo : 0.001;
            double ramp = (i - lo) / span;
            ramp = ramp < 0.0 ? 0.0 : (ramp > 1.0 ? 1.0 : ramp);
            f = f * (1.0 - ramp) + (f / yarn->factor) * ramp;
        }
        freqs_out[i] = (float)f;
    }
    return TDM_OK;
}

void kern_rope_cos_sin(const float *freqs, int d_r, int64_t pos, float *cos_out, float *sin_out)
{
    float p = (float)pos;
    for (int i = 0; i < d_r / 2; i++) {
        float angle = p * freqs[i];
        cos_out[i] = (float)cos((double)angle);
        sin_out[i] = (float)sin((double)angle);
    }
}

tdm_status_t kern_rope_cache_create(int64_t n_slots, kern_rope_cache_t **cache_out)
{
    kern_rope_cache_t *c;

    if (cache_out == NULL || n_slots < 1 || n_slots > ROPE_CACHE_MAX_SLOTS ||
        (n_slots & (n_slots - 1)) != 0) {
        return TDM_ERR_INVALID_ARG;
    }
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    c->n_slots = n_slots;
    *cache_out = c;
    return TDM_OK;
}

void kern_rope_cache_destroy(kern_rope_cache_t *cache)
{
    if (cache == NULL) {
        return;
    }
    for (int i = 0; i < KERN_ROPE_CACHE_TABLES; i++) {
        free(cache->t[i].tags);
        free(cache->t[i].rows);
    }
    free(cache);
}

/* The table of (freqs, d_r) in cache c, made (replacing the oldest) when none matches; NULL when
 * its rows cannot be allocated (the caller computes cos/sin itself). */
static rope_table_t *rope_table(kern_rope_cache_t *c, const float *freqs, int d_r)
{
    size_t fbytes = (size_t)(d_r / 2) * sizeof(float);
    rope_table_t *t;

    for (int i = 0; i < KERN_ROPE_CACHE_TABLES; i++) {
        t = &c->t[i];
        if (t->d_r == d_r && memcmp(t->freqs, freqs, fbytes) == 0) {
            return t;
        }
    }
    t = &c->t[c->next_victim];
    c->next_victim = (c->next_victim + 1) % KERN_ROPE_CACHE_TABLES;
    if (t->d_r != d_r) {
        free(t->tags);
        free(t->rows);
        t->d_r = 0;
        t->tags = malloc((size_t)c->n_slots * sizeof(int64_t));
        t->rows = malloc((size_t)c->n_slots * (size_t)d_r * sizeof(float));
        if (t->tags == NULL || t->rows == NULL) {
            free(t->tags);
            free(t->rows);
            t->tags = NULL;
            t->rows = NULL;
            return NULL;
        }
    }
    t->d_r = d_r;
    memcpy(t->freqs, freqs, fbytes);
    for (int64_t k = 0; k < c->n_slots; k++) {
        t->tags[k] = -1;
    }
    return t;
}

tdm_status_t kern_rope_cpu(kern_ctx_t *ctx, float *x, int64_t n_rows, int64_t n_heads, int64_t dim,
                           int d_r, const int64_t *pos, const float *freqs, kern_rope_dir_t dir)
{
    float cs_own[KERN_ROPE_MAX_DIMS / 2];
    float sn_own[KERN_ROPE_MAX_DIMS / 2];
    float cs2[KERN_ROPE_MAX_DIMS];
    float sn2[KERN_ROPE_MAX_DIMS];
    const cpu_vec_ops_t *vec = cpu_vec_ops();

    if (x == NULL || pos == NULL || freqs == NULL || d_r <= 0 || d_r % 2 != 0 ||
        d_r > KERN_ROPE_MAX_DIMS || d_r > dim || n_rows < 0 || n_heads <= 0) {
        return TDM_ERR_INVALID_ARG;
    }
    rope_table_t *table = NULL;
    if (ctx != NULL && ctx->rope_cache != NULL) {
        table = rope_table(ctx->rope_cache, freqs, d_r);
    }
    for (int64_t r = 0; r < n_rows; r++) {
        const float *cs = cs_own;
        const float *sn = sn_own;
        if (table != NULL && pos[r] >= 0) {
            int64_t k = pos[r] & (ctx->rope_cache->n_slots - 1);
            float *row = table->rows + k * d_r;
            if (table->tags[k] != pos[r]) {
                kern_rope_cos_sin(freqs, d_r, pos[r], row, row + d_r / 2);
                table->tags[k] = pos[r];
            }
            cs = row;
            sn = row + d_r / 2;
        } else {
            kern_rope_cos_sin(freqs, d_r, pos[r], cs_own, sn_own);
        }
        if (vec != NULL) {
            /* each pair's cos and sin at both of its lanes (the vector rotation's operands) */
            for (int i = 0; i < d_r / 2; i++) {
                cs2[2 * i] = cs[i];
                cs2[2 * i + 1] = cs[i];
                sn2[2 * i] = sn[i];
                sn2[2 * i + 1] = sn[i];
            }
            vec->rope_heads(x + r * n_heads * dim, n_heads, dim, d_r, cs2, sn2,
                            dir == KERN_ROPE_INVERSE);
            continue;
        }
        for (int64_t h = 0; h < n_heads; h++) {
            float *v = x + (r * n_heads + h) * dim;
            float *tail = v + dim - d_r;
            for (int64_t i = 0; i < dim - d_r; i++) {
                v[i] = cpu_bf16_round(v[i]);
            }
            for (int i = 0; i < d_r / 2; i++) {
                float a = tail[2 * i];
                float b = tail[2 * i + 1];
                float ra;
                float rb;
                if (dir == KERN_ROPE_FORWARD) {
                    ra = a * cs[i] - b * sn[i];
                    rb = a * sn[i] + b * cs[i];
                } else {
                    ra = a * cs[i] + b * sn[i];
                    rb = b * cs[i] - a * sn[i];
                }
                tail[2 * i] = cpu_bf16_round(ra);
                tail[2 * i + 1] = cpu_bf16_round(rb);
            }
        }
    }
    return TDM_OK;
}
