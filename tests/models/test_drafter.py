"""The DFlash drafter: float64 oracle, cached == stateless, context window, embedding rows,
SWA conventions, config/target validation, NumPy vs CuPy."""

from __future__ import annotations

import json
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from dflash_ref.backend import Backend
from dflash_ref.errors import ConfigError, FormatError
from dflash_ref.models.drafter import DFlashDrafter
from dflash_ref.models.target import TargetModel
from dflash_ref.testing import Tolerance, assert_close
from dflash_ref.tiny import write_tiny_drafter, write_tiny_target
from tests.models.oracle import drafter_forward

VS_ORACLE = Tolerance(1e-4, 1e-4, "float32 drafter vs float64 oracle through 2 layers")
SAME_MATH = Tolerance(1e-5, 2e-5, "same float32 math; K/V computed in other batch shapes")
PROMPT = np.array([3, 17, 42, 99, 5, 250, 7, 61, 13, 128, 77, 200, 31, 8, 190, 64, 11, 2, 150])


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("drafter")
    out = {}
    for fam in ("qwen3", "gemma3"):
        out[fam] = write_tiny_target(root / fam, fam, seed=11)
        out[fam + "_drafter"] = write_tiny_drafter(root / (fam + "_d"), out[fam], seed=12)
    return out


def _load(dirs, fam="qwen3", **kw):
    target = TargetModel.from_pretrained(dirs[fam])
    return target, DFlashDrafter.from_pretrained(dirs[fam + "_drafter"], target, **kw)


def _features(target, ids):
    state = target.new_state()
    return target.be.to_numpy(target.forward(ids, state).features)


@pytest.mark.parametrize("fam", ["qwen3", "gemma3"])
def test_forward_block_matches_float64_oracle(dirs, fam):
    target, drafter = _load(dirs, fam)
    assert target.target_layer_ids == [0, 2]  # bound by the drafter: the target had none
    feats = _features(target, PROMPT)
    dcfg = json.loads((dirs[fam + "_drafter"] / "config.json").read_text())
    D = load_file(dirs[fam + "_drafter"] / "model.safetensors")
    T = load_file(dirs[fam] / "model.safetensors")
    E = T["model.embed_tokens.weight"]
    head = T.get("lm_head.weight", E)  # qwen3 tiny targets are untied (like Qwen3-8B)
    gemma = fam == "gemma3"
    expected = drafter_forward(dcfg, D, E, head, feats, np.arange(len(PROMPT)), anchor=150,
                               s=len(PROMPT), emb_scale=8.0 if gemma else 1.0,
                               softcap=30.0 if gemma else None)
    got = drafter.forward_block(feats, np.arange(len(PROMPT)), 150, len(PROMPT))
    assert got.shape == (8, 256)
    assert_close(got, expected, VS_ORACLE, op="forward_block", tensor="logits", case=fam)


def test_cached_equals_stateless_across_steps(dirs):
    # The authors' loop: extend with the newly committed features, draft, crop to s; repeat.
    target, drafter = _load(dirs)
    feats = _features(target, PROMPT)
    cache = drafter.new_cache()
    for s in (6, 7, 11, 19):  # committed lengths after successive verify steps
        cache.extend(feats[cache.length:s], np.arange(cache.length, s))
        cached = cache.forward_block(int(PROMPT[s - 1]), s)
        stateless = drafter.forward_block(feats[:s], np.arange(s), int(PROMPT[s - 1]), s)
        assert_close(cached, stateless, SAME_MATH, op="DraftCache", case=f"s={s}")
    cache.crop(9)
    assert cache.length == 9
    assert_close(cache.forward_block(5, 9), drafter.forward_block(feats[:9], np.arange(9), 5, 9),
                 SAME_MATH, op="DraftCache.crop")


def _record_attention_kv(monkeypatch, drafter):
    """Give the drafter a backend whose attention op records the (k, v) it is handed."""
    seen, be = [], drafter.be

    def attention(q, k, v, mask, **kw):
        seen.append((k, v))
        return be.ops.attention(q, k, v, mask, **kw)

    ops = SimpleNamespace(**{**vars(be.ops), "attention": attention})
    monkeypatch.setattr(drafter, "be", Backend(be.name, be.xp, ops))
    return seen


@pytest.mark.parametrize("window", [None, 6])
def test_a_draft_attends_over_views_of_the_cache_not_copies(dirs, monkeypatch, window):
    # The block's K/V go into each layer's spare rows after the context: what attention reads
    # is the cache's own storage (a copy of the context per layer per draft was O(context)).
    target, drafter = _load(dirs)
    feats, n, B = _features(target, PROMPT), len(PROMPT), drafter.block_size
    seen = _record_attention_kv(monkeypatch, drafter)
    cache = drafter.new_cache(window=window)
    cache.extend(feats, np.arange(n))
    cache.forward_block(9, n)
    ctx = n if window is None else window
    assert len(seen) == len(cache.kv) == drafter.config.num_hidden_layers
    for (k, v), layer in zip(seen, cache.kv):
        assert k.shape == v.shape == (ctx + B, 2, 16)  # [ctx + B, nkv, d]
        assert np.shares_memory(k, layer.k) and np.shares_memory(v, layer.v)
        np.testing.assert_array_equal(k[:ctx], layer.k[n - ctx:])  # the context comes FIRST
        np.testing.assert_array_equal(v[:ctx], layer.v[n - ctx:])


def test_a_draft_never_changes_the_committed_rows(dirs):
    # Same extends, with and without drafts in between: the committed K/V are identical bit for
    # bit. Before each draft the spare rows are filled with NaN (through a public stage), so a
    # draft that read a row it did not write would give non-finite logits.
    target, drafter = _load(dirs)
    feats, B = _features(target, PROMPT), drafter.block_size
    drafted, plain = drafter.new_cache(), drafter.new_cache()
    nan = np.full((B + 3, 2, 16), np.nan, np.float32)
    for s in (6, 7, 11, 19):
        for c in (drafted, plain):
            c.extend(feats[c.length:s], np.arange(c.length, s))
        for layer in drafted.kv:
            layer.stage(nan, nan)
        logits = drafted.forward_block(int(PROMPT[s - 1]), s)
        assert drafted.length == plain.length == s
        for a, b in zip(drafted.kv, plain.kv):
            np.testing.assert_array_equal(a.k, b.k)
            np.testing.assert_array_equal(a.v, b.v)
        assert_close(logits, plain.forward_block(int(PROMPT[s - 1]), s), SAME_MATH,
                     op="DraftCache", case=f"drafted before, s={s}")


def test_context_window(dirs):
    target, drafter = _load(dirs)
    feats = _features(target, PROMPT)
    n = len(PROMPT)
    full = drafter.forward_block(feats, np.arange(n), 9, n)
    wide = drafter.new_cache(window=n + 5)
    wide.extend(feats, np.arange(n))
    assert_close(wide.forward_block(9, n), full, SAME_MATH, op="window >= context")
    narrow = drafter.new_cache(window=6)
    narrow.extend(feats[:10], np.arange(10))
    narrow.extend(feats[10:], np.arange(10, n))
    last6 = drafter.forward_block(feats[-6:], np.arange(n - 6, n), 9, n)
    assert_close(narrow.forward_block(9, n), last6, SAME_MATH, op="window 6 == last 6 features")
    assert np.abs(narrow.forward_block(9, n) - full).max() > 1e-4


def test_block_uses_the_anchor_and_mask_embedding_rows(dirs):
    target, drafter = _load(dirs)
    E = target.be.to_numpy(target.embed_tokens)
    e = drafter.embed_block(42)
    np.testing.assert_array_equal(e[0], E[42])
    np.testing.assert_array_equal(e[1:], np.broadcast_to(E[255], (7, 64)))  # mask_token_id 255
    _, gemma_drafter = _load(dirs, "gemma3")
    Eg = gemma_drafter.target.be.to_numpy(gemma_drafter.target.embed_tokens)
    np.testing.assert_array_equal(gemma_drafter.embed_block(42)[0], Eg[42] * 8.0)  # sqrt(64)


def _swa_drafter(tmp_path, dirs, convention, window):
    path = write_tiny_drafter(tmp_path / f"swa_{convention}_{window}", dirs["qwen3"], seed=12,
                              num_hidden_layers=1, layer_types=["sliding_attention"],
                              sliding_window=window, use_sliding_window=True)
    target = TargetModel.from_pretrained(dirs["qwen3"])
    return target, DFlashDrafter.from_pretrained(path, target, swa_convention=convention)


def test_swa_conventions_differ_exactly_where_they_should(tmp_path, dirs):
    n = len(PROMPT)
    target, causal = _swa_drafter(tmp_path, dirs, "causal_block", 64)
    _, open_ = _swa_drafter(tmp_path, dirs, "noncausal_window", 64)
    _, ignore = _swa_drafter(tmp_path, dirs, "ignore", 64)
    feats = _features(target, PROMPT)
    a, b, c = (d.forward_block(feats, np.arange(n), 9, n) for d in (causal, open_, ignore))
    # Window 64 > every distance: the window changes nothing ...
    assert_close(b, c, SAME_MATH, op="SWA", case="window covers everything")
    # ... while causality inside the block changes every row but the last (1 layer: the last
    # row sees the same keys either way).
    assert_close(a[-1], b[-1], SAME_MATH, op="SWA", case="last row")
    assert np.abs(a[:-1] - b[:-1]).max(axis=1).min() > 1e-5
    # Window 4 < context: the sliding window now hides old context keys.
    _, small = _swa_drafter(tmp_path, dirs, "noncausal_window", 8)
    d = small.forward_block(feats, np.arange(n), 9, n)
    assert np.abs(d - c).max() > 1e-4


def test_capture_conflict_and_mismatched_target(tmp_path, dirs):
    target = TargetModel.from_pretrained(dirs["qwen3"], target_layer_ids=[1, 2])
    with pytest.raises(ConfigError, match="captures layers"):
        DFlashDrafter.from_pretrained(dirs["qwen3_drafter"], target)
    wide = write_tiny_target(tmp_path / "wide", "qwen3", hidden_size=96)
    with pytest.raises(ConfigError, match="hidden_size"):
        DFlashDrafter.from_pretrained(dirs["qwen3_drafter"], TargetModel.from_pretrained(wide))


def test_fc_width_and_missing_tensor_errors(tmp_path, dirs):
    path = write_tiny_drafter(tmp_path / "bad", dirs["qwen3"], seed=3)
    t = load_file(path / "model.safetensors")
    t["fc.weight"] = np.zeros((64, 100), np.float32)  # not a multiple of hidden 64
    save_file(t, str(path / "model.safetensors"))
    with pytest.raises(ConfigError, match="not a multiple"):
        DFlashDrafter.from_pretrained(path, TargetModel.from_pretrained(dirs["qwen3"]))
    path = write_tiny_drafter(tmp_path / "miss", dirs["qwen3"], seed=3)
    t = load_file(path / "model.safetensors")
    del t["layers.1.self_attn.k_norm.weight"]
    save_file(t, str(path / "model.safetensors"))
    with pytest.raises(FormatError, match=r"layers\.1\.self_attn\.k_norm\.weight"):
        DFlashDrafter.from_pretrained(path, TargetModel.from_pretrained(dirs["qwen3"]))


def test_formula_ids_when_config_has_none(tmp_path, dirs):
    # No explicit target_layer_ids: the authors' formula (build_target_layer_ids) for a 1-layer
    # drafter is
    # [L // 2] = [4 // 2] = [2] for the 4-layer target, and fc [64, 1 * 64] agrees.
    path = write_tiny_drafter(tmp_path / "formula", dirs["qwen3"], seed=3, num_hidden_layers=1,
                              target_layer_ids=(2,))
    cfg = json.loads((path / "config.json").read_text())
    del cfg["dflash_config"]["target_layer_ids"]
    (path / "config.json").write_text(json.dumps(cfg))
    target = TargetModel.from_pretrained(dirs["qwen3"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        drafter = DFlashDrafter.from_pretrained(path, target)
    assert list(drafter.config.target_layer_ids) == [2] == target.target_layer_ids


def test_hf_assistant_layout_loads(tmp_path, dirs):
    path = write_tiny_drafter(tmp_path / "hfa", dirs["qwen3"], seed=12, layout="hf_assistant")
    target = TargetModel.from_pretrained(dirs["qwen3"])
    drafter = DFlashDrafter.from_pretrained(path, target)
    assert drafter.config.layout == "hf_assistant"
    feats = _features(target, PROMPT[:5])
    assert drafter.forward_block(feats, np.arange(5), 3, 5).shape == (8, 256)


@pytest.mark.gpu
@pytest.mark.parametrize("fam", ["qwen3", "gemma3"])
def test_drafter_numpy_vs_cupy(dirs, fam):
    t_cpu, d_cpu = _load(dirs, fam)
    t_gpu = TargetModel.from_pretrained(dirs[fam], backend="cupy")
    d_gpu = DFlashDrafter.from_pretrained(dirs[fam + "_drafter"], t_gpu)
    feats = _features(t_cpu, PROMPT)
    n = len(PROMPT)
    a = d_cpu.forward_block(feats, np.arange(n), 9, n)
    b = d_gpu.forward_block(feats, np.arange(n), 9, n)
    assert_close(b, a, Tolerance(1e-4, 1e-4, "cuBLAS vs NumPy BLAS, 2 layers"), op="drafter",
                 case=fam)
    cache = d_gpu.new_cache()  # the cached form: block K/V staged in the device cache's rows
    for s in (7, n):
        cache.extend(feats[cache.length:s], np.arange(cache.length, s))
        assert_close(cache.forward_block(9, s), d_cpu.forward_block(feats[:s], np.arange(s), 9, s),
                     Tolerance(1e-4, 1e-4, "cuBLAS vs NumPy BLAS, 2 layers"), op="DraftCache",
                     case=f"{fam}, s={s}")
