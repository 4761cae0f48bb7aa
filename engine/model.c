/* model.c - checkpoint loading into the compute layout, RoPE tables, model fingerprint
 * (engine/model.h). */
#include "engine/model.h"

#include "common/buf.h"
#include "common/clock.h"
#include "common/fingerprint.h"
#include "common/log.h"
#include "engine/inventory.h"
#include "engine/model_impl.h"
#include "kernels/codec.h"
#include "kernels/comm.h"
#include "kernels/rope.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NAME_BYTES 160

void engine_model_params_default(engine_model_params_t *params)
{
    memset(params, 0, sizeof(*params));
    params->n_threads = 1;
    params->ops = kern_ops_cpu();
}

/* Track a buffer the model owns. */
static void *model_alloc(engine_model_t *model, size_t n_bytes)
{
    void *p;
    if (model->n_allocs == model->cap_allocs) {
        void **grown = tdm_array_grow(model->allocs, sizeof(*grown), model->n_allocs + 1, 256,
                                      &model->cap_allocs);
        if (grown == NULL) {
            return NULL;
        }
        model->allocs = grown;
    }
    p = malloc(n_bytes == 0 ? 1 : n_bytes);
    if (p != NULL) {
        model->allocs[model->n_allocs++] = p;
        model->weight_bytes += n_bytes;
    }
    return p;
}

/* n_bytes at *ptr (host memory) copied once into backend memory (ops->mem_alloc + H2D) when
 * host code may not read the backend's memory; *ptr then points at the copy, and a host buffer
 * the loader made for it (widened vector, copied or expanded matrix, RoPE table: the last
 * model_alloc) is freed. No-op for a host_memory backend or a NULL *ptr. The copy is freed at
 * destroy. */
static tdm_status_t model_upload(engine_model_t *model, const void **ptr, size_t n_bytes)
{
    const kern_ops_t *ops = model->params.ops;
    void *dev = NULL;
    tdm_status_t st;

    if (ops->host_memory || *ptr == NULL) {
        return TDM_OK;
    }
    if (model->n_dev_allocs == model->cap_dev_allocs) {
        void **grown = tdm_array_grow(model->dev_allocs, sizeof(*grown), model->n_dev_allocs + 1,
                                      256, &model->cap_dev_allocs);
        if (grown == NULL) {
            return TDM_ERR_NO_MEMORY;
        }
        model->dev_allocs = grown;
    }
    st = ops->mem_alloc(NULL, n_bytes, &dev);
    if (st != TDM_OK) {
        return st;
    }
    model->dev_allocs[model->n_dev_allocs++] = dev;
    model->dev_bytes += n_bytes;
    st = ops->mem_copy(NULL, dev, *ptr, n_bytes, KERN_COPY_H2D);
    if (st != TDM_OK) {
        return st;
    }
    /* a host buffer the loader just made for it (the last model_alloc) is not needed again */
    if (model->n_allocs > 0 && model->allocs[model->n_allocs - 1] == *ptr) {
        free(model->allocs[--model->n_allocs]);
        model->weight_bytes -= n_bytes;
    }
    *ptr = dev;
    return TDM_OK;
}

/* The scale bytes of a stored matrix (kern_mat_bytes minus its data). */
static size_t mat_scale_bytes(const kern_mat_t *m)
{
    switch (m->dtype) {
    case KERN_MAT_FP8:
        return (size_t)((m->n_out + 31) / 32 * (m->n_in / 32));
    case KERN_MAT_MXFP4:
        return (size_t)(m->n_out * (m->n_in / 32));
    default:
        return 0;
    }
}

/* A matrix's data and scales uploaded as stored (model_upload). */
static tdm_status_t model_upload_mat(engine_model_t *model, kern_mat_t *m)
{
    size_t scale_bytes = mat_scale_bytes(m);
    const void *scales = m->scales;
    tdm_status_t st = model_upload(model, &m->data, (size_t)kern_mat_bytes(m) - scale_bytes);

    if (st == TDM_OK && scale_bytes > 0) {
        st = model_upload(model, &scales, scale_bytes);
        m->scales = scales;
    }
    return st;
}

typedef struct {
    engine_model_t *model;
    char *err;
    size_t err_bytes;
} loader_t;

static const engine_st_tensor_t *need(loader_t *ld, const char *name, engine_dtype_t dtype,
                                      int64_t n0, int64_t n1, tdm_status_t *status)
{
    const engine_st_tensor_t *t = engine_weights_find(ld->model->weights, name);
    int64_t want1 = n1 < 0 ? 0 : n1;
    if (t == NULL) {
        snprintf(ld->err, ld->err_bytes, "%s: missing", name);
        *status = TDM_ERR_NOT_FOUND;
        return NULL;
    }
    if (!(t->dtype == dtype || (dtype == ENGINE_DTYPE_I8 && t->dtype == ENGINE_DTYPE_U8)) ||
        t->shape[0] != n0 || (n1 >= 0 && (t->n_dims != 2 || t->shape[1] != want1)) ||
        (n1 < 0 && t->n_dims != 1)) {
        snprintf(ld->err, ld->err_bytes, "%s: dtype %s or shape unexpected", name,
                 engine_dtype_name(t->dtype));
        *status = TDM_ERR_MISMATCH;
        return NULL;
    }
    return t;
}

/* t's n BF16 or F32 values widened to FP32 in model memory, counted as resident vectors. */
static const float *widen_to_f32(loader_t *ld, const engine_st_tensor_t *t, engine_dtype_t dtype,
                                 int64_t n, tdm_status_t *status)
{
    float *v = model_alloc(ld->model, (size_t)n * sizeof(float));
    if (v == NULL) {
        *status = TDM_ERR_NO_MEMORY;
        return NULL;
    }
    ld->model->resident.vectors += (uint64_t)n * sizeof(float);
    ld->model->resident.n_params += (uint64_t)n;
    if (dtype == ENGINE_DTYPE_F32) {
        memcpy(v, t->data, (size_t)n * sizeof(float));
    } else {
        for (int64_t i = 0; i < n; i++) {
            uint16_t b;
            memcpy(&b, (const uint8_t *)t->data + 2 * i, 2);
            v[i] = kern_bf16_to_f32(b);
        }
    }
    {
        const void *p = v;
        *status = model_upload(ld->model, &p, (size_t)n * sizeof(float));
        return *status == TDM_OK ? p : NULL;
    }
}

/* A BF16 or F32 vector [n] widened to FP32. */
static const float *load_vec(loader_t *ld, const char *name, engine_dtype_t dtype, int64_t n,
                             tdm_status_t *status)
{
    const engine_st_tensor_t *t = need(ld, name, dtype, n, -1, status);
    if (t == NULL) {
        return NULL;
    }
    return widen_to_f32(ld, t, dtype, n, status);
}

/* A BF16 matrix [n / cols, cols] widened to FP32 [n]. */
static const float *load_mat_vec_bf16(loader_t *ld, const char *name, int64_t n, int64_t cols,
                                      tdm_status_t *status)
{
    const engine_st_tensor_t *t = need(ld, name, ENGINE_DTYPE_BF16, n / cols, cols, status);
    if (t == NULL) {
        return NULL;
    }
    return widen_to_f32(ld, t, ENGINE_DTYPE_BF16, n, status);
}

/* The checkpoint formats a matrix can be stored in. */
typedef enum { MAT_BF16, MAT_F32, MAT_FP8, MAT_FP4 } mat_format_t;

/* A tensor's data used in place when its element alignment allows (safetensors data offsets
 * need not be aligned): 1, else 0 (then copied). */
static int aligned_for(const void *p, size_t elem)
{
    return ((uintptr_t)p % elem) == 0;
}

/* The checkpoint tensors of `module` as a kern_mat_t pointing into the mapped files (nothing
 * copied, nothing checked beyond dtype and shape). */
static tdm_status_t find_mat(loader_t *ld, const char *module, mat_format_t fmt, int64_t n_out,
                             int64_t n_in, kern_mat_t *mat_out)
{
    char name[NAME_BYTES];
    char sname[NAME_BYTES];
    tdm_status_t status = TDM_OK;
    const engine_st_tensor_t *w;
    const engine_st_tensor_t *s = NULL;

    snprintf(name, sizeof(name), "%s%s", module, fmt == MAT_F32 ? "" : ".weight");
    snprintf(sname, sizeof(sname), "%s.scale", module);
    switch (fmt) {
    case MAT_F32:
        w = need(ld, name, ENGINE_DTYPE_F32, n_out, n_in, &status);
        break;
    case MAT_BF16:
        w = need(ld, name, ENGINE_DTYPE_BF16, n_out, n_in, &status);
        break;
    case MAT_FP8:
        w = need(ld, name, ENGINE_DTYPE_F8_E4M3, n_out, n_in, &status);
        s = w == NULL ? NULL
                      : need(ld, sname, ENGINE_DTYPE_F8_E8M0, (n_out + 31) / 32, (n_in + 31) / 32,
                             &status);
        break;
    default:
        w = need(ld, name, ENGINE_DTYPE_I8, n_out, n_in / 2, &status);
        s = w == NULL ? NULL : need(ld, sname, ENGINE_DTYPE_F8_E8M0, n_out, n_in / 32, &status);
        break;
    }
    if (status != TDM_OK) {
        return status;
    }
    static const kern_mat_dtype_t dtypes[] = {KERN_MAT_BF16, KERN_MAT_F32, KERN_MAT_FP8,
                                              KERN_MAT_MXFP4};
    *mat_out = (kern_mat_t){dtypes[fmt], n_out, n_in, w->data, s == NULL ? NULL : s->data, NULL};
    return TDM_OK;
}

/* The stored matrix m (find_mat) into dst as BF16 bits (FP8 / FP4 dequantized exactly, BF16
 * copied) or FP32 (F32 copied). */
static tdm_status_t copy_rows(const kern_mat_t *m, mat_format_t fmt, void *dst)
{
    switch (fmt) {
    case MAT_F32:
        memcpy(dst, m->data, (size_t)(m->n_out * m->n_in) * sizeof(float));
        return TDM_OK;
    case MAT_BF16:
        memcpy(dst, m->data, (size_t)(m->n_out * m->n_in) * sizeof(uint16_t));
        return TDM_OK;
    case MAT_FP8:
        return kern_mat_bf16_from_fp8(m->data, m->scales, m->n_out, m->n_in, dst);
    default:
        return kern_mat_bf16_from_mxfp4(m->data, m->scales, m->n_out, m->n_in, dst);
    }
}

static tdm_status_t load_mat_host(loader_t *ld, const char *module, mat_format_t fmt, int64_t n_out,
                                  int64_t n_in, kern_mat_t *mat_out);

/* lw->experts, the routed experts as ops->moe_ffn reads them: the descriptor arrays, and for a
 * backend whose memory the host may not read the table of their pointers in backend memory
 * (kern_moe_table_fill, uploaded once; a host_memory backend does not need it). */
static tdm_status_t model_experts_view(engine_model_t *model, engine_layer_weights_t *lw)
{
    size_t bytes = (size_t)KERN_MOE_TABLE_LEN(lw->n_experts) * sizeof(void *);
    const void **table;
    tdm_status_t st;

    lw->experts = (kern_moe_experts_t){lw->n_experts, lw->w1, lw->w3, lw->w2, NULL};
    if (model->params.ops->host_memory) {
        return TDM_OK;
    }
    table = model_alloc(model, bytes);
    if (table == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    st = kern_moe_table_fill(&lw->experts, table);
    if (st == TDM_OK) {
        st = model_upload(model, (const void **)&table, bytes);
    }
    if (st == TDM_OK) {
        lw->experts.table = (const void *const *)table;
    }
    return st;
}

/* load_mat_host's matrix, then uploaded to backend memory (model_upload_mat). */
static tdm_status_t load_mat(loader_t *ld, const char *module, mat_format_t fmt, int64_t n_out,
                             int64_t n_in, kern_mat_t *mat_out)
{
    tdm_status_t st = load_mat_host(ld, module, fmt, n_out, n_in, mat_out);
    return st == TDM_OK ? model_upload_mat(ld->model, mat_out) : st;
}

/*
 * A weight matrix in its resident format: FP8 / MXFP4 as stored (unless params.expand_bf16 or
 * scales outside the exact range: then expanded to BF16), BF16 / F32 in place when aligned,
 * else copied. Counts the bytes into model->resident.
 */
static tdm_status_t load_mat_host(loader_t *ld, const char *module, mat_format_t fmt, int64_t n_out,
                                  int64_t n_in, kern_mat_t *mat_out)
{
    engine_model_t *model = ld->model;
    engine_model_resident_t *res = &model->resident;
    size_t elem = fmt == MAT_F32 ? sizeof(float) : sizeof(uint16_t);
    kern_mat_t m;
    void *buf;
    tdm_status_t status = find_mat(ld, module, fmt, n_out, n_in, &m);

    if (status != TDM_OK) {
        return status;
    }
    res->n_params += (uint64_t)(n_out * n_in);
    if (fmt == MAT_FP8 || fmt == MAT_FP4) {
        if (!model->params.expand_bf16) {
            if (kern_mat_check_quantized(&m)) {
                uint64_t n_codes = (uint64_t)(fmt == MAT_FP8 ? n_out * n_in : n_out * n_in / 2);
                *(fmt == MAT_FP8 ? &res->fp8 : &res->mxfp4) += n_codes;
                res->scales += (uint64_t)kern_mat_bytes(&m) - n_codes;
                if (fmt == MAT_FP8 && model->params.ops->host_memory) {
                    /* the CPU kernels' clean-block map (kernels/gemm.h; a speed hint) */
                    uint8_t *map = model_alloc(model, (size_t)kern_mat_fp8_clean_bytes(&m));
                    if (map == NULL) {
                        return TDM_ERR_NO_MEMORY;
                    }
                    status = kern_mat_fp8_clean_fill(&m, map);
                    if (status != TDM_OK) {
                        return status;
                    }
                    m.fp8_clean = map;
                }
                *mat_out = m;
                return TDM_OK;
            }
            tdm_log(TDM_LOG_INFO, "engine",
                    "%s: scales outside the exact in-register range; expanded to BF16", module);
        }
    } else if (aligned_for(m.data, elem)) {
        *(fmt == MAT_F32 ? &res->f32 : &res->bf16) += (uint64_t)kern_mat_bytes(&m);
        *mat_out = m;
        return TDM_OK;
    }
    buf = model_alloc(model, (size_t)(n_out * n_in) * elem);
    if (buf == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    status = copy_rows(&m, fmt, buf);
    if (status != TDM_OK) {
        return status;
    }
    *(fmt == MAT_F32 ? &res->f32 : fmt == MAT_BF16 ? &res->bf16 : &res->expanded) +=
        (uint64_t)(n_out * n_in) * elem;
    *mat_out =
        (kern_mat_t){fmt == MAT_F32 ? KERN_MAT_F32 : KERN_MAT_BF16, n_out, n_in, buf, NULL, NULL};
    return TDM_OK;
}

/* BF16 rows [n_out, n_in] read by row (embedding, Markov embedding): in place when aligned. */
static const uint16_t *load_bf16_rows(loader_t *ld, const char *module, int64_t n_out,
                                      int64_t n_in, tdm_status_t *status)
{
    kern_mat_t m;
    *status = load_mat(ld, module, MAT_BF16, n_out, n_in, &m);
    return *status == TDM_OK ? m.data : NULL;
}

/* prefix + suffix into buf (names are short: truncation is a load error downstream). */
static const char *join_name(char *buf, size_t buf_bytes, const char *prefix, const char *suffix)
{
    size_t n_prefix = strlen(prefix);
    size_t n_suffix = strlen(suffix);
    if (n_prefix + n_suffix + 1 > buf_bytes) {
        buf[0] = '\0';
        return buf;
    }
    memcpy(buf, prefix, n_prefix);
    memcpy(buf + n_prefix, suffix, n_suffix + 1);
    return buf;
}

static tdm_status_t load_layer(loader_t *ld, int l)
{
    engine_model_t *model = ld->model;
    const engine_config_t *c = &model->cfg;
    const engine_layer_role_t *role = &c->roles[l];
    engine_layer_weights_t *lw = &model->layers[l];
    int64_t H = c->hidden_size, d = c->head_dim, m = c->hc_mult, n_h = c->num_attention_heads;
    int64_t rq = c->q_lora_rank, G = c->o_groups, ro = c->o_lora_rank, I = c->moe_intermediate_size;
    int64_t HI = c->index_n_heads, dI = c->index_head_dim;
    int64_t n_mix = (2 + m) * m;
    int dspark = l >= c->n_layers;
    char p[32];
    char n[NAME_BYTES];
    char n3[NAME_BYTES];
    tdm_status_t st = TDM_OK;
    const char *site_name[ENGINE_N_SITES] = {"attn", "ffn"};

    if (dspark) {
        snprintf(p, sizeof(p), "mtp.%d.", l - c->n_layers);
    } else {
        snprintf(p, sizeof(p), "layers.%d.", l);
    }
    lw->attn_norm = load_vec(ld, join_name(n, sizeof(n), p, "attn_norm.weight"), ENGINE_DTYPE_BF16, H, &st);
    if (st == TDM_OK) {
        lw->ffn_norm = load_vec(ld, join_name(n, sizeof(n), p, "ffn_norm.weight"), ENGINE_DTYPE_BF16, H, &st);
    }
    for (int s = 0; s < ENGINE_N_SITES && st == TDM_OK; s++) {
        char sfx[64];
        snprintf(sfx, sizeof(sfx), "hc_%s_fn", site_name[s]);
        st = load_mat(ld, join_name(n, sizeof(n), p, sfx), MAT_F32, n_mix, m * H, &lw->hc_fn[s]);
        if (st == TDM_OK) {
            snprintf(sfx, sizeof(sfx), "hc_%s_base", site_name[s]);
            lw->hc_base[s] = load_vec(ld, join_name(n, sizeof(n), p, sfx), ENGINE_DTYPE_F32, n_mix, &st);
        }
        if (st == TDM_OK) {
            snprintf(sfx, sizeof(sfx), "hc_%s_scale", site_name[s]);
            lw->hc_scale[s] = load_vec(ld, join_name(n, sizeof(n), p, sfx), ENGINE_DTYPE_F32, 3, &st);
        }
    }
    if (st == TDM_OK) {
        st = load_mat(ld, join_name(n, sizeof(n), p, "attn.wq_a"), MAT_FP8, rq, H, &lw->wq_a);
    }
    if (st == TDM_OK) {
        st = load_mat(ld, join_name(n, sizeof(n), p, "attn.wq_b"), MAT_FP8, n_h * d, rq, &lw->wq_b);
    }
    if (st == TDM_OK) {
        st = load_mat(ld, join_name(n, sizeof(n), p, "attn.wkv"), MAT_FP8, d, H, &lw->wkv);
    }
    if (st == TDM_OK) {
        st = load_mat(ld, join_name(n, sizeof(n), p, "attn.wo_a"), MAT_FP8, G * ro, n_h * d / G, &lw->wo_a);
    }
    if (st == TDM_OK) {
        st = load_mat(ld, join_name(n, sizeof(n), p, "attn.wo_b"), MAT_FP8, H, G * ro, &lw->wo_b);
    }
    if (st == TDM_OK) {
        lw->q_norm = load_vec(ld, join_name(n, sizeof(n), p, "attn.q_norm.weight"), ENGINE_DTYPE_BF16, rq, &st);
    }
    if (st == TDM_OK) {
        lw->kv_norm = load_vec(ld, join_name(n, sizeof(n), p, "attn.kv_norm.weight"), ENGINE_DTYPE_BF16, d, &st);
    }
    if (st == TDM_OK) {
        lw->attn_sink = load_vec(ld, join_name(n, sizeof(n), p, "attn.attn_sink"), ENGINE_DTYPE_F32, n_h, &st);
    }
    if (st == TDM_OK && (role->flags & ENGINE_ROLE_KV_SOURCE) != 0) {
        st = load_mat(ld, join_name(n, sizeof(n), p, "attn.compressor.wkv"), MAT_BF16, d, H, &lw->c_wkv);
        if (st == TDM_OK) {
            lw->c_norm = load_vec(ld, join_name(n, sizeof(n), p, "attn.compressor.norm.weight"), ENGINE_DTYPE_BF16, d,
                                  &st);
        }
        if (st == TDM_OK && role->ratio == 2) {
            st = load_mat(ld, join_name(n, sizeof(n), p, "attn.compressor.wgate"), MAT_BF16, d, H, &lw->c_wgate);
        }
    }
    if (st == TDM_OK && (role->flags & ENGINE_ROLE_INDEX_SOURCE) != 0) {
        st = load_mat(ld, join_name(n, sizeof(n), p, "attn.indexer.wq_b"), MAT_FP8, HI * dI, rq, &lw->i_wq_b);
        if (st == TDM_OK) {
            st = load_mat(ld, join_name(n, sizeof(n), p, "attn.indexer.weights_proj"), MAT_BF16, HI, H, &lw->i_wp);
        }
    }
    if (st == TDM_OK && role->kind == ENGINE_LAYER_FULL) {
        st = load_mat(ld, join_name(n, sizeof(n), p, "attn.indexer.wk"), MAT_BF16, dI, d, &lw->i_wk);
        if (st == TDM_OK) {
            lw->i_k_norm = load_vec(ld, join_name(n, sizeof(n), p, "attn.indexer.k_norm.weight"), ENGINE_DTYPE_BF16, dI,
                                    &st);
        }
    }
    lw->n_experts = (int)(dspark ? c->dspark_n_routed_experts : c->n_routed_experts);
    if (st == TDM_OK) {
        st = load_mat(ld, join_name(n, sizeof(n), p, "ffn.gate"), MAT_BF16, lw->n_experts, H, &lw->gate);
    }
    if (st == TDM_OK) {
        lw->gate_bias = load_vec(ld, join_name(n, sizeof(n), p, "ffn.gate.bias"), ENGINE_DTYPE_F32, lw->n_experts, &st);
    }
    if (st == TDM_OK) {
        lw->w1 = model_alloc(model, (size_t)lw->n_experts * sizeof(kern_mat_t));
        lw->w3 = model_alloc(model, (size_t)lw->n_experts * sizeof(kern_mat_t));
        lw->w2 = model_alloc(model, (size_t)lw->n_experts * sizeof(kern_mat_t));
        if (lw->w1 == NULL || lw->w3 == NULL || lw->w2 == NULL) {
            st = TDM_ERR_NO_MEMORY;
        } else {
            /* experts outside this shard's range stay zero: NULL data (kern_moe_experts_t) */
            memset(lw->w1, 0, (size_t)lw->n_experts * sizeof(kern_mat_t));
            memset(lw->w3, 0, (size_t)lw->n_experts * sizeof(kern_mat_t));
            memset(lw->w2, 0, (size_t)lw->n_experts * sizeof(kern_mat_t));
        }
    }
    {
        int R = model->params.ep_size > 1 ? model->params.ep_size : 1;
        engine_expert_range(lw->n_experts, R > 1 ? model->params.ep_rank : 0, R, &lw->e_begin,
                            &lw->e_end);
    }
    for (int e = lw->e_begin; e < lw->e_end && st == TDM_OK; e++) {
        char sfx[96];
        snprintf(sfx, sizeof(sfx), "%sffn.experts.%d.w1", p, e);
        snprintf(n3, sizeof(n3), "%sffn.experts.%d.w3", p, e);
        st = load_mat(ld, sfx, MAT_FP4, I, H, &lw->w1[e]);
        if (st == TDM_OK) {
            st = load_mat(ld, n3, MAT_FP4, I, H, &lw->w3[e]);
        }
        if (st == TDM_OK) {
            snprintf(sfx, sizeof(sfx), "ffn.experts.%d.w2", e);
            st = load_mat(ld, join_name(n, sizeof(n), p, sfx), MAT_FP4, H, I, &lw->w2[e]);
        }
    }
    if (st == TDM_OK) {
        st = model_experts_view(model, lw);
    }
    if (st == TDM_OK) {
        snprintf(n3, sizeof(n3), "%sffn.shared_experts.w3", p);
        char n1[NAME_BYTES];
        snprintf(n1, sizeof(n1), "%sffn.shared_experts.w1", p);
        st = load_mat(ld, n1, MAT_FP8, I, H, &lw->s_w1);
        if (st == TDM_OK) {
            st = load_mat(ld, n3, MAT_FP8, I, H, &lw->s_w3);
        }
    }
    if (st == TDM_OK) {
        st = load_mat(ld, join_name(n, sizeof(n), p, "ffn.shared_experts.w2"), MAT_FP8, H, I, &lw->s_w2);
    }
    if (st == TDM_OK && role->engram_slot >= 0 && !dspark) {
        int64_t N = c->engram_max_ngram_size, he = c->engram_n_heads, de = c->engram_head_dim;
        int64_t R = c->engram_num_embeddings[role->engram_slot];
        const engine_st_tensor_t *codes = need(ld, join_name(n, sizeof(n), p, "engram.embed.weight"),
                                               ENGINE_DTYPE_F8_E4M3, R, de, &st);
        const engine_st_tensor_t *scales =
            codes == NULL ? NULL
                          : need(ld, join_name(n, sizeof(n), p, "engram.embed.scale"), ENGINE_DTYPE_F8_E8M0, R, de / 32,
                                 &st);
        if (scales != NULL) {
            model->resident.engram += (uint64_t)(R * de + R * (de / 32));
            model->resident.n_params += (uint64_t)(R * de);
            lw->e_codes = codes->data;
            lw->e_scales = scales->data;
            lw->e_rows = R;
            st = load_mat(ld, join_name(n, sizeof(n), p, "engram.wkv"), MAT_FP8, (m + 1) * H, (N - 1) * he * de,
                          &lw->e_wkv);
        }
        if (st == TDM_OK) {
            lw->e_qw = load_mat_vec_bf16(ld, join_name(n, sizeof(n), p, "engram.q_weight"), m * H, H, &st);
        }
        if (st == TDM_OK) {
            lw->e_kw = load_mat_vec_bf16(ld, join_name(n, sizeof(n), p, "engram.k_weight"), m * H, H, &st);
        }
    }
    return st;
}

/* The DSpark heads on the last block (MODEL.md 3, 8): norm, Markov embed/head, confidence. */
static tdm_status_t load_heads(loader_t *ld, engine_model_t *model)
{
    const engine_config_t *c = &model->cfg;
    int64_t V = c->vocab_size, H = c->hidden_size, r_m = c->dspark_markov_rank;
    char p[32];
    char n[NAME_BYTES];
    tdm_status_t st = TDM_OK;
    snprintf(p, sizeof(p), "mtp.%d.", c->n_blocks - 1);
    model->mtp_norm = load_vec(ld, join_name(n, sizeof(n), p, "norm.weight"), ENGINE_DTYPE_BF16,
                               H, &st);
    if (st == TDM_OK) {
        model->markov_embed = load_bf16_rows(ld, join_name(n, sizeof(n), p, "markov_head.embed"), V,
                                             r_m, &st);
    }
    if (st == TDM_OK) {
        st = load_mat(ld, join_name(n, sizeof(n), p, "markov_head.head"), MAT_BF16, V, r_m,
                      &model->markov_head);
    }
    if (st == TDM_OK) {
        model->conf_proj = load_mat_vec_bf16(ld, join_name(n, sizeof(n), p,
                                                           "confidence_head.proj.weight"),
                                             H + r_m, H + r_m, &st);
    }
    return st;
}

static tdm_status_t load_globals(loader_t *ld)
{
    engine_model_t *model = ld->model;
    const engine_config_t *c = &model->cfg;
    int64_t V = c->vocab_size, H = c->hidden_size;
    tdm_status_t st = TDM_OK;
    model->embed = load_bf16_rows(ld, "embed", V, H, &st);
    if (st == TDM_OK) {
        model->norm = load_vec(ld, "norm.weight", ENGINE_DTYPE_BF16, H, &st);
    }
    if (st == TDM_OK) {
        st = load_mat(ld, "head", MAT_BF16, V, H, &model->head);
    }
    if (st == TDM_OK && c->n_blocks > 0) {
        st = load_mat(ld, "mtp.0.main_proj", MAT_FP8, H, c->n_dspark_target_layer_ids * H,
                      &model->main_proj);
        if (st == TDM_OK) {
            model->main_norm = load_vec(ld, "mtp.0.main_norm.weight", ENGINE_DTYPE_BF16, H, &st);
        }
        if (st == TDM_OK) {
            st = load_heads(ld, model);
        }
    }
    return st;
}

static tdm_status_t load_rope(engine_model_t *model)
{
    const engine_config_t *c = &model->cfg;
    kern_rope_yarn_t yarn = {c->rope_scaling.factor, c->rope_scaling.beta_fast,
                             c->rope_scaling.beta_slow,
                             (double)c->rope_scaling.original_max_position_embeddings};
    for (int l = 0; l < c->n_roles; l++) {
        float *f = model_alloc(model, (size_t)c->qk_rope_head_dim / 2 * sizeof(float));
        int compressed = c->roles[l].ratio > 0;
        tdm_status_t st;
        if (f == NULL) {
            return TDM_ERR_NO_MEMORY;
        }
        st = kern_rope_freqs((int)c->qk_rope_head_dim,
                             compressed ? c->compress_rope_theta : c->rope_theta,
                             compressed ? &yarn : NULL, f);
        if (st != TDM_OK) {
            return st;
        }
        {
            const void *p = f;
            st = model_upload(model, &p, (size_t)c->qk_rope_head_dim / 2 * sizeof(float));
            if (st != TDM_OK) {
                return st;
            }
            model->rope_freqs[l] = p;
        }
    }
    return TDM_OK;
}

/* One host range of an Engram table (codes or scales of a layer) and where it sits. */
typedef struct {
    const uint8_t *host;
    size_t n_bytes;
    const uint8_t **slot; /* the layer member that gets the backend address */
} engram_range_t;

static int range_cmp(const void *a, const void *b)
{
    const engram_range_t *x = a, *y = b;
    return x->host < y->host ? -1 : x->host > y->host;
}

/*
 * The Engram tables stay host memory (MODEL.md: host RAM); a backend that cannot read host
 * memory gets them through ops->host_register. Ranges that share a page are merged into one
 * registration (a backend may map whole pages: two registrations must not overlap), and each
 * table pointer becomes its backend address. No-op for a host_memory backend.
 */
static tdm_status_t register_engram(engine_model_t *model)
{
    const kern_ops_t *ops = model->params.ops;
    const engine_config_t *c = &model->cfg;
    engram_range_t ranges[2 * ENGINE_CONFIG_MAX_LAYERS];
    long sys_page = sysconf(_SC_PAGESIZE);
    uintptr_t page = sys_page > 0 ? (uintptr_t)sys_page : 4096;
    size_t n = 0;
    tdm_status_t st = TDM_OK;

    if (ops->host_memory) {
        return TDM_OK;
    }
    for (int l = 0; l < c->n_layers; l++) {
        engine_layer_weights_t *lw = &model->layers[l];
        if (lw->e_codes == NULL) {
            continue;
        }
        ranges[n++] =
            (engram_range_t){lw->e_codes, (size_t)(lw->e_rows * c->engram_head_dim), &lw->e_codes};
        ranges[n++] = (engram_range_t){
            lw->e_scales, (size_t)(lw->e_rows * (c->engram_head_dim / 32)), &lw->e_scales};
    }
    qsort(ranges, n, sizeof(ranges[0]), range_cmp);
    model->reg_ptrs = calloc(n + 1, sizeof(*model->reg_ptrs));
    model->reg_bytes = calloc(n + 1, sizeof(*model->reg_bytes));
    if (model->reg_ptrs == NULL || model->reg_bytes == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    for (size_t i = 0; i < n && st == TDM_OK;) {
        const uint8_t *lo = ranges[i].host;
        uintptr_t hi = (uintptr_t)lo + ranges[i].n_bytes;
        size_t j = i + 1;
        const void *dev = NULL;
        while (j < n &&
               ((uintptr_t)ranges[j].host & ~(page - 1)) <= ((hi + page - 1) & ~(page - 1))) {
            uintptr_t end = (uintptr_t)ranges[j].host + ranges[j].n_bytes;
            hi = end > hi ? end : hi;
            j++;
        }
        st = ops->host_register(NULL, lo, (size_t)(hi - (uintptr_t)lo), &dev);
        if (st != TDM_OK) {
            break;
        }
        model->reg_ptrs[model->n_regs] = lo;
        model->reg_bytes[model->n_regs++] = (size_t)(hi - (uintptr_t)lo);
        for (; i < j; i++) {
            *ranges[i].slot = (const uint8_t *)dev + (ranges[i].host - lo);
        }
    }
    return st;
}

/* Load progress (a full-size model takes minutes): a debug line per step with its time and
 * the bytes uploaded so far; an info line at most every LOAD_PROGRESS_NS while layers load. */
#define LOAD_PROGRESS_NS (2ull * 1000000000ull)

static void load_note(const engine_model_t *model, const char *step, uint64_t t_start_ns)
{
    uint64_t now = tdm_clock_now_ns();
    tdm_log(TDM_LOG_DEBUG, "engine",
            "model load: %s done at %.1f ms (%.1f MB on the host, %.1f MB in %s memory)", step,
            (double)(now - t_start_ns) / 1e6, (double)model->weight_bytes / 1e6,
            (double)model->dev_bytes / 1e6, model->params.ops->name);
}

static void load_progress(const engine_model_t *model, int layer, uint64_t t_start_ns,
                          uint64_t *last_ns)
{
    uint64_t now = tdm_clock_now_ns();
    double s = (double)(now - t_start_ns) / 1e9;

    if (now - *last_ns < LOAD_PROGRESS_NS) {
        return;
    }
    *last_ns = now;
    tdm_log(TDM_LOG_INFO, "engine",
            "model load: layer %d of %d after %.1f s, %.1f MB uploaded to %s memory (%.0f MB/s)",
            layer + 1, model->cfg.n_roles, s, (double)model->dev_bytes / 1e6,
            model->params.ops->name, s > 0.0 ? (double)model->dev_bytes / 1e6 / s : 0.0);
}

tdm_status_t engine_model_load(const char *dir, const engine_model_params_t *params,
                               engine_model_t **model_out, char *err, size_t err_bytes)
{
    engine_model_t *model;
    engine_tensor_spec_t *specs = NULL;
    size_t n_specs = 0;
    uint64_t t_start, t_last;
    loader_t ld;
    char local_err[256];
    tdm_status_t st;

    if (err == NULL || err_bytes == 0) {
        err = local_err;
        err_bytes = sizeof(local_err);
    }
    err[0] = '\0';
    if (dir == NULL || params == NULL || model_out == NULL || params->n_threads < 1) {
        snprintf(err, err_bytes, "engine_model_load: invalid argument");
        return TDM_ERR_INVALID_ARG;
    }
    if (params->ep_size < 0 || params->ep_size > KERN_COMM_MAX_RANKS || params->ep_rank < 0 ||
        (params->ep_size > 1 ? params->ep_rank >= params->ep_size : params->ep_rank != 0)) {
        snprintf(err, err_bytes,
                 "engine_model_load: expert-parallel rank %d of %d (ranks are 0..size-1, size "
                 "1..%d)",
                 params->ep_rank, params->ep_size, KERN_COMM_MAX_RANKS);
        return TDM_ERR_INVALID_ARG;
    }
    model = calloc(1, sizeof(*model));
    if (model == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    model->params = *params;
    if (model->params.ops == NULL) {
        model->params.ops = kern_ops_cpu();
    }
    st = engine_config_load(dir, &model->cfg, err, err_bytes);
    if (st != TDM_OK) {
        goto err_free;
    }
    st = engine_weights_open(dir, &model->weights, err, err_bytes);
    if (st != TDM_OK) {
        goto err_free;
    }
    if (!params->skip_weight_check) {
        st = engine_inventory_build(&model->cfg, &specs, &n_specs);
        if (st == TDM_OK) {
            st = engine_weights_check(model->weights, specs, n_specs, err, err_bytes);
        }
        free(specs);
        if (st != TDM_OK) {
            goto err_free;
        }
    }
    if (model->params.ops->host_memory && !params->map_weights) {
        /* after the check (which reads headers only: a refused checkpoint is never copied),
         * before any tensor pointer is taken (engine_weights_copy_resident) */
        uint64_t huge = 0;
        st = engine_weights_copy_resident(model->weights, &huge, err, err_bytes);
        if (st != TDM_OK) {
            goto err_free;
        }
        tdm_log(TDM_LOG_INFO, "engine",
                "weights copied into anonymous memory: %.1f MB advised for 2 MiB pages%s",
                (double)huge / 1e6, huge == 0 ? " (advice refused: 4 KiB pages)" : "");
    }
    if (model->cfg.n_engram_layer_ids > 0) {
        st = engine_engram_sidecar_load(dir, &model->cfg, &model->sidecar, err, err_bytes);
        if (st == TDM_OK) {
            st = engine_engram_layout_init(&model->cfg, &model->engram_layout);
        }
        if (st != TDM_OK) {
            goto err_free;
        }
    }
    ld.model = model;
    ld.err = err;
    ld.err_bytes = err_bytes;
    t_start = tdm_clock_now_ns();
    t_last = t_start;
    load_note(model, "checks", t_start);
    st = load_globals(&ld);
    if (st == TDM_OK) {
        load_note(model, "embedding, head and globals", t_start);
    }
    for (int l = 0; l < model->cfg.n_roles && st == TDM_OK; l++) {
        st = load_layer(&ld, l);
        if (st == TDM_OK) {
            char step[32];
            snprintf(step, sizeof(step), "layer %d", l);
            load_note(model, step, t_start);
            load_progress(model, l, t_start, &t_last);
        }
    }
    if (st == TDM_OK) {
        st = load_rope(model);
    }
    if (st == TDM_OK) {
        load_note(model, "rope tables", t_start);
        st = register_engram(model);
    }
    if (st == TDM_OK) {
        load_note(model, "engram tables registered", t_start);
        st = tdm_model_fingerprint(dir, &model->fingerprint, err, err_bytes);
    }
    if (st != TDM_OK) {
        goto err_free;
    }
    {
        const engine_model_resident_t *r = &model->resident;
        uint64_t total = engine_model_resident_total(r);
        tdm_log(TDM_LOG_INFO, "engine",
                "model resident: %.1f MB for %.1f M params = %.3f B/param (fp8 %.1f, mxfp4 %.1f, "
                "scales %.1f, bf16 %.1f, f32 %.1f, expanded-to-bf16 %.1f, vectors %.1f, "
                "engram tables %.1f MB); allocated %.1f MB",
                (double)total / 1e6, (double)r->n_params / 1e6,
                r->n_params > 0 ? (double)total / (double)r->n_params : 0.0,
                (double)r->fp8 / 1e6, (double)r->mxfp4 / 1e6, (double)r->scales / 1e6,
                (double)r->bf16 / 1e6, (double)r->f32 / 1e6, (double)r->expanded / 1e6,
                (double)r->vectors / 1e6, (double)r->engram / 1e6,
                (double)model->weight_bytes / 1e6);
        if (model->dev_bytes > 0) {
            tdm_log(TDM_LOG_INFO, "engine", "model weights uploaded to %s memory: %.1f MB",
                    model->params.ops->name, (double)model->dev_bytes / 1e6);
        }
    }
    *model_out = model;
    return TDM_OK;

err_free:
    if (err[0] == '\0') {
        snprintf(err, err_bytes, "%s: %s", dir, tdm_status_message(st));
    }
    engine_model_destroy(model);
    return st;
}

void engine_model_destroy(engine_model_t *model)
{
    if (model == NULL) {
        return;
    }
    for (size_t i = 0; i < model->n_allocs; i++) {
        free(model->allocs[i]);
    }
    free(model->allocs);
    for (size_t i = 0; i < model->n_regs; i++) {
        model->params.ops->host_unregister(NULL, model->reg_ptrs[i], model->reg_bytes[i]);
    }
    free(model->reg_ptrs);
    free(model->reg_bytes);
    for (size_t i = 0; i < model->n_dev_allocs; i++) {
        model->params.ops->mem_free(NULL, model->dev_allocs[i]);
    }
    free(model->dev_allocs);
    engine_engram_sidecar_fini(&model->sidecar);
    engine_weights_close(model->weights);
    free(model);
}

const engine_config_t *engine_model_config(const engine_model_t *model)
{
    return &model->cfg;
}

uint64_t engine_model_fingerprint(const engine_model_t *model)
{
    return model->fingerprint;
}

const kern_ops_t *engine_model_ops(const engine_model_t *model)
{
    return model->params.ops;
}

int engine_model_n_threads(const engine_model_t *model)
{
    return model->params.n_threads;
}

const float *engine_model_rope_freqs(const engine_model_t *model, int layer)
{
    if (layer < 0 || layer >= model->cfg.n_roles) {
        return NULL;
    }
    return model->rope_freqs[layer];
}

void engine_model_resident(const engine_model_t *model, engine_model_resident_t *out)
{
    *out = model->resident;
}

void engine_expert_range(int64_t E, int r, int R, int *begin, int *end)
{
    int64_t base = E / R, extra = E % R;
    *begin = (int)(r * base + (r < extra ? r : extra));
    *end = (int)(*begin + base + (r < extra ? 1 : 0));
}

tdm_status_t engine_model_expert_shard(const engine_model_t *model, int layer, int *begin, int *end,
                                       int *ep_rank, int *ep_size)
{
    if (model == NULL || begin == NULL || end == NULL || ep_rank == NULL || ep_size == NULL ||
        layer < 0 || layer >= model->cfg.n_roles) {
        return TDM_ERR_INVALID_ARG;
    }
    *begin = model->layers[layer].e_begin;
    *end = model->layers[layer].e_end;
    *ep_size = model->params.ep_size > 1 ? model->params.ep_size : 1;
    *ep_rank = *ep_size > 1 ? model->params.ep_rank : 0;
    return TDM_OK;
}

uint64_t engine_model_resident_total(const engine_model_resident_t *r)
{
    return r->fp8 + r->mxfp4 + r->scales + r->bf16 + r->f32 + r->expanded + r->vectors +
           r->engram;
}

uint64_t engine_model_weight_bytes(const engine_model_t *model)
{
    return model->weight_bytes;
}
