"""What one forward batch puts on the backend: one upload, then everything derived there, once.

On CuPy a host array that reaches device code is copied to the device there and then: host
positions given to the RoPE twin, a host ``np.arange`` inside a mask given to the attention
twin, host slots given to a pager write. Built in every layer, that was a few copies per layer
per decode step (docs/performance.md, "What was fixed by construction"). A :class:`BatchArrays`
is made once per forward by :meth:`~dflash_ref.models.state.TargetState.begin_batch`: it packs
the batch's small integer arrays into one host array and copies that to the backend once::

    pack = [ids; positions; slots (pooled chain only); ancestor rows (tree only)]  # [R, T] int32

Layers read views of that one copy, and what they derive from it is made on the backend the
first time a layer asks and reused by the others (per batch)::

    ids, positions, slots          rows of the copy                                    [T] int32
    ancestors                      tree only: [i, a] is True iff node a is i or above it  [T, T]
    causal_mask(S, window)         MaskSpec(positions, arange(S)): one per window kind
    causal_over(k_pos, window)     the same rule over a fixed store's slot positions [C]
    committed_mask(k_pos)          the pager's rule over its device slot table
    tree_mask(prefix, window)      keys [prefix..., nodes]: committed prefix, then ancestors
    once(key, make)                anything else (a layer type's proportional-RoPE cos / sin)

A tree commit has its own one upload: the accepted path's node indices (:class:`TreePath`),
which every store of the state reads.

Default and linear RoPE need no table: the ``rope`` op reads the device positions, and its
kernel forms the float32 angle and its sincos inline (a table would cost a launch per batch and
a read per element to save one sincosf); proportional RoPE (Gemma 4) runs as array code, so its
cos / sin table is built once per batch. On NumPy the copy is the pack itself; the code is the
same on both backends.

A state made for CUDA graphs passes ``buffers`` (models/graphs.py): the pack is then written
into the state's persistent device array of its shape (the first batch of a shape makes it), so
a captured step reads each step's ids and positions at the same addresses.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dflash_ref.ops.masks import (
    INT32_MAX,
    MaskSpec,
    ancestor_matrix,
    causal_mask,
    committed_prefix_mask,
)


class BatchArrays:
    """The backend arrays of one forward batch (module docstring).

    Args:
        be: the Backend.
        ids: [T] token ids (host).
        positions: [T] absolute positions (host; start + depth for a tree).
        start: the committed length before the batch (the masks' ``base_pos``).
        slots: [T] pager slots of a pooled chain batch (host, already checked), or None.
        parents: [T] tree parents (host; -1 for the root), or None for a chain.
        buffers: a dict pack shape -> persistent backend array (the state's, for CUDA graphs),
            or None: a new backend array per batch.
    """

    def __init__(self, be, ids, positions, start: int, slots=None, parents=None, buffers=None):
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        positions = np.asarray(positions, dtype=np.int64).reshape(-1)
        T = ids.size
        if positions.shape != (T,):
            raise ValueError(f"BatchArrays: {T} ids but positions of shape {positions.shape}")
        if T and (positions.min() < 0 or positions.max() > INT32_MAX):
            raise ValueError(
                f"BatchArrays: positions {positions.min()}..{positions.max()} must lie in "
                f"[0, 2^31 - 1]: the RoPE and attention kernels take int32 positions")
        rows = [ids, positions] + ([] if slots is None else [np.asarray(slots).reshape(-1)])
        pack = np.stack(rows)  # [R, T]
        if parents is not None:
            pack = np.concatenate([pack, ancestor_matrix(parents)])  # [R + T, T]
        dev = be.to_backend(pack.astype(np.int32))  # the batch's one host -> backend copy
        if buffers is not None:  # into the state's persistent array of this shape
            dev = _into(buffers, dev)
        self.be, self.start, self.host_positions = be, int(start), positions
        self.ids, self.positions = dev[0], dev[1]  # [T] int32 views
        self.slots = None if slots is None else dev[2]
        self.ancestors = None if parents is None else dev[len(rows):] != 0  # [T, T] bool
        self._derived: dict = {}

    def once(self, key, make: Callable):
        """``make()`` on the first call with ``key`` in this batch; the same object afterwards."""
        if key not in self._derived:
            self._derived[key] = make()
        return self._derived[key]

    def causal_mask(self, n_keys: int, window: int | None) -> MaskSpec:
        """The batch's queries over a plain cache's keys at positions 0..n_keys-1, causal, with
        the layer's sliding window (or None): :func:`~dflash_ref.ops.masks.causal_mask`."""
        key = ("causal", n_keys, window)
        if key not in self._derived:  # the first layer of the kind in this batch
            xp = self.be.xp
            self._derived[key] = causal_mask(self.positions, xp.arange(n_keys, dtype=xp.int32),
                                             window=window)
        return self._derived[key]

    def causal_over(self, k_pos, window: int | None) -> MaskSpec:
        """The batch's queries over a fixed-capacity store's slots at positions ``k_pos`` [C]
        (a backend array, the same object every batch): causal, with the layer's window. Keys
        past the queries are hidden by ``k <= q``, so the key count is no shape
        (models/graphs.py)."""
        return self.once(("causal_over", id(k_pos), window),
                         lambda: causal_mask(self.positions, k_pos, window=window))

    def committed_mask(self, k_pos) -> MaskSpec:
        """The pager's rule over its slot table ``k_pos`` [P] (a backend array, the same object
        for every layer of a batch): :func:`~dflash_ref.ops.masks.committed_prefix_mask` with
        base_pos = start."""
        key = ("committed", id(k_pos))
        if key not in self._derived:  # the first pooled layer in this batch
            self._derived[key] = committed_prefix_mask(self.positions, k_pos,
                                                       base_pos=self.start)
        return self._derived[key]

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


def _into(buffers: dict, dev):
    """``dev`` [R, T] copied into ``buffers``' array of its shape (``dev`` itself becomes that
    array the first time); returns the persistent array."""
    buf = buffers.get(dev.shape)
    if buf is None:
        buffers[dev.shape] = dev
        return dev
    buf[...] = dev  # [R, T] device -> device, at the addresses a captured step reads
    return buf
