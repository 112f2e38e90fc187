"""``dflash-ref check-gguf``: every planted fault is named (one line with its fix, exit 1), and
every GGUF the project writes passes (docs/check_gguf.md).

Files: the shipped demo pair, and ``convert``'s output of tiny pairs (an 8-layer Qwen3 target
whose drafter taps the default layers, a Gemma 3 target with a sliding drafter layer, a DFlash 2
drafter), each with the demo's byte tokenizer. Each fault is planted by copying a passing file
with gguf-py's own ``GGUFReader`` / ``GGUFWriter`` (independent of dflash-ref's reader and
writer) and changing one thing; the expected fault is the one planted.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from dflash_ref.cli import main
from dflash_ref.io.check_gguf import check_gguf

DEMO = Path(__file__).resolve().parents[2] / "dflash_ref" / "data" / "demo"
U32, I32, F32, STR, BOOL = (GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.FLOAT32,
                            GGUFValueType.STRING, GGUFValueType.BOOL)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """name -> (drafter gguf, target gguf): every one passes check-gguf."""
    from dflash_ref.config import build_target_layer_ids
    from dflash_ref.io.convert_drafter import convert_drafter
    from dflash_ref.io.convert_target import convert_target
    from dflash_ref.tiny import write_tiny_drafter, write_tiny_target

    r = tmp_path_factory.mktemp("check_gguf")
    out = {"demo": (DEMO / "gguf" / "drafter.gguf", DEMO / "gguf" / "target.gguf")}
    demo_t = convert_target(DEMO / "target", r / "demo_t.gguf", "f32")
    for naming in ("llama.cpp", "lucebox"):
        out[f"demo_{naming}"] = (convert_drafter(DEMO / "drafter", r / f"demo_{naming}.gguf",
                                                 "f32", naming, target=DEMO / "target"), demo_t)
    d2 = {"architectures": ["DFlash2DraftModel"],
          "dflash_config": {"mask_token_id": 257, "target_layer_ids": [0, 2],
                            "conv_kernel_size": 3, "conv_group_size": 8, "selector_rank": 32,
                            "selector_top_k": 6}}
    specs = {
        "deep": ("qwen3", {"num_hidden_layers": 8},
                 {"target_layer_ids": build_target_layer_ids(8, 2)}),
        "gemma": ("gemma3", {}, {"target_layer_ids": (0, 1), "sliding_window": 16,
                                 "use_sliding_window": True,
                                 "layer_types": ["sliding_attention", "full_attention"]}),
        "dflash2": ("qwen3", {}, d2),
    }
    for name, (family, t_kw, d_kw) in specs.items():
        t = write_tiny_target(r / f"{name}_t", family, seed=3, vocab_size=259, **t_kw)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(DEMO / "target" / f, t / f)
        d = write_tiny_drafter(r / f"{name}_d", t, seed=4, mask_token_id=257, **d_kw)
        out[name] = (convert_drafter(d, r / f"{name}_d.gguf", "f32", "llama.cpp", target=t),
                     convert_target(t, r / f"{name}_t.gguf", "f32"))
    return out


def plant(src: Path, dst: Path, set_keys=None, drop_keys=(), add=None, drop=(), rename=None):
    """Copy GGUF ``src`` to ``dst`` with gguf-py: keys set ({key: (value, type)}) or dropped,
    tensors added ({name: array}), dropped or renamed ({old: new}). Files here are F32."""
    r = GGUFReader(src)
    arch = r.get_field("general.architecture").contents()
    w = GGUFWriter(dst, arch)
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in drop_keys:
            continue
        if name in (set_keys or {}):
            continue
        sub = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        w.add_key_value(name, field.contents(), field.types[0], sub_type=sub)
    for key, (value, vtype) in (set_keys or {}).items():
        sub = None
        if isinstance(value, list):
            vtype, sub = GGUFValueType.ARRAY, vtype
        w.add_key_value(key, value, vtype, sub_type=sub)
    for t in r.tensors:
        if t.name not in drop:
            w.add_tensor((rename or {}).get(t.name, t.name), np.array(t.data))
    for name, x in (add or {}).items():  # F32, but int64 ids (a d2t) stay I64
        x = np.asarray(x)
        w.add_tensor(name, x if x.dtype == np.int64 else x.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def faults_of(capsys, drafter, target=None) -> tuple[int, list[str]]:
    rc = main(["check-gguf", str(drafter), *(["--target", str(target)] if target else [])])
    out = capsys.readouterr().out.strip().splitlines()
    return rc, out


@pytest.mark.parametrize("name", ["demo", "demo_llama.cpp", "demo_lucebox", "deep", "gemma",
                                  "dflash2"])
def test_every_gguf_the_project_writes_passes(files, capsys, name):
    # catches: a check that flags a correct file (the shipped pair, convert's output)
    drafter, target = files[name]
    rc, out = faults_of(capsys, drafter, target)
    assert rc == 0 and out == [f"ok {drafter} with target {target}"], out
    rc, out = faults_of(capsys, drafter)
    assert rc == 0 and len(out) == 1 and out[0].startswith("ok "), out


H, V = 128, 259  # the demo's width and vocabulary
# (id, pair, which file is planted, plant kwargs, fault kind, words of its line)
PLANTS = [
    ("tokenizer_missing", "demo_llama.cpp", "d",
     {"drop_keys": ("tokenizer.ggml.model", "tokenizer.ggml.tokens")},
     "tokenizer", ["tokenizer.ggml.model", "tokenizer.ggml.tokens", "--target"]),
    ("mask_token_missing", "demo_llama.cpp", "d", {"drop_keys": ("tokenizer.ggml.mask_token_id",)},
     "tokenizer", ["mask_token_id missing"]),
    ("mask_token_past_vocab", "demo_llama.cpp", "d",
     {"set_keys": {"tokenizer.ggml.mask_token_id": (V, U32)}}, "tokenizer",
     [f"{V} is outside the vocabulary of {V}"]),
    ("ids_stored_raw_zero", "demo_llama.cpp", "d",
     {"set_keys": {"dflash.target_layers": ([0, 1], I32)}}, "layer-ids",
     ["holds 0", "store [1, 2]"]),
    ("ids_capture_the_last_layer", "demo_llama.cpp", "d",
     {"set_keys": {"dflash.target_layers": ([2, 4], I32)}}, "layer-ids",
     ["HF layer 3, the target's last", "off by one", "store [1, 3]"]),
    ("ids_out_of_range", "demo_llama.cpp", "d",
     {"set_keys": {"dflash.target_layers": ([2, 6], I32)}}, "layer-ids",
     ["[5] outside the target's 4 layers"]),
    ("ids_count_vs_fc", "demo_llama.cpp", "d",
     {"set_keys": {"dflash.target_layers": ([2], I32)}}, "layer-ids", ["lists 1 layers",
                                                                      "implies 2 captures"]),
    ("ids_default_stored_raw", "deep", "d",  # default HF ids [1, 5] stored raw, not + 1
     {"set_keys": {"dflash.target_layers": ([1, 5], I32)}}, "layer-ids",
     ["default ids [1, 5] shifted by -1", "store [2, 6]"]),
    ("lucebox_ids_stored_plus_one", "demo_lucebox", "d",
     {"set_keys": {"qwen35-dflash-draft.dflash.target_layer_ids": ([2, 3], I32)}}, "layer-ids",
     ["HF layer 3, the target's last"]),
    ("sliding_pattern_without_window", "gemma", "d",
     {"drop_keys": ("dflash.attention.sliding_window",)}, "sliding-window",
     ["marks sliding layers", "missing or 0"]),
    ("swa_rope_without_pattern", "gemma", "d",
     {"drop_keys": ("dflash.attention.sliding_window", "dflash.attention.sliding_window_pattern"),
      "set_keys": {"dflash.rope.freq_base_swa": (10000.0, F32)}}, "sliding-window",
     ["freq_base_swa", "no sliding pattern"]),
    ("target_window_missing", "gemma", "t", {"drop_keys": ("gemma3.attention.sliding_window",)},
     "sliding-window", ["gemma3.attention.sliding_window is missing", "every layer global"]),
    ("dflash2_without_size_keys", "dflash2", "d",
     {"drop_keys": ("dflash.conv_kernel_size", "dflash.selector_top_k")}, "old-dflash2",
     ["without the size key(s)", "dflash.conv_kernel_size", "dflash.selector_top_k"]),
    ("dflash2_bare_codebook", "dflash2", "d",
     {"rename": {"selector_predecessor.weight": "selector_predecessor"}}, "old-dflash2",
     ["'selector_predecessor'", "does not load"]),
    ("dflash2_conv_base_with_weight", "dflash2", "d",
     {"rename": {"blk.0.attn_conv_base": "blk.0.attn_conv_base.weight"}}, "old-dflash2",
     ["blk.0.attn_conv_base.weight"]),
    ("dflash2_without_selector_hidden", "dflash2", "d", {"drop": ("selector_hidden.weight",)},
     "old-dflash2", ["runs this as plain DFlash"]),
    ("reduced_vocab_without_d2t", "demo_llama.cpp", "d",
     {"add": {"output.weight": np.zeros((200, H))}}, "draft-vocab",
     ["200 entries", f"the target's {V}", "no d2t"]),
    ("d2t_not_i64", "demo_llama.cpp", "d",
     {"add": {"output.weight": np.zeros((200, H)), "d2t": np.arange(200.0)}}, "draft-vocab",
     ["d2t is F32", "I64"]),  # llama.cpp asserts I64
    ("d2t_length", "demo_llama.cpp", "d",
     {"add": {"output.weight": np.zeros((200, H)), "d2t": np.arange(199)}}, "draft-vocab",
     ["d2t has shape [199]", "200 draft rows"]),  # one short: the edge
    ("width_mismatch", "demo_llama.cpp", "t", {"set_keys": {"qwen3.embedding_length": (96, U32)}},
     "pairing", ["embedding_length 128 != target qwen3.embedding_length 96"]),
    ("target_hidden_size_mismatch", "demo_llama.cpp", "d",
     {"set_keys": {"dflash.target_hidden_size": (96, U32)}}, "pairing",
     ["target_hidden_size 96 != target width 128"]),
    ("vocab_size_mismatch", "demo_llama.cpp", "d", {"set_keys": {"dflash.vocab_size": (256, U32)}},
     "pairing", ["vocab_size 256 != target vocabulary 259"]),
    ("tokens_differ", "demo_llama.cpp", "t",
     {"set_keys": {"tokenizer.ggml.tokens": ([f"t{i}" for i in range(V)], STR)}}, "pairing",
     ["differ from the target's (259) from id 0"]),
    ("unclaimed_bias", "demo_llama.cpp", "d", {"add": {"blk.0.attn_q.bias": np.zeros(H)}},
     "unclaimed-tensor", ["blk.0.attn_q.bias"]),
    ("unclaimed_block_past_count", "demo_llama.cpp", "d",
     {"add": {"blk.3.attn_norm.weight": np.ones(H)}}, "unclaimed-tensor",
     ["blk.3.attn_norm.weight", "(3 blocks)"]),
    ("unclaimed_fc_scale", "demo_lucebox", "d", {"add": {"fc.scale": np.ones(1)}},
     "unclaimed-tensor", ["fc.scale"]),
    ("rope_base_missing", "demo_llama.cpp", "d", {"drop_keys": ("dflash.rope.freq_base",)}, "rope",
     ["rope.freq_base missing", "10000"]),
    ("rope_base_differs", "demo_llama.cpp", "d",
     {"set_keys": {"dflash.rope.freq_base": (1e6, F32)}}, "rope",
     ["dflash.rope.freq_base 1000000.0 != target qwen3.rope.freq_base 10000.0"]),
    ("rope_scaling_differs", "demo_llama.cpp", "t",
     {"set_keys": {"qwen3.rope.scaling.type": ("linear", STR),
                   "qwen3.rope.scaling.factor": (2.0, F32)}}, "rope", ["rope.scaling.type"]),
]


@pytest.mark.parametrize("pair, which, kw, kind, words", [p[1:] for p in PLANTS],
                         ids=[p[0] for p in PLANTS])
def test_each_planted_fault_is_named_with_its_fix(files, tmp_path, capsys, pair, which, kw, kind,
                                                  words):
    # catches: a check that misses its fault, or names another (each plant changes one thing)
    drafter, target = files[pair]
    if which == "d":
        drafter = plant(drafter, tmp_path / "planted.gguf", **kw)
    else:
        target = plant(target, tmp_path / "planted.gguf", **kw)
    rc, out = faults_of(capsys, drafter, target)
    assert rc == 1, out
    lines = out[:-1]
    assert out[-1] == f"{drafter}: {len(lines)} fault(s) with target {target}"
    assert {line.split(":")[0] for line in lines} == {kind}, lines
    hit = [line for line in lines if all(w in line for w in words)]
    assert hit and "; fix: " in hit[0], lines


def test_a_reduced_vocabulary_with_d2t_is_not_a_fault(files, tmp_path):
    # catches: d2t ignored (every reduced-vocabulary drafter flagged) or d2t itself "unclaimed"
    drafter, target = files["demo_llama.cpp"]
    planted = plant(drafter, tmp_path / "d2t.gguf", add={"output.weight": np.zeros((200, H)),
                                                          "d2t": np.arange(200)},
                    set_keys={"dflash.vocab_size": (200, U32)})
    assert check_gguf(planted, target) == []


def test_every_fault_kind_of_the_docs_has_a_plant():
    from dflash_ref.io.check_gguf import CHECKS

    kinds = {p[4] for p in PLANTS}
    assert kinds == {"tokenizer", "layer-ids", "sliding-window", "old-dflash2", "draft-vocab",
                     "pairing", "unclaimed-tensor", "rope"}
    assert len(CHECKS) == len(kinds)


BAD = [
    ("a_target_as_file", ["{t}"], ["qwen3 target GGUF", "not a DFlash drafter", "--target"]),
    ("a_text_file", ["{txt}"], ["is not a GGUF file"]),
    ("missing", ["{root}/nope.gguf"], ["does not exist"]),
    ("drafter_as_target", ["{d}", "--target", "{d}"], ["--target", "DFlash drafter GGUF",
                                                       "drafter goes first"]),
    ("target_not_gguf", ["{d}", "--target", "{txt}"], ["--target", "is not a GGUF file"]),
]


@pytest.mark.parametrize("argv, words", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_is_one_error_line(files, tmp_path, capsys, argv, words):
    d, t = files["demo"]
    (tmp_path / "notes.txt").write_text("not a model\n")
    argv = [a.format(d=d, t=t, txt=tmp_path / "notes.txt", root=tmp_path) for a in argv]
    assert main(["check-gguf", *argv]) == 1
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and not captured.out, err
    for w in words:
        assert w in err[0], err[0]


def test_the_docs_quote_the_llamacpp_table_and_its_counts():
    # catches: docs/check_gguf.md drifting from what the llamacpp test pins
    from tests.llamacpp.test_check_gguf_llamacpp import EXPECTED, QUOTED

    doc = (Path(__file__).resolve().parents[2] / "docs" / "check_gguf.md").read_text()
    rows = dict(re.findall(r"^\| (\w+) \| (refuses|crashes|runs, [a-z ]+) \|$", doc, re.M))
    assert rows == EXPECTED
    (drafted, accepted) = QUOTED["base"]
    assert f"{accepted} of {drafted} drafted tokens accepted" in doc
    for pid, words in (("ids_stored_raw_zero", "a raw-id file"),
                       ("rope_base_differs", "a RoPE base of\n10^6")):
        drafted, accepted = QUOTED[pid]
        assert f"{words}: {accepted} of {drafted}" in doc


def test_a_terminal_is_told_the_headers_are_being_read_and_a_pipe_is_not(files, capsys,
                                                                          monkeypatch):
    # catches: a silent wait on a terminal, or a progress line polluting a pipe
    import sys

    d, t = files["demo"]
    assert main(["check-gguf", str(d)]) == 0
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(["check-gguf", str(d), "--target", str(t)]) == 0
    assert capsys.readouterr().err == f"reading the GGUF headers of {d} and {t} ...\n"
