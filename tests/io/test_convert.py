"""The converters: drafter GGUF in both namings, the rope_theta rule, shapes over config, capture
count reconciliation, malformed inputs, and target GGUFs with llama.cpp's baked-in values.

Independent checks: every output is re-read with the raw ``gguf.GGUFReader`` (keys, value
types, tensor types and ggml shapes); tensor names are checked against
``gguf.get_tensor_name_map`` (the gguf package's own HF -> GGUF table); llama.cpp's value
transforms (+1 norms, ``-exp(A_log)``, tiled value heads) are checked against formulas written
out here, never by calling the converter's inverse. Model round trips compare the GGUF model
with the safetensors model, which is the oracle.
"""

from __future__ import annotations

import json
import shutil
import warnings

import gguf
import numpy as np
import pytest
from gguf import GGUFReader, GGUFWriter

from dflash_ref.errors import ConfigError, FormatError
from dflash_ref.io.convert_common import tensor_type
from dflash_ref.io.convert_drafter import convert_drafter
from dflash_ref.io.convert_target import LAYER_NAMES, convert_target
from dflash_ref.io.drafter_from_gguf import read_gguf_drafter
from dflash_ref.io.gguf_io import _value_type, open_gguf
from dflash_ref.io.safetensors_io import load_checkpoint, write_safetensors
from dflash_ref.models.drafter import DFlashDrafter
from dflash_ref.models.target import TargetModel
from dflash_ref.testing import Tolerance, assert_close
from dflash_ref.tiny import write_tiny_drafter, write_tiny_target

PROMPT = np.array([3, 17, 42, 99, 5, 250, 7, 61, 13, 128, 77, 200, 31, 8, 190, 64, 11, 2, 150])
NAMINGS = ("llama.cpp", "lucebox")

# Drafter logits, GGUF vs safetensors (tiny qwen3 / gemma3 pairs, |logit| <= ~30). Weights are
# stored with relative error <= 2^-11 (F16), 2^-8 (BF16), amax/254 per 32 (Q8_0); norms are F32.
# Measured max |diff|: F16 1.6e-3..2.1e-3, BF16 1.2e-2..1.4e-2, Q8_0 2.8e-2..4.3e-2.
DRAFTER_TOL = {
    "f32": Tolerance(0.0, 0.0, "F32 stores the float32 weights bit for bit"),
    "f16": Tolerance(0.0, 6e-3, "F16 weights (rel. 2^-11) through 2 drafter layers + lm_head"),
    "bf16": Tolerance(0.0, 4e-2, "BF16 weights (rel. 2^-8) through 2 drafter layers + lm_head"),
    "q8_0": Tolerance(0.0, 1.2e-1, "Q8_0 weights (step amax/127) through 2 layers + lm_head"),
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("convert")
    out = {"root": root}
    for fam in ("qwen3", "gemma3", "qwen3_5"):
        out[fam] = write_tiny_target(root / fam, fam, seed=11)
    out["drafter"] = write_tiny_drafter(root / "drafter", out["qwen3"], seed=12)
    out["gemma3_drafter"] = write_tiny_drafter(root / "gemma3_d", out["gemma3"], seed=12)
    return out


def _features(target):
    return target.be.to_numpy(target.forward(PROMPT, target.new_state()).features)


def _pair(target_dir, drafter_dir, gguf_path):
    """(safetensors drafter, GGUF drafter), each bound to its own copy of the target."""
    ta = TargetModel.from_pretrained(target_dir)
    tb = TargetModel.from_pretrained(target_dir)
    return (DFlashDrafter.from_pretrained(drafter_dir, ta),
            DFlashDrafter.from_gguf(gguf_path, tb))


def _margin(logits: np.ndarray) -> float:
    """Smallest top-1 minus top-2 gap over the draft rows 1..B-1."""
    top = np.sort(logits[1:], axis=1)
    return float(np.min(top[:, -1] - top[:, -2]))


@pytest.fixture(scope="module")
def anchor(tiny):
    """An anchor whose draft rows have no near-ties: if every logit moves by at most atol, a
    top-1 lead over 2 * atol keeps the argmax, so drafted tokens must agree (greedy equality
    tests pick inputs without near-ties rather than loosen the check)."""
    target = TargetModel.from_pretrained(tiny["qwen3"])
    drafter = DFlashDrafter.from_pretrained(tiny["drafter"], target)
    feats = _features(target)
    need = 2 * DRAFTER_TOL["q8_0"].atol
    for a in range(256):
        if _margin(drafter.forward_block(feats, np.arange(len(PROMPT)), a, len(PROMPT))) > need:
            return a
    pytest.fail("no anchor without near-ties")  # pragma: no cover


# ---------------------------------------------------------------- drafter round trips


@pytest.mark.parametrize("naming", NAMINGS)
@pytest.mark.parametrize("qtype", ["f32", "f16", "bf16", "q8_0"])
def test_drafter_round_trip(tiny, tmp_path, anchor, qtype, naming):
    path = convert_drafter(tiny["drafter"], tmp_path / "d.gguf", qtype, naming,
                           target=tiny["qwen3"])
    ref, got = _pair(tiny["qwen3"], tiny["drafter"], path)
    assert got.config.target_layer_ids == ref.config.target_layer_ids == (0, 2)
    assert got.config.rope_theta == ref.config.rope_theta == 1e6
    assert got.config.rms_norm_eps == ref.config.rms_norm_eps == 1e-6
    feats = _features(ref.target)
    pos = np.arange(len(PROMPT))
    a = ref.forward_block(feats, pos, anchor, len(PROMPT))
    b = got.forward_block(feats, pos, anchor, len(PROMPT))
    assert_close(b, a, DRAFTER_TOL[qtype], op="from_gguf", tensor="drafter logits",
                 case=f"{qtype} {naming}")
    assert _margin(a) > 2 * DRAFTER_TOL[qtype].atol  # so the argmax cannot move
    np.testing.assert_array_equal(got.draft_tokens(b), ref.draft_tokens(a))


def test_bf16_checkpoint_to_bf16_gguf_is_bit_exact(tiny, tmp_path, anchor):
    # z-lab drafters are BF16: bf16 -> f32 -> bf16 is exact, so the logits are identical.
    src = write_tiny_drafter(tmp_path / "bf16", tiny["qwen3"], seed=12, dtype="bfloat16")
    path = convert_drafter(src, tmp_path / "d.gguf", "bf16", "lucebox")
    ref, got = _pair(tiny["qwen3"], src, path)
    feats, pos = _features(ref.target), np.arange(len(PROMPT))
    np.testing.assert_array_equal(got.forward_block(feats, pos, anchor, len(PROMPT)),
                                  ref.forward_block(feats, pos, anchor, len(PROMPT)))


def test_gemma_target_extras_and_round_trip(tiny, tmp_path):
    path = convert_drafter(tiny["gemma3_drafter"], tmp_path / "g.gguf", "f32", "llama.cpp",
                           target=tiny["gemma3"])
    fields = GGUFReader(path).fields
    assert fields["dflash.final_logit_softcapping"].contents() == 30.0
    assert fields["dflash.embedding_scale"].contents() == 8.0  # sqrt(64), bf16-exact
    ref, got = _pair(tiny["gemma3"], tiny["gemma3_drafter"], path)
    assert got.embedding_scale == ref.embedding_scale == 8.0
    feats, pos = _features(ref.target), np.arange(len(PROMPT))
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
        ref, got = _pair(tiny["qwen3"], src, path)
        assert got.config.layer_types == ref.config.layer_types
        assert got.config.sliding_window == 12
        feats, pos = _features(ref.target), np.arange(len(PROMPT))
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
    ref, got = _pair(t, d, path)
    feats, pos = _features(ref.target), np.arange(len(PROMPT))
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


# ---------------------------------------------------------------- keys the spec lists


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


# ---------------------------------------------------------------- capture count from fc


def rewrite(src, dst, changes=None, drop_keys=(), drop_tensors=(), tensors=None):
    """Copy a GGUF with edited metadata / tensors (written F32, or as given: raw arrays)."""
    g = open_gguf(src)
    w = GGUFWriter(dst, g.arch)
    for key, value in g.metadata.items():
        if key in ("general.architecture", "general.quantization_version") or key in drop_keys:
            continue
        val, vt, sub = _value_type(key, (changes or {}).get(key, value))
        w.add_key_value(key, val, vt, sub_type=sub)
    for key, value in (changes or {}).items():
        if key not in g.metadata:
            val, vt, sub = _value_type(key, value)
            w.add_key_value(key, val, vt, sub_type=sub)
    for name in g.tensor_names:
        if name in drop_tensors:
            continue
        x = (tensors or {}).get(name)
        w.add_tensor(name, g.load(name) if x is None else x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_capture_count_from_fc_when_metadata_disagrees(tiny, tmp_path):
    path = convert_drafter(tiny["drafter"], tmp_path / "d.gguf", "f32", "lucebox")
    bad = rewrite(path, tmp_path / "n3.gguf",
                  {"qwen35-dflash-draft.dflash.n_target_layers": 3})
    target = TargetModel.from_pretrained(tiny["qwen3"])
    with pytest.warns(UserWarning, match="n_target_layers is 3 but fc implies 2"):
        d = DFlashDrafter.from_gguf(bad, target)
    assert d.config.n_capture == 2 and d.config.target_layer_ids == (0, 2)


def test_missing_ids_use_the_formula_for_the_fc_count(tiny, tmp_path):
    path = convert_drafter(tiny["drafter"], tmp_path / "d.gguf", "f32", "lucebox")
    bad = rewrite(path, tmp_path / "noids.gguf",
                  drop_keys=("qwen35-dflash-draft.dflash.target_layer_ids",))
    with pytest.raises(FormatError, match="pass the target"):
        read_gguf_drafter(bad)
    deep = write_tiny_target(tmp_path / "deep", "qwen3", num_hidden_layers=8)
    target = TargetModel.from_pretrained(deep)
    with pytest.warns(UserWarning, match="default formula"):
        config, _ = read_gguf_drafter(bad, target.config)
    assert config["dflash_config"]["target_layer_ids"] == [1, 5]  # (L=8, C=2): 1 .. L-3


def test_fc_width_not_a_multiple_of_hidden_is_an_error(tiny, tmp_path):
    path = convert_drafter(tiny["drafter"], tmp_path / "d.gguf", "f32", "lucebox")
    rng = np.random.default_rng(0)
    bad = rewrite(path, tmp_path / "fc.gguf",
                  tensors={"dflash.fc.weight": rng.standard_normal((64, 100)).astype(np.float32)})
    with pytest.raises(FormatError, match=r"\[64, 100\].*100 is not C\*64"):
        read_gguf_drafter(bad)


def test_ids_of_another_length_than_fc_are_an_error(tiny, tmp_path):
    path = convert_drafter(tiny["drafter"], tmp_path / "d.gguf", "f32", "lucebox")
    bad = rewrite(path, tmp_path / "ids.gguf",
                  {"qwen35-dflash-draft.dflash.target_layer_ids": [0, 1, 2]})
    with pytest.raises(FormatError, match="lists 3 layers .* fc implies 2"):
        read_gguf_drafter(bad)


# ---------------------------------------------------------------- malformed inputs


def test_truncated_file(tiny, tmp_path):
    path = convert_drafter(tiny["drafter"], tmp_path / "d.gguf", "q8_0")
    short = tmp_path / "short.gguf"
    short.write_bytes(path.read_bytes()[: path.stat().st_size - 100])
    target = TargetModel.from_pretrained(tiny["qwen3"])
    with pytest.raises(FormatError, match="truncated"):
        DFlashDrafter.from_gguf(short, target)


def test_missing_tensor(tiny, tmp_path):
    path = convert_drafter(tiny["drafter"], tmp_path / "d.gguf", "f32")
    bad = rewrite(path, tmp_path / "m.gguf", drop_tensors=("blk.1.ffn_up.weight",))
    with pytest.raises(FormatError, match=r"lacks tensor\(s\) \['blk.1.ffn_up.weight'\]"):
        read_gguf_drafter(bad)


def test_integer_tensor_and_mistyped_metadata(tiny, tmp_path):
    path = convert_drafter(tiny["drafter"], tmp_path / "d.gguf", "f32")
    ints = rewrite(path, tmp_path / "i.gguf",
                   tensors={"blk.0.attn_q.weight": np.zeros((64, 64), dtype=np.int32)})
    with pytest.raises(FormatError, match="attn_q.weight.*I32, not a float weight"):
        read_gguf_drafter(ints)
    text = rewrite(path, tmp_path / "s.gguf", {"dflash.block_size": "sixteen"})
    with pytest.raises(FormatError, match="'dflash.block_size' must be int.*STRING"):
        read_gguf_drafter(text)
    norope = rewrite(path, tmp_path / "r.gguf", drop_keys=("dflash.rope.freq_base",))
    with pytest.raises(FormatError, match="no key 'dflash.rope.freq_base'"):
        read_gguf_drafter(norope)


def test_not_a_drafter_gguf(tiny, tmp_path):
    path = convert_target(tiny["qwen3"], tmp_path / "t.gguf")
    with pytest.raises(FormatError, match="arch 'qwen3' is not a DFlash drafter"):
        read_gguf_drafter(path)


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


# ---------------------------------------------------------------- targets


# Target logits, GGUF vs safetensors, on IDS (24 tokens). |logit| <= ~4 (qwen), 30 (gemma, cap).
# Measured max |diff|: F32 <= 1.5e-6; BF16 2.0e-2 qwen3, 8.8e-2 gemma3, 3.1e-1 qwen3_5; Q8_0
# 8.5e-2 qwen3. The tiny random hybrid amplifies weight error through its GDN recurrences
# (embedding rounding alone moves its logits by ~0.5 at Q8_0), so its BF16 bound is loose and
# its tokens are compared only where the margin allows (none here); F32 is exact either way.
F32_TOL = Tolerance(1e-5, 1e-5, "F32; only the +1/-1 of (1+w) norms and exp/log of A_log round")
TARGET_TOL = {
    ("qwen3", "f32"): F32_TOL, ("gemma3", "f32"): F32_TOL, ("qwen3_5", "f32"): F32_TOL,
    ("qwen3", "bf16"): Tolerance(0.0, 6e-2, "BF16 weights (rel. 2^-8) through 4 layers"),
    ("qwen3", "q8_0"): Tolerance(0.0, 2.5e-1, "Q8_0 weights (step amax/127) through 4 layers"),
    ("gemma3", "bf16"): Tolerance(0.0, 2.5e-1, "BF16 weights through 4 layers, softcap 30"),
    ("qwen3_5", "bf16"): Tolerance(0.0, 1.0, "BF16 weights through 3 GDN recurrences + 1 "
                                   "attention layer of a random tiny hybrid"),
}
IDS = np.array([3, 17, 42, 99, 5, 250, 7, 61, 13, 128, 77, 200, 31, 8, 190, 64, 11, 2, 150, 33,
                99, 180, 4, 222])


@pytest.mark.parametrize("family, qtype", list(TARGET_TOL))
def test_target_round_trip(tiny, tmp_path, family, qtype):
    path = convert_target(tiny[family], tmp_path / "t.gguf", qtype)
    ref = TargetModel.from_pretrained(tiny[family], target_layer_ids=[0, 2])
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
    if qtype == "f32":
        assert_close(b.features, a.features, tol, op="from_gguf", tensor="features", case=family)
    top = np.sort(a.logits, axis=1)
    sure = top[:, -1] - top[:, -2] > 2 * tol.atol  # rows whose argmax cannot move
    if qtype == "f32" or family != "qwen3_5":
        assert sure.sum() >= 8
    np.testing.assert_array_equal(b.logits.argmax(1)[sure], a.logits.argmax(1)[sure])


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
    assert cfg.embedding_scale == 8.0 and any("bfloat16" in d for d in cfg.defaults_used)
