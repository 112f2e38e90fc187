"""The target converter, HF checkpoint <-> llama.cpp GGUF, with llama.cpp's baked-in values.

Independent checks: tensor names are checked against ``gguf.get_tensor_name_map`` (the gguf
package's own HF -> GGUF table); llama.cpp's value transforms (+1 norms, ``-exp(A_log)``, tiled
value heads) are checked against formulas written out here, never by calling the converter's
inverse. Model round trips compare the GGUF model with the safetensors model, which is the oracle.
"""

from __future__ import annotations

import json
import warnings

import gguf
import numpy as np
import pytest
from gguf import GGUFReader

from dflash_ref.errors import ConfigError, FormatError
from dflash_ref.io.convert_drafter import convert_drafter
from dflash_ref.io.convert_target import LAYER_NAMES, convert_target
from dflash_ref.io.gguf_io import open_gguf
from dflash_ref.io.safetensors_io import load_checkpoint, write_safetensors
from dflash_ref.models.target import TargetModel
from dflash_ref.testing import Tolerance, assert_close
from dflash_ref.tiny import write_tiny_target
from tests.io.convert_helpers import rewrite

# ---------------------------------------------------------------- targets


# Target logits, GGUF vs safetensors, on IDS (24 tokens). |logit| <= ~4 (qwen), 30 (gemma, cap).
# F32 and BF16 are compared with a reference that holds the same values the GGUF stores: the
# safetensors weights, with every 2-D tensor rounded to bfloat16 for BF16 (round to nearest even,
# written out below, independent of the converter; 1-D and conv tensors stay F32 in the GGUF).
# Measured max |diff| then: F32 <= 1.5e-6, BF16 <= ~7e-6 (the +1/-1 of (1+w) norms and exp/log
# of A_log round); 1.03e-5 on one qwen3_5 BF16 logit since the stacked projections (issue 27:
# one product per q/k/v, gate/up and GDN input group, whose BLAS blocking rounds differently), so
# atol is 2e-5. Q8_0 has no exact reference: its bound is the weight error through 4 layers
# (measured 8.5e-2 on qwen3).
F32_TOL = Tolerance(1e-5, 2e-5, "F32; only the +1/-1 of (1+w) norms and exp/log of A_log round")
TARGET_TOL = {
    ("qwen3", "f32"): F32_TOL, ("gemma3", "f32"): F32_TOL, ("qwen3_5", "f32"): F32_TOL,
    ("qwen3", "bf16"): F32_TOL, ("gemma3", "bf16"): F32_TOL, ("qwen3_5", "bf16"): F32_TOL,
    ("qwen3", "q8_0"): Tolerance(0.0, 2.5e-1, "Q8_0 weights (step amax/127) through 4 layers"),
}
IDS = np.array([3, 17, 42, 99, 5, 250, 7, 61, 13, 128, 77, 200, 31, 8, 190, 64, 11, 2, 150, 33,
                99, 180, 4, 222])


@pytest.mark.parametrize("family, qtype", list(TARGET_TOL))
def test_target_round_trip(tiny, tmp_path, family, qtype):
    path = convert_target(tiny[family], tmp_path / "t.gguf", qtype)
    ref = TargetModel.from_pretrained(tiny[family], target_layer_ids=[0, 2])
    if qtype == "bf16":  # the reference holds exactly the values the BF16 GGUF stores
        w = {k: _bf16_round(v) if v.ndim == 2 else v
             for k, v in load_checkpoint(tiny[family]).items()}
        ref = TargetModel(ref.config, w, target_layer_ids=[0, 2])
    got = TargetModel.from_gguf(path, target_layer_ids=[0, 2])
    assert got.config.family == family
    assert got.config.layer_types == ref.config.layer_types
    assert got.config.attention_scale == ref.config.attention_scale
    assert got.config.embedding_scale == ref.config.embedding_scale
    assert got.config.final_logit_softcapping == ref.config.final_logit_softcapping
    assert got.config.rope_by_type == ref.config.rope_by_type
    assert got.config.gdn == ref.config.gdn
    a = ref.forward(IDS, ref.new_state())
    b = got.forward(IDS, got.new_state())
    tol = TARGET_TOL[family, qtype]
    assert_close(b.logits, a.logits, tol, op="TargetModel.from_gguf", tensor="logits",
                 case=f"{family} {qtype}")
    if qtype != "q8_0":
        assert_close(b.features, a.features, tol, op="from_gguf", tensor="features", case=family)
    top = np.sort(a.logits, axis=1)
    sure = top[:, -1] - top[:, -2] > 2 * tol.atol  # rows whose argmax cannot move
    assert sure.sum() >= 8  # so the token comparison below compares real rows
    np.testing.assert_array_equal(b.logits.argmax(1)[sure], a.logits.argmax(1)[sure])


def _bf16_round(w: np.ndarray) -> np.ndarray:
    """float32 -> nearest bfloat16 (ties to even) -> float32, by bit arithmetic."""
    bits = np.ascontiguousarray(w, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


def _raw(path) -> dict[str, np.ndarray]:
    return {t.name: np.asarray(t.data) for t in GGUFReader(path).tensors}


def test_target_values_as_llama_cpp_stores_them(tiny, tmp_path):
    # (1+w) norms get +1 baked in (Gemma 3, Qwen3.5), except the GDN gated norm; Qwen3 norms
    # are plain; q/k projections are stored unpermuted (NEOX RoPE).
    for family in ("qwen3", "gemma3", "qwen3_5"):
        raw = _raw(convert_target(tiny[family], tmp_path / f"{family}.gguf"))
        w = load_checkpoint(tiny[family])
        shift = 0.0 if family == "qwen3" else 1.0
        np.testing.assert_array_equal(raw["blk.3.attn_norm.weight"],
                                      w["model.layers.3.input_layernorm.weight"] + shift)
        np.testing.assert_array_equal(raw["blk.3.attn_q_norm.weight"],
                                      w["model.layers.3.self_attn.q_norm.weight"] + shift)
        np.testing.assert_array_equal(raw["output_norm.weight"], w["model.norm.weight"] + shift)
        np.testing.assert_array_equal(raw["blk.3.attn_q.weight"],
                                      w["model.layers.3.self_attn.q_proj.weight"])
        assert ("output.weight" in raw) == (family != "gemma3")  # gemma3 ties its lm_head
    np.testing.assert_array_equal(raw["blk.0.ssm_norm.weight"],
                                  w["model.layers.0.linear_attn.norm.weight"])  # no +1


def test_gdn_tensors_tiled_value_heads(tiny, tmp_path):
    # Tiny qwen3_5: H = 2 key heads, HV = 4 value heads (r = 2), dk = dv = 16, conv 4.
    path = convert_target(tiny["qwen3_5"], tmp_path / "q.gguf")
    raw, w = _raw(path), load_checkpoint(tiny["qwen3_5"])
    L = "model.layers.0.linear_attn."
    H, r, dv, dk = 2, 2, 16, 16

    def tiled(x, width, axis=0):  # GGUF block j*H + k holds HF block k*r + j (written out)
        x = np.moveaxis(x, axis, 0)
        out = np.empty_like(x)
        for k in range(H):
            for j in range(r):
                out[(j * H + k) * width:(j * H + k + 1) * width] = \
                    x[(k * r + j) * width:(k * r + j + 1) * width]
        return np.moveaxis(out, 0, axis)

    np.testing.assert_array_equal(raw["blk.0.attn_gate.weight"], tiled(w[L + "in_proj_z.weight"],
                                                                       dv))
    qkv = w[L + "in_proj_qkv.weight"]
    np.testing.assert_array_equal(raw["blk.0.attn_qkv.weight"],
                                  np.concatenate([qkv[:2 * H * dk], tiled(qkv[2 * H * dk:], dv)]))
    np.testing.assert_array_equal(raw["blk.0.ssm_beta.weight"], tiled(w[L + "in_proj_b.weight"],
                                                                      1))
    np.testing.assert_array_equal(raw["blk.0.ssm_out.weight"],
                                  tiled(w[L + "out_proj.weight"], dv, axis=1))
    np.testing.assert_array_equal(raw["blk.0.ssm_dt.bias"], tiled(w[L + "dt_bias"], 1))
    np.testing.assert_allclose(raw["blk.0.ssm_a"], -np.exp(tiled(w[L + "A_log"], 1)), rtol=1e-7)
    conv = w[L + "conv1d.weight"][:, 0, :]  # [conv_dim, 1, 4] -> [conv_dim, 4]
    np.testing.assert_array_equal(raw["blk.0.ssm_conv1d.weight"],
                                  np.concatenate([conv[:2 * H * dk], tiled(conv[2 * H * dk:],
                                                                           dv)]))
    info = {t.name: t for t in GGUFReader(path).tensors}
    assert info["blk.0.ssm_conv1d.weight"].shape.tolist() == [4, 2 * H * dk + H * r * dv]
    assert info["blk.0.ssm_conv1d.weight"].tensor_type.name == "F32"
    g = open_gguf(path)
    assert (g.get("ssm.group_count"), g.get("ssm.time_step_rank"), g.get("ssm.state_size"),
            g.get("ssm.inner_size"), g.get("ssm.conv_kernel")) == (2, 4, 16, 64, 4)
    assert g.get("full_attention_interval") == 4
    assert g.get("rope.dimension_count") == 8  # head_dim 32 x partial rotary 0.25
    assert g.get("rope.dimension_sections") == [2, 1, 1, 0]


@pytest.mark.parametrize("family", ["qwen3", "gemma3", "qwen3_5"])
def test_target_names_match_gguf_tensor_map(tiny, family, tmp_path):
    # The gguf package's own HF -> GGUF table is the oracle for our explicit one.
    arch = {"qwen3": gguf.MODEL_ARCH.QWEN3, "gemma3": gguf.MODEL_ARCH.GEMMA3,
            "qwen3_5": gguf.MODEL_ARCH.QWEN35}[family]
    tmap = gguf.get_tensor_name_map(arch, 4)
    for hf_suffix, ours in LAYER_NAMES[family].items():
        hf = "model.layers.2." + hf_suffix.replace("dt_bias", "dt_proj.bias")
        assert tmap.get_name(hf, try_suffixes=(".weight", ".bias")) == "blk.2." + ours, hf_suffix
    path = convert_target(tiny[family], tmp_path / "t.gguf")
    assert GGUFReader(path).fields["general.architecture"].contents() == \
        gguf.MODEL_ARCH_NAMES[arch]


def test_target_errors(tiny, tmp_path):
    path = convert_target(tiny["qwen3"], tmp_path / "t.gguf")
    norope = rewrite(path, tmp_path / "r.gguf", drop_keys=("qwen3.rope.freq_base",))
    with pytest.raises(FormatError, match="no key 'qwen3.rope.freq_base'"):
        TargetModel.from_gguf(norope)
    drafter = convert_drafter(tiny["drafter"], tmp_path / "d.gguf", "f32")
    with pytest.raises(FormatError, match="arch 'dflash' is not a target arch"):
        TargetModel.from_gguf(drafter)
    swa = write_tiny_target(tmp_path / "swa", "qwen3", use_sliding_window=True, sliding_window=8,
                            max_window_layers=2)
    with pytest.raises(ConfigError, match="sliding-window layers"):
        convert_target(swa, tmp_path / "x.gguf")
    w = load_checkpoint(tiny["qwen3"])
    cfg = json.loads((tiny["qwen3"] / "config.json").read_text())
    extra = write_safetensors(tmp_path / "mtp", dict(w, **{"mtp.fc.weight": w["lm_head.weight"]}),
                              config=cfg)
    with pytest.warns(UserWarning, match=r"1 tensor\(s\) outside the qwen3 text model"):
        convert_target(extra, tmp_path / "mtp.gguf")
    g35 = convert_target(tiny["qwen3_5"], tmp_path / "q.gguf")
    raw_a = rewrite(g35, tmp_path / "a.gguf",
                    tensors={"blk.0.ssm_a": np.ones(4, dtype=np.float32)})
    with pytest.raises(FormatError, match=r"ssm_a must be -exp\(A_log\)"):
        TargetModel.from_gguf(raw_a)


def test_gemma3_defaults_without_our_extra_keys(tiny, tmp_path):
    # A llama.cpp gemma3 file has no sliding pattern, local base or attention scale keys:
    # llama.cpp's rule applies (every 6th layer global, base 10000, scale head_dim^-0.5).
    path = convert_target(tiny["gemma3"], tmp_path / "g.gguf")
    plain = rewrite(path, tmp_path / "plain.gguf", drop_keys=(
        "gemma3.attention.sliding_window_pattern", "gemma3.rope.freq_base_swa",
        "gemma3.attention.scale", "gemma3.embedding_scale"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = TargetModel.from_gguf(plain).config
    assert cfg.layer_types == ("sliding_attention",) * 4  # (i + 1) % 6 != 0 for i < 4
    assert cfg.rope_by_type["sliding_attention"].theta == 10000.0
    assert cfg.attention_scale == 16 ** -0.5
    # the embedding scale is llama.cpp's float32 sqrtf(n_embd) (issue 14; sqrt(64) = 8 either
    # way; tests/io/test_gguf_defaults.py has a hidden size where the roundings differ)
    assert cfg.embedding_scale == 8.0 and any("sqrtf(n_embd)" in d for d in cfg.defaults_used)
