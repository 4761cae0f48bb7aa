"""Checkpoint tensor access (MODEL.md section 3, 12.2): dequantized FP32 views, cached.

Scale names: <module>.scale, aliases <module>.weight.scale and <module>.weight_scale_inv,
where <module> is the tensor name without its trailing ".weight".
"""
import os

import numpy as np

from . import numerics as nx
from .safetensors_io import Checkpoint, SafetensorsFile


class WeightError(Exception):
    pass


def _module(name):
    return name[:-len(".weight")] if name.endswith(".weight") else name


class Weights:
    def __init__(self, directory, cfg):
        self.dir = directory
        self.cfg = cfg
        self.ckpt = Checkpoint(directory)
        self._cache = {}

    def has(self, name):
        return name in self.ckpt

    def scale_name(self, name):
        mod = _module(name)
        for cand in (mod + ".scale", mod + ".weight.scale", mod + ".weight_scale_inv"):
            if cand in self.ckpt:
                return cand
        raise WeightError("no scale tensor for %s (tried %s.scale and aliases)" % (name, mod))

    def _expect(self, name, dtypes, shape):
        if name not in self.ckpt:
            raise WeightError("missing tensor %s" % name)
        dt = self.ckpt.dtype(name)
        if dt not in dtypes:
            raise WeightError("tensor %s: dtype %s, expected %s" % (name, dt, "/".join(dtypes)))
        if shape is not None and tuple(self.ckpt.shape(name)) != tuple(shape):
            raise WeightError("tensor %s: shape %s, expected %s"
                              % (name, self.ckpt.shape(name), tuple(shape)))

    def bf16(self, name, shape=None):
        """BF16 tensor widened to FP32 (exact)."""
        key = ("bf16", name)
        if key not in self._cache:
            self._expect(name, ("BF16",), shape)
            self._cache[key] = nx.bf16_to_f32(self.ckpt.raw(name))
        return self._cache[key]

    def f32(self, name, shape=None):
        key = ("f32", name)
        if key not in self._cache:
            self._expect(name, ("F32",), shape)
            self._cache[key] = np.asarray(self.ckpt.raw(name), dtype=np.float32)
        return self._cache[key]

    def fp8(self, name, shape):
        """FP8 dense [out, in]: W[o,i] = e4m3(code) * 2^(S[o/32, i/32] - 127), FP32 (exact)."""
        key = ("fp8", name)
        if key not in self._cache:
            self._expect(name, ("F8_E4M3",), shape)
            sn = self.scale_name(name)
            o, i = shape
            self._expect(sn, ("F8_E8M0",), (-(-o // 32), -(-i // 32)))
            self._cache[key] = nx.dequant_fp8_block(self.ckpt.raw(name), self.ckpt.raw(sn))
        return self._cache[key]

    def fp4(self, name, shape):
        """MXFP4 expert weight [out, in] from packed [out, in/2] + scale [out, in/32]."""
        key = ("fp4", name)
        if key not in self._cache:
            o, i = shape
            self._expect(name, ("I8", "U8"), (o, i // 2))
            sn = self.scale_name(name)
            self._expect(sn, ("F8_E8M0",), (o, i // 32))
            self._cache[key] = nx.dequant_mxfp4_rows(self.ckpt.raw(name), self.ckpt.raw(sn))
        return self._cache[key]

    def engram_table(self, layer, n_rows):
        """(codes uint8 [R, d_e], scales uint8 [R, d_e/32]) of layers.l.engram.embed, raw."""
        key = ("engram", layer)
        if key not in self._cache:
            name = "layers.%d.engram.embed.weight" % layer
            de = self.cfg.engram_head_dim
            self._expect(name, ("F8_E4M3",), (n_rows, de))
            sn = self.scale_name(name)
            self._expect(sn, ("F8_E8M0",), (n_rows, de // 32))
            self._cache[key] = (self.ckpt.raw(name), self.ckpt.raw(sn))
        return self._cache[key]


def load_engram_sidecar(directory, cfg):
    """Read engram-hash.safetensors (9.2) into an EngramTables (validated)."""
    from .engram import EngramTables
    path = os.path.join(directory, "engram-hash.safetensors")
    if not os.path.exists(path):
        raise WeightError("%s: missing Engram sidecar engram-hash.safetensors" % directory)
    f = SafetensorsFile(path)
    tm = f.raw("token_map")
    mult = f.raw("multipliers")
    primes = f.raw("primes") if "primes" in f.header else None
    offsets = f.raw("offsets") if "offsets" in f.header else None
    v_c = cfg.engram_compressed_vocab_size
    if "compressed_vocab_size" in f.metadata:
        mv = int(f.metadata["compressed_vocab_size"])
        if mv != v_c:
            raise WeightError("engram sidecar: compressed_vocab_size %d != config %d" % (mv, v_c))
    return EngramTables(cfg, tm, mult, primes, offsets, v_c)
