#!/usr/bin/python3
"""Unit checks of the Python reference against hand-worked values of MODEL.md.

  self_test.py [--quick]      (--quick skips the checks that build a tiny checkpoint)

Prints each failure and "N passed, N failed"; exits non-zero on any failure.
"""
import json
import math
import os
import struct
import sys
import tempfile
from fractions import Fraction

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flash_ref import numerics as nx                               # noqa: E402
from flash_ref import engram as eg                                  # noqa: E402
from flash_ref.config import Config, ConfigError                    # noqa: E402
from flash_ref.rope import yarn_lo_hi, inv_freq, Rope               # noqa: E402

PASSED = 0
FAILED = 0


def check(name, cond, detail=""):
    global PASSED, FAILED
    if cond:
        PASSED += 1
    else:
        FAILED += 1
        print("FAIL: %s %s" % (name, detail))


def f32(*v):
    return np.array(v, dtype=np.float32)


# ---------------------------------------------------------------------------------------------
def brute_nearest_even(x, table, codes):
    """Reference rounding: nearest table value by exact rational distance, ties to the even
    code (codes are ordered like the values; even code = even mantissa)."""
    fx = Fraction(float(x))
    best = None
    for v, c in zip(table, codes):
        dist = abs(Fraction(float(v)) - fx)
        key = (dist, c & 1)
        if best is None or key < best[0]:
            best = (key, c)
    return best[1]


def test_e2m1():
    ties = {0.25: 0.0, 0.75: 1.0, 1.25: 1.0, 1.75: 2.0, 2.5: 2.0, 3.5: 4.0, 5.0: 4.0}
    for x, want in ties.items():
        got = float(nx.e2m1_decode(nx.e2m1_encode(f32(x)))[0])
        check("E2M1 tie %g -> %g" % (x, want), got == want, "got %g" % got)
        gotn = nx.e2m1_decode(nx.e2m1_encode(f32(-x)))[0]
        check("E2M1 tie -%g -> -%g" % (x, want), float(gotn) == -want and np.signbit(gotn))
    check("E2M1 saturates 7 -> 6", nx.e2m1_encode(f32(7.0))[0] == 7)
    check("E2M1 saturates -1e30 -> -6", nx.e2m1_encode(f32(-1e30))[0] == 0xF)
    check("E2M1 +0 -> 0x0", nx.e2m1_encode(f32(0.0))[0] == 0x0)
    check("E2M1 -0 -> 0x8", nx.e2m1_encode(f32(-0.0))[0] == 0x8)
    check("E2M1 -0.2 -> 0x8 (negative rounding to zero keeps the sign)",
          nx.e2m1_encode(f32(-0.2))[0] == 0x8)
    codes = np.arange(16, dtype=np.uint8)
    rt = nx.e2m1_encode(nx.e2m1_decode(codes))
    check("E2M1 round trip of all codes", np.array_equal(rt, codes), str(rt))
    # against brute force on random and grid values
    pos_vals = nx.E2M1_TABLE[:8]
    rng = np.random.default_rng(1)
    xs = np.concatenate([rng.uniform(0, 7, 400), np.arange(0, 7.01, 0.125)]).astype(np.float32)
    got = nx.e2m1_encode(xs)
    want = [brute_nearest_even(min(x, 6.0), pos_vals, range(8)) for x in xs]
    check("E2M1 encode == brute-force RNE (%d values)" % len(xs), list(got) == want)


def test_e4m3():
    check("E4M3 max 448 -> 0x7E", nx.e4m3_encode(f32(448.0))[0] == 0x7E)
    check("E4M3 464 (tie above max) -> 0x7E", nx.e4m3_encode(f32(464.0))[0] == 0x7E)
    check("E4M3 1e6 clamps -> 0x7E", nx.e4m3_encode(f32(1e6))[0] == 0x7E)
    check("E4M3 -1e6 clamps -> 0xFE", nx.e4m3_encode(f32(-1e6))[0] == 0xFE)
    check("E4M3 decode 0x7E == 448", nx.e4m3_decode(np.uint8(0x7E)) == 448.0)
    check("E4M3 decode 0x7F is NaN", np.isnan(nx.e4m3_decode(np.uint8(0x7F))))
    check("E4M3 smallest subnormal 2^-9 -> 0x01", nx.e4m3_encode(f32(2.0 ** -9))[0] == 0x01)
    check("E4M3 2^-10 (tie) -> 0x00", nx.e4m3_encode(f32(2.0 ** -10))[0] == 0x00)
    check("E4M3 3*2^-10 (tie) -> 0x02", nx.e4m3_encode(f32(3 * 2.0 ** -10))[0] == 0x02)
    check("E4M3 max subnormal 7*2^-9 -> 0x07", nx.e4m3_encode(f32(7 * 2.0 ** -9))[0] == 0x07)
    check("E4M3 15*2^-10 (tie) -> 0x08 = 2^-6", nx.e4m3_encode(f32(15 * 2.0 ** -10))[0] == 0x08)
    check("E4M3 decode 0x08 == 2^-6", nx.e4m3_decode(np.uint8(0x08)) == 2.0 ** -6)
    check("E4M3 1.0625 (tie) -> 1.0", nx.e4m3_encode(f32(1.0625))[0] == 0x38)
    check("E4M3 1.1875 (tie) -> 1.25", nx.e4m3_encode(f32(1.1875))[0] == 0x3A)
    check("E4M3 -0 -> 0x80", nx.e4m3_encode(f32(-0.0))[0] == 0x80)
    check("E4M3 -2^-11 -> 0x80", nx.e4m3_encode(f32(-2.0 ** -11))[0] == 0x80)
    check("E4M3 +tiny -> 0x00", nx.e4m3_encode(f32(1e-30))[0] == 0x00)
    finite = np.array([c for c in range(256) if c & 0x7F != 0x7F], dtype=np.uint8)
    rt = nx.e4m3_encode(nx.e4m3_decode(finite))
    check("E4M3 round trip of all 254 finite codes", np.array_equal(rt, finite))
    pos_codes = list(range(0x7F))
    pos_vals = nx.E4M3_TABLE[:0x7F]
    rng = np.random.default_rng(2)
    xs = np.concatenate([np.exp(rng.uniform(math.log(2.0 ** -12), math.log(500), 600)),
                         (pos_vals[1:] + pos_vals[:-1]) / 2]).astype(np.float32)
    got = nx.e4m3_encode(xs)
    want = [brute_nearest_even(min(float(x), 448.0), pos_vals, pos_codes) for x in xs]
    check("E4M3 encode == brute-force RNE incl. all midpoints (%d values)" % len(xs),
          list(got) == want)
    try:
        nx.e4m3_encode(f32(np.nan))
        check("E4M3 NaN input rejected", False)
    except ValueError:
        check("E4M3 NaN input rejected", True)


def test_ceil2_bf16_ue8m0():
    one_up = np.nextafter(np.float32(1), np.float32(2))
    one_dn = np.nextafter(np.float32(1), np.float32(0))
    cases = [(1.0, 0), (one_up, 1), (one_dn, 0), (0.75, 0), (0.5, -1), (3.0, 2), (4.0, 2),
             (4.000001, 3), (2.0 ** -126, -126), (2.0 ** -127, -127), (1.5 * 2.0 ** -127, -126),
             (2.0 ** -149, -127), (2.0 ** -140, -127), (2.0 ** 127, 127), (3e38, 127),
             (1e-4 / 448, -22)]
    for r, want in cases:
        got = int(nx.ceil2(np.float32(r)))
        check("ceil2(%r) == %d" % (float(np.float32(r)), want), got == want, "got %d" % got)
    for k in range(-125, 127):
        p = np.float32(2.0 ** k)
        check_all = (int(nx.ceil2(p)) == k and
                     int(nx.ceil2(np.nextafter(p, np.float32(np.inf)))) == k + 1 and
                     int(nx.ceil2(np.nextafter(p, np.float32(0)))) == k)
        if not check_all:
            check("ceil2 around 2^%d" % k, False)
            break
    else:
        check("ceil2 around every power of two 2^-125..2^126", True)
    check("UE8M0 127 -> 1", nx.ue8m0_decode(np.uint8(127)) == 1.0)
    check("UE8M0 0 -> 2^-127", nx.ue8m0_decode(np.uint8(0)) == np.float32(2.0 ** -127))
    check("UE8M0 254 -> 2^127", nx.ue8m0_decode(np.uint8(254)) == np.float32(2.0 ** 127))
    b = nx.bf16_round(f32(1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, 1 + 2.0 ** -8 + 2.0 ** -20,
                          -(1 + 2.0 ** -8), 3.4e38, -0.0))
    check("BF16 RNE ties and overflow",
          list(b[:4]) == [1.0, 1 + 2.0 ** -6, 1 + 2.0 ** -7, -1.0] and np.isinf(b[4])
          and np.signbit(b[5]))
    codes = np.arange(0, 65536, 7, dtype=np.uint32).astype(np.uint16)
    v = nx.bf16_to_f32(codes)
    ok = ~np.isnan(v)
    check("BF16 widen/round round trip", np.array_equal(nx.bf16_bits(v[ok]), codes[ok]))


def test_quantizers():
    z32 = np.zeros(32, np.float32)
    deq, c, s = nx.q_act8(z32)
    check("Q_act8 all-zero group: floor scale 2^-22 (code 105), zero codes",
          s[0] == 105 and not c.any() and not deq.any())
    deq, c, s = nx.q_swa(-z32)
    check("Q_swa all -0 group: codes 0x80, scale 105", s[0] == 105 and (c == 0x80).all())
    deq, c, s = nx.q_mx4(z32)
    check("Q_mx4 all-zero group: floor scale 2^-126 (code 1)", s[0] == 1 and not c.any())
    deq, c, s = nx.q_ckv(np.zeros(16, np.float32))
    check("Q_ckv all-zero group: scale E4M3 2^-9 (0x01)", s[0] == 0x01 and not c.any())
    x = np.linspace(-448, 448, 32).astype(np.float32)
    deq, c, s = nx.q_act8(x)
    check("Q_act8 amax 448 -> scale 1 (code 127), codes E4M3(x)",
          s[0] == 127 and np.array_equal(c, nx.e4m3_encode(x)))
    x[5] = 449
    deq, c, s = nx.q_act8(x)
    check("Q_act8 amax 449 -> scale 2 (code 128)", s[0] == 128 and deq[5] == 448.0)
    x = np.full(32, 1e-6, np.float32)
    deq, c, s = nx.q_act8(x)
    check("Q_act8 below floor: s = 2^-22", s[0] == 105 and
          np.all(deq == nx.e4m3_decode(nx.e4m3_encode((x / np.float32(2.0 ** -22)))) * 2.0 ** -22))
    x = np.zeros(64, np.float32)
    x[0], x[1], x[2], x[32] = 6.0, 1.25, -0.75, 6.1
    deq, c, s = nx.q_mx4(x)
    check("Q_mx4 amax 6 -> s 1, amax 6.1 -> s 2", list(s) == [127, 128])
    check("Q_mx4 codes 6, 1.25->1, -0.75->-1", list(deq[:3]) == [6.0, 1.0, -1.0])
    x = np.zeros(16, np.float32)
    x[0], x[1] = 7.0, -1.0
    deq, c, s = nx.q_ckv(x)
    # r = fl(7/6) = 1.1666666 -> E4M3 1.125; 7/1.125 = 6.22 -> 6 (saturate) -> 6.75;
    # -1/1.125 = -0.889 -> -1 -> -1.125
    check("Q_ckv hand example (amax 7)", float(nx.e4m3_decode(s[0])) == 1.125 and
          deq[0] == 6.75 and deq[1] == -1.125, str((nx.e4m3_decode(s[0]), deq[:2])))
    x = np.full(16, 6000.0, np.float32)
    check("Q_ckv upper clamp 448", nx.e4m3_decode(nx.q_ckv(x)[2][0]) == 448.0)
    x = np.full(16, 1e-5, np.float32)
    check("Q_ckv lower clamp 2^-9", nx.q_ckv(x)[2][0] == 0x01)
    rng = np.random.default_rng(3)
    w = rng.standard_normal((70, 100)).astype(np.float32)
    codes, sc = nx.quant_fp8_block(w)
    check("FP8 block scales shape [ceil(o/32), ceil(i/32)]", sc.shape == (3, 4))
    wd = nx.dequant_fp8_block(codes, sc)
    check("FP8 block QDQ within E4M3 precision",
          np.max(np.abs(wd - w) / np.maximum(np.abs(w), 2.0 ** -6 * np.abs(w).max())) < 0.07)
    w = rng.standard_normal((4, 64)).astype(np.float32)
    packed, sc = nx.quant_mxfp4_rows(w)
    check("MXFP4 shapes", packed.shape == (4, 32) and sc.shape == (4, 2))
    check("MXFP4 nibble order (low = even element)",
          np.array_equal(nx.e2m1_unpack(np.array([[0x21]], np.uint8)), [[1, 2]]))


def test_yarn_rope():
    full = Config({})
    lo, hi = yarn_lo_hi(full.d_r, full.compress_rope_theta, full.rope_scaling)
    check("YaRN full model lo=15 hi=25", (lo, hi) == (15, 25), str((lo, hi)))
    lo, hi = yarn_lo_hi(16, 160000.0, full.rope_scaling)
    check("YaRN tiny (d_r 16) lo=3 hi=7", (lo, hi) == (3, 7), str((lo, hi)))
    f = inv_freq(64, 160000.0, full.rope_scaling)
    plain = inv_freq(64, 160000.0, None)
    check("YaRN f_i unchanged below lo, /factor above hi",
          np.array_equal(f[:16], plain[:16]) and
          np.array_equal(f[26:], (np.float64(160000.0) ** (-2.0 * np.arange(26, 32) / 64) / 16)
                         .astype(np.float32)))
    check("f_i FP32 of double theta^(-2i/d_r)",
          inv_freq(16, 10000.0)[1] == np.float32(10000.0 ** (-2.0 / 16)))
    r = Rope(16, 10000.0)
    c, s = r.table([3])
    ang = np.float32(np.float32(3) * r.f[2])
    check("RoPE angle fl32(fl32(pos)*f_i), cos/sin in double -> FP32",
          c[0, 2] == np.float32(math.cos(float(ang))) and s[0, 2] == np.float32(math.sin(float(ang))))
    x = np.zeros((1, 32), np.float32)
    x[0, 16], x[0, 17] = 1.0, 0.0
    y = r.apply(x, [1])
    check("RoPE rotates the last d_r dims, pair (x16, x17)",
          y[0, 16] == nx.bf16_round(f32(math.cos(1.0)))[0] and
          y[0, 17] == nx.bf16_round(f32(math.sin(1.0)))[0] and not y[0, :16].any())
    z = r.apply(y, [1], inverse=True)
    check("inverse RoPE undoes RoPE (to BF16)", abs(z[0, 16] - 1) < 2 ** -7 and abs(z[0, 17]) < 2 ** -7)


def test_engram_config():
    full = Config({})
    pr = eg.engram_primes(full)
    check("Engram full layer 1 primes 16000057...16000463 (24)",
          pr[0][0] == 16000057 and pr[0][-1] == 16000463 and len(pr[0]) == 24)
    check("Engram full layer 14 primes 16000477...16000889",
          pr[1][0] == 16000477 and pr[1][-1] == 16000889 and len(pr[1]) == 24)
    check("Engram full prime sums == engram_num_embeddings",
          [sum(p) for p in pr] == [384006168, 384016682])
    check("Engram primes strictly increasing, globally unique",
          all(a < b for a, b in zip(pr[0] + pr[1], (pr[0] + pr[1])[1:])))
    off = eg.engram_offsets(pr[0])
    check("Engram offsets exclusive prefix sum", off[0] == 0 and off[1] == pr[0][0] and
          off[-1] == sum(pr[0][:-1]))
    mult = eg.release_multipliers(full, 99092)
    check("release multipliers layer 1",
          mult[0] == [76632096046245, 4839876093313, 35959672319349, 73987337458391], str(mult[0]))
    check("release multipliers layer 14",
          mult[1] == [67716810739261, 51510806800915, 30921347202721, 82619226485591], str(mult[1]))
    check("splitmix64(0) == 0xE220A8397B1DCDAF", nx.splitmix64(0) == 0xE220A8397B1DCDAF)
    bm = eg.b_mu(99092)
    check("b_mu and id*mu fit int64", bm == ((2 ** 63 - 1) // 99092) // 2 and
          (99092 - 1) * (2 * bm - 1) < 2 ** 63)
    tm, vc = eg.random_token_map(1024)
    check("random token_map tiny: V_c 520, pairs collapse",
          vc == 520 and tm[15] == 15 and tm[16] == 16 and tm[17] == 16 and tm[1023] == 519)
    check("random token_map small: V_c 16392", eg.random_token_map(32768)[1] == 16392)
    # roles
    R = full.role
    check("full roles", [l for l in R if R[l] == "Full"] == [2, 8, 14, 20] and
          [l for l in R if R[l] == "Reindex"] == [24, 28, 32, 36] and R[0] == R[1] == "SWA" and
          R[3] == "Reuse" and R[39] == "Reuse" and full.kv_src[7] == 2 and full.kv_src[39] == 20
          and full.idx_src[25] == 24 and full.idx_src[21] == 20 and full.ced_cut == 20 and
          full.candidate_consumers == [24, 28, 32, 36])
    from make_random_ckpt import make_config
    tiny = Config(make_config("tiny"))
    R = tiny.role
    check("tiny roles: Full 2,4; Reindex 6; Reuse 3,5,7; c = 4",
          [l for l in R if R[l] == "Full"] == [2, 4] and [l for l in R if R[l] == "Reindex"] == [6]
          and [l for l in R if R[l] == "Reuse"] == [3, 5, 7] and tiny.ced_cut == 4 and
          tiny.candidate_consumers == [6])
    pt = eg.engram_primes(tiny)
    check("tiny Engram primes 1009..1033 / 1039..1069",
          pt[0] == [1009, 1013, 1019, 1021, 1031, 1033] and
          pt[1] == [1039, 1049, 1051, 1061, 1063, 1069])
    small = Config(make_config("small"))
    check("small config validates; roles Full 2,5,8 Reindex 12; c 8",
          [l for l in small.role if small.role[l] == "Full"] == [2, 5, 8] and
          [l for l in small.role if small.role[l] == "Reindex"] == [12] and small.ced_cut == 8)
    from flash_ref.inventory import param_counts
    bb, egt, ds, tot = param_counts(tiny)
    check("tiny params 2.05 M / 0.40 M / 0.49 M / 2.94 M (section 9)",
          (round(bb / 1e6, 2), round(egt / 1e6, 2), round(ds / 1e6, 2), round(tot / 1e6, 2)) ==
          (2.05, 0.40, 0.49, 2.94), str((bb, egt, ds, tot)))
    bb, egt, ds, tot = param_counts(small)
    check("small params 93.9 M / 6.4 M / 8.0 M / 108.3 M (section 9)",
          (round(bb / 1e6, 1), round(egt / 1e6, 1), round(ds / 1e6, 1), round(tot / 1e6, 1)) ==
          (93.9, 6.4, 8.0, 108.3), str((bb, egt, ds, tot)))
    # aliases and errors
    flat = {"dim": 128, "n_layers": 8, "n_heads": 4, "head_dim": 64, "rope_head_dim": 16,
            "q_lora_rank": 64, "o_groups": 2, "o_lora_rank": 32, "window_size": 16,
            "moe_inter_dim": 32, "n_activated_experts": 2, "score_func": "sqrtsoftplus",
            "route_scale": 2.5, "norm_eps": 1e-6, "original_seq_len": 4096, "rope_factor": 4,
            "compress_ratios": [0, 0, 2, 2, 1, 1, 1, 1, 0, 0, 0], "kv_source_layers": [2, 4],
            "index_source_layers": [2, 4, 6], "candidate_source_layer": 4,
            "candidate_topk_blocks": 4, "candidate_block_size": 4, "index_topk": 8,
            "index_n_heads": 4, "index_head_dim": 32, "n_routed_experts": 8, "n_mtp_layers": 3,
            "engram_layer_ids": [1, 2], "engram_n_heads": 2, "engram_head_dim": 32,
            "engram_vocab_size": 1000, "engram_num_embeddings": [6126, 6332], "engram_pad_id": 2,
            "dspark_n_activated_experts": 2, "vocab_size": 1024,
            "dspark_target_layer_ids": [5, 6, 7]}
    c = Config(flat)
    check("flat inference/config.json aliases",
          c.H == 128 and c.L == 8 and c.W == 16 and c.K == 2 and c.routed_scaling_factor == 2.5
          and c.rms_norm_eps == 1e-6 and c.rope_scaling["original_max_position_embeddings"] == 4096
          and c.rope_scaling["factor"] == 4 and c.candidate_source == 4 and c.role[6] == "Reindex"
          and c.dspark_num_experts_per_tok == 2)
    c = Config({"text_config": {"rope_parameters": {"main": {"rope_theta": 5000.0},
                                                    "compress": {"rope_type": "yarn", "factor": 8,
                                                                 "rope_theta": 90000.0}}}})
    check("rope_parameters {main, compress}", c.rope_scaling["factor"] == 8 and
          c.rope_theta == 5000.0 and c.compress_rope_theta == 90000.0)
    for bad, field in (({"hidden_size": "5120"}, "hidden_size"),
                       ({"compress_ratios": [0, 3]}, "compress_ratios"),
                       ({"num_key_value_heads": 2}, "num_key_value_heads"),
                       ({"engram_num_embeddings": [1, 2]}, "engram_num_embeddings"),
                       ({"index_topk": 100000}, "candidate_topk_blocks"),
                       ({"o_groups": 7}, "o_groups")):
        try:
            Config({"text_config": bad})
            check("config error names %s" % field, False)
        except ConfigError as e:
            check("config error names %s" % field, field in str(e), str(e))
    c = Config({"text_config": {"vocab_size": 7}, "hidden_size": 256})
    check("text_config first, then top level", c.V == 7 and c.H == 256)


def test_model(tmp):
    import make_random_ckpt as mk
    from flash_ref.model import Model
    from flash_ref.incremental import IncrementalDecoder
    from flash_ref import dumps
    from flash_ref.safetensors_io import Checkpoint, SafetensorsFile
    import teacher_forced as tf
    d = os.path.join(tmp, "tiny")
    mk.write_checkpoint(d, "tiny", seed=99)
    ck = Checkpoint(d)
    check("checkpoint sharded with index", len(ck.files) == 3 and
          os.path.exists(os.path.join(d, "model.safetensors.index.json")))
    check("FP4 expert stored I8 [I, H/2] + scale [I, H/32]",
          ck.dtype("layers.0.ffn.experts.0.w1.weight") == "I8" and
          ck.shape("layers.0.ffn.experts.0.w1.weight") == (32, 64) and
          ck.shape("layers.0.ffn.experts.0.w1.scale") == (32, 4))
    check("FP8 scale [ceil(o/32), ceil(i/32)] F8_E8M0",
          ck.dtype("layers.0.attn.wq_b.scale") == "F8_E8M0" and
          ck.shape("layers.0.attn.wq_b.scale") == (8, 2))
    check("Engram table rows = engram_num_embeddings",
          ck.shape("layers.2.engram.embed.weight") == (6332, 32) and
          ck.shape("layers.2.engram.embed.scale") == (6332, 1))
    side = SafetensorsFile(os.path.join(d, "engram-hash.safetensors"))
    check("sidecar tensors/metadata", side.dtype("token_map") == "I32" and
          side.shape("multipliers") == (2, 4) and side.shape("primes") == (2, 6) and
          side.metadata.get("compressed_vocab_size") == "520")
    ok, lines = mk.sanity(d, seed=99, n_tokens=256)
    check("9.1 sanity on a random tiny checkpoint", ok, "\n".join(lines))
    model = Model(d)
    cfg = model.cfg
    # Engram hash by hand at position 1 for layer 1
    ids = np.array([5, 40, 1000, 17], np.int64)
    rows = model.engram.rows(1, ids)
    tmap = model.engram.token_map
    mu = model.engram.multipliers[0]
    P, O = model.engram.primes[0], model.engram.offsets[0]
    v = [int(tmap[40]), int(tmap[5]), int(tmap[2]), int(tmap[2])]
    h = v[0] * mu[0]
    want = []
    for s in range(1, 4):
        h ^= v[s] * mu[s]
        for k in range(2):
            col = (s - 1) * 2 + k
            want.append(h % P[col] + O[col])
    check("Engram hash by hand (position 1, pad after start)", rows[1].tolist() == want)
    rng = np.random.default_rng(4)
    T = 48
    ids = rng.integers(0, 1022, size=T)
    logits, layers = model.forward(ids)
    check("forward logits finite, |logit| <= 1e4", np.isfinite(logits).all() and
          np.abs(logits).max() <= 1e4)
    dec = IncrementalDecoder(model)
    same = True
    for t in range(T):
        lg, pl = dec.step(ids[t])
        same &= np.array_equal(lg, logits[t])
        for l, (s, e) in enumerate(pl):
            same &= np.array_equal(s, layers[l].sel[t]) and np.array_equal(e, layers[l].experts[t])
    check("layer-major forward == token-by-token decoder with rings/pending halves (bit-exact)",
          same)
    sel6 = layers[6].sel
    check("Reindex consumer selects within the pool and k_I rows once n_c > k_I",
          (sel6[T - 1] >= 0).sum() == cfg.k_I)
    check("ratio-0 layers select nothing", (layers[0].sel == -1).all())
    check("ratio-2 query t=0 sees no rows, t=1 sees row 0",
          (layers[2].sel[0] == -1).all() and layers[2].sel[1][0] == 0 and
          (layers[2].sel[1][1:] == -1).all())
    dd = os.path.join(tmp, "dump")
    dumps.write_layers(dd, layers, cfg, ids.tolist())
    lf = os.path.join(tmp, "logits.bin")
    dumps.write_logits(lf, logits)
    raw = open(lf, "rb").read()
    check("TDLOGIT1 header layout", raw[:8] == b"TDLOGIT1" and
          struct.unpack("<IIiI", raw[8:24]) == (T, cfg.V, 0, 0) and raw[24:32] == b"\0" * 8 and
          len(raw) == 32 + 4 * T * cfg.V)
    man = json.load(open(os.path.join(dd, "manifest.json")))
    check("dump manifest shapes", man["files"]["3.in.f32"]["shape"] == [T, 4, 128] and
          man["files"]["3.sel.i32"]["shape"] == [T, 8] and
          man["files"]["3.experts.i32"]["shape"] == [T, 2])
    dump = dumps.LayerDump(dd, cfg)
    rep = tf.run(model, dump, ids.tolist(), list(range(cfg.L)), logits_file=lf, verbose=False)
    check("teacher-forced reference vs its own dump: every layer rel L2 0",
          rep["ok"] and all(r["rel_l2"] == 0 for r in rep["layers"]) and
          rep["head"]["rel_l2"] == 0)
    for l in range(cfg.L):
        os.remove(os.path.join(dd, "%d.pre.f32" % l))
    rep = tf.run(model, dumps.LayerDump(dd, cfg), ids.tolist(), [3, 6], verbose=False)
    check("teacher-forced with recomputed pre (no l.pre.f32) is exact on its own dump",
          rep["ok"] and all(r["rel_l2"] == 0 for r in rep["layers"]))


def main():
    quick = "--quick" in sys.argv
    test_e2m1()
    test_e4m3()
    test_ceil2_bf16_ue8m0()
    test_quantizers()
    test_yarn_rope()
    test_engram_config()
    if not quick:
        with tempfile.TemporaryDirectory() as tmp:
            test_model(tmp)
    print("%d passed, %d failed" % (PASSED, FAILED))
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
