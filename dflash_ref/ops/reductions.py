"""Row reductions over logits used by verify and the gates (docs/spec_decode.md, "Gates").

Every op takes logits [..., V] and reduces the last axis, returning one value per row [...].
"""

from __future__ import annotations

import numpy as np

from dflash_ref.ops._dtypes import as_compute, compute_dtype


def argmax_rows(logits) -> np.ndarray:
    """Greedy token per row: index of the largest logit; ties go to the lowest index.

    Args:
        logits: [..., V] finite values.
    Returns:
        [...] int64.
    """
    return np.argmax(np.asarray(logits), axis=-1).astype(np.int64)


def top1_prob_rows(logits) -> np.ndarray:
    """Probability of the top token per row: ``p1 = 1 / sum_j exp(l_j - l_max)``.

    This is softmax(l)[argmax] without forming the softmax; the entropy gate thresholds it.

    Args:
        logits: [..., V].
    Returns:
        [...] in the compute dtype, in (0, 1].
    """
    x = as_compute(logits, compute_dtype(logits))
    m = np.max(x, axis=-1, keepdims=True)  # [..., 1]
    return 1.0 / np.sum(np.exp(x - m), axis=-1)


def entropy_rows(logits) -> np.ndarray:
    """Shannon entropy (nats) of softmax(logits) per row.

    With m = max l, s = sum exp(l - m) and p = exp(l - m) / s:
    ``H = -sum p log p = log s - sum p (l - m)``.

    A logit of -inf (a masked token) contributes 0 to the sum (p log p -> 0 as p -> 0).

    Args:
        logits: [..., V] with at least one finite value per row.
    Returns:
        [...] in the compute dtype, in [0, log V].
    """
    x = as_compute(logits, compute_dtype(logits))
    shifted = x - np.max(x, axis=-1, keepdims=True)  # [..., V], <= 0
    e = np.exp(shifted)
    s = np.sum(e, axis=-1)  # [...]
    e_shifted = e * np.where(e > 0, shifted, 0)  # 0 where l = -inf, never 0 * -inf
    return np.log(s) - np.sum(e_shifted, axis=-1) / s
