"""A tree verify over a plain K/V cache: the nodes' view, and the tree that waits for its path.

``forward_tree`` runs a tree of drafted tokens in one batch (node i at position base +
depth(i)); its K/V are appended after the committed rows in node order, and node i sees the
committed prefix and its own ancestors (:func:`~dflash_ref.ops.masks.tree_mask`, the window
measured along the branch). The tree stays pending until ``TargetState.commit_path(path)`` keeps
the accepted branch (each store's ``keep_path``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dflash_ref.models.cache import KVCache
from dflash_ref.models.kv_store import Remember


class TreeKV(Remember):
    """A tree verify batch over a plain :class:`KVCache` holding the committed prefix."""

    def __init__(self, cache: KVCache, arrays, window: int | None):
        self.cache, self.arrays, self.window = cache, arrays, window

    def update(self, k, v):
        base = self.cache.length
        keys, values = self.cache.append(k, v)
        self.last = keys, values, self.arrays.tree_mask(base, self.window)
        return self.last


@dataclass
class PendingTree:
    """A tree verify waiting for ``commit_path``: its span and node features."""

    start: int
    ids: np.ndarray  # [n] node tokens
    features: object  # [n, C*H] every node's features, or None without capture

    def check(self, path: np.ndarray) -> None:
        """Refuse a ``path`` that does not start at the root 0 or leaves the tree."""
        n = self.ids.size
        if path.size == 0 or path[0] != 0 or np.any(path >= n):
            raise ValueError(f"commit_path: path must start at the root 0 and index the "
                             f"{n} tree nodes, got {path.tolist()}")
