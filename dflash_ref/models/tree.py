"""Tree verify on the target (docs/spec_decode.md, DDTree): a draft tree in one forward, its
arrays and mask, and the accepted branch as every store of the state reads it at the commit."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dflash_ref.models.batch_arrays import BatchArrays
from dflash_ref.models.output import TargetOutput
from dflash_ref.ops.masks import MaskSpec


def forward_tree(model, ids, parents, state) -> TargetOutput:
    """``TargetModel.forward_tree``: verify a draft tree in one pass.

    Node i (token ``ids[i]``, parent ``parents[i]`` < i, -1 for the root) sits at position
    ``state.length + depth(i)`` and sees the committed prefix and its own ancestors only
    (:func:`~dflash_ref.ops.masks.tree_mask`); GDN layers run each node from its parent's
    state. The state is left pending: call ``state.commit_path(path)`` with the accepted
    node indices (root first) to keep exactly that branch.

    Returns logits [n, vocab] and features [n, C*hidden] (None without capture), node order.
    """
    ids = model._check_ids(ids)
    parents = np.asarray(parents, dtype=np.int64).reshape(-1)
    if parents.shape[0] != ids.shape[0]:
        raise ValueError("forward_tree: ids and parents must have the same length")
    if parents.size and (parents[0] != -1 or np.any(parents[1:] >= np.arange(1, parents.size))
                         or np.any(parents[1:] < 0)):
        raise ValueError("forward_tree: parents must be [-1, p1, p2, ...] with 0 <= p_i < i "
                         "(one root, node 0, topologically ordered)")
    return model._run(state.begin_batch(ids, parents=parents), state)


class TreeArrays(BatchArrays):
    """A tree batch's :class:`~dflash_ref.models.batch_arrays.BatchArrays` (made with
    ``parents``: its ancestor rows in the one upload) and the tree-verify mask built from them."""

    def tree_mask(self, prefix, window: int | None) -> MaskSpec:
        """Tree verify over keys ``[prefix..., the T nodes]``.

        ``prefix``: an int P for a plain cache (keys at positions 0..P-1), or the pager's slot
        table [P] (a backend array). Equals :func:`~dflash_ref.ops.masks.tree_mask` with
        ``base_pos=start``, ``k_pos = concat(prefix positions, node positions)`` and
        ``node_slots = P + arange(T)`` (tests/models/test_batch_arrays.py), built on the backend.
        """
        xp = self.be.xp

        def make():
            pre = (xp.arange(prefix, dtype=xp.int32) if isinstance(prefix, int)
                   else prefix.astype(xp.int32, copy=False))  # [P]
            P, n = pre.shape[0], self.positions.shape[0]
            anc = xp.zeros((n, P + n), dtype=bool)  # committed columns stay False: they are
            anc[:, P:] = self.ancestors  # visible through base_pos; node columns: ancestry
            return MaskSpec(self.positions, xp.concatenate([pre, self.positions]), window=window,
                            base_pos=self.start, ancestors=anc)

        key = ("tree", "cache", prefix) if isinstance(prefix, int) else ("tree", id(prefix))
        return self.once((*key, window), make)


@dataclass(frozen=True)
class TreePath:
    """The accepted branch of a tree verify, as every store of the state reads it.

    Made once per commit by :meth:`~dflash_ref.models.state.TargetState.commit_path` (one host
    -> backend copy of the node indices), then handed to each store's ``keep_path``.

    Attributes:
        start: the first position of the branch (the committed length before the tree).
        nodes: [m] host node indices, root first (node 0 is the root).
        dev: [m] the same indices on the backend.
        rows: [m] ``start + dev`` on the backend: the nodes' rows in a cache that appended
            every node after its committed rows, in node order.
    """

    start: int
    nodes: np.ndarray
    dev: object
    rows: object

    @classmethod
    def upload(cls, be, start: int, nodes: np.ndarray) -> TreePath:
        """The path ``nodes`` [m] at ``start``, copied to the backend once."""
        dev = be.to_backend(nodes)  # [m] node indices: one copy for every store
        return cls(int(start), nodes, dev, start + dev)
