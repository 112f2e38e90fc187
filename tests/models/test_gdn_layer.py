"""GDNLayer: config and weight checks, the grouped qkvz/ba layout, an independent float64 oracle
of the whole layer, split/carry, rewind == fresh run on the kept tokens, extreme gates, and
NumPy vs CuPy.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dflash_ref.errors import ConfigError, FormatError
from dflash_ref.models.gdn_layer import (
    GDNConfig,
    GDNLayer,
    GDNState,
    infer_layout,
    qkvz_ba_to_separate,
)
from dflash_ref.testing import assert_close
from tests.ops.test_gdn import closed_form_recurrence


def small_config(layout="qwen3_5", H=2, r=2, dk=8, dv=6, hidden=20, W=4, **kw) -> GDNConfig:
    return GDNConfig(hidden_size=hidden, num_k_heads=H, num_v_heads=H * r, head_k_dim=dk,
                     head_v_dim=dv, conv_kernel=W, layout=layout, **kw)


def separate_weights(cfg: GDNConfig, rng, scale=0.3) -> dict[str, np.ndarray]:
    """Random float64 weights in the Qwen3.5 (separate) layout."""
    w = {name: scale * rng.standard_normal(shape)
         for name, shape in small_config(
             "qwen3_5", cfg.num_k_heads, cfg.ratio, cfg.head_k_dim, cfg.head_v_dim,
             cfg.hidden_size, cfg.conv_kernel).expected_shapes().items()}
    w["norm.weight"] = 1.0 + 0.1 * rng.standard_normal(cfg.head_v_dim)
    w["A_log"] = rng.uniform(-1.0, 1.5, cfg.num_v_heads)
    w["dt_bias"] = rng.uniform(-1.0, 1.0, cfg.num_v_heads)
    return w


def fuse_grouped(sep: dict[str, np.ndarray], cfg: GDNConfig) -> dict[str, np.ndarray]:
    """Build Qwen3-Next's grouped in_proj_qkvz / in_proj_ba by an explicit loop over key heads
    (HF ``modeling_qwen3_next.py``): for key head h the rows q_h | k_h | v_h (r dv) | z_h (r dv),
    and b_h (r) | a_h (r). Written independently of the code under test."""
    H, r, dk, dv = cfg.num_k_heads, cfg.ratio, cfg.head_k_dim, cfg.head_v_dim
    Wqkv, Wz = sep["in_proj_qkv.weight"], sep["in_proj_z.weight"]
    Wq, Wk, Wv = Wqkv[:H * dk], Wqkv[H * dk:2 * H * dk], Wqkv[2 * H * dk:]
    qkvz_rows, ba_rows = [], []
    for h in range(H):
        qkvz_rows += [Wq[h * dk:(h + 1) * dk], Wk[h * dk:(h + 1) * dk],
                      Wv[h * r * dv:(h + 1) * r * dv], Wz[h * r * dv:(h + 1) * r * dv]]
        ba_rows += [sep["in_proj_b.weight"][h * r:(h + 1) * r],
                    sep["in_proj_a.weight"][h * r:(h + 1) * r]]
    fused = {n: a for n, a in sep.items() if not n.startswith("in_proj")}
    fused["in_proj_qkvz.weight"] = np.concatenate(qkvz_rows)
    fused["in_proj_ba.weight"] = np.concatenate(ba_rows)
    return fused


def layer_oracle(x, w, cfg: GDNConfig, rec0, conv0):
    """float64 oracle of the layer from the equations (docs/gdn.md), loops where it helps."""
    T = x.shape[0]
    H, HV, dk, dv, W = (cfg.num_k_heads, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim,
                        cfg.conv_kernel)
    mixed = x @ w["in_proj_qkv.weight"].T
    z = (x @ w["in_proj_z.weight"].T).reshape(T, HV, dv)
    b, a = x @ w["in_proj_b.weight"].T, x @ w["in_proj_a.weight"].T
    wc = w["conv1d.weight"][:, 0, :]  # [conv_dim, W]
    hist = np.concatenate([conv0.T, mixed])  # [W - 1 + T, conv_dim]
    pre = np.array([[sum(wc[c, j] * hist[t + j, c] for j in range(W))
                     for c in range(cfg.conv_dim)] for t in range(T)])
    conv = pre / (1 + np.exp(-pre))  # silu
    kd = cfg.key_dim
    q = conv[:, :kd].reshape(T, H, dk)
    k = conv[:, kd:2 * kd].reshape(T, H, dk)
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + cfg.l2_norm_eps)
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + cfg.l2_norm_eps)
    v = conv[:, 2 * kd:].reshape(T, HV, dv)
    beta = 1 / (1 + np.exp(-b))
    g = -np.exp(w["A_log"]) * np.log1p(np.exp(a + w["dt_bias"]))  # a + dt_bias < 20 here
    o, rec = closed_form_recurrence(q, k, v, g, beta, rec0, dk ** -0.5)
    y = o / np.sqrt((o * o).mean(-1, keepdims=True) + cfg.rms_norm_eps) * w["norm.weight"]
    y = y * z / (1 + np.exp(-z))
    return y.reshape(T, cfg.value_dim) @ w["out_proj.weight"].T, rec, hist[T:].T


# ---------------------------------------------------------------- config and weights


def test_config_errors_name_the_problem():
    with pytest.raises(ConfigError, match="multiple of num_k_heads"):
        GDNConfig(hidden_size=8, num_k_heads=3, num_v_heads=4, head_k_dim=4, head_v_dim=4)
    with pytest.raises(ConfigError, match="layout"):
        small_config(layout="fused")
    with pytest.raises(ConfigError, match="head_k_dim"):
        GDNConfig(hidden_size=8, num_k_heads=1, num_v_heads=1, head_k_dim=0, head_v_dim=4)


def test_from_hf_reads_the_linear_attention_keys():
    hf = {"model_type": "qwen3_next", "hidden_size": 2048, "linear_num_key_heads": 16,
          "linear_num_value_heads": 32, "linear_key_head_dim": 128,
          "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "rms_norm_eps": 1e-6}
    cfg = GDNConfig.from_hf(hf)
    assert cfg.layout == "qwen3_next" and cfg.ratio == 2
    # Qwen3-Next-80B: conv_dim = 2 * 16 * 128 + 32 * 128 = 8192 (the published config's sizes).
    assert cfg.conv_dim == 8192 and cfg.value_dim == 4096
    assert GDNConfig.from_hf({**hf, "model_type": "qwen3_5_text"}).layout == "qwen3_5"
    with pytest.raises(ConfigError, match="linear_num_key_heads"):
        GDNConfig.from_hf({"hidden_size": 8})


def test_weight_errors_name_tensor_and_shapes(rng):
    cfg = small_config()
    w = separate_weights(cfg, rng)
    missing = {n: a for n, a in w.items() if n != "in_proj_z.weight"}
    with pytest.raises(FormatError, match=r"linear_attn\.in_proj_z\.weight.*\(24, 20\)"):
        GDNLayer(cfg, missing)
    bad = {**w, "dt_bias": np.zeros(5)}
    with pytest.raises(FormatError,
                       match=r"'linear_attn\.dt_bias' has shape \(5,\), expected \(4,\)"):
        GDNLayer(cfg, bad)
    with pytest.raises(FormatError, match="unexpected tensors.*conv1d.bias"):
        GDNLayer(cfg, {**w, "conv1d.bias": np.zeros(cfg.conv_dim)})
    # Qwen3-Next weights given to a qwen3_5 config: the message says which layout to use.
    with pytest.raises(FormatError, match="layout='qwen3_next'"):
        GDNLayer(cfg, fuse_grouped(w, cfg))
    assert infer_layout(fuse_grouped(w, cfg)) == "qwen3_next" and infer_layout(w) == "qwen3_5"


def test_conv_weight_may_be_squeezed(rng):
    cfg = small_config()
    w = separate_weights(cfg, rng)
    x = rng.standard_normal((5, cfg.hidden_size))
    squeezed = {**w, "conv1d.weight": w["conv1d.weight"][:, 0, :]}
    assert_close(GDNLayer(cfg, squeezed)(x)[0], GDNLayer(cfg, w)(x)[0], "exact",
                 op="GDNLayer", case="conv1d.weight [D, W] == [D, 1, W]")


# ---------------------------------------------------------------- layouts and the oracle


@pytest.mark.parametrize("r", [1, 2, 3])
def test_grouped_qkvz_layout_matches_separate(rng, r):
    cfg_sep = small_config("qwen3_5", r=r)
    cfg_grp = small_config("qwen3_next", r=r)
    sep = separate_weights(cfg_sep, rng)
    fused = fuse_grouped(sep, cfg_sep)
    # The converter recovers exactly the separate rows.
    back = qkvz_ba_to_separate(fused, cfg_grp)
    for name in sep:
        assert_close(back[name], sep[name], "exact", op="qkvz_ba_to_separate", tensor=name)
    x = rng.standard_normal((9, cfg_sep.hidden_size))
    y_sep, s_sep, _ = GDNLayer(cfg_sep, sep)(x)
    y_grp, s_grp, _ = GDNLayer(cfg_grp, fused)(x)
    assert_close(y_grp, y_sep, "float64", op="GDNLayer", case=f"qwen3_next vs qwen3_5, r={r}")
    assert_close(s_grp.recurrent, s_sep.recurrent, "float64", op="GDNLayer", tensor="state")
    assert_close(s_grp.conv, s_sep.conv, "float64", op="GDNLayer", tensor="conv state")


@pytest.mark.parametrize("mode", ["recurrent", "chunked"])
@pytest.mark.parametrize("with_state", [False, True])
def test_layer_matches_float64_oracle(rng, mode, with_state):
    cfg = small_config(r=2, chunk_size=4)
    w = separate_weights(cfg, rng)
    layer = GDNLayer(cfg, w)
    state = layer.initial_state()
    if with_state:
        state = GDNState(rng.standard_normal(state.recurrent.shape),
                         rng.standard_normal(state.conv.shape))
    x = rng.standard_normal((11, cfg.hidden_size))
    y, new, trace = layer.forward(x, state, mode=mode)
    y_ref, rec_ref, conv_ref = layer_oracle(x, w, cfg, state.recurrent, state.conv)
    assert trace is None
    assert_close(y, y_ref, "float64_gdn", op="GDNLayer.forward", case=mode)
    assert_close(new.recurrent, rec_ref, "float64_gdn", op="GDNLayer", tensor="recurrent")
    assert_close(new.conv, conv_ref, "exact", op="GDNLayer", tensor="conv state")


def test_gated_norm_uses_plain_weight_not_one_plus_w(rng):
    # norm.weight = 0 must zero the output (a (1 + w) norm would not).
    cfg = small_config()
    w = {**separate_weights(cfg, rng), "norm.weight": np.zeros(cfg.head_v_dim)}
    y, _, _ = GDNLayer(cfg, w)(rng.standard_normal((3, cfg.hidden_size)))
    assert_close(y, np.zeros_like(y), "exact", op="GDNLayer", case="norm.weight = 0")


@given(st.data())
def test_split_and_carry_the_layer_state(data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    layout = data.draw(st.sampled_from(["qwen3_5", "qwen3_next"]))
    cfg = small_config(layout, r=data.draw(st.sampled_from([1, 2])), chunk_size=4)
    w = separate_weights(cfg, rng)
    layer = GDNLayer(cfg, fuse_grouped(w, cfg) if layout == "qwen3_next" else w)
    T = data.draw(st.integers(1, 13))
    s = data.draw(st.integers(0, T))
    mode = data.draw(st.sampled_from(["auto", "recurrent", "chunked"]))
    x = rng.standard_normal((T, cfg.hidden_size))
    y, st_all, _ = layer.forward(x, mode=mode)
    y1, st1, _ = layer.forward(x[:s], mode=mode)
    y2, st2, _ = layer.forward(x[s:], st1, mode=mode)
    case = f"{layout}, T={T}, split={s}, {mode}"
    assert_close(np.concatenate([y1, y2]), y, "float64_gdn", op="GDNLayer", case=case)
    assert_close(st2.recurrent, st_all.recurrent, "float64_gdn", op="GDNLayer", case=case)
    assert_close(st2.conv, st_all.conv, "float64", op="GDNLayer", tensor="conv", case=case)


# ---------------------------------------------------------------- rewind


@given(st.data())
def test_rewind_equals_a_fresh_run_on_the_kept_tokens(data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    layout = data.draw(st.sampled_from(["qwen3_5", "qwen3_next"]))
    cfg = small_config(layout, r=data.draw(st.sampled_from([1, 2, 3])),
                       W=data.draw(st.sampled_from([2, 4])))
    w = separate_weights(cfg, rng)
    layer = GDNLayer(cfg, fuse_grouped(w, cfg) if layout == "qwen3_next" else w)
    prefix = rng.standard_normal((data.draw(st.integers(0, 6)), cfg.hidden_size))
    _, before, _ = layer.forward(prefix)  # the committed state (position P)
    T = data.draw(st.integers(1, 9))  # verify batch [x0, d1..d_{T-1}]
    batch = rng.standard_normal((T, cfg.hidden_size))
    _, after, trace = layer.forward(batch, before, return_trace=True)
    n_keep = data.draw(st.integers(0, T))
    case = f"{layout}, r={cfg.ratio}, W={cfg.conv_kernel}, P={len(prefix)}, T={T}, keep={n_keep}"

    got = layer.rewind(before, trace, n_keep)
    fresh = layer.forward(batch[:n_keep], before)[1] if n_keep else before
    assert_close(got.recurrent, fresh.recurrent, "float64", op="GDNLayer.rewind", case=case)
    assert_close(got.conv, fresh.conv, "float64", op="GDNLayer.rewind", tensor="conv", case=case)
    # Continuing from the rewound state equals running everything kept, plus new tokens.
    nxt = rng.standard_normal((3, cfg.hidden_size))
    y_cont, s_cont, _ = layer.forward(nxt, got)
    y_ref, s_ref, _ = layer.forward(np.concatenate([prefix, batch[:n_keep], nxt]))
    assert_close(y_cont, y_ref[-3:], "float64_gdn", op="GDNLayer.rewind", tensor="y after",
                 case=case)
    assert_close(s_cont.conv, s_ref.conv, "float64", op="GDNLayer.rewind", tensor="conv after")
    # The traced forward's own final state is the full-batch rewind.
    full = layer.rewind(before, trace, T)
    assert_close(full.recurrent, after.recurrent, "exact", op="GDNLayer.rewind", tensor="T")
    assert_close(full.conv, after.conv, "float64", op="GDNLayer.rewind", tensor="T conv")


def test_promote_index_convention_acc_0_and_acc_n(rng):
    # docs/gdn.md: batch [x0, d1..dN]; acc accepted drafts keep x0..d_acc (acc + 1 tokens).
    cfg = small_config(r=2)
    layer = GDNLayer(cfg, separate_weights(cfg, rng))
    _, before, _ = layer.forward(rng.standard_normal((4, cfg.hidden_size)))
    N = 5
    batch = rng.standard_normal((N + 1, cfg.hidden_size))
    _, after, trace = layer.forward(batch, before, return_trace=True)
    # acc = 0: only x0 is kept; its raw inputs are the newest conv column.
    s0 = layer.promote(before, trace, 0)
    one = layer.forward(batch[:1], before)[1]
    assert_close(s0.recurrent, one.recurrent, "float64", op="promote", case="acc=0")
    assert_close(s0.conv, one.conv, "float64", op="promote", tensor="conv", case="acc=0")
    assert_close(s0.conv[:, -1], trace.conv_inputs[0], "exact", op="promote", case="x0 column")
    # acc = N: every draft accepted -> the traced forward's final state.
    sN = layer.promote(before, trace, N)
    assert_close(sN.recurrent, after.recurrent, "exact", op="promote", case="acc=N")
    assert_close(sN.conv, after.conv, "float64", op="promote", tensor="conv", case="acc=N")
    # Off by one would be visible: promote(acc) != state after acc tokens.
    assert not np.allclose(layer.promote(before, trace, 2).recurrent,
                           layer.forward(batch[:2], before)[1].recurrent)
    with pytest.raises(ValueError, match="outside"):
        layer.promote(before, trace, N + 1)


def test_rewind_does_not_alias_the_trace(rng):
    cfg = small_config()
    layer = GDNLayer(cfg, separate_weights(cfg, rng))
    before = layer.initial_state()
    _, _, trace = layer.forward(rng.standard_normal((3, cfg.hidden_size)), before,
                                return_trace=True)
    s = layer.rewind(before, trace, 2)
    s.recurrent[...] = 0.0
    s.conv[...] = 0.0
    assert np.abs(trace.recurrent[1]).sum() > 0 and np.abs(trace.conv_inputs).sum() > 0
    s0 = layer.rewind(before, trace, 0)
    s0.conv[...] = 1.0
    assert not before.conv.any()


# ---------------------------------------------------------------- extreme gates


@pytest.mark.parametrize("mode", ["recurrent", "chunked"])
def test_extreme_gates_stay_finite_in_float32(rng, mode):
    # A = e^8 ~ 3000 and a + dt_bias ~ 30 (softplus -> identity): g ~ -9e4 per token.
    cfg = small_config(chunk_size=8)
    w = {n: a.astype(np.float32) for n, a in separate_weights(cfg, rng).items()}
    w["A_log"] = np.full(cfg.num_v_heads, 8.0, np.float32)
    w["dt_bias"] = np.full(cfg.num_v_heads, 30.0, np.float32)
    layer = GDNLayer(cfg, w)
    assert layer.dtype == np.float32
    x = rng.standard_normal((40, cfg.hidden_size)).astype(np.float32)
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        y, s, _ = layer.forward(x, mode=mode)
    assert np.isfinite(y).all() and np.isfinite(s.recurrent).all()


# ---------------------------------------------------------------- NumPy vs CuPy (gpu)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["qwen3_5", "qwen3_next"])
def test_layer_twin_forward_and_rewind(rng, layout):
    cfg = small_config(layout, H=2, r=2, dk=128, dv=128, hidden=96)
    sep = {n: a.astype(np.float32) for n, a in separate_weights(cfg, rng, 0.05).items()}
    w = fuse_grouped(sep, cfg) if layout == "qwen3_next" else sep
    np_layer, cp_layer = GDNLayer(cfg, w, "numpy"), GDNLayer(cfg, w, "cupy")
    x = rng.standard_normal((150, cfg.hidden_size)).astype(np.float32)
    y_np, s_np, _ = np_layer(x, mode="chunked")
    y_cp, s_cp, _ = cp_layer(x, mode="chunked")
    assert_close(y_cp, y_np, "float32_gdn", op="GDNLayer (cupy)", case=f"{layout} prefill")
    assert_close(s_cp.recurrent, s_np.recurrent, "float32_gdn", op="GDNLayer (cupy)")
    batch = rng.standard_normal((8, cfg.hidden_size)).astype(np.float32)
    _, _, tr_np = np_layer(batch, s_np, return_trace=True)
    s_cp_before = GDNState(cp_layer.be.to_backend(s_np.recurrent),
                           cp_layer.be.to_backend(s_np.conv))
    _, _, tr_cp = cp_layer(batch, s_cp_before, return_trace=True)
    for n_keep in (0, 1, 5, 8):
        a, b = cp_layer.rewind(s_cp_before, tr_cp, n_keep), np_layer.rewind(s_np, tr_np, n_keep)
        assert_close(a.recurrent, b.recurrent, "float32_gdn", op="rewind (cupy)",
                     case=f"keep={n_keep}")
        assert_close(a.conv, b.conv, "float32_gdn", op="rewind (cupy)", tensor="conv")
