/* init.h - seeded random weight initialisation for test checkpoints (MODEL.md 9.1, 12.9).
 *
 * Every tensor draws from its own counter-based stream, keyed by (seed, tensor name), so the
 * values do not depend on the order tensors are generated in. Owns nothing; knows nothing of
 * files.
 */
#ifndef TANDEM_TOOLS_MKMODEL_INIT_H
#define TANDEM_TOOLS_MKMODEL_INIT_H

#include <stdint.h>

#include "common/status.h"
#include "engine/config.h"

/* How one tensor's values are drawn. */
typedef enum {
    INIT_NORMAL = 0,  /* mean + std * N(0, 1) */
    INIT_UNIFORM = 1, /* U(lo, hi) */
    INIT_CONST = 2,   /* every value = mean */
} init_kind_t;

/* The MODEL.md 9.1 rule for one tensor. */
typedef struct {
    init_kind_t kind;
    double mean; /* NORMAL: mean; CONST: the value */
    double std;  /* NORMAL: standard deviation */
    double lo;   /* UNIFORM bounds */
    double hi;
} init_rule_t;

/*
 * init_rule_for - the 9.1 rule for tensor `name` (bare checkpoint name of a weight, not a
 * scale) whose logical matrix is [n_out, n_in] (n_in = fan_in; vectors: n_in = 1).
 * Returns TDM_OK, or TDM_ERR_NOT_FOUND for a name no rule covers (rule_out untouched).
 */
tdm_status_t init_rule_for(const engine_config_t *cfg, const char *name, int64_t n_in,
                           init_rule_t *rule_out);

/*
 * init_fill - values[i] for i < n drawn by `rule` from the stream keyed by (seed, name).
 * Normal draws use Box-Muller in double on SplitMix64 counter outputs; results rounded to f32.
 */
void init_fill(const init_rule_t *rule, uint64_t seed, const char *name, float *values,
               int64_t n);

#endif
