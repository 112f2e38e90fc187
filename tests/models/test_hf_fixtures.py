"""Gemma 4 (dense, PLE + KV sharing, MoE) and Qwen3.5 MoE against HF transformers.

The expected values are HF's own: ``tests/models/fixtures/hf/<case>/`` holds a tiny checkpoint
saved by transformers' ``save_pretrained`` and ``reference.npz`` with HF's float64 logits,
``hidden_states`` and router records over an 80-token prompt (scripts/build_hf_fixtures.py says
how they were made; the transformers version is in ``fixtures/hf/VERSION``). The prompt is longer
than every sliding window (8) and than the GDN trace limit (64); the model runs it in two
micro-batches (the first one longer than 64 for the hybrid). ``test_live_against_transformers``
rebuilds a case with the installed transformers and compares live; it skips without torch.

Also here: a DFlash drafter over each target runs in ``generate`` with speculative == plain
greedy, and the Gemma 4 drafter inherits the target's embedding scale and final softcap.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from dflash_ref.models.drafter import DFlashDrafter
from dflash_ref.models.target import TargetModel
from dflash_ref.spec_decode.loop import generate
from dflash_ref.testing import Tolerance, assert_close
from dflash_ref.tiny import write_tiny_drafter
from tests.models.oracle import qwen35_forward
from tests.models.oracle_gemma4_moe import gemma4_forward

FIXTURES = Path(__file__).parent / "fixtures" / "hf"
CASES = ("gemma4_dense", "gemma4_ple_kvshare", "gemma4_moe", "qwen35_moe")
REL = 1e-4  # the issue's "within 1e-4 relative"


def check(actual, ref, case: str, tensor: str) -> None:
    """float32 model vs HF float64: rtol 1e-4 per element plus atol = 1e-4 x max|ref| (float32
    rounding through 6 layers and 80 positions is relative to the tensor's scale, and elements
    near zero carry the absolute error of their larger neighbours)."""
    tol = Tolerance(REL, REL * float(np.max(np.abs(ref))),
                    "float32 target vs HF float64, 1e-4 relative to the tensor's scale")
    assert_close(actual, ref, tol, op="TargetModel vs HF transformers", tensor=tensor, case=case)


def run_in_two_batches(model: TargetModel, ids, cut: int):
    """Logits [T, V], features [T, C*H] and router taps of ids run as ids[:cut], ids[cut:]."""
    state, taps = model.new_state(), {}

    def tap(layer, name, x):
        if name in ("router_logits", "experts"):
            taps.setdefault((layer, name), []).append(np.asarray(x))

    outs = [model.forward(ids[:cut], state, tap=tap), model.forward(ids[cut:], state, tap=tap)]
    logits = np.concatenate([o.logits for o in outs])
    feats = np.concatenate([o.features for o in outs])
    return logits, feats, {k: np.concatenate(v) for k, v in taps.items()}


def check_against_reference(path: Path) -> None:
    ref = np.load(path / "reference.npz")
    L = ref["hidden"].shape[0] - 1
    model = TargetModel.from_pretrained(path, target_layer_ids=list(range(L - 1)))
    H = model.config.hidden_size
    cut = 70 if model.config.gdn is not None else 45  # first batch past the trace limit (64)
    logits, feats, taps = run_in_two_batches(model, ref["ids"], cut)
    check(logits, ref["logits"], path.name, "logits")
    # capture id i is HF hidden_states[i + 1] (the last layer's entry is final-normed in HF)
    for i in range(L - 1):
        check(feats[:, i * H:(i + 1) * H], ref["hidden"][i + 1], path.name,
              f"capture id {i} vs hidden_states[{i + 1}]")
    routers = [k for k in ref.files if k.startswith("router_")]
    assert bool(routers) == (model.config.moe is not None)
    for key in routers:
        i = int(key.split("_")[1])
        r = taps[(i, "router_logits")]
        if model.config.family == "gemma4":  # HF records the router's softmax for Gemma 4
            r = np.exp(r - r.max(1, keepdims=True))
            r = r / r.sum(1, keepdims=True)
        check(r, ref[key], path.name, key)
        k = model.config.moe.num_experts_per_tok
        hf_top = np.argsort(-ref[key], axis=1, kind="stable")[:, :k]
        assert np.array_equal(taps[(i, "experts")], hf_top), f"{path.name} experts of layer {i}"


@pytest.mark.parametrize("case", CASES)
def test_matches_recorded_hf_outputs(case):
    check_against_reference(FIXTURES / case)


def test_fixture_layouts_are_the_ones_the_issue_names():
    """Each fixture exercises what its name says (guards against a silently simplified rebuild)."""
    cfgs = {c: TargetModel.from_pretrained(FIXTURES / c).config for c in CASES}
    dense = cfgs["gemma4_dense"]
    assert dense.attention_k_eq_v and dense.final_logit_softcapping == 30.0
    assert (dense.head_dim_for(0), dense.head_dim_for(2)) == (8, 16)
    assert (dense.num_key_value_heads_for(0), dense.num_key_value_heads_for(2)) == (2, 1)
    assert dense.rope_for(2).rope_type == "proportional"
    ple = cfgs["gemma4_ple_kvshare"].gemma4
    assert ple.hidden_size_per_layer_input == 4 and ple.kv_sources[4:] == (3, 2)
    assert ple.use_double_wide_mlp
    assert cfgs["gemma4_moe"].moe.kind == "gemma4"
    q = cfgs["qwen35_moe"]
    assert q.moe.kind == "qwen" and q.moe.shared_expert_intermediate_size == 12
    assert "linear_attention" in q.layer_types
    assert (FIXTURES / "VERSION").read_text().startswith("transformers ")


def test_kv_sharing_layers_keep_no_cache_and_read_their_source():
    model = TargetModel.from_pretrained(FIXTURES / "gemma4_ple_kvshare")
    state = model.new_state()
    assert sorted(state.kv) == [0, 1, 2, 3]  # layers 4 and 5 read layers 3 and 2
    model.forward(np.arange(12) % 48, state)
    assert state.kv[3].length == 12 and state.kv[2].length == 12


@pytest.mark.parametrize("case", CASES)
def test_drafter_speculative_equals_plain_greedy(case, tmp_path):
    target_dir = FIXTURES / case
    cfg = json.loads((target_dir / "config.json").read_text())
    kw = {}
    if case.startswith("gemma4"):  # the drafter's per-layer SWA from its own config
        kw = dict(layer_types=["sliding_attention", "full_attention"], sliding_window=8,
                  use_sliding_window=True)
    d = write_tiny_drafter(tmp_path / "d", target_dir, seed=3, block_size=6,
                           target_layer_ids=(0, 2), mask_token_id=cfg["vocab_size"] - 1, **kw)
    target = TargetModel.from_pretrained(target_dir)
    drafter = DFlashDrafter.from_pretrained(d, target)
    if case.startswith("gemma4"):
        # inherits the target's embedding scale (sqrt(24) in float32) and final softcap 30
        assert drafter.config.noise_embedding_scale(target.config) == pytest.approx(24 ** 0.5)
        assert target.config.final_logit_softcapping == 30.0
    prompt = np.load(target_dir / "reference.npz")["ids"][:20]
    plain = generate(target, None, prompt, 12).tokens
    for verify in ("chain", "tree"):
        spec = generate(target, drafter, prompt, 12, block_size=6, verify=verify)
        assert spec.tokens == plain, f"{case} verify={verify}"


def _load_builder():
    spec = importlib.util.spec_from_file_location(
        "build_hf_fixtures", Path(__file__).parents[2] / "scripts" / "build_hf_fixtures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_live_against_transformers(case, tmp_path):
    pytest.importorskip("torch")
    tf = pytest.importorskip("transformers")
    if not hasattr(tf, "Gemma4TextConfig") or not hasattr(tf, "Qwen3_5MoeTextConfig"):
        pytest.skip(f"transformers {tf.__version__} has no Gemma 4 / Qwen3.5 MoE classes")
    _load_builder().build(case, tmp_path)
    check_against_reference(tmp_path / case)


@pytest.mark.parametrize("case", CASES)
def test_float64_oracle_agrees_with_hf_and_with_the_model(case):
    """The independent oracle (tests/models/oracle*.py) reproduces HF's recorded outputs, and the
    model matches the oracle: two independent routes to the same numbers."""
    path = FIXTURES / case
    cfg = json.loads((path / "config.json").read_text())
    tensors = load_file(path / "model.safetensors")
    ref = np.load(path / "reference.npz")
    forward = gemma4_forward if case.startswith("gemma4") else qwen35_forward
    ids = ref["ids"][:40]
    hs, logits = forward(cfg, tensors, ids)
    check(logits, ref["logits"][:40], case, "oracle logits vs HF")
    model = TargetModel.from_pretrained(path, target_layer_ids=[1])
    out = model.forward(ids, model.new_state())
    check(out.logits, logits, case, "model logits vs oracle")
    check(out.features, hs[2], case, "model capture id 1 vs oracle hs[2]")


@pytest.mark.parametrize("mistake", ["swa_as_full", "no_embedding_scale", "no_final_softcap"])
def test_seed_incidents_on_gemma4_31b_layout_break_agreement_with_hf(mistake):
    """The Gemma 4 31B seed's three costly mistakes each move the logits off HF's by at least ten
    times the agreement tolerance: SWA run as full attention (past the window only), the
    embedding scale dropped, the final softcap dropped (small here: the tiny model's logits sit
    where tanh is nearly linear, yet still 10x over the 1e-4 check)."""
    from dataclasses import replace

    from dflash_ref.io.safetensors_io import load_checkpoint

    path = FIXTURES / "gemma4_dense"
    ref = np.load(path / "reference.npz")
    good = TargetModel.from_pretrained(path)
    cfg = {"swa_as_full": replace(good.config, sliding_window=10 ** 6),
           "no_embedding_scale": replace(good.config, embedding_scale=None),
           "no_final_softcap": replace(good.config, final_logit_softcapping=None)}[mistake]
    bad = TargetModel(cfg, dict(load_checkpoint(path)))
    logits = bad.forward(ref["ids"], bad.new_state()).logits
    err = np.abs(logits - ref["logits"]).max(axis=1) / np.abs(ref["logits"]).max()  # per row
    assert err.max() > 10 * REL, mistake
    if mistake == "swa_as_full":  # identical while the context fits in the window (8)
        assert err[:8].max() < 1e-4
