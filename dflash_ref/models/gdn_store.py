"""One Gated DeltaNet layer's state for a whole sequence, and the views a forward runs it through.

A GDN layer's state is a fixed-size summary of every token so far (docs/gdn.md): unlike K/V
rows it cannot be cut at an earlier position. So the store keeps, beside the state, what a cut
needs, and refuses any other:

- the last chain batch (:class:`ChainTrace`): its span, the state before it and, for a batch of
  at most :data:`TRACE_MAX_TOKENS` tokens, the per-token trace. :meth:`GDNStore.truncate`
  rewinds inside that batch (:func:`~dflash_ref.models.gdn_layer.rewind_state`), nowhere else;
- a pending tree verify's node states (:class:`~dflash_ref.models.gdn_layer.GDNTreeStates`):
  :meth:`GDNStore.keep_path` keeps the state after the accepted path's last node.

A decoder layer sees one view per forward, ``batch.gdn[i].run(mixer, u)``: :class:`ChainGDN` or
:class:`TreeGDN`. The store never calls into the model beyond the ``mixer`` a view is handed.
"""

from __future__ import annotations

from dataclasses import dataclass

from dflash_ref.errors import StateError
from dflash_ref.models.batch_arrays import BatchArrays
from dflash_ref.models.gdn_layer import GDNState, GDNTrace, GDNTreeStates, rewind_state
from dflash_ref.models.stores import Store
from dflash_ref.models.tree import TreePath

TRACE_MAX_TOKENS = 64
"""A batch of at most this many tokens keeps the GDN per-token trace (recurrent scan) so that
rollback can rewind into it; longer batches (prefill) take the chunked scan and keep none."""


@dataclass
class ChainTrace:
    """The last chain batch through a GDN layer: positions start .. start + length - 1.

    ``before``: the state before the batch; ``trace``: its per-token trace, or None for a batch
    longer than TRACE_MAX_TOKENS (no rewind possible then).
    """

    start: int
    length: int
    before: GDNState
    trace: GDNTrace | None


class GDNStore(Store):
    """The state of GDN layer ``layer`` after positions 0..length-1 (module docstring).

    Attributes:
        state: the :class:`~dflash_ref.models.gdn_layer.GDNState` after position length - 1,
            None before any token.
        length: the positions the state covers (the committed length).
        last: the last chain batch (:class:`ChainTrace`), None after a tree commit or restore.
        tree: a pending tree verify's node states, None when none is pending.
    """

    def __init__(self, be, layer: int):
        self.be, self.layers, self.layer = be, (layer,), layer
        self.state: GDNState | None = None
        self.length = 0
        self.last: ChainTrace | None = None
        self.tree: GDNTreeStates | None = None

    def views(self, arrays: BatchArrays, parents) -> dict:
        if parents is not None:
            return {self.layer: TreeGDN(self, parents)}
        keep_trace = arrays.host_positions.size <= TRACE_MAX_TOKENS
        return {self.layer: ChainGDN(self, arrays.start, keep_trace)}

    def refusal(self, n: int) -> str | None:
        """None when ``n`` lies in the last chain batch and its trace was kept."""
        last = self.last
        if last is None or not last.start <= n <= last.start + last.length:
            span = "none" if last is None else f"[{last.start}, {last.start + last.length}]"
            return (f"GDN layers can only rewind within the last forward batch (positions "
                    f"{span}); re-run the prefix from a saved state instead")
        if last.trace is None:
            return (f"the last batch had {last.length} tokens, more than "
                    f"TRACE_MAX_TOKENS={TRACE_MAX_TOKENS}, so no GDN trace was kept; run long "
                    f"prefills before speculating, or in smaller batches")
        return None

    def truncate(self, n: int) -> None:
        """Rewind into the last chain batch (``refusal(n)`` is None)."""
        self.state = self._rewound(n)
        self.length = n

    def _rewound(self, n: int) -> GDNState:
        last = self.last
        return rewind_state(last.before, last.trace, n - last.start, self.be.xp)

    def keep_path(self, path: TreePath) -> None:
        """The state after the path's last node; a tree commit cannot be rewound further."""
        self.state = self.tree.node(int(path.nodes[-1]))
        self.length = path.start + path.nodes.size
        self.tree, self.last = None, None

    def snapshot(self, n: int) -> dict:
        """The state at ``n``: the committed length, or inside the last chain batch."""
        if n == self.length:
            return {self.layer: None if self.state is None else self.state.copy()}
        if self.refusal(n) is not None:
            raise StateError(
                f"snapshot(upto={n}): a GDN state cannot be truncated; it exists at the "
                f"committed length {self.length} and inside the last batch only. Take "
                f"checkpoints while prefilling (snapshot after each prefill piece) instead")
        return {self.layer: self._rewound(n)}

    def restore(self, length: int, pieces: dict) -> None:
        state = pieces[self.layer]
        self.state = None if state is None else state.copy()
        self.length = length
        self.tree, self.last = None, None


class ChainGDN:
    """A chain batch through one GDN layer: run from the committed state, keep the trace."""

    def __init__(self, store: GDNStore, start: int, keep_trace: bool):
        self.store, self.start, self.keep_trace = store, start, keep_trace

    def run(self, mixer, u):
        """``mixer`` (a GDNLayer) over u [T, hidden] from the committed state; returns y."""
        before = self.store.state or mixer.initial_state()
        y, after, trace = mixer.forward(u, before, return_trace=self.keep_trace)
        self.store.state = after
        self.store.last = ChainTrace(self.start, u.shape[0], before, trace)
        self.store.length = self.start + u.shape[0]
        return y


class TreeGDN:
    """A tree batch through one GDN layer: the layer runs once over all nodes, node i from its
    parent's state (``GDNLayer.forward_tree``).

    The root starts from the committed state. Every node's state is kept in the store
    (:class:`~dflash_ref.models.gdn_layer.GDNTreeStates`) so that :meth:`GDNStore.keep_path`
    can keep the state after the accepted path's last node.
    """

    def __init__(self, store: GDNStore, parents):
        self.store, self.parents = store, parents

    def run(self, mixer, u):
        """``mixer`` (a GDNLayer) over the tree's nodes u [n, hidden]; returns y [n, hidden]."""
        root = self.store.state or mixer.initial_state()
        y, node_states = mixer.forward_tree(u, root, self.parents)
        self.store.tree = node_states
        return y
