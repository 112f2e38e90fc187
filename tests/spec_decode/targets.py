"""A toy deterministic "target" for loop-free verifier tests: next token = f(prefix).

``greedy_next(prefix, V)`` stands in for the target's argmax after ``prefix``; it is an arbitrary
but fixed function of the whole prefix (a polynomial hash), so a wrong prefix changes the answer
like a real model would. ``logits_for(ids, V)`` turns ids into logits whose argmax is those ids.
"""

from __future__ import annotations

import numpy as np


def greedy_next(prefix, V: int) -> int:
    h = 1469598103934665603
    for t in prefix:
        h = ((h ^ (int(t) + 1)) * 1099511628211) % (1 << 61)
    return int(h % V)


def greedy_rollout(prefix, n: int, V: int) -> list[int]:
    """The target's greedy continuation of ``prefix``, n tokens."""
    seq = list(prefix)
    for _ in range(n):
        seq.append(greedy_next(seq, V))
    return seq[len(prefix):]


def logits_for(ids, V: int, rng: np.random.Generator | None = None) -> np.ndarray:
    """[R, V] float32 logits whose row argmax is ``ids`` (noise in (-1, 0], the winner at 2)."""
    ids = np.asarray(ids, dtype=np.int64)
    rng = rng or np.random.default_rng(0)
    x = -rng.random((ids.shape[0], V)).astype(np.float32)
    x[np.arange(ids.shape[0]), ids] = 2.0
    return x
