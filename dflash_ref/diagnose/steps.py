"""Per-step acceptance, collected by an observer, and the statistics of docs/acceptance.md.

:class:`StepLog` watches a greedy chain run (``generate(..., observer=StepLog())``): per spec
step it keeps the anchor position s, the drafts n-1, the accepted count a and, when a draft was
rejected, the rank of the target's token among the drafter's logits of the parting row (rank 0 is
the drafter's first choice, which was the rejected draft itself, so a rejection has rank >= 1). A
step that stops where the target agrees with the draft (rank 0: the loop's last step, cut at
``max_new_tokens``) rejected nothing: it is recorded with the drafts it judged, ``a`` of ``a``.
It only watches: the loop is the same with or without it.

:func:`acceptance_stats` turns the steps into the report's numbers:

- ``tau = mean(a + 1)`` and the acceptance rate ``sum a / sum (n - 1)`` (docs/conventions.md);
- ``P(a >= j)`` for j = 1..B-1 and ``P(a >= j | a >= j-1)``;
- the histogram of ``a + 1`` over 1..B;
- tau by context bucket (the anchor position s // ``bucket``);
- the drafts accepted (``sum a``) and the steps that rejected one (``a < n - 1``);
- the rejections by rank (second choice: rank 1; in the top ``k``: 2..k-1; absent: >= k) and by
  the block position where drafts and target part (``a + 1``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dflash_ref.spec_decode.observe import Observer

TOP_K = 8
"""A rejected target token of rank < TOP_K in the drafter's row counts as "in its top k"."""


@dataclass(frozen=True)
class Step:
    """One spec step: anchor position, drafts offered, drafts accepted, and the rank of the
    target's token in the drafter's parting row (None after a full accept)."""

    position: int
    drafted: int
    a: int
    miss_rank: int | None


class StepLog(Observer):
    """Collects :class:`Step` records from the loop's events (module docstring)."""

    def __init__(self):
        self.steps: list[Step] = []
        self._draft = None

    def on_draft(self, anchor, positions, logits, proposal) -> None:
        rows = logits.get() if type(logits).__module__.startswith("cupy") else np.asarray(logits)
        self._draft = (int(positions[0]), rows, len(positions) - 1)

    def on_commit(self, tokens) -> None:
        if self._draft is None:  # a plain step (or the prefill): nothing was drafted
            return
        position, rows, drafted = self._draft
        self._draft = None
        a = len(tokens) - 1
        rank = None
        if a < drafted:  # the target's token (the bonus) against the drafter's row a + 1
            row = rows[a + 1].astype(np.float64)  # [V]
            bonus = int(tokens[-1])
            rank = int(np.sum(row > row[bonus]) + np.sum(row[:bonus] == row[bonus]))
        if rank == 0:  # the target agreed with the draft: the step was cut (max_new_tokens)
            drafted, rank = a, None
        self.steps.append(Step(position, drafted, a, rank))


@dataclass(frozen=True)
class AcceptanceNumbers:
    """The numbers of one run (module docstring). Arrays are indexed from j = 1 (index 0 is
    block position 1)."""

    tau: float
    acceptance_rate: float
    p_at_least: tuple[float, ...]
    p_conditional: tuple[float, ...]
    histogram: tuple[int, ...]
    tau_by_context: tuple[tuple[int, float, int], ...]
    misses: dict
    parting: tuple[int, ...]
    n_steps: int
    accepted: int
    rejected: int


def acceptance_stats(steps: list[Step], block_size: int, bucket: int = 64) -> AcceptanceNumbers:
    """The statistics of ``steps`` for a block of ``block_size`` (module docstring).

    ``tau_by_context`` lists (bucket start, tau, steps) per non-empty bucket of anchor positions.
    """
    if not steps:
        raise ValueError("no speculative step ran: nothing to explain (is max_new_tokens >= 2 "
                         "and a drafter given?)")
    B = int(block_size)
    a = np.array([s.a for s in steps])  # [S]
    drafted = np.array([s.drafted for s in steps])
    at_least = [float(np.mean(a >= j)) for j in range(1, B)]
    cond = [float(np.mean(a[a >= j - 1] >= j)) if np.any(a >= j - 1) else 0.0
            for j in range(1, B)]
    hist = tuple(int(np.sum(a + 1 == n)) for n in range(1, B + 1))
    pos = np.array([s.position for s in steps]) // bucket
    by_ctx = tuple((int(b * bucket), float(np.mean(a[pos == b] + 1)), int(np.sum(pos == b)))
                   for b in np.unique(pos))
    ranks = [s.miss_rank for s in steps if s.miss_rank is not None]
    misses = {"second choice": sum(r == 1 for r in ranks),
              f"in top {TOP_K}": sum(2 <= r < TOP_K for r in ranks),
              "absent": sum(r >= TOP_K for r in ranks)}
    parting = tuple(int(np.sum((a + 1 == j) & (a < drafted))) for j in range(1, B))
    return AcceptanceNumbers(
        tau=float(np.mean(a + 1)), acceptance_rate=float(a.sum() / max(drafted.sum(), 1)),
        p_at_least=tuple(at_least), p_conditional=tuple(cond), histogram=hist,
        tau_by_context=by_ctx, misses=misses, parting=parting, n_steps=len(steps),
        accepted=int(a.sum()), rejected=int(np.sum(a < drafted)))
