"""Verify rules as objects (vLLM's proposer / scorer / sampler: a verifier decides).

Per speculative step the loop calls ``block = v.draft(ctx)`` (``ctx``: the step's
:class:`~dflash_ref.spec_decode.drafting.DraftingContext`), ``block.forward``, then
``result = v.verify(block, logits, ctx)`` and ``v.keep(state, ctx.position, result)``; a result
has ``a``, ``committed`` (the accepted drafts, then the bonus) and ``bonus_row`` (the row that
chose the bonus: what a gate reads next). Here the chain rules; the others are in
:mod:`~dflash_ref.spec_decode.extra_verifiers`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dflash_ref.errors import ConfigError
from dflash_ref.ops.sampling import DraftProposal, SamplingParams
from dflash_ref.spec_decode.drafting import DraftingContext
from dflash_ref.spec_decode.verify import (
    ChainVerifyResult,
    verify_chain_greedy,
    verify_chain_sampled,
)

DRAFT_ROWS = ("trained", "verify")


@dataclass(frozen=True, eq=False)
class ChainBlock:
    """Tokens [n] run at consecutive positions with a causal mask: a verify block
    ``[anchor, d_1 .. d_{n-1}]`` (with the ``proposal`` it came from), a prompt, or an anchor."""

    tokens: np.ndarray
    proposal: DraftProposal | None = None
    parents = None  # a chain has no tree

    def positions(self, start: int) -> np.ndarray:
        return start + np.arange(len(self.tokens))  # [n]

    def forward(self, target, state, tap=None, logits_rows=None):
        return target.forward(self.tokens, state, tap=tap, logits_rows=logits_rows)


class Verifier:
    """The interface every verify rule implements (module docstring)."""

    def check(self, sampling: SamplingParams, block_size: int, trained_block_size: int) -> None:
        """Refuse a run this rule cannot verify with a ``ConfigError`` naming the fix."""

    def draft(self, ctx: DraftingContext):
        """This step's block (a :class:`ChainBlock`, or a tree block)."""
        raise NotImplementedError

    def verify(self, block, logits, ctx: DraftingContext):
        """The decision on the target's ``logits`` for ``block`` (host values)."""
        raise NotImplementedError

    def keep(self, state, start: int, result) -> None:
        """Keep what ``result`` accepted in the target ``state`` (the block ran at ``start``)."""
        raise NotImplementedError


def block_too_wide(block_size: int, trained_block_size: int) -> ConfigError:
    """The error for a block wider than the drafter's trained block, with the fix."""
    return ConfigError(
        f"block_size {block_size} exceeds the drafter's trained block size "
        f"{trained_block_size}; to draft past it "
        f"anyway (positions the drafter never saw in training), verify with a chain that drafts "
        f"exactly the verify block: verify=ChainVerifier(draft_rows='verify') (at temperature > "
        f"0: RejectionChainVerifier(draft_rows='verify'))")


@dataclass(frozen=True)
class ChainVerifier(Verifier):
    """Greedy chain verify: argmax drafts, the prefix the target's argmax agrees with, rows 0..a.

    ``draft_rows``: "trained" drafts ``block_size`` rows (at most the trained block); "verify"
    drafts ``min(block_size, remaining + 1)``, the release's ``verify_size`` (past the trained
    block: positions never trained on, still lossless)."""

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
            raise block_too_wide(block_size, trained_block_size)

    def drafted_rows(self, ctx: DraftingContext) -> int:
        """n, the rows this step drafts: the step's block, or with ``draft_rows="verify"`` at
        most ``remaining + 1`` (the release's ``verify_size``)."""
        limit = ctx.remaining + 1 if self.draft_rows == "verify" else ctx.block_size
        return min(ctx.block_size, limit)

    def draft(self, ctx: DraftingContext) -> ChainBlock:
        """2b. ``[anchor, d_1 .. d_{n-1}]`` proposed under :meth:`draft_law`."""
        block_size = self.drafted_rows(ctx)
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
    """Sampled chain verify as the release does it (:func:`verify_chain_sampled`): drafts
    ``d_j ~ q_j``, each accepted with probability ``min(1, p/q)``, the bonus from the residual.
    At T < 1e-5 it is :class:`ChainVerifier`."""

    def draft_law(self, sampling: SamplingParams) -> SamplingParams | None:
        """Drafts sampled from ``sampling`` (None when it is greedy)."""
        return None if sampling.greedy else sampling

    def check(self, sampling, block_size, trained_block_size) -> None:
        self.check_rows(block_size, trained_block_size)

    def verify(self, block: ChainBlock, logits, ctx: DraftingContext) -> ChainVerifyResult:
        return verify_chain_sampled(ctx.be, block.tokens, logits, block.proposal, ctx.sampling,
                                    ctx.rng)
