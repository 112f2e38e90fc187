"""GGUF files through the ``gguf`` package, with the axis order said once.

**The axis-order rule.** ggml names a tensor's dimensions fastest-varying first:
``{ne0, ne1} = {in, out}`` for a weight matrix (llama.cpp writes shapes this way).
NumPy and PyTorch name them slowest first: ``[out, in]``. The same bytes, two spellings:

- ``gguf.ReaderTensor.shape`` is the **ggml** order ``[ne0, ne1, ...]``;
- ``gguf.ReaderTensor.data`` is a NumPy array in **NumPy** order ``[..., ne1, ne0]`` (for
  quantized and BF16 types its last axis counts bytes, not weights);
- ``GGUFWriter.add_tensor`` takes NumPy order and reverses it into ggml order on disk.

Everything this module returns is in NumPy order (``numpy_shape``, :meth:`GGUFFile.load`) unless
the name says ggml (``ggml_shape``). So an HF ``q_proj.weight [Hq, H]`` is the GGUF ``attn_q``
with ggml shape ``{H, Hq}`` and loads back as ``[Hq, H]``, no transpose anywhere.

Reading uses ``gguf.GGUFReader`` (memory-mapped) and ``gguf.quants.dequantize``; writing uses
``gguf.GGUFWriter`` with our own quantizers (:mod:`dflash_ref.io.quant`) for Q8_0 and Q4_K. There
is no hand-written GGUF parser or writer here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from dflash_ref.errors import FormatError
from dflash_ref.io.quant import float32_to_bf16_bits, quantize_q4_k, quantize_q8_0
from dflash_ref.io.safetensors_io import MissingTensorError, missing_tensor_message
from dflash_ref.io.writing import Replace, new_file, replace_any

GGUF_MAGIC = b"GGUF"
WRITE_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_K")  # float types write_gguf can produce
_UNPREFIXED = ("general.", "tokenizer.", "split.")  # keys that never carry the arch prefix
_INT_TYPES = ("I8", "I16", "I32", "I64")


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One tensor's entry: ``ggml_shape`` is {ne0, ne1, ...}; ``numpy_shape`` its reverse."""

    name: str
    ggml_type: str  # "F32", "BF16", "Q8_0", ... (gguf.GGMLQuantizationType names)
    ggml_shape: tuple[int, ...]
    numpy_shape: tuple[int, ...]
    n_bytes: int


class GGUFFile:
    """A GGUF file opened for reading (memory-mapped; tensors dequantized on demand).

    ``arch`` is ``general.architecture``; :meth:`get` looks ``"block_count"`` up as
    ``"{arch}.block_count"`` first. ``metadata`` holds every key as plain Python values.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise FormatError(f"GGUF file {self.path} does not exist")
        with open(self.path, "rb") as f:
            magic = f.read(4)
        if magic != GGUF_MAGIC:
            raise FormatError(
                f"{self.path} is not a GGUF file: it starts with {magic!r}, not {GGUF_MAGIC!r}"
            )
        try:
            self._reader = _reader(self.path)
        except Exception as exc:  # gguf raises ValueError/IndexError on short or corrupt data
            size = self.path.stat().st_size
            raise FormatError(
                f"could not parse {self.path} ({size} bytes) as GGUF: "
                f"{type(exc).__name__}: {exc}; the file is truncated or corrupt"
            ) from exc
        self._tensors = {t.name: t for t in self._reader.tensors}
        size = self.path.stat().st_size
        for t in self._reader.tensors:  # gguf slices the memmap without checking its end
            if t.data_offset + t.n_bytes > size:
                raise FormatError(
                    f"{self.path} is truncated: tensor {t.name!r} ends at byte "
                    f"{t.data_offset + t.n_bytes} but the file has {size} bytes"
                )
        arch = self._reader.get_field("general.architecture")
        self.arch: str | None = arch.contents() if arch is not None else None

    def __repr__(self) -> str:
        return f"GGUFFile({str(self.path)!r}, arch={self.arch!r}, {len(self._tensors)} tensors)"

    # ------------------------------------------------------------ metadata

    @cached_property
    def metadata(self) -> dict[str, Any]:
        """Every key -> a plain value: str, int, float, bool, or a list of those."""
        return {name: field.contents() for name, field in self._reader.fields.items()
                if not name.startswith("GGUF.")}  # the reader's own header pseudo-fields

    def value_type(self, key: str) -> str:
        """The stored GGUF type of ``key`` (arch prefix applied): "UINT32", "ARRAY[INT32]", ..."""
        field = self._reader.get_field(self.arch_key(key)) or self._reader.get_field(key)
        if field is None:
            raise FormatError(f"{self.path.name} has no key {self.arch_key(key)!r}")
        names = [t.name for t in field.types]
        return names[0] if len(names) == 1 else f"{names[0]}[{names[-1]}]"

    def arch_key(self, key: str) -> str:
        """``key`` with the arch prefix: "block_count" -> "dflash.block_count"."""
        if key.startswith(_UNPREFIXED) or self.arch is None or key.startswith(self.arch + "."):
            return key
        return f"{self.arch}.{key}"

    def get(self, key: str, default: Any = None) -> Any:
        """Metadata value of ``{arch}.key`` (or ``key`` itself when unprefixed), else default."""
        for k in (self.arch_key(key), key):
            if k in self.metadata:
                return self.metadata[k]
        return default

    def require(self, key: str) -> Any:
        """Like :meth:`get`, but a missing key is a FormatError listing the arch's keys."""
        value = self.get(key, _MISSING)
        if value is _MISSING:
            keys = sorted(k for k in self.metadata if self.arch and k.startswith(self.arch + "."))
            raise FormatError(
                f"{self.path.name} (arch {self.arch!r}) has no key {self.arch_key(key)!r}; "
                f"its {self.arch} keys are {keys}"
            )
        return value

    # ------------------------------------------------------------ tensors

    @property
    def tensor_names(self) -> list[str]:
        """Tensor names in file order."""
        return list(self._tensors)

    def __contains__(self, name: object) -> bool:
        return name in self._tensors

    def _tensor(self, name: str):
        if name not in self._tensors:
            raise MissingTensorError(missing_tensor_message(name, self._tensors, str(self.path)))
        return self._tensors[name]

    def tensor_info(self, name: str) -> GGUFTensorInfo:
        """Type and both spellings of the shape of tensor ``name`` (nothing is read)."""
        t = self._tensor(name)
        ggml_shape = tuple(int(n) for n in t.shape)
        return GGUFTensorInfo(name, t.tensor_type.name, ggml_shape, ggml_shape[::-1],
                              int(t.n_bytes))

    def raw(self, name: str) -> np.ndarray:
        """The stored data of ``name`` as gguf exposes it (NumPy order; bytes for quant types)."""
        return self._tensor(name).data

    def load(self, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """Tensor ``name`` as float32 in NumPy order [..., ne1, ne0], dequantized if needed.

        Raises FormatError for a missing tensor, an integer tensor (use :meth:`load_native`), a
        type gguf cannot dequantize, or a NumPy shape other than ``shape``.
        """
        info = self.tensor_info(name)
        if info.ggml_type in _INT_TYPES:
            raise FormatError(
                f"tensor {name!r} in {self.path.name} is {info.ggml_type}, not a float weight; "
                f"integer tensors load with load_native()"
            )
        if shape is not None and tuple(shape) != info.numpy_shape:
            raise FormatError(
                f"tensor {name!r} in {self.path.name} has NumPy shape {list(info.numpy_shape)} "
                f"(ggml {{{', '.join(map(str, info.ggml_shape))}}}), expected {list(shape)}"
            )
        return self.load_native(name).astype(np.float32, copy=False)

    def load_native(self, name: str) -> np.ndarray:
        """Tensor ``name`` in NumPy order: integer types as stored, every other type as float32."""
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        t = self._tensor(name)
        info = self.tensor_info(name)
        if info.ggml_type in _INT_TYPES or info.ggml_type in ("F32", "F64"):
            return np.array(t.data).reshape(info.numpy_shape)
        try:
            out = dequantize(np.asarray(t.data), GGMLQuantizationType[info.ggml_type])
        except NotImplementedError as exc:
            raise FormatError(
                f"tensor {name!r} in {self.path.name} has type {info.ggml_type}, which the gguf "
                f"package cannot dequantize ({exc})"
            ) from exc
        return np.asarray(out, dtype=np.float32).reshape(info.numpy_shape)


_MISSING = object()


def _reader(path: Path):
    """A ``gguf.GGUFReader`` whose mapped file is a plain ndarray view of the ``np.memmap``.

    The reader slices its map once per metadata value; on a real tokenizer (Gemma: 262144
    strings, scores and types) ``np.memmap.__getitem__`` / ``__array_finalize__`` took 22 of the
    38 s of ``TargetModel.from_gguf`` (cProfile, 2 cores). A plain view shares the same pages
    (its ``base`` keeps the map alive) and slices in C.
    """
    from gguf import GGUFReader

    class _PlainViewReader(GGUFReader):
        @property
        def data(self):
            return self._plain_data

        @data.setter
        def data(self, value):
            self._plain_data = value.view(np.ndarray) if isinstance(value, np.memmap) else value

    return _PlainViewReader(path)


def open_gguf(path: str | Path | GGUFFile) -> GGUFFile:
    """Open a GGUF file for reading (see :class:`GGUFFile`); an opened one is returned as is,
    so a caller that needs both the weights and the tokenizer parses the header once."""
    return path if isinstance(path, GGUFFile) else GGUFFile(path)


# ---------------------------------------------------------------- writing


def _value_type(key: str, value: Any):
    """(value, GGUFValueType, array sub-type or None) for a plain Python metadata value.

    bool -> BOOL; int -> UINT32 (INT32 if negative, 64-bit types beyond 32 bits); float ->
    FLOAT32; str -> STRING; a list -> ARRAY of its items' type, except that a list of ints is
    INT32 (llama.cpp reads layer-id arrays such as ``dflash.target_layer_ids`` as INT32). Pass
    ``(value, "UINT64")`` / ``(list, "FLOAT64")`` to choose a type explicitly.
    """
    from gguf import GGUFValueType as V

    if (isinstance(value, tuple) and len(value) == 2
            and (isinstance(value[1], V) or value[1] in V.__members__)):
        value, vt = value
        vt = V[vt] if isinstance(vt, str) else vt
        if isinstance(value, (list, np.ndarray)):
            return list(np.asarray(value).tolist()), V.ARRAY, vt
        return value, vt, None
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        if not value:
            raise FormatError(f"metadata {key!r}: GGUF cannot store an empty array")
        kinds = {_value_type(key, v)[1] for v in value}
        if kinds <= {V.UINT32, V.INT32, V.UINT64, V.INT64}:
            sub = V.INT32 if all(-(2**31) <= v < 2**31 for v in value) else V.INT64
        elif len(kinds) == 1:
            sub = kinds.pop()
        else:
            raise FormatError(f"metadata {key!r}: array items have mixed types {kinds}")
        return list(value), V.ARRAY, sub
    if isinstance(value, (bool, np.bool_)):
        return bool(value), V.BOOL, None
    if isinstance(value, (int, np.integer)):
        v = int(value)
        if 0 <= v < 2**32:
            return v, V.UINT32, None
        if -(2**31) <= v < 0:
            return v, V.INT32, None
        return v, (V.UINT64 if v >= 0 else V.INT64), None
    if isinstance(value, (float, np.floating)):
        return float(value), V.FLOAT32, None
    if isinstance(value, str):
        return value, V.STRING, None
    raise FormatError(f"metadata {key!r}: cannot store a {type(value).__name__} in GGUF")


def _encode_tensor(name: str, x, ggml_type: str):
    """x float [NumPy order] -> (array to hand to GGUFWriter, raw_dtype or None)."""
    from gguf import GGMLQuantizationType as Q

    x = np.asarray(x)
    if ggml_type == "I64" and np.issubdtype(x.dtype, np.integer):  # ids (a drafter's d2t)
        return np.ascontiguousarray(x, dtype=np.int64), Q.I64
    if not np.issubdtype(x.dtype, np.floating):
        raise FormatError(f"tensor {name!r}: write_gguf takes float arrays (integer ones as "
                          f"I64), got dtype {x.dtype}")
    if x.ndim == 0:
        raise FormatError(f"tensor {name!r}: GGUF tensors need at least one dimension")
    x = np.ascontiguousarray(x, dtype=np.float32)
    try:
        if ggml_type == "F32":
            return x, None
        if ggml_type == "F16":
            if np.any(np.abs(x) > 65504):
                raise FormatError(f"|x| up to {float(np.abs(x).max()):.3g} overflows F16 (65504)")
            return x.astype(np.float16), None
        if ggml_type == "BF16":  # bytes [..., 2 n]; GGUFWriter derives the shape from raw_dtype
            return float32_to_bf16_bits(x).view(np.uint8), Q.BF16
        if ggml_type == "Q8_0":
            return quantize_q8_0(x), Q.Q8_0
        if ggml_type == "Q4_K":
            return quantize_q4_k(x), Q.Q4_K
    except FormatError as exc:
        raise FormatError(f"tensor {name!r} {list(x.shape)} as {ggml_type}: {exc}") from exc
    raise FormatError(f"tensor {name!r}: type {ggml_type!r} is not one of {WRITE_TYPES}")


def write_gguf(path: str | Path, arch: str, tensors: Mapping[str, np.ndarray],
               types: str | Mapping[str, str] = "F32",
               metadata: Mapping[str, Any] | None = None, *, replace: Replace = replace_any,
               option: str = "OUT") -> Path:
    """Write a GGUF file with ``gguf.GGUFWriter``; returns the path.

    Args:
        arch: ``general.architecture`` (e.g. "dflash", "qwen35-dflash-draft").
        tensors: name -> float array in **NumPy order** [out, in] (written as ggml {in, out}).
        types: one of ``WRITE_TYPES`` for every tensor, or name -> type (missing names: F32;
            "I64" for an integer array, such as a drafter's d2t).
            Q8_0 needs the last dimension a multiple of 32, Q4_K of 256.
        metadata: full key -> value (keys are written as given: include the arch prefix);
            plain values are typed by :func:`_value_type`, or pass ``(value, "INT32")``.
        replace: which existing file at ``path`` may be replaced (:mod:`dflash_ref.io.writing`);
            default: any (the caller owns the path); the CLI passes its rule.

    The file is written under a temporary name beside ``path`` and moved onto it only when
    complete (:func:`dflash_ref.io.writing.new_file`): a failure (a bad tensor, a full disk,
    Ctrl-C) leaves ``path`` as it was.
    """
    from gguf import GGML_QUANT_VERSION, GGUFWriter

    path = Path(path)
    encoded = {}
    for name, x in tensors.items():
        ggml_type = types if isinstance(types, str) else types.get(name, "F32")
        encoded[name] = _encode_tensor(name, x, ggml_type)
    with new_file(path, option, replace=replace) as tmp:
        writer = GGUFWriter(tmp, arch)
        for key, value in (metadata or {}).items():
            val, vtype, sub = _value_type(key, value)
            writer.add_key_value(key, val, vtype, sub_type=sub)
        if any(raw is not None and raw.name not in ("BF16", "I64") for _, raw in encoded.values()):
            writer.add_quantization_version(GGML_QUANT_VERSION)
        for name, (data, raw_dtype) in encoded.items():
            writer.add_tensor(name, data, raw_dtype=raw_dtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return path
