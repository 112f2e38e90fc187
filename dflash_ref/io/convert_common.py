"""What the drafter and target converters share: storage types, lazy writing with a progress
bar, and typed metadata reads (docs/formats.md, "Converter").

- :func:`tensor_type`: every 1-D tensor and conv kernel is F32; matrices take the requested type
  when their rows hold whole quantization blocks (Q8_0: 32, Q4_K: 256), else a fallback or an
  error.
- :func:`write_converted`: :func:`~dflash_ref.io.gguf_io.write_gguf` over tensors loaded one at a
  time, with a tqdm bar for large models.
- :func:`meta`: a GGUF metadata value checked for its type, so a malformed file fails with the
  key's name rather than deep inside a model constructor.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dflash_ref.errors import ConfigError, FormatError
from dflash_ref.io.gguf_io import GGUFFile, write_gguf
from dflash_ref.io.writing import Replace, replace_any

# CLI spelling -> GGML type name.
QTYPES = {"f32": "F32", "f16": "F16", "bf16": "BF16", "q8_0": "Q8_0", "q4_k": "Q4_K"}
# Weights per quantization block: a row (last NumPy axis) must hold whole blocks.
BLOCK_SIZE = {"Q8_0": 32, "Q4_K": 256}
# general.file_type (gguf.LlamaFileType): ALL_F32, MOSTLY_F16, MOSTLY_Q8_0, MOSTLY_Q4_K_S
# (every matrix Q4_K, no mixed "M" recipe), MOSTLY_BF16.
FILE_TYPE = {"F32": 0, "F16": 1, "Q8_0": 7, "Q4_K": 14, "BF16": 32}
# Auto progress bar from this many weights on (a tiny test model never shows one).
PROGRESS_MIN_WEIGHTS = 50_000_000


def ggml_type_name(qtype: str) -> str:
    """"q8_0" / "Q8_0" -> "Q8_0"; anything else is a ConfigError listing the choices."""
    key = str(qtype).lower()
    if key not in QTYPES:
        raise ConfigError(f"unknown qtype {qtype!r}; choose one of {list(QTYPES)}")
    return QTYPES[key]


def tensor_type(name: str, shape: tuple[int, ...], qtype: str,
                fallback: str | None = None) -> str:
    """The GGML type tensor ``name`` (NumPy ``shape``) is written with.

    - 1-D tensors (norm weights, ``ssm_a``, ``ssm_dt.bias``) and conv kernels (``ssm_conv1d``,
      the DFlash 2 base kernels ``blk.N.{attn,ffn}_conv_base`` [2, K, H]): F32 always (ggml's
      elementwise kernels want F32 multipliers; lucebox and llama.cpp do the same).
    - Matrices: ``qtype``. Q8_0 needs rows (the last NumPy axis, the ggml ne0) that are a
      multiple of 32, Q4_K of 256. Otherwise ``fallback`` is used with a warning, or, without a
      fallback, the conversion fails (as lucebox's converters do).
    """
    typ = ggml_type_name(qtype)
    if len(shape) < 2 or "conv1d" in name or name.endswith("_conv_base"):
        return "F32"
    block = BLOCK_SIZE.get(typ)
    if block is None or shape[-1] % block == 0:
        return typ
    if fallback is None:
        raise FormatError(
            f"tensor {name!r} {list(shape)}: rows of {shape[-1]} weights are not a multiple of "
            f"the {typ} block ({block}); pick another qtype or pass fallback='q8_0' / 'bf16' "
            f"(CLI --fallback) to store such tensors in that type instead")
    fb = tensor_type(name, shape, fallback, None)
    warnings.warn(f"tensor {name!r} {list(shape)}: rows of {shape[-1]} do not fit {typ} blocks of "
                  f"{block}; stored as {fb}", stacklevel=2)
    return fb


class _Lazy(Mapping):
    """name -> array, loaded when write_gguf asks for it (one progress tick per tensor)."""

    def __init__(self, loaders: dict[str, Callable[[], np.ndarray]], bar):
        self._loaders, self._bar = loaders, bar

    def __getitem__(self, name: str) -> np.ndarray:
        x = self._loaders[name]()
        if self._bar is not None:
            self._bar.update(1)
        return x

    def __iter__(self) -> Iterator[str]:
        return iter(self._loaders)

    def __len__(self) -> int:
        return len(self._loaders)


def progress_bar(total: int, n_weights: int, desc: str, progress: bool | None):
    """A tqdm bar over ``total`` tensors, or None. ``progress=None``: only for large models."""
    enabled = progress if progress is not None else n_weights >= PROGRESS_MIN_WEIGHTS
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # the bar is optional
        return None
    return tqdm(total=total, desc=desc, unit="tensor")


def write_converted(out_path, arch: str, loaders: dict[str, Callable[[], np.ndarray]],
                    types: dict[str, str], metadata: dict, n_weights: int,
                    progress: bool | None, replace: Replace = replace_any) -> Path:
    """write_gguf with lazily loaded tensors and an optional progress bar; ``replace``: which
    existing file at ``out_path`` may be replaced (:mod:`dflash_ref.io.writing`)."""
    bar = progress_bar(len(loaders), n_weights, f"convert -> {Path(out_path).name}", progress)
    try:
        return write_gguf(out_path, arch, _Lazy(loaders, bar), types, metadata, replace=replace)
    finally:
        if bar is not None:
            bar.close()


def transformer_keys(arch: str, cfg, file_type: int) -> dict[str, Any]:
    """The llama.cpp block keys every converted transformer carries (arch-prefixed).

    ``cfg`` is a TargetConfig or DrafterConfig; key/value lengths are written explicitly because
    n_head * head_dim != n_embd in general.
    """
    a = arch + "."
    return {
        "general.file_type": file_type,
        a + "embedding_length": cfg.hidden_size,
        a + "block_count": cfg.num_hidden_layers,
        a + "feed_forward_length": cfg.intermediate_size,
        a + "attention.head_count": cfg.num_attention_heads,
        a + "attention.head_count_kv": cfg.num_key_value_heads,
        a + "attention.key_length": cfg.head_dim,
        a + "attention.value_length": cfg.head_dim,
        a + "attention.layer_norm_rms_epsilon": cfg.rms_norm_eps,
    }


def float_from_f32(v: float) -> float:
    """A FLOAT32 metadata value as the shortest decimal that rounds to it (1e-06, not
    9.99999997e-07), i.e. the value the writer was most likely given."""
    return float(str(np.float32(v)))




def meta(g: GGUFFile, key: str, kind: str, default: Any = ..., where: str = "") -> Any:
    """Metadata value ``key`` (arch prefix applied) checked to be ``kind``.

    kind: "int" (non-negative), "float" (finite), "bool", "str", "ints" (list of ints),
    "bools". Missing without a default, or of another type, is a FormatError naming the key.
    """
    value = g.get(key, ...)
    full = g.arch_key(key)
    if value is ...:
        if default is not ...:
            return default
        g.require(key)  # raises with the list of the arch's keys
    ok = {
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
        "float": lambda v: (isinstance(v, (int, float)) and not isinstance(v, bool)
                            and np.isfinite(v)),
        "bool": lambda v: isinstance(v, bool),
        "str": lambda v: isinstance(v, str),
        "ints": lambda v: (isinstance(v, list) and len(v) > 0
                           and all(isinstance(x, int) and not isinstance(x, bool) for x in v)),
        "bools": lambda v: isinstance(v, list) and all(isinstance(x, bool) for x in v),
    }[kind]
    if not ok(value):
        raise FormatError(f"{g.path.name}{where}: metadata {full!r} must be {kind}, got "
                          f"{value!r} (stored as {g.value_type(key)})")
    return float_from_f32(value) if kind == "float" else value




def describe_metadata_value(v: Any, limit: int = 12) -> str:
    """A metadata value for printing, long lists abbreviated."""
    if isinstance(v, list) and len(v) > limit:
        return json.dumps(v[:limit])[:-1] + f", ... ({len(v)} items)]"
    return json.dumps(v) if isinstance(v, (list, str)) else str(v)
