"""causal_conv1d_tree and gdn_tree_recurrent: hand-checked trees, the float64 closed form on
every root-to-node path, hypothesis properties against the chain ops, and NumPy vs CuPy.

The oracles are the chain ops run on each root-to-node path (``causal_conv1d``,
``gdn_recurrent``: what tree verify did before, one node at a time) and the independent float64
closed form of tests/ops/test_gdn.py. docs/gdn.md, "Tree verify: every node in one pass", has the
equations and the drawn ancestor table.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dflash_ref.ops.gdn import causal_conv1d, gdn_recurrent
from dflash_ref.ops.gdn_tree import causal_conv1d_tree, gdn_tree_recurrent, tree_conv_window
from dflash_ref.testing import assert_close
from tests.gpu import check_twin
from tests.ops.test_gdn import closed_form_recurrence, make_inputs
from tests.strategies import TREE_SHAPES, root_to_node, tree_parents, trees

# ---------------------------------------------------------------- unit: hand-checked values


def test_conv_window_drawn_by_hand():
    # W = 3, parents [-1, 0, 0, 2]: rows 0, 1 of xx are the committed state (oldest first),
    # rows 2..5 the nodes 0..3.        state: s0 s1 | nodes: 0 1 2 3
    #   node 0 (root):  s0 s1  0       rows [0, 1, 2]
    #   node 1 (of 0):  s1  0  1       rows [1, 2, 3]
    #   node 2 (of 0):  s1  0  2       rows [1, 2, 4]   (not node 1: a sibling, not an ancestor)
    #   node 3 (of 2):   0  2  3       rows [2, 4, 5]
    want = [[0, 1, 2], [1, 2, 3], [1, 2, 4], [2, 4, 5]]
    np.testing.assert_array_equal(tree_conv_window([-1, 0, 0, 2], 3), want)
    # W = 4, a chain of 2 under a second root: node 2 (a root) restarts from the state.
    np.testing.assert_array_equal(tree_conv_window([-1, 0, -1], 4),
                                  [[0, 1, 2, 3], [1, 2, 3, 4], [0, 1, 2, 5]])
    # W = 1: no state, the window is the node itself.
    np.testing.assert_array_equal(tree_conv_window([-1, 0], 1), [[0], [1]])


def test_causal_conv1d_tree_by_hand():
    # D = 1, W = 3, weight [1, 10, 100] (tap 0 oldest), state [1, 2], node inputs 3, 4, 5, 6,
    # parents [-1, 0, 0, 2]. Windows (table above): [1 2 3], [2 3 4], [2 3 5], [3 5 6], so the
    # pre-SiLU sums read the window as digits: 321, 432, 532, 653; silu(x) = x there in float64
    # (1 + e^-321 == 1). Node states: the window without its oldest input.
    y, states = causal_conv1d_tree(np.array([[3.0], [4.0], [5.0], [6.0]]),
                                   np.array([[1.0, 10.0, 100.0]]), np.array([[1.0, 2.0]]),
                                   [-1, 0, 0, 2])
    assert_close(y[:, 0], [321.0, 432.0, 532.0, 653.0], "float64", op="causal_conv1d_tree")
    assert_close(states[:, 0], [[2, 3], [3, 4], [3, 5], [5, 6]], "exact",
                 op="causal_conv1d_tree", tensor="node_states")


def test_tree_recurrence_siblings_by_hand():
    # K = 2, V = 1, scale 1, committed state S0 = [[2], [4]]; root 0 with two children 1 and 2.
    # node 0: g = log 0.5, beta 0.5, k = e1, v = 3, q = [0.6, 0.8] (tests/ops/test_gdn.py's hand
    #   step): S = [2, 2], o = 2.8
    # node 1 (of 0): g = 0, beta = 1, k = e2, v = 5, q = e2: read 2, delta 3, S = [2, 5], o = 5
    # node 2 (of 0): g = log 0.5, beta 0.5, k = e1, v = 0, q = [0.6, 0.8]: decay [1, 1], read 1,
    #   delta -0.5, S = [0.5, 1], o = 0.3 + 0.8 = 1.1
    # (starting node 2 from node 1's state would give S = [0.5, 2.5], o = 2.3; from the committed
    # state S = [0.5, 2], o = 1.9)
    q = np.array([[[0.6, 0.8]], [[0.0, 1.0]], [[0.6, 0.8]]])
    k = np.array([[[1.0, 0.0]], [[0.0, 1.0]], [[1.0, 0.0]]])
    v = np.array([[[3.0]], [[5.0]], [[0.0]]])
    g = np.log(np.array([[0.5], [1.0], [0.5]]))
    beta = np.array([[0.5], [1.0], [0.5]])
    S0 = np.array([[[2.0], [4.0]]])
    o, states = gdn_tree_recurrent(q, k, v, g, beta, S0, [-1, 0, 0], scale=1.0)
    assert_close(o[:, 0, 0], [2.8, 5.0, 1.1], "float64", op="gdn_tree_recurrent", tensor="o")
    assert_close(states[:, 0, :, 0], [[2.0, 2.0], [2.0, 5.0], [0.5, 1.0]], "float64",
                 op="gdn_tree_recurrent", tensor="node_states")
    assert_close(S0, [[[2.0], [4.0]]], "exact", op="gdn_tree_recurrent", tensor="S0 not modified")


@pytest.mark.parametrize("kda", [False, True])
def test_tree_recurrence_matches_the_closed_form_on_every_path(rng, kda):
    # float64 oracle independent of the code under test: the explicit-matrix closed form of
    # tests/ops/test_gdn.py on each root-to-node path. GQA r = 3, a deep-and-wide tree.
    parents = np.array([-1, 0, 1, 1, 0, 4, 5, 3])
    q, k, v, g, beta, S0 = make_inputs(rng, 8, 1, 3, 5, 4, kda=kda)
    o, states = gdn_tree_recurrent(q, k, v, g, beta, S0, parents)
    for i in range(len(parents)):
        p = root_to_node(parents, i)
        o_ref, S_ref = closed_form_recurrence(q[p], k[p], v[p], g[p], beta[p], S0, 5 ** -0.5)
        assert_close(o[i], o_ref[-1], "float64_gdn", op="gdn_tree_recurrent", case=f"node {i}")
        assert_close(states[i], S_ref, "float64_gdn", op="gdn_tree_recurrent",
                     tensor="node_states", case=f"node {i}")


def test_bad_parents_are_explained(rng):
    q, k, v, g, beta, S0 = make_inputs(rng, 3, 1, 1, 2, 2)
    x, w = rng.standard_normal((3, 4)), rng.standard_normal((4, 3))
    for bad, msg in [([-1, 1, 0], r"parents\[1\] = 1"), ([-1, 0, -2], r"parents\[2\] = -2"),
                     ([-1, 0], r"\[n=3\]"), ([-1.0, 0.0, 0.0], "integer")]:
        with pytest.raises(ValueError, match=msg):
            gdn_tree_recurrent(q, k, v, g, beta, S0, bad)
        with pytest.raises(ValueError, match=msg):
            causal_conv1d_tree(x, w, None, bad)
    with pytest.raises(ValueError, match=r"causal_conv1d_tree: state must be \[D, W-1\]"):
        causal_conv1d_tree(x, w, np.zeros((4, 3)), [-1, 0, 1])


def test_empty_tree(rng):
    q, k, v, g, beta, S0 = make_inputs(rng, 0, 1, 2, 3, 4)
    o, states = gdn_tree_recurrent(q, k, v, g, beta, S0, np.zeros(0, np.int64))
    assert o.shape == (0, 2, 4) and states.shape == (0, 2, 3, 4)
    y, cs = causal_conv1d_tree(np.zeros((0, 5)), np.ones((5, 4)), None, [])
    assert y.shape == (0, 5) and cs.shape == (0, 5, 3)


# ---------------------------------------------------------------- properties: tree == paths


@st.composite
def tree_cases(draw):
    return dict(
        parents=draw(trees(max_nodes=10)), H=draw(st.integers(1, 2)),
        r=draw(st.sampled_from([1, 2, 3])), K=draw(st.sampled_from([1, 3, 8])),
        V=draw(st.sampled_from([1, 5])), kda=draw(st.booleans()), init=draw(st.booleans()),
        D=draw(st.sampled_from([1, 3, 7])), W=draw(st.sampled_from([1, 2, 4])),
        dtype=draw(st.sampled_from([np.float32, np.float64])),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


@given(tree_cases())
def test_tree_ops_equal_the_chain_ops_on_every_root_to_node_path(case):
    # What tree verify did before: run each node's path with the chain op. The same operations
    # in the same order, so the results are bit-identical (float32 and float64).
    parents, n, dt = case["parents"], len(case["parents"]), case["dtype"]
    rng = np.random.default_rng(case["seed"])
    q, k, v, g, beta, S0 = make_inputs(rng, n, case["H"], case["H"] * case["r"], case["K"],
                                       case["V"], kda=case["kda"], init=case["init"], dtype=dt)
    x = rng.standard_normal((n, case["D"])).astype(dt)
    w = rng.standard_normal((case["D"], case["W"])).astype(dt)
    c0 = rng.standard_normal((case["D"], case["W"] - 1)).astype(dt) if case["init"] else None
    o, states = gdn_tree_recurrent(q, k, v, g, beta, S0, parents)
    y, conv_states = causal_conv1d_tree(x, w, c0, parents)
    assert o.dtype == states.dtype == y.dtype == conv_states.dtype == dt
    for i in range(n):
        p, where = root_to_node(parents, i), f"node {i} of {parents.tolist()}"
        o_p, S_p = gdn_recurrent(q[p], k[p], v[p], g[p], beta[p], S0)
        assert_close(o[i], o_p[-1], "exact", op="gdn_tree_recurrent", case=where)
        assert_close(states[i], S_p, "exact", op="gdn_tree_recurrent", tensor="node_states",
                     case=where)
        y_p, c_p = causal_conv1d(x[p], w, c0)
        assert_close(y[i], y_p[-1], "exact", op="causal_conv1d_tree", case=where)
        assert_close(conv_states[i], c_p, "exact", op="causal_conv1d_tree",
                     tensor="node_states", case=where)


@given(st.integers(1, 20), st.booleans(), st.integers(0, 2**32 - 1))
def test_a_chain_shaped_tree_is_gdn_recurrent_with_its_trace(n, kda, seed):
    rng = np.random.default_rng(seed)
    args = make_inputs(rng, n, 2, 4, 6, 5, kda=kda, dtype=np.float32)
    o, S, trace = gdn_recurrent(*args, return_trace=True)
    o_t, states = gdn_tree_recurrent(*args, np.arange(n) - 1)
    assert_close(o_t, o, "exact", op="gdn_tree_recurrent", case="chain")
    assert_close(states, trace, "exact", op="gdn_tree_recurrent", tensor="node_states = trace")
    x, w = rng.standard_normal((n, 3)), rng.standard_normal((3, 4))
    c0 = rng.standard_normal((3, 3))
    y, c_end = causal_conv1d(x, w, c0)
    y_t, conv_states = causal_conv1d_tree(x, w, c0, np.arange(n) - 1)
    assert_close(y_t, y, "exact", op="causal_conv1d_tree", case="chain")
    assert_close(conv_states[-1], c_end, "exact", op="causal_conv1d_tree", tensor="last state")


# ---------------------------------------------------------------- NumPy vs CuPy (gpu)

GPU_TREES = [("chain", 17), ("star", 9), ("random", 31), ("deep_wide", 24), ("forest", 12),
             ("random", 1)]
GPU_SHAPES = [
    # H, HV, K, V, kda
    (2, 4, 128, 128, False),  # Qwen head dims
    (1, 3, 33, 40, False),  # awkward dims, r = 3, dead lanes in the second column tile
    (1, 2, 16, 20, True),  # KDA
    (1, 1, 256, 64, False),  # the largest K the kernel takes
]


@pytest.mark.gpu
@pytest.mark.parametrize("tree", GPU_TREES, ids=str)
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=str)
def test_gdn_tree_recurrent_twin(rng, tree, shape):
    parents = tree_parents(tree[0], tree[1], rng).tolist()  # host parents, as the layer passes
    H, HV, K, V, kda = shape
    args = tuple(a.astype(np.float32) for a in make_inputs(rng, tree[1], H, HV, K, V, kda=kda,
                                                           gmin=-8.0))
    check_twin("gdn_tree_recurrent", (*args, parents), tol="float32_gdn",
               case=f"{tree} {shape}")
    check_twin("gdn_tree_recurrent", (*args[:5], None, parents), {"scale": 0.3},
               tol="float32_gdn", case=f"{tree} {shape} zero state, scale 0.3")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", TREE_SHAPES)
@pytest.mark.parametrize(("n", "D", "W"), [(1, 3, 4), (17, 2048 + 128, 4), (9, 6, 2),
                                           (5, 7, 1)], ids=str)
def test_causal_conv1d_tree_twin(rng, shape, n, D, W):
    parents = tree_parents(shape, n, rng).tolist()
    x = rng.standard_normal((n, D)).astype(np.float32)
    w = rng.standard_normal((D, W)).astype(np.float32)
    state = rng.standard_normal((D, W - 1)).astype(np.float32)
    check_twin("causal_conv1d_tree", (x, w, state, parents), tol="float32_rowsum",
               case=f"{shape} {(n, D, W)}")
    check_twin("causal_conv1d_tree", (x, w, None, parents), tol="float32_rowsum",
               case=f"{shape} {(n, D, W)} no state")


@pytest.mark.gpu
def test_twins_refuse_device_parents(rng):
    import cupy as cp

    from kernels_cupy.gdn_tree import causal_conv1d_tree as conv_twin

    x = cp.zeros((2, 3), cp.float32)
    with pytest.raises(TypeError, match="host array"):
        conv_twin(x, cp.ones((3, 4), cp.float32), None, cp.asarray([-1, 0]))
