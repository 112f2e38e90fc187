"""compare_weights and the DFlash name maps: clean conversions pass, planted bugs are flagged.

A tiny drafter (docs/formats.md names, H = 256 so Q4_K rows fit) is written as a BF16
checkpoint, converted by hand (name map + write_gguf) the way the future converter will, and then
broken on purpose: a transposed square matrix, a "+1" norm shift (drafter norms are stored raw), a
dropped tensor, an extra tensor, a transposed non-square matrix.
"""

from __future__ import annotations

import numpy as np
import pytest

from dflash_ref.io.compare import REL_RMS_BUDGET, compare_weights
from dflash_ref.io.gguf_io import write_gguf
from dflash_ref.io.names import FLAVOURS, flavour_of_arch, gguf_to_hf, hf_to_gguf
from dflash_ref.io.safetensors_io import load_checkpoint, write_safetensors

H, HKV, F, C, LAYERS = 256, 64, 512, 3, 2
LAYER_SHAPES = {
    "input_layernorm": (H,), "post_attention_layernorm": (H,),
    "self_attn.q_proj": (H, H), "self_attn.k_proj": (HKV, H), "self_attn.v_proj": (HKV, H),
    "self_attn.o_proj": (H, H), "self_attn.q_norm": (32,), "self_attn.k_norm": (32,),
    "mlp.gate_proj": (F, H), "mlp.up_proj": (F, H), "mlp.down_proj": (H, F),
}


def hf_names(n_layers: int) -> list[str]:
    names = ["fc.weight", "hidden_norm.weight", "norm.weight"]
    return names + [f"layers.{i}.{k}.weight" for i in range(n_layers) for k in LAYER_SHAPES]


def tiny_drafter(rng) -> dict[str, np.ndarray]:
    t = {"fc.weight": rng.standard_normal((H, C * H)) * 0.02,
         "hidden_norm.weight": 1 + 0.1 * rng.standard_normal(H),
         "norm.weight": 1 + 0.1 * rng.standard_normal(H)}
    for i in range(LAYERS):
        for k, shape in LAYER_SHAPES.items():
            scale = 0.1 if len(shape) == 1 else 0.02
            t[f"layers.{i}.{k}.weight"] = (len(shape) == 1) + scale * rng.standard_normal(shape)
    return {k: v.astype(np.float32) for k, v in t.items()}


@pytest.fixture
def checkpoint(tmp_path, rng):
    write_safetensors(tmp_path / "hf", tiny_drafter(rng), dtype="bfloat16")
    return tmp_path / "hf"


def convert_by_hand(checkpoint, path, arch, flavour, matrix_type="Q8_0", edit=None):
    """HF -> GGUF the simple way: rename, norms F32, matrices matrix_type."""
    t = {hf_to_gguf(k, flavour): v for k, v in load_checkpoint(checkpoint).items()}
    if edit:
        edit(t)
    types = {k: (matrix_type if v.ndim == 2 else "F32") for k, v in t.items()}
    return write_gguf(path, arch, t, types=types)


# ---------------------------------------------------------------- names


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_name_maps_are_one_to_one_and_invert(flavour):
    names = hf_names(5)
    assert len(names) == 58  # docs/formats.md drafter names: 3 + 11 * layers
    gguf_names = [hf_to_gguf(n, flavour) for n in names]
    assert len(set(gguf_names)) == 58
    same = {n for g, n in zip(gguf_names, names) if g == n}
    assert same == ({"fc.weight"} if flavour == "dflash" else set())  # llama.cpp keeps fc.weight
    assert [gguf_to_hf(g, flavour) for g in gguf_names] == names
    assert gguf_to_hf("token_embd.weight", flavour) == "token_embd.weight"  # not a drafter name


def test_name_maps_hand_values():
    assert hf_to_gguf("hidden_norm.weight", "dflash") == "enc.output_norm.weight"
    assert hf_to_gguf("hidden_norm.weight", "lucebox") == "dflash.hidden_norm.weight"
    assert hf_to_gguf("fc.weight", "lucebox") == "dflash.fc.weight"
    assert hf_to_gguf("norm.weight", "dflash") == "output_norm.weight"
    assert hf_to_gguf("layers.3.post_attention_layernorm.weight", "dflash") == \
        "blk.3.ffn_norm.weight"
    assert gguf_to_hf("blk.12.attn_output.weight", "lucebox") == "layers.12.self_attn.o_proj.weight"
    assert gguf_to_hf("blk.0.attn_q.bias", "dflash") == "layers.0.self_attn.q_proj.bias"
    assert flavour_of_arch("dflash") == "dflash"
    assert flavour_of_arch("qwen35-dflash-draft") == flavour_of_arch("gemma4-dflash-draft") == \
        "lucebox"
    assert flavour_of_arch("llama") is None


# ---------------------------------------------------------------- clean conversions


@pytest.mark.parametrize("arch, flavour, typ", [
    ("qwen35-dflash-draft", "lucebox", "Q8_0"), ("dflash", "dflash", "Q4_K"),
    ("dflash", "dflash", "BF16"),
])
def test_clean_conversion_is_all_ok(tmp_path, checkpoint, capsys, arch, flavour, typ):
    gguf_path = convert_by_hand(checkpoint, tmp_path / "d.gguf", arch, flavour, typ)
    rows = compare_weights(checkpoint, gguf_path)
    assert len(rows) == 3 + 11 * LAYERS and all(r.status == "ok" for r in rows)
    for r in rows:
        if r.type_b == "F32" or typ == "BF16":  # bf16 source values are exact in F32 and BF16
            assert r.rel_rms == 0.0 and r.max_abs == 0.0, r
        else:
            assert 0 < r.rel_rms < REL_RMS_BUDGET[typ] / 2, r
    out = capsys.readouterr().out
    assert f"{len(rows)} compared" in out and "<<" not in out


def test_two_ggufs_of_different_namings_compare_clean(tmp_path, checkpoint):
    a = convert_by_hand(checkpoint, tmp_path / "a.gguf", "dflash", "dflash", "F32")
    b = convert_by_hand(checkpoint, tmp_path / "b.gguf", "qwen35-dflash-draft", "lucebox", "F32")
    rows = compare_weights(a, b, show=False)
    assert all(r.status == "ok" and r.rel_rms == 0.0 for r in rows)


# ---------------------------------------------------------------- planted bugs


def plant_bugs(t):
    t["blk.1.attn_q.weight"] = t["blk.1.attn_q.weight"].T.copy()  # square: shapes still agree
    t["output_norm.weight"] = t["output_norm.weight"] + 1  # a "+1" norm shift
    del t["blk.0.attn_k.weight"]
    t["fc.scale"] = np.ones(4, np.float32)  # upstream optional tensor, no HF twin
    t["blk.0.ffn_down.weight"] = t["blk.0.ffn_down.weight"].T.copy()  # [H, F] -> [F, H]


def test_planted_bugs_are_flagged(tmp_path, checkpoint, capsys):
    gguf_path = convert_by_hand(checkpoint, tmp_path / "bad.gguf", "dflash", "dflash", "Q8_0",
                                edit=plant_bugs)
    rows = {r.name: r for r in compare_weights(checkpoint, gguf_path)}
    assert rows["layers.1.self_attn.q_proj.weight"].status == "outlier"
    assert rows["layers.1.self_attn.q_proj.weight"].rel_rms > 1.0
    assert rows["norm.weight"].status == "outlier"
    assert rows["layers.0.self_attn.k_proj.weight"].status == "only in a"
    assert rows["fc.scale"].status == "only in b" and rows["fc.scale"].name_b == "fc.scale"
    down = rows["layers.0.mlp.down_proj.weight"]
    assert down.status == "shape mismatch" and "transposed" in down.note
    assert down.shape == (H, F) and down.shape_b == (F, H)
    flagged = {n for n, r in rows.items() if r.flagged}
    assert len(flagged) == 5, flagged
    out = capsys.readouterr().out
    assert out.count("<<") == 5 and "2 outlier, 1 shape mismatch, 1 only in a, 1 only in b" in out


def test_name_map_options(tmp_path, checkpoint):
    path = convert_by_hand(checkpoint, tmp_path / "d.gguf", "dflash", "dflash", "F32")
    raw_rows = compare_weights(checkpoint, path, name_map=None, show=False)
    assert {r.name for r in raw_rows if r.status == "ok"} == {"fc.weight"}  # the one shared name
    assert len(raw_rows) == 1 + 2 * (2 + 11 * LAYERS)
    explicit = {hf_to_gguf(n, "dflash"): n for n in hf_names(LAYERS)}
    rows = compare_weights(checkpoint, path, name_map=explicit, show=False)
    assert all(r.status == "ok" for r in rows)
    rows = compare_weights(path, checkpoint, name_map="dflash", show=False)  # GGUF as reference
    assert all(r.status == "ok" for r in rows)
    with pytest.raises(ValueError, match="name_map"):
        compare_weights(checkpoint, path, name_map="llama", show=False)


def test_threshold_factor_and_integer_tensors(tmp_path, rng):
    x = rng.standard_normal((2, 64)).astype(np.float32)
    write_safetensors(tmp_path / "a", {"w": x, "ids": np.arange(4)})
    write_safetensors(tmp_path / "b", {"w": x * 1.004, "ids": np.arange(4) + (np.arange(4) == 3)},
                      dtype="bfloat16")
    rows = {r.name: r for r in compare_weights(tmp_path / "a", tmp_path / "b", show=False)}
    assert rows["w"].status == "ok"  # 0.4 % + bf16 rounding < the BF16 budget 0.8 %
    assert rows["ids"].status == "outlier" and rows["ids"].budget == 0.0
    rows = compare_weights(tmp_path / "a", tmp_path / "b", threshold_factor=0.1, show=False)
    assert {r.name for r in rows if r.flagged} == {"w", "ids"}


@pytest.mark.parametrize("typ", ["F16", "BF16", "Q8_0", "Q4_K"])
def test_budgets_have_headroom_on_gaussian_weights(tmp_path, rng, typ):
    # The budget table's typical values, re-measured: each stays below half its budget.
    x = rng.standard_normal((64, 512)).astype(np.float32)
    write_safetensors(tmp_path / "a", {"w": x})
    path = write_gguf(tmp_path / "b.gguf", "dflash", {"w": x}, types=typ)
    (row,) = compare_weights(tmp_path / "a", path, show=False)
    assert row.status == "ok" and row.rel_rms < REL_RMS_BUDGET[typ] / 2, row
