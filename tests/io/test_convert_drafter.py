"""The drafter converter, HF checkpoint -> GGUF in both namings: round trips through
``DFlashDrafter.from_gguf``, the two namings side by side, the keys each naming carries, the
rope_theta rule, shapes over config, and malformed checkpoints / arguments.

Independent checks: every output is re-read with the raw ``gguf.GGUFReader`` (keys, value
types, tensor types and ggml shapes). Model round trips compare the GGUF model with the
safetensors model, which is the oracle.
"""

from __future__ import annotations

import json
import shutil

import gguf
import numpy as np
import pytest
from gguf import GGUFReader

from dflash_ref.errors import ConfigError, FormatError
from dflash_ref.io.convert_common import tensor_type
from dflash_ref.io.convert_drafter import convert_drafter
from dflash_ref.io.drafter_from_gguf import read_gguf_drafter
from dflash_ref.io.gguf_io import open_gguf
from dflash_ref.io.safetensors_io import load_checkpoint, write_safetensors
from dflash_ref.models.drafter import DFlashDrafter
from dflash_ref.models.target import TargetModel
from dflash_ref.testing import assert_close
from dflash_ref.tiny import write_tiny_drafter, write_tiny_target
from tests.io.convert_helpers import (
    DRAFTER_TOL,
    NAMINGS,
    PROMPT,
    drafter_pair,
    features_of,
    rewrite,
    top1_margin,
)

# ---------------------------------------------------------------- drafter round trips


@pytest.mark.parametrize("naming", NAMINGS)
@pytest.mark.parametrize("qtype", ["f32", "f16", "bf16", "q8_0"])
def test_drafter_round_trip(tiny, tmp_path, anchor, qtype, naming):
    path = convert_drafter(tiny["drafter"], tmp_path / "d.gguf", qtype, naming,
                           target=tiny["qwen3"])
    ref, got = drafter_pair(tiny["qwen3"], tiny["drafter"], path)
    assert got.config.target_layer_ids == ref.config.target_layer_ids == (0, 2)
    assert got.config.rope_theta == ref.config.rope_theta == 1e6
    assert got.config.rms_norm_eps == ref.config.rms_norm_eps == 1e-6
    feats = features_of(ref.target)
    pos = np.arange(len(PROMPT))
    a = ref.forward_block(feats, pos, anchor, len(PROMPT))
    b = got.forward_block(feats, pos, anchor, len(PROMPT))
    assert_close(b, a, DRAFTER_TOL[qtype], op="from_gguf", tensor="drafter logits",
                 case=f"{qtype} {naming}")
    assert top1_margin(a) > 2 * DRAFTER_TOL[qtype].atol  # so the argmax cannot move
    np.testing.assert_array_equal(got.draft_tokens(b), ref.draft_tokens(a))


def test_bf16_checkpoint_to_bf16_gguf_is_bit_exact(tiny, tmp_path, anchor):
    # z-lab drafters are BF16: bf16 -> f32 -> bf16 is exact, so the logits are identical.
    src = write_tiny_drafter(tmp_path / "bf16", tiny["qwen3"], seed=12, dtype="bfloat16")
    path = convert_drafter(src, tmp_path / "d.gguf", "bf16", "lucebox")
    ref, got = drafter_pair(tiny["qwen3"], src, path)
    feats, pos = features_of(ref.target), np.arange(len(PROMPT))
    np.testing.assert_array_equal(got.forward_block(feats, pos, anchor, len(PROMPT)),
                                  ref.forward_block(feats, pos, anchor, len(PROMPT)))


def test_gemma_target_extras_and_round_trip(tiny, tmp_path):
    path = convert_drafter(tiny["gemma3_drafter"], tmp_path / "g.gguf", "f32", "llama.cpp",
                           target=tiny["gemma3"])
    fields = GGUFReader(path).fields
    assert fields["dflash.final_logit_softcapping"].contents() == 30.0
    assert fields["dflash.embedding_scale"].contents() == 8.0  # sqrt(64), bf16-exact
    ref, got = drafter_pair(tiny["gemma3"], tiny["gemma3_drafter"], path)
    assert got.embedding_scale == ref.embedding_scale == 8.0
    feats, pos = features_of(ref.target), np.arange(len(PROMPT))
    np.testing.assert_array_equal(got.forward_block(feats, pos, 150, len(PROMPT)),
                                  ref.forward_block(feats, pos, 150, len(PROMPT)))
    # The lucebox arch string follows the target family.
    lb = convert_drafter(tiny["gemma3_drafter"], tmp_path / "l.gguf", "f32", "lucebox",
                         target=tiny["gemma3"])
    assert open_gguf(lb).arch == "gemma4-dflash-draft"


def test_sliding_window_drafter_round_trip(tiny, tmp_path):
    src = write_tiny_drafter(tmp_path / "swa", tiny["qwen3"], seed=5,
                             layer_types=["sliding_attention", "full_attention"],
                             sliding_window=12, use_sliding_window=True)
    for naming in NAMINGS:
        path = convert_drafter(src, tmp_path / f"{naming}.gguf", "f32", naming)
        g = open_gguf(path)
        assert g.get("attention.sliding_window") == 12
        assert g.get("attention.sliding_window_pattern") == [True, False]
        assert g.value_type("attention.sliding_window_pattern") == "ARRAY[BOOL]"
        ref, got = drafter_pair(tiny["qwen3"], src, path)
        assert got.config.layer_types == ref.config.layer_types
        assert got.config.sliding_window == 12
        feats, pos = features_of(ref.target), np.arange(len(PROMPT))
        np.testing.assert_array_equal(got.forward_block(feats, pos, 9, len(PROMPT)),
                                      ref.forward_block(feats, pos, 9, len(PROMPT)))


def test_q4_k_needs_whole_blocks_and_fallback(tmp_path):
    t = write_tiny_target(tmp_path / "t", "qwen3", seed=3, hidden_size=256)
    d = write_tiny_drafter(tmp_path / "d", t, seed=4)  # o_proj rows are 4 heads x 16 = 64
    with pytest.raises(FormatError, match=r"attn_output.*not a multiple of the Q4_K block \(256\)"):
        convert_drafter(d, tmp_path / "x.gguf", "q4_k")
    with pytest.warns(UserWarning, match="stored as Q8_0"):
        path = convert_drafter(d, tmp_path / "q4.gguf", "q4_k", fallback="q8_0")
    types = {t.name: t.tensor_type.name for t in GGUFReader(path).tensors}
    assert types["fc.weight"] == types["blk.0.ffn_down.weight"] == "Q4_K"
    assert types["blk.0.attn_output.weight"] == "Q8_0"
    assert types["blk.0.attn_norm.weight"] == types["enc.output_norm.weight"] == "F32"
    ref, got = drafter_pair(t, d, path)
    feats, pos = features_of(ref.target), np.arange(len(PROMPT))
    a = ref.forward_block(feats, pos, 7, len(PROMPT))
    b = got.forward_block(feats, pos, 7, len(PROMPT))
    # Q4_K: 16 levels per 32 weights, rel. RMS ~8e-2 per matrix; a loose bound on the logits.
    assert float(np.abs(b - a).max()) < 0.25 * float(np.abs(a).max())


def test_progress_bar(tiny, tmp_path, capsys):
    convert_drafter(tiny["drafter"], tmp_path / "d.gguf", "q8_0", progress=True)
    err = capsys.readouterr().err
    assert "convert -> d.gguf" in err and "25/25" in err
    convert_drafter(tiny["drafter"], tmp_path / "e.gguf", "q8_0")  # tiny: no bar by default
    assert "convert ->" not in capsys.readouterr().err


def test_tensor_type_rule():
    assert tensor_type("blk.0.attn_norm.weight", (48,), "q8_0") == "F32"
    assert tensor_type("blk.0.ssm_conv1d.weight", (96, 4), "bf16") == "F32"
    assert tensor_type("blk.0.attn_q.weight", (8, 64), "Q8_0") == "Q8_0"
    assert tensor_type("blk.0.attn_q.weight", (8, 48), "f16") == "F16"
    with pytest.raises(FormatError, match="48 weights are not a multiple of the Q8_0 block"):
        tensor_type("blk.0.attn_q.weight", (8, 48), "q8_0")
    with pytest.raises(ConfigError, match="unknown qtype 'q5_k'"):
        tensor_type("w", (8, 64), "q5_k")


# ---------------------------------------------------------------- the two namings side by side


def test_two_namings_side_by_side(tiny, tmp_path):
    paths = {n: convert_drafter(tiny["drafter"], tmp_path / f"{n}.gguf", "bf16", n)
             for n in NAMINGS}
    lc, lb = GGUFReader(paths["llama.cpp"]), GGUFReader(paths["lucebox"])
    assert lc.fields["general.architecture"].contents() == "dflash"
    assert lb.fields["general.architecture"].contents() == "qwen35-dflash-draft"
    # HF ids [0, 2]: llama.cpp stores ids + 1 (input taps), lucebox the raw ids (output taps).
    assert lc.fields["dflash.target_layers"].contents() == [1, 3]
    assert lb.fields["qwen35-dflash-draft.dflash.target_layer_ids"].contents() == [0, 2]
    for r, key in ((lc, "dflash.target_layers"),
                   (lb, "qwen35-dflash-draft.dflash.target_layer_ids")):
        types = [t.name for t in r.fields[key].types]
        assert types == ["ARRAY", "INT32"]
    assert lb.fields["qwen35-dflash-draft.dflash.n_target_layers"].contents() == 2
    assert lc.fields["tokenizer.ggml.mask_token_id"].contents() == 255
    assert lb.fields["qwen35-dflash-draft.dflash.mask_token_id"].contents() == 255
    assert "dflash.target_layer_ids" not in lc.fields  # no raw ids in a llama.cpp file
    names_lc = {t.name for t in lc.tensors}
    names_lb = {t.name for t in lb.tensors}
    assert names_lc - names_lb == {"fc.weight", "enc.output_norm.weight"}
    assert names_lb - names_lc == {"dflash.fc.weight", "dflash.hidden_norm.weight"}
    data = {t.name: np.asarray(t.data) for t in lb.tensors}
    pairs = {"fc.weight": "dflash.fc.weight", "enc.output_norm.weight": "dflash.hidden_norm.weight"}
    for t in lc.tensors:  # the same bytes under either name
        np.testing.assert_array_equal(np.asarray(t.data), data[pairs.get(t.name, t.name)])


def test_plus_one_is_checked_not_guessed(tiny, tmp_path):
    # A "dflash" file whose target_layers hold raw ids (a 0) is refused: llama.cpp would tap
    # one layer early with every shape still valid (docs/conventions.md, "Lessons from the seeds").
    path = convert_drafter(tiny["drafter"], tmp_path / "d.gguf", "f32", "llama.cpp")
    bad = rewrite(path, tmp_path / "raw.gguf", {"dflash.target_layers": [0, 2]})
    with pytest.raises(FormatError, match=r"HF ids \+ 1"):
        read_gguf_drafter(bad)
    # ids + 1 that point at the target's last layer come back as its last layer: the drafter
    # refuses to capture the final-normed output and suggests the shift.
    shifted = rewrite(path, tmp_path / "shift.gguf", {"dflash.target_layers": [2, 4]})
    target = TargetModel.from_pretrained(tiny["qwen3"])
    with pytest.raises(ConfigError, match="shifted by one"):
        DFlashDrafter.from_gguf(shifted, target)


# ---------------------------------------------------------------- the keys each naming carries


SPEC_KEYS = {
    "llama.cpp": ["dflash.target_layers", "dflash.block_size", "tokenizer.ggml.mask_token_id",
                  "dflash.embedding_length", "dflash.block_count", "dflash.feed_forward_length",
                  "dflash.attention.head_count", "dflash.attention.head_count_kv",
                  "dflash.attention.key_length", "dflash.attention.value_length",
                  "dflash.attention.layer_norm_rms_epsilon", "dflash.rope.freq_base",
                  "dflash.attention.sliding_window", "dflash.attention.sliding_window_pattern",
                  "dflash.final_logit_softcapping"],
    "lucebox": [f"gemma4-dflash-draft.{k}" for k in (
        "context_length", "embedding_length", "block_count", "feed_forward_length",
        "attention.head_count", "attention.head_count_kv", "attention.key_length",
        "attention.value_length", "vocab_size", "attention.layer_norm_rms_epsilon",
        "rope.freq_base", "dflash.n_target_layers", "dflash.block_size", "dflash.mask_token_id",
        "dflash.target_layer_ids", "attention.sliding_window",
        "attention.sliding_window_pattern")] + ["general.name"],
}


@pytest.mark.parametrize("naming", NAMINGS)
def test_gguf_reader_finds_every_spec_key(tiny, tmp_path, naming):
    src = write_tiny_drafter(tmp_path / "swa", tiny["gemma3"], seed=5,
                             layer_types=["sliding_attention", "full_attention"],
                             sliding_window=16, use_sliding_window=True)
    path = convert_drafter(src, tmp_path / "d.gguf", "q8_0", naming, target=tiny["gemma3"])
    r = GGUFReader(path)
    missing = [k for k in SPEC_KEYS[naming] if k not in r.fields]
    assert not missing
    a = r.fields["general.architecture"].contents()
    assert [t.name for t in r.fields[f"{a}.rope.freq_base"].types] == ["FLOAT32"]
    assert [t.name for t in r.fields[f"{a}.attention.sliding_window_pattern"].types] == [
        "ARRAY", "BOOL"]
    assert r.fields[f"{a}.attention.key_length"].contents() == 16  # 4 heads x 16 != 64
    assert r.fields["general.quantization_version"].contents() == gguf.GGML_QUANT_VERSION
    # 3 + 11 per layer tensors; norms F32, matrices Q8_0; ggml shapes are {in, out}.
    assert len(r.tensors) == 3 + 11 * 2
    for t in r.tensors:
        want = "F32" if t.name.endswith("norm.weight") else "Q8_0"
        assert t.tensor_type.name == want, t.name
    fc = next(t for t in r.tensors if t.name.endswith("fc.weight"))
    assert fc.shape.tolist() == [2 * 64, 64]


# ---------------------------------------------------------------- the rope_theta rule


def _drafter_with_config(tiny, tmp_path, edit) -> object:
    src = tmp_path / "src"
    shutil.copytree(tiny["drafter"], src)
    cfg = json.loads((src / "config.json").read_text())
    edit(cfg)
    (src / "config.json").write_text(json.dumps(cfg))
    return src


@pytest.mark.parametrize("case, edit, theta", [
    ("nested wins over top level",
     lambda c: c.update(rope_theta=1e6, rope_parameters={"rope_theta": 1e7}), 1e7),
    ("top-level legacy", lambda c: c.update(rope_theta=1e7), 1e7),
    ("genuine 1e6 nested (gemma4)",
     lambda c: (c.pop("rope_theta"), c.update(rope_parameters={"rope_theta": 1000000.0})), 1e6),
    ("genuine 1e6 top level", lambda c: c.update(rope_theta=1000000.0), 1e6),
    ("int becomes float", lambda c: c.update(rope_theta=10000000), 1e7),
    ("nested null falls through",
     lambda c: c.update(rope_theta=1e7, rope_parameters={"rope_theta": None}), 1e7),
])
def test_rope_theta_resolution(tiny, tmp_path, case, edit, theta):
    src = _drafter_with_config(tiny, tmp_path, edit)
    path = convert_drafter(src, tmp_path / "d.gguf", "f32", "lucebox")
    field = GGUFReader(path).fields["qwen35-dflash-draft.rope.freq_base"]
    assert [t.name for t in field.types] == ["FLOAT32"]
    assert field.contents() == theta, case
    target = TargetModel.from_pretrained(tiny["qwen3"])
    assert DFlashDrafter.from_gguf(path, target).config.rope_theta == theta


@pytest.mark.parametrize("edit", [
    lambda c: c.pop("rope_theta"),
    lambda c: c.update(rope_theta=None),
    lambda c: (c.pop("rope_theta"), c.update(rope_parameters={})),
    lambda c: c.update(rope_theta=None, rope_parameters={"rope_theta": None}),
], ids=["missing", "null", "empty rope_parameters", "null everywhere"])
def test_rope_theta_missing_fails_loudly(tiny, tmp_path, edit):
    src = _drafter_with_config(tiny, tmp_path, edit)
    with pytest.raises(ConfigError, match="never assumes a default"):
        convert_drafter(src, tmp_path / "d.gguf", "f32")
    assert not (tmp_path / "d.gguf").exists()


# ---------------------------------------------------------------- shapes are ground truth


def test_shapes_win_over_config(tiny, tmp_path):
    def edit(c):
        c.update(intermediate_size=999, num_hidden_layers=5)
        c.pop("head_dim")

    src = _drafter_with_config(tiny, tmp_path, edit)
    with pytest.warns(UserWarning) as rec:
        path = convert_drafter(src, tmp_path / "d.gguf", "f32")
    text = " ".join(str(w.message) for w in rec)
    assert "intermediate_size=999" in text and "num_hidden_layers=5" in text
    g = open_gguf(path)
    assert g.get("feed_forward_length") == 128  # from gate_proj [128, 64]
    assert g.get("block_count") == 2  # layers.0 and layers.1
    assert g.get("attention.key_length") == 16  # k_proj rows 32 / 2 kv heads


def test_kv_heads_times_head_dim_must_match_k_proj(tiny, tmp_path):
    src = _drafter_with_config(tiny, tmp_path, lambda c: c.update(head_dim=8))
    with pytest.raises(ConfigError, match="k_proj.weight has 32 rows"):
        convert_drafter(src, tmp_path / "d.gguf", "f32")


def test_explicit_ids_that_disagree_with_fc_fail(tiny, tmp_path):
    src = _drafter_with_config(
        tiny, tmp_path, lambda c: c["dflash_config"].update(target_layer_ids=[0, 1, 2]))
    with pytest.raises(ConfigError, match="implies 2 captured layers"):
        convert_drafter(src, tmp_path / "d.gguf", "f32")


def test_malformed_checkpoints(tiny, tmp_path):
    w = load_checkpoint(tiny["drafter"])
    cfg = json.loads((tiny["drafter"] / "config.json").read_text())
    # an integer tensor
    bad = dict(w, **{"fc.weight": np.zeros((64, 128), dtype=np.int32)})
    d = write_safetensors(tmp_path / "int", bad, config=cfg)
    with pytest.raises(FormatError, match="fc.weight"):
        convert_drafter(d, tmp_path / "x.gguf")
    # a missing tensor
    d = write_safetensors(tmp_path / "miss", {k: v for k, v in w.items()
                                              if k != "layers.1.mlp.up_proj.weight"}, config=cfg)
    with pytest.raises(FormatError, match="layers.1.mlp.up_proj.weight"):
        convert_drafter(d, tmp_path / "x.gguf")
    # a tensor the drafter does not implement
    d = write_safetensors(tmp_path / "d2t", dict(w, d2t=np.zeros(4, np.float32)), config=cfg)
    with pytest.raises(FormatError, match=r"does not implement: \['d2t'\]"):
        convert_drafter(d, tmp_path / "x.gguf")
    # no config.json
    d = write_safetensors(tmp_path / "nocfg", w)
    with pytest.raises(FormatError, match="no config.json"):
        convert_drafter(d, tmp_path / "x.gguf")


def test_bad_arguments(tiny, tmp_path):
    with pytest.raises(ConfigError, match="unknown naming 'ggml'"):
        convert_drafter(tiny["drafter"], tmp_path / "x.gguf", naming="ggml")
    with pytest.raises(ConfigError, match="end in '-dflash-draft'"):
        convert_drafter(tiny["drafter"], tmp_path / "x.gguf", naming="lucebox", arch="qwen35")
    with pytest.raises(ConfigError, match="hidden_size 64 != target hidden_size 256"):
        t = write_tiny_target(tmp_path / "wide", "qwen3", hidden_size=256)
        convert_drafter(tiny["drafter"], tmp_path / "x.gguf", target=t)
