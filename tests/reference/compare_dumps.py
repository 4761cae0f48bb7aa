#!/usr/bin/python3
"""Compare two dumps of the same prompt (MODEL.md 12.10).

  compare_dumps.py A B [--min-cos X] [--min-top1 F] [--max-rel-l2 R] [--per-layer-json FILE]

A and B are both TDLOGIT1 files (logits: per-row cosine, top-1 agreement, max |diff|, rows
matched by position) or both --dump-layers directories (per layer: relative L2 of l.in and
l.out, ||A-B|| / ||B||, selection and expert agreement as sets per position). A directory may
also hold a logits file named logits.bin / logits.f32 / *.tdlogit, compared too.
Exit status 1 when a given threshold fails.
"""
import argparse
import glob
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flash_ref import dumps  # noqa: E402


def rel_l2(a, b):
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    nb = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / nb) if nb > 0 else float(np.linalg.norm(a - b))


def set_agreement(a, b):
    """fraction of rows whose non-negative entries are equal as sets; also mean Jaccard."""
    n = min(a.shape[0], b.shape[0])
    eq = 0
    jac = 0.0
    for t in range(n):
        sa = set(int(v) for v in a[t] if v >= 0)
        sb = set(int(v) for v in b[t] if v >= 0)
        eq += sa == sb
        u = sa | sb
        jac += (len(sa & sb) / len(u)) if u else 1.0
    return (eq / n if n else 1.0), (jac / n if n else 1.0), n


def compare_logits(fa, fb):
    ha, la = dumps.read_logits(fa)
    hb, lb = dumps.read_logits(fb)
    if ha["vocab"] != hb["vocab"]:
        raise SystemExit("vocab differs: %d vs %d" % (ha["vocab"], hb["vocab"]))
    pa = ha["first_position"] + np.arange(ha["rows"])
    pb = hb["first_position"] + np.arange(hb["rows"])
    common = np.intersect1d(pa, pb)
    if common.size == 0:
        raise SystemExit("no common positions")
    A = la[common - ha["first_position"]].astype(np.float64)
    B = lb[common - hb["first_position"]].astype(np.float64)
    cos = np.sum(A * B, 1) / np.maximum(np.linalg.norm(A, axis=1) * np.linalg.norm(B, axis=1),
                                        1e-300)
    top1 = np.argmax(A, 1) == np.argmax(B, 1)
    out = {"rows": int(common.size), "first": int(common[0]), "cos_mean": float(cos.mean()),
           "cos_min": float(cos.min()), "cos_min_pos": int(common[np.argmin(cos)]),
           "top1": float(top1.mean()), "max_abs_diff": float(np.max(np.abs(A - B))),
           "last_cos": float(cos[-1]), "last_top1": bool(top1[-1])}
    print("logits: %d common rows from position %d (schedules %d / %d)"
          % (out["rows"], out["first"], ha["schedule"], hb["schedule"]))
    print("  cosine mean %.6f min %.6f (at %d); last row %.6f"
          % (out["cos_mean"], out["cos_min"], out["cos_min_pos"], out["last_cos"]))
    print("  top-1 agreement %.2f %%; max |diff| %.4g"
          % (100 * out["top1"], out["max_abs_diff"]))
    return out


def find_logits(d):
    for pat in ("logits.bin", "logits.f32", "*.tdlogit", "logits*.bin"):
        hits = sorted(glob.glob(os.path.join(d, pat)))
        if hits:
            return hits[0]
    return None


def compare_layers(da, db, max_rel):
    A = dumps.LayerDump(da)
    B = dumps.LayerDump(db)
    la, lb = A.layers(), B.layers()
    common = [l for l in la if l in lb]
    rows = []
    print("layers: %d in A, %d in B, %d common" % (len(la), len(lb), len(common)))
    print("  %5s %12s %12s %10s %8s %10s %8s" % ("layer", "relL2(in)", "relL2(out)", "sel=",
                                                   "selJac", "experts=", "expJac"))
    worst = 0.0
    for l in common:
        r = {"layer": l}
        r["rel_in"] = rel_l2(A.read(l, "in.f32"), B.read(l, "in.f32"))
        r["rel_out"] = rel_l2(A.read(l, "out.f32"), B.read(l, "out.f32"))
        worst = max(worst, r["rel_out"])
        if A.has(l, "sel.i32") and B.has(l, "sel.i32"):
            r["sel_eq"], r["sel_jac"], _ = set_agreement(A.read(l, "sel.i32"), B.read(l, "sel.i32"))
        if A.has(l, "experts.i32") and B.has(l, "experts.i32"):
            r["exp_eq"], r["exp_jac"], _ = set_agreement(A.read(l, "experts.i32"),
                                                         B.read(l, "experts.i32"))
        rows.append(r)
        flag = " <-- above %.4g" % max_rel if max_rel is not None and r["rel_out"] > max_rel else ""
        print("  %5d %12.3e %12.3e %9.2f%% %8.4f %9.2f%% %8.4f%s"
              % (l, r["rel_in"], r["rel_out"], 100 * r.get("sel_eq", 1), r.get("sel_jac", 1),
                 100 * r.get("exp_eq", 1), r.get("exp_jac", 1), flag))
    return rows, worst


def main():
    ap = argparse.ArgumentParser(description="compare two 12.10 dumps")
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--min-cos", type=float, help="fail if mean logits cosine is below")
    ap.add_argument("--min-top1", type=float, help="fail if top-1 agreement (0..1) is below")
    ap.add_argument("--max-rel-l2", type=float, help="fail if a layer's out relative L2 exceeds")
    ap.add_argument("--json", metavar="FILE", help="write the statistics as JSON")
    a = ap.parse_args()
    stats = {}
    ok = True
    if os.path.isdir(a.a) and os.path.isdir(a.b):
        rows, worst = compare_layers(a.a, a.b, a.max_rel_l2)
        stats["layers"] = rows
        if a.max_rel_l2 is not None and worst > a.max_rel_l2:
            ok = False
        fa, fb = find_logits(a.a), find_logits(a.b)
        if fa and fb:
            stats["logits"] = compare_logits(fa, fb)
    elif os.path.isfile(a.a) and os.path.isfile(a.b):
        stats["logits"] = compare_logits(a.a, a.b)
    else:
        raise SystemExit("A and B must both be logits files or both dump directories")
    lg = stats.get("logits")
    if lg is not None:
        if a.min_cos is not None and lg["cos_mean"] < a.min_cos:
            ok = False
        if a.min_top1 is not None and lg["top1"] < a.min_top1:
            ok = False
    if a.json:
        with open(a.json, "w") as f:
            json.dump(stats, f, indent=1)
    print("result: %s" % ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
