"""The reference side of ``dflash-ref conform``: dflash-ref's target (and drafter) on the weights
a server serves, answering what :func:`dflash_ref.testing.conform.run_conform` asks.

- ``rows(prompt, tokens)``: the target run over ``prompt + tokens`` once, the logits of the rows
  that chose each token ([len(tokens), V]);
- ``next_logits(prompt, prefix)``: the row after ``prompt + prefix``; the prompt is prefilled
  once and its state snapshotted, each prefix restored from it;
- ``acceptance(prompt, n_predict, policy, seeds)``: ``generate`` with the drafter, driven as
  llama-server drives its own (:class:`ServerDraftWindow` around the chain rule the server
  runs), as (drafted, accepted) per seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dflash_ref.ops.sampling import DraftProposal, SamplingParams
from dflash_ref.spec_decode.arguments import make_verifier
from dflash_ref.spec_decode.drafting import DraftingContext
from dflash_ref.spec_decode.extra_verifiers import GreedyDraftChainVerifier
from dflash_ref.spec_decode.loop import generate
from dflash_ref.spec_decode.verifiers import ChainBlock, Verifier

DRAFT_RULES = ("sampled", "argmax")


@dataclass(frozen=True)
class ServerDraftWindow(Verifier):
    """A verifier (``inner``) drafting llama-server's draft length
    (``tools/server/server-context.cpp``, ``get_n_draft_max``): ``min(B - 1, remaining - 1)``
    drafts after the anchor, so that the accepted drafts and the bonus never pass
    ``n_predict``; no draft at all (a plain step) when none fits. ``inner`` drafts its whole
    block, as llama.cpp's DFlash does ("truncating draft to N tokens", common/speculative.cpp),
    and the block is cut to the window; ``inner`` verifies and keeps as it would."""

    inner: Verifier

    def check(self, sampling, block_size, trained_block_size) -> None:
        self.inner.check(sampling, block_size, trained_block_size)

    def draft(self, ctx: DraftingContext) -> ChainBlock:
        rows = max(1, min(ctx.block_size, ctx.remaining))  # the anchor and rows - 1 drafts
        if rows == 1:
            sampled = getattr(self.inner, "draft_law", lambda s: None)(ctx.sampling) is not None
            return ChainBlock(np.asarray([ctx.anchor], np.int64),
                              DraftProposal(np.zeros(0, np.int64),
                                            np.zeros((0, 1)) if sampled else None))
        block = self.inner.draft(ctx)  # the whole block drafted, then cut (a DFlash block is
        p = block.proposal  # non-causal: fewer masks would change every row's logits)
        cut = DraftProposal(p.tokens[: rows - 1], None if p.q is None else p.q[: rows - 1],
                            None if p.candidates is None else p.candidates[: rows - 1])
        return ChainBlock(block.tokens[:rows], cut)

    def verify(self, block, logits, ctx: DraftingContext):
        return self.inner.verify(block, logits, ctx)

    def keep(self, state, start: int, result) -> None:
        self.inner.keep(state, start, result)


class ModelReference:
    """dflash-ref's ``target`` (a ``TargetModel``) and optional ``drafter`` as the conform
    reference (module docstring); ``block_size``: the server's drafts + 1 (default: the
    drafter's trained block); ``draft_rule``: "sampled" (drafts drawn from q, rejection
    sampling) or "argmax" (argmax drafts matched against sampled rows) at T > 0."""

    def __init__(self, target, drafter=None, block_size: int | None = None,
                 draft_rule: str = "sampled"):
        self.target, self.drafter, self.draft_rule = target, drafter, draft_rule
        self.block_size = block_size or (int(drafter.block_size) if drafter else 1)
        self._prompt: tuple[int, ...] | None = None
        self._state = self._snap = self._last = None

    def rows(self, prompt, tokens) -> np.ndarray:
        ids = [*prompt, *tokens]
        if not tokens:
            return np.zeros((0, self.target.config.vocab_size))
        state = self.target.new_state()
        out = self.target.forward(np.asarray(ids[:-1], np.int64), state,
                                  logits_rows=slice(len(prompt) - 1, None))
        return np.asarray(_host(out.logits), np.float64)  # [len(tokens), V]

    def next_logits(self, prompt, prefix) -> np.ndarray:
        prompt = tuple(int(t) for t in prompt)
        if prompt != self._prompt:
            self._state = self.target.new_state()
            out = self.target.forward(np.asarray(prompt, np.int64), self._state,
                                      logits_rows=slice(-1, None))
            self._last = np.asarray(_host(out.logits)[0], np.float64)
            self._snap, self._prompt = self._state.snapshot(), prompt
        if not prefix:
            return self._last
        self._state.restore(self._snap)
        out = self.target.forward(np.asarray(prefix, np.int64), self._state,
                                  logits_rows=slice(-1, None))
        return np.asarray(_host(out.logits)[0], np.float64)  # [V]

    def acceptance(self, prompt, n_predict: int, policy, seeds) -> list[tuple[int, int]] | None:
        if self.drafter is None:
            return None
        out = []
        for seed in seeds:
            law = SamplingParams(policy.temperature, top_p=policy.top_p, top_k=policy.top_k,
                                 seed=None if policy.greedy else int(seed))
            res = generate(self.target, self.drafter, list(prompt), n_predict, sampling=law,
                           block_size=self.block_size, verify=self._verifier(law))
            out.append((int(sum(res.drafted)), int(sum(n - 1 for n in res.acceptance_lengths))))
        return out

    def _verifier(self, law: SamplingParams) -> ServerDraftWindow:
        """The chain rule the server runs (``draft_rule``), in its draft window."""
        if self.draft_rule == "argmax" and not law.greedy:
            return ServerDraftWindow(GreedyDraftChainVerifier())
        return ServerDraftWindow(make_verifier("chain", law))


def _host(x):
    return x.get() if type(x).__module__.startswith("cupy") else np.asarray(x)


__all__ = ["DRAFT_RULES", "ModelReference", "ServerDraftWindow"]
