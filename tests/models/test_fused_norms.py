"""The decoder stack's fused residual add + RMSNorm (``add_rms_norm``, dflash_ref/models/fused.py):
that it equals the unfused reference form (``AddNorm``, dflash_ref/models/layers.py) on every
family, how often it runs, and that the normed input one layer hands the next is the norm of the
stream it recorded.

Fused == reference is exact (``assert_array_equal``), by construction: the fused stack calls the
same layer parts in the same order on the same values, and on NumPy ``add_rms_norm`` is the add
then ``rms_norm`` (tests/ops/test_norm.py checks that bit for bit); the only difference is the
operand order of one addition (``m + x`` for ``x + m``), which IEEE addition does not see.

The expected counts are by hand from each family's layer order (dflash_ref/models/layers.py,
docs/backend.md "Fused ops"): every residual add that a norm of the sum follows is one
``add_rms_norm`` (the pre-MLP norm; the next layer's input norm; the final norm after the last
layer), so a forward over L layers makes 2L fused calls and only layer 0's input norm runs alone.
Gemma 3 also norms each sub-block's output before its add (sandwich norms): that norm joins the
fused call (``norm_add_rms_norm``: post norm, add, next norm); Gemma 4's layer scalar (and
per-layer input) sit between a layer's last add and the next norm, so there only the pre-MLP
add is fused (with the post-attention norm) and the post-feedforward norm runs alone. Logits
are unchanged bit for bit: every model test and the golden cases
(tests/oracle/test_golden_cases.py) run through the fused path.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from dflash_ref.backend import Backend, get_backend
from dflash_ref.config import TargetConfig, expected_tensors
from dflash_ref.models.assemble import FUSED_OPS
from dflash_ref.models.target import TargetModel
from dflash_ref.ops.norm import rms_norm
from dflash_ref.testing import Tolerance, assert_close
from dflash_ref.tiny import tiny_target_config, tiny_weights

FIXTURES = Path(__file__).parent / "fixtures" / "hf"
HF_CASES = ["qwen35_moe", "gemma4_dense", "gemma4_ple_kvshare", "gemma4_moe"]
UNFUSED_ADDS = ("qk_norm_rope",)  # the reference residual adds (the q/k op still fused)


def counting_ops_backend(calls: Counter, hidden: int) -> Backend:
    """The NumPy backend, counting ``add_rms_norm`` and ``norm_add_rms_norm`` calls and
    ``rms_norm`` calls over the residual stream's width ([T, hidden]; the per-head q / k / v
    norms are [T, h, d])."""
    ref = get_backend("numpy")

    def add_rms_norm(*args, **kwargs):
        calls["add_rms_norm"] += 1
        return ref.ops.add_rms_norm(*args, **kwargs)

    def norm_add_rms_norm(*args, **kwargs):
        calls["norm_add_rms_norm"] += 1
        return ref.ops.norm_add_rms_norm(*args, **kwargs)

    def stream_rms_norm(x, *args, **kwargs):
        if x.ndim == 2 and x.shape[-1] == hidden:
            calls["rms_norm"] += 1
        return ref.ops.rms_norm(x, *args, **kwargs)

    ops = SimpleNamespace(**{**vars(ref.ops), "add_rms_norm": add_rms_norm,
                             "norm_add_rms_norm": norm_add_rms_norm, "rms_norm": stream_rms_norm})
    return Backend("numpy", np, ops)


def tiny_config(family: str, n_layers: int) -> TargetConfig:
    over = {"num_hidden_layers": n_layers}
    if family == "gemma3":
        over["layer_types"] = (["sliding_attention", "full_attention"] * n_layers)[:n_layers]
    if family == "qwen3_5":
        over["layer_types"] = (["linear_attention"] * 3 + ["full_attention"]) * (n_layers // 4)
    return TargetConfig.from_hf(tiny_target_config(family, **over))


def counts_of_one_forward(model: TargetModel, calls: Counter, n_tokens: int = 5) -> Counter:
    calls.clear()
    model.forward(np.arange(3, 3 + n_tokens), model.new_state())
    return Counter(calls)


@pytest.mark.parametrize("family,n_layers,sandwich", [
    ("qwen3", 1, False), ("qwen3", 3, False), ("qwen3_5", 4, False), ("qwen3_5", 8, False),
    ("gemma3", 2, True), ("gemma3", 5, True)])
def test_one_fused_call_replaces_each_add_then_norm(family, n_layers, sandwich):
    cfg, calls = tiny_config(family, n_layers), Counter()
    weights = tiny_weights(expected_tensors(cfg), 7, cfg.norm_offset)
    model = TargetModel(cfg, weights, backend=counting_ops_backend(calls, cfg.hidden_size))
    L = n_layers
    # 2L fused: L pre-MLP norms, L - 1 next-layer input norms, the final norm. Alone: layer 0's
    # input norm. Gemma's post-attention and post-feedforward norms of the sub-block outputs are
    # fused too: each add is then a norm_add_rms_norm (post norm, add, next norm).
    fused = "norm_add_rms_norm" if sandwich else "add_rms_norm"
    assert counts_of_one_forward(model, calls) == Counter({fused: 2 * L, "rms_norm": 1})


@pytest.mark.parametrize("case", ["qwen35_moe", "gemma4_dense", "gemma4_ple_kvshare"])
def test_fused_calls_on_the_hf_fixtures(case):
    cfg = TargetConfig.from_hf(json.loads((FIXTURES / case / "config.json").read_text()))
    calls = Counter()
    model = TargetModel.from_pretrained(FIXTURES / case,
                                        backend=counting_ops_backend(calls, cfg.hidden_size))
    L = cfg.num_hidden_layers
    if case == "qwen35_moe":  # as Qwen3: nothing between a layer's last add and the next norm
        expected = {"add_rms_norm": 2 * L, "rms_norm": 1}
    else:  # Gemma 4: the layer scalar follows the last add: the L input norms, the final
        # norm and the L post-feedforward norms run alone; the post-attention norm, its add and
        # the pre-MLP norm are one norm_add_rms_norm
        expected = {"norm_add_rms_norm": L, "rms_norm": L + 1 + L}
        if case == "gemma4_ple_kvshare":  # + each layer's post_per_layer_input_norm [T, H]
            expected["rms_norm"] += L
    assert counts_of_one_forward(model, calls) == Counter(expected)


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5", "gemma3"])
def test_the_handed_over_input_is_the_next_layers_norm_of_the_recorded_stream(family):
    # "attn_norm" of layer i + 1 (made by layer i's fused add) must be layer i + 1's input norm
    # of the stream layer i recorded as "h", and "mlp_norm" the pre-MLP norm of h_(i-1) +
    # attn_out: bit for bit, as the unfused layer computed them. Catches the handed-over u
    # coming from the wrong norm (layer i's own, or the pre-MLP weight) or from the pre-add x.
    cfg = tiny_config(family, 4)
    model = TargetModel(cfg, tiny_weights(expected_tensors(cfg), 3, cfg.norm_offset))
    seen = {}
    model.forward(np.arange(3, 9), model.new_state(),
                  tap=lambda i, name, x: seen.__setitem__((i, name), np.array(x)))
    eps, off = cfg.rms_norm_eps, cfg.norm_offset
    for i in range(1, 4):
        w_in = model.layers[i].input_norm.weight
        np.testing.assert_array_equal(seen[i, "attn_norm"], rms_norm(seen[i - 1, "h"], w_in, eps,
                                                                     off))
        mid = seen[i - 1, "h"] + seen[i, "attn_out"]  # the stream before the MLP
        w_mlp = model.layers[i].pre_mlp_norm.weight
        np.testing.assert_array_equal(seen[i, "mlp_norm"], rms_norm(mid, w_mlp, eps, off))
        np.testing.assert_array_equal(seen[i, "h"], mid + seen[i, "mlp_out"])


# ---------------------------------------------------------------- fused == reference


def family_model(case: str, backend="numpy", fused=FUSED_OPS) -> TargetModel:
    """A tiny target of a family (qwen3, qwen3_5, gemma3) or an HF fixture (HF_CASES), with
    capture on two layers, built with the ``fused`` ops."""
    if case in HF_CASES:
        return TargetModel.from_pretrained(FIXTURES / case, backend=backend,
                                           target_layer_ids=[0, 2], fused=fused)
    cfg = tiny_config(case, 4)
    return TargetModel(cfg, tiny_weights(expected_tensors(cfg), 11, cfg.norm_offset),
                       backend=backend, target_layer_ids=[0, 2], fused=fused)


def run_steps(model: TargetModel) -> dict:
    """Prefill, a decode step and a tree verify on one state: every logit, feature and tap."""
    seen, state = {}, model.new_state()

    def tap(step):
        return lambda i, name, x: seen.__setitem__((step, i, name), model.be.to_numpy(x))

    for step, ids in enumerate([np.arange(3, 12), [17]]):
        out = model.forward(ids, state, tap=tap(step))
        seen[step, "logits"] = model.be.to_numpy(out.logits)
        seen[step, "features"] = model.be.to_numpy(out.features)
    out = model.forward_tree([5, 6, 7, 8], [-1, 0, 0, 1], state)
    seen["tree", "logits"] = model.be.to_numpy(out.logits)
    seen["tree", "features"] = model.be.to_numpy(out.features)
    return seen


@pytest.mark.parametrize("case", ["qwen3", "qwen3_5", "gemma3", *HF_CASES])
def test_the_fused_stack_equals_the_reference_stack_bit_for_bit(case):
    model = family_model(case)
    assert "add_rms_norm" in model.fused  # what every other test runs
    fused = run_steps(model)
    reference = run_steps(family_model(case, fused=UNFUSED_ADDS))
    assert fused.keys() == reference.keys()
    assert any(k[-1] == "attn_norm" for k in fused)  # the taps ran
    for key, want in reference.items():
        np.testing.assert_array_equal(fused[key], want, err_msg=f"{case}: {key}")


@pytest.mark.parametrize(("family", "n_layers", "sandwich"), [
    ("qwen3", 3, False), ("qwen3_5", 4, False), ("gemma3", 5, True)])
def test_the_reference_stack_fuses_nothing(family, n_layers, sandwich):
    # Each of the 2L + 1 stream norms (L input norms, L pre-MLP norms, the final norm) runs
    # alone after a plain add, plus Gemma's 2L post norms: the reference is the unfused block.
    cfg, calls = tiny_config(family, n_layers), Counter()
    weights = tiny_weights(expected_tensors(cfg), 7, cfg.norm_offset)
    model = TargetModel(cfg, weights, backend=counting_ops_backend(calls, cfg.hidden_size),
                        fused=UNFUSED_ADDS)
    L = n_layers
    assert counts_of_one_forward(model, calls) == Counter(
        {"rms_norm": 2 * L + 1 + (2 * L if sandwich else 0)})


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["qwen3", "qwen3_5", "gemma3", *HF_CASES])
def test_the_fused_stack_equals_the_reference_stack_on_cupy(case):
    # On CuPy the fused kernel (add_rms_norm_f32) and the plain rms_norm kernel reduce the mean
    # square in their own orders, so equality holds to float32 rounding, not bit for bit.
    fused = run_steps(family_model(case, backend="cupy"))
    reference = run_steps(family_model(case, backend="cupy", fused=UNFUSED_ADDS))
    tol = Tolerance(1e-5, 1e-5, "the same float32 math; the mean square of each norm summed in "
                                "another order, carried through 4 layers")
    for key, want in reference.items():
        assert_close(fused[key], want, tol, op="FusedAddNorm", tensor=str(key), case=case)
