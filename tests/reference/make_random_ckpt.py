#!/usr/bin/python3
"""Write a random-weight test checkpoint (MODEL.md section 9 preset) in the release layout.

  make_random_ckpt.py --out DIR [--preset tiny|small] [--seed N] [--shards N] [--no-check]

Layout (sections 3, 9, 9.1, 9.2, 12.2, 12.7): nested config.json (text_config, no
vision_config), bare tensor names, FP8 dense weights (E4M3 + UE8M0 32x32 scales), MXFP4
experts (I8 packed + UE8M0 per row/32), Engram tables (E4M3 + UE8M0 per row/32, as Q_act8),
sharded model-0000k-of-0000n.safetensors + model.safetensors.index.json, and the Engram sidecar
engram-hash.safetensors. Weights are seeded normal draws per 9.1, quantized by section 4 rules.
This is a test fixture for the Python reference: it is not byte-identical to tandem-mkmodel.

After writing it runs the 9.1 sanity check with the reference forward (unless --no-check):
finite logits, |logit| <= 1e4 on the check prompt, every expert of every layer used over 256
random tokens.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flash_ref import numerics as nx                       # noqa: E402
from flash_ref.config import Config                         # noqa: E402
from flash_ref.engram import engram_primes, engram_offsets, random_multipliers, random_token_map  # noqa: E402,E501
from flash_ref.inventory import inventory, param_counts     # noqa: E402
from flash_ref.safetensors_io import write_file              # noqa: E402

PRESETS = {
    "tiny": {
        "vocab_size": 1024, "hidden_size": 128, "num_hidden_layers": 8,
        "num_attention_heads": 4, "head_dim": 64, "qk_rope_head_dim": 16,
        "q_lora_rank": 64, "o_groups": 2, "o_lora_rank": 32,
        "sliding_window": 16, "max_position_embeddings": 8192,
        "compress_ratios": [0, 0, 2, 2, 1, 1, 1, 1, 0, 0, 0],
        "kv_source_layer_ids": [2, 4], "index_source_layer_ids": [2, 4, 6],
        "candidate_source_layer_id": 4, "candidate_topk_blocks": 4, "candidate_block_size": 4,
        "index_n_heads": 4, "index_head_dim": 32, "index_topk": 8,
        "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "engram_layer_ids": [1, 2], "engram_n_heads": 2, "engram_head_dim": 32,
        "engram_vocab_size": 1000, "engram_num_embeddings": [6126, 6332],
        "engram_compressed_vocab_size": 520,
        "dspark_target_layer_ids": [5, 6, 7], "dspark_markov_rank": 16,
        "dspark_n_routed_experts": 4, "dspark_num_experts_per_tok": 2,
        "dspark_noise_token_id": 1023, "image_token_id": 1022,
    },
    "small": {
        "vocab_size": 32768, "hidden_size": 512, "num_hidden_layers": 16,
        "num_attention_heads": 8, "head_dim": 128, "qk_rope_head_dim": 64,
        "q_lora_rank": 256, "o_groups": 4, "o_lora_rank": 128,
        "sliding_window": 128, "max_position_embeddings": 131072,
        "compress_ratios": [0, 0] + [2] * 6 + [1] * 8 + [0, 0, 0],
        "kv_source_layer_ids": [2, 5, 8], "index_source_layer_ids": [2, 5, 8, 12],
        "candidate_source_layer_id": 8, "candidate_topk_blocks": 64, "candidate_block_size": 8,
        "index_n_heads": 8, "index_head_dim": 64, "index_topk": 128,
        "n_routed_experts": 16, "num_experts_per_tok": 2, "moe_intermediate_size": 96,
        "engram_layer_ids": [1, 5], "engram_n_heads": 4, "engram_head_dim": 64,
        "engram_vocab_size": 4096, "engram_num_embeddings": [49796, 50980],
        "engram_compressed_vocab_size": 16392,
        "dspark_target_layer_ids": [13, 14, 15], "dspark_markov_rank": 32,
        "dspark_n_routed_experts": 4, "dspark_num_experts_per_tok": 2,
        "dspark_noise_token_id": 32767, "image_token_id": 32766,
    },
}

# full-size values of every other text_config field (section 2); written explicitly
COMMON_TEXT = {
    "model_type": "deepseek_v41_text",
    "num_key_value_heads": 1, "hidden_act": "silu", "swiglu_limit": 10.0,
    "rms_norm_eps": 1e-20, "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
    "rope_scaling": {"rope_type": "yarn", "factor": 16.0, "beta_fast": 32.0, "beta_slow": 1.0,
                     "original_max_position_embeddings": 65536},
    "n_shared_experts": 1, "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc",
    "norm_topk_prob": True, "routed_scaling_factor": 1.5,
    "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6,
    "engram_max_ngram_size": 4, "engram_pad_token_id": 2,
    "num_nextn_predict_layers": 3, "dspark_block_size": 5, "tie_word_embeddings": False,
}


def make_config(preset):
    p = dict(PRESETS[preset])
    image = p.pop("image_token_id")
    text = dict(COMMON_TEXT)
    text.update(p)
    return {
        "architectures": ["DeepseekV41ForCausalLM"],
        "model_type": "deepseek_v41",
        "dtype": "bfloat16",
        "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2,
        "image_token_id": image,
        "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic",
                                "weight_block_size": [32, 32], "scale_fmt": "ue8m0",
                                "expert_dtype": "fp4"},
        "text_config": text,
    }


def draw(rng, shape, init):
    kind, v = init
    if kind == "normal":
        return (rng.standard_normal(shape) * np.sqrt(v)).astype(np.float32)
    if kind == "one_plus_normal":
        return (1.0 + rng.standard_normal(shape) * np.sqrt(v)).astype(np.float32)
    if kind == "uniform":
        return rng.uniform(-v, v, size=shape).astype(np.float32)
    if kind == "const":
        return np.full(shape, v, dtype=np.float32)
    raise ValueError(kind)


def stored(name, kind, w):
    """[(name, dtype, storage array)] for one logical tensor."""
    if kind == "bf16":
        return [(name, "BF16", nx.bf16_bits(w))]
    if kind == "f32":
        return [(name, "F32", w)]
    mod = name[:-len(".weight")]
    if kind == "fp8":
        codes, sc = nx.quant_fp8_block(w)
        return [(name, "F8_E4M3", codes), (mod + ".scale", "F8_E8M0", sc)]
    if kind == "fp4":
        packed, sc = nx.quant_mxfp4_rows(w)
        return [(name, "I8", packed), (mod + ".scale", "F8_E8M0", sc)]
    if kind == "engram":
        _, codes, sc = nx.q_act8(w)        # rows as Q_act8 (12.7)
        return [(name, "F8_E4M3", codes), (mod + ".scale", "F8_E8M0", sc)]
    raise ValueError(kind)


def write_checkpoint(out, preset="tiny", seed=1234, n_shards=3):
    os.makedirs(out, exist_ok=True)
    raw = make_config(preset)
    cfg = Config(raw)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(raw, f, indent=2)
        f.write("\n")
    rng = np.random.default_rng(seed)
    tensors = []
    for name, kind, shape, init in inventory(cfg):
        tensors.extend(stored(name, kind, draw(rng, shape, init)))
    # shard by cumulative size into n_shards files of about equal size
    sizes = [a.nbytes for _, _, a in tensors]
    total = sum(sizes)
    shards = [[] for _ in range(n_shards)]
    acc = 0
    for t, sz in zip(tensors, sizes):
        k = min(n_shards - 1, int(acc * n_shards // max(total, 1)))
        shards[k].append(t)
        acc += sz
    weight_map = {}
    for k, sh in enumerate(shards):
        fname = "model-%05d-of-%05d.safetensors" % (k + 1, n_shards)
        write_file(os.path.join(out, fname), sh, {"format": "pt"})
        for name, _, _ in sh:
            weight_map[name] = fname
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    # Engram sidecar (9.2, random checkpoints)
    tm, v_c = random_token_map(cfg.V)
    assert v_c == cfg.engram_compressed_vocab_size, (v_c, cfg.engram_compressed_vocab_size)
    primes = engram_primes(cfg)
    offsets = [engram_offsets(p) for p in primes]
    mult = random_multipliers(cfg, v_c)
    write_file(os.path.join(out, "engram-hash.safetensors"), [
        ("token_map", "I32", tm),
        ("multipliers", "I64", np.array(mult, dtype=np.int64)),
        ("primes", "I64", np.array(primes, dtype=np.int64)),
        ("offsets", "I64", np.array(offsets, dtype=np.int64)),
    ], {"compressed_vocab_size": v_c, "tokenizer_sha256": "none", "origin": "random"})
    return cfg, len(tensors), total


def sanity(out, seed=1234, n_tokens=256, check_prompt=None):
    """9.1 checks with the reference forward; returns (ok, report lines)."""
    from flash_ref.model import Model
    model = Model(out)
    cfg = model.cfg
    lines = []
    ok = True
    rng = np.random.default_rng(seed + 1)
    allowed = np.array([i for i in range(cfg.V) if i != cfg.image_token_id])
    ids = rng.choice(allowed, size=n_tokens)
    t0 = time.time()
    logits, layers = model.forward(ids)
    dt = time.time() - t0
    fin = bool(np.isfinite(logits).all())
    mx = float(np.max(np.abs(logits)))
    lines.append("random %d tokens: forward %.2f s, logits finite=%s max|logit|=%.3f"
                 % (n_tokens, dt, fin, mx))
    ok &= fin and mx <= 1e4
    for l, res in enumerate(layers):
        used = np.bincount(res.experts.ravel(), minlength=cfg.E)
        lines.append("layer %d (%s): expert token counts %s" % (l, cfg.role.get(l, "SWA"),
                                                                 used.tolist()))
        if (used == 0).any():
            ok = False
            lines.append("  FAIL: expert(s) %s receive no token" % np.nonzero(used == 0)[0].tolist())
    if check_prompt is not None:
        lg, _ = model.forward(check_prompt)
        f2, m2 = bool(np.isfinite(lg).all()), float(np.max(np.abs(lg)))
        lines.append("check prompt (%d tokens): finite=%s max|logit|=%.3f" % (len(check_prompt), f2, m2))
        ok &= f2 and m2 <= 1e4
    return ok, lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--out", required=True)
    ap.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--shards", type=int, default=3)
    ap.add_argument("--no-check", action="store_true")
    a = ap.parse_args()
    t0 = time.time()
    cfg, n_t, total = write_checkpoint(a.out, a.preset, a.seed, a.shards)
    bb, eg, ds, tot = param_counts(cfg)
    print("wrote %s: %d tensors, %d data bytes, %.1f s" % (a.out, n_t, total, time.time() - t0))
    print("params: backbone %.3f M, Engram tables %.3f M, DSpark %.3f M, total %.3f M"
          % (bb / 1e6, eg / 1e6, ds / 1e6, tot / 1e6))
    print("roles: %s" % cfg.summary())
    if a.no_check:
        return 0
    check = [(17 * i + 5) % cfg.V for i in range(64)]
    check = [t if t != cfg.image_token_id else 3 for t in check]
    ok, lines = sanity(a.out, a.seed, 256, check)
    for s in lines:
        print(s)
    print("sanity: %s" % ("OK" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
