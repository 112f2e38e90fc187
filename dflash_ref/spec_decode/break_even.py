"""When speculation pays on a machine: a step's cost from measured row costs, and the tau from
which a verify form is as fast as plain decoding (or a given factor faster).

A step whose verify accepts a drafts (0 <= a <= B-1; it emits a + 1 tokens) costs, with L(r)
and H(r) the target's layers and head over r new rows, D the draft and R the rest of the step
(the verify decision, the commit, the rollback):

    eager       D + R + L(B) + H(B)                       every row, one forward
    lazy g      D + R + sum of L(hi - lo) + H(hi - lo)    over the spans (lo, hi) of
                                                          ``row_spans(B, g)`` with a >= lo
                                                          (``layers_later``: a forward per span)
                D + R + L(B) + sum of H(hi - lo)          (the layers at once)
    oracle      D + R + L(a + 1) + H(a + 1)               a verify that knew a in advance

Plain decoding costs P a token. Over a law of a, the speedup is ``E[a + 1] P / E[cost(a)]``
(tokens per step over the time of a step, against plain's). The oracle verifies exactly the
rows the step needs: where a row costs less than the token it brings, no rule that cuts the
block before the verify (``ConfidentChainVerifier``) does better at the same drafts, so its
speedup bounds every cut's.

The law of a: the accept counts of a run, or geometric with a per-draft acceptance alpha,
``P(a >= j) = alpha^j`` for j <= B-1, whose tau is ``sum_{j<B} alpha^j`` (1 at alpha 0, B at
alpha 1). :func:`break_even_tau` is the smallest tau of that family at which a form reaches a
speedup.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dflash_ref.spec_decode.lazy_verify import row_spans


@dataclass(frozen=True)
class RowCosts:
    """Measured milliseconds on one machine: ``layers[r-1]`` = L(r) and ``head[r-1]`` = H(r)
    for r = 1..B new rows, ``draft`` D and ``rest`` R per step, ``plain`` P per plain token."""

    layers: tuple[float, ...]
    head: tuple[float, ...]
    draft: float
    rest: float
    plain: float

    def __post_init__(self):
        if len(self.layers) != len(self.head) or not self.layers:
            raise ValueError(f"layers and head need one cost per row count 1..B, got "
                             f"{len(self.layers)} and {len(self.head)}")

    @property
    def block(self) -> int:
        return len(self.layers)

    def rows(self, r: int) -> float:
        """L(r) + H(r): r rows through the layers and the head, one forward."""
        return self.layers[r - 1] + self.head[r - 1]


@dataclass(frozen=True)
class Form:
    """A verify form: ``"eager"``, ``"oracle"``, or ``"lazy"`` with its ``groups`` and
    ``layers_later`` (module docstring)."""

    kind: str
    groups: tuple[int, ...] = ()
    layers_later: bool = True


EAGER = Form("eager")
ORACLE = Form("oracle")


def step_ms(c: RowCosts, form: Form, a: int) -> float:
    """The cost of a step that accepts ``a`` drafts (module docstring)."""
    B = c.block
    if not 0 <= a <= B - 1:
        raise ValueError(f"a step of {B} rows accepts 0..{B - 1} drafts, got {a}")
    fixed = c.draft + c.rest
    if form.kind == "eager":
        return fixed + c.rows(B)
    if form.kind == "oracle":
        return fixed + c.rows(a + 1)
    spans = [(lo, hi) for lo, hi in row_spans(B, form.groups) if a >= lo]  # the spans read
    if form.layers_later:
        return fixed + sum(c.rows(hi - lo) for lo, hi in spans)
    return fixed + c.layers[B - 1] + sum(c.head[hi - lo - 1] for lo, hi in spans)


def geometric_law(alpha: float, block: int) -> np.ndarray:
    """``P(a = j)`` for j = 0..B-1 when each draft is accepted with probability ``alpha``
    after the ones before it: ``alpha^j (1 - alpha)``, the last ``alpha^(B-1)``."""
    p = alpha ** np.arange(block, dtype=np.float64)  # P(a >= j)
    return p - np.append(p[1:], 0.0)


def geometric_alpha(tau: float, block: int) -> float:
    """The alpha whose geometric law has this ``tau`` (1 <= tau <= B), by bisection to 1e-12
    (tau grows with alpha)."""
    if not 1.0 <= tau <= block:
        raise ValueError(f"a block of {block} rows has 1 <= tau <= {block}, got {tau}")
    lo, hi = 0.0, 1.0
    while hi - lo > 1e-12:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if law_tau(geometric_law(mid, block)) < tau else (lo, mid)
    return hi


def expected_step_ms(c: RowCosts, form: Form, law: Sequence[float]) -> float:
    """``E[cost(a)]`` over ``law`` = P(a = 0..B-1)."""
    return float(sum(p * step_ms(c, form, a) for a, p in enumerate(law)))


def speedup(c: RowCosts, form: Form, law: Sequence[float]) -> float:
    """``E[a + 1] P / E[cost(a)]`` over ``law`` = P(a = 0..B-1)."""
    return law_tau(law) * c.plain / expected_step_ms(c, form, law)


def measured_law(accepts: Sequence[int], block: int) -> np.ndarray:
    """The law of a from a run's accept counts (each 0..B-1)."""
    return np.bincount(np.asarray(accepts, dtype=np.int64), minlength=block) / len(accepts)


def law_tau(law: Sequence[float]) -> float:
    """``E[a + 1]``."""
    law = np.asarray(law, dtype=np.float64)
    return float(law @ (np.arange(law.size) + 1))


def break_even_tau(c: RowCosts, form: Form, target: float = 1.0, grid: int = 1000) -> float | None:
    """The smallest tau of the geometric family (module docstring) at which ``form`` reaches
    ``speedup >= target``, to about 1e-9 in alpha (the first grid point that reaches it,
    refined by bisection against the point before); None if alpha = 1 (tau = B) does not."""
    def reaches(alpha: float) -> bool:
        return speedup(c, form, geometric_law(alpha, c.block)) >= target

    alphas = np.linspace(0.0, 1.0, grid + 1)
    i = next((i for i, a in enumerate(alphas) if reaches(float(a))), None)
    if i is None:
        return None
    if i == 0:
        return 1.0
    lo, hi = float(alphas[i - 1]), float(alphas[i])
    while hi - lo > 1e-9:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if reaches(mid) else (mid, hi)
    return law_tau(geometric_law(hi, c.block))
