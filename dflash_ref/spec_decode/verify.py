"""Chain verify: greedy, and sampled at temperature > 0 (docs/spec_decode.md, "Chain verify").

One verify step sees the block that was drafted and the target's output for it:

    block     = [t_s, d_1, ..., d_{n-1}]   [n]     anchor (last committed token) + n-1 drafts
    posterior = target token per block row [n]     row j predicts position s+j+1

Row j of the target saw block[0..j], so its token is the target's choice for the position where
draft d_{j+1} sits. The accepted count is

    a = length of the longest prefix with block[1+j] == posterior[j], j = 0..n-2  (0 <= a <= n-1)

and the bonus is ``posterior[a]``: the target's own token right after the last accepted draft
(after a rejection it replaces the rejected draft; after a full accept it is a free extra token).
The step commits ``block[1..a]`` and the bonus, so the output grows by ``a + 1`` tokens and the
next anchor is the bonus (``s <- s + a + 1``). The target KV cache and the drafter's context keep
verify rows 0..a (the old anchor and the a accepted drafts); the bonus is in no cache yet.

- **Greedy** (:func:`verify_chain_greedy`, z-lab/dflash ``dflash/model.py``): posterior = argmax
  per row (``be.ops.argmax_rows``).
- **Sampled** (:func:`verify_chain_sampled`, the release: PyPI ``dflash`` 0.1.0,
  ``dflash/model.py``, ``_rejection_sample``): the drafts were sampled, ``d_j ~ q_j``; with the
  target's ``p_j = sampling_probs(row j)`` draft j is accepted iff ``u_j q_j(d_j) < p_j(d_j)``
  (probability ``min(1, p/q)``), stopping at the first rejection; the bonus is drawn from the
  residual ``max(0, p_a - q_a)`` renormalised (``p_a`` itself if the residual is all zero), or
  from ``p_{n-1}`` after a full accept (:func:`rejection_core`). The emitted tokens are
  distributed as sampling from p one token at a time.
- **Greedy drafts, sampled rows** (:func:`chain_sampled_core`, the older z-lab form @44947fb): a
  token is sampled per target row and a greedy draft is accepted iff it equals it; also lossless.

Everything returned is on the host (Python ints and NumPy arrays): the loop branches on it.
Non-finite logits are refused, never turned into a token: every verifier raises
:class:`~dflash_ref.errors.NonFiniteLogitsError` when a row holds NaN or +-inf (docs/conventions.md,
"Non-finite logits"). Tree verification (DDTree) lives in :mod:`dflash_ref.spec_decode.ddtree`;
the verify rules as objects, in :mod:`dflash_ref.spec_decode.verifiers`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dflash_ref.backend import Backend, as_backend
from dflash_ref.ops.reductions import argmax_rows_checked
from dflash_ref.ops.sampling import (
    DraftProposal,
    SamplingParams,
    as_generator,
    sample_from_probs,
    sampling_probs,
)


@dataclass(frozen=True)
class ChainVerifyResult:
    """Outcome of one chain verify step (docs/spec_decode.md).

    Attributes:
        a: accepted drafts, 0 <= a <= B-1.
        accepted: ``block[1 : 1+a]``, the accepted draft tokens.
        bonus: ``posterior[a]``, the target's token after the last accepted draft.
        posterior: [B] int64, the target's token per block row (argmax, or sampled); the
            rejection form samples only up to the bonus, so there it is [a+1].
    """

    a: int
    accepted: tuple[int, ...]
    bonus: int
    posterior: np.ndarray

    @property
    def committed(self) -> tuple[int, ...]:
        """The ``a + 1`` tokens this step appends after the anchor: accepted drafts, then bonus.

        With the anchor at position s they fill positions s+1..s+a+1; the bonus at s+a+1 is the
        next anchor.
        """
        return (*self.accepted, self.bonus)

    @property
    def acceptance_length(self) -> int:
        """``a + 1``: the quantity tau averages (docs/conventions.md, tau)."""
        return self.a + 1

    @property
    def n_keep_rows(self) -> int:
        """Verify rows to keep in the target KV cache and the drafter context: rows 0..a."""
        return self.a + 1

    @property
    def bonus_row(self) -> int:
        """The verify row whose logits chose the bonus: row a."""
        return self.a


# ---------------------------------------------------------------------------------------------
# Small pure pieces (host NumPy, any leading batch dimensions).
# ---------------------------------------------------------------------------------------------


def accept_length(drafts, posterior) -> np.ndarray:
    """Longest prefix where the drafts equal the target's tokens (``dflash_generate``).

    ``a = sum_j prod_{i <= j} [drafts[i] == posterior[i]]`` (the HF ref's cumprod of equality,
    summed).

    Args:
        drafts: [..., k] int, ``block[..., 1:]``.
        posterior: [..., >= k] int; only the first k entries are compared (row k, the bonus row
            of a full accept, is never compared).
    Returns:
        [...] int64 in [0, k].
    """
    drafts = np.asarray(drafts)
    k = drafts.shape[-1]
    eq = drafts == np.asarray(posterior)[..., :k]  # [..., k]
    return np.sum(np.cumprod(eq, axis=-1), axis=-1).astype(np.int64)


def _check_block(block) -> np.ndarray:
    """``block`` as a host int64 vector [B] with B >= 1."""
    b = _host(block)
    if b.ndim != 1 or b.shape[0] < 1 or not np.issubdtype(b.dtype, np.integer):
        raise ValueError(
            f"block must be a 1-D integer array [B] = [anchor, d_1, ..., d_(B-1)] with B >= 1; "
            f"got shape {b.shape}, dtype {b.dtype}"
        )
    return b.astype(np.int64)


def _host(x) -> np.ndarray:
    """Any array (NumPy, CuPy, list) as a host NumPy array."""
    if type(x).__module__.startswith("cupy"):
        return x.get()
    return np.asarray(x)


def greedy_posterior(be: Backend | str, target, n_rows: int | None = None,
                     role: str = "verify") -> np.ndarray:
    """The target's greedy token per row, on the host.

    Args:
        be: the backend holding ``target``.
        target: either logits [R, V] (a backend array; reduced with ``be.ops.argmax_rows``,
            lowest index on ties, and refused when non-finite) or already-reduced ids [R] (any
            integer array, taken as they are).
        n_rows: when given, R must equal it.
        role: named in the error when the logits are non-finite.
    Returns:
        [R] int64 host array.
    Raises:
        NonFiniteLogitsError: a logits row holds NaN or +-inf.
    """
    be = as_backend(be)
    if not hasattr(target, "shape"):
        target = np.asarray(target)
    ndim = len(target.shape)
    if ndim == 2:
        ids = argmax_rows_checked(be, target, role)  # one copy: ids and finiteness together
    elif ndim == 1 and np.issubdtype(np.dtype(target.dtype), np.integer):
        ids = _host(target)
    else:
        raise ValueError(
            f"target must be logits [R, V] or integer argmax ids [R]; got shape "
            f"{tuple(target.shape)}, dtype {target.dtype}"
        )
    if n_rows is not None and ids.shape[0] != n_rows:
        raise ValueError(
            f"the target gave {ids.shape[0]} rows but the block/tree has {n_rows}: verify runs the "
            f"target on every block token (anchor included), one row each"
        )
    return ids.astype(np.int64)


# ---------------------------------------------------------------------------------------------
# Greedy chain verify.
# ---------------------------------------------------------------------------------------------


def verify_chain_greedy(be: Backend | str, block, target) -> ChainVerifyResult:
    """Greedy chain verify (``dflash_generate``).

    Example: block [5, 7, 9, 2], target argmax rows [7, 9, 4, x]: 7 == 7, 9 == 9, 2 != 4, so
    a = 2, accepted (7, 9), bonus 4, committed (7, 9, 4).

    Args:
        be: backend of ``target``.
        block: [B] int, ``[anchor, d_1, ..., d_(B-1)]`` (host or device).
        target: the target's logits [B, V] for the B block rows, or their argmax ids [B].
    Returns:
        :class:`ChainVerifyResult` with host values.
    """
    b = _check_block(block)
    posterior = greedy_posterior(be, target, n_rows=b.shape[0])  # [B]
    a = int(accept_length(b[1:], posterior))
    return ChainVerifyResult(a=a, accepted=tuple(int(t) for t in b[1: 1 + a]),
                             bonus=int(posterior[a]), posterior=posterior)


# ---------------------------------------------------------------------------------------------
# Sampled chain verify (temperature > 0).
# ---------------------------------------------------------------------------------------------


def rejection_core(drafts, p, q, candidates, u_accept, u_bonus) -> tuple[int, int]:
    """Speculative sampling with the residual, one block (module docstring, "Sampled").

    Args:
        drafts: [n-1] the sampled drafts.
        p: [n, V] target probabilities of the verify rows (row j is checked against drafts[j]).
        q: [n-1, V] draft probabilities, or [n-1, k] on ``candidates`` [n-1, k] (DFlash 2).
        candidates: None, or [n-1, k] distinct token ids per row.
        u_accept: [n-1] uniforms; u_bonus: one uniform.
    Returns:
        (a, bonus): accepted drafts and the bonus token.
    """
    drafts = np.asarray(drafts, dtype=np.int64)
    p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
    m = drafts.shape[0]
    rows = np.arange(m)
    q_full = np.zeros((m, p.shape[-1]))
    if candidates is None:
        q_full[:] = q
    else:
        np.add.at(q_full, (rows[:, None], np.asarray(candidates)), q)
    p_d, q_d = p[rows, drafts], q_full[rows, drafts]
    accepted = np.asarray(u_accept, np.float64) * q_d < p_d
    a = int(np.sum(np.cumprod(accepted)))
    if a == m:
        return a, int(sample_from_probs(p[m], u_bonus))
    residual = np.maximum(p[a] - q_full[a], 0.0)
    if not residual.sum() > 0:
        residual = p[a]
    return a, int(sample_from_probs(residual, u_bonus))


def verify_chain_sampled(be: Backend | str, block, target_logits, proposal: DraftProposal,
                         law: SamplingParams, rng) -> ChainVerifyResult:
    """Sampled chain verify as the release does it: rejection sampling with the residual.

    ``p = sampling_probs(target rows)`` ([n, V], top-k / top-p of ``law``); then
    :func:`rejection_core` on the proposal's drafts and their law ``q``: n-1 accept uniforms,
    then one for the bonus. ``posterior`` in the result holds the accepted drafts followed by
    the bonus (length a+1): rows after the bonus are never sampled in this form. A greedy
    ``law`` (T < 1e-5) is :func:`verify_chain_greedy`.

    Args:
        block: [n] int, ``[anchor, d_1, ..., d_(n-1)]`` with the drafts of ``proposal``.
        target_logits: [n, V] (backend array).
        proposal: the drafter's :class:`~dflash_ref.ops.sampling.DraftProposal`; ``q`` required.
        law: the sampling parameters of the run.
        rng: ``np.random.Generator`` or int seed.
    Raises:
        NonFiniteLogitsError: a target row holds NaN or +-inf.
    """
    b = _check_block(block)
    if law.greedy:
        return verify_chain_greedy(be, b, target_logits)
    p = sampling_probs(be, target_logits, law.temperature, law.top_p, law.top_k)  # [n, V]
    if p.shape[0] != b.shape[0]:
        raise ValueError(f"target_logits has {p.shape[0]} rows, block has {b.shape[0]}")
    if proposal.q is None:
        raise ValueError("sampled verify needs the draft distribution q the drafts came from "
                         "(drafter.propose with the sampling law)")
    g = as_generator(rng)
    u_accept = g.random(b.shape[0] - 1)
    a, bonus = rejection_core(b[1:], p, proposal.q, proposal.candidates, u_accept, g.random())
    posterior = np.concatenate([b[1: 1 + a], [bonus]]).astype(np.int64)
    return ChainVerifyResult(a=a, accepted=tuple(int(t) for t in b[1: 1 + a]), bonus=bonus,
                             posterior=posterior)


def chain_sampled_core(block, probs, u) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Greedy drafts checked against sampled target rows, batched (module docstring).

    ``posterior[j] ~ probs[j]`` independently for every row (drawn with ``u[j]`` by
    :func:`~dflash_ref.ops.sampling.sample_from_probs`); ``a`` = :func:`accept_length`;
    ``bonus = posterior[a]``. With a one-hot draft law this is the rejection rule's distribution:
    row j matches d with probability ``p_j(d)`` (the acceptance probability), and given that it
    does not, its token is ``p_j`` restricted to tokens != d, renormalised (the residual), so

        P(a = k, bonus = x) = prod_{j<k} p_j(d_j) * p_k(x) [x != d_k]   for k < n-1,
        P(a = n-1, bonus = x) = prod_{j<n-1} p_j(d_j) * p_(n-1)(x).

    Args:
        block: [..., n] int.
        probs: [..., n, V] target probabilities per block row (rows sum to 1).
        u: [..., n] uniform draws in [0, 1).
    Returns:
        (a [...], bonus [...], posterior [..., n]), all int64.
    """
    block = np.asarray(block)
    posterior = sample_from_probs(probs, u)  # [..., n]
    a = accept_length(block[..., 1:], posterior)  # [...]
    bonus = np.take_along_axis(posterior, a[..., None], axis=-1)[..., 0]  # [...]
    return a, bonus, posterior
