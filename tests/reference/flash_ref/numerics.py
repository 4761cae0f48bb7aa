"""Number formats and quantizers of MODEL.md section 4, bit-exact.

Conventions: every "FP32" array is a numpy float32 array; BF16 values are carried as float32
arrays whose low 16 bits are zero. Codes are uint8 arrays. Nothing here uses an approximate
log2: exponents come from the float bits.

float32 division in numpy is IEEE correctly rounded (RN), which is MODEL.md's fl(a/b).
Multiplying / dividing by a power of two is exact unless the result is subnormal, in which
case IEEE RN applies (the same as __fdiv_rn).
"""
import numpy as np

F32 = np.float32

# ---------------------------------------------------------------------------------------------
# BF16


def _check_f32(x, what):
    if not (isinstance(x, np.ndarray) and x.dtype == np.float32):
        raise TypeError("%s expects a float32 ndarray, got %r" %
                        (what, getattr(x, "dtype", type(x))))


def bf16_round(x):
    """BF16(x): round-to-nearest-even of an FP32 array to BF16, returned as float32.

    Overflow rounds to +-inf as IEEE RNE does; NaN stays (quiet) NaN.
    """
    x = np.asarray(x)
    _check_f32(x, "bf16_round")
    u = x.view(np.uint32)
    r = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    nan = np.isnan(x)
    if nan.any():
        r = np.where(nan, (u | np.uint32(0x00400000)) & np.uint32(0xFFFF0000), r)
    return r.astype(np.uint32).view(np.float32)


def bf16_bits(x):
    """uint16 BF16 codes of BF16(x)."""
    return (bf16_round(x).view(np.uint32) >> np.uint32(16)).astype(np.uint16)


def bf16_to_f32(codes):
    """Widen uint16 BF16 codes to float32 exactly (code << 16)."""
    c = np.asarray(codes, dtype=np.uint16)
    return (c.astype(np.uint32) << np.uint32(16)).view(np.float32)


# ---------------------------------------------------------------------------------------------
# exponent helpers

def _f32_exp_field(a):
    """Unbiased exponent of |a| from its bits, -127 for zero and FP32 subnormals."""
    bits = np.asarray(a, dtype=np.float32).view(np.uint32)
    return ((bits >> np.uint32(23)) & np.uint32(0xFF)).astype(np.int32) - 127


def exp2i(e):
    """2**e as float32 for integer array e in [-149, 127], exact (built from bits)."""
    e = np.asarray(e, dtype=np.int64)
    if np.any(e < -149) or np.any(e > 127):
        raise ValueError("exp2i: exponent out of FP32 range")
    normal = e >= -126
    bits = np.where(normal, (e + 127) << 23, np.left_shift(1, np.clip(e + 149, 0, 22)))
    return bits.astype(np.uint32).view(np.float32)


def ceil2(r):
    """Exponent of the smallest power of two >= r for FP32 r > 0, read from r's bits,
    clamped to [-127, 127] (MODEL.md section 4, [tandem]).

    r == 0 (only possible where no floor applies, e.g. an all-zero weight block) gives -127.
    """
    r = np.asarray(r, dtype=np.float32)
    if np.any(np.isnan(r)) or np.any(r < 0):
        raise ValueError("ceil2: argument must be >= 0 and not NaN")
    bits = r.view(np.uint32)
    E = ((bits >> np.uint32(23)) & np.uint32(0xFF)).astype(np.int64)
    M = (bits & np.uint32(0x7FFFFF)).astype(np.int64)
    normal = E - 127 + (M != 0)
    # subnormal r = M * 2^-149: ceil(log2 M) exactly via frexp (M < 2^23 is exact in double)
    frac, ex = np.frexp(M.astype(np.float64))
    clog2 = np.where(frac == 0.5, ex - 1, ex).astype(np.int64)
    sub = -149 + clog2
    out = np.where(E > 0, normal, np.where(M > 0, sub, -127))
    return np.clip(out, -127, 127).astype(np.int32)


# ---------------------------------------------------------------------------------------------
# UE8M0

def ue8m0_decode(codes):
    """2^(u-127) as float32 (u = 255 is NaN, never written)."""
    c = np.asarray(codes, dtype=np.int64)
    out = exp2i(np.clip(c - 127, -127, 127))  # 2^-127 is an FP32 subnormal, exact
    return np.where(c == 255, np.float32(np.nan), out).astype(np.float32)


def ue8m0_encode_exp(e):
    """UE8M0 code of the power of two 2^e, e in [-127, 127]."""
    e = np.asarray(e, dtype=np.int64)
    if np.any(e < -127) or np.any(e > 127):
        raise ValueError("ue8m0: exponent out of range")
    return (e + 127).astype(np.uint8)


# ---------------------------------------------------------------------------------------------
# E4M3 (OCP E4M3FN)

def _e4m3_table():
    t = np.zeros(256, dtype=np.float32)
    for c in range(256):
        s = -1.0 if c & 0x80 else 1.0
        e = (c >> 3) & 0xF
        m = c & 7
        if e == 0xF and m == 7:
            v = np.nan
        elif e == 0:
            v = m * 2.0 ** -9
        else:
            v = (1 + m / 8.0) * 2.0 ** (e - 7)
        t[c] = s * v
    return t


E4M3_TABLE = _e4m3_table()
E4M3_MAX = np.float32(448.0)


def e4m3_decode(codes):
    return E4M3_TABLE[np.asarray(codes, dtype=np.uint8)]


def e4m3_encode(x):
    """FP32 -> E4M3 codes: clamp to +-448, then RNE (subnormals included); the sign bit is
    the input's (a negative value rounding to zero gives 0x80). NaN input is an error."""
    x = np.asarray(x)
    _check_f32(x, "e4m3_encode")
    if np.isnan(x).any():
        raise ValueError("e4m3_encode: NaN input")
    sign = np.signbit(x)
    a = np.minimum(np.abs(x), E4M3_MAX)
    qe = np.maximum(_f32_exp_field(a), -6) - 3          # quantum exponent: 2^(e-3), >= 2^-9
    k = np.rint(a * exp2i(-qe))                          # exact scaling, RNE to integer 0..16
    code = (qe + 9) * 8 + k.astype(np.int32)             # continuous across binades
    return (code | np.where(sign, 0x80, 0)).astype(np.uint8)


# ---------------------------------------------------------------------------------------------
# E2M1 (FP4)

E2M1_TABLE = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6],
                      dtype=np.float32)


def e2m1_decode(codes):
    return E2M1_TABLE[np.asarray(codes, dtype=np.uint8) & 0xF]


def e2m1_encode(x):
    """FP32 -> E2M1 nibble codes (uint8 0..15): RNE saturating at +-6, ties to even mantissa;
    the sign bit is the input's (negative rounding to zero gives 0x8). NaN is an error."""
    x = np.asarray(x)
    _check_f32(x, "e2m1_encode")
    if np.isnan(x).any():
        raise ValueError("e2m1_encode: NaN input")
    sign = np.signbit(x)
    a = np.minimum(np.abs(x), np.float32(6.0))
    qe = np.maximum(_f32_exp_field(a), 0) - 1            # quantum 0.5 below 2, 1 in [2,4), 2 above
    k = np.rint(a * exp2i(-qe))
    code = (qe + 1) * 2 + k.astype(np.int32)
    return (code | np.where(sign, 0x8, 0)).astype(np.uint8)


def e2m1_unpack(packed):
    """Packed bytes [..., n/2] -> nibble codes [..., n]: byte b holds element 2b in the low
    nibble and 2b+1 in the high nibble."""
    p = np.asarray(packed, dtype=np.uint8)
    out = np.empty(p.shape[:-1] + (p.shape[-1] * 2,), dtype=np.uint8)
    out[..., 0::2] = p & 0xF
    out[..., 1::2] = p >> 4
    return out


def e2m1_pack(codes):
    c = np.asarray(codes, dtype=np.uint8)
    return ((c[..., 0::2] & 0xF) | ((c[..., 1::2] & 0xF) << 4)).astype(np.uint8)


# ---------------------------------------------------------------------------------------------
# quantizers (QDQ). Each returns (dequantized FP32 values, value codes, scale codes); groups are
# contiguous along the last axis.

ACT8_FLOOR = np.float32(1e-4)
MX4_FLOOR = np.float32(6.0 * 2.0 ** -126)
CKV_SCALE_MIN = np.float32(2.0 ** -9)


def _groups(x, g, what):
    x = np.asarray(x)
    _check_f32(x, what)
    n = x.shape[-1]
    if n % g:
        raise ValueError("%s: last dim %d not a multiple of %d" % (what, n, g))
    return x.reshape(x.shape[:-1] + (n // g, g))


def _pow2_scale_quant(x, group, floor, qmax, encode, decode, what):
    xg = _groups(x, group, what)
    if np.isnan(xg).any():
        raise ValueError("%s: NaN input" % what)
    amax = np.max(np.abs(xg), axis=-1, keepdims=True)
    if floor is not None:
        amax = np.maximum(amax, floor)
    e = ceil2(amax / qmax)                    # fl(amax/qmax), then exact ceil2 from the bits
    s = exp2i(e)
    codes = encode(xg / s)                    # division by a power of two
    with np.errstate(over="ignore"):          # only for |x| near FLT_MAX: 4 * 2^126 = inf
        deq = decode(codes) * s
    return (deq.reshape(np.shape(x)).astype(np.float32), codes.reshape(np.shape(x)),
            ue8m0_encode_exp(e[..., 0]))


def q_act8(x):
    """Q_act8: groups of 32, s = 2^ceil2(fl(amax/448)) (UE8M0), floor amax >= 1e-4, E4M3(x/s)."""
    return _pow2_scale_quant(x, 32, ACT8_FLOOR, E4M3_MAX, e4m3_encode, e4m3_decode, "Q_act8")


def q_swa(x):
    """Q_swa: identical to Q_act8 (window KV rows, DSpark context KV)."""
    return _pow2_scale_quant(x, 32, ACT8_FLOOR, E4M3_MAX, e4m3_encode, e4m3_decode, "Q_swa")


def q_mx4(x):
    """Q_mx4: groups of 32, s = 2^ceil2(fl(amax/6)) (UE8M0), floor amax >= 6*2^-126, E2M1(x/s)."""
    return _pow2_scale_quant(x, 32, MX4_FLOOR, np.float32(6.0), e2m1_encode, e2m1_decode, "Q_mx4")


def q_ckv(x):
    """Q_ckv: groups of 16, s = E4M3(clamp(fl(amax/6), 2^-9, 448)), codes E2M1(fl(x/s))."""
    xg = _groups(x, 16, "Q_ckv")
    if np.isnan(xg).any():
        raise ValueError("Q_ckv: NaN input")
    amax = np.max(np.abs(xg), axis=-1, keepdims=True)
    r = np.clip(amax / np.float32(6.0), CKV_SCALE_MIN, E4M3_MAX).astype(np.float32)
    scode = e4m3_encode(r)
    s = e4m3_decode(scode)
    codes = e2m1_encode((xg / s).astype(np.float32))    # fl(x/s), correctly rounded
    deq = e2m1_decode(codes) * s
    return (deq.reshape(np.shape(x)).astype(np.float32), codes.reshape(np.shape(x)),
            scode[..., 0])


def qdq_act8(x):
    return q_act8(x)[0]


# ---------------------------------------------------------------------------------------------
# weight storage quantization (MODEL.md 12.7) and dequantization (section 3)

def quant_fp8_block(w):
    """FP8 dense: one UE8M0 scale per 32x32 block, s = 2^ceil2(fl(amax/448)), E4M3(w/s).
    No floor (12.7); an all-zero block gets 2^-127. Returns (codes [o,i], scales [ceil(o/32),
    ceil(i/32)])."""
    w = np.asarray(w, dtype=np.float32)
    o, i = w.shape
    bo, bi = -(-o // 32), -(-i // 32)
    pad = np.zeros((bo * 32, bi * 32), np.float32)
    pad[:o, :i] = w
    blk = pad.reshape(bo, 32, bi, 32)
    amax = np.max(np.abs(blk), axis=(1, 3))
    e = ceil2(amax / E4M3_MAX)
    s = exp2i(e)
    codes = e4m3_encode((blk / s[:, None, :, None]).astype(np.float32))
    return codes.reshape(bo * 32, bi * 32)[:o, :i].copy(), ue8m0_encode_exp(e)


def dequant_fp8_block(codes, scales):
    codes = np.asarray(codes, np.uint8)
    o, i = codes.shape
    s = ue8m0_decode(scales)
    sfull = np.repeat(np.repeat(s, 32, axis=0), 32, axis=1)[:o, :i]
    return (e4m3_decode(codes) * sfull).astype(np.float32)


def quant_mxfp4_rows(w):
    """MXFP4 experts: one UE8M0 per (row, 32 along K), s = 2^ceil2(fl(amax/6)), E2M1(w/s).
    Returns (packed uint8 [o, i/2], scales [o, i/32])."""
    w = np.asarray(w, dtype=np.float32)
    o, i = w.shape
    g = w.reshape(o, i // 32, 32)
    amax = np.max(np.abs(g), axis=-1, keepdims=True)
    e = ceil2(amax / np.float32(6.0))
    s = exp2i(e)
    codes = e2m1_encode((g / s).astype(np.float32)).reshape(o, i)
    return e2m1_pack(codes), ue8m0_encode_exp(e[..., 0])


def dequant_mxfp4_rows(packed, scales):
    codes = e2m1_unpack(packed)
    o, i = codes.shape
    s = ue8m0_decode(scales)
    return (e2m1_decode(codes).reshape(o, i // 32, 32) * s[:, :, None]).reshape(o, i)


def dequant_rows32(codes, scales):
    """E4M3 rows with one UE8M0 per 32 columns (Engram tables)."""
    codes = np.asarray(codes, np.uint8)
    d = codes.shape[-1]
    s = ue8m0_decode(scales)
    v = e4m3_decode(codes).reshape(codes.shape[:-1] + (d // 32, 32)) * s[..., None]
    return v.reshape(codes.shape).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# misc integer helpers

MASK64 = (1 << 64) - 1


def splitmix64(x):
    """First output of a SplitMix64 generator with state x (MODEL.md 12.8), Python ints."""
    z = (x + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)
