"""Which draft row a tree draws each depth from, and the tree's shape when the filters leave
fewer tokens than its width (dflash_ref/spec_decode/extra_verifiers.py, tree_sampling.py).

The drafter's block is ``[anchor, MASK x (B-1)]``: its row d scores the token at depth d, row 0
(the anchor's) scores nothing a tree draws. A tree whose children at depth d came from row d-1
is still lossless (its draw and its verify read the same wrong q), so only the law itself shows
it: here the rows are hand-made laws, each with its own heavy token, and the expected q and
tokens are written from them by hand.
"""

from __future__ import annotations

import numpy as np

from dflash_ref.backend import get_backend
from dflash_ref.ops.sampling import SamplingParams
from dflash_ref.spec_decode.drafting import DraftingContext
from dflash_ref.spec_decode.extra_verifiers import SampledTreeVerifier, TreeVerifier

V, B = 8, 4
HEAVY = (1, 5, 2, 6)  # row d puts 0.86 on HEAVY[d] and 0.02 on each other token


class Scripted:
    """A generator stand-in whose ``random()`` returns the given uniforms in order."""

    def __init__(self, *u):
        self.u = list(u)

    def random(self, *shape):
        return self.u.pop(0)


class FixedRows:
    """A proposer whose draft logits are given rows (``DraftingContext.draft_logits``)."""

    def __init__(self, logits):
        self.logits = logits

    def draft_logits(self, anchor, position):
        return self.logits


def row_laws() -> np.ndarray:
    """[B, V] the law of each draft row (row d heavy on HEAVY[d])."""
    P = np.full((B, V), 0.02)
    P[np.arange(B), HEAVY] = 0.86
    return P


def context(sampling: SamplingParams, rng) -> DraftingContext:
    logits = np.log(row_laws()).astype(np.float32)  # softmax(logits) = the row laws
    return DraftingContext(anchor=3, position=10, block_size=B, remaining=50, sampling=sampling,
                           rng=rng, be=get_backend("numpy"), proposer=FixedRows(logits))


def test_the_sampled_tree_draws_depth_d_from_draft_row_d():
    # Catches q built from rows 0..B-2 (depth d from row d-1). At T = 1/2 the law of row d is
    # P_d^2 / sum P_d^2: 0.86^2 / (0.86^2 + 7 * 0.02^2) on the heavy token.
    law = SamplingParams(temperature=0.5, seed=0)
    block = SampledTreeVerifier(widths=(1,)).draft(context(law, Scripted(0.5, 0.5, 0.5)))
    P = row_laws() ** 2
    want = P[1:] / P[1:].sum(-1, keepdims=True)  # depths 1..B-1 from rows 1..B-1
    np.testing.assert_allclose(block.q, want, rtol=1e-6, atol=0)
    # u = 0.5 lands on each row's heavy token (the mass before it is at most 5 * 0.0005)
    assert block.tree.tokens.tolist() == [3, *HEAVY[1:]]


def test_the_ddtree_scores_depth_d_from_draft_row_d():
    # The greedy tree: its budget of B-1 nodes goes to the chain of heavy tokens (a sibling
    # costs log(0.02 / 0.86) against a child's log(0.86)), rows 1..B-1 in depth order.
    block = TreeVerifier().draft(context(SamplingParams(), None))
    assert block.tree.tokens.tolist() == [3, *HEAVY[1:]]
    assert block.tree.depths.tolist() == list(range(B))


def test_top_k_below_the_width_gives_one_child_per_node():
    # Catches drawing ``width`` children whatever the support: with top_k = 1 the only token of
    # each row would be drawn again (a duplicate child) or from a zero law.
    law = SamplingParams(temperature=1.0, top_k=1, seed=0)
    block = SampledTreeVerifier(widths=(3, 2)).draft(context(law, np.random.default_rng(0)))
    assert block.tree.tokens.tolist() == [3, *HEAVY[1:]]
    assert block.tree.parents.tolist() == [-1, 0, 1, 2]


def test_top_p_below_the_width_gives_as_many_children_as_kept_tokens():
    # Row 1 rewritten to [0.5, 0.3, 0.2 / 6 ...]: top_p = 0.8 keeps 0 (nothing before it) and 1
    # (0.5 before it), drops the rest (0.8 before them is not < 0.8). Width 3 at depth 1 gets
    # these two children, distinct, each with one child below (width 1).
    P = row_laws()
    P[1] = [0.5, 0.3] + [0.2 / 6] * 6
    law = SamplingParams(temperature=1.0, top_p=0.8, seed=0)
    ctx = context(law, np.random.default_rng(1))
    ctx.proposer.logits = np.log(P).astype(np.float32)
    tree = SampledTreeVerifier(widths=(3,)).draft(ctx).tree
    assert tree.parents.tolist() == [-1, 0, 0, 1, 2, 3, 4]
    assert sorted(tree.tokens[1:3].tolist()) == [0, 1]
    assert tree.tokens[3:].tolist() == [HEAVY[2], HEAVY[2], HEAVY[3], HEAVY[3]]
