"""Export and compare: the layout's grammar, what the recorder stores, and how compare reports.

Expected values come from hand-made perturbations of a case (a known key, index and size), from
an independent recomputation (one fresh forward over the whole committed sequence, argmax of the
stored logits), or from docs/conventions.md itself (its headings).
"""

from __future__ import annotations

import io
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from dflash_ref.cli import main
from dflash_ref.errors import FormatError
from dflash_ref.oracle.compare import compare_cases, compare_main
from dflash_ref.oracle.layout import KINDS, TOLERANCES, kind_of, parse_key, read_case, tensor_key

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"


def test_key_grammar_round_trip_and_refusal():
    assert tensor_key(3, "target", "features", 2) == "step0003.target.layer02.features"
    assert tensor_key(None, "", "prompt_ids") == "input.prompt_ids"
    p = parse_key("step0012.state.layer05.gdn_conv")
    assert (p.step, p.component, p.layer, p.name) == (12, "state", 5, "gdn_conv")
    assert parse_key("step0001.verify.accepted").layer is None
    for bad in ("step1.target.logits", "Step0001.target.logits", "step0001.target.layer2.h",
                "target.logits"):
        with pytest.raises(FormatError, match="grammar"):
            parse_key(bad)
    assert kind_of("step0001.verify.committed") == "exact"
    assert kind_of("step0001.drafter.draft_logits") == "logits"
    assert set(KINDS.values()) <= set(TOLERANCES)


def test_manifest_states_every_convention_heading():
    headings = re.findall(r"^## (.+)$", (ROOT / "docs" / "conventions.md").read_text(), re.M)
    headings = [h for h in headings if h != "Lessons from the seeds"]
    m = json.loads((GOLDEN / "qwen3_chain" / "manifest.json").read_text())
    assert sorted(m["conventions"]) == sorted(headings)
    assert m["tolerances"]["exact"]["atol"] == 0.0
    assert all(t["why"] for t in m["tolerances"].values())


def _copy(tmp_path, name="qwen3_chain") -> Path:
    dst = tmp_path / name
    shutil.copytree(GOLDEN / name, dst)
    return dst


def _edit(case: Path, key: str, fn) -> None:
    """Apply fn to tensor ``key`` wherever it is stored in ``case``."""
    for f in case.glob("*.safetensors"):
        t = load_file(str(f))
        if key in t:
            t[key] = fn(t[key].copy())
            save_file(t, str(f))
            return
    raise KeyError(key)


def test_compare_equal_on_itself_and_on_a_subset(tmp_path):
    assert compare_cases(GOLDEN / "qwen3_chain", GOLDEN / "qwen3_chain").equal
    other = _copy(tmp_path)
    (other / "manifest.json").unlink()  # a foreign dump has no manifest
    for f in ("step0002.safetensors", "step0005.safetensors"):
        (other / f).unlink()
    r = compare_cases(GOLDEN / "qwen3_chain", other)
    assert r.equal and r.missing and all(k.startswith(("step0002", "step0005"))
                                         for k in r.missing)
    assert r.verdict().startswith("EQUAL")


def test_compare_names_the_planted_divergence(tmp_path):
    other = _copy(tmp_path)
    key = "step0003.target.layer02.features"
    _edit(other, key, lambda a: (a.__setitem__((0, 5), a[0, 5] + 0.01), a)[1])
    later = "step0004.target.logits"
    _edit(other, later, lambda a: a + 1.0)
    r = compare_cases(GOLDEN / "qwen3_chain", other)
    d = r.first
    assert (d.key, d.step, d.layer, d.name, d.worst_index) == (key, 3, 2, "features", (0, 5))
    assert d.max_abs == pytest.approx(0.01, rel=1e-3) and d.n_bad == 1
    assert [x.key for x in r.divergences] == [key, later]
    assert r.verdict().startswith(f"DIVERGED at {key}")


def test_compare_integers_exact_shapes_and_nan(tmp_path):
    other = _copy(tmp_path)
    _edit(other, "step0001.drafter.draft_tokens", lambda a: a + 1)
    _edit(other, "step0002.target.logits", lambda a: a[:, :-1])
    r = compare_cases(GOLDEN / "qwen3_chain", other)
    assert r.first.key == "step0001.drafter.draft_tokens" and r.first.kind == "exact"
    shape = [d for d in r.divergences if d.key == "step0002.target.logits"][0]
    assert "shape" in shape.problem
    other = _copy(tmp_path / "b")
    _edit(other, "step0001.target.logits", lambda a: (a.__setitem__((0, 7), np.nan), a)[1])
    assert compare_cases(GOLDEN / "qwen3_chain", other).first.worst_index == (0, 7)


def test_tolerance_scale_loosens_floats_only(tmp_path):
    other = _copy(tmp_path)
    # logits tolerance: 1e-3 + 1e-3 |ref|; 5e-3 fails at scale 1, passes at scale 10
    _edit(other, "step0001.target.logits", lambda a: a + np.float32(5e-3))
    assert compare_cases(GOLDEN / "qwen3_chain", other).first is not None
    assert compare_cases(GOLDEN / "qwen3_chain", other, tolerance_scale=10).first is None


def test_recorded_steps_agree_with_an_independent_recomputation():
    """Committed rows' features and the verify decisions, against one fresh forward."""
    from dflash_ref.models.drafter import DFlashDrafter
    from dflash_ref.models.target import TargetModel
    from dflash_ref.oracle.cases import case_models

    m, t = read_case(GOLDEN / "qwen3_chain")
    target_dir, drafter_dir = case_models("demo", Path("."))
    target = TargetModel.from_pretrained(target_dir)
    DFlashDrafter.from_pretrained(drafter_dir, target)  # sets the capture ids
    seq = m["run"]["prompt_ids"] + [x for s in m["steps"] for x in s["committed"]]
    full = target.forward(seq[:-1], target.new_state())  # every committed position
    H = target.config.hidden_size
    accepted_any = False
    for s in m["steps"]:
        n, start = s["step"], s["start"]
        committed = t[tensor_key(n, "verify", "committed")]
        assert committed.tolist() == s["committed"]
        rows = len(t[tensor_key(n, "target", "input_ids")]) if n == 0 else committed.size
        for c, layer in enumerate(target.target_layer_ids):
            np.testing.assert_allclose(t[tensor_key(n, "target", "features", layer)],
                                       full.features[start:start + rows, c * H:(c + 1) * H],
                                       rtol=1e-4, atol=1e-5)
        if s["kind"] != "chain":
            continue
        a = int(t[tensor_key(n, "verify", "accepted")][0])
        accepted_any |= a > 0
        drafts = t[tensor_key(n, "drafter", "draft_tokens")]
        assert drafts.tolist() == t[tensor_key(n, "drafter", "draft_logits")].argmax(1).tolist()
        posterior = t[tensor_key(n, "target", "logits")].argmax(1)
        assert committed.tolist() == drafts[:a].tolist() + [int(posterior[a])]
        assert int(t[tensor_key(n, "state", "length")][0]) == start + a + 1
    assert accepted_any


def test_gguf_alongside_loads_and_gives_the_recorded_logits(tmp_path):
    from dflash_ref.models.drafter import DFlashDrafter
    from dflash_ref.models.target import TargetModel
    from dflash_ref.oracle.cases import DEMO_PROMPT, case_models
    from dflash_ref.oracle.export import export_case

    target_dir, drafter_dir = case_models("demo", tmp_path)
    m = export_case(tmp_path / "c", target_dir, drafter_dir, DEMO_PROMPT, max_new_tokens=3,
                    block_size=4)
    assert m["gguf"]["target"] == "target.gguf"
    target = TargetModel.from_gguf(tmp_path / "c" / "target.gguf")
    DFlashDrafter.from_gguf(tmp_path / "c" / "drafter.gguf", target)
    _, t = read_case(tmp_path / "c")
    logits = target.forward(DEMO_PROMPT, target.new_state()).logits[-1:]
    np.testing.assert_allclose(logits, t["step0000.target.logits"], rtol=1e-5, atol=1e-5)


def test_cli_export_compare_and_exit_codes(tmp_path, capsys):
    from dflash_ref.oracle.cases import case_models

    target_dir, drafter_dir = case_models("demo", tmp_path)
    args = ["oracle", "export", str(tmp_path / "a"), "--target", str(target_dir), "--drafter",
            str(drafter_dir), "--ids", "3,17,42,99", "--max-new-tokens", "4", "--block-size",
            "4", "--no-gguf", "--detail-steps", "0"]
    assert main(args) == 0
    assert not list((tmp_path / "a").glob("*.gguf"))
    assert main(["oracle", "compare", str(tmp_path / "a"), str(tmp_path / "a")]) == 0
    (tmp_path / "empty").mkdir()
    assert main(["oracle", "compare", str(tmp_path / "a"), str(tmp_path / "empty")]) == 2
    other = tmp_path / "b"
    shutil.copytree(tmp_path / "a", other)
    _edit(other, "step0000.target.layer01.q_rope", lambda a: a * 2)
    buf = io.StringIO()
    assert compare_main(tmp_path / "a", other, out=buf) == 1
    assert "DIVERGED at step0000.target.layer01.q_rope" in buf.getvalue().splitlines()[-1]
    capsys.readouterr()
    # --prompt: the demo target ships its tokenizer.json, so text is encoded by it (ids
    # "hello" = bytes 104 101 108 108 111 for the byte-level demo tokenizer)
    prompt_args = ["oracle", "export", str(tmp_path / "c"), *args[3:7], "--prompt", "hello",
                   "--max-new-tokens", "2", "--no-gguf"]
    assert main(prompt_args) == 0
    ids = json.loads((tmp_path / "c" / "manifest.json").read_text())["run"]["prompt_ids"]
    assert ids[-5:] == [104, 101, 108, 108, 111]


def test_commit_ema_gate_on_a_cost_model_is_reproducible(tmp_path):
    from dflash_ref.oracle.cases import DEMO_PROMPT, case_models
    from dflash_ref.oracle.export import export_case

    target_dir, drafter_dir = case_models("demo", tmp_path)
    kw = dict(max_new_tokens=8, block_size=4, gate="commit-ema,version=v2,warmup=1", gguf=False)
    a = export_case(tmp_path / "a", target_dir, drafter_dir, DEMO_PROMPT, **kw)
    export_case(tmp_path / "b", target_dir, drafter_dir, DEMO_PROMPT, **kw)
    assert a["run"]["gate"]["cost_model"]["target_fixed"] == 1.0
    assert any(t["key"].endswith(".gate.ema") for t in a["tensors"])
    assert compare_cases(tmp_path / "a", tmp_path / "b").equal


def test_bad_gate_and_pager_specs_name_the_fix():
    from dflash_ref.errors import ConfigError
    from dflash_ref.oracle.export import make_gate, make_pager

    with pytest.raises(ConfigError, match="entropy or commit-ema"):
        make_gate("speedy", sampled=False)
    with pytest.raises(ConfigError, match="pool=P"):
        make_pager("chunk=4")
    pager, spec = make_pager("pool=64,chunk=8")
    assert spec == {"pool_tokens": 64, "chunk_tokens": 8} and pager.chunk_tokens == 8


def test_detail_on_a_tree_step_keeps_its_features(tmp_path):
    from dflash_ref.oracle.cases import DEMO_PROMPT, case_models
    from dflash_ref.oracle.export import export_case

    target_dir, drafter_dir = case_models("demo", tmp_path)
    m = export_case(tmp_path / "t", target_dir, drafter_dir, DEMO_PROMPT, max_new_tokens=4,
                    block_size=4, verify="tree", detail_steps=[1], gguf=False)
    keys = [t["key"] for t in m["tensors"]]
    assert "step0001.target.layer01.features" in keys and "step0001.target.tree_parents" in keys
