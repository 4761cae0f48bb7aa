"""Engram hashing tables (MODEL.md section 5.6, 9.2).

primes / offsets are recomputed from the config; multipliers and token_map come from the
sidecar engram-hash.safetensors (checked against the rules of 9.2); for random checkpoints the
sidecar contents are defined by 9.2 and can be generated here.
"""
import numpy as np

from .numerics import splitmix64


def _is_prime(n):
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    f = 3
    while f * f <= n:
        if n % f == 0:
            return False
        f += 2
    return True


def engram_primes(cfg):
    """list (per Engram layer, config order) of lists of (N-1)*h_e primes, column order
    col = (n-2)*h_e + head: walk (layer, n = 2..N, head), each gets the smallest prime
    > engram_vocab_size - 1 not yet used (global across layers)."""
    N, he = cfg.engram_max_ngram_size, cfg.engram_n_heads
    cand = cfg.engram_vocab_size - 1
    out = []
    for _ in cfg.engram_layer_ids:
        ps = []
        for _n in range(2, N + 1):
            for _h in range(he):
                cand += 1
                while not _is_prime(cand):
                    cand += 1
                ps.append(cand)
        out.append(ps)
    return out


def engram_offsets(primes_layer):
    """Exclusive prefix sum of a layer's primes over columns."""
    o, acc = [], 0
    for p in primes_layer:
        o.append(acc)
        acc += p
    return o


def b_mu(v_c):
    """b_mu = max(1, floor(floor((2^63-1)/V_c)/2))."""
    return max(1, ((2 ** 63 - 1) // v_c) // 2)


def random_multipliers(cfg, v_c):
    """Random-checkpoint multipliers: mu_l[s] = 2*(splitmix64(10007*l + s) mod b_mu) + 1."""
    b = b_mu(v_c)
    return [[2 * (splitmix64(10007 * l + s) % b) + 1 for s in range(cfg.engram_max_ngram_size)]
            for l in cfg.engram_layer_ids]


def release_multipliers(cfg, v_c):
    """Real-checkpoint multipliers: numpy default_rng(10007*l).integers(0, b_mu, size=N,
    dtype=int64)*2 + 1 per Engram layer l."""
    b = b_mu(v_c)
    out = []
    for l in cfg.engram_layer_ids:
        r = np.random.default_rng(10007 * l).integers(0, b, size=cfg.engram_max_ngram_size,
                                                      dtype=np.int64)
        out.append([int(v) * 2 + 1 for v in r])
    return out


def random_token_map(V):
    """token_map[i] = i for i < 16, else 16 + floor((i-16)/2); V_c = 16 + ceil((V-16)/2)."""
    i = np.arange(V, dtype=np.int64)
    tm = np.where(i < 16, i, 16 + (i - 16) // 2).astype(np.int32)
    v_c = 16 + -(-(V - 16) // 2) if V > 16 else V
    return tm, v_c


class EngramTables:
    """token_map, per-layer multipliers, primes, offsets, validated (9.2)."""

    def __init__(self, cfg, token_map, multipliers, primes=None, offsets=None, v_c=None):
        self.cfg = cfg
        n_l = len(cfg.engram_layer_ids)
        N = cfg.engram_max_ngram_size
        self.token_map = np.asarray(token_map, dtype=np.int64)
        if self.token_map.shape != (cfg.vocab_size,):
            raise ValueError("engram sidecar: token_map shape %s != [V]" % (self.token_map.shape,))
        v_c = cfg.engram_compressed_vocab_size if v_c is None else v_c
        if self.token_map.min() < 0 or self.token_map.max() >= v_c:
            raise ValueError("engram sidecar: token_map out of [0, V_c)")
        b = b_mu(v_c)
        mult = np.asarray(multipliers, dtype=np.int64)
        if mult.shape != (n_l, N):
            raise ValueError("engram sidecar: multipliers shape %s != [%d, %d]" % (mult.shape, n_l, N))
        for v in mult.ravel().tolist():
            if v % 2 == 0 or v <= 0 or v > 2 * b - 1:
                raise ValueError("engram sidecar: multiplier %d not odd or > 2*b_mu-1" % v)
        self.multipliers = [[int(v) for v in row] for row in mult]
        self.primes = engram_primes(cfg)
        self.offsets = [engram_offsets(p) for p in self.primes]
        if primes is not None and np.asarray(primes, np.int64).tolist() != self.primes:
            raise ValueError("engram sidecar: primes differ from the config's")
        if offsets is not None and np.asarray(offsets, np.int64).tolist() != self.offsets:
            raise ValueError("engram sidecar: offsets differ from the config's")
        self.v_c = v_c

    def rows(self, layer, ids):
        """Table rows [T, (N-1)*h_e] for token ids [T] at Engram layer `layer` (int64).

        v_s = blocked_s ? token_map[pad] : token_map[id(p-s)], blocked_s = blocked_{s-1} or
        p-s < 0 or dead(p-s) (dead = image_token_id); h_0 = v_0*mu[0],
        h_s = h_{s-1} XOR v_s*mu[s]; row = (h_s mod P[col]) + O[col], col = (s-1)*h_e + k.
        """
        cfg = self.cfg
        li = cfg.engram_index[layer]
        N, he = cfg.engram_max_ngram_size, cfg.engram_n_heads
        ids = np.asarray(ids, dtype=np.int64)
        T = ids.shape[0]
        pad_v = int(self.token_map[cfg.engram_pad_token_id])
        dead = ids == cfg.image_token_id
        cid = self.token_map[np.clip(ids, 0, cfg.vocab_size - 1)]
        mu = self.multipliers[li]
        P = self.primes[li]
        O = self.offsets[li]
        out = np.zeros((T, (N - 1) * he), dtype=np.int64)
        blocked = np.zeros(T, dtype=bool)
        h = np.zeros(T, dtype=np.int64)
        pos = np.arange(T)
        for s in range(N):
            src = pos - s
            blocked = blocked | (src < 0) | np.where(src >= 0, dead[np.clip(src, 0, None)], True)
            v = np.where(blocked, pad_v, cid[np.clip(src, 0, None)]).astype(np.int64)
            prod = v * np.int64(mu[s])             # never overflows int64 (9.2)
            h = prod if s == 0 else np.bitwise_xor(h, prod)
            if s >= 1:
                for k in range(he):
                    col = (s - 1) * he + k
                    out[:, col] = h % np.int64(P[col]) + np.int64(O[col])
        return out
