"""CuPy twins of :mod:`dflash_ref.ops.gdn_tree` (kernels in cuda/gdn_tree.cu).

- :func:`gdn_tree_recurrent`: one launch for the whole tree; each block walks the nodes in
  order and reloads a parent's state from the [n, HV, K, V] output it writes (registers carry
  it along a chain).
- :func:`causal_conv1d_tree`: two grid-stride kernels (outputs, per-node conv states) reading
  through the window table :func:`dflash_ref.ops.gdn_tree.tree_conv_window`.

The tree's parents are a host array (the tree is built on the host): they are checked there with
the reference's own check and uploaded with the window table; CuPy copies host arrays through
pinned memory asynchronously, so nothing here waits for the GPU.
"""

from __future__ import annotations

import cupy as cp
import numpy as np

from dflash_ref.ops.gdn import check_conv_args
from dflash_ref.ops.gdn_tree import check_tree_parents, tree_conv_window
from kernels_cupy._build import get_kernel
from kernels_cupy._launch import f32, fp32, i32, launch_elementwise
from kernels_cupy.gdn import _inputs

TREE_COLS, TREE_WARPS = 32, 8  # GDN_TREE_COLS, GDN_TREE_WARPS: block of gdn_tree_recurrent_f32
MAX_K_TREE = 256  # GDN_TREE_WARPS x GDN_TREE_MAX_ROWS (gdn_tree.cu)


def gdn_tree_recurrent(q, k, v, g, beta, state, parents, scale=None):
    """Twin of :func:`dflash_ref.ops.gdn_tree.gdn_tree_recurrent` (same arguments and returns;
    ``parents`` on the host)."""
    q, k, v, g, beta, state, (n, H, HV, K, V, kda) = _inputs(
        "gdn_tree_recurrent", q, k, v, g, beta, state)
    host = check_tree_parents(parents, n, "gdn_tree_recurrent")
    if K > MAX_K_TREE:
        raise ValueError(f"gdn_tree_recurrent (cupy): head_k_dim K={K} > {MAX_K_TREE} unsupported")
    scale = K ** -0.5 if scale is None else scale
    o = cp.empty((n, HV, V), cp.float32)
    node_states = cp.empty((n, HV, K, V), cp.float32)
    if n == 0:
        return o, node_states
    grid = (HV, -(-V // TREE_COLS))  # lanes along the contiguous V axis: coalesced state I/O
    get_kernel("gdn_tree", "gdn_tree_recurrent_f32")(
        grid, (TREE_COLS, TREE_WARPS),
        (q, k, v, g, beta, state, cp.asarray(host.astype(np.int32)), node_states, o, i32(n),
         i32(H), i32(HV), i32(K), i32(V), i32(kda), fp32(scale)),
    )
    return o, node_states


def causal_conv1d_tree(x, weight, conv_state, parents):
    """Twin of :func:`dflash_ref.ops.gdn_tree.causal_conv1d_tree`: x [n, D], weight [D, W],
    conv_state [D, W - 1] or None, host parents [n]."""
    op = "causal_conv1d_tree"
    x, w = f32(x, op, "x"), f32(weight, op, "weight")
    state = None if conv_state is None else f32(conv_state, op, "conv_state")
    n, D, W = check_conv_args(x, w, state, op)
    host = check_tree_parents(parents, n, op)
    if state is None:
        state = cp.zeros((D, W - 1), cp.float32)
    window = cp.asarray(tree_conv_window(host, W).astype(np.int32))  # [n, W], built on the host
    y = cp.empty((n, D), cp.float32)
    node_states = cp.empty((n, D, W - 1), cp.float32)
    launch_elementwise("gdn_tree", "causal_conv1d_tree_f32", n * D,
                       (x, w, state, window, y, i32(n), i32(D), i32(W)))
    launch_elementwise("gdn_tree", "conv_tree_states_f32", n * D * (W - 1),
                       (x, state, window, node_states, i32(n), i32(D), i32(W)))
    return y, node_states
