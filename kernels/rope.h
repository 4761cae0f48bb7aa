/* rope.h - rotary position embedding on the last d_r dims (MODEL.md 5, R5), with the [tandem]
 * table rule: f_i in double rounded to FP32, angle fl32(fl32(pos) * f_i), cos/sin of that angle
 * in double rounded to FP32; the rotated values are rounded to BF16.
 *
 * Owns nothing; the frequency table is computed once on the host (kern_rope_freqs) and held by
 * the model. Knows nothing of layers.
 */
#ifndef TANDEM_KERNELS_ROPE_H
#define TANDEM_KERNELS_ROPE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/status.h"
#include "kernels/backend.h"

/* Largest d_r the kernels support. */
#define KERN_ROPE_MAX_DIMS 256

/*
 * kern_rope_yarn_t - YaRN parameters (config rope_scaling). factor <= 0 means no YaRN.
 */
typedef struct {
    double factor;
    double beta_fast;
    double beta_slow;
    double original_max_position;
} kern_rope_yarn_t;

/*
 * kern_rope_freqs - f_i = theta^(-2i/d_r) for i < d_r/2 in double; with yarn (non-NULL, factor
 * > 0): corr(b) = d_r ln(L0 / (2 pi b)) / (2 ln theta), lo = max(floor(corr(beta_fast)), 0),
 * hi = min(ceil(corr(beta_slow)), d_r - 1), ramp_i = clamp((i - lo) / max(hi - lo, 0.001), 0, 1),
 * f_i = f_i (1 - ramp_i) + (f_i / factor) ramp_i; then rounded to FP32 into freqs_out [d_r/2].
 * Returns TDM_OK or TDM_ERR_INVALID_ARG (d_r odd, <= 0 or > KERN_ROPE_MAX_DIMS, theta <= 1).
 */
tdm_status_t kern_rope_freqs(int d_r, double theta, const kern_rope_yarn_t *yarn, float *freqs_out);

/* kern_rope_cos_sin - cos_out, sin_out [d_r/2] FP32 at position pos (the table rule). */
void kern_rope_cos_sin(const float *freqs, int d_r, int64_t pos, float *cos_out, float *sin_out);

/*
 * kern_rope_cache_t - the CPU RoPE's cos/sin rows (kern_rope_cos_sin) of recently used positions,
 * for up to KERN_ROPE_CACHE_TABLES frequency tables (told apart by their values, not their
 * address): a forward pass rotates the same positions with the same table in many calls (q, kv,
 * index keys and the inverse rotation of every layer), and each row's cos/sin would otherwise be
 * computed (d_r libm calls) in each. A cached row is the very floats kern_rope_cos_sin returns,
 * so results do not change. Direct-mapped on pos % n_slots; a kern_ctx_t points at it
 * (rope_cache) and kern_rope_cpu uses it. Not thread-safe: one per kernel context.
 */
typedef struct kern_rope_cache kern_rope_cache_t;

/* Frequency tables a kern_rope_cache_t holds at once (the least recently created is replaced). */
#define KERN_ROPE_CACHE_TABLES 4

/*
 * kern_rope_cache_create - an empty cache of n_slots positions per table (a power of two,
 * 1..2^20); each table's rows (n_slots * d_r floats plus a tag per slot) are allocated the
 * first time kern_rope_cpu sees it. Returns TDM_OK, TDM_ERR_INVALID_ARG (n_slots not a power of
 * two in range, cache_out NULL), TDM_ERR_NO_MEMORY. Caller frees with kern_rope_cache_destroy.
 */
tdm_status_t kern_rope_cache_create(int64_t n_slots, kern_rope_cache_t **cache_out);

/* kern_rope_cache_destroy - frees the cache and its rows; NULL is a no-op. */
void kern_rope_cache_destroy(kern_rope_cache_t *cache);

/* Direction of kern_rope_fn. */
typedef enum {
    KERN_ROPE_FORWARD = 0, /* (a, b) -> (a c - b s, a s + b c) */
    KERN_ROPE_INVERSE = 1, /* (a, b) -> (a c + b s, b c - a s) */
} kern_rope_dir_t;

/*
 * kern_rope_fn - rotate, in place, the last d_r dims of each of n_heads vectors of dim elements
 * in each of n_rows rows, at position pos[r] of the row: pairs (x[dim-d_r+2i], x[dim-d_r+2i+1])
 * by angle pos * f_i; FP32 math, every element of the row (rotated or not) rounded to BF16.
 *
 * x:     [n_rows, n_heads, dim] f32, rows of n_heads * dim contiguous elements, in place.
 * pos:   [n_rows] positions >= 0.   freqs: [d_r/2] from kern_rope_freqs.
 * Returns TDM_OK or TDM_ERR_INVALID_ARG (NULL, d_r > dim, d_r odd).
 * The CPU version takes each row's cos/sin from ctx->rope_cache when ctx has one (filling it on
 * a miss; a table whose rows cannot be allocated is simply not cached): the same values.
 */
typedef tdm_status_t kern_rope_fn(kern_ctx_t *ctx, float *x, int64_t n_rows, int64_t n_heads,
                                  int64_t dim, int d_r, const int64_t *pos, const float *freqs,
                                  kern_rope_dir_t dir);
kern_rope_fn kern_rope_cpu;

#ifdef __cplusplus
}
#endif

#endif
