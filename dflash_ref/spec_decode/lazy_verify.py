"""Chain verify that puts through the target's head only the rows the accepted prefix reaches.

Row j of a chain verify block ``[t_s, d_1 .. d_{n-1}]`` decides draft ``d_{j+1}`` (or gives the
bonus), so its logits are needed only if drafts 1..j were all accepted: the rows needed are
exactly 0..a. :class:`LazyChainBlock` runs the target with ``forward_head_later`` (the layers on
every row, for the K/V and the features; the head later); the verifier then asks for the rows
in groups, ``head_groups`` (sizes of successive groups, the rest in one last group), and stops
at the group holding row a::

    head_groups = (1, 1)   row 0; row 1 if d_1 was accepted; rows 2..n-1 if d_2 was too
    head_groups = ()       every row at once: ChainVerifier's cost

Lossless by construction: each row's logits are the target's (``lm_head`` acts row by row) and
the rule reads rows 0..a only, in order; the sampled form draws its uniforms as
:func:`~dflash_ref.spec_decode.verify.verify_chain_sampled` does (n-1 accept uniforms, then the
bonus's), so with the same generator it emits the same tokens. Which grouping is cheapest
depends on the head's cost per row count and on the acceptance rates: measured on Gemma 3 270M
in docs/spec_decode.md ("Verify that costs what it must"), ``scripts/verify_cost.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dflash_ref.ops.reductions import argmax_rows_checked
from dflash_ref.ops.sampling import (
    DraftProposal,
    SamplingParams,
    as_generator,
    sample_from_probs,
    sampling_probs,
)
from dflash_ref.spec_decode.drafting import DraftingContext
from dflash_ref.spec_decode.verifiers import ChainBlock, ChainVerifier, RejectionChainVerifier
from dflash_ref.spec_decode.verify import ChainVerifyResult, accept_length, residual_draw

HEAD_GROUPS = (1, 1)
"""The default grouping (module docstring): measured on Gemma 3 270M, NumPy, on one BLAS thread
and on two with the few-row products (docs/spec_decode.md, "Verify that costs what it must",
"A few rows on a CPU")."""


def row_spans(n: int, groups) -> list[tuple[int, int]]:
    """The rows 0..n-1 cut into ``groups`` (sizes >= 1, in order) and one last span of the rest:
    ``row_spans(8, (1, 2)) == [(0, 1), (1, 3), (3, 8)]``."""
    spans, lo = [], 0
    for g in groups:
        if lo >= n:
            break
        spans.append((lo, min(lo + int(g), n)))
        lo += int(g)
    return spans + ([(lo, n)] if lo < n else [])


def verify_greedy_lazy(be, block, logits, groups) -> ChainVerifyResult:
    """Greedy chain verify of ``block`` [n] reading ``logits`` [n, V] (a ``HeadRows`` or an
    array) one span of :func:`row_spans` at a time, up to the span holding row a. ``posterior``:
    the argmax of the rows read ([m], a < m <= n)."""
    b = np.asarray(block, dtype=np.int64)  # [n]
    n, posterior, a = b.shape[0], np.zeros(0, np.int64), 0
    for lo, hi in row_spans(n, groups):
        ids = argmax_rows_checked(be, logits[lo:hi], "verify", first_row=lo)  # [hi-lo]
        posterior = np.concatenate([posterior, ids])  # [hi]
        a = int(accept_length(b[1: 1 + min(hi, n - 1)], posterior))
        if a < hi:  # row a, the bonus's, is read: the rows past it are never needed
            break
    return ChainVerifyResult(a=a, accepted=tuple(int(t) for t in b[1: 1 + a]),
                             bonus=int(posterior[a]), posterior=posterior)


def q_row(proposal: DraftProposal, j: int, vocab: int) -> np.ndarray:
    """The draft law of row j over the whole vocabulary [V] float64 (DFlash 2's candidates
    scattered, repeats summed, as ``rejection_core`` does)."""
    q = np.asarray(proposal.q[j], np.float64)
    if proposal.candidates is None:
        return q
    full = np.zeros(vocab)
    np.add.at(full, np.asarray(proposal.candidates[j]), q)
    return full


def verify_sampled_lazy(be, block, logits, proposal: DraftProposal, law: SamplingParams, rng,
                        groups) -> ChainVerifyResult:
    """Sampled chain verify (``verify_chain_sampled``'s rule and draws) reading ``logits``
    [n, V] one span at a time: ``p_j`` only for j <= a (the bonus after a full accept from
    ``p_{n-1}``). Greedy: :func:`verify_greedy_lazy`."""
    if law.greedy:
        return verify_greedy_lazy(be, block, logits, groups)
    if proposal.q is None:
        raise ValueError("sampled verify needs the draft distribution q the drafts came from "
                         "(drafter.propose with the sampling law)")
    b = np.asarray(block, dtype=np.int64)  # [n]
    n, g = b.shape[0], as_generator(rng)
    u_accept, u_bonus = g.random(n - 1), g.random()  # verify_chain_sampled's draws, in order
    for lo, hi in row_spans(n, groups):
        p = sampling_probs(be, logits[lo:hi], law.temperature, law.top_p, law.top_k)  # [r, V]
        for j in range(lo, hi):
            a, bonus = decide_row(b, p[j - lo], proposal, j, u_accept, u_bonus)
            if bonus is not None:
                return ChainVerifyResult(a=a, accepted=tuple(int(t) for t in b[1: 1 + a]),
                                         bonus=bonus, posterior=np.asarray([*b[1: 1 + a], bonus],
                                                                           np.int64))
    raise AssertionError("unreachable: the last row always decides")


def decide_row(b, p_j, proposal: DraftProposal, j: int, u_accept, u_bonus):
    """Row j's decision: ``(j, bonus)`` when it ends the step (the last row: a full accept, the
    bonus from ``p_j``; else a rejection of ``d_{j+1}``, the bonus from the residual), or
    ``(j, None)`` when ``d_{j+1}`` is accepted (``u_j q_j(d) < p_j(d)``)."""
    if j == b.shape[0] - 1:
        return j, int(sample_from_probs(p_j, u_bonus))
    d = b[j + 1]
    q_j = q_row(proposal, j, p_j.shape[-1])  # [V]
    if u_accept[j] * q_j[d] < p_j[d]:
        return j, None
    return j, residual_draw(p_j, q_j, u_bonus)


@dataclass(frozen=True, eq=False)
class LazyChainBlock(ChainBlock):
    """A :class:`ChainBlock` whose forward leaves the head for later: the output's ``logits``
    is the target's ``HeadRows`` (``TargetModel.forward_head_later``); with ``layers_later``
    the layers too run only on the rows asked for, group by group."""

    layers_later: bool = False

    def forward(self, target, state, tap=None, logits_rows=None):
        if logits_rows is not None:  # a caller that names its rows gets exactly those
            return super().forward(target, state, tap, logits_rows)
        return target.forward_head_later(self.tokens, state, tap=tap,
                                         layers_later=self.layers_later)


@dataclass(frozen=True)
class LazyChainVerifier(ChainVerifier):
    """:class:`ChainVerifier` (greedy), the head run on rows 0..a only, read in ``head_groups``
    (module docstring); with ``layers_later`` the target's layers too run group by group, each
    group a forward of its own (rows past a never run). The same tokens, drafts and acceptance."""

    head_groups: tuple[int, ...] = HEAD_GROUPS
    layers_later: bool = True

    def __post_init__(self):
        super().__post_init__()
        if any(int(g) < 1 for g in self.head_groups):
            raise ValueError(f"head_groups must be row counts >= 1, got {self.head_groups}")

    def draft(self, ctx: DraftingContext) -> LazyChainBlock:
        block = super().draft(ctx)
        return LazyChainBlock(block.tokens, block.proposal, self.layers_later)

    def verify(self, block, logits, ctx: DraftingContext) -> ChainVerifyResult:
        return verify_greedy_lazy(ctx.be, block.tokens, logits, self.head_groups)


@dataclass(frozen=True)
class LazyRejectionChainVerifier(LazyChainVerifier, RejectionChainVerifier):
    """:class:`RejectionChainVerifier` (sampled), the head and the sampling law run on rows 0..a
    only; with the same generator the same tokens."""

    def verify(self, block, logits, ctx: DraftingContext) -> ChainVerifyResult:
        return verify_sampled_lazy(ctx.be, block.tokens, logits, block.proposal, ctx.sampling,
                                   ctx.rng, self.head_groups)
