"""TargetConfig errors and behaviour common to every family: unknown architectures and wrappers,
mismatched model_type / architectures, malformed keys, the error family, frozen dataclasses,
describe() and from_file().

Fixtures are published config.json dicts (tests/config/configs.py).
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from dflash_ref.config import (
    DrafterConfig,
    TargetConfig,
)
from dflash_ref.errors import ConfigError, DFlashRefError
from tests.config.configs import (
    FULL,
    LINEAR,
    gemma3_27b_text,
    qwen3_8b,
    qwen35_9b,
    raises,
    zlab_qwen3_8b_drafter,
)


def test_unknown_architecture_lists_supported():
    with pytest.raises(ConfigError) as exc:
        TargetConfig.from_hf({"model_type": "llama", "architectures": ["LlamaForCausalLM"]})
    msg = str(exc.value)
    assert "'llama'" in msg and "not a supported target" in msg
    assert "Qwen3" in msg and "Gemma 3" in msg and "Gemma 4" in msg


def test_unknown_multimodal_wrapper():
    with raises("multimodal model_type 'llava'"):
        TargetConfig.from_hf({"model_type": "llava", "text_config": {"model_type": "llama"}})


def test_drafter_config_given_as_target():
    with raises("DrafterConfig.from_hf"):
        TargetConfig.from_hf(zlab_qwen3_8b_drafter())


def test_model_type_and_architecture_disagree():
    raw = qwen3_8b()
    raw["architectures"] = ["Gemma3ForCausalLM"]
    with raises("model_type says qwen3 but architectures"):
        TargetConfig.from_hf(raw)


def test_not_a_dict():
    with raises("expected a dict"):
        TargetConfig.from_hf([1, 2])  # type: ignore[arg-type]


@pytest.mark.parametrize("mutate, match", [
    (lambda c: c.pop("hidden_size"), "required key 'hidden_size' is missing"),
    (lambda c: c.update(hidden_size="4096"), "hidden_size must be an integer"),
    (lambda c: c.update(num_key_value_heads=5), "not a multiple of num_key_value_heads 5"),
    (lambda c: c.update(rms_norm_eps=-1e-6), "rms_norm_eps must be > 0"),
    (lambda c: c.update(hidden_act="relu"), "hidden_act='relu' is not supported"),
    (lambda c: c.update(layer_types=[FULL] * 35), "35 entries but num_hidden_layers is 36"),
    (lambda c: c.update(layer_types=[LINEAR] * 36), "allows only"),
    (lambda c: c.update(architectures="Qwen3ForCausalLM"), "architectures must be a list"),
])
def test_bad_qwen3_configs(mutate, match):
    raw = qwen3_8b()
    mutate(raw)
    with raises(match):
        TargetConfig.from_hf(raw)


def test_config_error_is_a_dflash_ref_error_and_value_error():
    with pytest.raises(DFlashRefError):
        TargetConfig.from_hf({})
    with pytest.raises(ValueError):
        TargetConfig.from_hf({})


def test_target_config_is_frozen_and_describes_itself():
    cfg = TargetConfig.from_hf(gemma3_27b_text())
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.hidden_size = 1  # type: ignore[misc]
    text = cfg.describe()
    assert "gemma3" in text and "52 sliding_attention" in text and "73.5" in text
    assert "rope[full_attention]: theta 1e+06, linear factor 8" in text
    assert "qwen3_5" in TargetConfig.from_hf(qwen35_9b()).describe()
    assert cfg.with_weight_prefix("x.").weight_prefix == "x."


def test_from_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(qwen3_8b()))
    assert TargetConfig.from_file(tmp_path).hidden_size == 4096
    assert TargetConfig.from_file(tmp_path / "config.json").hidden_size == 4096
    with raises("does not exist"):
        TargetConfig.from_file(tmp_path / "nope")
    (tmp_path / "bad.json").write_text("{")
    with raises("not valid JSON"):
        DrafterConfig.from_file(tmp_path / "bad.json")
