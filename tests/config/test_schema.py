"""Tensor schemas (:mod:`dflash_ref.config.schema`): the tensor names and PyTorch [out, in] shapes a
config implies, for the GDN mixer, a hybrid target and a z-lab drafter.

Expected shapes are counted by hand from the sizes written in each test (key_dim = H dk,
value_dim = HV dv, conv_dim = 2 key_dim + value_dim), never produced by the code under test.
"""

from __future__ import annotations

import dataclasses

import pytest

from dflash_ref.config import (
    DrafterConfig,
    GDNDims,
    TargetConfig,
    drafter_expected_tensors,
    expected_tensors,
    gdn_expected_tensors,
)
from dflash_ref.models.gdn_layer import GDNConfig
from tests.config.configs import qwen35_9b, zlab_qwen3_8b_drafter

# Awkward sizes: H = 2 key heads x dk = 3, HV = 4 value heads x dv = 5, conv K = 4, hidden 7.
# key_dim = 6, value_dim = 20, conv_dim = 2 * 6 + 20 = 32.
DIMS = GDNDims(num_key_heads=2, num_value_heads=4, key_head_dim=3, value_head_dim=5,
               conv_kernel_dim=4, projection_layout="qkv_z_b_a")
COMMON = {"conv1d.weight": (32, 1, 4), "dt_bias": (4,), "A_log": (4,), "norm.weight": (5,),
          "out_proj.weight": (7, 20)}
SEPARATE = {"in_proj_qkv.weight": (32, 7), "in_proj_z.weight": (20, 7),
            "in_proj_b.weight": (4, 7), "in_proj_a.weight": (4, 7), **COMMON}
GROUPED = {"in_proj_qkvz.weight": (2 * 6 + 2 * 20, 7), "in_proj_ba.weight": (2 * 4, 7), **COMMON}


def test_gdn_schema_hand_counted_both_layouts():
    assert gdn_expected_tensors(DIMS, 7) == SEPARATE
    grouped = dataclasses.replace(DIMS, projection_layout="qkvz_ba_grouped")
    assert gdn_expected_tensors(grouped, 7) == GROUPED


@pytest.mark.parametrize("layout, expected", [("qwen3_5", SEPARATE), ("qwen3_next", GROUPED)])
def test_gdn_layer_config_reports_the_same_schema(layout, expected):
    cfg = GDNConfig(hidden_size=7, num_k_heads=2, num_v_heads=4, head_k_dim=3, head_v_dim=5,
                    conv_kernel=4, layout=layout)
    assert cfg.expected_shapes() == expected


def test_hybrid_target_schema():
    # Qwen3.5-9B: hidden 4096, 32 layers (every 4th full attention), 16 q / 4 kv heads x 256 with
    # the output gate (q rows doubled), GDN 16 k-heads x 128, 32 v-heads x 128, conv 4, ffn 12288.
    t = expected_tensors(TargetConfig.from_hf(qwen35_9b()))
    p = "model.language_model."
    assert t[p + "embed_tokens.weight"] == (248320, 4096)
    assert t["lm_head.weight"] == (248320, 4096)
    assert t[p + "layers.3.self_attn.q_proj.weight"] == (2 * 16 * 256, 4096)
    assert t[p + "layers.3.self_attn.k_proj.weight"] == (4 * 256, 4096)
    assert t[p + "layers.3.self_attn.q_norm.weight"] == (256,)
    assert t[p + "layers.0.linear_attn.in_proj_qkv.weight"] == (2 * 2048 + 4096, 4096)
    assert t[p + "layers.0.linear_attn.conv1d.weight"] == (8192, 1, 4)
    assert t[p + "layers.0.linear_attn.out_proj.weight"] == (4096, 4096)
    assert t[p + "layers.31.mlp.down_proj.weight"] == (4096, 12288)
    assert p + "layers.0.self_attn.q_proj.weight" not in t
    # 3 global (embed, norm, lm_head); per layer 2 norms + 3 MLP; 8 attention layers x 6;
    # 24 GDN layers x 9.
    assert len(t) == 3 + 32 * 5 + 8 * 6 + 24 * 9


def test_drafter_schema():
    # z-lab Qwen3-8B drafter: hidden 4096, 5 layers, 32 q / 8 kv heads x 128, ffn 12288, 5 captures.
    t = drafter_expected_tensors(DrafterConfig.from_hf(zlab_qwen3_8b_drafter()))
    assert len(t) == 3 + 11 * 5
    assert t["fc.weight"] == (4096, 5 * 4096)
    assert t["hidden_norm.weight"] == t["norm.weight"] == (4096,)
    assert t["layers.4.self_attn.q_proj.weight"] == (32 * 128, 4096)
    assert t["layers.4.self_attn.k_proj.weight"] == (8 * 128, 4096)
    assert t["layers.4.self_attn.o_proj.weight"] == (4096, 32 * 128)
    assert t["layers.0.mlp.down_proj.weight"] == (4096, 12288)
