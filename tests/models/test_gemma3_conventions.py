"""Gemma 3 conventions that the default tiny checkpoint cannot see: the attention scale from
``query_pre_attn_scalar`` (the tiny config sets it equal to head_dim) and linear RoPE scaling on
the global layers. Expected logits come from the independent float64 oracle
(tests/models/oracle.py), which reads both fields from config.json itself."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import load_file

from dflash_ref.models.assemble import FUSED_OPS
from dflash_ref.models.target import TargetModel
from dflash_ref.testing import Tolerance, assert_close
from dflash_ref.tiny import write_tiny_target
from tests.models.oracle import dense_forward

VS_ORACLE = Tolerance(1e-4, 1e-4, "float32 model vs float64 oracle through 4 layers")
# 32 tokens: the sliding layers (window 8) drop keys, the global ones see every position up to 31.
IDS = np.array([3, 17, 42, 99, 5, 250, 7, 61, 13, 128, 77, 200, 31, 8, 190, 64, 11, 2, 150, 90,
                33, 99, 180, 4, 222, 19, 71, 140, 6, 58, 231, 12])


# The target with the reference q/k norms and RoPE (``NormRope``, models/layers.py) in place of
# the fused ``qk_norm_rope`` op: both forms read the layer's RoPE spec, both are tested.
REFERENCE_NORM_ROPE = ("add_rms_norm",)


def _model_vs_oracle(path, fused=FUSED_OPS):
    config = json.loads((path / "config.json").read_text())
    tensors = load_file(path / "model.safetensors")
    model = TargetModel.from_pretrained(path, fused=fused)
    got = model.be.to_numpy(model.forward(IDS, model.new_state()).logits)
    return config, tensors, got


def test_attention_scale_is_query_pre_attn_scalar(tmp_path):
    # head_dim 16 but query_pre_attn_scalar 64: scores scale by 64^-0.5 = 1/8, not 16^-0.5 = 1/4.
    path = write_tiny_target(tmp_path / "g", "gemma3", seed=13, query_pre_attn_scalar=64)
    config, tensors, got = _model_vs_oracle(path)
    assert config["head_dim"] == 16 and config["query_pre_attn_scalar"] == 64
    _, expected = dense_forward(config, tensors, IDS)
    assert_close(got, expected, VS_ORACLE, op="TargetModel.forward", tensor="logits",
                 case="query_pre_attn_scalar 64, head_dim 16")
    # The case can tell the two scales apart: the oracle with the head_dim scale is far off.
    _, head_dim_scale = dense_forward({**config, "query_pre_attn_scalar": 16}, tensors, IDS)
    assert np.abs(head_dim_scale - expected).max() > 100 * VS_ORACLE.atol


@pytest.mark.parametrize("fused", [FUSED_OPS, REFERENCE_NORM_ROPE],
                         ids=["fused", "reference"])
def test_global_layers_apply_linear_rope_scaling(tmp_path, fused):
    # Global layers (1, 3): theta 1e6 with inv_freq / 8; sliding layers (0, 2): theta 1e4,
    # unscaled. Channel pair 0 turns 1 rad per position unscaled, 1/8 rad scaled: positions
    # 1..31 differ from the first token on.
    path = write_tiny_target(tmp_path / "g", "gemma3", seed=13,
                             rope_scaling={"rope_type": "linear", "factor": 8.0})
    config, tensors, got = _model_vs_oracle(path, fused)
    _, expected = dense_forward(config, tensors, IDS)
    assert_close(got, expected, VS_ORACLE, op="TargetModel.forward", tensor="logits",
                 case="global rope_scaling linear 8")
    # Without the factor the oracle is far off, so the comparison above can fail.
    _, unscaled = dense_forward({**config, "rope_scaling": None}, tensors, IDS)
    assert np.abs(unscaled - expected).max() > 100 * VS_ORACLE.atol
