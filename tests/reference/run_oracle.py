#!/usr/bin/python3
"""Run the Python oracle forward (MODEL.md schedule 6(a)) on a prompt.

  run_oracle.py --model DIR --prompt-ids 1,2,3 [--dump-logits FILE] [--dump-layers DIR]
  run_oracle.py --model DIR --random-prompt 256 [--seed 7] ...

Writes the section 12.10 formats: TDLOGIT1 logits for every prompt position (first_position 0,
schedule 0) and the --dump-layers directory (l.in.f32, l.out.f32, l.sel.i32, l.experts.i32,
manifest.json; plus the l.pre.f32 extension). Ids >= V and image_token_id are rejected.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flash_ref import dumps                       # noqa: E402
from flash_ref.model import Model                  # noqa: E402


def parse_ids(text):
    if text.startswith("@"):
        with open(text[1:]) as f:
            text = f.read()
    return [int(v) for v in text.replace("\n", ",").replace(" ", ",").split(",") if v.strip()]


def main():
    ap = argparse.ArgumentParser(description="Python oracle forward of DeepSeek-V4.1-Flash")
    ap.add_argument("--model", required=True, help="checkpoint directory")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--prompt-ids", help="comma-separated token ids, or @FILE")
    g.add_argument("--random-prompt", type=int, metavar="T", help="T random ids (not image)")
    ap.add_argument("--seed", type=int, default=0, help="seed of --random-prompt")
    ap.add_argument("--dump-logits", metavar="FILE")
    ap.add_argument("--dump-layers", metavar="DIR")
    ap.add_argument("--top", type=int, default=5, help="print the top N of the last position")
    ap.add_argument("--accum", choices=("f64", "f32"), default="f64",
                    help="GEMM accumulation (f32 = test-only emulation of another order)")
    a = ap.parse_args()
    import flash_ref.model as fm
    fm.ACCUM = a.accum

    t0 = time.time()
    model = Model(a.model)
    cfg = model.cfg
    if a.prompt_ids is not None:
        ids = parse_ids(a.prompt_ids)
    else:
        rng = np.random.default_rng(a.seed)
        allowed = np.array([i for i in range(cfg.V) if i != cfg.image_token_id])
        ids = rng.choice(allowed, size=a.random_prompt).tolist()
    if not ids:
        print("error: empty prompt", file=sys.stderr)
        return 2
    for i in ids:
        if i < 0 or i >= cfg.V:
            print("error: token id %d out of [0, %d)" % (i, cfg.V), file=sys.stderr)
            return 2
        if i == cfg.image_token_id:
            print("error: image inputs are not supported by this deployment", file=sys.stderr)
            return 2
    t1 = time.time()
    logits, layers = model.forward(np.array(ids, np.int64))
    t2 = time.time()
    print("model %s: L=%d H=%d V=%d roles %s" % (a.model, cfg.L, cfg.H, cfg.V, cfg.summary()))
    print("prompt %d tokens; load %.2f s, forward %.2f s" % (len(ids), t1 - t0, t2 - t1))
    fin = bool(np.isfinite(logits).all())
    print("logits finite=%s max|logit|=%.4f" % (fin, float(np.max(np.abs(logits)))))
    last = logits[-1]
    top = np.argsort(-last, kind="stable")[:a.top]
    print("last position %d top-%d: %s" % (len(ids) - 1, a.top,
                                           ", ".join("%d:%.4f" % (i, last[i]) for i in top)))
    if a.dump_logits:
        if os.path.dirname(a.dump_logits):
            os.makedirs(os.path.dirname(a.dump_logits), exist_ok=True)
        dumps.write_logits(a.dump_logits, logits, first_position=0, schedule=0)
        print("wrote %s" % a.dump_logits)
    if a.dump_layers:
        dumps.write_layers(a.dump_layers, layers, cfg, ids)
        print("wrote %s" % a.dump_layers)
    return 0 if fin else 1


if __name__ == "__main__":
    sys.exit(main())
