"""GDNLayer.forward_tree and tree verify on a hybrid target: every node in one pass.

The projections of the tree's n rows run as one matmul, a path's as another, so even the raw
conv states agree to rounding only (float64 tolerance), not bit for bit as in the op tests.
Oracles: the layer's float64 oracle (tests/models/test_gdn_layer.py, written from the equations)
and ``GDNLayer.forward`` on each root-to-node path; on the target, the per-node loop that tree
verify ran before (kept here verbatim as :func:`per_node_run`).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dflash_ref.models import gdn_store
from dflash_ref.models.gdn_layer import GDNLayer, GDNState
from dflash_ref.models.target import TargetModel
from dflash_ref.testing import Tolerance, assert_close
from dflash_ref.tiny import write_tiny_target
from tests.models.test_gdn_layer import fuse_grouped, layer_oracle, separate_weights, small_config
from tests.strategies import root_to_node, tree_parents, trees

# Same float32 math, but a node's projections run in an n-row matmul instead of a 1-row one:
# BLAS may sum in another order (a few ulp of O(10) logits through 4 layers).
ROWS = Tolerance(1e-5, 2e-5, "same float32 math, BLAS blocking differs with the row count")


def _layer(rng, layout="qwen3_5", **kw):
    cfg = small_config(layout, **kw)
    w = separate_weights(cfg, rng)
    return GDNLayer(cfg, fuse_grouped(w, cfg) if layout == "qwen3_next" else w), w, cfg


def _random_state(layer, rng) -> GDNState:
    s = layer.initial_state()
    return GDNState(rng.standard_normal(s.recurrent.shape), rng.standard_normal(s.conv.shape))


# ---------------------------------------------------------------- the layer


@pytest.mark.parametrize("layout", ["qwen3_5", "qwen3_next"])
def test_forward_tree_matches_the_float64_oracle_on_every_path(rng, layout):
    layer, w, cfg = _layer(rng, layout, r=2)
    state = _random_state(layer, rng)
    parents = np.array([-1, 0, 1, 1, 0, 4, 2])
    x = rng.standard_normal((len(parents), cfg.hidden_size))
    y, nodes = layer.forward_tree(x, state, parents)
    for i in range(len(parents)):
        p = root_to_node(parents, i)
        y_ref, rec_ref, conv_ref = layer_oracle(x[p], w, cfg, state.recurrent, state.conv)
        assert_close(y[i], y_ref[-1], "float64_gdn", op="GDNLayer.forward_tree", case=f"node {i}")
        assert_close(nodes.recurrent[i], rec_ref, "float64_gdn", op="GDNLayer.forward_tree",
                     tensor="recurrent", case=f"node {i}")
        assert_close(nodes.conv[i], conv_ref, "float64", op="GDNLayer.forward_tree",
                     tensor="conv", case=f"node {i}")


@given(trees(max_nodes=9), st.data())
def test_forward_tree_equals_forward_on_every_root_to_node_path(parents, data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    layout = data.draw(st.sampled_from(["qwen3_5", "qwen3_next"]))
    layer, _, cfg = _layer(rng, layout, r=data.draw(st.sampled_from([1, 3])),
                           W=data.draw(st.sampled_from([2, 4])))
    state = _random_state(layer, rng) if data.draw(st.booleans()) else None
    x = rng.standard_normal((len(parents), cfg.hidden_size))
    y, nodes = layer.forward_tree(x, state, parents)
    for i in range(len(parents)):
        p, case = root_to_node(parents, i), f"{layout}, node {i} of {parents.tolist()}"
        y_p, s_p, _ = layer.forward(x[p], state, mode="recurrent")
        assert_close(y[i], y_p[-1], "float64", op="GDNLayer.forward_tree", case=case)
        node = nodes.node(i)
        assert_close(node.recurrent, s_p.recurrent, "float64", op="GDNLayer.forward_tree",
                     tensor="recurrent", case=case)
        assert_close(node.conv, s_p.conv, "float64", op="GDNLayer.forward_tree", tensor="conv",
                     case=case)


def test_node_states_are_copies(rng):
    layer, _, cfg = _layer(rng)
    _, nodes = layer.forward_tree(rng.standard_normal((3, cfg.hidden_size)), None, [-1, 0, 0])
    node = nodes.node(2)
    node.recurrent[...] = 0.0
    node.conv[...] = 0.0
    assert np.any(nodes.recurrent[2] != 0) and np.any(nodes.conv[2] != 0)


def test_forward_tree_errors_name_the_problem(rng):
    layer, _, cfg = _layer(rng)
    with pytest.raises(ValueError, match=r"forward_tree: x must be \[T, hidden=20\]"):
        layer.forward_tree(np.zeros((2, 3)), None, [-1, 0])
    with pytest.raises(ValueError, match=r"parents\[1\] = 1"):
        layer.forward_tree(np.zeros((2, cfg.hidden_size)), None, [-1, 1])


# ---------------------------------------------------------------- the hybrid target


def per_node_run(self, mixer, u):
    """TreeGDN.run as it was before the batched tree: a one-token layer forward per node."""
    root = self.store.state or mixer.initial_state()
    node_states, ys = [], []
    for i, p in enumerate(self.parents):
        y, st_i, _ = mixer.forward(u[i:i + 1], root if p < 0 else node_states[p])
        node_states.append(st_i)
        ys.append(y)
    self.store.tree = _NodeList(node_states)
    return np.concatenate(ys, axis=0)  # [n, hidden]


class _NodeList(list):
    def node(self, i):
        return self[i]


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    path = write_tiny_target(tmp_path_factory.mktemp("hybrid"), "qwen3_5", seed=11)
    return TargetModel.from_pretrained(path, target_layer_ids=[0, 2])


PREFIX = np.array([3, 17, 42, 99, 5, 250, 7, 61, 13])
TREE = np.array([40, 41, 42, 43, 44, 45, 46, 47])
PARENTS = np.array([-1, 0, 0, 1, 3, 3, 2, 6])


def _tree_then_commit(model, path):
    state = model.new_state()
    model.forward(PREFIX, state)
    out = model.forward_tree(TREE, PARENTS, state)
    state.commit_path(path)
    return out, state


@pytest.mark.parametrize("path", [[0, 1, 3, 5], [0, 2, 6, 7], [0]])
def test_hybrid_tree_verify_gives_the_logits_and_committed_state_of_the_per_node_loop(
        hybrid, monkeypatch, path):
    out, state = _tree_then_commit(hybrid, path)
    with monkeypatch.context() as m:
        m.setattr(gdn_store.TreeGDN, "run", per_node_run)
        ref, ref_state = _tree_then_commit(hybrid, path)
    assert_close(out.logits, ref.logits, ROWS, op="forward_tree", tensor="logits")
    assert_close(out.features, ref.features, ROWS, op="forward_tree", tensor="features")
    assert state.gdn and set(state.gdn) == set(ref_state.gdn)
    for i, st_i in state.gdn.items():
        assert_close(st_i.recurrent, ref_state.gdn[i].recurrent, ROWS, op="commit_path",
                     tensor=f"gdn[{i}].recurrent", case=str(path))
        assert_close(st_i.conv, ref_state.gdn[i].conv, ROWS, op="commit_path",
                     tensor=f"gdn[{i}].conv", case=str(path))
    nxt, ref_nxt = hybrid.forward([7, 8], state), hybrid.forward([7, 8], ref_state)
    assert_close(nxt.logits, ref_nxt.logits, ROWS, op="after commit_path", case=str(path))


def test_hybrid_tree_verify_runs_each_gdn_layer_once(hybrid, monkeypatch):
    # The fix itself: one forward_tree per GDN layer per tree, no one-token forward per node.
    calls = {"forward": 0, "forward_tree": 0}
    fwd, fwd_tree = GDNLayer.forward, GDNLayer.forward_tree

    def counting(name, fn):
        def wrapped(self, *a, **kw):
            calls[name] += 1
            return fn(self, *a, **kw)
        return wrapped

    state = hybrid.new_state()
    hybrid.forward(PREFIX, state)
    monkeypatch.setattr(GDNLayer, "forward", counting("forward", fwd))
    monkeypatch.setattr(GDNLayer, "forward_tree", counting("forward_tree", fwd_tree))
    hybrid.forward_tree(TREE, PARENTS, state)
    n_gdn = hybrid.config.layer_types.count("linear_attention")
    assert n_gdn > 0 and calls == {"forward": 0, "forward_tree": n_gdn}


# ---------------------------------------------------------------- NumPy vs CuPy (gpu)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["qwen3_5", "qwen3_next"])
def test_forward_tree_twin(rng, layout):
    cfg = small_config(layout, H=2, r=2, dk=128, dv=128, hidden=96)
    sep = {n: a.astype(np.float32) for n, a in separate_weights(cfg, rng, 0.05).items()}
    w = fuse_grouped(sep, cfg) if layout == "qwen3_next" else sep
    np_layer, cp_layer = GDNLayer(cfg, w, "numpy"), GDNLayer(cfg, w, "cupy")
    _, s_np, _ = np_layer(rng.standard_normal((20, cfg.hidden_size)).astype(np.float32))
    s_cp = GDNState(cp_layer.be.to_backend(s_np.recurrent), cp_layer.be.to_backend(s_np.conv))
    parents = tree_parents("random", 23, rng)
    x = rng.standard_normal((23, cfg.hidden_size)).astype(np.float32)
    y_np, n_np = np_layer.forward_tree(x, s_np, parents)
    y_cp, n_cp = cp_layer.forward_tree(x, s_cp, parents)
    assert_close(y_cp, y_np, "float32_gdn", op="GDNLayer.forward_tree (cupy)", case=layout)
    assert_close(n_cp.recurrent, n_np.recurrent, "float32_gdn", op="forward_tree (cupy)",
                 tensor="recurrent")
    assert_close(n_cp.conv, n_np.conv, "float32_gdn", op="forward_tree (cupy)", tensor="conv")
