"""Sampled drafting and rejection sampling with the residual, as the authors' release does it.

Public source: PyPI ``dflash`` 0.1.0, ``dflash/model.py`` (``_sampling_probs``,
``_rejection_sample``, ``dflash_generate``); docs/spec_decode.md, "Sampling".

**The sampling distribution** (:func:`sampling_probs`), applied to the target's rows and to a
DFlash drafter's rows alike, in this order:

1. ``x = logits / T``;
2. top-k (``0 < k < V``): keep the k largest x (equal values: the lower id first), the rest get
   probability 0;
3. ``p = softmax(x)`` over the kept entries;
4. top-p (``top_p < 1``): sort p descending (equal values: the lower id first) and keep an entry
   iff the mass strictly before it is ``< top_p`` (the first entry is always kept); renormalise.

**Two sampled verify forms** (``generate(..., sampled_verify=...)``):

- ``"rejection"`` (the release, the default): the drafts are sampled, ``d_j ~ q_j``, where q_j is
  the drafter's sampling distribution of row j (DFlash 2: ``softmax(score_j / T)`` over the
  selector's k candidates of that row, no top-p / top-k). Verify against the target's
  ``p_j = sampling_probs(target row j)``: accept d_j iff ``u_j q_j(d_j) < p_j(d_j)``
  (probability ``min(1, p/q)``), stop at the first rejection; the bonus is drawn from the
  residual ``max(0, p_a - q_a)`` renormalised (p_a itself if the residual is all zero), or from
  p_{n-1} after a full accept. The emitted tokens are distributed as sampling from p one token
  at a time.
- ``"greedy_draft"`` (the older reference, z-lab @44947fb): greedy drafts (argmax, or the
  selector's greedy path), one token sampled per target row, a draft accepted iff it equals the
  sampled token (:func:`~dflash_ref.spec_decode.verify.chain_sampled_core`); also lossless.

Probabilities are formed on the host in float64, so a seed gives the same tokens on every backend.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dflash_ref.backend import as_backend
from dflash_ref.errors import ConfigError
from dflash_ref.spec_decode.verify import (
    GREEDY_BELOW_TEMPERATURE,
    ChainVerifyResult,
    chain_sampled_core,
    greedy_posterior,
    sample_from_probs,
    target_probs,
)

SAMPLED_VERIFY_FORMS = ("rejection", "greedy_draft")


@dataclass(frozen=True)
class SamplingParams:
    """Temperature, top-p and top-k, checked as the release checks them (T >= 0, top_p in (0, 1],
    top_k >= 0; 0 disables top-k). Below T = 1e-5 decoding is greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self):
        t, p, k = self.temperature, self.top_p, self.top_k
        if not (t >= 0 and 0 < p <= 1 and isinstance(k, (int, np.integer)) and k >= 0):
            raise ConfigError(f"sampling needs temperature >= 0, top_p in (0, 1] and an integer "
                              f"top_k >= 0; got temperature={t!r}, top_p={p!r}, top_k={k!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW_TEMPERATURE


def sampling_probs(be, logits, temperature: float, top_p: float = 1.0,
                   top_k: int = 0) -> np.ndarray:
    """The release's sampling distribution per row (module docstring, steps 1-4).

    Args:
        logits: [..., V] (backend array).
    Returns:
        [..., V] float64 on the host, rows sum to 1. Without top-p / top-k this is exactly
        :func:`~dflash_ref.spec_decode.verify.target_probs`.
    """
    p = target_probs(be, logits, temperature)  # softmax(logits / T), float64
    V = p.shape[-1]
    if 0 < top_k < V:
        x = as_backend(be).to_numpy(logits).astype(np.float64)
        order = np.argsort(-x, axis=-1, kind="stable")  # descending, ties: lower id first
        keep = np.zeros(p.shape, dtype=bool)
        np.put_along_axis(keep, order[..., :top_k], True, axis=-1)
        p = np.where(keep, p, 0.0)
        p = p / p.sum(axis=-1, keepdims=True)
    if top_p < 1.0:
        order = np.argsort(-p, axis=-1, kind="stable")
        sorted_p = np.take_along_axis(p, order, axis=-1)
        before = np.cumsum(sorted_p, axis=-1) - sorted_p  # mass strictly before each entry
        keep = np.zeros(p.shape, dtype=bool)
        np.put_along_axis(keep, order, before < top_p, axis=-1)
        p = np.where(keep, p, 0.0)
        p = p / p.sum(axis=-1, keepdims=True)
    return p


def sample_next(be, logits, params: SamplingParams, rng) -> np.ndarray:
    """One token per row: the argmax when greedy, else a draw from :func:`sampling_probs`
    (one uniform per row, as :func:`~dflash_ref.spec_decode.verify.sample_tokens`)."""
    if params.greedy:
        return greedy_posterior(be, logits)
    probs = sampling_probs(be, logits, params.temperature, params.top_p, params.top_k)
    return sample_from_probs(probs, rng.random(probs.shape[:-1]))


def rejection_core(drafts, p, q, candidates, u_accept, u_bonus) -> tuple[int, int]:
    """Speculative sampling with the residual, one block (module docstring).

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


@dataclass(frozen=True)
class DraftProposal:
    """One drafted block: ``tokens`` [n-1]; for sampled drafts, their distribution ``q``
    ([n-1, V], or [n-1, k] on ``candidates`` for DFlash 2)."""

    tokens: np.ndarray
    q: np.ndarray | None = None
    candidates: np.ndarray | None = None


def propose_block(drafter, cache, anchor: int, s: int, n_rows: int, params: SamplingParams,
                  form: str, rng) -> DraftProposal:
    """Draft n-1 tokens after ``anchor`` at position s from a draft cache (up to date to s).

    Greedy, or the ``"greedy_draft"`` form: argmax per row (DFlash 2: the selector's greedy
    path). The ``"rejection"`` form at T > 0: sampled from :func:`sampling_probs` of the draft rows
    (one uniform per row), or for DFlash 2 along the selector's path from
    ``softmax(score_i / T)`` over row i's candidates (one uniform per row, in order).

    ``n_rows`` below the drafter's block size runs a shorter block when the drafter offers it
    (``DFlashDrafter``); other drafters' logits are cut to n rows.
    """
    sampled = not params.greedy and form == "rejection"
    if not hasattr(drafter, "propose"):  # a bare drafter: logits only (tests' scripted drafters)
        logits = cache.forward_block(anchor, s)[:n_rows]
        if not sampled:
            return DraftProposal(np.asarray(drafter.draft_tokens(logits), np.int64)[: n_rows - 1])
        return _sample_rows(drafter.target.be, logits[1:], params, rng)
    logits, hidden = cache.forward_block(anchor, s, n_rows=n_rows, with_hidden=True)
    if not sampled:
        return DraftProposal(drafter.propose(hidden, logits, anchor))
    if not getattr(drafter, "is_dflash2", False):
        return _sample_rows(drafter.be, logits[1:], params, rng)
    q_rows = []

    def choose(i, scores):  # the selector's row i, given the path so far
        q_i = target_probs("numpy", scores, params.temperature)  # softmax(score / T)
        q_rows.append(q_i)
        return int(sample_from_probs(q_i, rng.random()))

    path = drafter.selector.select(hidden[1:], logits[1:], anchor, choose)
    return DraftProposal(path.tokens, np.stack(q_rows), path.candidates)


def _sample_rows(be, logits, params: SamplingParams, rng) -> DraftProposal:
    q = sampling_probs(be, logits, params.temperature, params.top_p, params.top_k)
    return DraftProposal(sample_from_probs(q, rng.random(q.shape[:-1])), q)


def verify_sampled(be, block, target_logits, proposal: DraftProposal, params: SamplingParams,
                   form: str, rng) -> ChainVerifyResult:
    """Sampled chain verify of ``block`` = [anchor, drafts] in ``form`` (module docstring)."""
    block = np.asarray(block, dtype=np.int64)
    p = sampling_probs(be, target_logits, params.temperature, params.top_p, params.top_k)
    if p.shape[0] != block.shape[0]:
        raise ValueError(f"target_logits has {p.shape[0]} rows, block has {block.shape[0]}")
    if form == "greedy_draft":
        a, bonus, posterior = chain_sampled_core(block, p, rng.random(block.shape[0]))
        a, bonus = int(a), int(bonus)
    else:
        if proposal.q is None:
            raise ValueError("the rejection form needs the draft distribution q")
        u_accept = rng.random(block.shape[0] - 1)
        a, bonus = rejection_core(block[1:], p, proposal.q, proposal.candidates, u_accept,
                                  rng.random())
        posterior = np.concatenate([block[1: 1 + a], [bonus]]).astype(np.int64)
    return ChainVerifyResult(a=a, accepted=tuple(int(t) for t in block[1: 1 + a]),
                             bonus=bonus, posterior=posterior)
