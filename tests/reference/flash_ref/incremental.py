"""Token-by-token oracle decoder with explicit per-sequence state (MODEL.md 5.2-5.4, 7).

A second implementation of the state semantics, used to check that the layer-major forward of
model.py is the token-by-token oracle: per layer a window ring of C = W + B + 1 entries (slot
p mod C), per KV source the published rows / index keys, and for ratio-2 sources the pending
half-group (a_p, b_p) FP32 of the even token, combined when the odd token arrives. The leaf
math (projections, norms, quantizers, MoE, mHC) is shared with model.py.
"""
import numpy as np

from .model import Context, LayerResult, rmsnorm, n_c, F32


class IncrementalDecoder:
    def __init__(self, model, lo=0):
        self.m = model
        cfg = self.cfg = model.cfg
        self.lo = lo
        self.C = cfg.W + cfg.dspark_block_size + 1
        self.ring = {l: np.zeros((self.C, cfg.d), F32) for l in range(cfg.L)}
        self.ring_pos = {l: np.full(self.C, -1, np.int64) for l in range(cfg.L)}
        self.pending = {}
        self.rows = {l: [] for l in cfg.kv_source_layer_ids}
        self.ikeys = {l: [] for l in cfg.kv_source_layer_ids}
        self.ids = []

    def _publish(self, l, a, b, row):
        c_hat, c = self.m.comp_rows(l, a, b, [row])
        self.rows[l].append(c_hat[0])
        self.ikeys[l].append(self.m.index_keys(l, c, [row])[0])

    def step(self, tok):
        """Run token tok at the next position through all layers; returns (logits [V],
        per-layer (sel [k_I], experts [K]))."""
        mdl, cfg = self.m, self.cfg
        w = mdl.w
        t = len(self.ids)
        self.ids.append(int(tok))
        pos = np.array([t])
        X = mdl.embed(np.array([tok]))
        pre = mdl.e0(1)
        ctx = Context(np.array(self.ids))
        per_layer = []
        for l in range(cfg.L):
            P = mdl.P(l)
            res = LayerResult()
            if l in cfg.engram_index:
                X = mdl.engram_update(l, X, mdl.engram.rows(l, ctx.ids)[t:t + 1])
            pre_a, post_a, M_a = mdl.hc_mix(l, "attn", X)
            xn = rmsnorm(mdl.collapse(pre, X), w.bf16(P + "attn_norm.weight", (cfg.H,)), mdl.eps)
            qr, q, k_hat = mdl.attn_qkv(l, xn, pos)
            slot = t % self.C
            self.ring[l][slot] = k_hat[0]
            self.ring_pos[l][slot] = t
            r = cfg.ratios[l]
            sel = np.full(cfg.k_I, -1, np.int64)
            Ks = []
            if r > 0:
                if cfg.kv_src[l] == l:
                    a, b = mdl.comp_ab(l, xn)
                    if r == 2:
                        if t % 2 == 0:
                            self.pending[l] = (a[0], b[0])          # pending half-group
                        else:
                            pa, pb = self.pending.pop(l)
                            self._publish(l, np.stack([pa, a[0]])[None],
                                          np.stack([pb, b[0]])[None], (t - 1) // 2)
                    else:
                        self._publish(l, a[:, None, :], None, t)
                src = cfg.kv_src[l]
                ctx.rows[src] = np.array(self.rows[src], F32).reshape(-1, cfg.d)
                ctx.ikeys[src] = np.array(self.ikeys[src], F32).reshape(-1, cfg.index_head_dim)
                assert ctx.rows[src].shape[0] == n_c(t, r)
                # selections / pool of earlier layers at this query live in ctx (this step)
                sel = mdl.selection_step(l, qr, xn, pos, ctx, res)[0]
            # window keys from the ring, oldest first
            for p in range(max(t - cfg.W + 1, self.lo), t + 1):
                s_ = p % self.C
                assert self.ring_pos[l][s_] == p, "ring entry overwritten"
                Ks.append(self.ring[l][s_])
            for j in sel:
                if j >= 0:
                    Ks.append(ctx.rows[cfg.kv_src[l]][j])
            K = np.array(Ks, F32)[None]
            att = mdl.attn_core(l, q, K, np.ones((1, K.shape[1]), bool), pos)
            X = mdl.hc_update(post_a, att, M_a, X)
            pre_f, post_f, M_f = mdl.hc_mix(l, "ffn", X)
            xf = rmsnorm(mdl.collapse(pre_a, X), w.bf16(P + "ffn_norm.weight", (cfg.H,)), mdl.eps)
            ffn = mdl.moe(l, xf, res)
            X = mdl.hc_update(post_f, ffn, M_f, X)
            pre = pre_f
            per_layer.append((sel, res.experts[0]))
        return mdl.head(X, pre)[0], per_layer
