"""Chain verify, greedy and sampled (docs/spec_decode.md, "Chain verify").

    block     = [t_s, d_1, ..., d_{n-1}]   [n]   the anchor and n-1 drafts
    posterior = target token per block row [n]   row j (it saw block[0..j]) predicts s+j+1
    a         = longest prefix with block[1+j] == posterior[j], j = 0..n-2   (0 <= a <= n-1)
    bonus     = posterior[a]                      the target's token after the accepted drafts

The step commits ``block[1..a]`` and the bonus; the caches keep verify rows 0..a.

- **Greedy** (:func:`verify_chain_greedy`): posterior = argmax per row.
- **Sampled** (:func:`verify_chain_sampled`, the release's ``_rejection_sample``, PyPI ``dflash``
  0.1.0): drafts ``d_j ~ q_j``; draft j is accepted iff ``u_j q_j(d_j) < p_j(d_j)`` with
  ``p_j = sampling_probs(row j)`` (probability ``min(1, p/q)``), up to the first rejection; the
  bonus is drawn from the residual ``max(0, p_a - q_a)`` renormalised (``p_a`` if it is all
  zero), or from ``p_{n-1}`` after a full accept: the tokens are distributed as sampling from p.

Results are on the host. A row holding NaN or +-inf raises
:class:`~dflash_ref.errors.NonFiniteLogitsError` (docs/conventions.md, "Non-finite logits").
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
    """One chain verify step: ``a`` accepted drafts (0 <= a <= B-1), ``accepted`` =
    ``block[1 : 1+a]``, ``bonus`` = ``posterior[a]``, ``posterior`` [B] int64 the target's token
    per row (argmax, or sampled; the rejection form samples only up to the bonus: [a+1])."""

    a: int
    accepted: tuple[int, ...]
    bonus: int
    posterior: np.ndarray

    @property
    def committed(self) -> tuple[int, ...]:
        """The accepted drafts, then the bonus: positions s+1..s+a+1."""
        return (*self.accepted, self.bonus)

    @property
    def acceptance_length(self) -> int:
        """``a + 1``: the quantity tau averages (docs/conventions.md, tau)."""
        return self.a + 1

    @property
    def n_keep_rows(self) -> int:
        """Verify rows the target KV cache and the drafter context keep: 0..a."""
        return self.a + 1

    @property
    def bonus_row(self) -> int:
        """The verify row whose logits chose the bonus: row a."""
        return self.a


def accept_length(drafts, posterior) -> np.ndarray:
    """``a = sum_j prod_{i <= j} [drafts[i] == posterior[i]]``, the longest agreeing prefix.

    ``drafts`` [..., k] (``block[..., 1:]``); ``posterior`` [..., >= k], its first k compared
    (the bonus row of a full accept never is). Returns [...] int64 in [0, k]."""
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
    if type(x).__module__.startswith("cupy"):
        return x.get()
    return np.asarray(x)


def greedy_posterior(be: Backend | str, target, n_rows: int | None = None,
                     role: str = "verify") -> np.ndarray:
    """The target's greedy token per row, [R] int64 on the host, from logits [R, V] (lowest
    index on ties; non-finite rows refused, ``role`` named) or from ids [R] taken as they are."""
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


def verify_chain_greedy(be: Backend | str, block, target) -> ChainVerifyResult:
    """Greedy chain verify of ``block`` [B] against ``target`` (logits [B, V] or argmax ids
    [B]). Block [5, 7, 9, 2], argmax rows [7, 9, 4, x]: a = 2, accepted (7, 9), bonus 4."""
    b = _check_block(block)
    posterior = greedy_posterior(be, target, n_rows=b.shape[0])  # [B]
    a = int(accept_length(b[1:], posterior))
    return ChainVerifyResult(a=a, accepted=tuple(int(t) for t in b[1: 1 + a]),
                             bonus=int(posterior[a]), posterior=posterior)


def rejection_core(drafts, p, q, candidates, u_accept, u_bonus) -> tuple[int, int]:
    """(a, bonus) by rejection sampling with the residual (module docstring, "Sampled"):
    ``drafts`` [n-1], ``p`` [n, V] (row j checks drafts[j]), ``q`` [n-1, V] or [n-1, k] on
    ``candidates`` [n-1, k] (DFlash 2), ``u_accept`` [n-1] uniforms, ``u_bonus`` one."""
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
    return a, residual_draw(p[a], q_full[a], u_bonus)


def residual_draw(p_row, q_row, u) -> int:
    """The bonus after a rejection: a token from ``max(0, p - q)`` renormalised (``p`` [V] if
    that is all zero), drawn with the uniform ``u``."""
    residual = np.maximum(p_row - q_row, 0.0)
    if not residual.sum() > 0:
        residual = p_row
    return int(sample_from_probs(residual, u))


def verify_chain_sampled(be: Backend | str, block, target_logits, proposal: DraftProposal,
                         law: SamplingParams, rng) -> ChainVerifyResult:
    """:func:`rejection_core` on ``block`` [n], ``p = sampling_probs(target_logits)`` [n, V]
    and the ``proposal``'s ``q``, with n-1 accept uniforms from ``rng``, then one for the bonus
    (``posterior``: the accepted drafts and the bonus). Greedy: :func:`verify_chain_greedy`."""
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
