"""gdn_tree_recurrent_f32's walk over the tree, checked on CPU (no GPU needed).

Every block of the kernel walks the nodes in index order and keeps the state of the node it
stepped last in registers; it reloads only when ``parents[t]`` is another node, from
node_states[parents[t]] (elements the same thread wrote) or from state_in for a root. The
control flow depends on ``parents`` only, so all blocks take the same branches. The emulation
below runs that walk in NumPy (the per-thread arithmetic is gdn_recurrent_f32's, emulated in
tests/kernels/test_gdn_plan.py) with node_states filled with NaN, so reading a node that was not
written yet would show.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from dflash_ref.ops.gdn import recurrent_step
from dflash_ref.ops.gdn_tree import gdn_tree_recurrent
from dflash_ref.testing import assert_close
from kernels_cupy import _build
from kernels_cupy import gdn_tree as kt
from tests.ops.test_gdn import make_inputs
from tests.strategies import TREE_SHAPES, tree_parents


def _define(name: str) -> int:
    src = (_build.CUDA_DIR / "gdn_tree.cu").read_text()
    return int(re.search(rf"#define {name} (\d+)", src).group(1))


def test_constants_match_the_cuda_source():
    assert (kt.TREE_COLS, kt.TREE_WARPS) == (_define("GDN_TREE_COLS"), _define("GDN_TREE_WARPS"))
    assert kt.MAX_K_TREE == _define("GDN_TREE_WARPS") * _define("GDN_TREE_MAX_ROWS")


def emulate_tree_walk(q, k, v, g, beta, state, parents, scale):
    """The kernel's node loop (all heads at once): returns (o, node_states, reloads), reloads
    being the parent read at each reload (-1: state_in)."""
    n, H, _ = q.shape
    HV, K, V = state.shape
    qh, kh = np.repeat(q, HV // H, axis=1), np.repeat(k, HV // H, axis=1)  # grouped GQA
    node_states = np.full((n, HV, K, V), np.nan, np.float32)  # unwritten memory reads NaN
    o = np.full((n, HV, V), np.nan, np.float32)
    held, s, reloads = -2, None, []
    for t in range(n):
        p = int(parents[t])
        if p != held:  # registers hold another node's state: reload the parent's
            s = (state if p < 0 else node_states[p]).copy()
            reloads.append(p)
        o[t] = recurrent_step(s, qh[t], kh[t], v[t], np.exp(g[t]), beta[t], np.float32(scale))
        node_states[t] = s  # what a later child of t reloads
        held = t
    return o, node_states, reloads


@pytest.mark.parametrize("shape", TREE_SHAPES)
@pytest.mark.parametrize("kda", [False, True])
def test_tree_walk_matches_the_reference(rng, shape, kda):
    parents = tree_parents(shape, 13, rng)
    args = tuple(a.astype(np.float32) for a in make_inputs(rng, 13, 1, 2, 6, 5, kda=kda))
    o, states, reloads = emulate_tree_walk(*args, parents, 6 ** -0.5)
    o_r, states_r = gdn_tree_recurrent(*args, parents)
    # Registers carried along a chain hold exactly what was stored: bit-identical.
    assert_close(o, o_r, "exact", op="gdn_tree_recurrent_f32 (walk)", case=shape)
    assert_close(states, states_r, "exact", op="gdn_tree_recurrent_f32 (walk)",
                 tensor="node_states", case=shape)
    # A reload happens exactly where a node's parent is not the node stepped just before it.
    want = [int(p) for t, p in enumerate(parents) if t == 0 or p != t - 1]
    assert reloads == want


def test_a_chain_loads_the_state_once_and_a_star_reloads_the_root():
    rng = np.random.default_rng(0)
    args = tuple(a.astype(np.float32) for a in make_inputs(rng, 6, 1, 1, 4, 3))
    assert emulate_tree_walk(*args, np.arange(6) - 1, 0.5)[2] == [-1]
    assert emulate_tree_walk(*args, np.array([-1, 0, 0, 0, 0, 0]), 0.5)[2] == [-1, 0, 0, 0, 0]


def test_a_thread_reloads_only_the_addresses_it_wrote():
    # Thread (lane, wy) of block (hv, tile) writes node t's rows kk = wy + 8 i of column col at
    # (t HV + hv) K V + kk V + col and reloads a parent p at p HV K V + (hv K + kk) V + col
    # (the kernel's two expressions): the same addresses, so no barrier is needed.
    HV, K, V = 3, 40, 70
    for t, hv, kk, col in [(0, 0, 0, 0), (5, 2, 39, 69), (7, 1, 17, 33)]:
        written = ((t * HV + hv) * K + kk) * V + col
        reloaded = t * HV * K * V + (hv * K + kk) * V + col
        assert written == reloaded
