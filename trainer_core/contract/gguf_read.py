"""Reading GGUF files: the header (KVs, tensor infos) parsed straight from the file, tensors as numpy
views of a memory map, dequantized on demand.

The gguf package's reader builds a Python object per array element, which takes seconds on a
248k-entry vocabulary (the Qwen3.5 bridge's `tokenizer.ggml.tokens`); the parser here reads the
header once and decodes string arrays only when asked (`read_gguf_string_array`). `open_gguf` (the
gguf package's reader, for students) checks the file first and turns every failure into one
ModelFileError sentence. gguf_io.py writes the files and re-exports these names.
"""
from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer_core.base.errors import ModelFileError

__all__ = ["GGUFHeader", "GGUFTensor", "dequantize", "open_gguf", "read_gguf_tensors", "read_gguf_kvs",
           "read_gguf_string_array"]


@dataclass
class GGUFTensor:
    path: Path
    name: str
    shape_ne: tuple[int, ...]   # GGUF order: fastest axis first
    dtype: str                  # "F32", "F16", "Q8_0", …
    data: np.ndarray            # numpy in torch order (reversed ne), dequantized only on demand

    def to_torch(self) -> torch.Tensor:
        return torch.from_numpy(dequantize(self.path, self.name, self.dtype, self.data, self.shape_ne))


def dequantize(path: Path, name: str, dtype: str, data: np.ndarray, shape_ne: tuple[int, ...]) -> np.ndarray:
    """One tensor as float32 in torch order (ne reversed), copied out of the memory map (once)."""
    import gguf
    try:
        if dtype in ("F32", "F16"):
            values = np.asarray(data, dtype=np.float32)
        else:  # BF16, Q8_0, Q4_K, …: the gguf package's reference dequantizers
            values = gguf.quants.dequantize(data, gguf.GGMLQuantizationType[dtype])
    except NotImplementedError:
        raise ModelFileError(f"{path} stores {name} as {dtype}, which the gguf package cannot dequantize; convert "
                             f"the file to f16, bf16 or q8_0.") from None
    values = np.ascontiguousarray(values, dtype=np.float32).reshape(tuple(reversed(shape_ne)))
    return values.copy() if np.may_share_memory(values, data) else values


def _check_file(path: Path) -> int:
    """The file's size, after checking it exists, is readable and starts with the GGUF magic."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            magic = f.read(4)
    except FileNotFoundError:
        raise ModelFileError(f"{path} does not exist; check the path.") from None
    except OSError as e:
        raise ModelFileError(f"{path} cannot be read ({e.strerror}); check its permissions.") from None
    if magic != b"GGUF":
        raise ModelFileError(f"{path} is not a GGUF file (it does not start with the bytes 'GGUF').")
    return size


def _damaged(path: Path, e: Exception) -> ModelFileError:
    return ModelFileError(f"{path} is truncated or damaged and cannot be read as GGUF "
                          f"({' '.join(str(e).split()) or type(e).__name__}); download or export it again.")


def open_gguf(path: str | os.PathLike):
    """A gguf.GGUFReader over the file, or ModelFileError saying why it cannot be one."""
    import gguf
    path = Path(path)
    size = _check_file(path)
    try:
        reader = gguf.GGUFReader(path, "r")
    except Exception as e:  # the package raises ValueError, IndexError, … on short or bad data
        raise _damaged(path, e) from None
    for t in reader.tensors:
        if t.data_offset + t.n_bytes > size:
            raise ModelFileError(f"{path} is truncated (the data of {t.name} runs past the end of "
                                 f"the file); download or export it again.")
    return reader


# GGUF value types: scalars (struct format), STRING 8, ARRAY 9
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class _Array:
    """A KV array left where it is in the file: item type, length and the offset of its first item."""
    item_type: int
    count: int
    offset: int


class GGUFHeader:
    """The KVs and tensor index of a GGUF, parsed from its memory map. gguf.GGUFReader builds a numpy
    view per array item: seconds for the bridge's ~500k tokenizer strings, which this only steps over
    (they are decoded on demand, `strings`)."""

    def __init__(self, path: Path):
        self.path = path
        size = _check_file(path)
        self.data = data = np.memmap(path, mode="r")
        self._bytes = memoryview(data)          # a slice of this is a view; one of the memmap, a new memmap
        self.kvs: dict[str, Any] = {}
        self.index: list[tuple[str, tuple[int, ...], int, int]] = []   # name, ne, ggml type, offset in data
        try:
            version, n_tensors, n_kv = struct.unpack_from("<IQQ", data, 4)
            if version not in (2, 3):
                raise ValueError(f"GGUF version {version}; versions 2 and 3 are read")
            off = 24
            for _ in range(n_kv):
                key, off = self._string(off)
                (vtype,), off = struct.unpack_from("<I", data, off), off + 4
                self.kvs[key], off = self._value(vtype, off)
            for _ in range(n_tensors):
                name, off = self._string(off)
                (n_dims,) = struct.unpack_from("<I", data, off)
                ne = struct.unpack_from(f"<{n_dims}Q", data, off + 4)
                ggml_type, offset = struct.unpack_from("<IQ", data, off + 4 + 8 * n_dims)
                off += 4 + 8 * n_dims + 12
                self.index.append((name, tuple(int(n) for n in ne), int(ggml_type), int(offset)))
            align = int(self.kvs.get("general.alignment", 32))
            self.data_start = -(-off // align) * align
        except (struct.error, ValueError, OverflowError) as e:
            raise _damaged(path, e) from None
        if len({name for name, *_ in self.index}) != len(self.index):
            raise _damaged(path, ValueError("a tensor name appears twice"))
        self.size = size

    def _string(self, off: int) -> tuple[str, int]:
        (n,) = _U64.unpack_from(self.data, off)
        if off + 8 + n > len(self.data):
            raise ValueError("a string runs past the end of the file")
        return bytes(self._bytes[off + 8:off + 8 + n]).decode("utf-8", "replace"), off + 8 + n

    def _value(self, vtype: int, off: int) -> tuple[Any, int]:
        if vtype == _STRING:
            return self._string(off)
        if vtype in _SCALARS:
            return struct.unpack_from(_SCALARS[vtype], self.data, off)[0], off + struct.calcsize(_SCALARS[vtype])
        if vtype != _ARRAY:
            raise ValueError(f"unknown value type {vtype}")
        item, count = struct.unpack_from("<IQ", self.data, off)
        start = off = off + 12
        if item == _STRING:
            unpack = _U64.unpack_from
            for _ in range(count):
                off += 8 + unpack(self.data, off)[0]
        elif item in _SCALARS:
            off += count * struct.calcsize(_SCALARS[item])
        else:
            raise ValueError(f"an array of value type {item} is not read")
        if off > len(self.data):
            raise ValueError("an array runs past the end of the file")
        return _Array(item, count, start), off

    def array_length(self, key: str) -> int | None:
        value = self.kvs.get(key)
        return value.count if isinstance(value, _Array) else None

    def strings(self, key: str) -> list[str]:
        """The items of a STRING array KV."""
        value = self.kvs.get(key)
        if not isinstance(value, _Array) or value.item_type != _STRING:
            raise ModelFileError(f"{self.path} has no string array {key}.")
        out, off = [], value.offset
        for _ in range(value.count):
            text, off = self._string(off)
            out.append(text)
        return out

    def summary(self) -> dict[str, Any]:
        """Every KV except the GGUF bookkeeping ones: scalars and strings as values, short numeric
        arrays as lists (adapter.out_layers), other arrays as "[array of N]"."""
        out: dict[str, Any] = {}
        for key, value in self.kvs.items():
            if isinstance(value, _Array):
                if value.item_type != _STRING and value.count <= 64:
                    fmt = _SCALARS[value.item_type]
                    step = struct.calcsize(fmt)
                    out[key] = [struct.unpack_from(fmt, self.data, value.offset + i * step)[0]
                                for i in range(value.count)]
                else:
                    out[key] = f"[array of {value.count}]"
            else:
                out[key] = value
        return out

    def tensors(self) -> dict[str, GGUFTensor]:
        import gguf
        out = {}
        for name, ne, raw_type, offset in self.index:
            try:
                qtype = gguf.GGMLQuantizationType(raw_type)
            except ValueError:
                raise _damaged(self.path, ValueError(f"{name} has the unknown tensor type {raw_type}")) from None
            block, type_size = gguf.GGML_QUANT_SIZES[qtype]
            n_elems = math.prod(ne)
            n_bytes = n_elems * type_size // block
            start = self.data_start + offset
            if start + n_bytes > self.size:
                raise ModelFileError(f"{self.path} is truncated (the data of {name} runs past the end of "
                                     f"the file); download or export it again.")
            shape = tuple(reversed(ne))
            raw = self.data[start:start + n_bytes]
            numpy_type = _NUMPY_TYPES.get(qtype.name)
            array = (raw.view(numpy_type).reshape(shape) if numpy_type is not None
                     else raw.reshape(gguf.quant_shape_to_byte_shape(shape, qtype)))
            out[name] = GGUFTensor(self.path, name, ne, qtype.name, array)
        return out


_NUMPY_TYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16,
                "I32": np.int32, "I64": np.int64}


def read_gguf_tensors(path: str | os.PathLike) -> dict[str, GGUFTensor]:
    return GGUFHeader(Path(path)).tensors()


def read_gguf_kvs(path: str | os.PathLike) -> dict[str, Any]:
    """Every KV except the GGUF bookkeeping ones, as Python values; arrays of strings (the bridge's
    248k-entry vocabulary) and long arrays as "[array of N]"."""
    return GGUFHeader(Path(path)).summary()


def read_gguf_string_array(path: str | os.PathLike, key: str) -> list[str]:
    """The items of a STRING array KV (tokenizer.ggml.tokens, …), or ModelFileError when there is none."""
    return GGUFHeader(Path(path)).strings(key)
