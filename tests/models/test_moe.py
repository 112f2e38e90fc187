"""models/moe.py: routing by hand, the grouped expert sum vs the token-by-token reference, the
per-expert tensors transformers saves, the router taps, and the CuPy path (gpu)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dflash_ref.backend import get_backend
from dflash_ref.models.moe import (
    experts_grouped,
    experts_reference,
    fuse_expert_tensors,
    route_top_k,
)
from dflash_ref.models.target import TargetModel
from dflash_ref.testing import Tolerance, assert_close
from tests.models.test_hf_fixtures import FIXTURES

REORDER = Tolerance(1e-5, 1e-6, "same products, summed in another order (float32)")


def test_route_top_k_by_hand():
    # logits ln(1), ln(2), ln(3), ln(4): p = 0.1, 0.2, 0.3, 0.4; top-2 = experts 3, 2 with
    # weights 0.4 / 0.7 and 0.3 / 0.7 after the renormalisation.
    logits = np.log(np.array([[1.0, 2.0, 3.0, 4.0]], np.float32))
    w, ids = route_top_k(np, logits, 2)
    assert ids.tolist() == [[3, 2]]
    np.testing.assert_allclose(w, [[4 / 7, 3 / 7]], rtol=1e-6)


def _experts(rng, E, F, H):
    return (rng.standard_normal((E, 2 * F, H)).astype(np.float32) / np.sqrt(H),
            rng.standard_normal((E, H, F)).astype(np.float32) / np.sqrt(F))


@settings(max_examples=20)
@given(T=st.integers(1, 37), E=st.integers(1, 9), k=st.integers(1, 4), seed=st.integers(0, 99),
       act=st.sampled_from(["silu", "gelu_pytorch_tanh"]))
def test_grouped_equals_reference(T, E, k, seed, act):
    k = min(k, E)
    rng = np.random.default_rng(seed)
    H, F = 7, 5  # awkward sizes
    x = rng.standard_normal((T, H)).astype(np.float32)
    gate_up, down = _experts(rng, E, F, H)
    w, ids = route_top_k(np, rng.standard_normal((T, E)).astype(np.float32), k)
    ref = experts_reference(np, x, ids, w, gate_up, down, act)
    got = experts_grouped(np, x, ids, w, gate_up, down, act)
    assert_close(got, ref, REORDER, op="experts_grouped", case=f"T={T} E={E} k={k}")


def test_fuse_expert_tensors_stacks_gate_rows_first():
    rng = np.random.default_rng(0)
    per = {f"m.experts.{e}.{n}_proj.weight": rng.standard_normal((3, 2) if n != "down" else (2, 3))
           for e in range(2) for n in ("gate", "up", "down")}
    per["m.gate.weight"] = np.ones((2, 2))
    fused = fuse_expert_tensors(per)
    assert sorted(fused) == ["m.experts.down_proj", "m.experts.gate_up_proj", "m.gate.weight"]
    gu = fused["m.experts.gate_up_proj"]  # [E, 2F, H]
    assert gu.shape == (2, 6, 2)
    assert np.array_equal(gu[1, :3], per["m.experts.1.gate_proj.weight"])
    assert np.array_equal(gu[1, 3:], per["m.experts.1.up_proj.weight"])
    assert np.array_equal(fused["m.experts.down_proj"][0], per["m.experts.0.down_proj.weight"])


def test_verify_width_is_observable_through_the_tap():
    """Which experts a verify batch touched, per token: the seeds' "verify width" question."""
    model = TargetModel.from_pretrained(FIXTURES / "qwen35_moe")
    state = model.new_state()
    model.forward(np.arange(10) % 48, state)
    seen = {}
    model.forward(np.array([5, 6, 7, 8]), state,
                  tap=lambda layer, name, x: seen.setdefault((layer, name), np.asarray(x)))
    for layer in range(model.config.num_hidden_layers):
        ids = seen[(layer, "experts")]
        assert ids.shape == (4, 2) and seen[(layer, "router_logits")].shape == (4, 4)
        np.testing.assert_allclose(seen[(layer, "expert_weights")].sum(1), 1.0, rtol=1e-6)
        # the chosen experts are the two largest router logits of each token
        top = np.argsort(-seen[(layer, "router_logits")], axis=1, kind="stable")[:, :2]
        assert np.array_equal(ids, top)


@pytest.mark.gpu
def test_grouped_cupy_matches_numpy():
    be = get_backend("cupy")
    rng = np.random.default_rng(3)
    T, E, k, H, F = 37, 6, 3, 7, 5
    x = rng.standard_normal((T, H)).astype(np.float32)
    gate_up, down = _experts(rng, E, F, H)
    w, ids = route_top_k(np, rng.standard_normal((T, E)).astype(np.float32), k)
    ref = experts_reference(np, x, ids, w, gate_up, down, "silu")
    xp = be.xp
    got = experts_grouped(xp, xp.asarray(x), xp.asarray(ids), xp.asarray(w), xp.asarray(gate_up),
                          xp.asarray(down), "silu")
    assert_close(got, ref, Tolerance(1e-4, 1e-5, "cuBLAS vs NumPy"), op="experts_grouped")


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["gemma4_dense", "gemma4_ple_kvshare", "gemma4_moe",
                                  "qwen35_moe"])
def test_new_families_numpy_vs_cupy(case):
    ids = np.load(FIXTURES / case / "reference.npz")["ids"]
    outs = []
    for backend in ("numpy", "cupy"):
        m = TargetModel.from_pretrained(FIXTURES / case, backend=backend, target_layer_ids=[1])
        st_ = m.new_state()
        o = [m.forward(ids[:70], st_), m.forward(ids[70:], st_)]
        outs.append(np.concatenate([np.asarray(getattr(x.logits, "get", lambda a=x.logits: a)())
                                    for x in o]))
    assert_close(outs[1], outs[0], Tolerance(1e-4, 1e-4, "cuBLAS vs NumPy BLAS, 6 layers"),
                 op="TargetModel", tensor="logits", case=case)
