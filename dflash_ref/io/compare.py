"""Per-tensor numerical comparison of two weight sets (checkpoint directories or GGUF files).

The question it answers: "is this GGUF a faithful conversion of that checkpoint?" (seed 001
asked it about a Q6_K drafter: F32 norms exact, Q6_K weights 1.78 % mean / 2.155 % max relative
RMS error, no outlier). For every tensor name present on both sides:

    rel_rms = ||b - a||_2 / ||a||_2        (a is the reference, usually the HF checkpoint)
    max_abs = max |b - a|

Names are matched after mapping every GGUF side's names to HF names (:mod:`dflash_ref.io.names`;
``name_map="auto"`` picks the naming from the GGUF's architecture: a drafter's ``dflash`` /
``*-dflash-draft`` naming, or a ``qwen3`` / ``qwen35`` / ``gemma3`` target's llama.cpp names,
whose values are mapped back to HF's too: norm offset, ``ssm_a``, conv shape, value-head order).
A tensor is an **outlier** when rel_rms exceeds the budget of the lossier storage type of the pair
(:data:`REL_RMS_BUDGET`).
Tensors on one side only and shape mismatches are rows of their own, never silently skipped; a
shape that matches only after a transpose says so (the GGUF axis-order pitfall).

One weight set is checked on its own by :func:`check_finite_weights`: no NaN or inf
(``from_pretrained(..., check_finite=True)``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dflash_ref.errors import FormatError
from dflash_ref.io.convert_target import (
    FAMILY_OF_ARCH,
    from_gguf_value,
    hf_names_of_gguf_target,
    target_config_of_gguf,
)
from dflash_ref.io.draft_vocab import D2T, HEAD, offsets
from dflash_ref.io.gguf_io import GGUF_MAGIC, open_gguf
from dflash_ref.io.names import FLAVOURS, canonical_hf_name, flavour_of_arch, gguf_to_hf
from dflash_ref.io.safetensors_io import open_checkpoint

# Expected relative RMS error of storing Gaussian-like weights in each type, with headroom
# (measured typical values in brackets; tests/io/test_compare.py re-measures the first five).
REL_RMS_BUDGET: dict[str, float] = {
    "F64": 1e-9,  # [0] exact or float32 rounding of the comparison itself
    "F32": 1e-6,  # [0] float32 copies are exact; 1e-6 leaves room for F64 sources
    "F16": 1e-3,  # [2.1e-4] 11 significant bits: relative rounding error <= 2^-11
    "BF16": 8e-3,  # [1.6e-3] 8 significant bits: relative rounding error <= 2^-8
    "Q8_0": 1.5e-2,  # [5.4e-3] step max|x|/127 per 32 weights
    "Q6_K": 4e-2,  # [~2e-2] seed 001: 1.78 % mean, 2.155 % max on a real drafter
    "Q5_K": 1e-1,  # [~4e-2] one bit more than Q4_K
    "Q4_K": 2e-1,  # [8.0e-2 ours, ~7.2e-2 ggml's search; 9.4e-2 Laplace] 16 levels per 32
}

INTEGER_TYPES = frozenset({"I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64", "BOOL"})


@dataclass(frozen=True)
class CompareRow:
    """One tensor of the comparison. ``name`` is the HF name both sides were matched on."""

    name: str
    status: str  # "ok" | "outlier" | "only in a" | "only in b" | "shape mismatch" | "no budget"
    name_a: str | None = None
    name_b: str | None = None
    type_a: str | None = None
    type_b: str | None = None
    shape: tuple[int, ...] | None = None  # NumPy order; a's shape on a mismatch
    shape_b: tuple[int, ...] | None = None
    rel_rms: float | None = None
    max_abs: float | None = None
    budget: float | None = None
    note: str = ""

    @property
    def flagged(self) -> bool:
        return self.status not in ("ok", "no budget")


class _Weights:
    """One side: HF-space name -> (stored name, storage type, NumPy shape, float32 loader)."""

    def __init__(self, path: str | Path, name_map):
        path = Path(path)
        self.label = str(path)
        self.entries: dict[str, tuple[str, str, tuple[int, ...], Callable[[], np.ndarray]]] = {}
        self.target_cfg = None  # a target GGUF's config: its HF prefix is matched to the other side
        if _is_gguf(path):
            g = open_gguf(path)
            if name_map == "auto" and g.arch in FAMILY_OF_ARCH:
                self._add_target_gguf(g)
                return
            to_hf = _resolve_map(name_map, g.arch)
            reduced = {v: k for k, v in HEAD.items()} if D2T in g else {}  # its own head
            for stored in g.tensor_names:
                info = g.tensor_info(stored)
                load = (lambda s=stored: g.load_native(s).astype(np.float32)) if stored != D2T \
                    else (lambda: offsets(g.load_native(D2T)))  # the directory's form
                self._add(reduced.get(stored) or to_hf(stored), stored, info.ggml_type,
                          info.numpy_shape, load)
        else:
            ckpt = open_checkpoint(path)
            for stored in ckpt:
                info = ckpt.info(stored)
                self._add(canonical_hf_name(stored), stored, info.dtype, info.shape,
                          lambda s=stored: ckpt.load_native(s).astype(np.float32))

    def _add_target_gguf(self, g) -> None:
        """A Qwen3 / Qwen3.5 / Gemma 3 GGUF: llama.cpp names and values mapped back to HF's
        (:func:`~dflash_ref.io.convert_target.from_gguf_value`: norm offset, ``ssm_a``, conv
        shape, value-head order), so that a target compares with its own checkpoint."""
        _, cfg = target_config_of_gguf(g)
        self.target_cfg = cfg
        for stored, (hf, suffix) in hf_names_of_gguf_target(g, cfg).items():
            info = g.tensor_info(stored)
            shape = tuple(info.numpy_shape)
            if suffix == "linear_attn.conv1d.weight":
                shape = (shape[0], 1, shape[-1])  # [conv_dim, K] -> HF's [conv_dim, 1, K]
            self._add(hf, stored, info.ggml_type, shape,
                      lambda s=stored, x=suffix: from_gguf_value(cfg, x, g.load(s),
                                                                 f"{g.path.name}: {s}"))

    def align_prefix(self, other: _Weights) -> None:
        """Re-key a target GGUF's HF names under the prefix the other side uses
        (``model.``, ``model.language_model.``, ...), when it uses one of the candidates."""
        cfg = self.target_cfg
        if cfg is None:
            return
        for p in cfg.weight_prefix_candidates:
            if p != cfg.weight_prefix and f"{p}embed_tokens.weight" in other.entries:
                old = cfg.weight_prefix
                self.entries = {(p + k[len(old):] if k.startswith(old) else k): v
                                for k, v in self.entries.items()}
                return

    def _add(self, key, stored, typ, shape, loader) -> None:
        if key in self.entries:
            raise FormatError(
                f"{self.label}: tensors {self.entries[key][0]!r} and {stored!r} both map to "
                f"{key!r}; the name map is not one-to-one"
            )
        self.entries[key] = (stored, typ, tuple(shape), loader)


def _is_gguf(path: Path) -> bool:
    if path.suffix == ".gguf":
        return True
    if path.is_file() and not path.name.endswith((".safetensors", ".json")):
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    return False


def _resolve_map(name_map, arch: str | None) -> Callable[[str], str]:
    """name_map ("auto" | None | flavour | dict | callable) -> a function GGUF name -> HF name."""
    if name_map is None:
        return lambda n: n
    if name_map == "auto":
        flavour = flavour_of_arch(arch)
        return (lambda n: gguf_to_hf(n, flavour)) if flavour else (lambda n: n)
    if isinstance(name_map, str):
        if name_map not in FLAVOURS:
            raise ValueError(f"name_map {name_map!r}: expected 'auto', None, {FLAVOURS}, a dict "
                             f"or a function")
        return lambda n: gguf_to_hf(n, name_map)
    if isinstance(name_map, Mapping):
        return lambda n: name_map.get(n, n)
    return lambda n: name_map(n) or n


def _budget(type_a: str, type_b: str) -> float | None:
    budgets = [REL_RMS_BUDGET.get(t) for t in (type_a, type_b)]
    return None if any(b is None for b in budgets) else max(budgets)


def compare_weights(a: str | Path, b: str | Path, name_map="auto", threshold_factor: float = 1.0,
                    show: bool = True, file=None) -> list[CompareRow]:
    """Compare every tensor of ``a`` (reference) and ``b``; print a table; return the rows.

    Args:
        a, b: a checkpoint directory (or .safetensors file / index) or a GGUF file each.
        name_map: how GGUF names become HF names, applied to each GGUF side: "auto" (from the
            arch: "dflash" -> llama.cpp naming, "*-dflash-draft" -> lucebox), a flavour name,
            a dict {gguf name: hf name}, a function, or None (names as stored).
        threshold_factor: a row is an outlier when rel_rms > factor * budget.
        show: print :func:`format_table` of the rows to ``file`` (stdout by default).
    """
    wa, wb = _Weights(a, name_map), _Weights(b, name_map)
    wa.align_prefix(wb)
    wb.align_prefix(wa)
    rows = []
    for key in sorted(set(wa.entries) | set(wb.entries)):
        if key not in wb.entries:
            stored, typ, shape, _ = wa.entries[key]
            rows.append(CompareRow(key, "only in a", name_a=stored, type_a=typ, shape=shape))
            continue
        if key not in wa.entries:
            stored, typ, shape, _ = wb.entries[key]
            rows.append(CompareRow(key, "only in b", name_b=stored, type_b=typ, shape=shape))
            continue
        rows.append(_compare_one(key, wa.entries[key], wb.entries[key], threshold_factor))
    if show:
        print(format_table(rows, wa.label, wb.label), file=file or sys.stdout)
    return rows


def _compare_one(key, entry_a, entry_b, factor: float) -> CompareRow:
    (name_a, type_a, shape_a, load_a), (name_b, type_b, shape_b, load_b) = entry_a, entry_b
    common = dict(name_a=name_a, name_b=name_b, type_a=type_a, type_b=type_b, shape=shape_a)
    if shape_a != shape_b:
        note = "transposed? (GGUF axis order)" if shape_a[::-1] == shape_b else ""
        return CompareRow(key, "shape mismatch", shape_b=shape_b, note=note, **common)
    integer = type_a in INTEGER_TYPES or type_b in INTEGER_TYPES
    note = "integer tensor: must match exactly" if integer else ""
    xa, xb = load_a().astype(np.float64), load_b().astype(np.float64)
    diff = xb - xa
    ref = float(np.sqrt(np.sum(xa * xa)))
    err = float(np.sqrt(np.sum(diff * diff)))
    rel = err / ref if ref > 0 else (0.0 if err == 0 else float("inf"))
    max_abs = float(np.max(np.abs(diff))) if diff.size else 0.0
    budget = 0.0 if integer else _budget(type_a, type_b)
    if budget is None:
        status = "no budget"
    else:
        status = "outlier" if rel > factor * budget else "ok"
    return CompareRow(key, status, rel_rms=rel, max_abs=max_abs, budget=budget, note=note,
                      **common)


def _num(v: float | None, spec: str) -> str:
    return format(v, spec) if v is not None else ""


def format_table(rows: list[CompareRow], label_a: str = "a", label_b: str = "b") -> str:
    """A fixed-width table of the rows, outliers marked ``<<``, then a one-line summary."""
    header = (f"{'tensor (HF name)':44} {'type a':>6} {'type b':>6} {'shape':>16} "
              f"{'rel RMS':>10} {'max abs':>10} {'budget':>8}  status")
    lines = [f"a = {label_a}", f"b = {label_b}", header, "-" * len(header)]
    for r in rows:
        shape = "x".join(map(str, r.shape)) if r.shape is not None else ""
        if r.shape_b is not None:
            shape += " vs " + "x".join(map(str, r.shape_b))
        mark = "  <<" if r.flagged else ""
        lines.append(
            f"{r.name:44} {r.type_a or '':>6} {r.type_b or '':>6} {shape:>16} "
            f"{_num(r.rel_rms, '.3e'):>10} {_num(r.max_abs, '.3e'):>10} {_num(r.budget, '.1e'):>8}"
            f"  {r.status}{' ' + r.note if r.note else ''}{mark}"
        )
    counts = {s: sum(r.status == s for r in rows) for s in
              ("ok", "outlier", "shape mismatch", "only in a", "only in b", "no budget")}
    compared = [r.rel_rms for r in rows if r.rel_rms is not None]
    summary = f"{len(compared)} compared" + "".join(
        f", {n} {s}" for s, n in counts.items() if n and s != "ok")
    if compared:
        summary += f"; rel RMS mean {np.mean(compared):.3e}, max {np.max(compared):.3e}"
    lines.append(summary)
    return "\n".join(lines)


def check_finite_weights(weights: dict[str, np.ndarray], source) -> None:
    """Raise :class:`~dflash_ref.errors.FormatError` naming every tensor of ``weights`` that
    holds NaN or +-inf (``from_pretrained(..., check_finite=True)``; one pass over the weights).

    A single NaN weight makes every logit after it NaN; this names the tensor instead."""
    bad = {name: int((~np.isfinite(w)).sum()) for name, w in weights.items()
           if w.dtype.kind == "f" and not np.isfinite(w).all()}
    if bad:
        shown = ", ".join(f"{n} ({k} values)" for n, k in list(bad.items())[:8])
        raise FormatError(f"{source}: {len(bad)} weight tensors hold NaN or inf: {shown}"
                          f"{' ...' if len(bad) > 8 else ''}; the checkpoint is corrupt or was "
                          f"saved after a diverged step: download or convert it again")
