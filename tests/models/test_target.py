"""Target models: loading real layouts, forward == independent oracle, capture, micro-batching,
decode == prefill, rollback, SWA, Gemma scale/softcap, errors, NumPy vs CuPy."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file, save_file

from dflash_ref.errors import ConfigError, FormatError
from dflash_ref.models.target import TargetModel
from dflash_ref.testing import Tolerance, assert_close
from dflash_ref.tiny import TINY_FAMILIES, write_tiny_target
from tests.models.oracle import dense_forward, qwen35_forward

# float32 model vs float64 oracle through 4 layers of matmuls over width <= 128: relative error
# per layer ~ sqrt(128) * 6e-8, amplified by norms; logits are O(10).
VS_ORACLE = Tolerance(1e-4, 1e-4, "float32 model vs float64 oracle through 4 layers")
# Same float32 computation, different batch split: matmul rows are independent, but BLAS may
# pick other kernels for other row counts (different summation order): a few ulp of O(10) values.
SPLIT = Tolerance(1e-5, 2e-5, "same float32 math, BLAS blocking differs with the row count")

PROMPT = np.array([3, 17, 42, 99, 5, 250, 7, 61, 13, 128, 77, 200, 31, 8, 190, 64, 11, 2, 150, 90])


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """family -> directory of a tiny checkpoint in HF layout."""
    root = tmp_path_factory.mktemp("targets")
    return {f: write_tiny_target(root / f, f, seed=7) for f in TINY_FAMILIES}


def _run(model, ids, splits=None, **state_kw):
    """Forward ``ids`` in micro-batches cut at ``splits``; returns (state, logits, features)."""
    state = model.new_state(**state_kw)
    cuts = [0, *(splits or []), len(ids)]
    outs = [model.forward(ids[a:b], state) for a, b in zip(cuts, cuts[1:]) if b > a]
    logits = np.concatenate([model.be.to_numpy(o.logits) for o in outs])
    feats = None
    if outs[0].features is not None:
        feats = np.concatenate([model.be.to_numpy(o.features) for o in outs])
    return state, logits, feats


# ---------------------------------------------------------------- loading and the oracle


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_every_family_loads_through_from_pretrained(ckpt, family):
    model = TargetModel.from_pretrained(ckpt[family], target_layer_ids=[0, 2])
    out = model.forward(PROMPT[:5], model.new_state())
    assert out.logits.shape == (5, 256) and out.logits.dtype == np.float32
    assert out.features.shape == (5, 2 * 64)
    assert np.all(np.isfinite(out.logits))


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_forward_matches_the_independent_float64_oracle(ckpt, family):
    config = json.loads((ckpt[family] / "config.json").read_text())
    tensors = load_file(ckpt[family] / "model.safetensors")
    oracle = qwen35_forward if family == "qwen3_5" else dense_forward
    hs, logits = oracle(config, tensors, PROMPT)
    model = TargetModel.from_pretrained(ckpt[family], target_layer_ids=[2, 0, 1])
    _, got_logits, feats = _run(model, PROMPT)
    assert_close(got_logits, logits, VS_ORACLE, op="TargetModel.forward", tensor="logits",
                 case=family)
    # Capture convention: features = concat(hs[2 + 1], hs[0 + 1], hs[1 + 1]) in list order.
    expected = np.concatenate([hs[3], hs[1], hs[2]], axis=1)
    assert_close(feats, expected, VS_ORACLE, op="TargetModel.forward", tensor="features",
                 case=family)


def test_capture_is_the_output_of_layer_id_not_its_input(tmp_path):
    # Layers 0 and 2 are made identities (o_proj = down_proj = 0): their output equals their
    # input. Capturing id 0 must then give the embeddings exactly; id 1 must not (layer 1 is
    # active). A "+1" bug (output of id + 1) or an "input of id" bug breaks one of the two.
    path = write_tiny_target(tmp_path / "t", "qwen3", seed=3)
    tensors = load_file(path / "model.safetensors")
    for i in (0, 2):
        for name in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):
            tensors[f"model.layers.{i}.{name}"][:] = 0.0
    save_file(tensors, str(path / "model.safetensors"))
    model = TargetModel.from_pretrained(path, target_layer_ids=[1, 0])
    feats = model.forward(PROMPT[:6], model.new_state()).features
    emb = tensors["model.embed_tokens.weight"][PROMPT[:6]]
    np.testing.assert_array_equal(feats[:, 64:], emb)  # id 0: output of identity layer 0
    assert np.abs(feats[:, :64] - emb).max() > 1e-2  # id 1: layer 1 changed the stream


# ---------------------------------------------------------------- micro-batching and decode


@pytest.mark.parametrize("family", TINY_FAMILIES)
@settings(max_examples=8)
@given(data=st.data())
def test_micro_batches_equal_one_batch(ckpt, family, data):
    model = _cached_model(ckpt, family)
    splits = sorted(set(data.draw(st.lists(st.integers(1, len(PROMPT) - 1), max_size=4))))
    ref_state, ref_logits, ref_feats = _run(model, PROMPT)
    state, logits, feats = _run(model, PROMPT, splits)
    assert_close(logits, ref_logits, SPLIT, op="forward", tensor="logits", case=f"{splits}")
    assert_close(feats, ref_feats, SPLIT, op="forward", tensor="features", case=f"{splits}")
    assert_close(state.features.rows(), ref_feats, SPLIT, op="FeatureBuffer", case=f"{splits}")
    for i, cache in ref_state.kv.items():
        assert_close(state.kv[i].k, cache.k, SPLIT, op="KVCache", tensor=f"k[{i}]")
        assert_close(state.kv[i].v, cache.v, SPLIT, op="KVCache", tensor=f"v[{i}]")


_MODELS: dict = {}


def _cached_model(ckpt, family):
    if family not in _MODELS:
        _MODELS[family] = TargetModel.from_pretrained(ckpt[family], target_layer_ids=[0, 2])
    return _MODELS[family]


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_token_by_token_decode_equals_prefill(ckpt, family):
    model = _cached_model(ckpt, family)
    _, ref_logits, ref_feats = _run(model, PROMPT)
    _, logits, feats = _run(model, PROMPT, list(range(1, len(PROMPT))))
    assert_close(logits, ref_logits, SPLIT, op="decode", tensor="logits", case=family)
    assert_close(feats, ref_feats, SPLIT, op="decode", tensor="features", case=family)


@pytest.mark.parametrize("family", TINY_FAMILIES)
@pytest.mark.parametrize("n_keep_offset", [0, 1, 3, 6])
def test_rollback_then_rerun_equals_fresh_run(ckpt, family, n_keep_offset):
    # Prefill 10 tokens, run a "verify batch" of 6 wrong tokens, roll back to keep n_keep_offset
    # of them, then run the true continuation: must equal a fresh run of the true sequence.
    model = _cached_model(ckpt, family)
    prefix, rest = PROMPT[:10], PROMPT[10:]
    wrong = np.array([5, 6, 7, 8, 9, 10])
    wrong[:n_keep_offset] = rest[:n_keep_offset]  # the accepted part agrees with the truth
    state = model.new_state()
    model.forward(prefix, state)
    model.forward(wrong, state)
    state.rollback(10 + n_keep_offset)
    tail = model.forward(rest[n_keep_offset:], state)
    _, ref_logits, ref_feats = _run(model, PROMPT)
    assert_close(model.be.to_numpy(tail.logits), ref_logits[10 + n_keep_offset:], SPLIT,
                 op="rollback", tensor="logits", case=f"{family} keep {n_keep_offset}")
    assert_close(state.features.rows(), ref_feats, SPLIT, op="rollback", tensor="features")
    assert state.length == len(PROMPT)


def test_hybrid_rollback_beyond_the_last_batch_is_refused(ckpt):
    model = _cached_model(ckpt, "qwen3_5")
    state = model.new_state()
    model.forward(PROMPT[:10], state)
    model.forward(PROMPT[10:14], state)
    with pytest.raises(ValueError, match="last forward"):
        state.rollback(8)


# ---------------------------------------------------------------- SWA, Gemma scale and softcap


def test_swa_differs_from_full_attention_only_past_the_window(tmp_path):
    # Window 8: positions 0..7 see every earlier key under both rules; from position 8 on, the
    # sliding layers drop keys and the logits must change.
    swa = write_tiny_target(tmp_path / "swa", "gemma3", seed=5)
    full = write_tiny_target(tmp_path / "full", "gemma3", seed=5, sliding_window=4096)
    _, a, _ = _run(TargetModel.from_pretrained(swa), PROMPT)
    _, b, _ = _run(TargetModel.from_pretrained(full), PROMPT)
    assert_close(a[:8], b[:8], SPLIT, op="SWA", case="inside the window")
    assert np.abs(a[8:] - b[8:]).max(axis=1).min() > 1e-4, "SWA ran as full attention"


def test_gemma_embedding_scale_and_softcap_are_applied_exactly_once(ckpt):
    model = TargetModel.from_pretrained(ckpt["gemma3"], target_layer_ids=[3])
    E = load_file(ckpt["gemma3"] / "model.safetensors")["model.embed_tokens.weight"]
    # hidden 64, float32 checkpoint: sqrt(64) = 8 exactly.
    np.testing.assert_array_equal(model.embed(PROMPT[:4]), E[PROMPT[:4]] * 8.0)
    out = model.forward(PROMPT[:6], model.new_state())
    # Recompute the head from the captured last-layer output: 30 tanh(raw / 30), once.
    h = out.features.astype(np.float64)
    w = load_file(ckpt["gemma3"] / "model.safetensors")["model.norm.weight"].astype(np.float64)
    hn = h / np.sqrt(np.mean(h * h, -1, keepdims=True) + 1e-6) * (1.0 + w)
    raw = hn @ E.astype(np.float64).T
    assert_close(out.logits, 30.0 * np.tanh(raw / 30.0), VS_ORACLE, op="softcap", case="once")
    # The cap bites here (|raw| reaches ~66 > 30), so the comparison above tells "once" from
    # "never" and from "twice": the float64 formula moves the logits far beyond the tolerance.
    once = 30.0 * np.tanh(raw / 30.0)
    assert np.abs(raw).max() > 30.0
    assert np.abs(once - raw).max() > 1.0  # no softcap: off by more than 1
    assert np.abs(30.0 * np.tanh(once / 30.0) - once).max() > 1.0  # softcap applied twice


# ---------------------------------------------------------------- errors


def test_missing_tensor_wrong_shape_and_missing_rope_theta(tmp_path):
    path = write_tiny_target(tmp_path / "t", "qwen3", seed=1)
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(FormatError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        TargetModel.from_pretrained(path)

    path = write_tiny_target(tmp_path / "s", "qwen3", seed=1)
    tensors = load_file(path / "model.safetensors")
    tensors["model.norm.weight"] = np.ones(63, np.float32)
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(FormatError, match=r"model\.norm\.weight has shape \[63\], expected \[64\]"):
        TargetModel.from_pretrained(path)

    path = write_tiny_target(tmp_path / "r", "qwen3", seed=1)
    cfg = json.loads((path / "config.json").read_text())
    del cfg["rope_theta"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="rope_theta"):
        TargetModel.from_pretrained(path)


def test_capture_ids_out_of_range_and_unsupported_features(ckpt, tmp_path):
    with pytest.raises(ConfigError, match="GGUF"):
        TargetModel.from_pretrained(ckpt["qwen3"], target_layer_ids=[4])
    path = write_tiny_target(tmp_path / "g", "qwen3", seed=1, hidden_act="gelu")
    with pytest.raises(ConfigError, match="hidden_act"):
        TargetModel.from_pretrained(path)


# ---------------------------------------------------------------- NumPy vs CuPy


@pytest.mark.gpu
@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_target_numpy_vs_cupy(ckpt, family):
    cpu = TargetModel.from_pretrained(ckpt[family], target_layer_ids=[0, 2])
    gpu = TargetModel.from_pretrained(ckpt[family], backend="cupy", target_layer_ids=[0, 2])
    _, a, fa = _run(cpu, PROMPT, [7, 15])
    _, b, fb = _run(gpu, PROMPT, [7, 15])
    tol = Tolerance(1e-4, 1e-4, "cuBLAS (maybe TF32-free fp32) vs NumPy BLAS through 4 layers")
    assert_close(b, a, tol, op="TargetModel", tensor="logits", case=family)
    assert_close(fb, fa, tol, op="TargetModel", tensor="features", case=family)


# ---------------------------------------------------------------- tree verify


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_tree_pass_then_commit_path_equals_running_the_path_as_a_chain(ckpt, family):
    # A tree over 7 nodes: root 0; children 1, 2; 3 under 1; 4, 5 under 3; 6 under 2.
    model = _cached_model(ckpt, family)
    prefix = PROMPT[:9]
    tokens = np.array([40, 41, 42, 43, 44, 45, 46])
    parents = np.array([-1, 0, 0, 1, 3, 3, 2])
    state = model.new_state()
    model.forward(prefix, state)
    out = model.forward_tree(tokens, parents, state)
    # Every node's logits equal a chain run of its root-to-node branch.
    for node, branch in {5: [0, 1, 3, 5], 6: [0, 2, 6], 4: [0, 1, 3, 4]}.items():
        ref_state = model.new_state()
        ref = model.forward(np.concatenate([prefix, tokens[branch]]), ref_state)
        assert_close(out.logits[node], ref.logits[-1], SPLIT, op="forward_tree",
                     tensor=f"logits[{node}]", case=family)
    state.commit_path([0, 1, 3, 5])
    assert state.length == 13
    # After the commit the state continues exactly like a chain run of prefix + branch.
    nxt = model.forward([7, 8], state)
    ref_state = model.new_state()
    ref = model.forward(np.concatenate([prefix, tokens[[0, 1, 3, 5]], [7, 8]]), ref_state)
    assert_close(nxt.logits, ref.logits[-2:], SPLIT, op="commit_path", case=family)
    assert_close(state.features.rows(), ref_state.features.rows(), SPLIT, op="commit_path",
                 tensor="features", case=family)


def test_tree_pass_must_be_committed_before_anything_else(ckpt):
    model = _cached_model(ckpt, "qwen3")
    state = model.new_state()
    model.forward(PROMPT[:4], state)
    model.forward_tree([1, 2, 3], [-1, 0, 0], state)
    with pytest.raises(ValueError, match="commit_path"):
        model.forward([5], state)
    with pytest.raises(ValueError, match="commit_path"):
        state.rollback(2)
    with pytest.raises(ValueError, match="root"):
        state.commit_path([1, 2])
    with pytest.raises(ValueError, match="topologically"):
        model.forward_tree([1, 2], [-1, 1], model.new_state())


# ---------------------------------------------------------------- real layouts: nesting, shards


@pytest.mark.parametrize("family,arch,model_type,prefixes", [
    ("qwen3_5", "Qwen3_5ForConditionalGeneration", "qwen3_5", ["model.language_model."]),
    ("gemma3", "Gemma3ForConditionalGeneration", "gemma3",
     ["language_model.model.", "model.language_model."]),
])
def test_multimodal_wrapper_nests_the_text_config_and_prefixes_weights(ckpt, tmp_path, family,
                                                                       arch, model_type, prefixes):
    # The multimodal checkpoints keep the text model's config under text_config and its tensors
    # under a prefix; each published prefix must load and give the text-only model's logits.
    text_cfg = json.loads((ckpt[family] / "config.json").read_text())
    tensors = load_file(ckpt[family] / "model.safetensors")
    text_model = TargetModel.from_pretrained(ckpt[family])
    ref = text_model.forward(PROMPT[:6], text_model.new_state()).logits
    for prefix in prefixes:
        path = tmp_path / prefix.strip(".").replace(".", "_")
        path.mkdir()
        wrapped = {"architectures": [arch], "model_type": model_type, "text_config": text_cfg,
                   "vision_config": {"depth": 1}}
        if "tie_word_embeddings" in text_cfg:
            wrapped["tie_word_embeddings"] = text_cfg["tie_word_embeddings"]
        (path / "config.json").write_text(json.dumps(wrapped))
        head = "lm_head.weight" if prefix.startswith("model.") else "language_model.lm_head.weight"
        renamed = {(head if k == "lm_head.weight" else prefix + k[len("model."):]): v
                   for k, v in tensors.items()}
        save_file(renamed, str(path / "model.safetensors"))
        model = TargetModel.from_pretrained(path)
        assert model.config.weight_prefix == prefix
        got = model.forward(PROMPT[:6], model.new_state()).logits
        np.testing.assert_array_equal(got, ref)


def test_sharded_bf16_checkpoint_loads_like_the_float32_one(tmp_path):
    # bf16 storage rounds every weight; the loader reads the raw bf16 bits into float32, so the
    # sharded bf16 model equals a float32 model built from the rounded weights exactly.
    from dflash_ref.io.quant import bf16_bits_to_float32, float32_to_bf16_bits

    f32 = write_tiny_target(tmp_path / "f32", "qwen3", seed=9)
    bf16 = write_tiny_target(tmp_path / "bf16", "qwen3", seed=9, dtype="bfloat16",
                             shard_size=60_000)
    assert (bf16 / "model.safetensors.index.json").exists()
    tensors = {k: bf16_bits_to_float32(float32_to_bf16_bits(v))
               for k, v in load_file(f32 / "model.safetensors").items()}
    save_file(tensors, str(f32 / "model.safetensors"))
    a = TargetModel.from_pretrained(f32)
    b = TargetModel.from_pretrained(bf16)
    np.testing.assert_array_equal(a.forward(PROMPT, a.new_state()).logits,
                                  b.forward(PROMPT, b.new_state()).logits)
