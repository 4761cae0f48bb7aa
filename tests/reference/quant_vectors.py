#!/usr/bin/python3
"""Golden vectors for the section-4 codecs and quantizers, for bit-exact comparison with a C /
CUDA implementation on identical FP32 input (MODEL.md 6(e)).

  quant_vectors.py --out FILE.json [--seed N] [--groups N]

JSON: {"format": "tandem-quant-vectors-1", "cases": {NAME: {"group": g, "x": [u32 bits...],
"codes": [...], "scales": [...]}}, "bf16": {"x": [u32], "bits": [u16]}, "e4m3": {...},
"e2m1": {...}, "ceil2": {"x": [u32], "e": [...]}}. Floats are given as their IEEE-754 bit
patterns (uint32) so nothing is lost in decimal. For Q_act8 / Q_swa / Q_mx4 "scales" are UE8M0
codes; for Q_ckv they are E4M3 codes. Each case's x is a whole number of groups.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flash_ref import numerics as nx  # noqa: E402


def bits(a):
    return np.asarray(a, np.float32).view(np.uint32).tolist()


def edge_values():
    v = [0.0, -0.0, 1e-45, -1e-45, 1e-38, 2.0 ** -126, 2.0 ** -127, 2.0 ** -9, 2.0 ** -10,
         3 * 2.0 ** -10, 15 * 2.0 ** -10, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 7.0, 448.0,
         464.0, 480.0, 1e4, 3e38, 1e-4, 1e-4 / 448, 6 * 2.0 ** -126, 1.0625, 1.1875]
    return np.array(v + [-x for x in v], np.float32)


def groups(rng, g, n):
    """n groups of g values: random normal at many scales, sparse, all-zero, edge mixes."""
    out = []
    scales = [1e-8, 1e-5, 1e-4, 1e-3, 0.01, 0.1, 1.0, 6.0, 10.0, 100.0, 448.0, 1e3, 1e5]
    for k in range(n):
        kind = k % 6
        if kind == 0:
            x = rng.standard_normal(g) * scales[k % len(scales)]
        elif kind == 1:
            x = np.zeros(g)
        elif kind == 2:
            x = rng.choice(edge_values(), size=g)
        elif kind == 3:
            x = np.zeros(g)
            x[rng.integers(0, g)] = rng.standard_normal() * scales[(k // 6) % len(scales)]
        elif kind == 4:    # exact ties after scaling by a power of two
            x = rng.integers(-16, 17, size=g) * 0.25 * 2.0 ** int(rng.integers(-20, 10))
        else:
            x = rng.uniform(-1, 1, size=g) * 2.0 ** float(rng.uniform(-30, 20))
        out.append(np.asarray(x, np.float32))
    return np.concatenate(out).astype(np.float32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--groups", type=int, default=300)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    cases = {}
    for name, fn, g in (("q_act8", nx.q_act8, 32), ("q_swa", nx.q_swa, 32),
                        ("q_mx4", nx.q_mx4, 32), ("q_ckv", nx.q_ckv, 16)):
        x = groups(rng, g, a.groups)
        _, codes, scales = fn(x)
        cases[name] = {"group": g, "x": bits(x), "codes": codes.astype(int).tolist(),
                       "scales": scales.astype(int).tolist()}
    xs = np.concatenate([edge_values(), (rng.standard_normal(2000) *
                                         np.exp(rng.uniform(-20, 8, 2000))).astype(np.float32)])
    doc = {
        "format": "tandem-quant-vectors-1",
        "source": "tests/reference/flash_ref/numerics.py",
        "cases": cases,
        "bf16": {"x": bits(xs), "bits": nx.bf16_bits(xs).astype(int).tolist()},
        "e4m3": {"x": bits(xs), "codes": nx.e4m3_encode(xs).astype(int).tolist()},
        "e2m1": {"x": bits(xs), "codes": nx.e2m1_encode(xs).astype(int).tolist()},
        "ceil2": {"x": bits(np.abs(xs[np.abs(xs) > 0])),
                  "e": nx.ceil2(np.abs(xs[np.abs(xs) > 0])).astype(int).tolist()},
    }
    with open(a.out, "w") as f:
        json.dump(doc, f)
    print("wrote %s: %s" % (a.out, ", ".join("%s %d groups" % (k, len(v["scales"]))
                                              for k, v in cases.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
