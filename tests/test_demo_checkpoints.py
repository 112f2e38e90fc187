"""The shipped demo pair (dflash_ref/data/demo), trained by scripts/train_demo_pair.py
(docs/training.md): layout, byte tokenizer, losslessness, acceptance on held-out prompts, that
the drafter's acceptance comes from the target's captured features, and the GGUF conversions in
``gguf/`` (scripts/convert_demo_pair.py): equal to a fresh conversion, same tokens."""

from __future__ import annotations

import fnmatch
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

import dflash_ref
from dflash_ref.config import DrafterConfig, drafter_expected_tensors
from dflash_ref.demo_text import decode_bytes, is_byte_vocabulary
from dflash_ref.io.safetensors_io import open_checkpoint
from dflash_ref.models.drafter import DFlashDrafter
from dflash_ref.models.target import TargetModel
from dflash_ref.spec_decode.loop import generate

ROOT = Path(__file__).resolve().parents[1]


def _load_script(name: str):
    """Import scripts/<name>.py (scripts/ is not a package) by path; these need only NumPy."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


demo_corpus = _load_script("demo_corpus")
DEMO = Path(dflash_ref.__file__).parent / "data" / "demo"
HELD_OUT = demo_corpus.held_out_prompts(16)  # 16 x 64 bytes from the four held-out modules
NEW_TOKENS = 64
# Measured on the shipped files with these 16 prompts x 64 tokens (docs/training.md): tau 5.09
# (min 2.52), features zeroed 1.82. The bounds are the issue's.
MIN_MEAN_TAU = 3.5
MIN_ABLATION_DROP = 1.0


def test_files_are_small_bf16_and_in_the_hf_and_zlab_layouts():
    names = {d: sorted(p.name for p in (DEMO / d).iterdir()) for d in ("target", "drafter")}
    assert names == {"target": ["config.json", "model.safetensors", "tokenizer.json",
                                "tokenizer_config.json"],
                     "drafter": ["config.json", "model.safetensors"]}
    size = sum(p.stat().st_size for d in ("target", "drafter") for p in (DEMO / d).iterdir())
    assert size < 4_000_000
    target_config = json.loads((DEMO / "target" / "config.json").read_text())
    assert target_config["model_type"] == "qwen3"
    assert target_config["architectures"] == ["Qwen3ForCausalLM"]
    config = json.loads((DEMO / "drafter" / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"]
    assert config["block_size"] == 8
    assert config["dflash_config"]["mask_token_id"] == demo_corpus.MASK
    expected = drafter_expected_tensors(DrafterConfig.from_hf(config))
    ckpt = open_checkpoint(DEMO / "drafter")
    assert {name: ckpt.info(name).shape for name in ckpt} == expected
    for d in ("target", "drafter"):
        ckpt = open_checkpoint(DEMO / d)
        assert {ckpt.info(name).dtype for name in ckpt} == {"BF16"}


def test_the_tokenizer_is_bytes():
    assert is_byte_vocabulary(DEMO / "target")
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(DEMO / "target" / "tokenizer.json"))
    text = "    def put(self, item):\n        return 'é' + \"\\t\"\n"
    assert tok.encode(text).ids == list(text.encode())  # id b is byte b
    assert tok.decode(list(text.encode())) == text
    for name, i in demo_corpus.SPECIAL_TOKENS.items():
        assert tok.token_to_id(name) == i


def test_held_out_prompts_come_from_modules_kept_out_of_training():
    train, held = demo_corpus.split_corpus()
    train_text = train[train < 256].astype(np.uint8).tobytes()
    assert set(held) == set(demo_corpus.HELD_OUT_FILES)
    for name in held:
        assert f"# ==== {name} ====".encode() not in train_text
    for p in HELD_OUT:
        assert p.size == 64 and any(p.astype(np.uint8).tobytes() in held[n] for n in held)


@pytest.mark.parametrize("verify", ["chain", "tree"])
def test_speculative_output_equals_plain_greedy(demo_pair, verify):
    target, drafter = demo_pair
    for prompt in HELD_OUT[:3]:
        plain = generate(target, None, prompt, 48).tokens
        spec = generate(target, drafter, prompt, 48, verify=verify)
        assert spec.tokens == plain, decode_bytes(prompt)
        assert len(set(plain)) >= 8  # the text is not stuck on one character


def _zero_feature_drafter(target):
    """The ablation: fc = 0 makes the encoded context exactly what zeroed features give."""
    drafter = DFlashDrafter.from_pretrained(DEMO / "drafter", target)
    drafter.fc = drafter.fc * 0
    return drafter


def test_tau_on_held_out_prompts_and_the_feature_ablation(demo_pair):
    target, drafter = demo_pair
    taus = [generate(target, drafter, p, NEW_TOKENS).tau for p in HELD_OUT]
    zeroed = _zero_feature_drafter(target)
    taus_zero = [generate(target, zeroed, p, NEW_TOKENS).tau for p in HELD_OUT]
    tau, tau_zero = float(np.mean(taus)), float(np.mean(taus_zero))
    assert tau >= MIN_MEAN_TAU, f"mean tau {tau:.2f}"
    assert tau - tau_zero >= MIN_ABLATION_DROP, f"tau {tau:.2f}, features zeroed {tau_zero:.2f}"


@pytest.mark.gpu
def test_demo_on_cupy_is_lossless_and_accepted():
    """The shipped pair on the CuPy backend: speculative == plain there too, and the drafts are
    accepted about as often (a near-tie may move one step under the kernels' float32 rounding)."""
    target = TargetModel.from_pretrained(DEMO / "target", backend="cupy")
    drafter = DFlashDrafter.from_pretrained(DEMO / "drafter", target)
    taus = []
    for prompt in HELD_OUT:
        spec = generate(target, drafter, prompt, NEW_TOKENS)
        assert spec.tokens == generate(target, None, prompt, NEW_TOKENS).tokens
        taus.append(spec.tau)
    assert np.mean(taus) >= MIN_MEAN_TAU - 0.2


# ---------------------------------------------------------------- the GGUF conversions


def test_gguf_files_are_small_and_packaged():
    files = sorted(p.name for p in (DEMO / "gguf").iterdir())
    assert files == ["drafter.gguf", "target.gguf"]
    assert sum(p.stat().st_size for p in (DEMO / "gguf").iterdir()) < 4_000_000
    # every shipped file matches a package-data glob of pyproject.toml (relative to dflash_ref/)
    tomllib = pytest.importorskip("tomllib")
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["dflash_ref"]
    pkg = DEMO.parents[1]
    for path in DEMO.rglob("*"):
        if path.is_file():
            rel = path.relative_to(pkg).as_posix()
            assert any(fnmatch.fnmatch(rel, g) and rel.count("/") == g.count("/")
                       for g in globs), rel


def test_shipped_gguf_equals_a_fresh_conversion(tmp_path):
    """The independent reader (gguf.GGUFReader) on both files: the same keys with the same
    types and values, the same tensors with the same types, ggml shapes and bytes."""
    fresh = _load_script("convert_demo_pair").convert_demo_pair(DEMO, tmp_path)
    for new in fresh:
        a, b = GGUFReader(DEMO / "gguf" / new.name), GGUFReader(new)
        assert list(a.fields) == list(b.fields), new.name
        for key, field in a.fields.items():
            other = b.fields[key]
            assert [t.name for t in field.types] == [t.name for t in other.types], key
            assert field.contents() == other.contents(), key
        assert [t.name for t in a.tensors] == [t.name for t in b.tensors]
        for ta, tb in zip(a.tensors, b.tensors):
            assert ta.tensor_type == tb.tensor_type and ta.shape.tolist() == tb.shape.tolist()
            np.testing.assert_array_equal(np.asarray(ta.data), np.asarray(tb.data),
                                          err_msg=ta.name)
    g = GGUFReader(DEMO / "gguf" / "drafter.gguf")
    assert g.fields["general.architecture"].contents() == "dflash"
    assert g.fields["dflash.target_layers"].contents() == [2, 3]  # HF [1, 2] + 1
    types = {t.tensor_type.name for t in g.tensors}
    assert types == {"BF16", "F32"}  # the shipped precision; norms F32


def test_gguf_pair_generates_the_safetensors_tokens(demo_pair):
    """Same weights (BF16 -> BF16 is exact), so the same tokens and acceptance, step by step."""
    target, drafter = demo_pair
    g_target = TargetModel.from_gguf(DEMO / "gguf" / "target.gguf")
    g_drafter = DFlashDrafter.from_gguf(DEMO / "gguf" / "drafter.gguf", g_target)
    assert g_drafter.config.target_layer_ids == drafter.config.target_layer_ids == (1, 2)
    for prompt in HELD_OUT[3:5]:
        ref = generate(target, drafter, prompt, 48)
        got = generate(g_target, g_drafter, prompt, 48)
        assert got.tokens == ref.tokens, decode_bytes(prompt)
        assert got.acceptance_lengths == ref.acceptance_lengths
        assert max(ref.acceptance_lengths) > 1  # the drafter is accepted: the pair is tested


def test_notebook_prompts_need_no_source_checkout():
    # issue 25: the end-to-end notebook loaded scripts/demo_corpus.py by a path that exists only
    # in a source checkout; it now reads package data, which must equal the corpus's prompts
    from dflash_ref.demo_text import demo_held_out_prompts

    expected = [p.tolist() for p in demo_corpus.held_out_prompts(24)]
    assert demo_held_out_prompts(24) == expected
    assert demo_held_out_prompts() == expected[:16]
    assert (DEMO / "held_out_prompts.json").is_file()
