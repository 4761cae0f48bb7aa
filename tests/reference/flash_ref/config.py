"""config.json reading (MODEL.md section 2, 12.1) and derived roles.

Fields are read from text_config, falling back to the top level; flat inference/config.json
aliases are accepted; a missing field takes the full-size value; a present field with a wrong
type or value is a load error naming it (ConfigError).
"""
import json
import os

FULL = {
    "vocab_size": 129280, "hidden_size": 5120, "num_hidden_layers": 40,
    "num_attention_heads": 64, "num_key_value_heads": 1,
    "head_dim": 512, "qk_rope_head_dim": 64,
    "q_lora_rank": 1280, "o_groups": 8, "o_lora_rank": 1024,
    "hidden_act": "silu", "swiglu_limit": 10.0,
    "rms_norm_eps": 1e-20,
    "max_position_embeddings": 1048576,
    "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
    "rope_scaling": {"type": "yarn", "factor": 16.0, "beta_fast": 32.0, "beta_slow": 1.0,
                     "original_max_position_embeddings": 65536},
    "sliding_window": 128,
    "compress_ratios": [0, 0] + [2] * 18 + [1] * 20 + [0, 0, 0],
    "kv_source_layer_ids": [2, 8, 14, 20],
    "index_source_layer_ids": [2, 8, 14, 20, 24, 28, 32, 36],
    "index_n_heads": 32, "index_head_dim": 128, "index_topk": 512,
    "candidate_source_layer_id": 20, "candidate_topk_blocks": 2048, "candidate_block_size": 8,
    "n_routed_experts": 384, "n_shared_experts": 1, "num_experts_per_tok": 6,
    "moe_intermediate_size": 2304,
    "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc", "norm_topk_prob": True,
    "routed_scaling_factor": 1.5,
    "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6,
    "engram_layer_ids": [1, 14], "engram_num_embeddings": [384006168, 384016682],
    "engram_max_ngram_size": 4, "engram_n_heads": 8, "engram_head_dim": 256,
    "engram_vocab_size": 16000000, "engram_pad_token_id": 2,
    "engram_compressed_vocab_size": 99092,
    "num_nextn_predict_layers": 3, "dspark_block_size": 5, "dspark_noise_token_id": 128799,
    "dspark_target_layer_ids": [37, 38, 39], "dspark_markov_rank": 256,
    "dspark_n_routed_experts": 128, "dspark_num_experts_per_tok": 3,
    "tie_word_embeddings": False,
    # top level
    "image_token_id": 129264, "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2,
}

# flat inference/config.json aliases -> canonical field
ALIASES = {
    "dim": "hidden_size", "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads",
    "moe_inter_dim": "moe_intermediate_size", "n_activated_experts": "num_experts_per_tok",
    "score_func": "scoring_func", "route_scale": "routed_scaling_factor",
    "norm_eps": "rms_norm_eps", "window_size": "sliding_window",
    "rope_head_dim": "qk_rope_head_dim", "kv_source_layers": "kv_source_layer_ids",
    "index_source_layers": "index_source_layer_ids",
    "candidate_source_layer": "candidate_source_layer_id",
    "n_mtp_layers": "num_nextn_predict_layers", "engram_pad_id": "engram_pad_token_id",
    "dspark_n_activated_experts": "dspark_num_experts_per_tok",
}
# flat YaRN aliases -> rope_scaling key
ROPE_ALIASES = {"original_seq_len": "original_max_position_embeddings", "rope_factor": "factor",
                "beta_fast": "beta_fast", "beta_slow": "beta_slow"}


class ConfigError(Exception):
    pass


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v):
    return (isinstance(v, (int, float))) and not isinstance(v, bool)


def _check_type(name, v, proto):
    if isinstance(proto, bool):
        ok = isinstance(v, bool)
    elif _is_int(proto):
        ok = _is_int(v)
    elif isinstance(proto, float):
        ok = _is_num(v)
    elif isinstance(proto, str):
        ok = isinstance(v, str)
    elif isinstance(proto, list):
        ok = isinstance(v, list) and all(_is_int(e) for e in v)
    elif isinstance(proto, dict):
        ok = isinstance(v, dict)
    else:
        ok = True
    if not ok:
        raise ConfigError("config field %s: wrong type %r" % (name, v))
    if isinstance(proto, float):
        return float(v)
    return v


def _normalize_rope(name, rs):
    """rope_scaling / rope_parameters dict -> {type, factor, beta_fast, beta_slow, L0}."""
    if not isinstance(rs, dict):
        raise ConfigError("config field %s: wrong type %r" % (name, rs))
    out = dict(FULL["rope_scaling"])
    typ = rs.get("rope_type", rs.get("type", "yarn"))
    if typ != "yarn":
        raise ConfigError("config field %s.rope_type: %r is not \"yarn\"" % (name, typ))
    for k in ("factor", "beta_fast", "beta_slow", "original_max_position_embeddings"):
        if k in rs:
            if not _is_num(rs[k]):
                raise ConfigError("config field %s.%s: wrong type %r" % (name, k, rs[k]))
            out[k] = rs[k]
    return out


class Config:
    """All section-2 fields as attributes plus derived roles."""

    def __init__(self, raw):
        if not isinstance(raw, dict):
            raise ConfigError("config.json: top level is not an object")
        text = raw.get("text_config", {}) or {}
        if not isinstance(text, dict):
            raise ConfigError("config field text_config: wrong type")

        def lookup(key):
            for src in (text, raw):
                if key in src:
                    return True, src[key]
            for alias, canon in ALIASES.items():
                if canon == key:
                    for src in (text, raw):
                        if alias in src:
                            return True, src[alias]
            return False, None

        vals = {}
        for key, proto in FULL.items():
            if key == "rope_scaling":
                continue
            found, v = lookup(key)
            vals[key] = _check_type(key, v, proto) if found else proto

        # rope_scaling: rope_scaling, rope_parameters (flat or {main, compress}), flat aliases
        self.rope_theta_from_params = None
        found, rs = lookup("rope_scaling")
        fp, rp = lookup("rope_parameters")
        if found and rs is not None:
            rope = _normalize_rope("rope_scaling", rs)
        elif fp and rp is not None:
            if isinstance(rp, dict) and ("main" in rp or "compress" in rp):
                comp = rp.get("compress", {}) or {}
                main = rp.get("main", {}) or {}
                rope = _normalize_rope("rope_parameters.compress", comp)
                # interpretation: a rope_theta inside main/compress sets rope_theta /
                # compress_rope_theta unless those are given explicitly
                if "rope_theta" in main and not lookup("rope_theta")[0]:
                    vals["rope_theta"] = _check_type("rope_parameters.main.rope_theta",
                                                     main["rope_theta"], 1.0)
                if "rope_theta" in comp and not lookup("compress_rope_theta")[0]:
                    vals["compress_rope_theta"] = _check_type(
                        "rope_parameters.compress.rope_theta", comp["rope_theta"], 1.0)
            else:
                rope = _normalize_rope("rope_parameters", rp)
        else:
            rope = dict(FULL["rope_scaling"])
            for alias, k in ROPE_ALIASES.items():
                for src in (text, raw):
                    if alias in src:
                        if not _is_num(src[alias]):
                            raise ConfigError("config field %s: wrong type" % alias)
                        rope[k] = src[alias]
                        break
        vals["rope_scaling"] = rope
        for k, v in vals.items():
            setattr(self, k, v)
        self.raw = raw
        self._validate()
        self._derive()

    # ------------------------------------------------------------------------------------------
    def _validate(self):
        def err(field, msg):
            raise ConfigError("config field %s: %s" % (field, msg))

        L = self.num_hidden_layers
        for f in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                  "head_dim", "qk_rope_head_dim", "q_lora_rank", "o_groups", "o_lora_rank",
                  "sliding_window", "index_n_heads", "index_head_dim", "index_topk",
                  "candidate_topk_blocks", "candidate_block_size", "n_routed_experts",
                  "num_experts_per_tok", "moe_intermediate_size", "hc_mult",
                  "hc_sinkhorn_iters", "engram_max_ngram_size", "engram_n_heads",
                  "engram_head_dim"):
            if getattr(self, f) <= 0:
                err(f, "must be positive")
        if self.num_key_value_heads != 1:
            err("num_key_value_heads", "must be 1 (one shared latent)")
        if self.hidden_act != "silu":
            err("hidden_act", "must be \"silu\"")
        if self.scoring_func != "sqrtsoftplus":
            err("scoring_func", "must be \"sqrtsoftplus\"")
        if self.topk_method != "noaux_tc":
            err("topk_method", "must be \"noaux_tc\"")
        if self.norm_topk_prob is not True:
            err("norm_topk_prob", "only true is modelled")
        if self.n_shared_experts != 1:
            err("n_shared_experts", "must be 1")
        if self.tie_word_embeddings:
            err("tie_word_embeddings", "must be false")
        for f in ("hidden_size", "moe_intermediate_size", "head_dim", "index_head_dim",
                  "engram_head_dim", "q_lora_rank", "o_lora_rank"):
            if getattr(self, f) % 32:
                err(f, "must be a multiple of 32")
        dr = self.qk_rope_head_dim
        if dr % 2 or dr > min(self.head_dim, self.index_head_dim):
            err("qk_rope_head_dim", "must be even and <= min(head_dim, index_head_dim)")
        if self.num_attention_heads % self.o_groups:
            err("o_groups", "must divide num_attention_heads")
        n_all = L + self.num_nextn_predict_layers
        ratios = list(self.compress_ratios)
        for r in ratios:
            if r not in (0, 1, 2):
                err("compress_ratios", "ratios must be 0, 1 or 2")
        self.ratios = ratios + [0] * max(0, n_all - len(ratios))
        for k in range(L, n_all):
            if self.ratios[k] != 0:
                err("compress_ratios", "DSpark block %d must have ratio 0" % k)
        kvs = sorted(self.kv_source_layer_ids)
        ixs = sorted(self.index_source_layer_ids)
        for name, lst in (("kv_source_layer_ids", kvs), ("index_source_layer_ids", ixs)):
            for l in lst:
                if not 0 <= l < L or self.ratios[l] == 0:
                    err(name, "layer %d is not a backbone layer with ratio > 0" % l)
        for l in range(L):
            if self.ratios[l] > 0:
                kv = [s for s in kvs if s <= l]
                ix = [s for s in ixs if s <= l]
                if not kv or self.ratios[kv[-1]] != self.ratios[l]:
                    err("kv_source_layer_ids", "layer %d has no same-ratio kv_src" % l)
                if not ix or ix[-1] < kv[-1]:
                    err("index_source_layer_ids", "layer %d needs idx_src(l) >= kv_src(l)" % l)
        if self.candidate_topk_blocks * self.candidate_block_size < self.index_topk:
            err("candidate_topk_blocks", "n_B * B_c must be >= index_topk")
        cs = self.candidate_source_layer_id
        if cs not in ixs or cs not in kvs:
            err("candidate_source_layer_id", "must be a Full layer (KV and index source)")
        if cs > max(kvs):
            err("candidate_source_layer_id", "must be <= the CED cut max(kv_source_layer_ids)")
        kv_cs = max(s for s in kvs if s <= cs)
        for l in ixs:
            if l > cs and max(s for s in kvs if s <= l) != kv_cs:
                err("candidate_source_layer_id",
                    "consumer %d does not share the candidate source's kv_src" % l)
        for l in self.engram_layer_ids:
            if not 0 <= l < L:
                err("engram_layer_ids", "layer %d out of range" % l)
        if len(self.engram_num_embeddings) != len(self.engram_layer_ids):
            err("engram_num_embeddings", "needs one entry per Engram layer")
        for l in self.dspark_target_layer_ids:
            if not 0 <= l < L:
                err("dspark_target_layer_ids", "layer %d out of range" % l)
        # Engram prime sums (section 5.6)
        from . import engram as _eng
        primes = _eng.engram_primes(self)
        for i, l in enumerate(self.engram_layer_ids):
            if sum(primes[i]) != self.engram_num_embeddings[i]:
                err("engram_num_embeddings", "layer %d: primes sum to %d, config says %d"
                    % (l, sum(primes[i]), self.engram_num_embeddings[i]))

    def _derive(self):
        L = self.num_hidden_layers
        kvs = sorted(self.kv_source_layer_ids)
        ixs = sorted(self.index_source_layer_ids)
        self.L = L
        self.n_blocks = self.num_nextn_predict_layers
        self.kv_src = {}
        self.idx_src = {}
        self.role = {}
        for l in range(L):
            r = self.ratios[l]
            if r == 0:
                self.role[l] = "SWA"
                continue
            self.kv_src[l] = max(s for s in kvs if s <= l)
            self.idx_src[l] = max(s for s in ixs if s <= l)
            if l in kvs and l in ixs:
                self.role[l] = "Full"
            elif l in ixs:
                self.role[l] = "Reindex"
            else:
                self.role[l] = "Reuse"
        self.candidate_source = self.candidate_source_layer_id
        self.candidate_consumers = [l for l in ixs if l > self.candidate_source]
        self.ced_cut = max(kvs)
        self.engram_index = {l: i for i, l in enumerate(self.engram_layer_ids)}
        self.m = self.hc_mult
        self.H = self.hidden_size
        self.V = self.vocab_size
        self.n_h = self.num_attention_heads
        self.d = self.head_dim
        self.d_r = self.qk_rope_head_dim
        self.W = self.sliding_window
        self.k_I = self.index_topk
        self.K = self.num_experts_per_tok
        self.E = self.n_routed_experts

    def summary(self):
        return {l: self.role[l] for l in range(self.L)}


def load_config(directory_or_file):
    path = directory_or_file
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    with open(path) as f:
        raw = json.load(f)
    return Config(raw)
