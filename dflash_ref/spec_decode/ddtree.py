"""DDTree: a best-first draft tree from one drafter pass, verified in one target pass.

The default is the authors' reference (liranringel/ddtree ``ddtree.py``); the lucebox port's
choices (Luce-Org/lucebox ``server/src/common/ddtree.cpp``) are options of :class:`DDTreeOptions`.

**Inputs.** The drafter runs on ``[root, mask x (B-1)]`` exactly as in chain mode; its rows
1..B-1 give, for depth d = 1..L (L = B-1), a distribution over the token at position root + d.
Per depth we keep the top K tokens with log-probabilities ``lp = log_softmax(row)`` in float32.

**Build** (best-first over the path's summed draft log-probability, the paper's surrogate for
the chance that the target accepts the path). A max-heap holds candidates
``(score, rank path, parent, depth, rank)``; it starts with the rank-0 token of depth 1 under the
root. Popping a candidate creates node ``index = 1 + nodes so far`` (so a parent always precedes
its children), records its parent and depth and registers its token in the parent's child map,
then pushes

- the next sibling (same parent and depth, rank + 1), score ``score - lp[d][r] + lp[d][r+1]``,
  if rank + 1 < K;
- the first child (depth + 1, rank 0), score ``score + lp[d+1][0]``, if depth < L;

until ``budget`` non-root nodes exist or the heap is empty. Equal scores are ordered by the rank
path (the tuple of ranks from the root), lexicographically smaller first: the authors' tie rule.

**Verify.** One target pass over ``[root, node tokens...]`` at positions ``start + depth``; row i
sees the committed prefix and its ancestors (self included): :func:`ancestor_matrix`. Greedy:
posterior = argmax per row. **Follow**: from the root, while the posterior token of the current
node is one of its children, move to that child. The path (root first) is accepted; the bonus is
the posterior of the last node on it. Acceptance length = len(path), comparable to chain a + 1.
At temperature 0 the committed tokens equal plain greedy decoding's.

**Commit** (the loop's job; :class:`TreeVerifyResult` gives what it needs): the KV row of node i
was written at slot ``committed + i``; keep the rows of ``path`` in path order right after the
committed prefix (copy ``committed + path[d]`` -> ``committed + d``); the drafter's next context
is the features of ``path`` in path order; GDN state is the state after the last path node,
rebuilt along the path (lucebox's tree-mode DeltaNet).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Literal

import numpy as np

from dflash_ref.backend import Backend, as_backend
from dflash_ref.errors import ConfigError
from dflash_ref.ops.masks import ancestor_matrix
from dflash_ref.ops.reductions import check_finite_logits
from dflash_ref.spec_decode.verify import greedy_posterior

LUCEBOX_BUDGET = 22
"""lucebox ``--ddtree-budget`` default (Luce-Org/lucebox ``server/src/common/ddtree.cpp``)."""
LUCEBOX_TOP_K = 8
"""lucebox: K = 8 candidates per depth when budget > L, else 1 (a top-1 chain)."""
MIN_TEMPERATURE = 1e-3
"""lucebox divides the draft logits by max(1e-3, T)."""


@dataclass(frozen=True)
class DDTreeOptions:
    """How to build the tree. Defaults reproduce the authors' ``ddtree.py``.

    Attributes:
        budget: non-root nodes. ``None``: L = B-1, the authors' default (as many nodes as a chain).
        top_k: candidates per depth, overriding ``top_k_rule``.
        top_k_rule: "authors": K = min(budget, V). "lucebox": K = 8 if budget > L else 1.
        chain_seed: lucebox: pre-insert the top-1 chain of depths 1..min(L, budget) at indices
            1.. (with their rank-1 siblings queued) before the best-first loop. Authors: off.
        temperature: the draft logits are divided by max(1e-3, T) before log_softmax (lucebox
            ``--ddtree-temp``, default 1.0; the authors apply no temperature, which equals 1.0).
    """

    budget: int | None = None
    top_k: int | None = None
    top_k_rule: Literal["authors", "lucebox"] = "authors"
    chain_seed: bool = False
    temperature: float = 1.0

    @classmethod
    def lucebox(cls, budget: int = LUCEBOX_BUDGET, temperature: float = 1.0) -> DDTreeOptions:
        """The lucebox port's defaults: budget 22, K = 8 (or 1), chain seeded."""
        return cls(budget=budget, top_k_rule="lucebox", chain_seed=True, temperature=temperature)

    def resolve(self, L: int, V: int) -> tuple[int, int]:
        """(budget, K) for a draft of L depths over a vocabulary of V tokens."""
        budget = L if self.budget is None else int(self.budget)
        if self.top_k is not None:
            if self.top_k < 1:
                raise ConfigError(f"DDTreeOptions.top_k must be >= 1, got {self.top_k}")
            k = int(self.top_k)
        elif self.top_k_rule == "authors":
            k = budget
        elif self.top_k_rule == "lucebox":
            k = LUCEBOX_TOP_K if budget > L else 1
        else:
            raise ConfigError(
                f"DDTreeOptions.top_k_rule must be 'authors' or 'lucebox', got {self.top_k_rule!r}"
            )
        return budget, max(1, min(k, V))


@dataclass(frozen=True)
class DDTree:
    """A flattened draft tree; node 0 is the root (the previous bonus token, already emitted).

    Attributes:
        tokens: [N] int64 token per node.
        parents: [N] int64; ``parents[0] = -1`` and ``parents[i] < i``.
        depths: [N] int64; ``depths[0] = 0``, ``depths[i] = depths[parents[i]] + 1``.
        log_weights: [N] float64 summed draft log-probability of the path to each node (root 0).
        ranks: [N] int64 rank of each node's token among its depth's top-K (root 0).
        child_maps: per node, token -> child index.
    """

    tokens: np.ndarray
    parents: np.ndarray
    depths: np.ndarray
    log_weights: np.ndarray
    ranks: np.ndarray
    child_maps: tuple[dict[int, int], ...]

    @property
    def n_nodes(self) -> int:
        """N = 1 + non-root nodes: the verify batch width."""
        return int(self.tokens.shape[0])

    def positions(self, start: int) -> np.ndarray:
        """[N] absolute positions for the verify pass: ``start + depth`` (root at ``start``)."""
        return start + self.depths

    def visibility(self) -> np.ndarray:
        """[N, N] bool ancestor-only visibility, self included (see :func:`ancestor_matrix`)."""
        return ancestor_matrix(self.parents)

    def path_to(self, i: int) -> list[int]:
        """Node indices from the root to node ``i``, root first."""
        path = [int(i)]
        while path[-1] != 0:
            path.append(int(self.parents[path[-1]]))
        return path[::-1]


@dataclass(frozen=True)
class TreeVerifyResult:
    """Outcome of a greedy tree verify (``ddtree.py``, follow and commit).

    Attributes:
        path: accepted node indices in path order, root (0) first. These are also the verify
            rows whose KV, features and GDN states the loop keeps, in this order.
        accepted: the accepted nodes' tokens (root excluded: it was emitted last step).
        bonus: the target's token at the last path node; it becomes the next root.
        posterior: [N] int64 the target's greedy token per tree node.
    """

    path: tuple[int, ...]
    accepted: tuple[int, ...]
    bonus: int
    posterior: np.ndarray

    @property
    def a(self) -> int:
        """Accepted draft tokens (len(path) - 1), comparable to chain verify's a."""
        return len(self.path) - 1

    @property
    def acceptance_length(self) -> int:
        """len(path), root included: comparable to chain mode's a + 1."""
        return len(self.path)

    @property
    def committed(self) -> tuple[int, ...]:
        """Tokens this step appends after the root: the accepted tokens, then the bonus."""
        return (*self.accepted, self.bonus)

    @property
    def bonus_row(self) -> int:
        """The verify row whose logits chose the bonus: the path's last node."""
        return self.path[-1]


# ---------------------------------------------------------------------------------------------
# Building.
# ---------------------------------------------------------------------------------------------


def topk_log_probs(be: Backend | str, draft_logits, k: int,
                   temperature: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Top-k tokens per draft row with their log-probabilities, sorted best first.

    ``lp = log_softmax(logits / max(1e-3, T))`` in float32 on the backend; the k largest per row
    are returned on the host, ordered by decreasing lp, equal lp by increasing token id (the
    deterministic tie rule of this reference; torch.topk leaves it unspecified).

    Args:
        be: backend of ``draft_logits``.
        draft_logits: [L, V] the drafter's rows for depths 1..L.
        k: 1 <= k <= V.
        temperature: T; 1.0 leaves the logits as they are.
    Returns:
        (ids [L, k] int64, lp [L, k] float32), host arrays.
    Raises:
        NonFiniteLogitsError: a draft row holds NaN or +-inf (rows named as block rows 1..L).
    """
    be = as_backend(be)
    xp = be.xp
    x = xp.asarray(draft_logits, dtype=xp.float32)  # [L, V]
    if x.ndim != 2:
        raise ValueError(f"draft_logits must be [L, V], got shape {tuple(x.shape)}")
    L, V = x.shape
    if not 1 <= k <= V:
        raise ValueError(f"k must be in [1, V={V}], got {k}")
    bad = be.ops.count_nonfinite_rows(x)  # [L] int64, copied with the candidates below
    if temperature != 1.0:
        x = x / np.float32(max(MIN_TEMPERATURE, temperature))
    lp = be.ops.log_softmax(x)  # [L, V] float32
    kth = xp.partition(lp, V - k, axis=-1)[:, V - k : V - k + 1]  # [L, 1] the k-th largest
    rows, cols = xp.nonzero(lp >= kth)  # every candidate (more than k only on ties at kth)
    vals = be.to_numpy(lp[rows, cols])
    n = int(rows.shape[0])
    host = be.to_numpy(xp.concatenate([rows.astype(xp.int64), cols.astype(xp.int64), bad]))
    rows, cols, bad = host[:n], host[n : 2 * n], host[2 * n :]  # one copy for all three
    if bad.any():
        check_finite_logits(be.to_numpy(draft_logits), "draft", first_row=1)
    if not np.all(np.isfinite(vals)):
        raise ValueError(
            "draft_logits has fewer than k finite entries in some row (a -inf or NaN logit "
            "reached the top-k); DDTree scores are sums of log-probabilities and need finite ones"
        )
    order = np.lexsort((cols, -vals.astype(np.float64), rows))  # row, then lp desc, then id asc
    ids = np.empty((L, k), np.int64)
    out = np.empty((L, k), np.float32)
    starts = np.searchsorted(rows[order], np.arange(L))
    for d in range(L):
        sel = order[starts[d] : starts[d] + k]
        ids[d], out[d] = cols[sel], vals[sel]
    return ids, out


def build_ddtree(be: Backend | str, root_token: int, draft_logits,
                 options: DDTreeOptions | None = None) -> DDTree:
    """Build the draft tree for one step from the drafter's logits (liranringel/ddtree).

    Args:
        be: backend of ``draft_logits``.
        root_token: the previous bonus token (the anchor of the draft block).
        draft_logits: [L, V] the drafter's rows 1..B-1 (row 0, the anchor, dropped): row d-1
            scores depth d.
        options: :class:`DDTreeOptions`; the authors' defaults when omitted.
    Returns:
        :class:`DDTree` (host arrays).
    """
    options = options or DDTreeOptions()
    L, V = (int(n) for n in draft_logits.shape)
    budget, k = options.resolve(L, V)
    if budget <= 0 or L <= 0:
        return build_ddtree_from_topk(root_token, np.zeros((0, 1), np.int64),
                                      np.zeros((0, 1), np.float32), 0, options.chain_seed)
    ids, lp = topk_log_probs(be, draft_logits, k, options.temperature)
    return build_ddtree_from_topk(root_token, ids, lp, budget, options.chain_seed)


def build_ddtree_from_topk(root_token: int, topk_ids, topk_lp, budget: int,
                           chain_seed: bool = False) -> DDTree:
    """The best-first builder on precomputed top-K tables (the heart of :func:`build_ddtree`).

    Args:
        root_token: token of node 0.
        topk_ids: [L, K] int, candidates per depth sorted best first (row d-1 = depth d).
        topk_lp: [L, K] their log-probabilities (float32; scores are summed in float64).
        budget: maximum non-root nodes.
        chain_seed: pre-insert the top-1 chain (lucebox); off in the authors' builder.
    Returns:
        :class:`DDTree` with ``1 + min(budget, K + K^2 + ... + K^L)`` nodes (the heap empties
        once every path of the K-ary tree is in).
    """
    ids = np.asarray(topk_ids, dtype=np.int64)
    lps = np.asarray(topk_lp, dtype=np.float32).astype(np.float64).tolist()  # Python floats
    L, K = ids.shape if ids.ndim == 2 else (0, 0)
    tok = ids.tolist()
    tokens, parents, depths, logw, ranks = [int(root_token)], [-1], [0], [0.0], [0]
    child_maps: list[dict[int, int]] = [{}]

    def add(parent: int, depth: int, rank: int, score: float) -> int:
        idx = len(tokens)
        t = tok[depth - 1][rank]
        tokens.append(t)
        parents.append(parent)
        depths.append(depth)
        logw.append(score)
        ranks.append(rank)
        child_maps[parent][t] = idx
        child_maps.append({})
        return idx

    # Heap entries: (-score, rank path, parent, depth, rank). heapq is a min-heap, so the best
    # score pops first and equal scores pop in lexicographic rank-path order (the authors' rule).
    heap: list[tuple[float, tuple[int, ...], int, int, int]] = []
    if budget > 0 and L > 0:
        if chain_seed:
            parent, score = 0, 0.0
            for d in range(1, min(L, budget) + 1):
                score += lps[d - 1][0]
                if K > 1:  # the rank-1 sibling of chain node d, under chain node d-1
                    sib = score - lps[d - 1][0] + lps[d - 1][1]
                    heapq.heappush(heap, (-sib, (0,) * (d - 1) + (1,), parent, d, 1))
                parent = add(parent, d, 0, score)  # chain nodes push no children: the chain is them
        else:
            heapq.heappush(heap, (-lps[0][0], (0,), 0, 1, 0))
    while heap and len(tokens) - 1 < budget:
        neg, path, parent, depth, rank = heapq.heappop(heap)
        score = -neg
        idx = add(parent, depth, rank, score)
        if rank + 1 < K:  # next sibling
            sib = score - lps[depth - 1][rank] + lps[depth - 1][rank + 1]
            heapq.heappush(heap, (-sib, path[:-1] + (rank + 1,), parent, depth, rank + 1))
        if depth < L:  # first child
            heapq.heappush(heap, (-(score + lps[depth][0]), path + (0,), idx, depth + 1, 0))
    return DDTree(
        tokens=np.asarray(tokens, np.int64),
        parents=np.asarray(parents, np.int64),
        depths=np.asarray(depths, np.int64),
        log_weights=np.asarray(logw, np.float64),
        ranks=np.asarray(ranks, np.int64),
        child_maps=tuple(child_maps),
    )


def chain_tree(block) -> DDTree:
    """The block ``[anchor, d_1, ..., d_(B-1)]`` as a tree: node i = block[i], parent i-1.

    Verifying it with :func:`verify_tree` gives exactly
    :func:`~dflash_ref.spec_decode.verify.verify_chain_greedy` on the block.
    """
    b = np.asarray(block, dtype=np.int64)
    n = b.shape[0]
    child_maps = tuple({int(b[i + 1]): i + 1} if i + 1 < n else {} for i in range(n))
    return DDTree(tokens=b.copy(), parents=np.arange(-1, n - 1, dtype=np.int64),
                  depths=np.arange(n, dtype=np.int64), log_weights=np.zeros(n),
                  ranks=np.zeros(n, np.int64), child_maps=child_maps)


# ---------------------------------------------------------------------------------------------
# Verifying.
# ---------------------------------------------------------------------------------------------


def follow_verified_tree(tree: DDTree, posterior) -> TreeVerifyResult:
    """Walk from the root along the target's greedy choices (``ddtree.py``, follow).

    ``path = [0]; next = posterior[0]``; while ``next`` is a child token of the current node,
    move to that child and append it, ``next = posterior[child]``. The bonus is ``next``.

    Args:
        tree: the verified tree.
        posterior: [N] int, the target's greedy token per node.
    """
    post = np.asarray(posterior, dtype=np.int64)
    if post.shape != (tree.n_nodes,):
        raise ValueError(f"posterior has shape {post.shape}, the tree has {tree.n_nodes} nodes")
    path = [0]
    nxt = int(post[0])
    while nxt in tree.child_maps[path[-1]]:
        path.append(tree.child_maps[path[-1]][nxt])
        nxt = int(post[path[-1]])
    return TreeVerifyResult(
        path=tuple(path),
        accepted=tuple(int(tree.tokens[i]) for i in path[1:]),
        bonus=nxt,
        posterior=post,
    )


def verify_tree(be: Backend | str, tree: DDTree, target) -> TreeVerifyResult:
    """Greedy tree verify: argmax per node (``be.ops.argmax_rows``), then follow the tree.

    Args:
        be: backend of ``target``.
        tree: the tree the target ran on (rows in node order).
        target: the target's logits [N, V] for the N tree rows, or their argmax ids [N].
    Raises:
        NonFiniteLogitsError: a logits row holds NaN or +-inf (:func:`greedy_posterior`).
    """
    posterior = greedy_posterior(be, target, n_rows=tree.n_nodes)  # [N]
    return follow_verified_tree(tree, posterior)
