"""llama.cpp's convert_hf_to_gguf.py and dflash-ref's converter on the same HF checkpoints
(issue 29; docs/interop.md, "Both converters agree").

llama.cpp's converter (from the pinned source, with its bundled gguf-py and
``--target-model-dir``) is the oracle for names, shapes, storage types, values and metadata.
Every difference that remains is listed in :data:`KNOWN` with its reason, and the test fails on
any other, and on a listed one that went away (so the list stays true).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from dflash_ref.io.convert_drafter import convert_drafter
from dflash_ref.io.convert_target import convert_target
from dflash_ref.tiny import write_tiny_drafter, write_tiny_target
from tests.llamacpp.harness import convert_with_llamacpp

pytestmark = pytest.mark.llamacpp

DEMO = Path(__file__).resolve().parents[2] / "dflash_ref" / "data" / "demo"
DFLASH2 = {"architectures": ["DFlash2DraftModel"],
           "dflash_config": {"mask_token_id": 257, "target_layer_ids": [0, 2],
                             "conv_kernel_size": 3, "conv_group_size": 8, "selector_rank": 32,
                             "selector_top_k": 6}}

# key -> (llama.cpp's value or None when it has no such key, ours or None, the reason)
KNOWN_DRAFTER = {
    "general.name": ("*", "DFlash-Draft-*", "a label; llama.cpp takes the directory name"),
    "general.size_label": ("*", None, "a label llama.cpp computes from the parameter count"),
    "general.type": ("model", None, "llama.cpp's file kind label; the loader does not read it"),
    "general.quantization_version": (2, None, "written by llama.cpp whatever the types; ours "
                                     "only when a quantized type is present"),
    "dflash.target_hidden_size": (None, "*", "ours states the target's width (the loader reads "
                                  "it when present, else takes the target's); same value"),
    "dflash.vocab_size": (None, "*", "ours states the vocabulary the draft head covers; "
                          "llama.cpp takes it from the token list"),
    "tokenizer.ggml.merges": (None, ["\u0100 \u0101"], "llama.cpp's converter writes no merges "
                              "key for a vocabulary without merges, and llama.cpp's loader "
                              "then refuses the file (cannot find tokenizer merges); ours "
                              "writes one merge that makes no token (io/vocab_gguf.py)"),
}
KNOWN_TARGET = {
    **{k: v for k, v in KNOWN_DRAFTER.items()
       if k in ("general.size_label", "general.type", "general.quantization_version",
                "tokenizer.ggml.merges")},
    "general.name": ("Target", "Qwen3ForCausalLM", "a label; llama.cpp takes the directory "
                     "name, ours the HF architecture"),
    "qwen3.vocab_size": (None, 259, "ours states the embedding's rows; llama.cpp takes the "
                         "token list's length, the same number"),
}


def _fields(path):
    r = GGUFReader(path)
    md = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    return md, {t.name: t for t in r.tensors}


def _matches(pattern, value) -> bool:
    if pattern == "*":
        return True
    if isinstance(pattern, str) and pattern.endswith("*") and isinstance(value, str):
        return value.startswith(pattern[:-1])
    return pattern == value


def compare_files(theirs: Path, ours: Path, known: dict) -> list[str]:
    """Differences between the two GGUFs that ``known`` does not explain."""
    md_t, ts_t = _fields(theirs)
    md_o, ts_o = _fields(ours)
    problems = []
    for key in sorted(set(md_t) | set(md_o)):
        vt, vo = md_t.get(key), md_o.get(key)
        if key in known:
            want_t, want_o, _ = known[key]
            if not (_matches(want_t, vt) if want_t is not None else vt is None) or not (
                    _matches(want_o, vo) if want_o is not None else vo is None):
                problems.append(f"known difference {key!r} changed: llama.cpp {vt!r}, ours {vo!r}")
        elif vt != vo:
            problems.append(f"metadata {key!r}: llama.cpp {str(vt)[:80]}, ours {str(vo)[:80]}")
    if set(ts_t) != set(ts_o):
        problems.append(f"tensors only in llama.cpp's {sorted(set(ts_t) - set(ts_o))}, only in "
                        f"ours {sorted(set(ts_o) - set(ts_t))}")
    for name in sorted(set(ts_t) & set(ts_o)):
        a, b = ts_t[name], ts_o[name]
        if list(a.shape) != list(b.shape) or a.tensor_type != b.tensor_type:
            problems.append(f"{name}: llama.cpp {a.tensor_type.name} {list(a.shape)}, ours "
                            f"{b.tensor_type.name} {list(b.shape)}")
        elif not np.array_equal(np.asarray(a.data), np.asarray(b.data)):
            problems.append(f"{name}: same type and shape, other values")
    return problems


def test_demo_drafter(llamacpp_src, tmp_path):
    theirs = tmp_path / "theirs.gguf"
    convert_with_llamacpp(llamacpp_src, DEMO / "drafter", "--target-model-dir", DEMO / "target",
                          "--outfile", theirs, "--outtype", "bf16")
    problems = compare_files(theirs, DEMO / "gguf" / "drafter.gguf", KNOWN_DRAFTER)
    assert not problems, "\n".join(problems)


def test_demo_target(llamacpp_src, tmp_path):
    theirs = tmp_path / "theirs.gguf"
    convert_with_llamacpp(llamacpp_src, DEMO / "target", "--outfile", theirs, "--outtype", "bf16")
    problems = compare_files(theirs, DEMO / "gguf" / "target.gguf", KNOWN_TARGET)
    assert not problems, "\n".join(problems)


@pytest.fixture(scope="module")
def dflash2_pair(tmp_path_factory):
    """A tiny Qwen3 target with the demo's byte vocabulary and a DFlash 2 drafter for it."""
    root = tmp_path_factory.mktemp("dflash2")
    target = write_tiny_target(root / "target", "qwen3", seed=21, vocab_size=259)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DEMO / "target" / name, target / name)
    drafter = write_tiny_drafter(root / "drafter", target, seed=22, dtype="bfloat16", **DFLASH2)
    return root, target, drafter


def test_dflash2_drafter(llamacpp_src, dflash2_pair):
    root, target, drafter = dflash2_pair
    theirs, ours = root / "theirs.gguf", root / "ours.gguf"
    convert_with_llamacpp(llamacpp_src, drafter, "--target-model-dir", target,
                          "--outfile", theirs, "--outtype", "bf16")
    convert_drafter(drafter, ours, "bf16", "llama.cpp", target=target, progress=False)
    problems = compare_files(theirs, ours, KNOWN_DRAFTER)
    assert not problems, "\n".join(problems)
    convert_target(target, root / "target.gguf", "f32", progress=False)  # for test_dflash2


def test_dspark_drafter(llamacpp_src, tmp_path):
    """The DSpark heads: the same names, shapes, types and keys (sample_from_anchor,
    has_confidence_head) from both converters, and our reader loads llama.cpp's file."""
    from dflash_ref.models.drafter import DFlashDrafter
    from dflash_ref.models.dspark import DSparkDrafter
    from dflash_ref.models.target import TargetModel
    from tests.models.test_dspark import write_dspark

    src = write_dspark(tmp_path / "dspark")
    theirs, ours = tmp_path / "theirs.gguf", tmp_path / "ours.gguf"
    convert_with_llamacpp(llamacpp_src, src, "--target-model-dir", DEMO / "target",
                          "--outfile", theirs, "--outtype", "bf16")
    convert_drafter(src, ours, "bf16", "llama.cpp", target=DEMO / "target", progress=False)
    problems = compare_files(theirs, ours, KNOWN_DRAFTER)
    assert not problems, "\n".join(problems)
    md, _ = _fields(theirs)
    assert (md["dflash.sample_from_anchor"], md["dflash.has_confidence_head"]) == (True, True)
    target = TargetModel.from_pretrained(DEMO / "target")
    assert type(DFlashDrafter.from_gguf(theirs, target)) is DSparkDrafter
