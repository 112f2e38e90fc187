"""Verify rules as objects: what the drafter proposes, what the target runs, what is kept.

vLLM's split is the model (proposer / scorer / sampler): the drafter proposes, the target scores
the proposal in one forward, and a *verifier* decides what is accepted. One class per rule:

- :class:`ChainVerifier`: greedy drafts (argmax rows; DFlash 2: the selector's greedy path), the
  target runs the chain, :func:`~dflash_ref.spec_decode.verify.verify_chain_greedy` decides,
  rows 0..a are kept;
- :class:`RejectionChainVerifier`: sampled drafts with their law q, the chain,
  :func:`~dflash_ref.spec_decode.verify.verify_chain_sampled` (the release's rejection sampling),
  rows 0..a;
- :class:`GreedyDraftChainVerifier`: greedy drafts, the chain, one sample per target row and a
  draft accepted on equality (the older form), rows 0..a;
- :class:`TreeVerifier`: the draft rows' top-k make a DDTree, the target runs the tree,
  :func:`~dflash_ref.spec_decode.ddtree.verify_tree` decides, the accepted path is kept;
- :class:`SampledTreeVerifier`: children drawn from the draft law, the target runs the tree,
  recursive rejection sampling (:mod:`~dflash_ref.spec_decode.tree_sampling`) decides, the
  accepted path is kept: lossless at temperature > 0.

``generate(verify="chain")`` is :class:`ChainVerifier` when greedy and
:class:`RejectionChainVerifier` when sampled, ``verify="tree"`` is :class:`TreeVerifier` with the
authors' options when greedy and :class:`SampledTreeVerifier` when sampled
(:func:`make_verifier`, the one place a verify-mode string is read). Any
:class:`Verifier` instance can be passed instead, so a new rule is one new class plus its tests:
the loop and :mod:`dflash_ref.oracle` only call the interface below.

**The interface.** A verifier is built once per ``generate`` call; per speculative step the loop
calls ``block = v.draft(ctx)``, runs the target on ``block`` (``block.forward``), then
``result = v.verify(block, logits, ctx)`` and ``v.keep(state, ctx.position, result)``. ``ctx`` is
the step's :class:`~dflash_ref.spec_decode.drafting.DraftingContext`, all a rule sees of the
request (it holds no reference back to it):

- ``ctx.anchor``, ``ctx.position`` (its position s), ``ctx.block_size`` (the step's block
  size), ``ctx.remaining`` (tokens still wanted), ``ctx.sampling``
  (:class:`~dflash_ref.ops.sampling.SamplingParams`), ``ctx.rng`` (the draws' generator; None
  when greedy), ``ctx.be``;
- ``ctx.propose(block_size, law)``: the drafter's :class:`~dflash_ref.ops.sampling.DraftProposal`
  for a ``block_size`` block (greedy drafts for ``law=None``, else sampled from ``law``);
- ``ctx.draft_logits()``: the drafter's logits over its trained block [Bd, V].

A result has ``a`` (accepted drafts), ``committed`` (accepted drafts then the bonus) and
``bonus_row`` (the verify row whose logits chose the bonus: what a gate reads next).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dflash_ref.errors import ConfigError
from dflash_ref.ops.sampling import DraftProposal, SamplingParams, sampling_probs
from dflash_ref.spec_decode.ddtree import DDTree, DDTreeOptions, build_ddtree, verify_tree
from dflash_ref.spec_decode.drafting import DraftingContext
from dflash_ref.spec_decode.tree_sampling import draw_sampled_tree, verify_tree_sampled
from dflash_ref.spec_decode.verify import (
    ChainVerifyResult,
    chain_sampled_core,
    verify_chain_greedy,
    verify_chain_sampled,
)

VERIFY_MODES = ("chain", "tree")
DRAFT_ROWS = ("trained", "verify")


# ---------------------------------------------------------------------------------------------
# What the target runs.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class ChainBlock:
    """Tokens [n] run at consecutive positions with a causal mask: a verify block
    ``[anchor, d_1 .. d_{n-1}]`` (with the ``proposal`` it came from), a prompt, or an anchor."""

    tokens: np.ndarray
    proposal: DraftProposal | None = None
    parents = None  # a chain has no tree

    def positions(self, start: int) -> np.ndarray:
        """[n] ``start .. start+n-1``."""
        return start + np.arange(len(self.tokens))

    def forward(self, target, state, tap=None, logits_rows=None):
        """The target's forward over the block (``TargetModel.forward``)."""
        return target.forward(self.tokens, state, tap=tap, logits_rows=logits_rows)


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


# ---------------------------------------------------------------------------------------------
# The rules.
# ---------------------------------------------------------------------------------------------


class Verifier:
    """The interface every verify rule implements (module docstring)."""

    def check(self, sampling: SamplingParams, block_size: int, trained_block_size: int) -> None:
        """Refuse a run this rule cannot verify (a :class:`~dflash_ref.errors.ConfigError`
        naming the fix). ``block_size`` the run's; ``trained_block_size`` the drafter's."""

    def draft(self, ctx: DraftingContext):
        """Ask ``ctx`` for this step's block (a :class:`ChainBlock` or :class:`TreeBlock`)."""
        raise NotImplementedError

    def verify(self, block, logits, ctx: DraftingContext):
        """The decision on the target's ``logits`` for ``block`` (host values)."""
        raise NotImplementedError

    def keep(self, state, start: int, result) -> None:
        """Keep what ``result`` accepted in the target ``state`` (the block ran at ``start``)."""
        raise NotImplementedError


def _block_too_wide(block_size: int, trained_block_size: int) -> ConfigError:
    return ConfigError(
        f"block_size {block_size} exceeds the drafter's trained block size "
        f"{trained_block_size}; to draft past it "
        f"anyway (positions the drafter never saw in training), verify with a chain that drafts "
        f"exactly the verify block: verify=ChainVerifier(draft_rows='verify') (at temperature > "
        f"0: RejectionChainVerifier(draft_rows='verify'))")


@dataclass(frozen=True)
class ChainVerifier(Verifier):
    """Greedy chain verify: argmax drafts, accept the prefix the target's argmax agrees with.

    Attributes:
        draft_rows: "trained" drafts ``block_size`` rows (at most the drafter's
            ``trained_block_size``); "verify" drafts exactly the verify block,
            ``min(block_size, remaining + 1)`` rows, as the release's ``verify_size``
            (acceptance lengths then match the release's; a ``block_size`` above the trained
            one drafts positions never trained on, still lossless).
    """

    draft_rows: str = "trained"

    def __post_init__(self):
        if self.draft_rows not in DRAFT_ROWS:
            raise ConfigError(f"draft_rows={self.draft_rows!r} is unknown; expected one of "
                              f"{DRAFT_ROWS}")

    def draft_law(self, sampling: SamplingParams) -> SamplingParams | None:
        """What the drafter must propose: None, greedy drafts."""
        return None

    def check(self, sampling, block_size, trained_block_size) -> None:
        if not sampling.greedy:
            raise ConfigError("ChainVerifier verifies greedy decoding; at temperature > 0 use "
                              "verify='chain' or RejectionChainVerifier()")
        self.check_rows(block_size, trained_block_size)

    def check_rows(self, block_size: int, trained_block_size: int) -> None:
        """Past the trained block only with ``draft_rows="verify"``."""
        if block_size > trained_block_size and self.draft_rows != "verify":
            raise _block_too_wide(block_size, trained_block_size)

    def draft(self, ctx: DraftingContext) -> ChainBlock:
        """2b. ``[anchor, d_1 .. d_{n-1}]`` from the drafter's proposal under :meth:`draft_law`:
        n = the block size, or with ``draft_rows="verify"`` the release's ``verify_size``."""
        block_size = ctx.block_size
        if self.draft_rows == "verify":
            block_size = min(block_size, ctx.remaining + 1)
        proposal = ctx.propose(block_size, self.draft_law(ctx.sampling))
        drafts = proposal.tokens[: block_size - 1]  # [n-1]
        tokens = np.concatenate([[ctx.anchor], drafts]).astype(np.int64)  # [n]
        return ChainBlock(tokens, proposal)

    def verify(self, block: ChainBlock, logits, ctx: DraftingContext) -> ChainVerifyResult:
        return verify_chain_greedy(ctx.be, block.tokens, logits)

    def keep(self, state, start: int, result) -> None:
        """Rows 0..a: KV truncated, features of the kept rows, GDN rewound."""
        state.rollback(start + result.a + 1)


@dataclass(frozen=True)
class RejectionChainVerifier(ChainVerifier):
    """Sampled chain verify as the release does it (:func:`verify_chain_sampled`): sampled drafts
    ``d_j ~ q_j``, accept with probability ``min(1, p/q)``, the bonus from the residual. At
    T < 1e-5 it is :class:`ChainVerifier`."""

    def draft_law(self, sampling: SamplingParams) -> SamplingParams | None:
        """Drafts sampled from ``sampling`` (None when it is greedy)."""
        return None if sampling.greedy else sampling

    def check(self, sampling, block_size, trained_block_size) -> None:
        self.check_rows(block_size, trained_block_size)

    def verify(self, block: ChainBlock, logits, ctx: DraftingContext) -> ChainVerifyResult:
        return verify_chain_sampled(ctx.be, block.tokens, logits, block.proposal, ctx.sampling,
                                    ctx.rng)


@dataclass(frozen=True)
class GreedyDraftChainVerifier(ChainVerifier):
    """The older sampled form (z-lab @44947fb): greedy drafts, one token sampled per target row
    from ``sampling_probs`` (n uniforms), a draft accepted iff it equals the sampled token
    (:func:`~dflash_ref.spec_decode.verify.chain_sampled_core`); lossless too. Greedy at
    T < 1e-5."""

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


@dataclass(frozen=True)
class TreeVerifier(Verifier):
    """DDTree, greedy (liranringel/ddtree ``ddtree.py``; :mod:`~dflash_ref.spec_decode.ddtree`):
    a best-first tree over the draft rows 1..B-1, one target pass with an ancestor-only mask,
    the verified path kept.

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
            raise _block_too_wide(block_size, trained_block_size)

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

    def check(self, sampling, block_size, trained_block_size) -> None:
        if sampling.greedy:
            raise ConfigError("SampledTreeVerifier verifies sampled decoding (temperature > 0); "
                              "when greedy use verify='tree' (DDTree)")
        if block_size > trained_block_size:
            raise _block_too_wide(block_size, trained_block_size)

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


def make_verifier(verify, sampling: SamplingParams) -> Verifier:
    """``generate``'s ``verify`` as a :class:`Verifier`: "chain", "tree" or a verifier itself.

    The one place a verify-mode string is read: "chain" is :class:`ChainVerifier` when
    ``sampling`` is greedy, else :class:`RejectionChainVerifier`; "tree" is :class:`TreeVerifier`
    when greedy, else :class:`SampledTreeVerifier`.
    """
    if isinstance(verify, Verifier):
        return verify
    if verify == "chain":
        return ChainVerifier() if sampling.greedy else RejectionChainVerifier()
    if verify == "tree":
        return TreeVerifier() if sampling.greedy else SampledTreeVerifier()
    raise unknown_verify_mode(verify)


def unknown_verify_mode(verify) -> ConfigError:
    """The error for a ``verify`` that is neither a mode name nor a :class:`Verifier`."""
    return ConfigError(f"verify={verify!r} is unknown; expected one of {VERIFY_MODES} or a "
                       f"Verifier (dflash_ref.spec_decode.verifiers)")
