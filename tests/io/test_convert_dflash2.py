"""DFlash 2 drafters (``DFlash2DraftModel``) through the GGUF converter, and the release's draft
head keys of both kinds (docs/formats.md, "DFlash drafter names" and "Drafter: z-lab checkpoint
-> GGUF").

Oracles: the safetensors drafter (``DFlashDrafter.from_pretrained``) for every round trip; the
``gguf`` package's own ``GGUFReader`` (an independent reader) for the file layout, checked
against :data:`LLAMA_CPP_DFLASH2`, the table written out below from llama.cpp's loader
(ggml-org/llama.cpp ``src/models/dflash.cpp``, ``create_tensor`` calls; tensor strings from the
``gguf-py/gguf/constants.py`` hunk of pull request #27342).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from dflash_ref.cli import main
from dflash_ref.errors import ConfigError, FormatError
from dflash_ref.io.compare import compare_weights
from dflash_ref.io.convert_drafter import convert_drafter
from dflash_ref.io.drafter_from_gguf import read_gguf_drafter
from dflash_ref.io.safetensors_io import load_checkpoint, write_safetensors
from dflash_ref.models.drafter import DFlashDrafter
from dflash_ref.models.target import TargetModel
from dflash_ref.testing import Tolerance, assert_close
from dflash_ref.tiny import write_tiny_drafter, write_tiny_target
from tests.io.convert_helpers import PROMPT, drafter_pair, features_of, rewrite

H, V, K, GS, R, TOP_K = 64, 256, 3, 8, 32, 6  # tiny qwen3 width / vocab; DFlash 2 sizes
G = H // GS
SIZES = {"conv_kernel_size": K, "conv_group_size": GS, "selector_rank": R, "selector_top_k": TOP_K}
DFLASH2 = {"architectures": ["DFlash2DraftModel"],
           "dflash_config": {"mask_token_id": 255, "target_layer_ids": [0, 2], **SIZES}}
ANCHORS = (9, 42, 77, 150, 201)

# llama.cpp's DFlash 2 tensors: GGUF name -> (storage class, ggml shape {ne0, ne1, ...}).
# "matrix" takes the requested qtype; conv base kernels are F32 like every conv kernel.
LLAMA_CPP_DFLASH2 = {
    "blk.{i}.attn_conv_base": ("F32", [H, K, 2]),  # no ".weight": tn(..._CONV_BASE, i)
    "blk.{i}.attn_conv_proj.weight": ("matrix", [H, 2 * K * G]),
    "blk.{i}.ffn_conv_base": ("F32", [H, K, 2]),
    "blk.{i}.ffn_conv_proj.weight": ("matrix", [H, 2 * K * G]),
    "selector_predecessor.weight": ("matrix", [R, V]),
    "selector_successor.weight": ("matrix", [R, V]),
    "selector_hidden.weight": ("matrix", [H, R]),
}
# ... and the HF name each holds (z-lab release, dflash/model.py).
HF_OF = {
    "blk.{i}.attn_conv_base": "layers.{i}.attention_conv.base_kernel",
    "blk.{i}.attn_conv_proj.weight": "layers.{i}.attention_conv.kernel_projection.weight",
    "blk.{i}.ffn_conv_base": "layers.{i}.mlp_conv.base_kernel",
    "blk.{i}.ffn_conv_proj.weight": "layers.{i}.mlp_conv.kernel_projection.weight",
    "selector_predecessor.weight": "candidate_selector.predecessor_codebook",
    "selector_successor.weight": "candidate_selector.successor_codebook",
    "selector_hidden.weight": "candidate_selector.hidden_projection.weight",
}

# Logits, GGUF vs safetensors (2 layers, each with 4 grouped convolutions, + lm_head; |logit|
# <= 4.3 here). Measured max |diff| over ANCHORS: F16 7.6e-3, Q8_0 2.1e-1.
TOL = {"f16": Tolerance(0.0, 2e-2, "F16 weights (rel. 2^-11) through 2 DFlash 2 layers"),
       "q8_0": Tolerance(0.0, 4e-1, "Q8_0 weights (step amax/127) through 2 DFlash 2 layers")}


def _published(src: Path, dst: Path) -> Path:
    """``src`` in the published layout: the two codebooks without ``.weight``."""
    w = load_checkpoint(src)
    for name in ("predecessor_codebook", "successor_codebook"):
        w[f"candidate_selector.{name}"] = w.pop(f"candidate_selector.{name}.weight")
    return write_safetensors(dst, w, config=json.loads((src / "config.json").read_text()))


@pytest.fixture(scope="module")
def d2(tmp_path_factory):
    root = tmp_path_factory.mktemp("dflash2")
    t = write_tiny_target(root / "t", "qwen3", seed=11)
    src = write_tiny_drafter(root / "d", t, seed=12, **DFLASH2)
    return {"root": root, "target": t, "src": src,
            "published": _published(src, root / "published"),
            "bf16": write_tiny_drafter(root / "bf16", t, seed=12, dtype="bfloat16", **DFLASH2)}


def _blocks(ref, got, anchors=ANCHORS):
    """(anchor, (logits, z) of ref, (logits, z) of got) per anchor, on the same features."""
    feats, pos, n = features_of(ref.target), np.arange(len(PROMPT)), len(PROMPT)
    for a in anchors:
        yield (a, ref.forward_block(feats, pos, a, n, with_hidden=True),
               got.forward_block(feats, pos, a, n, with_hidden=True))


# ---------------------------------------------------------------- round trips


def test_f32_round_trip_is_exact_tensors_logits_and_selector_path(d2, tmp_path):
    path = convert_drafter(d2["published"], tmp_path / "d.gguf", "f32", target=d2["target"])
    config, weights = read_gguf_drafter(path)
    source = load_checkpoint(d2["src"])  # the .weight spelling: what the reader returns
    assert config["architectures"] == ["DFlash2DraftModel"]
    assert set(weights) == set(source)
    for name, w in source.items():
        np.testing.assert_array_equal(weights[name], w, err_msg=name)
    ref, got = drafter_pair(d2["target"], d2["src"], path)
    assert got.is_dflash2 and got.config.dflash2 == ref.config.dflash2 == SIZES
    moved = False
    for a, (la, za), (lb, zb) in _blocks(ref, got):
        np.testing.assert_array_equal(lb, la)
        path_a, path_b = ref.propose(za, la, a).tokens, got.propose(zb, lb, a).tokens
        np.testing.assert_array_equal(path_b, path_a)
        sa, sb = ref.selector.select(za[1:], la[1:], a), got.selector.select(zb[1:], lb[1:], a)
        np.testing.assert_array_equal(sb.candidates, sa.candidates)
        np.testing.assert_array_equal(sb.scores, sa.scores)  # catches swapped codebooks
        moved |= path_a.tolist() != la[1:].argmax(-1).tolist()
    assert moved, "the selector must move some path off the per-row argmax to be tested here"


def test_bf16_checkpoint_to_bf16_gguf_is_bit_exact(d2, tmp_path):
    # bf16 -> f32 -> bf16 is exact for every matrix; norms and conv bases are F32 (exact too).
    path = convert_drafter(d2["bf16"], tmp_path / "d.gguf", "bf16")
    ref, got = drafter_pair(d2["target"], d2["bf16"], path)
    for a, (la, za), (lb, zb) in _blocks(ref, got):
        np.testing.assert_array_equal(lb, la)
        np.testing.assert_array_equal(got.propose(zb, lb, a).tokens,
                                      ref.propose(za, la, a).tokens)


@pytest.mark.parametrize("qtype", ["f16", "q8_0"])
def test_lossy_round_trips_stay_within_the_storage_tolerance(d2, tmp_path, qtype):
    path = convert_drafter(d2["src"], tmp_path / "d.gguf", qtype, target=d2["target"])
    ref, got = drafter_pair(d2["target"], d2["src"], path)
    for a, (la, _), (lb, _) in _blocks(ref, got):
        assert_close(lb, la, TOL[qtype], op="from_gguf", tensor="DFlash 2 logits",
                     case=f"{qtype} anchor {a}")


def test_published_and_weight_spellings_convert_to_the_same_file(d2, tmp_path):
    a = GGUFReader(convert_drafter(d2["src"], tmp_path / "a.gguf", "f32"))
    b = GGUFReader(convert_drafter(d2["published"], tmp_path / "b.gguf", "f32"))
    assert [t.name for t in a.tensors] == [t.name for t in b.tensors]
    for ta, tb in zip(a.tensors, b.tensors):
        np.testing.assert_array_equal(np.asarray(tb.data), np.asarray(ta.data), err_msg=ta.name)
    rows = compare_weights(d2["published"], tmp_path / "b.gguf", threshold_factor=1.0)
    assert not any(r.flagged for r in rows) and len(rows) == len(a.tensors)


def test_cli_convert_writes_dflash2(d2, tmp_path, capsys):
    out = tmp_path / "d.gguf"
    assert main(["convert", str(d2["published"]), str(out), "--qtype", "bf16"]) == 0
    text = capsys.readouterr().out
    assert "arch dflash" in text and f"{3 + 11 * 2 + 4 * 2 + 3} tensors" in text
    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "DFlash 2" in text and text.rstrip().endswith("warnings: none")


# ---------------------------------------------------------------- the file, read independently


@pytest.mark.parametrize("qtype, matrix", [("f32", "F32"), ("bf16", "BF16"), ("q8_0", "Q8_0")])
def test_gguf_reader_sees_llama_cpps_names_shapes_and_keys(d2, tmp_path, qtype, matrix):
    r = GGUFReader(convert_drafter(d2["src"], tmp_path / "d.gguf", qtype))
    tensors = {t.name: t for t in r.tensors}
    source = load_checkpoint(d2["published"])
    for pattern, (storage, shape) in LLAMA_CPP_DFLASH2.items():
        for i in (0, 1) if "{i}" in pattern else (0,):
            t = tensors[pattern.format(i=i)]
            assert t.tensor_type.name == (matrix if storage == "matrix" else storage), t.name
            assert t.shape.tolist() == shape, t.name  # ggml order {ne0, ne1, ...}
            if t.tensor_type.name == "F32":  # NumPy order is the HF layout, bytes unchanged
                np.testing.assert_array_equal(np.asarray(t.data),
                                              source[HF_OF[pattern].format(i=i)])
    assert len(tensors) == 3 + 11 * 2 + 4 * 2 + 3
    f = r.fields
    assert f["general.architecture"].contents() == "dflash"
    for key, value in SIZES.items():
        assert f[f"dflash.{key}"].contents() == value
        assert [t.name for t in f[f"dflash.{key}"].types] == ["UINT32"]
    assert f["dflash.block_size"].contents() == 8
    assert f["dflash.target_layers"].contents() == [1, 3]  # HF ids + 1, as for DFlash
    assert f["dflash.vocab_size"].contents() == V


# ---------------------------------------------------------------- refusals and bad files


def test_lucebox_naming_refuses_dflash2(d2, tmp_path):
    # lucebox's converter skips tensors it cannot name: the file would run as plain DFlash.
    with pytest.raises(ConfigError, match=r"lucebox naming has no DFlash 2 tensors.*llama\.cpp"):
        convert_drafter(d2["src"], tmp_path / "d.gguf", "f32", "lucebox")
    assert not (tmp_path / "d.gguf").exists()


@pytest.mark.parametrize("dropped", ["selector_successor.weight", "selector_hidden.weight",
                                     "blk.1.ffn_conv_base"])
def test_a_missing_dflash2_tensor_is_named(d2, tmp_path, dropped):
    path = convert_drafter(d2["src"], tmp_path / "d.gguf", "f32")
    bad = rewrite(path, tmp_path / "bad.gguf", drop_tensors=(dropped,))
    with pytest.raises(FormatError, match=rf"lacks tensor\(s\) \['{dropped}'\] of a DFlash 2"):
        read_gguf_drafter(bad)


def test_a_missing_dflash2_size_key_is_named(d2, tmp_path):
    path = convert_drafter(d2["src"], tmp_path / "d.gguf", "f32")
    bad = rewrite(path, tmp_path / "bad.gguf", drop_keys=("dflash.selector_top_k",))
    with pytest.raises(FormatError, match=r"\['dflash.selector_top_k'\] are missing"):
        read_gguf_drafter(bad)
    # Sizes without any DFlash 2 tensor: also an incomplete DFlash 2 file, the tensors named.
    plain = rewrite(path, tmp_path / "plain.gguf",
                    drop_tensors=[n for n in open_names(path) if "conv" in n or "selector" in n])
    with pytest.raises(FormatError, match=r"\['blk.0.attn_conv_base', .* and 7 more of a "
                                          r"DFlash 2 drafter"):
        read_gguf_drafter(plain)


def open_names(path) -> list[str]:
    return [t.name for t in GGUFReader(path).tensors]


# ---------------------------------------------------------------- the release's head keys


HEAD = {"output_multiplier": 1.25, "final_logit_softcapping": 20.0,
        "input_embedding_scale": 1.5, "is_causal": True,
        "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 6,
        "use_sliding_window": True}


@pytest.mark.parametrize("kind, naming", [("dflash", "llama.cpp"), ("dflash", "lucebox"),
                                          ("dflash2", "llama.cpp")])
def test_head_and_attention_keys_round_trip(d2, tmp_path, kind, naming):
    extra = DFLASH2 if kind == "dflash2" else {}
    src = write_tiny_drafter(tmp_path / "src", d2["target"], seed=13, **extra, **HEAD)
    path = convert_drafter(src, tmp_path / "d.gguf", "f32", naming)
    r = GGUFReader(path)
    a = r.fields["general.architecture"].contents()
    assert r.fields[f"{a}.logit_scale"].contents() == 1.25  # llama.cpp's LLM_KV_LOGIT_SCALE
    assert r.fields[f"{a}.final_logit_softcapping"].contents() == 20.0
    assert r.fields[f"{a}.attention.causal"].contents() is True
    ref, got = drafter_pair(d2["target"], src, path)
    for field in ("output_multiplier", "final_logit_softcapping", "input_embedding_scale",
                  "causal_override", "layer_types", "sliding_window", "kind", "dflash2"):
        assert getattr(got.config, field) == getattr(ref.config, field), field
    assert got.config.output_multiplier == 1.25 and got.config.causal_override is True
    for _, (la, _), (lb, _) in _blocks(ref, got, ANCHORS[:2]):
        np.testing.assert_array_equal(lb, la)


def test_a_drafter_cap_of_zero_survives_a_capped_target(tmp_path):
    # Gemma targets cap at 30; a drafter stating 0 means "no cap" and must not inherit 30.
    t = write_tiny_target(tmp_path / "g", "gemma3", seed=11)
    src = write_tiny_drafter(tmp_path / "d", t, seed=12, final_logit_softcapping=0.0)
    path = convert_drafter(src, tmp_path / "d.gguf", "f32", target=t)
    assert GGUFReader(path).fields["dflash.final_logit_softcapping"].contents() == 0.0
    ta, tb = TargetModel.from_pretrained(t), TargetModel.from_pretrained(t)
    ref = DFlashDrafter.from_pretrained(src, ta)
    got = DFlashDrafter.from_gguf(path, tb)
    assert got.config.final_logit_softcapping == 0.0
    feats, pos = features_of(ta), np.arange(len(PROMPT))
    la = ref.forward_block(feats, pos, 9, len(PROMPT))
    np.testing.assert_array_equal(got.forward_block(feats, pos, 9, len(PROMPT)), la)
    assert np.abs(la).max() > 30.0  # uncapped: a cap of 30 would have been visible
