"""Debug dump formats of MODEL.md 12.10.

--dump-logits FILE: 32-byte header (8 bytes magic "TDLOGIT1", u32 rows, u32 vocab,
i32 first_position, u32 schedule (0 oracle, 1 ced), 8 zero bytes), then float32 [rows, vocab],
little-endian.

--dump-layers DIR: per backbone layer l: l.in.f32 / l.out.f32 (float32 [T, m, H], the residual
streams entering the layer - before its Engram update - and leaving it), l.sel.i32 (int32
[T, k_I], the selected compressed rows the layer's attention used, ascending, -1 padded; all -1 for
ratio-0 layers), l.experts.i32 (int32 [T, K], routed experts, ascending), and manifest.json with
shapes. Extension written by this reference (readers must not require it): l.pre.f32 (float32
[T, m], the previous FFN site's pre used by layer l's attention collapse; e0 for layer 0), and
"ids" (the prompt) in the manifest.
"""
import json
import os
import struct

import numpy as np

MAGIC = b"TDLOGIT1"
SCHEDULES = {"oracle": 0, "ced": 1}


def write_logits(path, logits, first_position=0, schedule=0):
    logits = np.ascontiguousarray(logits, dtype="<f4")
    rows, vocab = logits.shape
    with open(path, "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<IIiI", rows, vocab, first_position, schedule))
        f.write(b"\0" * 8)
        f.write(logits.tobytes())


def read_logits(path):
    """({rows, vocab, first_position, schedule}, float32 [rows, vocab])."""
    with open(path, "rb") as f:
        hdr = f.read(32)
        if len(hdr) != 32 or hdr[:8] != MAGIC:
            raise ValueError("%s: not a TDLOGIT1 file" % path)
        rows, vocab, first, sched = struct.unpack("<IIiI", hdr[8:24])
        data = np.frombuffer(f.read(), dtype="<f4")
    if data.size != rows * vocab:
        raise ValueError("%s: %d floats, header says %d x %d" % (path, data.size, rows, vocab))
    return ({"rows": rows, "vocab": vocab, "first_position": first, "schedule": sched},
            data.reshape(rows, vocab).astype(np.float32))


def write_layers(directory, layers, cfg, ids, schedule="oracle", first_position=0):
    """layers: list of model.LayerResult (x_in, x_out, pre_in, sel, experts)."""
    os.makedirs(directory, exist_ok=True)
    T = len(ids)
    files = {}

    def put(name, arr, dt):
        arr = np.ascontiguousarray(arr, dtype=dt)
        with open(os.path.join(directory, name), "wb") as f:
            f.write(arr.tobytes())
        files[name] = {"dtype": "f32" if dt == "<f4" else "i32", "shape": list(arr.shape)}

    for l, res in enumerate(layers):
        put("%d.in.f32" % l, res.x_in, "<f4")
        put("%d.out.f32" % l, res.x_out, "<f4")
        put("%d.sel.i32" % l, res.sel, "<i4")
        put("%d.experts.i32" % l, res.experts, "<i4")
        put("%d.pre.f32" % l, res.pre_in, "<f4")
    manifest = {
        "format": "tandem-dump-layers",
        "writer": "tests/reference/flash_ref (python oracle)",
        "schedule": schedule, "first_position": first_position,
        "T": T, "m": cfg.m, "H": cfg.H, "k_I": cfg.k_I, "K": cfg.K,
        "layers": list(range(len(layers))),
        "ids": [int(i) for i in ids],
        "files": files,
    }
    with open(os.path.join(directory, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")


class LayerDump:
    """Reader of a --dump-layers directory; shapes from manifest.json (lenient about its exact
    layout: a "files" map {name: {"shape": [...]}} or top-level T/m/H/k_I/K), falling back to
    the config and the file size."""

    def __init__(self, directory, cfg=None):
        self.dir = directory
        self.cfg = cfg
        mp = os.path.join(directory, "manifest.json")
        self.manifest = {}
        if os.path.exists(mp):
            with open(mp) as f:
                self.manifest = json.load(f)
        self.files = {}
        fl = self.manifest.get("files", {})
        if isinstance(fl, dict):
            for k, v in fl.items():
                if isinstance(v, dict) and "shape" in v:
                    self.files[k] = list(v["shape"])
                elif isinstance(v, list):
                    self.files[k] = list(v)
        elif isinstance(fl, list):
            for v in fl:
                if isinstance(v, dict) and "name" in v and "shape" in v:
                    self.files[v["name"]] = list(v["shape"])

    def _get(self, key, default=None):
        v = self.manifest.get(key)
        if v is None and self.cfg is not None:
            v = {"m": self.cfg.m, "H": self.cfg.H, "k_I": self.cfg.k_I, "K": self.cfg.K}.get(key)
        return default if v is None else v

    def ids(self):
        for k in ("ids", "prompt_ids", "tokens", "token_ids"):
            if k in self.manifest:
                return [int(v) for v in self.manifest[k]]
        return None

    def layers(self):
        ls = self.manifest.get("layers")
        if isinstance(ls, list) and ls and all(isinstance(v, int) for v in ls):
            return sorted(ls)
        out = []
        for name in os.listdir(self.dir):
            p = name.split(".")
            if len(p) == 3 and p[1] == "in" and p[0].isdigit():
                out.append(int(p[0]))
        return sorted(out)

    def has(self, l, what):
        return os.path.exists(os.path.join(self.dir, "%s.%s" % (l, what)))

    def read(self, l, what):
        name = "%s.%s" % (l, what)
        path = os.path.join(self.dir, name)
        dt = "<f4" if what.endswith("f32") else "<i4"
        data = np.fromfile(path, dtype=dt)
        shape = self.files.get(name)
        if shape is None:
            m, H = self._get("m"), self._get("H")
            last = {"in.f32": (m, H), "out.f32": (m, H), "sel.i32": (self._get("k_I"),),
                    "experts.i32": (self._get("K"),), "pre.f32": (m,)}[what]
            inner = int(np.prod(last))
            shape = [data.size // inner] + list(last)
        arr = data.reshape(shape)
        return arr.astype(np.float32) if dt == "<f4" else arr.astype(np.int64)
