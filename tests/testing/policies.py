"""The project's sampled verify rules as harness steps (dflash_ref.testing.lossless), and the
one-line mutants the harness must reject.

A step is ``step(target, draft_logits [L, V], rng) -> emitted tokens``. :func:`verifier_step`
runs a :class:`~dflash_ref.spec_decode.verifiers.Verifier` exactly as the loop does (``draft``,
the target's rows for the block, ``verify``) on a
:class:`~dflash_ref.spec_decode.drafting.DraftingContext` whose proposer is a stand-in for the
drafter (:class:`ToyProposer`): its ``propose`` gives argmax rows, sampled rows, or a DFlash 2
style sparse proposal, its ``draft_logits`` the toy drafter's block.
"""

from __future__ import annotations

import numpy as np

from dflash_ref.backend import get_backend
from dflash_ref.ops.sampling import (
    DraftProposal,
    SamplingParams,
    sample_from_probs,
    sample_rows,
    sampling_probs,
    target_probs,
)
from dflash_ref.spec_decode.drafting import DraftingContext
from dflash_ref.spec_decode.extra_verifiers import TreeBlock
from dflash_ref.spec_decode.verifiers import ChainBlock
from dflash_ref.spec_decode.verify import ChainVerifyResult
from dflash_ref.testing.lossless import Law

NP = get_backend("numpy")
ANCHOR = 0
SPARSE_K = 2  # DFlash 2's candidates per row in the toy selector


def params(law: Law, rng) -> SamplingParams:
    return SamplingParams(law.temperature, top_p=law.top_p, top_k=law.top_k, seed=rng)


class ToyProposer:
    """The drafter a verifier drafts from through its context (drafting.py, ``Proposer``): the
    block's logits are the toy drafter's, whatever the anchor and position."""

    def __init__(self, draft_logits, sparse: bool = False):
        V = draft_logits.shape[1]
        self.sparse = sparse
        self.block_logits = np.concatenate([np.zeros((1, V)), draft_logits])  # [B, V] row 0: anchor

    def draft_logits(self, anchor: int, position: int):
        return self.block_logits

    def propose(self, anchor: int, position: int, block_size: int, law, rng,
                scored=None) -> DraftProposal:
        rows = self.block_logits[1:block_size]  # [n-1, V]
        if law is None or law.greedy:
            return DraftProposal(np.argmax(rows, axis=-1).astype(np.int64))
        if self.sparse:
            return sparse_proposal(rows, law, rng)
        return sample_rows(NP, rows, law, rng)


def toy_context(draft_logits, law: Law, rng, sparse: bool = False) -> DraftingContext:
    """A step's context at the anchor, its block the toy drafter's L + 1 rows."""
    return DraftingContext(anchor=ANCHOR, position=10, block_size=draft_logits.shape[0] + 1,
                           remaining=100, sampling=params(law, rng), rng=rng, be=NP,
                           proposer=ToyProposer(draft_logits, sparse))


def sparse_proposal(rows, law: SamplingParams, rng) -> DraftProposal:
    """DFlash 2's form (models/dflash2.py ``propose``): per row, k candidates (the row's top k)
    re-scored given the path so far, ``c_i ~ softmax(score / T)`` over them; q [n-1, k] on
    candidates [n-1, k]. The toy selector adds 1.5 to a candidate equal to the previous token
    plus 1 (mod V), so q_i depends on the drafts before it, as the real selector's does."""
    V = rows.shape[-1]
    prev, tokens, qs, cands = ANCHOR, [], [], []
    for row in rows:
        c = np.argsort(-row, kind="stable")[:SPARSE_K]  # [k]
        score = row[c] + 1.5 * (c == (prev + 1) % V)  # [k]
        q = target_probs("numpy", score, law.temperature)  # [k]
        prev = int(c[sample_from_probs(q, rng.random())])
        tokens.append(prev)
        qs.append(q)
        cands.append(c)
    return DraftProposal(np.asarray(tokens, np.int64), np.stack(qs), np.stack(cands))


def block_logits(target, block) -> np.ndarray:
    """[n, V] the target's rows for a chain block: row j after the drafts 1..j."""
    drafts = tuple(int(t) for t in block.tokens[1:])
    return np.stack([target(drafts[:j]) for j in range(len(block.tokens))])


def tree_logits(target, tree) -> np.ndarray:
    """[N, V] the target's rows for a tree: node i after its path's tokens."""
    return np.stack([target(tuple(int(tree.tokens[k]) for k in tree.path_to(i)[1:]))
                     for i in range(tree.n_nodes)])


def verifier_step(verifier, law: Law, sparse: bool = False):
    """A harness step that runs ``verifier`` as the loop does."""

    def step(target, draft_logits, rng):
        ctx = toy_context(draft_logits, law, rng, sparse)
        block = verifier.draft(ctx)
        if isinstance(block, TreeBlock):
            logits = tree_logits(target, block.tree)
        else:
            logits = block_logits(target, block)
        return verifier.verify(block, logits, ctx).committed

    return step


# ---------------------------------------------------------------------------------------------
# Mutants: sampled chain verify (the release's rejection sampling) with one line wrong.
# ---------------------------------------------------------------------------------------------


def _mutant_chain(target, draft_logits, rng, law: Law, mutation: str):
    """Sampled drafts, rejection sampling; ``mutation`` names the one line that differs from
    dflash_ref/spec_decode/verify.py ``rejection_core``."""
    sp = params(law, rng)
    prop = sample_rows(NP, draft_logits, sp, rng)  # drafts ~ q
    block = ChainBlock(np.concatenate([[ANCHOR], prop.tokens]).astype(np.int64), prop)
    rows = block_logits(target, block)  # [n, V]
    if mutation == "top_p_after_ratio":  # the ratio on the unfiltered law, top-p afterwards
        p = sampling_probs(NP, rows, law.temperature, 1.0, law.top_k)
        p_after = sampling_probs(NP, rows, law.temperature, law.top_p, law.top_k)
    else:
        p = p_after = sampling_probs(NP, rows, law.temperature, law.top_p, law.top_k)  # [n, V]
    q = prop.q  # [n-1, V]
    m = len(prop.tokens)
    a = 0
    while a < m:
        d = int(prop.tokens[a])
        if not rng.random() * q[a, d] < p[a, d]:
            break
        a += 1
    if a == m:
        bonus = int(sample_from_probs(p_after[m], rng.random()))
    elif mutation == "bonus_from_q":
        bonus = int(sample_from_probs(q[a], rng.random()))  # was: the residual of p
    elif mutation == "bonus_from_p":
        bonus = int(sample_from_probs(p_after[a], rng.random()))  # was: the residual of p
    elif mutation == "residual_not_renormalised":
        res = np.maximum(p[a] - q[a], 0.0)  # was: / res.sum(), then inverse CDF on u
        bonus = int(min(np.searchsorted(np.cumsum(res), rng.random(), side="right"),
                        res.shape[0] - 1))
    else:
        res = np.maximum(p_after[a] - q[a], 0.0)
        bonus = int(sample_from_probs(res if res.sum() > 0 else p_after[a], rng.random()))
    return ChainVerifyResult(a, tuple(int(t) for t in prop.tokens[:a]), bonus,
                             np.zeros(0, np.int64)).committed


MUTATIONS = ("bonus_from_q", "bonus_from_p", "residual_not_renormalised", "top_p_after_ratio")


def mutant_chain_step(law: Law, mutation: str):
    def step(target, draft_logits, rng):
        return _mutant_chain(target, draft_logits, rng, law, mutation)

    return step


def correct_chain_step(law: Law):
    """The same code with no mutation (so the mutants' harness runs are shown to pass it)."""
    return mutant_chain_step(law, "none")
