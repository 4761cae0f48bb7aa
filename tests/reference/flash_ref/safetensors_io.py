"""Plain struct/json/numpy safetensors reader and writer (MODEL.md section 3).

A safetensors file is: u64 little-endian header length N, N bytes of JSON header
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}},
then the data region (offsets are relative to the data region start).

numpy has no BF16 / FP8 types, so tensors are returned as raw storage:
  BF16      -> uint16 codes (use numerics.bf16_to_f32 to widen exactly)
  F8_E4M3   -> uint8 codes  (numerics.e4m3_decode)
  F8_E8M0   -> uint8 codes  (numerics.ue8m0_decode)
  I8 / U8   -> uint8 bytes  (packed E2M1 pairs for FP4 experts: numerics.e2m1_unpack)
  F16/F32/F64/I16/I32/I64/U16/U32/U64/BOOL -> the matching numpy dtype
"""
import json
import os
import struct

import numpy as np

# dtype name -> (numpy storage dtype, bytes per element)
_STORAGE = {
    "BF16": np.dtype("<u2"),
    "F16": np.dtype("<f2"),
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
    "F8_E4M3": np.dtype("u1"),
    "F8_E5M2": np.dtype("u1"),
    "F8_E8M0": np.dtype("u1"),
    "I8": np.dtype("u1"),   # raw bytes; FP4 packed pairs are unsigned nibbles
    "U8": np.dtype("u1"),
    "I16": np.dtype("<i2"),
    "U16": np.dtype("<u2"),
    "I32": np.dtype("<i4"),
    "U32": np.dtype("<u4"),
    "I64": np.dtype("<i8"),
    "U64": np.dtype("<u8"),
    "BOOL": np.dtype("u1"),
}


class SafetensorsError(Exception):
    pass


def read_header(path):
    """Return (header dict without __metadata__, metadata dict, data_start offset)."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise SafetensorsError("%s: truncated header length" % path)
        (n,) = struct.unpack("<Q", raw)
        if n > 100 * 1024 * 1024:
            raise SafetensorsError("%s: header length %d too large" % (path, n))
        hdr = json.loads(f.read(n).decode("utf-8"))
    meta = hdr.pop("__metadata__", {}) or {}
    return hdr, meta, 8 + n


class SafetensorsFile:
    """One .safetensors file, memory-mapped; tensors are read lazily."""

    def __init__(self, path):
        self.path = path
        self.header, self.metadata, self.data_start = read_header(path)
        size = os.path.getsize(path)
        self._mm = np.memmap(path, dtype=np.uint8, mode="r") if size > 0 else None
        for name, info in self.header.items():
            b, e = info["data_offsets"]
            if info["dtype"] not in _STORAGE:
                raise SafetensorsError("%s: tensor %s has unsupported dtype %s"
                                       % (path, name, info["dtype"]))
            want = int(np.prod(info["shape"], dtype=np.int64)) * _STORAGE[info["dtype"]].itemsize
            if e - b != want or self.data_start + e > size:
                raise SafetensorsError("%s: tensor %s has bad data_offsets" % (path, name))

    def keys(self):
        return list(self.header.keys())

    def dtype(self, name):
        return self.header[name]["dtype"]

    def shape(self, name):
        return tuple(self.header[name]["shape"])

    def raw(self, name):
        """Storage array (see module doc) with the tensor's shape; a read-only copy."""
        info = self.header[name]
        b, e = info["data_offsets"]
        st = _STORAGE[info["dtype"]]
        buf = np.asarray(self._mm[self.data_start + b:self.data_start + e]) if e > b else \
            np.zeros(0, np.uint8)
        arr = np.frombuffer(buf.tobytes(), dtype=st).reshape(info["shape"])
        return arr


class Checkpoint:
    """A checkpoint directory: model.safetensors.index.json (sharded) or model.safetensors."""

    def __init__(self, directory):
        self.directory = directory
        idx = os.path.join(directory, "model.safetensors.index.json")
        self.files = {}
        self.where = {}
        if os.path.exists(idx):
            with open(idx) as f:
                index = json.load(f)
            for name, fname in index["weight_map"].items():
                self.where[name] = fname
            for fname in sorted(set(self.where.values())):
                self.files[fname] = SafetensorsFile(os.path.join(directory, fname))
            for name, fname in self.where.items():
                if name not in self.files[fname].header:
                    raise SafetensorsError("index names %s in %s, which lacks it" % (name, fname))
        else:
            single = os.path.join(directory, "model.safetensors")
            if not os.path.exists(single):
                raise SafetensorsError("%s: no model.safetensors.index.json or model.safetensors"
                                       % directory)
            self.files["model.safetensors"] = SafetensorsFile(single)
            for name in self.files["model.safetensors"].keys():
                self.where[name] = "model.safetensors"

    def __contains__(self, name):
        return name in self.where

    def names(self):
        return list(self.where.keys())

    def dtype(self, name):
        return self.files[self.where[name]].dtype(name)

    def shape(self, name):
        return self.files[self.where[name]].shape(name)

    def raw(self, name):
        if name not in self.where:
            raise KeyError("tensor %s not in checkpoint %s" % (name, self.directory))
        return self.files[self.where[name]].raw(name)


def write_file(path, tensors, metadata=None):
    """Write a safetensors file. tensors: list of (name, dtype_name, storage ndarray).

    The storage array must already hold the stored representation (uint16 for BF16, uint8
    codes for FP8/E8M0/I8, ...); its shape is the tensor shape.
    """
    header = {}
    off = 0
    blobs = []
    for name, dt, arr in tensors:
        st = _STORAGE[dt]
        a = np.ascontiguousarray(arr).astype(st, copy=False)
        data = a.tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(data)]}
        off += len(data)
        blobs.append(data)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hj = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hj += b" " * ((8 - len(hj) % 8) % 8)  # align the data region to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)
    return off
