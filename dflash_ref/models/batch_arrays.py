"""What one forward batch puts on the backend: one upload, then everything derived there, once.

:meth:`~dflash_ref.models.state.TargetState.begin_batch` makes one per forward (on CuPy each
host array reaching device code is a copy), its small integer arrays packed and copied once::

    pack = [ids; positions; slots (pooled chain only); ancestor rows (tree only)]  # [R, T] int32

Layers read views of that copy; what they derive from it is made on the backend the first time
a layer asks and reused by the others: ``causal_mask`` (one per window kind), ``causal_over``
(over a fixed store's slot positions), ``committed_mask`` (the pager's rule), ``once(key,
make)`` for anything else; a tree's mask is :class:`~dflash_ref.models.tree.TreeArrays`'. A
state made for CUDA graphs passes ``buffers``: each pack is written into its persistent array
of that shape, so a captured step reads each step's inputs at one address.
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
    """The backend arrays of one forward batch: host ``ids`` [T], ``positions`` [T] (start +
    depth for a tree), ``start`` (the committed length: the masks' ``base_pos``), pooled
    ``slots`` [T] or None, tree ``parents`` [T] or None, ``buffers`` (shape -> persistent
    array, for CUDA graphs) or None."""

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
        """Queries over a plain cache's keys at 0..n_keys-1, causal, with the layer's window."""
        key = ("causal", n_keys, window)
        if key not in self._derived:  # the first layer of the kind in this batch
            xp = self.be.xp
            self._derived[key] = causal_mask(self.positions, xp.arange(n_keys, dtype=xp.int32),
                                             window=window)
        return self._derived[key]

    def causal_over(self, k_pos, window: int | None) -> MaskSpec:
        """Queries over a fixed store's slot positions ``k_pos`` [C] (the same backend array
        every batch), causal, with the layer's window: the key count is no shape."""
        return self.once(("causal_over", id(k_pos), window),
                         lambda: causal_mask(self.positions, k_pos, window=window))

    def committed_mask(self, k_pos) -> MaskSpec:
        """The pager's rule over its slot table ``k_pos`` [P] (a backend array):
        :func:`~dflash_ref.ops.masks.committed_prefix_mask`, base_pos = start."""
        key = ("committed", id(k_pos))
        if key not in self._derived:  # the first pooled layer in this batch
            self._derived[key] = committed_prefix_mask(self.positions, k_pos,
                                                       base_pos=self.start)
        return self._derived[key]


def _into(buffers: dict, dev):
    """``dev`` [R, T] copied into ``buffers``' array of its shape (the first time: ``dev``)."""
    buf = buffers.get(dev.shape)
    if buf is None:
        buffers[dev.shape] = dev
        return dev
    buf[...] = dev  # [R, T] device -> device, at the addresses a captured step reads
    return buf
