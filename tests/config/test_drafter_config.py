"""DrafterConfig: both layouts (z-lab, transformers assistant), key aliases, the sliding-window
conventions and causality, and validate_against() with a target and an fc weight shape.

Fixtures are published config.json dicts (tests/config/configs.py); expected values are
hand-computed from those numbers (docs/config.md, "DrafterConfig"), never produced by
dflash_ref.config itself.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings

import pytest

from dflash_ref.config import (
    DrafterConfig,
    TargetConfig,
)
from tests.config.configs import (
    FULL,
    SLIDING,
    gemma4_31b,
    hf_assistant_drafter,
    qwen3_4b,
    qwen3_8b,
    raises,
    zlab_gemma4_31b_drafter,
    zlab_qwen3_8b_drafter,
    zlab_swa_drafter,
)


def test_zlab_qwen3_8b_drafter():
    d = DrafterConfig.from_hf(zlab_qwen3_8b_drafter())
    assert d.layout == "zlab" and d.fc_name == "fc.weight"
    assert d.hidden_norm_name == "hidden_norm.weight"
    assert d.target_layer_ids == (1, 9, 17, 25, 33) and d.target_layer_ids_source == "config"
    assert d.n_capture == 5 and d.block_size == 16 and d.mask_token_id == 151669
    assert (d.hidden_size, d.num_hidden_layers, d.intermediate_size) == (4096, 5, 12288)
    assert (d.num_attention_heads, d.num_key_value_heads, d.head_dim) == (32, 8, 128)
    assert d.rms_norm_eps == 1e-6 and d.vocab_size == 151936 and not d.attention_bias
    assert d.rope_theta == 1e6 and d.layer_types == (FULL,) * 5
    assert not any(d.is_causal_for(i) for i in range(5))
    assert d.visibility(0).max_back is None and d.visibility(0).max_ahead is None
    assert d.causal_override is None and d.input_embedding_scale is None


def test_zlab_drafter_default_ids_from_formula():
    raw = zlab_qwen3_8b_drafter()
    del raw["dflash_config"]["target_layer_ids"]
    d = DrafterConfig.from_hf(raw)
    assert d.target_layer_ids == (1, 9, 17, 25, 33) and d.target_layer_ids_source == "formula"


def test_zlab_drafter_keys_at_top_level():
    raw = zlab_qwen3_8b_drafter()
    raw.update(raw.pop("dflash_config"))
    d = DrafterConfig.from_hf(raw)
    assert d.layout == "zlab" and d.mask_token_id == 151669


def test_drafter_key_in_two_places_must_agree():
    raw = zlab_qwen3_8b_drafter()
    raw["dflash_config"]["block_size"] = 8
    with raises("dflash_config.block_size=8 but block_size=16"):
        DrafterConfig.from_hf(raw)
    raw["dflash_config"]["block_size"] = 16
    assert DrafterConfig.from_hf(raw).block_size == 16


def test_swa_drafter_nested_theta_and_causal_block_default():
    d = DrafterConfig.from_hf(zlab_swa_drafter())
    assert d.rope_theta == 1e7  # nested wins over the stale top-level 1e6
    assert d.swa_convention == "causal_block" and d.sliding_window == 2048
    assert [d.is_causal_for(i) for i in range(6)] == [True] * 5 + [False]
    v = d.visibility(0)
    assert (v.max_back, v.max_ahead) == (2047, 0)
    q = 5000
    assert v.visible(q, q) and v.visible(q, q - 2047) and not v.visible(q, q - 2048)
    assert not v.visible(q, q + 1)  # later noise positions are hidden in a causal block
    full = d.visibility(5)
    assert full.visible(q, 0) and full.visible(q, q + 15)


@pytest.mark.parametrize("conv, back, ahead", [
    ("noncausal_window", 2047, 2047),
    ("bidirectional", 2048, 2048),
    ("ignore", None, None),
])
def test_swa_conventions(conv, back, ahead):
    d = DrafterConfig.from_hf(zlab_swa_drafter(), swa_convention=conv)
    v = d.visibility(0)
    assert (v.max_back, v.max_ahead) == (back, ahead)
    assert not d.is_causal_for(0)


def test_bidirectional_window_is_inclusive():
    v = DrafterConfig.from_hf(zlab_swa_drafter(), swa_convention="bidirectional").visibility(0)
    q = 5000
    # |q - k| <= W on both sides (masking_utils sliding_window_bidirectional_overlay).
    assert v.visible(q, q - 2048) and not v.visible(q, q - 2049)
    assert v.visible(q, q + 2048) and not v.visible(q, q + 2049)


def test_causal_overrides():
    raw = zlab_swa_drafter()
    raw["is_causal"] = True
    d = DrafterConfig.from_hf(raw)
    assert d.causal_override is True and d.is_causal_for(5)
    assert (d.visibility(5).max_back, d.visibility(5).max_ahead) == (None, 0)
    raw = zlab_swa_drafter()
    raw["dflash_config"]["causal"] = False
    d = DrafterConfig.from_hf(raw)
    assert not d.is_causal_for(0)
    assert (d.visibility(0).max_back, d.visibility(0).max_ahead) == (2047, 2047)
    raw["is_causal"] = True
    with raises("dflash_config.causal=False but is_causal=True"):
        DrafterConfig.from_hf(raw)


def test_mimo_style_use_swa_without_layer_types():
    raw = zlab_qwen3_8b_drafter()
    del raw["layer_types"]
    raw["dflash_config"].update(use_swa=True, swa_window_size=1024, attention_sink_bias=True)
    d = DrafterConfig.from_hf(raw)
    assert d.layer_types == (SLIDING,) * 5 and d.sliding_window == 1024
    assert d.attention_sink_bias


def test_hf_assistant_drafter():
    d = DrafterConfig.from_hf(hf_assistant_drafter())
    assert d.layout == "hf_assistant" and d.swa_convention == "bidirectional"
    assert d.fc_name == "encoder.fc.weight"
    assert d.hidden_norm_name == "encoder.output_norm_enc.weight"
    assert d.vocab_size is None and d.rope_theta == 5e5 and d.rms_norm_eps == 1e-5
    assert d.target_layer_ids == (1, 13, 25, 37, 49) and d.block_size == 16
    assert (d.visibility(0).max_back, d.visibility(0).max_ahead) == (2048, 2048)


def test_hf_assistant_defaults_all_sliding_window_2048():
    raw = hf_assistant_drafter()
    del raw["layer_types"], raw["sliding_window"]
    d = DrafterConfig.from_hf(raw)
    assert d.layer_types == (SLIDING,) * 5 and d.sliding_window == 2048
    assert "sliding_window=2048 (assistant default)" in d.defaults_used
    assert "sliding window 2048, convention bidirectional" in d.describe()


def test_use_sliding_window_false_with_sliding_layers_warns():
    raw = zlab_swa_drafter()
    raw["use_sliding_window"] = False
    with pytest.warns(UserWarning, match="swa_convention='ignore'"):
        DrafterConfig.from_hf(raw)


@pytest.mark.parametrize("mutate, match", [
    (lambda c: c.pop("rope_theta"), "no RoPE base"),
    (lambda c: c["dflash_config"].pop("mask_token_id"), "mask_token_id is missing"),
    (lambda c: c.pop("block_size"), "block_size is missing"),
    (lambda c: (c["dflash_config"].pop("target_layer_ids"), c.pop("num_target_layers")),
     "no target_layer_ids and no num_target_layers"),
    (lambda c: c["dflash_config"].update(target_layer_ids=[1, 9, 9]), "distinct non-negative"),
    (lambda c: c["dflash_config"].update(target_layer_ids=[1, 40]), "num_target_layers is 36"),
    (lambda c: c.update(layer_types=[SLIDING] * 5), "no window size"),
    (lambda c: c.update(hidden_act="gelu"), "hidden_act='gelu' is not supported"),
    (lambda c: c.update(mask_token_id=151669, vocab_size=1000), "outside vocab_size 1000"),
    (lambda c: c.update(architectures=["DFlash2DraftModel"]), "DFlash2DraftModel"),
    (lambda c: c.update(architectures=["Qwen3ForCausalLM"]), "TargetConfig.from_hf"),
])
def test_bad_drafter_configs(mutate, match):
    raw = zlab_qwen3_8b_drafter()
    mutate(raw)
    with raises(match):
        DrafterConfig.from_hf(raw)


def test_drafter_layout_must_be_detectable_or_given():
    raw = zlab_qwen3_8b_drafter()
    del raw["auto_map"], raw["architectures"]
    raw.update(raw.pop("dflash_config"))
    with raises("Pass layout='zlab'"):
        DrafterConfig.from_hf(raw)
    assert DrafterConfig.from_hf(raw, layout="zlab").layout == "zlab"
    with raises("unknown"):
        DrafterConfig.from_hf(raw, layout="eagle")
    with raises("swa_convention 'causal' is unknown"):
        DrafterConfig.from_hf(zlab_swa_drafter(), swa_convention="causal")


# ---------------------------------------------------------------------------------- validate


def test_validate_matching_pair_returns_self():
    d = DrafterConfig.from_hf(zlab_qwen3_8b_drafter())
    t = TargetConfig.from_hf(qwen3_8b())
    assert d.validate_against(t) is d
    assert d.validate_against(t, fc_shape=(4096, 20480)) is d  # [H, 5 * H]
    assert d.noise_embedding_scale(t) == 1.0


def test_validate_hidden_and_vocab_mismatch():
    d = DrafterConfig.from_hf(zlab_qwen3_8b_drafter())
    with raises("drafter hidden_size 4096 != target hidden_size 2560"):
        d.validate_against(TargetConfig.from_hf(qwen3_4b()))
    raw = qwen3_8b()
    raw["vocab_size"] = 152064
    with raises("drafter vocab_size 151936 != target vocab_size 152064"):
        d.validate_against(TargetConfig.from_hf(raw))


def test_validate_ids_must_fit_the_target():
    raw = zlab_qwen3_8b_drafter()
    raw["dflash_config"]["target_layer_ids"] = [1, 16, 31, 46, 61]  # a 64-layer target's ids
    raw["num_target_layers"] = 64
    with pytest.warns(UserWarning, match="64-layer target"):
        with raises(r"include \[46, 61\], beyond the target's layers 0..35"):
            DrafterConfig.from_hf(raw).validate_against(TargetConfig.from_hf(qwen3_8b()))


def test_validate_last_layer_is_refused():
    raw = zlab_qwen3_8b_drafter()
    raw["dflash_config"]["target_layer_ids"] = [2, 10, 18, 26, 35]
    with raises("last layer 35.*final-normed"):
        DrafterConfig.from_hf(raw).validate_against(TargetConfig.from_hf(qwen3_8b()))


def test_validate_formula_drafter_for_another_depth_is_an_error():
    raw = zlab_qwen3_8b_drafter()
    del raw["dflash_config"]["target_layer_ids"]
    raw["num_target_layers"] = 64
    with raises("64-layer target .* default target_layer_ids depend on it"):
        DrafterConfig.from_hf(raw).validate_against(TargetConfig.from_hf(qwen3_8b()))


def test_validate_mask_outside_target_vocab():
    raw = zlab_qwen3_8b_drafter()
    del raw["vocab_size"]
    raw["dflash_config"]["mask_token_id"] = 151936
    with raises("mask_token_id 151936 is outside the target vocabulary"):
        DrafterConfig.from_hf(raw).validate_against(TargetConfig.from_hf(qwen3_8b()))


def test_validate_fc_shapes():
    d = DrafterConfig.from_hf(zlab_qwen3_8b_drafter())
    t = TargetConfig.from_hf(qwen3_8b())
    with raises("input width 20481 is not a multiple of hidden_size 4096"):
        d.validate_against(t, fc_shape=(4096, 20481))
    with raises("is it transposed"):
        d.validate_against(t, fc_shape=(20480, 4096))
    with raises("implies 6 captured layers but target_layer_ids lists 5"):
        d.validate_against(t, fc_shape=(4096, 6 * 4096))
    with raises("two positive ints"):
        d.validate_against(t, fc_shape=(4096,))


def test_validate_fc_wins_over_formula_with_warning():
    raw = zlab_qwen3_8b_drafter()
    del raw["dflash_config"]["target_layer_ids"]
    d = DrafterConfig.from_hf(raw)
    t = TargetConfig.from_hf(qwen3_8b())
    with pytest.warns(UserWarning, match="implies 6 captured layers"):
        fixed = d.validate_against(t, fc_shape=(4096, 6 * 4096))
    # (36, 6): step 32/5 = 6.4 -> 1, 7.4, 13.8, 20.2, 26.6, 33 -> [1, 7, 14, 20, 27, 33].
    assert fixed.target_layer_ids == (1, 7, 14, 20, 27, 33)
    assert fixed.target_layer_ids_source == "fc_shape" and fixed.n_capture == 6
    assert d.target_layer_ids == (1, 9, 17, 25, 33)  # the original is untouched


def test_gemma4_drafter_against_gemma4_target():
    d = DrafterConfig.from_hf(zlab_gemma4_31b_drafter())
    t = TargetConfig.from_hf(gemma4_31b())
    assert d.n_capture == 6 and d.num_hidden_layers == 5
    assert d.rope_theta == 1e6  # genuine 1e6 for Gemma 4 drafters
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert d.validate_against(t, fc_shape=(5376, 6 * 5376)) is d
    assert d.noise_embedding_scale(t) == 73.5
    raw = zlab_gemma4_31b_drafter()
    raw["dflash_config"]["input_embedding_scale"] = 2.0
    assert DrafterConfig.from_hf(raw).noise_embedding_scale(t) == 2.0


def test_hf_assistant_without_vocab_validates_against_target_vocab():
    d = DrafterConfig.from_hf(hf_assistant_drafter())
    target = copy.deepcopy(qwen3_8b())
    target.update(hidden_size=6656, num_hidden_layers=52, vocab_size=202048,
                  num_attention_heads=52, num_key_value_heads=4)
    t = TargetConfig.from_hf(target)
    assert d.validate_against(t) is d
    target["vocab_size"] = 200000  # mask 201818 no longer fits
    with raises("outside the target vocabulary"):
        d.validate_against(TargetConfig.from_hf(target))


def test_drafter_describe_and_frozen():
    d = DrafterConfig.from_hf(zlab_swa_drafter())
    text = d.describe()
    assert "zlab layout" in text and "[1, 10, 20, 29, 37]" in text and "causal_block" in text
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.block_size = 8  # type: ignore[misc]
    with pytest.raises(IndexError):
        d.is_causal_for(6)


def test_query_heads_must_be_a_multiple_of_kv_heads():
    # the same check as the target's (config/fields.py head_counts): 32 query heads cannot share 5
    raw = zlab_qwen3_8b_drafter()
    raw["num_key_value_heads"] = 5
    with raises("drafter config.json: num_attention_heads 32 is not a multiple of "
                "num_key_value_heads 5"):
        DrafterConfig.from_hf(raw)
