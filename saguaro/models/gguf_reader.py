"""Read a GGUF file: its header parsed with :mod:`struct`, its tensors views of one read-only
memory map of the file.

``gguf.GGUFReader`` builds a numpy view for every part of every field (each of a vocabulary's
150,000 token strings included), which takes seconds on a real model; this reader decodes the
header straight into Python values and maps the tensors without reading or copying them, so
opening a file costs little more than reading its vocabulary.

The layout (GGUF versions 2 and 3, little-endian): the magic ``GGUF``, the version (u32), the
tensor and key/value counts (u64 each), the key/value pairs (a string key, a u32 value type, the
value), then per tensor its name, its number of dimensions (u32), the dimensions (u64 each,
innermost first), its GGML type (u32) and its data's offset (u64) from the start of the data
section, which begins at the first multiple of ``general.alignment`` (32 by default) after the
header. A string is its length (u64) and UTF-8 bytes; an array its element type (u32), count
(u64) and elements.
"""

from __future__ import annotations

import functools
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from saguaro.errors import ModelLoadError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
CACHED_FILES = 4  # files whose reading GGUFFile.read keeps (a target and its draft, twice over)
# The smallest header: magic, version, tensor count, key/value count.
_PREAMBLE = struct.Struct("<4sIQQ")
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")
# GGUF value types
_STRING, _ARRAY = 8, 9
# Scalar value type -> its struct format and its numpy dtype (for arrays of it).
_SCALARS: dict[int, tuple[str, str]] = {
    0: ("<B", "<u1"),
    1: ("<b", "<i1"),
    2: ("<H", "<u2"),
    3: ("<h", "<i2"),
    4: ("<I", "<u4"),
    5: ("<i", "<i4"),
    6: ("<f", "<f4"),
    7: ("<?", "?"),
    10: ("<Q", "<u8"),
    11: ("<q", "<i8"),
    12: ("<d", "<f8"),
}
_SCALAR_STRUCTS = {kind: struct.Struct(fmt) for kind, (fmt, _) in _SCALARS.items()}
# GGML types whose data is an array of numbers, as gguf's reader gives them; every other
# type's data is its bytes, one row of blocks per row.
_ELEMENT_DTYPES = {
    GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16,
    GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


def is_gguf(path: str | Path) -> bool:
    """Whether ``path`` names a GGUF file (by its suffix; reading it says whether it is one)."""
    return Path(path).suffix.lower() == ".gguf"


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor: ``shape`` innermost first (as GGUF stores it, and as gguf's reader gives it),
    ``data`` a read-only view of the file: an array of numbers of the reversed shape for
    F32/F16/F64 and the integer types, else uint8 ``[rows, row bytes]`` (a quantized row's
    blocks)."""

    name: str
    tensor_type: int
    shape: tuple[int, ...]
    data: np.ndarray
    offset: int  # of its first byte in the file

    @property
    def type_name(self) -> str:
        """GGML's name of the tensor's type (``Q4_K``, ``F32``)."""
        return GGMLQuantizationType(self.tensor_type).name

    @property
    def dims(self) -> tuple[int, ...]:
        """The shape outermost first, as torch and numpy write it (``[out, in]`` for a matrix)."""
        return tuple(reversed(self.shape))


@dataclass(frozen=True)
class GGUFFile:
    """The fields and tensors of one GGUF file, read once: ``fields`` maps each key to its
    decoded value (str, int, float, bool, or a list of them)."""

    fields: dict[str, Any]
    tensors: list[GGUFTensor]
    path: Path
    buffer: np.ndarray = field(repr=False, compare=False)  # the file's map, read-only bytes

    @classmethod
    def read(cls, path: str | Path) -> GGUFFile:
        """The file at ``path``; a :class:`ModelLoadError` naming it where it is missing, not a
        GGUF file, of a version this reader does not know, or cut short. Starting an engine
        reads a file several times (its config, its tokenizer, its weights), so the last few
        files read are kept, each while its size and modification time stay the same: the
        same object, its map included (callers treat it as read-only)."""
        path = Path(path)
        if not path.is_file():
            raise ModelLoadError(f"{path}: no such GGUF file")
        stat = path.stat()
        return _read(path, stat.st_size, stat.st_mtime_ns)

    @classmethod
    def parse(cls, path: Path, size: int) -> GGUFFile:
        """The file at ``path``, of ``size`` bytes, read now."""
        if size < _PREAMBLE.size:
            raise ModelLoadError(f"{path}: not a GGUF file ({size} bytes, no GGUF header)")
        data = np.memmap(path, dtype=np.uint8, mode="r")
        header = _Header(memoryview(data), path)
        try:
            fields, infos = header.parse()
        except (struct.error, IndexError) as e:
            raise ModelLoadError(f"{path}: truncated GGUF file (its header is cut short)") from e
        except UnicodeDecodeError as e:
            raise ModelLoadError(f"{path}: malformed GGUF header (a string is not UTF-8)") from e
        start = _aligned(header.pos, _alignment(fields, path))
        return cls(fields, [_tensor(data, start, info, path) for info in infos], path, data)

    def release_pages(self) -> None:
        """Stop counting the file's pages as this process's resident memory (``MADV_DONTNEED`` on
        its read-only map): once the weights a loader copied (interleaved, say) are built, the
        pages they came from would otherwise stay resident beside the copies. A page still read
        later comes back from the page cache on its next touch; nothing is lost."""
        mapped = getattr(self.buffer, "_mmap", None)  # numpy's memmap keeps its mmap here
        if isinstance(mapped, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
            mapped.madvise(mmap.MADV_DONTNEED)

    def need(self, key: str) -> Any:
        """The value of field ``key``; a :class:`ModelLoadError` where the file lacks it."""
        if key not in self.fields:
            raise ModelLoadError(f"{self.path}: missing GGUF field {key!r}")
        return self.fields[key]

    def joined_rows(self, tensors: list[GGUFTensor]) -> np.ndarray | None:
        """The blocks of ``tensors`` (of one block type and row length) as one ``[rows, row
        bytes]`` view where they lie back to back in the file, as a fused layer's parts often
        do; None where they do not."""
        first = tensors[0]
        if first.data.dtype != np.uint8 or any(
            t.tensor_type != first.tensor_type or t.data.shape[1:] != first.data.shape[1:]
            for t in tensors
        ):
            return None
        end = first.offset
        for t in tensors:
            if t.offset != end:
                return None
            end += t.data.nbytes
        return self.buffer[first.offset : end].reshape(-1, first.data.shape[-1])


@functools.lru_cache(maxsize=CACHED_FILES)
def _read(path: Path, size: int, mtime_ns: int) -> GGUFFile:
    """:meth:`GGUFFile.parse`, once per file and version of it (its size and time)."""
    del mtime_ns  # the cache's key only
    return GGUFFile.parse(path, size)


# A tensor as the header lists it: name, dimensions (innermost first), GGML type, data offset.
_TensorInfo = tuple[str, tuple[int, ...], int, int]


class _Header:
    """A cursor over the header's bytes; :meth:`parse` reads it, leaving ``pos`` past its end."""

    def __init__(self, buf: memoryview, path: Path) -> None:
        self.buf, self.path, self.pos = buf, path, 0

    def parse(self) -> tuple[dict[str, Any], list[_TensorInfo]]:
        """The key/value fields and the tensor infos."""
        magic, version, n_tensors, n_fields = _PREAMBLE.unpack_from(self.buf, 0)
        if magic != MAGIC:
            raise ModelLoadError(f"{self.path}: not a GGUF file (magic {magic!r}, not {MAGIC!r})")
        if version not in VERSIONS:
            raise ModelLoadError(
                f"{self.path}: GGUF version {version} is not supported (saguaro reads "
                f"{', '.join(map(str, VERSIONS))}; a big-endian file reads as a huge version)"
            )
        self.pos = _PREAMBLE.size
        fields: dict[str, Any] = {}
        for _ in range(n_fields):
            key = self.string()
            if key in fields:
                raise ModelLoadError(f"{self.path}: GGUF field {key!r} appears twice")
            fields[key] = self.value(self.u32())
        return fields, [self.tensor_info() for _ in range(n_tensors)]

    def u32(self) -> int:
        (v,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return v

    def u64(self) -> int:
        (v,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return v

    def string(self) -> str:
        n = self.u64()
        end = self.pos + n
        if end > len(self.buf):
            raise IndexError("string past the end of the file")
        s = str(self.buf[self.pos : end], "utf-8")
        self.pos = end
        return s

    def value(self, kind: int) -> Any:
        """One value of GGUF type ``kind``."""
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            return self.array(self.u32(), self.u64())
        if kind not in _SCALARS:
            raise ModelLoadError(f"{self.path}: unknown GGUF value type {kind} in its header")
        s = _SCALAR_STRUCTS[kind]
        (v,) = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return v

    def array(self, kind: int, count: int) -> list[Any]:
        """``count`` values of type ``kind``: numbers in one read, strings in a loop (inlined:
        a vocabulary has 150,000 of them), other arrays element by element."""
        if kind in _SCALARS:
            dtype = np.dtype(_SCALARS[kind][1])
            end = self.pos + dtype.itemsize * count
            if end > len(self.buf):
                raise IndexError("array past the end of the file")
            values = np.frombuffer(self.buf, dtype, count, self.pos).tolist()
            self.pos = end
            return values
        if kind != _STRING:
            return [self.value(kind) for _ in range(count)]
        buf, pos, unpack, out = self.buf, self.pos, _U64.unpack_from, []
        for _ in range(count):
            (n,) = unpack(buf, pos)
            pos += 8
            out.append(str(buf[pos : pos + n], "utf-8"))
            pos += n
        if pos > len(buf):
            raise IndexError("string past the end of the file")
        self.pos = pos
        return out

    def tensor_info(self) -> _TensorInfo:
        name = self.string()
        dims = tuple(self.u64() for _ in range(self.u32()))
        return name, dims, self.u32(), self.u64()


def _alignment(fields: dict[str, Any], path: Path) -> int:
    """``general.alignment``: a power of two, 32 where the file gives none."""
    align = fields.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(align, int) or align <= 0 or align & (align - 1):
        raise ModelLoadError(f"{path}: general.alignment {align!r} is not a power of two")
    return align


def _aligned(offset: int, alignment: int) -> int:
    return -(-offset // alignment) * alignment


def _tensor(data: np.memmap, start: int, info: _TensorInfo, path: Path) -> GGUFTensor:
    """A view of one tensor's bytes in the map ``data`` (its data section at ``start``)."""
    name, shape, kind, offset = info
    try:
        ggml = GGMLQuantizationType(kind)
        block, type_size = GGML_QUANT_SIZES[ggml]
    except (ValueError, KeyError):
        raise ModelLoadError(f"{path}: tensor {name} has unknown GGML type {kind}") from None
    dims = tuple(reversed(shape)) or (1,)
    if dims[-1] % block:
        raise ModelLoadError(
            f"{path}: tensor {name}'s rows of {dims[-1]} are not whole {ggml.name} blocks"
        )
    begin = start + offset
    nbytes = int(np.prod(dims, dtype=np.int64)) // block * type_size
    if begin + nbytes > len(data):
        raise ModelLoadError(
            f"{path}: truncated GGUF file (tensor {name} needs bytes {begin}..{begin + nbytes}, "
            f"the file has {len(data)})"
        )
    raw = data[begin : begin + nbytes]
    dtype = _ELEMENT_DTYPES.get(ggml)
    if dtype is not None:
        return GGUFTensor(name, kind, shape, raw.view(dtype).reshape(dims), begin)
    rows = (*dims[:-1], dims[-1] // block * type_size)
    return GGUFTensor(name, kind, shape, raw.reshape(rows), begin)
