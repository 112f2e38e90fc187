"""Gated DeltaNet over a draft tree: the short conv and the recurrence, every node in one call.

A tree verify (DDTree, docs/spec_decode.md) feeds n nodes at once; node i has parent
``parents[i] < i`` (-1: a root, which continues the committed sequence). Each node must see
exactly what it would see if its root-to-node path had been run as a chain (docs/gdn.md, "Tree
verify: every node in one pass"):

- the conv window of node i is its own raw input, then its ancestors' (nearest last), continued
  by the committed conv state once the ancestry runs out (:func:`tree_conv_window`);
- the recurrence steps node i from its parent's state (a root from the committed state), with the
  five steps of :func:`dflash_ref.ops.gdn.gdn_recurrent` in the same order.

Both return the state after every node, so the state after any accepted path is a copy of its
last node's. Shapes follow :mod:`dflash_ref.ops.gdn` with T = n nodes.
"""

from __future__ import annotations

import numpy as np

from dflash_ref.ops._dtypes import in_compute_dtype
from dflash_ref.ops.gdn import _check_gdn_inputs, _expand_qk, check_conv_args, recurrent_step
from dflash_ref.ops.norm import silu


def check_tree_parents(parents, n: int, op: str) -> np.ndarray:
    """``parents`` as a host int64 array [n], checked: -1 <= parents[i] < i (topological order).

    Host only (NumPy, a list): a tree is built on the host, and the CuPy twins check it there
    before one upload, so no check waits for the GPU.
    """
    if type(parents).__module__.startswith("cupy"):
        raise TypeError(f"{op}: parents must be a host array (NumPy or a list), got a CuPy "
                        f"array; pass the tree's parents as built on the host")
    parents = np.asarray(parents)
    if parents.shape != (n,) or not (n == 0 or np.issubdtype(parents.dtype, np.integer)):
        raise ValueError(f"{op}: parents must be an integer array [n={n}] (one parent per "
                         f"node), got {parents.dtype} {parents.shape}")
    parents = parents.astype(np.int64)
    bad = np.flatnonzero((parents < -1) | (parents >= np.arange(n)))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{op}: tree parents must be topologically ordered (-1 <= parents[i] "
                         f"< i, -1 for a root); parents[{i}] = {int(parents[i])}")
    return parents


def tree_conv_window(parents, W: int) -> np.ndarray:
    """[n, W] rows of ``xx = concat(conv_state^T, x)`` [W - 1 + n, D] that node i's conv reads,
    oldest first; column W - 1 is the node itself (row W - 1 + i).

    Columns 0..W-2 are the ancestor table: the conv state node i starts from (its ancestors'
    inputs, nearest last, continued by the committed state's columns once the ancestry runs
    out). Columns 1..W-1 are node i's conv state afterwards.

    Built backwards from one predecessor map on the rows of xx: a node's predecessor is its
    parent's row (``W - 1 + parents[i]``, which for a root, -1, is the state's newest column
    W - 2), a state column's is the column before it. W - 1 gathers, each over all nodes.
    Example, W = 3, parents [-1, 0, 0, 2] (rows 0, 1: state; 2..5: nodes)::

        node 0: [0, 1, 2]   node 1: [1, 2, 3]   node 2: [1, 2, 4]   node 3: [2, 4, 5]
    """
    parents = np.asarray(parents, dtype=np.int64)
    n = parents.shape[0]
    prev = np.concatenate([np.arange(W - 1) - 1, (W - 1) + parents])  # [W - 1 + n]
    window = np.empty((n, W), np.int64)
    window[:, W - 1] = (W - 1) + np.arange(n)  # the node itself
    for j in range(W - 2, -1, -1):
        window[:, j] = prev[window[:, j + 1]]  # one step back along the branch
    return window


def causal_conv1d_tree(x, weight, conv_state, parents):
    """:func:`dflash_ref.ops.gdn.causal_conv1d` on every node of a tree at once.

    For node i with window rows ``w_i = tree_conv_window(parents, W)[i]`` and
    ``xx = concat(conv_state^T, x)``::

        y[i, c]          = silu( sum_{j=0}^{W-1} weight[c, j] * xx[w_i[j], c] )
        node_states[i]   = xx[w_i[1:]]^T        the last W - 1 raw inputs of the path, oldest first

    which is what ``causal_conv1d`` returns for the last token of the root-to-i path, and the
    state it leaves (the same products, summed in the same tap order).

    Args:
        x: [n, D] raw inputs of the n nodes (node order).
        weight: [D, W]; conv_state: [D, W - 1] the committed state, or None for zeros.
        parents: [n] host integers, -1 <= parents[i] < i.
    Returns:
        ``(y, node_states)``: y [n, D], node_states [n, D, W - 1].
    """
    x, weight, conv_state = in_compute_dtype(x, weight, conv_state)
    dt = x.dtype
    n, D, W = check_conv_args(x, weight, conv_state, "causal_conv1d_tree")
    parents = check_tree_parents(parents, n, "causal_conv1d_tree")
    state = np.zeros((D, W - 1), dt) if conv_state is None else conv_state
    xx = np.concatenate([state.T, x], axis=0)  # [W - 1 + n, D]
    window = xx[tree_conv_window(parents, W)]  # [n, W, D]
    acc = np.zeros((n, D), dt)
    for j in range(W):
        acc += weight[:, j] * window[:, j]  # tap j, oldest first, as causal_conv1d
    node_states = np.ascontiguousarray(window[:, 1:].transpose(0, 2, 1))  # [n, D, W - 1]
    return silu(acc), node_states


def gdn_tree_recurrent(q, k, v, g, beta, state, parents, scale=None):
    """:func:`dflash_ref.ops.gdn.gdn_recurrent` on every node of a tree at once.

    Node i starts from ``node_states[parents[i]]`` (a root, parents[i] = -1, from ``state``) and
    takes one step of the recurrence, in gdn_recurrent's order (docs/gdn.md, "Shapes and the
    recurrence")::

        S <- exp(g_i) * S;  r = S^T k_i;  d = beta_i (v_i - r);  S <- S + k_i d^T;
        o_i = scale * S^T q_i;  node_states[i] = S

    so ``o[i]`` and ``node_states[i]`` are gdn_recurrent's last output and final state on the
    root-to-i path. Grouped GQA (value head h reads q/k head h // r) and KDA gates as there.
    The reference loops over nodes in index order (a parent always comes first); every step is
    vectorised over the value heads.

    Args:
        q, k: [n, H, K]; v: [n, HV, V]; g: [n, HV] or [n, HV, K]; beta: [n, HV].
        state: [HV, K, V] the committed state, or None for zeros. Not modified.
        parents: [n] host integers, -1 <= parents[i] < i.
        scale: output scale; None means K ** -0.5.
    Returns:
        ``(o, node_states)``: o [n, HV, V], node_states [n, HV, K, V].
    """
    q, k, v, g, beta, state = in_compute_dtype(q, k, v, g, beta, state)
    dt = q.dtype
    n, H, HV, K, V, _ = _check_gdn_inputs(q, k, v, g, beta, state)
    parents = check_tree_parents(parents, n, "gdn_tree_recurrent")
    scale = dt.type(K ** -0.5 if scale is None else scale)
    qh, kh = _expand_qk(q, HV // H), _expand_qk(k, HV // H)  # [n, HV, K]
    decay = np.exp(g)  # [n, HV] or [n, HV, K]
    root = np.zeros((HV, K, V), dt) if state is None else state  # [HV, K, V]
    o = np.empty((n, HV, V), dt)
    node_states = np.empty((n, HV, K, V), dt)
    for i in range(n):  # topological order: node_states[parents[i]] is already final
        S = (root if parents[i] < 0 else node_states[parents[i]]).copy()  # [HV, K, V]
        o[i] = recurrent_step(S, qh[i], kh[i], v[i], decay[i], beta[i], scale)
        node_states[i] = S
    return o, node_states
