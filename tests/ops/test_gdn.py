"""gdn_recurrent, causal_conv1d and the GQA helpers: hand values, an independent float64 closed
form, hypothesis properties, and NumPy vs CuPy. The chunked form is tested in test_gdn_chunked.py.

Reading order: dflash_ref/ops/gdn.py (the reference) -> kernels_cupy/gdn.py and
kernels_cupy/cuda/gdn.cu (the twin) -> this file. docs/gdn.md, "Shapes and the recurrence", has
the equations.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dflash_ref.ops.gdn import (
    causal_conv1d,
    gdn_chunked,
    gdn_recurrent,
    qk_head_of_value_head,
    value_heads_grouped_to_tiled,
    value_heads_tiled_to_grouped,
)
from dflash_ref.testing import assert_close
from tests.gpu import check_twin

# ---------------------------------------------------------------- independent oracles


def closed_form_recurrence(q, k, v, g, beta, state, scale, mapping="grouped"):
    """float64 oracle written from the closed form (docs/gdn.md, "Shapes and the recurrence";
    FLA ``fla/ops/gated_delta_rule/naive.py``), one head at a time:

        S_t = (I - beta_t k_t k_t^T) D_t S_{t-1} + beta_t k_t v_t^T,   o_t = scale S_t^T q_t

    with D_t = exp(g_t) I (scalar gate) or Diag(exp(g_t)) (KDA; decay first, so D_t sits to the
    right of the transition). Independent of the code under test: explicit matrices, no shared
    helpers, the head mapping spelled out.
    """
    T, H, K = q.shape
    HV, V = v.shape[1:]
    o = np.zeros((T, HV, V))
    S_all = np.array(state, dtype=np.float64, copy=True)
    for h in range(HV):
        hk = h // (HV // H) if mapping == "grouped" else h % H
        S = S_all[h]
        for t in range(T):
            kt = k[t, hk][:, None]  # [K, 1]
            D = np.diag(np.exp(g[t, h])) if g.ndim == 3 else np.exp(g[t, h]) * np.eye(K)
            S = (np.eye(K) - beta[t, h] * kt @ kt.T) @ D @ S + beta[t, h] * kt @ v[t, h][None, :]
            o[t, h] = scale * S.T @ q[t, hk]
        S_all[h] = S
    return o, S_all


def make_inputs(rng, T, H, HV, K, V, *, kda=False, gmin=-5.0, init=True, dtype=np.float64,
                zero_gate_p=0.1):
    """L2-normalised q/k (as the layer feeds them), g in [gmin, 0] with some exact zeros."""
    q = rng.standard_normal((T, H, K))
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    k = rng.standard_normal((T, H, K))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((T, HV, V))
    g = rng.uniform(gmin, 0.0, (T, HV, K) if kda else (T, HV))
    g[rng.random(g.shape) < zero_gate_p] = 0.0  # FLA's mask_p: some gates exactly 0
    beta = rng.uniform(0.0, 1.0, (T, HV))
    state = rng.standard_normal((HV, K, V)) if init else None
    return tuple(a if a is None else a.astype(dtype) for a in (q, k, v, g, beta, state))


@st.composite
def gdn_cases(draw, max_t: int = 150, kda=None):
    """Shapes with T around chunk boundaries, GQA r in {1, 2, 3}, awkward K and V."""
    T = draw(st.sampled_from([1, 2, 5, 17, 63, 64, 65, 100, 128, 129, max_t]))
    H = draw(st.integers(1, 2))
    r = draw(st.sampled_from([1, 2, 3]))
    K = draw(st.sampled_from([1, 3, 8, 16]))
    V = draw(st.sampled_from([1, 5, 8, 12]))
    return dict(
        T=min(T, max_t), H=H, HV=H * r, K=K, V=V,
        kda=draw(st.booleans()) if kda is None else kda,
        gmin=draw(st.sampled_from([-0.05, -1.0, -5.0, -50.0])),
        init=draw(st.booleans()),
        seed=draw(st.integers(0, 2**32 - 1)),
        chunk=draw(st.sampled_from([1, 3, 16, 64])),
    )


def inputs_of(case, dtype=np.float64):
    rng = np.random.default_rng(case["seed"])
    return make_inputs(rng, case["T"], case["H"], case["HV"], case["K"], case["V"],
                       kda=case["kda"], gmin=case["gmin"], init=case["init"], dtype=dtype)


def desc(case) -> str:
    return ", ".join(f"{k}={v}" for k, v in case.items())


# ---------------------------------------------------------------- unit: hand-checked values


def test_recurrent_one_step_by_hand():
    # K=2, V=1, S0 = [[2], [4]], g = log 0.5, beta = 0.5, v = 3, k = e1, q = [0.6, 0.8], scale 1.
    # 1. decay: S = 0.5 S0 = [1, 2]          2. read: r = S^T k = 1
    # 3. delta: d = 0.5 (3 - 1) = 1          4. write: S = [1 + 1, 2] = [2, 2]
    # 5. output from the updated state: o = 0.6 * 2 + 0.8 * 2 = 2.8
    # (reading before the decay would give d = 0.5 and S = [1.5, 2]; output before the write
    # would give o = 0.6 + 1.6 = 2.2)
    q = np.array([[[0.6, 0.8]]])
    k = np.array([[[1.0, 0.0]]])
    v = np.array([[[3.0]]])
    g = np.array([[np.log(0.5)]])
    beta = np.array([[0.5]])
    S0 = np.array([[[2.0], [4.0]]])
    o, S = gdn_recurrent(q, k, v, g, beta, S0, scale=1.0)
    assert_close(o, [[[2.8]]], "float64", op="gdn_recurrent", tensor="o")
    assert_close(S, [[[2.0], [2.0]]], "float64", op="gdn_recurrent", tensor="S")
    assert_close(S0, [[[2.0], [4.0]]], "exact", op="gdn_recurrent", tensor="S0 not modified")
    o_c, S_c = gdn_chunked(q, k, v, g, beta, S0, scale=1.0)
    assert_close(o_c, o, "float64_gdn", op="gdn_chunked", tensor="o")
    assert_close(S_c, S, "float64_gdn", op="gdn_chunked", tensor="S")


def test_recurrent_kda_decays_rows_by_hand():
    # KDA: row i (key channel) decays by exp(g[i]). S0 = [[1], [1]], g = [log 0.5, log 0.25],
    # beta = 0 (no write): S = [0.5, 0.25]; o = S^T q * scale with q = [1, 0], scale 2 -> 1.0.
    q = np.array([[[1.0, 0.0]]])
    k = np.array([[[1.0, 0.0]]])
    v = np.zeros((1, 1, 1))
    g = np.log(np.array([[[0.5, 0.25]]]))
    S0 = np.ones((1, 2, 1))
    o, S = gdn_recurrent(q, k, v, g, np.zeros((1, 1)), S0, scale=2.0)
    assert_close(S, [[[0.5], [0.25]]], "float64", op="gdn_recurrent", tensor="S (KDA)")
    assert_close(o, [[[1.0]]], "float64", op="gdn_recurrent", tensor="o (KDA)")


def test_default_scale_is_inverse_sqrt_k():
    # Empty state, one write of v = 1 along k = q = e1 with beta = 1: S^T q = 1, so o = K^-1/2.
    K = 16
    e1 = np.zeros((1, 1, K))
    e1[0, 0, 0] = 1.0
    o, _ = gdn_recurrent(e1, e1, np.ones((1, 1, 1)), np.zeros((1, 1)), np.ones((1, 1)))
    assert_close(o, [[[0.25]]], "float64", op="gdn_recurrent", case="scale = 1/sqrt(16)")


def test_recurrent_matches_closed_form_float64(rng):
    for kda in (False, True):
        args = make_inputs(rng, 37, 2, 6, 8, 5, kda=kda)
        o, S = gdn_recurrent(*args)
        o_ref, S_ref = closed_form_recurrence(*args, scale=8 ** -0.5)
        assert_close(o, o_ref, "float64", op="gdn_recurrent", tensor="o", case=f"kda={kda}")
        assert_close(S, S_ref, "float64", op="gdn_recurrent", tensor="S", case=f"kda={kda}")


def test_causal_conv1d_by_hand():
    # One channel, W = 3, weight [1, 2, 3] (tap 2 = current token), state [10, 20] (oldest first).
    # xx = [10, 20, 1, 2]: y0 = 1*10 + 2*20 + 3*1 = 53, y1 = 1*20 + 2*1 + 3*2 = 28.
    x = np.array([[1.0], [2.0]])
    w = np.array([[1.0, 2.0, 3.0]])
    y, new_state = causal_conv1d(x, w, np.array([[10.0, 20.0]]))
    silu = lambda a: a / (1.0 + np.exp(-a))  # noqa: E731
    assert_close(y, [[silu(53.0)], [silu(28.0)]], "float64", op="causal_conv1d")
    assert_close(new_state, [[1.0, 2.0]], "exact", op="causal_conv1d", tensor="new_state")
    # A single token keeps the newest state column and appends x: [20, 5].
    _, s1 = causal_conv1d(np.array([[5.0]]), w, np.array([[10.0, 20.0]]))
    assert_close(s1, [[20.0, 5.0]], "exact", op="causal_conv1d", tensor="rolled state")


def test_causal_conv1d_matches_numpy_convolve(rng):
    T, D, W = 11, 4, 4
    x, w = rng.standard_normal((T, D)), rng.standard_normal((D, W))
    y, _ = causal_conv1d(x, w)
    for c in range(D):
        # Causal correlation with zero history: full convolution with the flipped kernel.
        pre = np.convolve(x[:, c], w[c, ::-1])[:T]
        assert_close(y[:, c], pre / (1 + np.exp(-pre)), "float64", op="causal_conv1d",
                     case=f"channel {c}")


def test_gqa_mappings_by_hand():
    # H = 2, HV = 6 (r = 3): grouped [0, 0, 0, 1, 1, 1], tiled [0, 1, 0, 1, 0, 1].
    assert [qk_head_of_value_head(h, 2, 6) for h in range(6)] == [0, 0, 0, 1, 1, 1]
    assert [qk_head_of_value_head(h, 2, 6, "tiled") for h in range(6)] == [0, 1, 0, 1, 0, 1]
    # Tiled storage [a0, b0, a1, b1] (a/b = q/k head, 0/1 = sub-head) -> grouped [a0, a1, b0, b1].
    tiled = np.array(["a0", "b0", "a1", "b1"])
    assert list(value_heads_tiled_to_grouped(tiled, 2, 4)) == ["a0", "a1", "b0", "b1"]
    # With a per-head block of n = 2 rows (e.g. dv rows of in_proj_z).
    rows = np.array(["a0.0", "a0.1", "b0.0", "b0.1", "a1.0", "a1.1", "b1.0", "b1.1"])
    assert list(value_heads_tiled_to_grouped(rows, 2, 4)) == [
        "a0.0", "a0.1", "a1.0", "a1.1", "b0.0", "b0.1", "b1.0", "b1.1"]


def test_input_shape_errors_are_explained():
    q = np.zeros((3, 2, 4))
    v = np.zeros((3, 3, 5))
    with pytest.raises(ValueError, match="multiple of the number of q/k heads"):
        gdn_recurrent(q, q, v, np.zeros((3, 3)), np.zeros((3, 3)))
    v = np.zeros((3, 4, 5))
    with pytest.raises(ValueError, match="KDA"):
        gdn_recurrent(q, q, v, np.zeros((3, 4, 5)), np.zeros((3, 4)))
    with pytest.raises(ValueError, match="state must be"):
        gdn_chunked(q, q, v, np.zeros((3, 4)), np.zeros((3, 4)), np.zeros((4, 5, 4)))
    with pytest.raises(ValueError, match="g must be <= 0"):
        gdn_chunked(q, q, v, np.full((3, 4), 0.1), np.zeros((3, 4)))
    with pytest.raises(ValueError, match="squeeze"):
        causal_conv1d(np.zeros((3, 4)), np.zeros((4, 1, 4)))


def test_dtypes_follow_the_compute_rule(rng):
    args = make_inputs(rng, 5, 1, 1, 4, 4, dtype=np.float32)
    for op in (gdn_recurrent, gdn_chunked):
        o, S = op(*args)
        assert o.dtype == np.float32 and S.dtype == np.float32
        o, S = op(*(a.astype(np.float64) for a in args))
        assert o.dtype == np.float64 and S.dtype == np.float64


# ---------------------------------------------------------------- property tests


@given(gdn_cases(max_t=40))
def test_recurrent_matches_closed_form_property(case):
    args = inputs_of(case)
    o, S = gdn_recurrent(*args)
    state = args[5] if args[5] is not None else np.zeros((case["HV"], case["K"], case["V"]))
    o_ref, S_ref = closed_form_recurrence(*args[:5], state, scale=case["K"] ** -0.5)
    assert_close(o, o_ref, "float64_gdn", op="gdn_recurrent", tensor="o", case=desc(case))
    assert_close(S, S_ref, "float64_gdn", op="gdn_recurrent", tensor="S", case=desc(case))


@given(gdn_cases(max_t=70))
def test_trace_is_the_state_after_each_prefix(case):
    args = inputs_of(case)
    o, S, trace = gdn_recurrent(*args, return_trace=True)
    assert trace.shape == (case["T"], case["HV"], case["K"], case["V"])
    assert_close(trace[-1], S, "exact", op="gdn_recurrent", tensor="trace[-1]")
    for t in sorted({0, case["T"] // 2, case["T"] - 1}):
        _, S_t = gdn_recurrent(*(a[:t + 1] for a in args[:5]), args[5])
        assert_close(trace[t], S_t, "exact", op="gdn_recurrent", tensor=f"trace[{t}]",
                     case=desc(case))


@given(st.data())
def test_delta_rule_stores_v_exactly(data):
    # With beta = 1, g = 0 and |k| = 1 the write replaces what k reads: S^T k == v afterwards.
    K, V = data.draw(st.sampled_from([(4, 3), (8, 8), (16, 5)]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    q, k, v, _, _, S0 = make_inputs(rng, 1, 1, 1, K, V)
    _, S = gdn_recurrent(q, k, v, np.zeros((1, 1)), np.ones((1, 1)), S0)
    assert_close(S[0].T @ k[0, 0], v[0, 0], "float64", op="gdn_recurrent", case="S^T k = v")


def test_padding_with_zero_gate_and_beta_is_exact(rng):
    # Appending tokens with g = 0 and beta = 0 leaves the state unchanged (why padding is exact).
    q, k, v, g, beta, S0 = make_inputs(rng, 10, 1, 2, 4, 3)
    _, S = gdn_recurrent(q, k, v, g, beta, S0)
    pad = make_inputs(rng, 5, 1, 2, 4, 3)
    _, S_pad = gdn_recurrent(*pad[:3], np.zeros((5, 2)), np.zeros((5, 2)), S)
    assert_close(S_pad, S, "exact", op="gdn_recurrent", case="g = beta = 0 tokens")


@given(gdn_cases(max_t=40))
def test_gqa_grouped_and_tiled_mappings(case):
    args = inputs_of(case)
    q, k, v, g, beta, S0 = args
    S0 = np.zeros((case["HV"], case["K"], case["V"])) if S0 is None else S0
    H, HV, scale = case["H"], case["HV"], case["K"] ** -0.5
    # Grouped: what the ops implement.
    o, S = gdn_recurrent(q, k, v, g, beta, S0)
    o_ref, S_ref = closed_form_recurrence(q, k, v, g, beta, S0, scale, mapping="grouped")
    assert_close(o, o_ref, "float64_gdn", op="gdn_recurrent", case=f"grouped {desc(case)}")
    # Tiled (ggml): permute the value-head tensors tiled -> grouped, run, permute back.
    o_t, S_t = closed_form_recurrence(q, k, v, g, beta, S0, scale, mapping="tiled")
    to_g = lambda a: value_heads_tiled_to_grouped(a, H, HV, axis=1)  # noqa: E731
    o_p, S_p = gdn_recurrent(q, k, to_g(v), to_g(g), to_g(beta),
                             value_heads_tiled_to_grouped(S0, H, HV, axis=0))
    assert_close(value_heads_grouped_to_tiled(o_p, H, HV, axis=1), o_t, "float64_gdn",
                 op="value_heads_tiled_to_grouped", case=desc(case))
    assert_close(value_heads_grouped_to_tiled(S_p, H, HV, axis=0), S_t, "float64_gdn",
                 op="value_heads_tiled_to_grouped", tensor="state", case=desc(case))


@given(st.integers(1, 3), st.integers(1, 4), st.integers(1, 3), st.integers(0, 2))
def test_value_head_permutations_are_inverse(H, r, n, axis):
    shape = [2, 3, 2]
    shape[axis] = H * r * n
    x = np.arange(np.prod(shape)).reshape(shape)
    y = value_heads_tiled_to_grouped(x, H, H * r, axis=axis)
    assert_close(value_heads_grouped_to_tiled(y, H, H * r, axis=axis), x, "exact",
                 op="value_heads_grouped_to_tiled")


@given(st.data())
def test_causal_conv1d_split_and_carry(data):
    T = data.draw(st.integers(0, 12))
    D = data.draw(st.sampled_from([1, 3, 7]))
    W = data.draw(st.sampled_from([1, 2, 4]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    x, w = rng.standard_normal((T, D)), rng.standard_normal((D, W))
    state = rng.standard_normal((D, W - 1))
    s = data.draw(st.integers(0, T))
    y, new_state = causal_conv1d(x, w, state)
    y1, st1 = causal_conv1d(x[:s], w, state)
    y2, st2 = causal_conv1d(x[s:], w, st1)
    assert_close(np.concatenate([y1, y2]), y, "float64", op="causal_conv1d", case=f"split {s}")
    assert_close(st2, new_state, "exact", op="causal_conv1d", tensor="state")
    # The state is the last W - 1 raw inputs of concat(state, x), oldest first.
    expected = np.concatenate([state, x.T], axis=1)[:, T:]
    assert_close(new_state, expected, "exact", op="causal_conv1d", tensor="state window")


# ---------------------------------------------------------------- NumPy vs CuPy (gpu)

GPU_CASES = [
    # T, H, HV, K, V, kda
    (1, 2, 4, 128, 128, False),  # decode step, Qwen head dims
    (17, 2, 4, 128, 128, False),  # verify batch
    (5, 1, 3, 33, 7, False),  # awkward dims, r = 3
    (200, 2, 4, 64, 48, False),  # not a multiple of 64
    (70, 1, 2, 16, 20, True),  # KDA
    (3, 1, 1, 256, 64, False),  # largest K the kernels take
]


def _f32(args):
    return tuple(None if a is None else a.astype(np.float32) for a in args)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_CASES, ids=str)
@pytest.mark.parametrize("trace", [False, True])
def test_gdn_recurrent_twin(rng, shape, trace):
    T, H, HV, K, V, kda = shape
    args = _f32(make_inputs(rng, T, H, HV, K, V, kda=kda, gmin=-8.0))
    check_twin("gdn_recurrent", args, {"return_trace": trace}, "float32_gdn", case=str(shape))


@pytest.mark.gpu
def test_gdn_recurrent_twin_trace_is_bit_identical_to_prefix_runs(rng):
    from dflash_ref.backend import get_backend

    cp_be = get_backend("cupy")
    args = [cp_be.to_backend(a) for a in _f32(make_inputs(rng, 9, 2, 4, 128, 128))]
    _, S, trace = cp_be.ops.gdn_recurrent(*args, return_trace=True)
    for t in (0, 4, 8):
        _, S_t = cp_be.ops.gdn_recurrent(*(a[:t + 1] for a in args[:5]), args[5])
        assert_close(trace[t], S_t, "exact", op="gdn_recurrent (cupy)", tensor=f"trace[{t}]")
    assert_close(trace[-1], S, "exact", op="gdn_recurrent (cupy)", tensor="trace[-1]")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 3, 4), (7, 10, 4), (300, 2048 + 128, 4), (5, 6, 2)],
                         ids=str)
def test_causal_conv1d_twin(rng, shape):
    T, D, W = shape
    x = rng.standard_normal((T, D)).astype(np.float32)
    w = rng.standard_normal((D, W)).astype(np.float32)
    state = rng.standard_normal((D, W - 1)).astype(np.float32)
    check_twin("causal_conv1d", (x, w, state), tol="float32_rowsum", case=str(shape))
    check_twin("causal_conv1d", (x, w), tol="float32_rowsum", case=f"{shape} no state")
