"""CuPy twin of :mod:`dflash_ref.ops.masks`.

Masks are described, then built (docs/attention.md): the attention kernel evaluates a MaskSpec
inline and needs no mask in memory. ``materialize`` exists for callers that want the dense
additive mask on the device (a dense baseline, debugging); it is plain CuPy array code running
the same :func:`dflash_ref.ops.masks.visible` predicate, not worth a kernel.
"""

from __future__ import annotations

import cupy as cp
import numpy as np

from dflash_ref.ops.masks import MaskSpec, visible


def materialize(spec: MaskSpec, dtype=np.float32) -> cp.ndarray:
    """Twin of :func:`dflash_ref.ops.masks.materialize`: [Tq, Tk], 0 visible / -inf not."""
    ok = visible(spec, xp=cp)  # [Tq, Tk] bool on the device
    dt = np.dtype(dtype)
    return cp.where(ok, dt.type(0.0), dt.type(-np.inf)).astype(dt)
