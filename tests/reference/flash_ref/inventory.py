"""Tensor inventory of MODEL.md section 3 (used by the random-checkpoint writer and for
parameter counts). Each entry: (name, kind, shape, init) with kind in
bf16 / f32 / fp8 / fp4 / engram and init a (distribution, parameter) pair of 9.1:
('normal', variance), ('const', value), ('uniform', bound), ('one_plus_normal', variance).
"""
import math


def inventory(cfg):
    H, V, L, m = cfg.H, cfg.V, cfg.L, cfg.m
    nh, d, rq, G, ro = cfg.n_h, cfg.d, cfg.q_lora_rank, cfg.o_groups, cfg.o_lora_rank
    I = cfg.moe_intermediate_size
    HI, dI = cfg.index_n_heads, cfg.index_head_dim
    N, he, de = cfg.engram_max_ngram_size, cfg.engram_n_heads, cfg.engram_head_dim
    out_scale = 1.0 / (2 * L)          # variance factor of (1/sqrt(2L))^2, backbone L (12.9)
    ent = []

    def add(name, kind, shape, init):
        ent.append((name, kind, tuple(shape), init))

    def lin(name, kind, o, i, extra=1.0):
        add(name, kind, (o, i), ("normal", extra / i))

    add("embed.weight", "bf16", (V, H), ("normal", 1.0))
    add("head.weight", "bf16", (V, H), ("normal", 1.0 / H))
    add("norm.weight", "bf16", (H,), ("const", 1.0))

    def block(p, ratio, E, is_backbone_layer, l):
        add(p + "attn_norm.weight", "bf16", (H,), ("const", 1.0))
        add(p + "ffn_norm.weight", "bf16", (H,), ("const", 1.0))
        for site in ("attn", "ffn"):
            add(p + "hc_%s_fn" % site, "f32", ((2 + m) * m, m * H), ("normal", 1.0 / (m * H)))
            add(p + "hc_%s_base" % site, "f32", ((2 + m) * m,), ("normal", 0.25))
            add(p + "hc_%s_scale" % site, "f32", (3,), ("const", 0.5))
        lin(p + "attn.wq_a.weight", "fp8", rq, H)
        lin(p + "attn.wq_b.weight", "fp8", nh * d, rq)
        add(p + "attn.q_norm.weight", "bf16", (rq,), ("const", 1.0))
        add(p + "attn.kv_norm.weight", "bf16", (d,), ("const", 1.0))
        lin(p + "attn.wkv.weight", "fp8", d, H)
        lin(p + "attn.wo_a.weight", "fp8", G * ro, nh * d // G)
        lin(p + "attn.wo_b.weight", "fp8", H, G * ro, out_scale)
        add(p + "attn.attn_sink", "f32", (nh,), ("uniform", 1.0))
        if is_backbone_layer:
            if l in cfg.kv_source_layer_ids:
                lin(p + "attn.compressor.wkv.weight", "bf16", d, H)
                add(p + "attn.compressor.norm.weight", "bf16", (d,), ("const", 1.0))
                if ratio == 2:
                    add(p + "attn.compressor.wgate.weight", "bf16", (d, H), ("normal", 4.0 / H))
            if l in cfg.index_source_layer_ids:
                lin(p + "attn.indexer.wq_b.weight", "fp8", HI * dI, rq)
                lin(p + "attn.indexer.weights_proj.weight", "bf16", HI, H)
            if l in cfg.index_source_layer_ids and l in cfg.kv_source_layer_ids:
                lin(p + "attn.indexer.wk.weight", "bf16", dI, d)
                add(p + "attn.indexer.k_norm.weight", "bf16", (dI,), ("const", 1.0))
        add(p + "ffn.gate.weight", "bf16", (E, H), ("normal", 1.0 / H))
        add(p + "ffn.gate.bias", "f32", (E,), ("uniform", 0.05))
        for e in range(E):
            lin(p + "ffn.experts.%d.w1.weight" % e, "fp4", I, H)
            lin(p + "ffn.experts.%d.w3.weight" % e, "fp4", I, H)
            lin(p + "ffn.experts.%d.w2.weight" % e, "fp4", H, I, out_scale)
        lin(p + "ffn.shared_experts.w1.weight", "fp8", I, H)
        lin(p + "ffn.shared_experts.w3.weight", "fp8", I, H)
        lin(p + "ffn.shared_experts.w2.weight", "fp8", H, I, out_scale)

    for l in range(L):
        p = "layers.%d." % l
        block(p, cfg.ratios[l], cfg.E, True, l)
        if l in cfg.engram_index:
            R = cfg.engram_num_embeddings[cfg.engram_index[l]]
            add(p + "engram.embed.weight", "engram", (R, de), ("normal", 1.0))
            lin(p + "engram.wkv.weight", "fp8", (m + 1) * H, (N - 1) * he * de)
            add(p + "engram.q_weight", "bf16", (m, H), ("one_plus_normal", 0.01))
            add(p + "engram.k_weight", "bf16", (m, H), ("one_plus_normal", 0.01))
    nd = cfg.n_blocks
    nt = len(cfg.dspark_target_layer_ids)
    rm = cfg.dspark_markov_rank
    for k in range(nd):
        p = "mtp.%d." % k
        block(p, 0, cfg.dspark_n_routed_experts, False, None)
        if k == 0:
            lin(p + "main_proj.weight", "fp8", H, nt * H)
            add(p + "main_norm.weight", "bf16", (H,), ("const", 1.0))
        if k == nd - 1:
            add(p + "norm.weight", "bf16", (H,), ("const", 1.0))
            add(p + "markov_head.embed.weight", "bf16", (V, rm), ("normal", 1.0))
            add(p + "markov_head.head.weight", "bf16", (V, rm), ("normal", 1.0 / rm))
            add(p + "confidence_head.proj.weight", "bf16", (1, H + rm), ("normal", 1.0 / (H + rm)))
    return ent


def param_counts(cfg):
    """(backbone, engram tables, dspark, total) logical parameter counts."""
    bb = eg = ds = 0
    for name, kind, shape, _ in inventory(cfg):
        n = math.prod(shape)
        if name.startswith("mtp."):
            ds += n
        elif kind == "engram":
            eg += n
        else:
            bb += n
    return bb, eg, ds, bb + eg + ds
