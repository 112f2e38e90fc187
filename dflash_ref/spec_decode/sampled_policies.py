"""Sampled verify policies the field uses, beside the package's own (docs/lossless.md tabulates
which are lossless and what each costs):

- :class:`OneHotRejectionChainVerifier`: argmax drafts, each with the one-hot law ``q = e_d``,
  verified by the release's rejection rule (the z-lab/dflash MLX port's proposal for v1 drafts
  under sampling). Accepting ``d`` with probability ``min(1, p(d) / 1) = p(d)`` and drawing the
  bonus from ``norm(max(p - e_d, 0))`` (p without d, renormalised) is speculative sampling with
  a draft law that is a point mass: lossless.
- :class:`DDTreeSampleMatchVerifier`: DDTree's deterministic top-k tree (the greedy builder),
  one token drawn from the target's law at every node, the walk follows the child whose token
  matches and takes the first miss as the bonus (lucebox's sampled tree verify). Every committed
  token is a draw from the target's law given the path: lossless.
- :class:`TopKRatioTreeVerifier`: the same deterministic tree verified by the recursive
  ``min(1, r/q)`` rule of :func:`~dflash_ref.spec_decode.tree_sampling.verify_tree_sampled`,
  as if its children had been drawn from ``q``. They were not (the first child is proposed with
  probability 1, not ``q(c)``), so the rule over-accepts it: **not lossless** (the hipfire
  counterexample). It is kept as the case the lossless certificate must reject
  (tests/testing/test_policies_certified.py), and to measure what its extra acceptance is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dflash_ref.ops.sampling import DraftProposal, sample_from_probs, sampling_probs
from dflash_ref.spec_decode.ddtree import (
    DDTree,
    TreeVerifyResult,
    build_ddtree,
    follow_verified_tree,
)
from dflash_ref.spec_decode.drafting import DraftingContext
from dflash_ref.spec_decode.extra_verifiers import SampledTreeBlock, TreeBlock, TreeVerifier
from dflash_ref.spec_decode.tree_sampling import verify_tree_sampled
from dflash_ref.spec_decode.verifiers import ChainBlock, RejectionChainVerifier, block_too_wide


@dataclass(frozen=True)
class OneHotRejectionChainVerifier(RejectionChainVerifier):
    """Argmax drafts with one-hot ``q``, the release's rejection rule (module docstring)."""

    def draft(self, ctx: DraftingContext) -> ChainBlock:
        """Argmax drafts; the proposal's ``q`` is 1 on each draft (the sparse form: one
        candidate per row)."""
        block_size = self.drafted_rows(ctx)
        drafts = np.asarray(ctx.propose(block_size, None).tokens[: block_size - 1], np.int64)
        one_hot = DraftProposal(drafts, np.ones((drafts.shape[0], 1)), drafts[:, None])
        return ChainBlock(np.concatenate([[ctx.anchor], drafts]).astype(np.int64), one_hot)


def sample_match_walk(tree: DDTree, p, u) -> TreeVerifyResult:
    """Lucebox's sampled walk: ``x_i ~ p[i]`` at every node (by inverse CDF on ``u[i]``), then
    :func:`~dflash_ref.spec_decode.ddtree.follow_verified_tree` on those draws.

    Args:
        tree: the verified tree.
        p: [N, V] the target's sampling law at each node.
        u: [N] uniforms in [0, 1).
    """
    return follow_verified_tree(tree, sample_from_probs(np.asarray(p), np.asarray(u)))


class _SampledDDTree(TreeVerifier):
    """DDTree's tree, verified at any temperature (greedy: :class:`TreeVerifier`'s walk)."""

    def check(self, sampling, block_size, trained_block_size) -> None:
        if block_size > trained_block_size:
            raise block_too_wide(block_size, trained_block_size)

    def target_law(self, logits, ctx: DraftingContext) -> np.ndarray:
        """[N, V] the target's sampling law at each node."""
        law = ctx.sampling
        return sampling_probs(ctx.be, logits, law.temperature, law.top_p, law.top_k)


@dataclass(frozen=True)
class DDTreeSampleMatchVerifier(_SampledDDTree):
    """DDTree's tree, one target draw per node, follow the matching child (module docstring)."""

    def verify(self, block: TreeBlock, logits, ctx: DraftingContext):
        if ctx.sampling.greedy:
            return super().verify(block, logits, ctx)
        p = self.target_law(logits, ctx)  # [N, V]
        return sample_match_walk(block.tree, p, ctx.rng.random(block.tree.n_nodes))


@dataclass(frozen=True)
class TopKRatioTreeVerifier(_SampledDDTree):
    """DDTree's deterministic children verified by the ``min(1, r/q)`` recursion: biased, the
    certificate's counterexample (module docstring)."""

    def draft(self, ctx: DraftingContext) -> SampledTreeBlock:
        """DDTree's tree over the drafter's rows 1..B-1, with their law ``q`` [L, V]."""
        law = ctx.sampling
        rows = ctx.draft_logits()[1:ctx.block_size]  # [L, V]
        tree = build_ddtree(ctx.be, ctx.anchor, rows, self.options)
        if law.greedy:
            return SampledTreeBlock(tree)
        q = sampling_probs(ctx.be, rows, law.temperature, law.top_p, law.top_k, role="draft")
        return SampledTreeBlock(tree, q)

    def verify(self, block: SampledTreeBlock, logits, ctx: DraftingContext):
        if ctx.sampling.greedy:
            return super().verify(block, logits, ctx)
        return verify_tree_sampled(block.tree, self.target_law(logits, ctx), block.q, ctx.rng)
