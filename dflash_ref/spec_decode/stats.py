"""Acceptance statistics: tau, acceptance rate, per-position acceptance (docs/spec_decode.md).

Per verify step the loop records ``a`` (accepted drafts) and ``k`` (drafted tokens, B-1 for a
chain). Two families of numbers are quoted in the wild and are easy to confuse:

- **acceptance length tau** = mean of ``a + 1`` over verify steps: tokens emitted per target
  forward, 1 <= tau <= B (at most B-1 drafts + 1 bonus). The authors' benchmark (z-lab/dflash,
  ``_print_decode_summary``) averages per response and then over responses; SGLang and most
  harnesses pool all steps. Both are provided: :attr:`AcceptanceStats.tau` (per response, the
  authors') and :attr:`AcceptanceStats.tau_pooled`.
- **acceptance rate** (vLLM "draft acceptance rate", llama.cpp "accept %") = accepted drafts /
  drafted tokens, the bonus excluded.

With a fixed k they are tied by ``tau = 1 + rate * k`` (pooled; and per response with that
response's rate). B = 16 (k = 15): rate 44.7% is tau 7.70, not 44.7% of 16.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def tau_pooled(acceptance_lengths: Sequence[int]) -> float:
    """Mean of ``a + 1`` over all verify steps, pooled (SGLang ``spec_accept_length``).

    Args:
        acceptance_lengths: ``a + 1`` per verify step.
    """
    x = np.asarray(acceptance_lengths, dtype=np.float64)
    if x.size == 0:
        raise ValueError("tau of zero verify steps is undefined")
    return float(np.mean(x))


def tau_per_response(acceptance_lengths_by_response: Sequence[Sequence[int]]) -> float:
    """The authors' tau: mean of ``a + 1`` within each response, then the mean over responses.

    Responses without a verify step are skipped (they have no tau).
    """
    means = [tau_pooled(r) for r in acceptance_lengths_by_response if len(r) > 0]
    if not means:
        raise ValueError("tau of zero verify steps is undefined")
    return float(np.mean(means))


def acceptance_rate(accepted: Sequence[int], drafted: Sequence[int]) -> float:
    """``sum(a) / sum(k)``: accepted drafts over drafted tokens, bonus excluded."""
    total = float(np.sum(np.asarray(drafted, dtype=np.float64)))
    if total <= 0:
        raise ValueError("acceptance rate with zero drafted tokens is undefined")
    return float(np.sum(np.asarray(accepted, dtype=np.float64))) / total


def per_position_accepted(accepted: Sequence[int], k: int) -> np.ndarray:
    """How often draft position j (1-based, j = 1..k) was accepted: ``#{steps : a >= j}``.

    Position j is accepted iff the first j drafts all are, so the counts never increase with j
    and sum to ``sum(a)``.

    Returns:
        [k] int64; entry j-1 is position j.
    """
    a = np.asarray(accepted, dtype=np.int64).reshape(-1)  # [steps]
    j = np.arange(1, k + 1)  # [k]
    return np.sum(a[:, None] >= j[None, :], axis=0).astype(np.int64)  # [k]


def acceptance_histogram(acceptance_lengths: Sequence[int], block_size: int) -> np.ndarray:
    """Counts of ``a + 1`` in bins 0..B, pooled over steps (the authors' benchmark histogram)."""
    x = np.asarray(acceptance_lengths, dtype=np.int64)
    if x.size and (x.min() < 0 or x.max() > block_size):
        raise ValueError(
            f"acceptance lengths must be in [0, {block_size}], got {x.min()}..{x.max()}"
        )
    return np.bincount(x, minlength=block_size + 1).astype(np.int64)


class AcceptanceStats:
    """Accumulates verify steps by response.

    Usage::

        st = AcceptanceStats(block_size=16)
        for prompt in prompts:
            st.start_response()
            ... st.record(a, k) after each verify step ...
        st.tau, st.tau_pooled, st.acceptance_rate, st.per_position_rate()

    ``k`` is the number of drafted tokens the step verified: B-1 for a chain. For a DDTree step
    record ``a = len(path) - 1``; what counts as "drafted" in a tree is a choice (the nodes
    verified, or the depth); tau is unaffected by it.
    """

    def __init__(self, block_size: int):
        self.block_size = int(block_size)
        self.responses: list[list[tuple[int, int]]] = []

    def start_response(self) -> None:
        self.responses.append([])

    def record(self, a: int, k: int) -> None:
        """One verify step: ``a`` accepted of ``k`` drafted (0 <= a <= k)."""
        if not 0 <= a <= k:
            raise ValueError(f"need 0 <= a <= k, got a={a}, k={k}")
        if not self.responses:
            self.start_response()
        self.responses[-1].append((int(a), int(k)))

    @property
    def steps(self) -> list[tuple[int, int]]:
        return [s for r in self.responses for s in r]

    @property
    def n_steps(self) -> int:
        return sum(len(r) for r in self.responses)

    @property
    def tau(self) -> float:
        """Per-response tau (the authors' benchmark)."""
        return tau_per_response([[a + 1 for a, _ in r] for r in self.responses])

    @property
    def tau_pooled(self) -> float:
        return tau_pooled([a + 1 for a, _ in self.steps])

    @property
    def acceptance_rate(self) -> float:
        s = self.steps
        return acceptance_rate([a for a, _ in s], [k for _, k in s])

    def per_position(self) -> tuple[np.ndarray, np.ndarray]:
        """(accepted [K], drafted [K]) per draft position j = 1..K, K = the largest k seen."""
        s = self.steps
        kmax = max((k for _, k in s), default=0)
        acc = per_position_accepted([a for a, _ in s], kmax)
        drafted = per_position_accepted([k for _, k in s], kmax)  # steps that drafted position j
        return acc, drafted

    def per_position_rate(self) -> np.ndarray:
        """Acceptance rate of position j among steps that drafted it (NaN where none did)."""
        acc, drafted = self.per_position()
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(drafted > 0, acc / np.maximum(drafted, 1), np.nan)

    def histogram(self) -> np.ndarray:
        return acceptance_histogram([a + 1 for a, _ in self.steps], self.block_size)
