"""The vocabulary every config module shares, and the typed reader of one config dict.

- Layer-type names ``FULL`` / ``SLIDING`` / ``LINEAR`` and the other closed value sets
  (families, activations, RoPE types, embedding dtypes, drafter layouts, SWA conventions).
- :class:`_Fields`: typed reads (``int``, ``float``, ``bool``, ``str``) that name the key and the
  dict a bad value came from, and record every default taken.
- Small validators: integer lists, ``layer_types`` lists, HF's interval rule for layer types.
- :func:`round_to_dtype` and :func:`embedding_scale_for` (Gemma's bf16-rounded sqrt(H)).
- ``_read_json``: a config.json file (or the one inside a checkpoint directory) as a dict.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dflash_ref.errors import ConfigError

FULL = "full_attention"
SLIDING = "sliding_attention"
LINEAR = "linear_attention"
LAYER_TYPES = (FULL, SLIDING, LINEAR)

FAMILIES = ("qwen3", "qwen3_next", "qwen3_5", "gemma3", "gemma4")
SUPPORTED_ACTIVATIONS = ("silu", "gelu_pytorch_tanh", "gelu")
ROPE_TYPES = ("default", "linear", "proportional")
EMBEDDING_DTYPES = ("bfloat16", "float16", "float32")
DRAFTER_LAYOUTS = ("zlab", "hf_assistant")
SWA_CONVENTIONS = ("causal_block", "noncausal_window", "bidirectional", "ignore")


_MISSING = object()


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_number(v: Any) -> bool:
    return (isinstance(v, (int, float, np.integer, np.floating))
            and not isinstance(v, (bool, np.bool_)))


class _Fields:
    """Typed reads from one config dict that say where a bad value came from.

    ``null`` counts as missing. A missing key takes, in order: the family's transformers default
    from ``hf_table`` if ``use_hf_table`` (recorded), the ``default`` argument (recorded), or raises
    a ConfigError naming the key, where it was looked for, and the fix.
    """

    def __init__(self, d: Mapping, where: str, hf_table: Mapping | None = None,
                 use_hf_table: bool = False, hf_class: str = "") -> None:
        self.d = d
        self.where = where
        self.hf_table = hf_table or {}
        self.use_hf_table = use_hf_table
        self.hf_class = hf_class
        self.defaults_used: list[str] = []

    def has(self, key: str) -> bool:
        return self.d.get(key) is not None

    def missing_hint(self, key: str) -> str:
        if key in self.hf_table:
            return (f" transformers fills {key}={self.hf_table[key]!r} from {self.hf_class}; add "
                    f"it to the config, or pass hf_defaults=True to accept transformers' class "
                    f"defaults (each one is then listed in defaults_used).")
        return ""

    def raw(self, key: str, default: Any = _MISSING, hint: str = "") -> Any:
        v = self.d.get(key)
        if v is not None:
            return v
        if self.use_hf_table and key in self.hf_table:
            v = self.hf_table[key]
            self.defaults_used.append(f"{key}={v!r} ({self.hf_class} default)")
            return v
        if default is not _MISSING:
            if default is not None:
                self.defaults_used.append(f"{key}={default!r} (default)")
            return default
        raise ConfigError(f"{self.where}: required key {key!r} is missing or null.{hint}"
                          f"{self.missing_hint(key)}")

    def int(self, key: str, default: Any = _MISSING, *, minimum: int = 1, hint: str = "") -> Any:
        v = self.raw(key, default, hint)
        if v is None:
            return None
        if not _is_int(v):
            raise ConfigError(f"{self.where}: {key} must be an integer, got {v!r} "
                              f"({type(v).__name__}).")
        if v < minimum:
            raise ConfigError(f"{self.where}: {key} must be >= {minimum}, got {v}.")
        return int(v)

    def float(self, key: str, default: Any = _MISSING, *, positive: bool = True,
              hint: str = "") -> Any:
        v = self.raw(key, default, hint)
        if v is None:
            return None
        if not _is_number(v) or not math.isfinite(float(v)):
            raise ConfigError(f"{self.where}: {key} must be a finite number, got {v!r}.")
        if positive and not float(v) > 0:
            raise ConfigError(f"{self.where}: {key} must be > 0, got {v}.")
        return float(v)

    def bool(self, key: str, default: Any = _MISSING) -> Any:
        v = self.raw(key, default)
        if v is None:
            return None
        if not isinstance(v, (bool, np.bool_)):
            raise ConfigError(f"{self.where}: {key} must be true or false, got {v!r}.")
        return bool(v)

    def str(self, key: str, default: Any = _MISSING, choices: Sequence[str] | None = None) -> Any:
        v = self.raw(key, default)
        if v is None:
            return None
        if not isinstance(v, str):
            raise ConfigError(f"{self.where}: {key} must be a string, got {v!r}.")
        if choices is not None and v not in choices:
            raise ConfigError(f"{self.where}: {key}={v!r} is not supported; supported: "
                              f"{', '.join(choices)}.")
        return v

    def head_counts(self) -> tuple[int, int]:
        """(num_attention_heads, num_key_value_heads), the first a multiple of the second."""
        n_heads, n_kv = self.int("num_attention_heads"), self.int("num_key_value_heads")
        if n_heads % n_kv:
            raise ConfigError(f"{self.where}: num_attention_heads {n_heads} is not a multiple "
                              f"of num_key_value_heads {n_kv} (grouped-query attention needs "
                              f"that).")
        return n_heads, n_kv


def _int_list(v: Any, what: str, where: str) -> tuple[int, ...]:
    if not isinstance(v, (list, tuple)) or not all(_is_int(x) for x in v):
        raise ConfigError(f"{where}: {what} must be a list of integers, got {v!r}.")
    return tuple(int(x) for x in v)


def _layer_type_list(v: Any, n_layers: int, allowed: Sequence[str], where: str,
                     key: str = "layer_types") -> tuple[str, ...]:
    if not isinstance(v, (list, tuple)) or not all(isinstance(t, str) for t in v):
        raise ConfigError(f"{where}: {key} must be a list of strings, got {v!r}.")
    if len(v) != n_layers:
        raise ConfigError(f"{where}: {key} has {len(v)} entries but num_hidden_layers is "
                          f"{n_layers}; they must match one entry per layer.")
    bad = sorted({t for t in v if t not in allowed})
    if bad:
        raise ConfigError(f"{where}: {key} contains {bad}; this layout allows only "
                          f"{list(allowed)}.")
    return tuple(v)


def _interval_layer_types(n_layers: int, interval: int, periodic: str, every: str) -> tuple:
    """HF's rule: layer i is ``every`` iff (i + 1) % interval == 0, else ``periodic``."""
    return tuple(every if (i + 1) % interval == 0 else periodic for i in range(n_layers))


def round_to_dtype(x: float, dtype: str) -> float:
    """Round ``x`` as torch does for ``torch.tensor(x).to(dtype)``: float64 -> float32 -> dtype.

    Both narrowing steps round to nearest, ties to even. bfloat16 keeps the top 16 bits of the
    float32 pattern (8 exponent bits, 7 stored mantissa bits), so between 64 and 128 its spacing is
    0.5: sqrt(5376) = 73.32 -> 73.5.
    """
    if dtype not in EMBEDDING_DTYPES:
        raise ConfigError(f"cannot round to dtype {dtype!r}; supported: {EMBEDDING_DTYPES}")
    f32 = np.float32(x)
    if dtype == "float32":
        return float(f32)
    if dtype == "float16":
        return float(np.float16(f32))
    bits = int(np.array(f32, dtype=np.float32).view(np.uint32))
    if (bits & 0x7F800000) == 0x7F800000:  # inf / nan: truncate, keep the class
        return float(np.array(bits & 0xFFFF0000, dtype=np.uint32).view(np.float32))
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # round half to even
    return float(np.array(rounded, dtype=np.uint32).view(np.float32))


def embedding_scale_for(hidden_size: int, dtype: str = "bfloat16") -> float:
    """Gemma's embedding normaliser: sqrt(hidden_size) rounded to the embedding dtype.

    HF multiplies the looked-up rows by ``embed_scale.to(weight.dtype)``, so a bf16 checkpoint is
    scaled by the bf16-rounded value (docs/drafter.md; docs/config.md, "Embedding scale and
    RoPE"): bf16 sqrt(5376) = 73.32 -> 73.5,
    sqrt(3840) = 61.97 -> 62.0, sqrt(2816) = 53.07 -> 53.0.
    """
    return round_to_dtype(math.sqrt(hidden_size), dtype)


def _read_json(path: str | os.PathLike, what: str) -> dict:
    p = os.fspath(path)
    if os.path.isdir(p):
        p = os.path.join(p, "config.json")
    try:
        with open(p, encoding="utf-8") as fh:
            d = json.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{what} config: {p} does not exist; pass the path of config.json "
                          f"or of the checkpoint directory that holds it.") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{what} config: {p} is not valid JSON ({exc}).") from None
    except UnicodeDecodeError:
        with open(p, "rb") as fh:
            kind = "a GGUF file" if fh.read(4) == b"GGUF" else "a binary file"
        raise ConfigError(f"{what} config: {p} is {kind}, not a config.json; pass the checkpoint "
                          f"directory (config.json + safetensors) or its config.json.") from None
    if not isinstance(d, dict):
        raise ConfigError(f"{what} config: {p} holds a {type(d).__name__}, not a JSON object.")
    return d
