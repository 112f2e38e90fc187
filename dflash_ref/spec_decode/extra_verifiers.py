"""Verify rules off the default path: DDTree, the sampled tree, and the older sampled chain.

Each implements :class:`~dflash_ref.spec_decode.verifiers.Verifier` (that module's docstring
says what the loop calls and what a result holds):

- :class:`TreeVerifier`: the draft rows' top-k make a DDTree (liranringel/ddtree ``ddtree.py``;
  :mod:`~dflash_ref.spec_decode.ddtree`), the target runs it in one pass with an ancestor-only
  mask, :func:`~dflash_ref.spec_decode.ddtree.verify_tree` decides, the accepted path is kept;
- :class:`SampledTreeVerifier`: children drawn from the draft law, recursive rejection sampling
  (:mod:`~dflash_ref.spec_decode.tree_sampling`) decides, the path is kept: lossless at T > 0;
- :class:`GreedyDraftChainVerifier`: greedy drafts, one token sampled per target row, a draft
  accepted iff it equals it (:func:`chain_sampled_core`), rows 0..a kept: lossless too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dflash_ref.errors import ConfigError
from dflash_ref.ops.sampling import SamplingParams, sample_from_probs, sampling_probs
from dflash_ref.spec_decode.ddtree import DDTree, DDTreeOptions, build_ddtree, verify_tree
from dflash_ref.spec_decode.drafting import DraftingContext
from dflash_ref.spec_decode.tree_sampling import draw_sampled_tree, verify_tree_sampled
from dflash_ref.spec_decode.verifiers import ChainBlock, ChainVerifier, Verifier, block_too_wide
from dflash_ref.spec_decode.verify import ChainVerifyResult, accept_length, verify_chain_greedy


def chain_sampled_core(block, probs, u) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Greedy drafts checked against sampled target rows, batched.

    ``posterior[j] ~ probs[j]`` independently for every row (drawn with ``u[j]`` by
    :func:`~dflash_ref.ops.sampling.sample_from_probs`); ``a`` =
    :func:`~dflash_ref.spec_decode.verify.accept_length`; ``bonus = posterior[a]``. With a
    one-hot draft law this is the rejection rule's distribution: row j matches d with
    probability ``p_j(d)`` (the acceptance probability), and given that it does not, its token
    is ``p_j`` restricted to tokens != d, renormalised (the residual), so

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


@dataclass(frozen=True)
class GreedyDraftChainVerifier(ChainVerifier):
    """The older sampled form of z-lab/dflash: greedy drafts, one token sampled per target row
    from ``sampling_probs`` (n uniforms), a draft accepted iff it equals the sampled token
    (:func:`chain_sampled_core`); lossless too. Greedy at T < 1e-5."""

    def check(self, sampling, block_size, trained_block_size) -> None:
        self.check_rows(block_size, trained_block_size)

    def verify(self, block: ChainBlock, logits, ctx: DraftingContext) -> ChainVerifyResult:
        law = ctx.sampling
        if law.greedy:
            return verify_chain_greedy(ctx.be, block.tokens, logits)
        p = sampling_probs(ctx.be, logits, law.temperature, law.top_p, law.top_k)  # [n, V]
        n = len(block.tokens)
        if p.shape[0] != n:
            raise ValueError(f"target_logits has {p.shape[0]} rows, block has {n}")
        a, bonus, posterior = chain_sampled_core(block.tokens, p, ctx.rng.random(n))
        a = int(a)
        return ChainVerifyResult(a=a, accepted=tuple(int(t) for t in block.tokens[1: 1 + a]),
                                 bonus=int(bonus), posterior=posterior)


@dataclass(frozen=True, eq=False)
class TreeBlock:
    """A DDTree run in one pass, each node at ``start + depth`` seeing its ancestors."""

    tree: DDTree

    @property
    def tokens(self) -> np.ndarray:
        """[N] the node tokens, root first."""
        return self.tree.tokens

    @property
    def parents(self) -> np.ndarray:
        """[N] parent node of each node, -1 for the root."""
        return self.tree.parents

    def positions(self, start: int) -> np.ndarray:
        """[N] ``start + depth``."""
        return self.tree.positions(start)

    def forward(self, target, state, tap=None, logits_rows=None):
        """``TargetModel.forward_tree`` (it takes no tap and returns every node's logits)."""
        return target.forward_tree(self.tree.tokens, self.tree.parents, state)


@dataclass(frozen=True)
class TreeVerifier(Verifier):
    """DDTree, greedy: a best-first tree over the draft rows 1..B-1, one target pass with an
    ancestor-only mask, the verified path kept.

    Attributes:
        options: how the tree is built (the authors' defaults; ``DDTreeOptions.lucebox()``).
    """

    options: DDTreeOptions = field(default_factory=DDTreeOptions)

    def check(self, sampling, block_size, trained_block_size) -> None:
        if not sampling.greedy:
            raise ConfigError("TreeVerifier (DDTree's top-k tree) verifies greedy decoding; at "
                              "temperature > 0 use verify='tree' (SampledTreeVerifier: drawn "
                              "children, recursive rejection sampling) or verify='chain'")
        if block_size > trained_block_size:
            raise block_too_wide(block_size, trained_block_size)

    def draft(self, ctx: DraftingContext) -> TreeBlock:
        """2b. The tree over the drafter's rows 1..B-1 (its trained block is drafted)."""
        rows = ctx.draft_logits()[1:ctx.block_size]  # [B-1, V]
        return TreeBlock(build_ddtree(ctx.be, ctx.anchor, rows, self.options))

    def verify(self, block: TreeBlock, logits, ctx: DraftingContext):
        return verify_tree(ctx.be, block.tree, logits)

    def keep(self, state, start: int, result) -> None:
        """The path's KV rows, features and GDN state, as if it had run as a chain."""
        state.commit_path(result.path)


@dataclass(frozen=True, eq=False)
class SampledTreeBlock(TreeBlock):
    """A drawn tree and the draft law ``q`` [L, V] its children were drawn from."""

    q: np.ndarray | None = None


@dataclass(frozen=True)
class SampledTreeVerifier(Verifier):
    """Lossless tree verify at T > 0 (:mod:`~dflash_ref.spec_decode.tree_sampling`): children
    drawn from the drafter's sampling law, verified by recursive rejection sampling.

    Attributes:
        widths: children drawn per node at depths 1, 2, ..; deeper depths get 1 (a chain under
            each node). (2, 2) over a block of 8 is a 26-node tree.
        replacement: draw children i.i.d. (SpecInfer) instead of without replacement (the
            default: no repeated child wastes a row).
    """

    widths: tuple[int, ...] = (2, 2)
    replacement: bool = False

    def __post_init__(self):
        if not self.widths or any(int(w) < 1 for w in self.widths):
            raise ConfigError(f"SampledTreeVerifier widths must be integers >= 1 (children per "
                              f"node at depths 1, 2, ..), got {self.widths!r}; e.g. (2, 2)")

    def check(self, sampling: SamplingParams, block_size, trained_block_size) -> None:
        if sampling.greedy:
            raise ConfigError("SampledTreeVerifier verifies sampled decoding (temperature > 0); "
                              "when greedy use verify='tree' (DDTree)")
        if block_size > trained_block_size:
            raise block_too_wide(block_size, trained_block_size)

    def draft(self, ctx: DraftingContext) -> SampledTreeBlock:
        """2b. The drafter's rows 1..B-1 as laws q, children drawn from them."""
        law = ctx.sampling
        q = sampling_probs(ctx.be, ctx.draft_logits()[1:ctx.block_size], law.temperature,
                           law.top_p, law.top_k, role="draft")  # [L, V]
        tree = draw_sampled_tree(ctx.anchor, q, self.widths, ctx.rng, self.replacement)
        return SampledTreeBlock(tree, q)

    def verify(self, block: SampledTreeBlock, logits, ctx: DraftingContext):
        law = ctx.sampling
        p = sampling_probs(ctx.be, logits, law.temperature, law.top_p, law.top_k)  # [N, V]
        return verify_tree_sampled(block.tree, p, block.q, ctx.rng, self.replacement)

    def keep(self, state, start: int, result) -> None:
        """The path's KV rows, features and GDN state, as :class:`TreeVerifier`."""
        state.commit_path(result.path)
