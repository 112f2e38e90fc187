"""Row reductions over logits used by verify and the gates (docs/spec_decode.md, "Gates").

Every op takes logits [..., V] and reduces the last axis, returning one value per row [...].

Non-finite values follow one rule on every backend (docs/conventions.md, "Non-finite logits"):

- ``argmax_rows``: NaN compares greater than everything and the first NaN wins (NumPy's argmax);
  +inf and -inf are ordinary extremes (a row of -inf gives 0, the lowest index of the tie).
- ``top1_prob_rows`` / ``entropy_rows``: softmax is defined when ``max(row)`` is finite, so a row
  holding a NaN or a +inf, or whose entries are all -inf, gives NaN. A -inf next to a finite
  value is a masked token: probability 0.
- ``count_nonfinite_rows`` counts NaN, +inf and -inf per row; verify and draft refuse a row where
  it is not 0 (:func:`argmax_rows_checked`, :func:`check_finite_logits`).
"""

from __future__ import annotations

import numpy as np

from dflash_ref.errors import NonFiniteLogitsError
from dflash_ref.ops._dtypes import in_compute_dtype


def argmax_rows(logits) -> np.ndarray:
    """Greedy token per row: index of the largest logit; ties go to the lowest index.

    NaN counts as larger than any number, so a row holding NaN gives its first NaN's index
    (NumPy's argmax); +inf and -inf are ordinary values.

    Args:
        logits: [..., V].
    Returns:
        [...] int64.
    """
    return np.argmax(np.asarray(logits), axis=-1).astype(np.int64)


def _softmax_defined(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ok [...], x with undefined rows zeroed [..., V]): ok iff max(row) is finite.

    ``np.max`` propagates NaN, so ``ok`` is False for a row holding NaN, a row holding +inf and a
    row of only -inf. Zeroing those rows keeps the arithmetic below free of invalid operations.
    """
    ok = np.isfinite(np.max(x, axis=-1))  # [...]
    return ok, np.where(ok[..., None], x, 0)


def top1_prob_rows(logits) -> np.ndarray:
    """Probability of the top token per row: ``p1 = 1 / sum_j exp(l_j - l_max)``.

    This is softmax(l)[argmax] without forming the softmax; the entropy gate thresholds it.
    A row whose max is not finite (NaN, +inf, or all -inf) gives NaN.

    Args:
        logits: [..., V].
    Returns:
        [...] in the compute dtype, in (0, 1] or NaN.
    """
    ok, x = _softmax_defined(in_compute_dtype(logits))
    m = np.max(x, axis=-1, keepdims=True)  # [..., 1]
    return np.where(ok, 1.0 / np.sum(np.exp(x - m), axis=-1), np.nan).astype(x.dtype)


def entropy_rows(logits) -> np.ndarray:
    """Shannon entropy (nats) of softmax(logits) per row.

    With m = max l, s = sum exp(l - m) and p = exp(l - m) / s:
    ``H = -sum p log p = log s - sum p (l - m)``.

    A logit of -inf (a masked token) contributes 0 to the sum (p log p -> 0 as p -> 0). A row whose
    max is not finite (NaN, +inf, or all -inf) gives NaN.

    Args:
        logits: [..., V].
    Returns:
        [...] in the compute dtype, in [0, log V] or NaN.
    """
    ok, x = _softmax_defined(in_compute_dtype(logits))
    shifted = x - np.max(x, axis=-1, keepdims=True)  # [..., V], <= 0
    e = np.exp(shifted)
    s = np.sum(e, axis=-1)  # [...]
    e_shifted = e * np.where(e > 0, shifted, 0)  # 0 where l = -inf, never 0 * -inf
    h = np.log(s) - np.sum(e_shifted, axis=-1) / s
    return np.where(ok, h, np.nan).astype(x.dtype)


def count_nonfinite_rows(logits) -> np.ndarray:
    """Number of NaN, +inf and -inf entries per row.

    Args:
        logits: [..., V].
    Returns:
        [...] int64.
    """
    return np.sum(~np.isfinite(np.asarray(logits)), axis=-1).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# The guard verify and draft share (not ops: they take a Backend and return host values).
# ---------------------------------------------------------------------------------------------


def check_finite_logits(logits, role: str, first_row: int = 0) -> None:
    """Raise :class:`~dflash_ref.errors.NonFiniteLogitsError` if host ``logits`` hold NaN or inf.

    Args:
        logits: [R, V] host array.
        role: "verify", "draft" or "target", named in the error.
        first_row: the caller's index of row 0, so the error names rows as the caller counts them.
    """
    x = np.asarray(logits)
    bad = ~np.isfinite(x)  # [R, V]
    if not bad.any():
        return
    rows = np.flatnonzero(bad.reshape(-1, x.shape[-1]).any(axis=-1)) + first_row
    raise NonFiniteLogitsError(role, rows, np.isnan(x).sum(), np.isposinf(x).sum(),
                               np.isneginf(x).sum(), n_rows=int(np.prod(x.shape[:-1])))


def argmax_rows_checked(be, logits, role: str, first_row: int = 0) -> np.ndarray:
    """``argmax_rows`` on the backend, as host int64 [R]; raises on non-finite logits.

    The per-row non-finite counts (``count_nonfinite_rows``) are computed beside the argmax and
    copied to the host with it in one transfer, so the guard adds no host synchronisation. Only
    when a count is not 0 are the logits copied, to name the rows in the error.

    Args:
        be: the :class:`~dflash_ref.backend.Backend` holding ``logits``.
        logits: [R, V] backend array.
        role: "verify", "draft" or "target", named in the error.
        first_row: the caller's index of row 0 (``draft_tokens`` drops the anchor row: 1).
    Returns:
        [R] int64 host array.
    """
    ids = be.ops.argmax_rows(logits)  # [R] int64
    counts = be.ops.count_nonfinite_rows(logits)  # [R] int64
    host = be.to_numpy(be.xp.stack([ids, counts]))  # [2, R]: one device -> host copy
    if host[1].any():
        check_finite_logits(be.to_numpy(logits), role, first_row)
    return host[0].astype(np.int64)
