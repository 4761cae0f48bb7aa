"""The MODEL.md section-5 oracle forward (schedule 6(a)), one layer at a time.

Every position of the prompt runs through all L layers with window floor lo = 0. Because every
layer is causal (a query at t sees window keys p <= t, compressed rows j < n_c(t) and selections
made at t), running layer l over all positions at once, after layer l-1 has run over all
positions, gives exactly the token-by-token oracle; "state built by earlier positions" is the
causal masking below. A single layer can be run on any input X [T, m, H] (teacher forcing):
its window keys come from that same input, compressed rows / index keys from the source layers'
inputs (Context).

Rounding points R1-R9 of section 4 and 12.3 are marked inline. All arrays are float32; BF16
values are float32 arrays with zero low halves (numerics.bf16_round).
"""
import math

import numpy as np

from . import numerics as nx
from .config import load_config
from .numerics import bf16_round as bf
from .rope import Rope
from .weights import Weights, load_engram_sidecar

F32 = np.float32
NEG_INF = F32(-np.inf)
POS_INF = F32(np.inf)


def _f32(v):
    return np.float32(v)


def sigmoid(x):
    with np.errstate(over="ignore"):
        return (F32(1) / (F32(1) + np.exp(-x))).astype(F32)


def rms_scale(x, eps):
    """(mean(x^2) + eps)^-1/2 over the last axis, FP32."""
    ms = np.mean(x * x, axis=-1, dtype=F32)
    return (F32(1) / np.sqrt(ms + eps)).astype(F32)


def rmsnorm(x, gamma, eps):
    """R2: FP32 x * (mean(x^2)+eps)^-1/2, then * gamma, then BF16."""
    r = rms_scale(x, eps)
    return bf((x * r[..., None]) * gamma)


def dot64(a, b):
    """a @ b with the products accumulated in float64, rounded once to FP32.

    MODEL.md leaves the FP32 summation order open (12.6); accumulating in double and rounding
    once gives the correctly rounded FP32 result in all but ~1e-9 of cases, and makes the
    reference independent of batch shape / BLAS blocking (layer-major == token-by-token)."""
    if ACCUM == "f32":                 # test-only: plain FP32 accumulation (BLAS order)
        return np.matmul(a.astype(F32), b.astype(F32)).astype(F32)
    return np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(F32)


# "f64" (default): products accumulated in double, rounded once. "f32": numpy/BLAS FP32
# accumulation - a second, equally valid order, used to emulate another implementation.
ACCUM = "f64"


def qa8(x):
    """Q_act8 QDQ (R4): the FP32 operand of an FP8/FP4-weight GEMM."""
    return nx.q_act8(x)[0]


def topk_order(vals, k):
    """Indices of the top k of vals[..., n] per row: value descending, then index ascending
    (the [tandem] tie order of 5.4). NaN is an engine error."""
    if np.isnan(vals).any():
        raise FloatingPointError("NaN reached a top-k")
    return np.argsort(-vals, axis=-1, kind="stable")[..., :k]


def n_c(t, r):
    """Rows visible to query t at ratio r: floor((t+1)/r)."""
    return (np.asarray(t) + 1) // r


class Context:
    """Per-prompt state shared between layers: ids, the rows / index keys published by KV
    sources, the selections published by index sources and the candidate pool."""

    def __init__(self, ids):
        self.ids = np.asarray(ids, dtype=np.int64)
        self.T = len(self.ids)
        self.rows = {}      # kv source -> FP32 dequantized main rows c_hat [n_rows, d]
        self.ikeys = {}     # Full layer -> FP32 dequantized index keys k^I [n_rows, d_I]
        self.sel = {}       # index source -> int64 [T, k_I] selected rows, ascending, -1 padded
        self.pool = {}      # candidate source -> bool [T, n_rows]
        self.sel_gap = {}   # index source -> [T] relative k-th/(k+1)-th score gap (near ties)


class LayerResult:
    def __init__(self):
        self.x_in = None        # [T, m, H] entering the layer (before Engram)
        self.x_out = None       # [T, m, H] leaving the layer
        self.pre_in = None      # [T, m] previous FFN site's pre used by the attention collapse
        self.pre_out = None     # [T, m] this layer's FFN-site pre (for the next site)
        self.sel = None         # [T, k_I] rows the attention used (ascending, -1 padded)
        self.sel_own = None     # [T, k_I] selection computed by this layer (index sources)
        self.sel_gap = None     # [T] relative gap between k-th and (k+1)-th index score
        self.experts = None     # [T, K] experts used (ascending)
        self.experts_own = None  # [T, K] experts computed by this layer's router
        self.expert_gap = None  # [T] relative gap between K-th and (K+1)-th biased score


def _rel_gap(sorted_vals, k):
    """(v_k - v_{k+1}) / |v_k| per row for descending-sorted values; +inf if no (k+1)-th."""
    n = sorted_vals.shape[-1]
    if k <= 0 or k >= n:
        return np.full(sorted_vals.shape[:-1], np.inf)
    a = sorted_vals[..., k - 1].astype(np.float64)
    b = sorted_vals[..., k].astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        g = (a - b) / np.maximum(np.abs(a), 1e-30)
    g = np.where(np.isfinite(b), g, np.inf)
    return g


class Model:
    def __init__(self, directory):
        self.dir = directory
        self.cfg = cfg = load_config(directory)
        self.w = Weights(directory, cfg)
        self.engram = load_engram_sidecar(directory, cfg) if cfg.engram_layer_ids else None
        self.rope_plain = Rope(cfg.d_r, cfg.rope_theta, None)
        self.rope_yarn = Rope(cfg.d_r, cfg.compress_rope_theta, cfg.rope_scaling)
        self.eps = _f32(cfg.rms_norm_eps)
        self.hc_eps = _f32(cfg.hc_eps)

    # ------------------------------------------------------------------------------------------
    def rope(self, l):
        """Ratio-0 layers: rope_theta unscaled; ratio>0: compress_rope_theta with YaRN."""
        return self.rope_yarn if self.cfg.ratios[l] > 0 else self.rope_plain

    def P(self, l):
        return "layers.%d." % l

    # ------------------------------------------------------------------------------------------
    # 5.1 mHC
    def hc_mix(self, l, site, X):
        """pre [T,m], post [T,m], M [T,m,m] of site 'attn' / 'ffn' from X [T,m,H] (FP32)."""
        cfg, w = self.cfg, self.w
        m, H = cfg.m, cfg.H
        T = X.shape[0]
        n = (2 + m) * m
        Fw = w.f32(self.P(l) + "hc_%s_fn" % site, (n, m * H))
        base = w.f32(self.P(l) + "hc_%s_base" % site, (n,))
        sc = w.f32(self.P(l) + "hc_%s_scale" % site, (3,))
        xf = X.reshape(T, m * H)
        mix = dot64(xf, Fw.T) * rms_scale(xf, self.eps)[:, None]          # FP32 mix
        pre = sigmoid(mix[:, :m] * sc[0] + base[:m]) + self.hc_eps
        post = F32(2) * sigmoid(mix[:, m:2 * m] * sc[1] + base[m:2 * m])
        C = (mix[:, 2 * m:] * sc[2] + base[2 * m:]).reshape(T, m, m)   # C_ij, i rows
        C = C - np.max(C, axis=2, keepdims=True)
        eC = np.exp(C)
        M = eC / np.sum(eC, axis=2, keepdims=True) + self.hc_eps         # softmax_j + eps
        M = M / (np.sum(M, axis=1, keepdims=True) + self.hc_eps)        # column normalise
        for _ in range(cfg.hc_sinkhorn_iters - 1):
            M = M / (np.sum(M, axis=2, keepdims=True) + self.hc_eps)    # row
            M = M / (np.sum(M, axis=1, keepdims=True) + self.hc_eps)    # column
        return pre.astype(F32), post.astype(F32), M.astype(F32)

    @staticmethod
    def collapse(pre, X):
        """y = BF16(sum_i pre_i X_i) (R2)."""
        return bf(dot64(pre[:, None, :], X)[:, 0, :])

    @staticmethod
    def hc_update(post, F_out, M, X):
        """X'_j = BF16(post_j F_out + sum_i M_ij X_i) (R1)."""
        mixed = dot64(np.transpose(M, (0, 2, 1)), X)               # [T, j, H]
        return bf(post[:, :, None] * F_out[:, None, :] + mixed)

    # ------------------------------------------------------------------------------------------
    # 5.6 Engram
    def engram_update(self, l, X, rows):
        """X [T, m, H] updated by Engram layer l; rows [T, (N-1)h_e] = table rows
        (EngramTables.rows over the token history)."""
        cfg, w = self.cfg, self.w
        m, H = cfg.m, cfg.H
        T = X.shape[0]
        N, he, de = cfg.engram_max_ngram_size, cfg.engram_n_heads, cfg.engram_head_dim
        li = cfg.engram_index[l]
        codes, scales = w.engram_table(l, cfg.engram_num_embeddings[li])
        e = nx.dequant_rows32(codes[rows.ravel()], scales[rows.ravel()])  # R9: exact
        e = e.reshape(T, (N - 1) * he * de)
        Wkv = w.fp8(self.P(l) + "engram.wkv.weight", ((m + 1) * H, (N - 1) * he * de))
        kv = bf(dot64(qa8(e), Wkv.T))                                    # R3/R4
        keys = kv[:, :m * H].reshape(T, m, H)
        value = kv[:, m * H:]
        qw = w.bf16(self.P(l) + "engram.q_weight", (m, H))
        kw = w.bf16(self.P(l) + "engram.k_weight", (m, H))
        dot = np.sum(((X * qw[None]) * kw[None]) * keys, axis=-1, dtype=F32)   # [T, m]
        gam = dot * rms_scale(X, self.eps) * rms_scale(keys, self.eps) / F32(math.sqrt(H))
        sgn = np.where(gam >= 0, F32(1), F32(-1))                        # sign(0) = +
        g = sigmoid(sgn * np.sqrt(np.maximum(np.abs(gam), F32(1e-6))))
        return bf(X + g[:, :, None] * value[:, None, :])                 # R9

    # ------------------------------------------------------------------------------------------
    # 5.3 compressor
    def comp_ab(self, l, x):
        """Per-token compressor projections of KV source l: a = W_ckv x (FP32 at ratio 2,
        BF16 at ratio 1), b = W_cg x (FP32, ratio 2 only, else None)."""
        cfg, w = self.cfg, self.w
        Wckv = w.bf16(self.P(l) + "attn.compressor.wkv.weight", (cfg.d, cfg.H))
        if cfg.ratios[l] == 2:
            Wcg = w.bf16(self.P(l) + "attn.compressor.wgate.weight", (cfg.d, cfg.H))
            return dot64(x, Wckv.T), dot64(x, Wcg.T)                    # FP32 (R3 exception)
        return bf(dot64(x, Wckv.T)), None                                # R3

    def comp_rows(self, l, a, b, row_idx):
        """Rows row_idx [n] from grouped projections a, b [n, r, d]:
        (c_hat FP32 [n, d] = Q_ckv QDQ of the roped row, latent c BF16 [n, d])."""
        cfg, w = self.cfg, self.w
        r = cfg.ratios[l]
        if r == 2:
            bm = b - np.max(b, axis=1, keepdims=True)
            eb = np.exp(bm)
            wgt = eb / np.sum(eb, axis=1, keepdims=True)                # softmax over the group
            v = bf(np.sum(wgt * a, axis=1, dtype=F32))
        else:
            v = a[:, 0, :]                                               # already BF16
        gamma = w.bf16(self.P(l) + "attn.compressor.norm.weight", (cfg.d,))
        c = rmsnorm(v, gamma, self.eps)                                  # latent, pre-RoPE
        pos = r * np.asarray(row_idx, np.int64)
        c_hat = nx.q_ckv(self.rope(l).apply(c, pos))[0]                  # R5, R6
        return c_hat, c

    def compressor(self, l, x):
        """All complete rows of KV source l from its normed attention input x [T, H]."""
        r = self.cfg.ratios[l]
        n = x.shape[0] // r
        a, b = self.comp_ab(l, x[:n * r])
        d = a.shape[-1]
        return self.comp_rows(l, a.reshape(n, r, d), None if b is None else b.reshape(n, r, d),
                              np.arange(n))

    def index_keys(self, l, c, row_idx):
        """k^I_j = Q_mx4(BF16(RoPE(BF16(RMSNorm(BF16(W_k c_j); k_norm)), r j))), FP32 QDQ."""
        cfg, w = self.cfg, self.w
        dI = cfg.index_head_dim
        r = cfg.ratios[l]
        Wk = w.bf16(self.P(l) + "attn.indexer.wk.weight", (dI, cfg.d))
        kn = w.bf16(self.P(l) + "attn.indexer.k_norm.weight", (dI,))
        k = rmsnorm(bf(dot64(c, Wk.T)), kn, self.eps)
        pos = r * np.asarray(row_idx, np.int64)
        return nx.q_mx4(self.rope(l).apply(k, pos))[0]

    # ------------------------------------------------------------------------------------------
    # 5.4 indexer and selection
    def index_query(self, l, qr, x, pos):
        """(q^I FP32 QDQ [T, H_I, d_I], weights w FP32 [T, H_I]) of layer l at positions pos."""
        cfg, w = self.cfg, self.w
        HI, dI = cfg.index_n_heads, cfg.index_head_dim
        T = x.shape[0]
        Wq = w.fp8(self.P(l) + "attn.indexer.wq_b.weight", (HI * dI, cfg.q_lora_rank))
        Wp = w.bf16(self.P(l) + "attn.indexer.weights_proj.weight", (HI, cfg.H))
        q = bf(dot64(qa8(qr), Wq.T)).reshape(T, HI, dI)                  # 12.3
        q = nx.q_mx4(self.rope(l).apply(q, pos))[0]                      # R5, R6
        wts = bf(dot64(x, Wp.T)) * F32(dI ** -0.5) * F32(HI ** -0.5)
        return q, wts.astype(F32)

    @staticmethod
    def index_scores(q, wts, keys, nvis):
        """sigma_t(j) = sum_h w_h max(0, q_h . k_j) FP32 [T, n]; -inf for j >= n_c(t)."""
        T = q.shape[0]
        n = keys.shape[0]
        if n == 0:
            return np.zeros((T, 0), F32)
        dots = dot64(q, keys.T[None, :, :])                              # [T, H_I, n]
        sc = np.sum(wts[:, :, None] * np.maximum(dots, F32(0)), axis=1, dtype=F32)
        vis = np.arange(n)[None, :] < np.asarray(nvis)[:, None]
        return np.where(vis, sc, NEG_INF).astype(F32)

    def candidate_pool(self, scores, nvis):
        """Pool mask [T, n] of the candidate source (5.4, 12.5)."""
        cfg = self.cfg
        Bc, nB = cfg.candidate_block_size, cfg.candidate_topk_blocks
        T, n = scores.shape
        nb = -(-n // Bc)
        if nb == 0:
            return np.zeros((T, 0), bool)
        pad = np.full((T, nb * Bc), NEG_INF, F32)
        pad[:, :n] = scores
        beta = np.max(pad.reshape(T, nb, Bc), axis=2)
        newest = (nvis - 1) // Bc
        has = nvis > 0
        beta[np.arange(T)[has], newest[has]] = POS_INF
        order = topk_order(beta, min(nB, nb))
        kept_val = np.take_along_axis(beta, order, axis=1)
        keep_blk = np.zeros((T, nb), bool)
        rows_t = np.repeat(np.arange(T)[:, None], order.shape[1], axis=1)
        ok = kept_val != NEG_INF
        keep_blk[rows_t[ok], order[ok]] = True
        pool = np.repeat(keep_blk, Bc, axis=1)[:, :n]
        return pool & (np.arange(n)[None, :] < nvis[:, None])

    def select(self, scores, nvis):
        """S(t): top min(k_I, n_c(t)) rows (-inf never), ascending, -1 padded [T, k_I];
        every visible row when n_c(t) <= k_I. Also the relative k-th gap."""
        kI = self.cfg.k_I
        T, n = scores.shape
        out = np.full((T, kI), -1, np.int64)
        gap = np.full(T, np.inf)
        if n == 0:
            return out, gap
        k = min(kI, n)
        order = topk_order(scores, min(kI + 1, n))
        vals = np.take_along_axis(scores, order, axis=1)
        gap = _rel_gap(vals, kI)
        sel = order[:, :k].copy()
        sel[vals[:, :k] == NEG_INF] = -1
        small = nvis <= kI
        ar = np.arange(k)[None, :]
        sel = np.where(small[:, None], np.where(ar < nvis[:, None], ar, -1), sel)
        gap = np.where(small, np.inf, gap)
        big = np.iinfo(np.int64).max
        sel = np.sort(np.where(sel < 0, big, sel), axis=1)
        out[:, :k] = np.where(sel == big, -1, sel)
        return out, gap

    def selection_step(self, l, qr, x, pos, ctx, res):
        """Selection S(t) used by ratio>0 layer l for queries at pos; publishes rows the
        index sources compute. Reads ctx.ikeys / ctx.pool / ctx.sel of the source layers
        (the pool and selections of the same query positions)."""
        cfg = self.cfg
        role = cfg.role[l]
        src = cfg.kv_src[l]
        nvis = np.minimum(n_c(pos, cfg.ratios[l]), ctx.ikeys[src].shape[0]) \
            if role in ("Full", "Reindex") else None
        if role in ("Full", "Reindex"):
            qI, wts = self.index_query(l, qr, x, pos)
            sc = self.index_scores(qI, wts, ctx.ikeys[src], nvis)
            if l == cfg.candidate_source:
                ctx.pool[l] = self.candidate_pool(sc, nvis)
            if l in cfg.candidate_consumers:
                sc = np.where(ctx.pool[cfg.candidate_source], sc, NEG_INF).astype(F32)
            own, gap = self.select(sc, nvis)
            ctx.sel[l] = own
            ctx.sel_gap[l] = gap
            res.sel_own, res.sel_gap = own, gap
            return own
        return ctx.sel[cfg.idx_src[l]]

    # ------------------------------------------------------------------------------------------
    # 5.2 attention
    def attn_qkv(self, l, x, pos):
        """(qr BF16 [T, r_q], q BF16 roped [T, n_h, d], k_hat FP32 Q_swa QDQ [T, d])."""
        cfg, w = self.cfg, self.w
        P = self.P(l)
        T = x.shape[0]
        H, nh, d, rq = cfg.H, cfg.n_h, cfg.d, cfg.q_lora_rank
        rope = self.rope(l)
        xq = qa8(x)                                                      # R4
        Wqa = w.fp8(P + "attn.wq_a.weight", (rq, H))
        Wqb = w.fp8(P + "attn.wq_b.weight", (nh * d, rq))
        Wkv = w.fp8(P + "attn.wkv.weight", (d, H))
        qr = rmsnorm(bf(dot64(xq, Wqa.T)), w.bf16(P + "attn.q_norm.weight", (rq,)), self.eps)
        q = bf(dot64(qa8(qr), Wqb.T)).reshape(T, nh, d)
        q = rope.apply(q, pos)                                           # R5
        kv = rmsnorm(bf(dot64(xq, Wkv.T)), w.bf16(P + "attn.kv_norm.weight", (d,)), self.eps)
        k_hat = nx.q_swa(rope.apply(kv, pos))[0]                         # R5, R6
        return qr, q, k_hat

    def attn_core(self, l, q, K, valid, pos):
        """Per query t (row of q [T, n_h, d]) over its key set K [T, E, d] (valid [T, E]):
        sink softmax, P.V, inverse RoPE, grouped wo_a, Q_act8, wo_b -> BF16 [T, H]."""
        cfg, w = self.cfg, self.w
        P = self.P(l)
        T = q.shape[0]
        H, nh, d, G, ro = cfg.H, cfg.n_h, cfg.d, cfg.o_groups, cfg.o_lora_rank
        z = dot64(q, np.transpose(K, (0, 2, 1))) * F32(1.0 / math.sqrt(d))   # [T, n_h, E]
        z = np.where(valid[:, None, :], z, NEG_INF)
        mu = np.max(z, axis=2, keepdims=True)
        ez = np.exp(z - mu)
        sink = w.f32(P + "attn.attn_sink", (nh,))
        den = np.sum(ez, axis=2, keepdims=True, dtype=np.float64).astype(F32) + \
            np.exp(sink[None, :, None] - mu)
        p = (ez / den).astype(F32)
        o = bf(dot64(p, K))                                              # R7
        o = self.rope(l).apply(o, pos, inverse=True)                     # R5
        Woa = w.fp8(P + "attn.wo_a.weight", (G * ro, nh * d // G)).reshape(G, ro, nh * d // G)
        og = o.reshape(T, G, nh * d // G)
        a = bf(dot64(og[:, :, None, :], np.transpose(Woa, (0, 2, 1))[None])[:, :, 0, :])
        Wob = w.fp8(P + "attn.wo_b.weight", (H, G * ro))
        return bf(dot64(qa8(a.reshape(T, G * ro)), Wob.T))              # R4 on a, not on o

    def attention(self, l, x, ctx, res, lo=0, sel_override=None):
        """Attention of layer l for all positions 0..T-1 of x [T, H] (the normed input)."""
        cfg = self.cfg
        T = x.shape[0]
        d, W, r = cfg.d, cfg.W, cfg.ratios[l]
        pos = np.arange(T)
        qr, q, k_hat = self.attn_qkv(l, x, pos)
        sel = np.full((T, cfg.k_I), -1, np.int64)
        rows = np.zeros((0, d), F32)
        if r > 0:
            if cfg.kv_src[l] == l:                                       # publish rows, keys
                c_hat, c = self.compressor(l, x)
                ctx.rows[l] = c_hat
                ctx.ikeys[l] = self.index_keys(l, c, np.arange(c.shape[0]))
            rows = ctx.rows[cfg.kv_src[l]]
            sel = self.selection_step(l, qr, x, pos, ctx, res)
            if sel_override is not None:
                sel = np.asarray(sel_override, np.int64)
        res.sel = sel
        # key set K(t): window entries max(t-W+1, lo)..t, then the selected compressed rows
        widx = pos[:, None] - (W - 1) + np.arange(W)[None, :]
        wvalid = widx >= max(lo, 0)
        K = k_hat[np.clip(widx, 0, None)]
        valid = wvalid
        if rows.shape[0] > 0:
            K = np.concatenate([K, rows[np.clip(sel, 0, rows.shape[0] - 1)]], axis=1)
            valid = np.concatenate([wvalid, sel >= 0], axis=1)
        return self.attn_core(l, q, K, valid, pos)

    # ------------------------------------------------------------------------------------------
    # 5.5 MoE
    def moe(self, l, x, res, experts_override=None):
        cfg, w = self.cfg, self.w
        P = self.P(l)
        T, H = x.shape
        E, K, I = cfg.E, cfg.K, cfg.moe_intermediate_size
        lam = F32(cfg.swiglu_limit)
        rho = F32(cfg.routed_scaling_factor)
        Wg = w.bf16(P + "ffn.gate.weight", (E, H))
        bias = w.f32(P + "ffn.gate.bias", (E,))
        logits = dot64(x, Wg.T)                                                # FP32 (R3 exception)
        with np.errstate(over="ignore"):
            s = np.sqrt(np.logaddexp(F32(0), logits)).astype(F32)       # sqrt(softplus)
        biased = (s + bias[None, :]).astype(F32)
        order = topk_order(biased, min(K + 1, E))
        res.expert_gap = _rel_gap(np.take_along_axis(biased, order, axis=1), K)
        own = np.sort(order[:, :K], axis=1)
        res.experts_own = own
        sel = own if experts_override is None else np.sort(np.asarray(experts_override,
                                                                      np.int64), axis=1)
        res.experts = sel
        s_sel = np.take_along_axis(s, sel, axis=1)                       # ascending expert id
        ssum = np.zeros(T, F32)
        for kk in range(K):
            ssum = ssum + s_sel[:, kk]
        wts = (rho * s_sel) / (ssum[:, None] + F32(1e-20))
        xq = qa8(x)                                                      # R4

        def expert(W1, W3, W2, rows, scale):
            g = bf(dot64(xq[rows], W1.T))
            u = bf(dot64(xq[rows], W3.T))
            with np.errstate(over="ignore"):
                gm = np.minimum(g, lam)
                h = (gm * sigmoid(gm)) * np.clip(u, -lam, lam)          # FP32
            h = h * scale[:, None]                                       # routing weight
            return bf(dot64(qa8(bf(h)), W2.T))                                 # R8

        acc = np.zeros((T, H), F32)
        for e in range(E):
            hit = sel == e
            rows = np.nonzero(hit.any(axis=1))[0]
            if rows.size == 0:
                continue
            sc = wts[hit]
            W1 = w.fp4(P + "ffn.experts.%d.w1.weight" % e, (I, H))
            W3 = w.fp4(P + "ffn.experts.%d.w3.weight" % e, (I, H))
            W2 = w.fp4(P + "ffn.experts.%d.w2.weight" % e, (H, I))
            acc[rows] = acc[rows] + expert(W1, W3, W2, rows, sc)          # ascending id
        S1 = w.fp8(P + "ffn.shared_experts.w1.weight", (I, H))
        S3 = w.fp8(P + "ffn.shared_experts.w3.weight", (I, H))
        S2 = w.fp8(P + "ffn.shared_experts.w2.weight", (H, I))
        acc = acc + expert(S1, S3, S2, np.arange(T), np.ones(T, F32))
        return bf(acc)                                                   # R8

    # ------------------------------------------------------------------------------------------
    def run_layer(self, l, X, pre_prev, ctx, lo=0, sel_override=None, experts_override=None,
                  need_ffn=True):
        """One backbone layer (Engram if any, attention site, FFN site) on X [T, m, H].

        pre_prev: [T, m] pre of the previous FFN site (e0 for layer 0). Publishes rows, index
        keys, selections and the pool into ctx. need_ffn=False skips the MoE (the FFN-site pre
        is still computed; x_out is then None)."""
        cfg, w = self.cfg, self.w
        P = self.P(l)
        res = LayerResult()
        res.x_in = X
        res.pre_in = pre_prev
        if l in cfg.engram_index:
            X = self.engram_update(l, X, self.engram.rows(l, ctx.ids))
        pre_a, post_a, M_a = self.hc_mix(l, "attn", X)
        y = self.collapse(pre_prev, X)
        xn = rmsnorm(y, w.bf16(P + "attn_norm.weight", (cfg.H,)), self.eps)
        att = self.attention(l, xn, ctx, res, lo=lo, sel_override=sel_override)
        X = self.hc_update(post_a, att, M_a, X)
        res.x_mid = X
        pre_f, post_f, M_f = self.hc_mix(l, "ffn", X)
        res.pre_out = pre_f
        if need_ffn:
            y = self.collapse(pre_a, X)
            xn = rmsnorm(y, w.bf16(P + "ffn_norm.weight", (cfg.H,)), self.eps)
            ffn = self.moe(l, xn, res, experts_override=experts_override)
            res.x_out = self.hc_update(post_f, ffn, M_f, X)
        return res

    def embed(self, ids):
        cfg = self.cfg
        ids = np.asarray(ids, np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= cfg.V):
            raise ValueError("token id out of [0, V)")
        E = self.w.bf16("embed.weight", (cfg.V, cfg.H))
        return np.repeat(E[ids][:, None, :], cfg.m, axis=1).astype(F32)  # R1 (BF16 already)

    def e0(self, T):
        p = np.zeros((T, self.cfg.m), F32)
        p[:, 0] = 1
        return p

    def head(self, X, pre):
        cfg, w = self.cfg, self.w
        h = self.collapse(pre, X)
        hn = rmsnorm(h, w.bf16("norm.weight", (cfg.H,)), self.eps)
        return dot64(hn, w.bf16("head.weight", (cfg.V, cfg.H)).T)  # FP32 logits

    def forward(self, ids, keep_layers=True):
        """Oracle forward over the prompt (schedule 6(a), window floor 0):
        (logits [T, V] FP32, [LayerResult per layer])."""
        ctx = Context(ids)
        X = self.embed(ctx.ids)
        pre = self.e0(ctx.T)
        layers = []
        for l in range(self.cfg.L):
            res = self.run_layer(l, X, pre, ctx)
            X, pre = res.x_out, res.pre_out
            if keep_layers:
                layers.append(res)
            else:
                layers.append(_slim(res))
        return self.head(X, pre), layers


def _slim(res):
    s = LayerResult()
    s.sel, s.experts = res.sel, res.experts
    return s
