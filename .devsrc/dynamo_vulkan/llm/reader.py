"""Open a GGUF file with the ``gguf`` package, validated up front.

Every failure is a :class:`GGUFError` (a ``ValueError``) that names the file and what is
wrong with it: a missing file, one that is not a regular file or cannot be read, a file
that is not GGUF, a truncated or corrupt one (counts the file's size cannot hold, tensor
data that is misaligned, overlaps another tensor's or runs past the end), an unsupported
architecture, a missing tensor, a tensor stored in a quant type we cannot decode. Counts
are checked against the file's size before anything is built from them, so a hostile
header costs no more host memory than the file is large.

``header_only=True`` reads the metadata and tensor table of a file whose data section
may be cut short (the first chunk of a split model holds the whole header): the bounds
check is left out and tensor data cannot be read.
"""

from __future__ import annotations

import math
import mmap
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch

from dynamo_vulkan.gguf.errors import GGUFError, GGUFFileNotFoundError, UnsupportedQuantType
from dynamo_vulkan.gguf.quants import QUANT_TYPES, dequantize, quant_info, qtype_name
from .file_read import read_spans

__all__ = ["GGUFFile", "TensorInfo", "open_gguf", "SUPPORTED_ARCHITECTURES", "GGUFError"]

# models/config.py builds each
SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3", "olmo2", "granite",
                           "mistral3")

_MISSING = object()


@dataclass(frozen=True)
class TensorInfo:
    name: str
    qtype: int  # gguf.GGMLQuantizationType value
    shape: tuple[int, ...]  # torch order (reversed GGUF ne): a weight is [rows, cols]
    offset: int  # absolute offset of the data in the file
    nbytes: int

    @property
    def ne(self) -> tuple[int, ...]:
        return tuple(reversed(self.shape))

    @property
    def rows(self) -> int:
        return int(np.prod(self.shape[:-1], dtype=np.int64)) if len(self.shape) > 1 else 1

    @property
    def cols(self) -> int:
        return self.shape[-1]

    @property
    def qtype_name(self) -> str:
        return qtype_name(self.qtype)


def _field_value(field) -> Any:
    """A ``GGUFReader`` field as a Python value (works with old and new gguf versions)."""
    import gguf

    types = list(field.types)
    if not types:
        return None
    main = types[0]
    if main == gguf.GGUFValueType.ARRAY:
        sub = types[-1]
        if sub == gguf.GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]
        if sub == gguf.GGUFValueType.ARRAY:
            raise GGUFError(f"nested arrays are not supported (field {field.name!r})")
        if not field.data:
            return []
        return np.concatenate([np.asarray(field.parts[i]).reshape(-1) for i in field.data]).tolist()
    if main == gguf.GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace")
    v = np.asarray(field.parts[field.data[0]]).reshape(-1)[0]
    if main == gguf.GGUFValueType.BOOL:
        return bool(v)
    return v.item()


# GGUF value types (gguf.GGUFValueType) -> little-endian numpy dtypes
_SCALAR_DTYPES = {
    0: np.dtype("<u1"), 1: np.dtype("<i1"), 2: np.dtype("<u2"), 3: np.dtype("<i2"),
    4: np.dtype("<u4"), 5: np.dtype("<i4"), 6: np.dtype("<f4"), 7: np.dtype("<u1"),
    10: np.dtype("<u8"), 11: np.dtype("<i8"), 12: np.dtype("<f8"),
}
_BOOL, _STRING, _ARRAY = 7, 8, 9
# the fewest bytes a header item takes: a key/value (key length, value type, a 1-byte
# value), a tensor's entry (name length, dimension count, type, offset), a string
# (its length), an array (element type, count)
_MIN_KV_BYTES, _MIN_TENSOR_BYTES, _MIN_STRING_BYTES, _MIN_ARRAY_BYTES = 13, 24, 8, 12
_U64 = struct.Struct("<Q")
MAX_ARRAY_DEPTH = 4           # arrays of arrays (GGUF files use none deeper than 2)


class _Header:
    """A fast parser of the GGUF header (metadata + tensor table).

    ``gguf.GGUFReader`` builds one numpy view per array element, which takes ~15 s for a
    262k-token vocabulary on a small machine; this reads arrays in bulk with numpy."""

    def __init__(self, buf, size: int):
        self.buf = buf
        self.size = size
        self.pos = 0

    def _need(self, n: int) -> None:
        if n < 0 or self.pos + n > self.size:
            raise GGUFError(f"header runs past the end of the file (at byte {self.pos}, needs {n} more)")

    def u32(self) -> int:
        self._need(4)
        (v,) = struct.unpack_from("<I", self.buf, self.pos)
        self.pos += 4
        return v

    def u64(self) -> int:
        self._need(8)
        (v,) = struct.unpack_from("<Q", self.buf, self.pos)
        self.pos += 8
        return v

    def string(self) -> str:
        n = self.u64()
        self._need(n)
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def _strings(self, count: int) -> list[str]:
        """``count`` strings, as :meth:`string` reads them one by one (a vocabulary holds
        up to 262k: the loop keeps to locals)."""
        buf, pos, size = self.buf, self.pos, self.size
        unpack = _U64.unpack_from
        out = []
        append = out.append
        for _ in range(count):
            if pos + 8 > size:
                self.pos = pos
                self._need(8)
            (n,) = unpack(buf, pos)
            pos += 8
            if pos + n > size:
                self.pos = pos
                self._need(n)
            append(buf[pos:pos + n].decode("utf-8", errors="replace"))
            pos += n
        self.pos = pos
        return out

    def value(self, vtype: int, depth: int = 0):
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype = self.u32()
            count = self.u64()
            if etype == _STRING:
                self._need(count * _MIN_STRING_BYTES)      # before building the list
                return self._strings(count)
            if etype == _ARRAY:
                if depth >= MAX_ARRAY_DEPTH:
                    raise GGUFError(f"arrays nested deeper than {MAX_ARRAY_DEPTH}")
                self._need(count * _MIN_ARRAY_BYTES)
                return [self.value(_ARRAY, depth + 1) for _ in range(count)]
            dt = _SCALAR_DTYPES.get(etype)
            if dt is None:
                raise GGUFError(f"unknown array element type {etype}")
            self._need(count * dt.itemsize)
            arr = np.frombuffer(self.buf, dtype=dt, count=count, offset=self.pos)
            self.pos += count * dt.itemsize
            return arr.astype(bool).tolist() if etype == _BOOL else arr.tolist()
        dt = _SCALAR_DTYPES.get(vtype)
        if dt is None:
            raise GGUFError(f"unknown value type {vtype}")
        self._need(dt.itemsize)
        v = np.frombuffer(self.buf, dtype=dt, count=1, offset=self.pos)[0]
        self.pos += dt.itemsize
        return bool(v) if vtype == _BOOL else v.item()


def _type_sizes(qtype: int) -> tuple[int, int]:
    """(elements, bytes) of a block of the type: the types we decode from our own table,
    others from the gguf package's (slow to import: a file of our types needs none of it)."""
    info = QUANT_TYPES.get(qtype)
    if info is not None:
        return info.block_size, info.type_size
    import gguf

    try:
        return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(qtype)]
    except (ValueError, KeyError):
        raise GGUFError(f"unknown tensor type id {qtype}") from None


class GGUFFile:
    """A validated GGUF file: metadata, tensor table, and tensor data on demand.

    ``parser="fast"`` (default) reads the header with a bulk numpy parser; ``parser="gguf"``
    uses ``gguf.GGUFReader`` (slow for large vocabularies; kept as the cross-check).
    The header is parsed from a mapping of the file, closed once parsed; tensor data is
    read with positional reads (:mod:`.file_read`) from the file, which stays open until
    :meth:`close` (or the end of a ``with`` block). Tensors handed out are copies,
    independent of the file, and no file page counts in the process's RSS.
    """

    def __init__(self, path, *, check_architecture: bool = True, parser: str = "fast", header_only: bool = False):
        path = Path(path)
        self.path = path
        self.header_only = header_only
        self._fh = None
        self._reader = None
        fh = _open_regular(path)
        try:
            size = os.fstat(fh.fileno()).st_size
            magic = fh.read(4)
        except OSError as e:
            fh.close()
            raise GGUFError(f"{path}: cannot be read: {e.strerror or e}") from None
        self._fh = fh            # tensor data is read from it (raw), at absolute offsets
        self.file_size = size
        if magic != b"GGUF":
            self.close()
            if len(magic) < 4:
                raise GGUFError(f"{path}: truncated GGUF file ({size} bytes)")
            raise GGUFError(f"{path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
        try:
            if parser == "fast":
                self._open_fast(fh, size)
            elif parser == "gguf":
                self._open_gguf_reader(path, size)
            else:
                raise ValueError(f"unknown parser {parser!r}")
            for info in ([] if header_only else self.tensors.values()):
                end = info.offset + info.nbytes
                if end > size:
                    raise GGUFError(
                        f"{path}: truncated GGUF file: tensor {info.name!r} needs bytes "
                        f"[{info.offset}, {end}) but the file has {size}"
                    )
            _check_layout(self.tensors.values(), self.data_offset, self.alignment)
            self.architecture = self.get("general.architecture", None)
            if self.architecture is None:
                raise GGUFError(f"{path}: no general.architecture in the metadata")
            if check_architecture and self.architecture not in SUPPORTED_ARCHITECTURES:
                raise GGUFError(
                    f"{path}: unsupported architecture {self.architecture!r}; "
                    f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
                )
        except GGUFError as e:
            self.close()
            msg = str(e)
            if not msg.startswith(str(path)):
                raise GGUFError(f"{path}: corrupt or truncated GGUF file ({size} bytes): {msg}") from e
            raise
        except Exception as e:  # the gguf package raises ValueError, IndexError, struct errors, ...
            self.close()
            raise GGUFError(f"{path}: corrupt or truncated GGUF file ({size} bytes): {type(e).__name__}: {e}") from e

    def _open_fast(self, fh, size: int) -> None:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            self._parse_header(mm, size)
        finally:
            try:
                mm.close()      # the header is parsed into Python objects; tensor data is read from fh
            except BufferError:  # a view still holds it (an exception's frame); the GC closes it then
                pass

    def _parse_header(self, mm, size: int) -> None:
        h = _Header(mm, size)
        h.pos = 4
        version = h.u32()
        if version not in (2, 3):
            if version & 0xFFFF == 0 and version != 0:
                raise GGUFError(f"big-endian GGUF files are not supported")
            raise GGUFError(f"unsupported GGUF version {version}")
        self.version = version
        n_tensors = h.u64()
        n_kv = h.u64()
        if n_tensors > 1 << 24 or n_kv > 1 << 24 or \
                n_tensors * _MIN_TENSOR_BYTES + n_kv * _MIN_KV_BYTES > size - h.pos:
            raise GGUFError(f"implausible counts: {n_tensors} tensors and {n_kv} metadata keys "
                            f"cannot fit in the file's {size} bytes")
        values: dict[str, Any] = {}
        for _ in range(n_kv):
            key = h.string()
            values[key] = h.value(h.u32())
        raw = []
        for _ in range(n_tensors):
            name = h.string()
            n_dims = h.u32()
            if n_dims > 8:
                raise GGUFError(f"tensor {name!r}: {n_dims} dimensions")
            ne = [h.u64() for _ in range(n_dims)]
            qtype = h.u32()
            offset = h.u64()
            raw.append((name, ne, qtype, offset))
        align = values.get("general.alignment", 32)
        if type(align) is not int or not 0 < align <= 1 << 20 or align & (align - 1):
            raise GGUFError(f"general.alignment is {align!r:.40}; it must be a power of two "
                            "up to 2^20")
        self.alignment = align
        data_start = (h.pos + align - 1) // align * align
        tensors: dict[str, TensorInfo] = {}
        for name, ne, qtype, offset in raw:
            if name in tensors:
                raise GGUFError(f"duplicated tensor {name!r}")
            bs, ts = _type_sizes(qtype)
            n = math.prod(ne)             # Python ints: no wrap-around
            if ne and ne[0] % bs:
                raise GGUFError(f"tensor {name!r}: row length {ne[0]} is not a multiple of the block size {bs}")
            tensors[name] = TensorInfo(
                name=name,
                qtype=qtype,
                shape=tuple(int(d) for d in reversed(ne)),
                offset=data_start + offset,
                nbytes=n // bs * ts,
            )
        self._values = values
        self.tensors = tensors
        self.data_offset = data_start

    def _open_gguf_reader(self, path: Path, size: int) -> None:
        import gguf

        reader = gguf.GGUFReader(str(path), "r")
        self._reader = reader
        self._values = {k: _field_value(f) for k, f in reader.fields.items()}
        for k in [k for k in self._values if k.startswith("GGUF.")]:  # the reader's own pseudo-keys
            del self._values[k]
        self.version = int(reader.fields["GGUF.version"].parts[-1][0]) if "GGUF.version" in reader.fields else None
        self.tensors = {
            t.name: TensorInfo(
                name=t.name,
                qtype=int(t.tensor_type),
                shape=tuple(int(d) for d in reversed(list(t.shape))),
                offset=int(t.data_offset),
                nbytes=int(t.n_bytes),
            )
            for t in reader.tensors
        }
        self.data_offset = int(reader.data_offset)
        self.alignment = int(reader.alignment)

    # ------------------------------------------------------------------ metadata
    def keys(self) -> list[str]:
        return list(self._values.keys())

    def __contains__(self, key: str) -> bool:
        return key in self._values

    def get(self, key: str, default=_MISSING):
        """A metadata value; a missing key returns ``default`` or raises GGUFError."""
        if key in self._values:
            return self._values[key]
        if default is _MISSING:
            raise GGUFError(f"{self.path}: metadata key {key!r} missing")
        return default

    def arch_get(self, suffix: str, default=_MISSING):
        """``get(f"{architecture}.{suffix}")``."""
        return self.get(f"{self.architecture}.{suffix}", default)

    @property
    def metadata(self) -> dict[str, Any]:
        return dict(self._values)

    # ------------------------------------------------------------------ tensors
    def has_tensor(self, name: str) -> bool:
        return name in self.tensors

    def tensor_info(self, name: str) -> TensorInfo:
        info = self.tensors.get(name)
        if info is None:
            raise GGUFError(f"{self.path}: tensor {name!r} missing (architecture {self.architecture})")
        return info

    def require(self, names: Iterable[str], *, supported: bool = True) -> None:
        """Check up front that every tensor exists (and is a type we decode)."""
        names = list(names)
        missing = [n for n in names if n not in self.tensors]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise GGUFError(
                f"{self.path}: tensor {missing[0]!r} missing{more} (architecture {self.architecture})"
            )
        if supported:
            for n in names:
                quant_info(self.tensors[n].qtype, n)

    def raw(self, name: str) -> torch.Tensor:
        """The tensor's bytes as a flat uint8 tensor (a copy)."""
        return self.raw_concat([name])

    def raw_concat(self, names: Iterable[str]) -> torch.Tensor:
        """The bytes of the tensors ``names``, one after another, as one flat uint8 tensor
        (one copy: the loader's fused q|k|v and gate|up weights need no second one)."""
        infos = [self.tensor_info(n) for n in names]
        if self.header_only:
            raise GGUFError(f"{self.path}: opened header-only; tensor {infos[0].name!r} cannot be read")
        if self._reader is not None:
            parts = [np.asarray(self._reader.data[i.offset:i.offset + i.nbytes]) for i in infos]
            for i, p in zip(infos, parts):
                if p.size != i.nbytes:
                    raise GGUFError(f"{self.path}: tensor {i.name!r}: {p.size} bytes, expected {i.nbytes}")
            return torch.from_numpy(np.concatenate(parts) if len(parts) > 1 else parts[0].copy())
        if self._fh is None:
            raise GGUFError(f"{self.path}: file is closed")
        arr = np.empty(sum(i.nbytes for i in infos), np.uint8)
        spans, at = [], 0
        for i in infos:
            spans.append((i.offset, arr[at:at + i.nbytes]))
            at += i.nbytes
        try:
            read_spans(self._fh, spans)
        except EOFError as e:
            what = ", ".join(repr(i.name) for i in infos)
            raise GGUFError(f"{self.path}: truncated GGUF file: it shrank after it was opened "
                            f"(reading tensor {what}: {e})") from None
        except OSError as e:
            raise GGUFError(f"{self.path}: cannot be read: {e.strerror or e}") from None
        return torch.from_numpy(arr)

    def float_tensor(self, name: str) -> torch.Tensor:
        """The tensor decoded to float32, in torch shape (reversed ne)."""
        info = self.tensor_info(name)
        quant_info(info.qtype, name)
        w = dequantize(self.raw(name), info.qtype, info.rows, info.cols, tensor_name=name)
        return w.reshape(info.shape)

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        fh, self._fh = self._fh, None
        if fh is not None:
            fh.close()
        reader, self._reader = self._reader, None
        if reader is not None:
            rmm = getattr(getattr(reader, "data", None), "_mmap", None)
            reader.tensors = []
            reader.fields = {}
            reader.data = None
            if rmm is not None:
                try:
                    rmm.close()
                except Exception:
                    pass

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GGUFFile({str(self.path)!r}, architecture={getattr(self, 'architecture', None)!r}, tensors={len(getattr(self, 'tensors', {}))})"


def _open_regular(path: Path):
    """The file at `path` opened for reading, or GGUFError: missing (GGUFFileNotFoundError),
    not a regular file (a directory, a FIFO, a device: opened without blocking and
    refused), or unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        raise GGUFFileNotFoundError(f"GGUF file not found: {path}") from None
    except IsADirectoryError:
        raise GGUFError(f"{path}: not a regular file (a directory)") from None
    except OSError as e:
        raise GGUFError(f"{path}: cannot be read: {e.strerror or e}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        what = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else \
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket or other special file"
        raise GGUFError(f"{path}: not a regular file ({what})")
    return os.fdopen(fd, "rb")


def _check_layout(tensors: Iterable[TensorInfo], data_offset: int, alignment: int) -> None:
    """Each tensor's data starts at a multiple of the alignment from the data section's
    start and overlaps no other tensor's (GGUF lays them out one after another)."""
    spans = []
    for t in tensors:
        if t.offset < data_offset or (t.offset - data_offset) % alignment:
            raise GGUFError(f"tensor {t.name!r}: data offset {t.offset - data_offset} is not a "
                            f"multiple of general.alignment {alignment}")
        if t.nbytes:
            spans.append((t.offset, t.offset + t.nbytes, t.name))
    spans.sort()
    for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
        if start < end:
            raise GGUFError(f"tensors {a!r} and {b!r} overlap: {a!r} ends at byte {end}, "
                            f"{b!r} starts at {start}")


def open_gguf(path, *, check_architecture: bool = True, parser: str = "fast", header_only: bool = False) -> GGUFFile:
    return GGUFFile(path, check_architecture=check_architecture, parser=parser, header_only=header_only)


__all__ += ["UnsupportedQuantType"]
