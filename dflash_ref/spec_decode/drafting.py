"""What a verifier drafts from: the step's data and the proposer, handed over as one object.

Each speculative step the request hands the verifier a :class:`DraftingContext` around its
:class:`Proposer`; the verifier drafts through it and reaches nothing of the request (vLLM's
proposer, scorer and sampler exchange data objects the same way).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from dflash_ref.errors import ConfigError
from dflash_ref.ops.sampling import DraftProposal, SamplingParams


class Proposer:
    """The drafter and its cache of context K/V over the target ``state``'s features: each draft
    extends the cache with the positions committed since the last (``[cache.length, s)``), then
    runs ``[anchor, MASK x (n-1)]`` at ``s .. s+n-1``, timed as "draft". ``block_size``: the
    run's B (a verifier may draft fewer rows)."""

    def __init__(self, drafter, state, block_size: int, observer, clock):
        self.drafter, self.state, self.block_size = drafter, state, block_size
        self.observer, self.clock = observer, clock
        self.cache = drafter.cache_for(state)
        if state.features is None:
            raise ConfigError("the target captures no features; bind the drafter first "
                              "(DFlashDrafter.from_pretrained(path, target) sets "
                              "target_layer_ids)")

    def propose(self, anchor: int, position: int, block_size: int, law: SamplingParams | None,
                rng, scored: int | None = None) -> DraftProposal:
        """The drafter's proposal d_1 .. d_{n-1} (n = ``block_size``): greedy for ``law=None``,
        else sampled from ``law`` with ``rng``; ``scored=top_k``: with ``p_draft``, the
        drafter's probability of each draft over its row's ``top_k`` best."""
        with self.clock.phase("draft"):
            self.extend(position)
            logits, hidden = self.cache.forward_block(anchor, position, block_size,
                                                      with_hidden=True)  # [n, V], [n, H]
            proposal = self.drafter.propose(hidden, logits, anchor, law, rng)
            if scored is not None:
                proposal = replace(proposal, p_draft=self.drafter.draft_probs(
                    logits, proposal.tokens, scored))
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
        """The features of positions committed since the last draft, up to the anchor's
        excluded, join the drafter's context."""
        start = self.cache.length
        features = self.state.features.rows(start, position)  # [n, C*H]
        positions = np.arange(start, position)  # [n]
        self.observer.on_draft_context(features, positions)
        self.cache.extend(features, positions)


@dataclass(frozen=True)
class DraftingContext:
    """One speculative step as a verifier sees it: the ``anchor`` t_s at ``position`` s, the
    step's ``block_size`` B (a chain's rows: the anchor and B-1 drafts), the tokens still wanted
    (``remaining``; the release's ``verify_size`` is ``remaining + 1``), the run's ``sampling``
    law and the generator of its draws (``rng``, None when greedy), the backend ``be`` of the
    target's logits, and the request's ``proposer``."""

    anchor: int
    position: int
    block_size: int
    remaining: int
    sampling: SamplingParams
    rng: np.random.Generator | None
    be: object
    proposer: Proposer

    def propose(self, block_size: int, law: SamplingParams | None,
                scored: int | None = None) -> DraftProposal:
        """The drafter's ``DraftProposal`` for a ``block_size`` block at the anchor
        (``scored=top_k``: with ``p_draft``)."""
        return self.proposer.propose(self.anchor, self.position, block_size, law, self.rng,
                                     scored)

    def draft_logits(self):
        """The drafter's logits [Bd, V] over its trained block at the anchor."""
        return self.proposer.draft_logits(self.anchor, self.position)
