"""The sampled verify rule of a DFlash server with one planted bug each, as ``Verifier`` classes
run by dflash-ref's own loop (tests/conform/server.py serves them).

``Planted(bug=None)`` is the correct rule, the release's (``RejectionChainVerifier``): drafts
``d_j ~ q_j``, each accepted with probability ``min(1, p/q)``, the bonus from the renormalised
residual ``max(p - q, 0)``; the server runs it in llama-server's draft window
(``ServerDraftWindow``, dflash_ref/oracle/conform_reference.py). Each bug below is that rule
with one thing wrong, as reported on public trackers (docs/conformance.md):

| name | what is wrong |
|---|---|
| ``draft_ignores_temperature`` | drafts: the drafter's argmax at any T; the ratio uses q at T |
| ``bonus_from_q`` | after a rejection the bonus is drawn from q, not from the residual |
| ``residual_not_renormalised`` | inverse CDF on ``max(p - q, 0)`` without dividing by its sum |
| ``top_p_after_ratio`` | the ratio uses p before top-p; top-p is applied to the residual only |
| ``independent_rows`` | every verify row sampled independently and all emitted, as accepted |
| ``biased_tree`` | the drafter's top-3 at depth 1 as children, ``min(1, p/q)`` in turn |
| ``off_by_one`` | the rejected draft is emitted as accepted, the bonus drawn after it |

A bug changes only sampled steps (greedy runs are the correct rule's), except ``off_by_one``,
which emits the rejected draft at T = 0 too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dflash_ref.ops.sampling import DraftProposal, sample_from_probs, sampling_probs
from dflash_ref.spec_decode.verifiers import RejectionChainVerifier
from dflash_ref.spec_decode.verify import ChainVerifyResult, verify_chain_greedy

TREE_WIDTH = 3  # children of the biased tree rule


def _p(ctx, logits, top_p=None) -> np.ndarray:
    """[n, V] the run's law of the target rows (``top_p``: another top-p)."""
    s = ctx.sampling
    return sampling_probs(ctx.be, logits, s.temperature, s.top_p if top_p is None else top_p,
                          s.top_k)


def _result(drafts, a: int, bonus: int) -> ChainVerifyResult:
    return ChainVerifyResult(a, tuple(int(t) for t in drafts[:a]), int(bonus),
                             np.zeros(0, np.int64))


def _accepted(drafts, p, q, rng) -> int:
    """The accepted prefix of rejection sampling: d_j kept while ``u q(d_j) < p(d_j)``."""
    a = 0
    while a < len(drafts) and rng.random() * q[a, drafts[a]] < p[a, drafts[a]]:
        a += 1
    return a


def _residual_draw(p_row, q_row, u) -> int:
    res = np.maximum(p_row - q_row, 0.0)
    return int(sample_from_probs(res if res.sum() > 0 else p_row, u))


@dataclass(frozen=True)
class Planted(RejectionChainVerifier):
    """The correct rule, written out (``bug=None``), or with the named ``bug``."""

    bug: str | None = None

    def draft(self, ctx):
        block = super().draft(ctx)
        if self.bug != "draft_ignores_temperature" or ctx.sampling.greedy or \
                len(block.tokens) == 1:
            return block
        n = len(block.tokens)
        rows = ctx.draft_logits()[1:n]  # [n-1, V] the drafter's block rows
        drafts = np.argmax(rows, axis=-1).astype(np.int64)  # ignores T
        q = _p(ctx, rows)  # what the verifier believes the drafts came from
        return type(block)(np.concatenate([[ctx.anchor], drafts]).astype(np.int64),
                           DraftProposal(drafts, q))

    def verify(self, block, logits, ctx):
        drafts = np.asarray(block.tokens[1:], np.int64)
        if ctx.sampling.greedy:
            res = verify_chain_greedy(ctx.be, block.tokens, logits)
            if self.bug == "off_by_one" and res.a < len(drafts):
                return _result(drafts, res.a + 1, np.argmax(np.asarray(logits)[res.a + 1]))
            return res
        p = _p(ctx, logits)  # [n, V]
        if not len(drafts):  # no draft fits (llama-server's window): a plain step
            return _result(drafts, 0, sample_from_probs(p[0], ctx.rng.random()))
        q = np.asarray(block.proposal.q, np.float64).reshape(len(drafts), -1)  # [n-1, V]
        rng, m = ctx.rng, len(drafts)
        if self.bug == "independent_rows":
            rows = [int(sample_from_probs(p[j], rng.random())) for j in range(m + 1)]
            return ChainVerifyResult(m, tuple(rows[:m]), rows[m], np.zeros(0, np.int64))
        if self.bug == "biased_tree":
            return self._tree(p, q, rng)
        p_ratio = _p(ctx, logits, top_p=1.0) if self.bug == "top_p_after_ratio" else p
        a = _accepted(drafts, p_ratio, q, rng)
        if a == m:
            return _result(drafts, a, sample_from_probs(p[m], rng.random()))
        if self.bug == "off_by_one":
            return _result(drafts, a + 1, sample_from_probs(p[a + 1], rng.random()))
        if self.bug == "bonus_from_q":
            return _result(drafts, a, sample_from_probs(q[a], rng.random()))
        if self.bug == "residual_not_renormalised":
            cdf = np.cumsum(np.maximum(p[a] - q[a], 0.0))
            return _result(drafts, a, min(np.searchsorted(cdf, rng.random(), side="right"),
                                          cdf.shape[0] - 1))
        return _result(drafts, a, _residual_draw(p[a], q[a], rng.random()))

    @staticmethod
    def _tree(p, q, rng) -> ChainVerifyResult:
        """Children: q's top TREE_WIDTH at depth 1 (deterministic); each accepted with
        ``min(1, r/q)``, r <- norm(max(r - q, 0)) after a rejection; the accepted child (or a
        draw from r) is the step's one token."""
        r = p[0]
        for c in np.argsort(-q[0], kind="stable")[:TREE_WIDTH]:
            if rng.random() * q[0, c] < r[c]:
                return ChainVerifyResult(0, (), int(c), np.zeros(0, np.int64))
            res = np.maximum(r - q[0], 0.0)
            r = res / res.sum() if res.sum() > 0 else r
        return ChainVerifyResult(0, (), int(sample_from_probs(r, rng.random())),
                                 np.zeros(0, np.int64))


BUGS = ("draft_ignores_temperature", "bonus_from_q", "residual_not_renormalised",
        "top_p_after_ratio", "independent_rows", "biased_tree", "off_by_one")
