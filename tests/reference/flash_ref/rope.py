"""RoPE tables (MODEL.md section 5, [tandem] table rule).

f_i = theta^(-2i/d_r) in double, YaRN-corrected in double for ratio>0 layers, rounded to
FP32; angle = fl32(fl32(pos) * f_i) (FP32 multiply); cos/sin evaluated in double on that FP32
angle and rounded to FP32. Rotation of pairs (x_{2i}, x_{2i+1}) of the last d_r dims in FP32,
result rounded to BF16 (R5).
"""
import math

import numpy as np

from .numerics import bf16_round


def yarn_lo_hi(d_r, theta, rope):
    L0 = float(rope["original_max_position_embeddings"])

    def corr(beta):
        return d_r * math.log(L0 / (2 * math.pi * float(beta))) / (2 * math.log(theta))

    lo = max(math.floor(corr(rope["beta_fast"])), 0)
    hi = min(math.ceil(corr(rope["beta_slow"])), d_r - 1)
    return lo, hi


def inv_freq(d_r, theta, rope=None):
    """FP32 f_i, i = 0..d_r/2-1; rope = YaRN dict (ratio>0 layers) or None (plain)."""
    out = []
    if rope is not None:
        lo, hi = yarn_lo_hi(d_r, theta, rope)
        factor = float(rope["factor"])
    for i in range(d_r // 2):
        f = float(theta) ** (-2.0 * i / d_r)
        if rope is not None:
            ramp = min(max((i - lo) / max(hi - lo, 0.001), 0.0), 1.0)
            f = f * (1 - ramp) + (f / factor) * ramp
        out.append(f)
    return np.array(out, dtype=np.float64).astype(np.float32)


class Rope:
    def __init__(self, d_r, theta, rope=None):
        self.d_r = d_r
        self.f = inv_freq(d_r, theta, rope)
        self._cache = {}

    def table(self, pos):
        """cos, sin FP32 [len(pos), d_r/2] for integer positions."""
        pos = np.asarray(pos, dtype=np.int64)
        ang = pos.astype(np.float32)[:, None] * self.f[None, :]     # fl32(fl32(pos) * f_i)
        a64 = ang.astype(np.float32).astype(np.float64)
        return np.cos(a64).astype(np.float32), np.sin(a64).astype(np.float32)

    def apply(self, x, pos, inverse=False):
        """Rotate the last d_r dims of x [..., P, (heads,) D] at positions pos [P].

        x has shape [P, D] or [P, n, D]; returns BF16-rounded float32 of the same shape."""
        x = np.asarray(x, dtype=np.float32)
        c, s = self.table(pos)
        if x.ndim == 3:
            c, s = c[:, None, :], s[:, None, :]
        D = x.shape[-1]
        out = x.copy()
        a = x[..., D - self.d_r::2]
        b = x[..., D - self.d_r + 1::2]
        if not inverse:
            out[..., D - self.d_r::2] = a * c - b * s
            out[..., D - self.d_r + 1::2] = a * s + b * c
        else:
            out[..., D - self.d_r::2] = a * c + b * s
            out[..., D - self.d_r + 1::2] = b * c - a * s
        return bf16_round(out)
