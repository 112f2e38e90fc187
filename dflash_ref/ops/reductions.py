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
    """[...] int64: index of the largest logit of [..., V]; ties and NaN: the first wins."""
    return np.argmax(np.asarray(logits), axis=-1).astype(np.int64)


def _softmax_defined(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ok [...], x with undefined rows zeroed [..., V]): ok iff max(row) is finite."""
    ok = np.isfinite(np.max(x, axis=-1))  # [...]
    return ok, np.where(ok[..., None], x, 0)


def top1_prob_rows(logits) -> np.ndarray:
    """Top-token probability of [..., V]: ``p1 = 1 / sum_j exp(l_j - l_max)``, [...] or NaN."""
    ok, x = _softmax_defined(in_compute_dtype(logits))
    m = np.max(x, axis=-1, keepdims=True)  # [..., 1]
    return np.where(ok, 1.0 / np.sum(np.exp(x - m), axis=-1), np.nan).astype(x.dtype)


def entropy_rows(logits) -> np.ndarray:
    """Entropy (nats) of softmax of [..., V]: ``H = log s - sum p (l - m)``, m = max l,
    s = sum exp(l - m), p = exp(l - m) / s; a -inf logit adds 0. [...] or NaN.
    """
    ok, x = _softmax_defined(in_compute_dtype(logits))
    shifted = x - np.max(x, axis=-1, keepdims=True)  # [..., V], <= 0
    e = np.exp(shifted)
    s = np.sum(e, axis=-1)  # [...]
    e_shifted = e * np.where(e > 0, shifted, 0)  # 0 where l = -inf, never 0 * -inf
    h = np.log(s) - np.sum(e_shifted, axis=-1) / s
    return np.where(ok, h, np.nan).astype(x.dtype)


def count_nonfinite_rows(logits) -> np.ndarray:
    """[...] int64: NaN, +inf and -inf entries per row of [..., V]."""
    return np.sum(~np.isfinite(np.asarray(logits)), axis=-1).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# The guard verify and draft share (not ops: they take a Backend and return host values).
# ---------------------------------------------------------------------------------------------


def check_finite_logits(logits, role: str, first_row: int = 0) -> None:
    """Raise NonFiniteLogitsError naming ``role`` if host logits [R, V] hold NaN or inf; rows
    are numbered from ``first_row``."""
    x = np.asarray(logits)
    bad = ~np.isfinite(x)  # [R, V]
    if not bad.any():
        return
    rows = np.flatnonzero(bad.reshape(-1, x.shape[-1]).any(axis=-1)) + first_row
    raise NonFiniteLogitsError(role, rows, np.isnan(x).sum(), np.isposinf(x).sum(),
                               np.isneginf(x).sum(), n_rows=int(np.prod(x.shape[:-1])))


def argmax_rows_checked(be, logits, role: str, first_row: int = 0) -> np.ndarray:
    """``argmax_rows`` of backend logits [R, V] as host int64 [R]; raises on non-finite logits.

    The non-finite counts come to the host with the argmax in one copy (no extra sync).
    """
    ids = be.ops.argmax_rows(logits)  # [R] int64
    counts = be.ops.count_nonfinite_rows(logits)  # [R] int64
    host = be.to_numpy(be.xp.stack([ids, counts]))  # [2, R]: one device -> host copy
    if host[1].any():
        check_finite_logits(be.to_numpy(logits), role, first_row)
    return host[0].astype(np.int64)
