"""Tree verify at temperature > 0: sampled children, recursive rejection sampling (lossless).

A greedy DDTree (:mod:`~dflash_ref.spec_decode.ddtree`) keeps the drafter's top-k per depth and
follows the target's argmax: at T > 0 a deterministic top-k is not a draw from any law, so no
accept rule on it reproduces the target's distribution. Here the children are *drawn*, and each
node is verified by multi-draft speculative sampling (SpecInfer, Miao et al. 2023, "Multi-round
speculative sampling"; SpecTr, Sun et al. 2023; the without-replacement form of Jeon et al. 2024,
"Recursive Speculative Decoding"):

**Draw** (:func:`draw_sampled_tree`). The drafter's rows give ``q_d`` over the token at depth d
(``sampling_probs`` of row d with the run's T, top-k, top-p). Depth by depth, every node of depth
d-1 gets ``w_d`` children drawn from ``q_d`` (``widths``; depths past its end get 1), in draw order
(node indices grow with it, so children of a node are in draw order and parents precede
children). Without replacement (the default) a drawn token is removed from the node's ``q`` and
``q`` renormalised before the next draw (at most the support of ``q_d`` children); with
replacement all draws are i.i.d. ``q_d`` and a token may repeat.

**Verify** (:func:`verify_tree_sampled`). From the root, with ``r = p_node`` (the target's law at
the node, ``sampling_probs`` of its row) and ``q = q_(depth+1)``: for each child c in draw order,
accept it iff ``u q(c) < r(c)`` (probability ``min(1, r(c)/q(c))``); on acceptance move to c and
start again there; on rejection ``r <- max(r - q, 0) / sum`` (the residual; ``r`` itself if the
residual is all zero, which only a probability-0 rejection reaches), and without replacement
``q <- q`` with c removed, renormalised. When every child is rejected, or the node has none, the
bonus is drawn from ``r``. The path (root first) is accepted; acceptance length = len(path).

**Why lossless.** At one child the step is single-draft speculative sampling of ``r`` with a draw
from ``q``: the token it emits is distributed as ``r`` provided the fall-back after a rejection
emits a token distributed as the residual. The fall-back is the next child's stage run on the
residual (whose law does not depend on which token was rejected), or the residual itself: by
induction over the children, the node emits a token distributed as ``p_node``; the subtree under
the accepted child was drawn independently of the decision, so the argument repeats at the child
with the target's law given the path. tests/spec_decode/test_tree_sampling.py checks it with
:mod:`dflash_ref.testing.lossless` and fails mutants of one line.
"""

from __future__ import annotations

import numpy as np

from dflash_ref.ops.sampling import sample_from_probs
from dflash_ref.spec_decode.ddtree import DDTree, TreeVerifyResult


def tree_widths(widths, depth: int) -> tuple[int, ...]:
    """Children per node at depths 1..``depth``: ``widths`` padded with 1 (a chain below)."""
    w = tuple(int(x) for x in widths)[:depth]
    return w + (1,) * (depth - len(w))


def draw_sampled_tree(root_token: int, q, widths, rng, replacement: bool = False) -> DDTree:
    """Draw the tree (module docstring, "Draw").

    Args:
        root_token: the anchor (node 0).
        q: [L, V] the draft law of depths 1..L (rows sum to 1).
        widths: children per node for depths 1, 2, .. (padded with 1 to L).
        rng: ``np.random.Generator``: one uniform per draw, in node order.
        replacement: i.i.d. draws (True) or without replacement (False).
    Returns:
        :class:`~dflash_ref.spec_decode.ddtree.DDTree` with ``log_weights`` the summed
        ``log q`` of each path and ``ranks`` each node's draw index among its siblings.
    """
    q = np.asarray(q, dtype=np.float64)
    L = q.shape[0]
    tokens, parents, depths, logw, ranks = [int(root_token)], [-1], [0], [0.0], [0]
    child_maps: list[dict[int, int]] = [{}]
    frontier = [0]
    for d, w in enumerate(tree_widths(widths, L), start=1):
        nxt = []
        for parent in frontier:
            law = q[d - 1].copy()  # [V]
            for rank in range(min(w, int(np.count_nonzero(law)))):
                t = int(sample_from_probs(law, rng.random()))
                idx = len(tokens)
                tokens.append(t)
                parents.append(parent)
                depths.append(d)
                logw.append(logw[parent] + float(np.log(q[d - 1, t])))
                ranks.append(rank)
                child_maps[parent].setdefault(t, idx)
                child_maps.append({})
                nxt.append(idx)
                if not replacement and law.sum() > law[t]:
                    law[t] = 0.0
                    law /= law.sum()
        frontier = nxt
    return DDTree(tokens=np.asarray(tokens, np.int64), parents=np.asarray(parents, np.int64),
                  depths=np.asarray(depths, np.int64), log_weights=np.asarray(logw),
                  ranks=np.asarray(ranks, np.int64), child_maps=tuple(child_maps))


def children(tree: DDTree) -> list[list[int]]:
    """Per node, its children in draw order (increasing index)."""
    out: list[list[int]] = [[] for _ in range(tree.n_nodes)]
    for i in range(1, tree.n_nodes):
        out[int(tree.parents[i])].append(i)
    return out


def residual(r, q) -> np.ndarray:
    """``max(r - q, 0)`` renormalised; ``r`` itself when that is all zero."""
    res = np.maximum(r - q, 0.0)
    total = res.sum()
    return res / total if total > 0 else r


def verify_tree_sampled(tree: DDTree, p, q, rng, replacement: bool = False) -> TreeVerifyResult:
    """Recursive rejection sampling down the tree (module docstring, "Verify").

    Args:
        tree: the drawn tree (:func:`draw_sampled_tree` with the same ``q`` and
            ``replacement``).
        p: [N, V] the target's sampling law at each node (rows sum to 1).
        q: [L, V] the draft law of depths 1..L.
        rng: ``np.random.Generator``: one uniform per child tried, then one for the bonus.
    Returns:
        :class:`~dflash_ref.spec_decode.ddtree.TreeVerifyResult`; ``posterior`` holds the
        accepted tokens and the bonus (length len(path)).
    """
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    if p.shape[0] != tree.n_nodes:
        raise ValueError(f"p has {p.shape[0]} rows, the tree has {tree.n_nodes} nodes")
    kids = children(tree)
    path = [0]
    while True:
        node = path[-1]
        r = p[node]  # [V]
        law = q[tree.depths[node]].copy() if kids[node] else None  # [V] law of the children
        moved = False
        for c in kids[node]:
            t = int(tree.tokens[c])
            if rng.random() * law[t] < r[t]:
                path.append(c)
                moved = True
                break
            r = residual(r, law)
            if not replacement:
                law[t] = 0.0
                law = law / law.sum() if law.sum() > 0 else law
        if not moved:
            bonus = int(sample_from_probs(r, rng.random()))
            break
    accepted = tuple(int(tree.tokens[i]) for i in path[1:])
    return TreeVerifyResult(path=tuple(path), accepted=accepted, bonus=bonus,
                            posterior=np.asarray([*accepted, bonus], np.int64))
