"""Compare another stack's dump against a reference case: the first diverging tensor, in order.

:func:`compare_cases` walks the reference manifest's tensor list (execution order) and checks each
key the other dump holds against the tolerance of its kind (docs/golden_vectors.md, "Tolerance
semantics"). Keys the other dump lacks are listed as missing, never failed; keys it has that the
reference does not are listed as extra. The first failing key is the diagnosis: everything
computed after it depends on it, so later differences are consequences.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dflash_ref.errors import FormatError
from dflash_ref.oracle.layout import TOLERANCES, Tolerance, kind_of, parse_key, read_case


@dataclass
class Divergence:
    """One tensor outside its tolerance (or of another shape / dtype class)."""

    key: str
    step: int | None
    layer: int | None
    name: str
    kind: str
    max_abs: float
    max_rel: float
    worst_index: tuple[int, ...] | None
    ref_value: float | None
    other_value: float | None
    n_bad: int
    n_total: int
    tolerance: Tolerance
    problem: str = ""  # non-numeric reasons: "shape [3, 4] != [3, 5]"

    def describe(self) -> str:
        where = (f"step {self.step}" if self.step is not None else "inputs") + (
            f", layer {self.layer}" if self.layer is not None else "")
        if self.problem:
            return f"{self.key} ({where}, {self.name}): {self.problem}"
        t = self.tolerance
        return (f"{self.key} ({where}, {self.name}, kind {self.kind}): max abs err "
                f"{self.max_abs:.3g}, max rel err {self.max_rel:.3g}; worst at index "
                f"{list(self.worst_index)}: ref {self.ref_value:.6g}, other "
                f"{self.other_value:.6g}; {self.n_bad}/{self.n_total} elements outside "
                f"atol {t.atol:g} + rtol {t.rtol:g} * |ref|")


@dataclass
class Report:
    compared: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    divergences: list[Divergence] = field(default_factory=list)

    @property
    def first(self) -> Divergence | None:
        return self.divergences[0] if self.divergences else None

    @property
    def equal(self) -> bool:
        return not self.divergences and bool(self.compared)

    def verdict(self) -> str:
        n, m = len(self.compared), len(self.missing)
        if self.first is not None:
            d = self.first
            return (f"DIVERGED at {d.key} (first of {len(self.divergences)} diverging tensors; "
                    f"{n} compared, {m} missing)")
        if not self.compared:
            return f"NOTHING COMPARED: the dump holds none of the reference's {m} tensors"
        return f"EQUAL: {n} tensors within tolerance ({m} missing from the dump, not checked)"


def _tolerances(manifest: dict | None, scale: float) -> dict[str, Tolerance]:
    table = dict(TOLERANCES)
    for kind, t in ((manifest or {}).get("tolerances") or {}).items():
        table[kind] = Tolerance(atol=float(t["atol"]), rtol=float(t["rtol"]),
                                reason=t.get("why", ""))
    return {k: Tolerance(atol=t.atol * scale, rtol=t.rtol * scale, reason=t.reason)
            if k != "exact" else t
            for k, t in table.items()}


def check_tensor(key: str, ref: np.ndarray, other: np.ndarray, kind: str,
                 tol: Tolerance) -> Divergence | None:
    """None when ``other`` matches ``ref`` under ``tol`` (elementwise, see the module docstring)."""
    p = parse_key(key)

    def fail(problem, **kw):
        base = dict(key=key, step=p.step, layer=p.layer, name=p.name, kind=kind, max_abs=np.inf,
                    max_rel=np.inf, worst_index=None, ref_value=None, other_value=None,
                    n_bad=int(ref.size), n_total=int(ref.size), tolerance=tol, problem=problem)
        base.update(kw)
        return Divergence(**base)

    if tuple(ref.shape) != tuple(other.shape):
        return fail(f"shape {list(other.shape)} != reference {list(ref.shape)}")
    if ref.size == 0:
        return None
    r = ref.astype(np.float64)
    o = other.astype(np.float64)
    both_nan = np.isnan(r) & np.isnan(o)
    err = np.where(both_nan, 0.0, np.abs(o - r))
    err = np.where(np.isnan(err), np.inf, err)  # NaN on one side only
    bad = err > tol.atol + tol.rtol * np.abs(np.nan_to_num(r))
    if not bad.any():
        return None
    rel = err / np.maximum(np.abs(r), np.finfo(np.float64).tiny)
    worst = np.unravel_index(int(np.argmax(np.where(bad, err, -1.0))), ref.shape)
    return Divergence(key=key, step=p.step, layer=p.layer, name=p.name, kind=kind,
                      max_abs=float(err.max()), max_rel=float(np.where(bad, rel, 0.0).max()),
                      worst_index=tuple(int(i) for i in worst), ref_value=float(r[worst]),
                      other_value=float(o[worst]), n_bad=int(bad.sum()),
                      n_total=int(ref.size), tolerance=tol)


def compare_cases(ref_dir, other_dir, tolerance_scale: float = 1.0,
                  stop_at_first: bool = False) -> Report:
    """Compare the dump in ``other_dir`` with the reference case ``ref_dir`` (module docstring).

    Order: the reference manifest's ``tensors`` list (execution order). ``tolerance_scale``
    multiplies every float tolerance (e.g. 30 for a bf16 stack); integers stay exact.
    """
    manifest, ref = read_case(ref_dir)
    if manifest is None:
        raise FormatError(f"{ref_dir} has no manifest.json; the reference must be a case written "
                          f"by 'dflash-ref oracle export'")
    _, other = read_case(other_dir)
    table = _tolerances(manifest, tolerance_scale)
    order = [t["key"] for t in manifest["tensors"]]
    lost = [t for t in manifest["tensors"] if t["key"] not in ref]
    if lost:
        files = sorted({t.get("file", "?") for t in lost})
        raise FormatError(f"reference {ref_dir}: {len(lost)} tensors its manifest.json lists are "
                          f"in no file, e.g. {lost[0]['key']!r} (expected in {files[:3]}); "
                          f"restore the missing files or export the case again")
    kinds = {t["key"]: t["kind"] for t in manifest["tensors"]}
    report = Report(extra=sorted(set(other) - set(order)))
    for key in order:
        if key not in other:
            report.missing.append(key)
            continue
        report.compared.append(key)
        kind = kinds.get(key) or kind_of(key)
        d = check_tensor(key, ref[key], other[key], kind, table[kind])
        if d is not None:
            report.divergences.append(d)
            if stop_at_first:
                break
    return report


def print_report(report: Report, out, max_missing: int = 12) -> None:
    """The human report: first divergence (with the next few), missing, extra, verdict."""
    if report.first is not None:
        print("first divergence (execution order):", file=out)
        print(f"  {report.first.describe()}", file=out)
        later = report.divergences[1:4]
        if later:
            print("then (probably consequences):", file=out)
            for d in later:
                print(f"  {d.describe()}", file=out)
    if report.missing:
        shown = ", ".join(report.missing[:max_missing])
        more = len(report.missing) - max_missing
        print(f"missing from the dump ({len(report.missing)}, not checked): {shown}"
              + (f", ... {more} more" if more > 0 else ""), file=out)
    if report.extra:
        print(f"in the dump but not in the reference ({len(report.extra)}): "
              f"{', '.join(report.extra[:max_missing])}", file=out)
    print(report.verdict(), file=out)


def compare_main(ref_dir, other_dir, tolerance_scale: float = 1.0, out=None) -> int:
    """CLI body: print the report; 0 equal, 1 diverged, 2 nothing compared."""
    import math
    import sys

    if not (isinstance(tolerance_scale, (int, float)) and math.isfinite(tolerance_scale)
            and tolerance_scale > 0):
        raise ValueError(f"tolerance_scale {tolerance_scale!r}: expected a finite number > 0 "
                         f"(1: the tolerances as stated; e.g. 30 for a bf16 stack)")

    out = out or sys.stdout
    report = compare_cases(Path(ref_dir), Path(other_dir), tolerance_scale)
    print_report(report, out)
    if report.first is not None:
        return 1
    return 0 if report.compared else 2
