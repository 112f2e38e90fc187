"""dflash_ref.diagnose: hand-checked statistics, the rank of a rejection, and the four planted
faults of docs/acceptance.md, each recognised by its signature on the shipped demo pair.

Hand values: the statistics of a made-up list of steps, computed in the comments. The planted
faults change the pair in the way a stack gets it wrong (the drafter's fc zeroed, the target
capturing one layer too high, the drafter's RoPE base 1e6 instead of 1e4, the mask id a space),
and the report must name the fault (``signatures``), and only it.
"""

from __future__ import annotations

import copy
import dataclasses
import shutil
from pathlib import Path
from types import MappingProxyType

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import dflash_ref
from dflash_ref.diagnose import explain, first_divergence
from dflash_ref.diagnose.steps import Step, StepLog, acceptance_stats
from tests.test_demo_checkpoints import HELD_OUT

DEMO = Path(dflash_ref.__file__).parent / "data" / "demo"
GOLDEN = Path(__file__).resolve().parents[1] / "golden"
PROMPTS = HELD_OUT[:4]
NEW = 64
# tau of each planted fault and of the ablation that names it, as docs/acceptance.md quotes them
DOC = {"baseline": 4.13, "zeroed": 1.25, "shifted": 3.19, "rope": 2.38, "mask": 1.52,
       "shuffled": 1.35, "layers -1": 2.90, "layers +1": 3.19}


def test_acceptance_stats_hand_case():
    # B = 4 (3 drafts). a = 0, 3, 1, 2 at positions 10, 20, 70, 75.
    steps = [Step(10, 3, 0, 1), Step(20, 3, 3, None), Step(70, 3, 1, 5), Step(75, 3, 2, 9)]
    s = acceptance_stats(steps, 4, bucket=64)
    assert s.tau == pytest.approx((1 + 4 + 2 + 3) / 4)  # 2.5
    assert s.acceptance_rate == pytest.approx(6 / 12)
    assert s.p_at_least == pytest.approx((3 / 4, 2 / 4, 1 / 4))  # a >= 1, 2, 3
    assert s.p_conditional == pytest.approx((3 / 4, 2 / 3, 1 / 2))
    assert s.histogram == (1, 1, 1, 1)  # a + 1 = 1, 2, 3, 4
    assert s.tau_by_context == ((0, 2.5, 2), (64, 2.5, 2))  # (1 + 4) / 2, (2 + 3) / 2
    assert s.misses == {"second choice": 1, "in top 8": 1, "absent": 1}
    assert s.parting == (1, 1, 1)  # rejected at block positions 1, 2, 3
    with pytest.raises(ValueError, match="no speculative step"):
        acceptance_stats([], 4)


def test_step_log_ranks_the_targets_token_in_the_parting_row():
    log = StepLog()
    rows = np.zeros((4, 6))
    rows[2] = [0.0, 5.0, 3.0, 3.0, 9.0, 1.0]  # row 2: order 4, 1, 2, 3 (tie: lower id), 5, 0
    log.on_draft(7, np.arange(30, 34), rows, None)
    log.on_commit([11, 3])  # a = 1: the target chose 3 at block position 2; rank 3
    log.on_commit([5])  # a plain step: ignored
    log.on_draft(5, np.arange(32, 36), rows, None)
    log.on_commit([1, 2, 3, 4])  # a = 3 of 3: a full accept, no rank
    log.on_draft(9, np.arange(40, 44), rows, None)
    log.on_commit([8, 4])  # a = 1 and the target's 4 is row 2's first choice: a cut step,
    # 1 draft judged, none rejected (catches the budget cut counted as a rejection)
    assert log.steps == [Step(30, 3, 1, 3), Step(32, 3, 3, None), Step(40, 1, 1, None)]


def _with_config(drafter, **changes):
    d = copy.copy(drafter)
    d.config = dataclasses.replace(drafter.config, **changes)
    return d


def test_the_shipped_pair_shows_no_fault(demo_pair, demo_tokenizer):
    report = explain(*demo_pair, PROMPTS, NEW, tokenizer=demo_tokenizer, bucket=16)
    assert report.signatures() == []
    assert report.stats.tau == pytest.approx(DOC["baseline"], abs=0.006)
    assert report.ablations["features zeroed"].tau == pytest.approx(DOC["zeroed"], abs=0.006)
    assert report.ablations["features shuffled"].tau == pytest.approx(DOC["shuffled"], abs=0.006)
    assert report.ablations["layers -1"].tau == pytest.approx(DOC["layers -1"], abs=0.006)
    assert report.ablations["layers +1"].tau == pytest.approx(DOC["layers +1"], abs=0.006)
    assert [lo for lo, _, _ in report.stats.tau_by_context] == [64, 80, 96, 112]
    doc = (Path(__file__).resolve().parents[2] / "docs" / "acceptance.md").read_text()
    assert report.summary() in doc  # the page shows this very report
    assert report.ablations["RoPE base = target's"] is None  # equal bases: nothing to try
    text = report.summary()
    assert "signatures: none" in text and "P(a >= j)" in text


def test_planted_zeroed_features(demo_pair, demo_tokenizer):
    target, drafter = demo_pair
    broken = copy.copy(drafter)
    broken.fc = drafter.fc * 0
    report = explain(target, broken, PROMPTS, NEW, tokenizer=demo_tokenizer,
                     ablations=["features zeroed"])
    assert report.signatures() == ["features unused"]
    assert report.stats.tau == pytest.approx(DOC["zeroed"], abs=0.006)
    assert report.ablations["features zeroed"].tau == pytest.approx(DOC["zeroed"], abs=0.006)


def test_planted_one_layer_shift(demo_pair, demo_tokenizer):
    target, drafter = demo_pair
    target.set_target_layer_ids([2, 3])  # captured one layer too high (the GGUF +1 bug)
    try:
        report = explain(target, drafter, PROMPTS, NEW, tokenizer=demo_tokenizer,
                         ablations=["features zeroed", "layers -1", "layers +1"])
    finally:
        target.set_target_layer_ids([1, 2])
    assert report.signatures() == ["layers off by one (-1)"]
    assert report.stats.tau == pytest.approx(DOC["shifted"], abs=0.006)
    assert report.ablations["layers -1"].tau == pytest.approx(DOC["baseline"], abs=0.006)
    assert report.ablations["features zeroed"].tau == pytest.approx(DOC["zeroed"], abs=0.006)
    assert report.ablations["layers +1"] is None  # layer 4 does not exist
    assert list(target.target_layer_ids) == [1, 2]


def test_planted_wrong_rope_base(demo_pair, demo_tokenizer):
    target, drafter = demo_pair
    rope = {t: dataclasses.replace(r, theta=1e6) for t, r in drafter.config.rope_by_type.items()}
    broken = _with_config(drafter, rope_by_type=MappingProxyType(rope))
    report = explain(target, broken, PROMPTS, NEW, tokenizer=demo_tokenizer,
                     ablations=["features zeroed", "RoPE base = target's"])
    assert report.signatures() == ["RoPE base"]
    assert report.stats.tau == pytest.approx(DOC["rope"], abs=0.006)
    assert report.ablations["RoPE base = target's"].tau == pytest.approx(DOC["baseline"], abs=0.006)


def test_planted_wrong_mask_id(demo_pair, demo_tokenizer):
    target, drafter = demo_pair
    report = explain(target, _with_config(drafter, mask_token_id=32), PROMPTS, NEW,
                     tokenizer=demo_tokenizer, ablations=["features zeroed"])
    assert report.signatures() == ["mask token"]
    assert report.stats.tau == pytest.approx(DOC["mask"], abs=0.006)
    assert any("ordinary token (' ')" in m for _, _, m in report.checks)


def test_first_divergence_names_the_tensor_and_step(tmp_path):
    case = GOLDEN / "qwen3_chain"
    assert first_divergence(case, case).startswith("EQUAL")
    other = tmp_path / "other"
    shutil.copytree(case, other)
    key = "step0003.target.layer02.features"
    for f in other.glob("*.safetensors"):
        t = load_file(str(f))
        if key in t:
            t[key] = t[key] + 0.5
            save_file(t, str(f))
    assert first_divergence(case, other) == f"first divergence: {key} (step 3, layer 2, features)"


def test_the_doc_quotes_these_numbers():
    text = (Path(__file__).resolve().parents[2] / "docs" / "acceptance.md").read_text()
    for key in ("baseline", "zeroed", "shifted", "rope", "mask"):
        assert f"| {DOC[key]:.2f} |" in text, key
    assert "ablation layers -1 tau 4.13 (+0.94)" in text
    assert "ablation RoPE base = target's tau 4.13 (+1.75)" in text
