/* forward_counters.c - the forward context's read and FLOP counters for rooflines
 * (engine_fwd_read_bytes, engine_fwd_attn_flops, engine_fwd_reset_read_bytes;
 * engine/forward.h): what fwd_gemm and
 * the KV readers add up on the host, plus the routed experts ops->moe_ffn counted on the
 * backend. */
#include "engine/forward.h"
#include "engine/forward_impl.h"

#include <stdint.h>
#include <stdlib.h>

/* Bytes of the routed experts ops->moe_ffn ran: each expert's count (read from the backend)
 * times its own w1 + w3 + w2 (the loader may have expanded one expert of a layer to BF16). */
static uint64_t moe_expert_bytes(engine_fwd_t *fwd)
{
    const engine_config_t *c = fwd->cfg;
    int64_t n = (int64_t)(c->n_layers + c->n_blocks) * fwd->moe_e_max;
    int64_t *counts = malloc((size_t)n * sizeof(int64_t));
    uint64_t total = 0;

    if (counts == NULL || fwd->moe_active == NULL ||
        fwd->ops->mem_copy(&fwd->kctx, counts, fwd->moe_active, (size_t)n * sizeof(int64_t),
                           KERN_COPY_D2H) != TDM_OK) {
        free(counts);
        return 0;
    }
    for (int l = 0; l < c->n_layers + c->n_blocks; l++) {
        const engine_layer_weights_t *lw = &fwd->model->layers[l];
        for (int e = lw->e_begin; e < lw->e_end; e++) {
            int64_t k = counts[(int64_t)l * fwd->moe_e_max + e];
            if (k > 0) {
                total += (uint64_t)k *
                         (uint64_t)(kern_mat_bytes(&lw->w1[e]) + kern_mat_bytes(&lw->w3[e]) +
                                    kern_mat_bytes(&lw->w2[e]));
            }
        }
    }
    free(counts);
    return total;
}

void engine_fwd_read_bytes(engine_fwd_t *fwd, uint64_t *weight_bytes_out, uint64_t *kv_bytes_out)
{
    if (weight_bytes_out != NULL) {
        *weight_bytes_out = fwd != NULL ? fwd->read_weight_bytes + moe_expert_bytes(fwd) : 0;
    }
    if (kv_bytes_out != NULL) {
        *kv_bytes_out = fwd != NULL ? fwd->read_kv_bytes : 0;
    }
}

uint64_t engine_fwd_attn_flops(const engine_fwd_t *fwd)
{
    return fwd != NULL ? fwd->attn_flops : 0;
}

void engine_fwd_reset_read_bytes(engine_fwd_t *fwd)
{
    if (fwd != NULL) {
        fwd->read_weight_bytes = 0;
        fwd->read_kv_bytes = 0;
        fwd->attn_flops = 0;
        if (fwd->moe_active != NULL) {
            (void)fwd->ops->mem_set(&fwd->kctx, fwd->moe_active, 0,
                                    (size_t)(fwd->cfg->n_layers + fwd->cfg->n_blocks) *
                                        (size_t)fwd->moe_e_max * sizeof(int64_t));
        }
    }
}
