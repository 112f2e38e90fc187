"""What a verifier drafts from: the step's data and the proposer, handed over as one object.

vLLM's proposer, scorer and sampler exchange small data objects and none calls back into the
worker that drives it. Here, each speculative step the request builds a :class:`DraftingContext`
(the anchor, its position, the step's block size, the tokens still wanted, the sampling law, its
generator, the backend) around the request's :class:`Proposer` (the drafter, its cache over the
target state's features, and the observer and clock that watch a draft), and hands it to the
verifier: ``block = verifier.draft(ctx)`` asks ``ctx.propose(block_size, law)`` or
``ctx.draft_logits()``, and ``verifier.verify(block, logits, ctx)`` reads its sampling law,
generator and backend. Neither reaches the request (:mod:`~dflash_ref.spec_decode.decoding`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dflash_ref.errors import ConfigError
from dflash_ref.ops.sampling import DraftProposal, SamplingParams


class Proposer:
    """The drafter and its cache of context K/V, drafting over a target state's features.

    Each draft first extends the cache with the features of the positions committed since the
    last one (``[cache.length, s)``), then runs the block ``[anchor, MASK x (n-1)]`` at positions
    ``s .. s+n-1``. The clock times both as "draft"; the observer sees the context rows and the
    block's logits.

    Args:
        drafter: a DFlash drafter bound to the target that made ``state``.
        state: the request's target state (its ``features`` are the drafter's context).
        block_size: the run's block size B (a step's rows; a verifier may draft fewer).
        observer, clock: the request's observer and clock.
    """

    def __init__(self, drafter, state, block_size: int, observer, clock):
        self.drafter, self.state, self.block_size = drafter, state, block_size
        self.observer, self.clock = observer, clock
        self.cache = drafter.cache_for(state)
        if state.features is None:
            raise ConfigError("the target captures no features; bind the drafter first "
                              "(DFlashDrafter.from_pretrained(path, target) sets "
                              "target_layer_ids)")

    def propose(self, anchor: int, position: int, block_size: int, law: SamplingParams | None,
                rng) -> DraftProposal:
        """The drafter's proposal d_1 .. d_{n-1} for ``[anchor, MASK x (n-1)]`` at positions
        ``position ..`` (n = ``block_size``): greedy drafts for ``law=None``, else sampled from
        ``law`` with ``rng``."""
        with self.clock.phase("draft"):
            self.extend(position)
            logits, hidden = self.cache.forward_block(anchor, position, block_size,
                                                      with_hidden=True)  # [n, V], [n, H]
            proposal = self.drafter.propose(hidden, logits, anchor, law, rng)
        self.observer.on_draft(anchor, position + np.arange(block_size), logits, proposal)
        return proposal

    def draft_logits(self, anchor: int, position: int):
        """The drafter's logits [Bd, V] over its trained block ``[anchor, MASK x (Bd-1)]``."""
        with self.clock.phase("draft"):
            self.extend(position)
            logits = self.cache.forward_block(anchor, position)  # [Bd, V]
        self.observer.on_draft(anchor, position + np.arange(logits.shape[0]), logits, None)
        return logits

    def extend(self, position: int) -> None:
        """The features of positions committed since the last draft (up to ``position``, the
        anchor's, excluded) join the drafter's context."""
        start = self.cache.length
        features = self.state.features.rows(start, position)  # [n, C*H]
        positions = np.arange(start, position)  # [n]
        self.observer.on_draft_context(features, positions)
        self.cache.extend(features, positions)


@dataclass(frozen=True)
class DraftingContext:
    """One speculative step as a verifier sees it: its data, and the proposer that drafts.

    Attributes:
        anchor: t_s, the newest emitted token (not yet run by the target).
        position: s, the anchor's position.
        block_size: the step's block size B (rows of a verify chain: the anchor and B-1 drafts).
        remaining: tokens still wanted (the release's ``verify_size`` is ``remaining + 1``).
        sampling: the run's :class:`~dflash_ref.ops.sampling.SamplingParams`.
        rng: the generator of the run's draws (None when greedy: greedy draws nothing).
        be: the Backend of the target's logits.
        proposer: the request's :class:`Proposer`.
    """

    anchor: int
    position: int
    block_size: int
    remaining: int
    sampling: SamplingParams
    rng: np.random.Generator | None
    be: object
    proposer: Proposer

    def propose(self, block_size: int, law: SamplingParams | None) -> DraftProposal:
        """The drafter's :class:`~dflash_ref.ops.sampling.DraftProposal` for a ``block_size``
        block at the anchor: greedy drafts for ``law=None``, else sampled from ``law``."""
        return self.proposer.propose(self.anchor, self.position, block_size, law, self.rng)

    def draft_logits(self):
        """The drafter's logits [Bd, V] over its trained block at the anchor."""
        return self.proposer.draft_logits(self.anchor, self.position)
