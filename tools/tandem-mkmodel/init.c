#include "init.h"

#include <math.h>
#include <string.h>

#include "common/hash.h"

#define INIT_TWO_PI 6.283185307179586476925286766559

static int ends_with(const char *text, const char *suffix)
{
    size_t n_text = strlen(text);
    size_t n_suffix = strlen(suffix);
    return n_text >= n_suffix && strcmp(text + n_text - n_suffix, suffix) == 0;
}

static init_rule_t normal(double mean, double variance)
{
    init_rule_t rule = {INIT_NORMAL, mean, sqrt(variance), 0.0, 0.0};
    return rule;
}

static init_rule_t constant(double value)
{
    init_rule_t rule = {INIT_CONST, value, 0.0, 0.0, 0.0};
    return rule;
}

static init_rule_t uniform(double lo, double hi)
{
    init_rule_t rule = {INIT_UNIFORM, 0.0, 0.0, lo, hi};
    return rule;
}

tdm_status_t init_rule_for(const engine_config_t *cfg, const char *name, int64_t n_in,
                           init_rule_t *rule_out)
{
    const double hidden = (double)cfg->hidden_size;
    const double m = (double)cfg->hc_mult;
    const double r_m = (double)cfg->dspark_markov_rank;
    const double depth_scale = 1.0 / sqrt(2.0 * (double)cfg->num_hidden_layers);
    init_rule_t rule;

    if (strcmp(name, "embed.weight") == 0) {
        rule = normal(0.0, 1.0);
    } else if (strcmp(name, "head.weight") == 0) {
        rule = normal(0.0, 1.0 / hidden);
    } else if (ends_with(name, "norm.weight")) {
        /* attn_norm, ffn_norm, q_norm, kv_norm, compressor.norm, k_norm, norm, main_norm */
        rule = constant(1.0);
    } else if (ends_with(name, "_fn") && strstr(name, ".hc_") != NULL) {
        rule = normal(0.0, 1.0 / (m * hidden));
    } else if (ends_with(name, "_base") && strstr(name, ".hc_") != NULL) {
        rule = normal(0.0, 0.25);
    } else if (ends_with(name, "_scale") && strstr(name, ".hc_") != NULL) {
        rule = constant(0.5);
    } else if (ends_with(name, "attn.attn_sink")) {
        rule = uniform(-1.0, 1.0);
    } else if (ends_with(name, "ffn.gate.weight")) {
        rule = normal(0.0, 1.0 / hidden);
    } else if (ends_with(name, "ffn.gate.bias")) {
        rule = uniform(-0.05, 0.05);
    } else if (ends_with(name, "engram.embed.weight")) {
        rule = normal(0.0, 1.0);
    } else if (ends_with(name, "engram.q_weight") || ends_with(name, "engram.k_weight")) {
        rule = normal(1.0, 0.01);
    } else if (ends_with(name, "markov_head.embed.weight")) {
        rule = normal(0.0, 1.0);
    } else if (ends_with(name, "markov_head.head.weight")) {
        rule = normal(0.0, 1.0 / r_m);
    } else if (ends_with(name, "confidence_head.proj.weight")) {
        rule = normal(0.0, 1.0 / (hidden + r_m));
    } else if (ends_with(name, "compressor.wgate.weight")) {
        rule = normal(0.0, 4.0 / hidden);
    } else if (ends_with(name, ".weight")) {
        /* Every other linear: N(0, 1/fan_in); wo_b and every w2 also scaled by 1/sqrt(2L)
         * with the backbone L, DSpark blocks included (12.9). */
        rule = normal(0.0, 1.0 / (double)n_in);
        if (ends_with(name, "attn.wo_b.weight") || ends_with(name, ".w2.weight")) {
            rule.std *= depth_scale;
        }
    } else {
        return TDM_ERR_NOT_FOUND;
    }
    *rule_out = rule;
    return TDM_OK;
}

/* A uniform double in (0, 1) from 53 random bits (never 0, so log() is finite). */
static double unit_open(uint64_t bits)
{
    return ((double)(bits >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

void init_fill(const init_rule_t *rule, uint64_t seed, const char *name, float *values,
               int64_t n)
{
    const uint64_t stream = tdm_hash_splitmix64(seed ^ tdm_hash_xxh3_64(name, strlen(name)));

    for (int64_t i = 0; i < n; i++) {
        double value;
        switch (rule->kind) {
        case INIT_CONST:
            value = rule->mean;
            break;
        case INIT_UNIFORM:
            value = rule->lo + (rule->hi - rule->lo) *
                                   unit_open(tdm_hash_splitmix64(stream + (uint64_t)i));
            break;
        case INIT_NORMAL:
        default: {
            /* Box-Muller over the pair (2k, 2k+1); element i takes the cos or sin half. */
            uint64_t pair = (uint64_t)(i / 2) * 2;
            double u1 = unit_open(tdm_hash_splitmix64(stream + pair));
            double u2 = unit_open(tdm_hash_splitmix64(stream + pair + 1));
            double radius = sqrt(-2.0 * log(u1));
            double z = (i % 2 == 0) ? radius * cos(INIT_TWO_PI * u2)
                                    : radius * sin(INIT_TWO_PI * u2);
            value = rule->mean + rule->std * z;
            break;
        }
        }
        values[i] = (float)value;
    }
}
