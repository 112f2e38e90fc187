"""Hugging Face checkpoint directories (safetensors + config.json): lazy reading, tiny writing.

Layout of a checkpoint directory (the HF convention; z-lab drafters ship the first form)::

    config.json                        the model config (parsed elsewhere: dflash_ref.config)
    model.safetensors                  every tensor in one file, or
    model.safetensors.index.json       {"metadata": {"total_size": N},
                                        "weight_map": {tensor name: shard file name}}
    model-00001-of-00003.safetensors   the shards the index names

When both forms are present the single file wins, as in transformers. Tensors are PyTorch
``[out, in]`` (docs/formats.md), so a safetensors matrix is already in NumPy order.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON
(``{name: {"dtype", "shape", "data_offsets": [begin, end]}}``, offsets relative to the end of
the header) and the raw little-endian tensor bytes. The ``safetensors`` package parses and
validates it (``safe_open``) and reads F16/F32/integer tensors for us. Its NumPy API cannot
return **BF16** (NumPy has no bfloat16 dtype), so for BF16 tensors we read the byte range named
by the header ourselves as raw uint16 and widen the bits exactly to float32
(``bf16 << 16``, :func:`dflash_ref.io.quant.bf16_bits_to_float32`). That is the only place this
module looks inside the file format, and the file has already passed ``safe_open`` by then.

Reading is lazy: :func:`open_checkpoint` reads only the headers; each tensor is read when it is
asked for, so a 16 GB checkpoint costs nothing until a tensor is used.
"""

from __future__ import annotations

import difflib
import json
import struct
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dflash_ref.errors import FormatError
from dflash_ref.io.quant import bf16_bits_to_float32, float32_to_bf16_bits

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
CONFIG_FILE = "config.json"
FLOAT_DTYPES = ("BF16", "F16", "F32", "F64")  # safetensors dtype codes read as float32
_NUMPY_OF = {"F16": np.float16, "F32": np.float32, "F64": np.float64}

# Storage choices of write_safetensors -> (safetensors dtype name, NumPy dtype of the bytes).
_STORAGE = {
    "float32": ("float32", np.float32), "f32": ("float32", np.float32),
    "float16": ("float16", np.float16), "f16": ("float16", np.float16),
    "bfloat16": ("bfloat16", np.uint16), "bf16": ("bfloat16", np.uint16),
}


class MissingTensorError(FormatError, KeyError):
    """A tensor name the checkpoint does not hold (also a KeyError, so Mapping.get works)."""

    __str__ = Exception.__str__  # KeyError would print the message in quotes


@dataclass(frozen=True)
class TensorInfo:
    """What the header says about one tensor: ``dtype`` is the safetensors code ("BF16", ...)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: Path


def missing_tensor_message(name: str, available, where: str) -> str:
    """'tensor X is not in WHERE (N tensors); close names: [...]' for every missing-tensor error."""
    names = sorted(available)
    close = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
    hint = f"close names: {close}" if close else f"first names: {names[:5]}"
    return f"tensor {name!r} is not in {where} ({len(names)} tensors); {hint}"


def check_tensor_shapes(weights: Mapping, expected: Mapping[str, tuple[int, ...]], where: str,
                        hint: str = "") -> None:
    """Every ``expected`` name is in ``weights`` with exactly its shape, else FormatError.

    A missing tensor names the first few missing and ``hint`` (how to fix the pairing); a wrong
    shape names the tensor, the shape found and the one the config implies.
    """
    missing = [n for n in expected if n not in weights]
    if missing:
        raise FormatError(
            f"{where} lacks {len(missing)} tensor(s) its config needs, e.g. {missing[:3]}"
            + (f"; {hint}" if hint else "")
        )
    for name, shape in expected.items():
        got = tuple(weights[name].shape)
        if got != tuple(shape):
            raise FormatError(
                f"{where}: tensor {name} has shape {list(got)}, expected {list(shape)} from "
                f"config.json; the config and the weights disagree"
            )


class SafetensorsCheckpoint(Mapping):
    """A checkpoint opened lazily: ``ckpt[name]`` reads that one tensor as float32 [shape].

    Attributes: ``path`` (the directory), ``files`` (the .safetensors files), ``config`` (the
    parsed config.json, or None when absent), ``infos`` (name -> :class:`TensorInfo`).
    """

    def __init__(self, path: str | Path):
        path = Path(path)
        if path.is_file() and path.name.endswith(".safetensors"):
            directory, files = path.parent, {path.name: path}
            weight_map = None
        elif path.is_file() and path.name.endswith(".index.json"):
            directory = path.parent
            weight_map, files = _read_index(path)
        elif path.is_dir():
            directory = path
            if (path / SINGLE_FILE).is_file():
                files, weight_map = {SINGLE_FILE: path / SINGLE_FILE}, None
            elif (path / INDEX_FILE).is_file():
                weight_map, files = _read_index(path / INDEX_FILE)
            else:
                raise FormatError(
                    f"{path} holds neither {SINGLE_FILE} nor {INDEX_FILE}; "
                    f"point at a Hugging Face checkpoint directory (found: "
                    f"{sorted(p.name for p in path.iterdir())[:10]})"
                )
        else:
            raise FormatError(
                f"checkpoint {path} does not exist (expected a directory with {SINGLE_FILE} or "
                f"{INDEX_FILE}, or a .safetensors file)"
            )
        self.path = directory
        self.files = sorted(files.values())
        self.config = _read_config(directory / CONFIG_FILE)
        self._headers: dict[Path, dict] = {}
        per_file = {f: _read_infos(f) for f in files.values()}
        if weight_map is None:
            self.infos = {i.name: i for infos in per_file.values() for i in infos.values()}
        else:
            self.infos = {}
            for name, shard in weight_map.items():
                infos = per_file[files[shard]]
                if name not in infos:
                    raise FormatError(
                        f"{INDEX_FILE} maps tensor {name!r} to {shard}, which does not hold it "
                        f"({missing_tensor_message(name, infos, shard)}); the index and the "
                        f"shards come from different checkpoints"
                    )
                self.infos[name] = infos[name]

    # ------------------------------------------------------------ Mapping interface

    def __getitem__(self, name: str) -> np.ndarray:
        return self.load(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.infos)

    def __len__(self) -> int:
        return len(self.infos)

    def __contains__(self, name: object) -> bool:
        return name in self.infos

    def __repr__(self) -> str:
        return f"SafetensorsCheckpoint({str(self.path)!r}, {len(self)} tensors)"

    # ------------------------------------------------------------ access

    def info(self, name: str) -> TensorInfo:
        """Dtype, shape and file of ``name`` without reading its data."""
        if name not in self.infos:
            raise MissingTensorError(missing_tensor_message(name, self.infos, str(self.path)))
        return self.infos[name]

    def loaders(self) -> dict[str, Callable[[], np.ndarray]]:
        """name -> a zero-argument function reading that tensor as float32 (nothing read yet)."""
        return {name: (lambda n=name: self.load(n)) for name in self.infos}

    def load(self, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """Tensor ``name`` as float32 [shape] (BF16/F16 widened exactly, F64 rounded).

        Raises FormatError for a missing tensor (with close names), a non-float dtype (use
        :meth:`load_native` for integer tensors such as ``d2t``) or a shape other than ``shape``.
        """
        info = self.info(name)
        if info.dtype not in FLOAT_DTYPES:
            raise FormatError(
                f"tensor {name!r} in {info.file.name} has dtype {info.dtype}; expected a float "
                f"weight ({', '.join(FLOAT_DTYPES)}). Integer tensors load with load_native()"
            )
        if shape is not None and tuple(shape) != info.shape:
            raise FormatError(
                f"tensor {name!r} in {info.file.name} has shape {list(info.shape)}, expected "
                f"{list(shape)}; the checkpoint does not match the config"
            )
        return self.load_native(name).astype(np.float32, copy=False)

    def load_native(self, name: str) -> np.ndarray:
        """Tensor ``name`` in its stored dtype; BF16 comes back as float32 (exact)."""
        info = self.info(name)
        if info.dtype == "BF16":
            return bf16_bits_to_float32(self._read_bf16_bits(info))
        try:
            from safetensors import safe_open

            with safe_open(str(info.file), framework="numpy") as f:
                return f.get_tensor(name)
        except Exception as exc:  # the Rust reader raises SafetensorError / TypeError
            raise FormatError(
                f"could not read tensor {name!r} ({info.dtype} {list(info.shape)}) from "
                f"{info.file}: {type(exc).__name__}: {exc}"
            ) from exc

    def _read_bf16_bits(self, info: TensorInfo) -> np.ndarray:
        """The raw uint16 bits of a BF16 tensor, from the byte range its header names."""
        if info.file not in self._headers:
            self._headers[info.file] = _read_header(info.file)
        header_len, header = self._headers[info.file]
        begin, end = header[info.name]["data_offsets"]
        count = int(np.prod(info.shape, dtype=np.int64))
        if end - begin != 2 * count:
            raise FormatError(
                f"tensor {info.name!r} in {info.file}: BF16 {list(info.shape)} needs "
                f"{2 * count} bytes but its data_offsets span {end - begin}"
            )
        bits = np.fromfile(info.file, dtype="<u2", count=count, offset=8 + header_len + begin)
        if bits.size != count:
            raise FormatError(f"{info.file} is truncated inside tensor {info.name!r}")
        return bits.reshape(info.shape)


def open_checkpoint(path: str | Path) -> SafetensorsCheckpoint:
    """Open a checkpoint directory (or one .safetensors file, or an index) lazily."""
    return SafetensorsCheckpoint(path)


def load_checkpoint(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of a checkpoint, the float ones as float32 and the integer ones (a reduced
    drafter's ``d2t``) as stored (reads everything: for small models and tests)."""
    ckpt = open_checkpoint(path)
    return {name: ckpt.load(name) if ckpt.info(name).dtype in FLOAT_DTYPES
            else ckpt.load_native(name) for name in ckpt}


# ---------------------------------------------------------------- file helpers


def _read_config(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FormatError(f"{path} is not valid JSON: {exc}") from exc


def _read_index(path: Path) -> tuple[dict[str, str], dict[str, Path]]:
    """model.safetensors.index.json -> (weight_map, {shard name: path}), all shards present."""
    try:
        index = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FormatError(f"{path} is not valid JSON: {exc}") from exc
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise FormatError(
            f"{path} has no 'weight_map' object (tensor name -> shard file); it is not a "
            f"safetensors index"
        )
    files = {}
    for shard in sorted(set(weight_map.values())):
        shard_path = path.parent / shard
        if not shard_path.is_file():
            names = sorted(n for n, s in weight_map.items() if s == shard)
            raise FormatError(
                f"{path.name} names shard {shard!r}, which is missing from {path.parent} "
                f"(it should hold {len(names)} tensors, e.g. {names[:3]}); download it again"
            )
        files[shard] = shard_path
    return weight_map, files


def _read_infos(path: Path) -> dict[str, TensorInfo]:
    """Names, dtypes and shapes of one .safetensors file, validated by the safetensors package."""
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="numpy") as f:
            infos = {}
            for name in f.keys():
                view = f.get_slice(name)
                infos[name] = TensorInfo(name, view.get_dtype(), tuple(view.get_shape()), path)
            return infos
    except Exception as exc:  # SafetensorError: truncated, bad header, overlapping offsets...
        raise FormatError(
            f"{path} is not a readable safetensors file ({type(exc).__name__}: {exc}); "
            f"it may be truncated or not a safetensors file"
        ) from exc


def _read_header(path: Path) -> tuple[int, dict]:
    """(N, parsed JSON header) of a safetensors file: 8-byte little-endian N, then N bytes."""
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        return header_len, json.loads(f.read(header_len))


# ---------------------------------------------------------------- writing


def _serialize_file(arrays: dict[str, tuple[str, np.ndarray]], path: Path,
                    metadata: dict[str, str]) -> None:
    """Write {name: (safetensors dtype name, contiguous little-endian array)} with the package.

    safetensors >= 0.8 takes ``TensorSpec`` objects; earlier versions take plain dicts.
    """
    import safetensors

    if hasattr(safetensors, "TensorSpec"):
        flat = {
            name: safetensors.TensorSpec(dtype=dt, shape=list(a.shape), data_ptr=a.ctypes.data,
                                         data_len=a.nbytes)
            for name, (dt, a) in arrays.items()
        }  # the arrays stay alive in ``arrays`` for the duration of the call
    else:
        flat = {name: {"dtype": dt, "shape": list(a.shape), "data": a.tobytes()}
                for name, (dt, a) in arrays.items()}
    safetensors.serialize_file(flat, str(path), metadata=metadata)


def _storage(name: str, x, dtype: str | None) -> tuple[str, np.ndarray]:
    """A tensor as (safetensors dtype name, little-endian array of the stored bytes)."""
    x = np.asarray(x)
    if dtype is not None and np.issubdtype(x.dtype, np.floating):
        if dtype not in _STORAGE:
            raise ValueError(f"storage dtype {dtype!r} is unknown; expected {list(_STORAGE)}")
        st_name, np_dtype = _STORAGE[dtype]
        if st_name == "bfloat16":
            return st_name, float32_to_bf16_bits(x.astype(np.float32)).astype("<u2")
        return st_name, np.ascontiguousarray(x, dtype=np.dtype(np_dtype).newbyteorder("<"))
    if x.dtype.kind not in "fiub":
        raise FormatError(f"tensor {name!r} has dtype {x.dtype}, which safetensors cannot store")
    return x.dtype.name, np.ascontiguousarray(x, dtype=x.dtype.newbyteorder("<"))


def write_safetensors(directory: str | Path, tensors: Mapping[str, np.ndarray],
                      config: Mapping[str, Any] | None = None, shard_size: int | None = None,
                      dtype: str | None = None, overwrite: bool = False) -> Path:
    """Write a checkpoint directory in the Hugging Face layout; returns the directory.

    Args:
        tensors: name -> NumPy array (PyTorch/NumPy order [out, in]).
        config: written as config.json when given.
        shard_size: None -> one ``model.safetensors``; else shards of at most this many bytes
            (a larger tensor gets a shard of its own) plus ``model.safetensors.index.json``.
        dtype: storage of the float tensors: None (as given), "float32", "float16" or
            "bfloat16" (round to nearest even); integer tensors are stored as given.
        overwrite: replace existing model*.safetensors / index / config files.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    existing = [p for p in directory.iterdir()
                if p.name.startswith("model") and (p.suffix == ".safetensors"
                                                   or p.name == INDEX_FILE)]
    if existing and not overwrite:
        raise FileExistsError(
            f"{directory} already holds {sorted(p.name for p in existing)}; pass overwrite=True"
        )
    for p in existing:
        p.unlink()
    arrays = {name: _storage(name, x, dtype) for name, x in tensors.items()}
    metadata = {"format": "pt"}
    if shard_size is None:
        _serialize_file(arrays, directory / SINGLE_FILE, metadata)
    else:
        shards: list[dict[str, tuple[str, np.ndarray]]] = [{}]
        used = 0
        for name, (dt, a) in arrays.items():
            if shards[-1] and used + a.nbytes > shard_size:
                shards.append({})
                used = 0
            shards[-1][name] = (dt, a)
            used += a.nbytes
        weight_map = {}
        for i, shard in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            _serialize_file(shard, directory / fname, metadata)
            weight_map.update({name: fname for name in shard})
        index = {
            "metadata": {"total_size": sum(a.nbytes for _, a in arrays.values())},
            "weight_map": dict(sorted(weight_map.items())),
        }
        (directory / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    if config is not None:
        (directory / CONFIG_FILE).write_text(json.dumps(dict(config), indent=2) + "\n")
    return directory
