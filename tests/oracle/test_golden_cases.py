"""The committed golden cases (tests/golden/) still describe what the reference computes.

Each case is re-exported into a temporary directory from its recipe (dflash_ref/oracle/cases.py)
and compared with the committed files by ``compare`` itself: same keys, every tensor within its
tolerance, the same steps and tokens. A failure means the reference's outputs changed; if that
was intended, rewrite the cases with ``python scripts/make_golden_cases.py`` and let the review
read the diff. The expected values are the committed files, written by an earlier, reviewed
version of the code: this test pins change, not correctness (correctness of the parts is pinned
by the oracle tests of each component; the HF / z-lab dumper test compares with another stack).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from dflash_ref.oracle.cases import GOLDEN_CASES, case_models, export_golden_case
from dflash_ref.oracle.compare import compare_cases

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
MAX_TOTAL_BYTES = 2 * 1024 * 1024


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_golden_case_recheck(name, tmp_path):
    committed = GOLDEN / name
    old = json.loads((committed / "manifest.json").read_text())
    target, drafter = case_models(GOLDEN_CASES[name]["models"], tmp_path / "models")
    for role, path in (("target", target), ("drafter", drafter)):
        now = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
               for p in sorted(Path(path).glob("*.safetensors"))}
        assert now == old["models"][role]["sha256"], (
            f"the {role} checkpoint of golden case {name!r} changed (the demo pair or a tiny "
            f"builder); rewrite the cases: python scripts/make_golden_cases.py {name}")
    new = export_golden_case(name, tmp_path / "case", tmp_path / "models")
    report = compare_cases(committed, tmp_path / "case")
    assert not report.missing and not report.extra, (report.missing, report.extra)
    assert report.first is None, report.first.describe()
    assert new["steps"] == old["steps"]
    assert new["result"]["tokens"] == old["result"]["tokens"]
    assert [t["key"] for t in new["tensors"]] == [t["key"] for t in old["tensors"]]
    assert new["conventions"] == old["conventions"]


def test_golden_cases_stay_small():
    total = sum(p.stat().st_size for p in GOLDEN.rglob("*") if p.is_file())
    assert total < MAX_TOTAL_BYTES, f"tests/golden holds {total} bytes"
    assert sorted(p.name for p in GOLDEN.iterdir() if p.is_dir()) == sorted(GOLDEN_CASES)


def test_golden_cases_cover_the_issue_list():
    # a Qwen3 case with per-layer detail, a hybrid with GDN states, a Gemma-style SWA case, a
    # sampled run with its seed, a DDTree step, a pooled run with a gate
    kinds = {n: json.loads((GOLDEN / n / "manifest.json").read_text()) for n in GOLDEN_CASES}
    keys = {n: [t["key"] for t in m["tensors"]] for n, m in kinds.items()}
    assert any(k.endswith(".q_rope") for k in keys["qwen3_chain"])
    assert any(k.endswith(".gdn_recurrent") for k in keys["qwen3_5_hybrid"])
    assert kinds["gemma3_swa"]["conventions"]["The sliding-window inequality"][
        "target_sliding_window"] == 8
    assert kinds["qwen3_sampled"]["run"]["seed"] == 7
    assert any(s["kind"] == "tree" for s in kinds["qwen3_ddtree"]["steps"])
    assert any(k.endswith(".slot_positions") for k in keys["qwen3_pooled_gated"])
    assert any(k.endswith(".gate.floor") or ".gate." in k for k in keys["qwen3_pooled_gated"])
    assert any(s["kind"] == "chain" and s["committed"] and len(s["committed"]) > 1
               for s in kinds["qwen3_chain"]["steps"]), "no step accepted a draft"
