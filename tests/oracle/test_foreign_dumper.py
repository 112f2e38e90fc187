"""Another stack's dump compares equal, and its classic bugs are located at the right tensor.

The foreign stack is HF transformers' model code for the target and the z-lab ``dflash`` package
(``DFlashDraftModel``) for the drafter, in PyTorch: scripts/dump_hf_reference.py. The expected
locations are where each bug first enters the computation, by construction of the bug: a layer
id shifted by one changes the captured features and nothing before them; an unapplied embedding
scale changes the embedding output itself; a sliding layer run as full attention changes the
first sliding layer's attention output (layer 0 of the Gemma case) and nothing before it.
Skipped without torch / transformers (run with a venv that has them, e.g. PYTHONPATH=$PWD).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from dflash_ref.oracle.cases import GOLDEN_CASES, case_models  # noqa: E402
from dflash_ref.oracle.compare import compare_cases  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
sys.path.insert(0, str(ROOT / "scripts"))
from dump_hf_reference import dump  # noqa: E402

HAS_ZLAB = importlib.util.find_spec("dflash") is not None


def _dump(tmp_path, name, bug="none", with_drafter=True):
    target, drafter = case_models(GOLDEN_CASES[name]["models"], tmp_path / "models")
    out = dump(GOLDEN / name, tmp_path / f"dump_{bug}", target,
               drafter if with_drafter else None, bug)
    return compare_cases(GOLDEN / name, out)


@pytest.mark.parametrize("name", ["qwen3_chain", "qwen3_5_hybrid", "qwen3_sampled",
                                  "qwen3_ddtree"])
def test_hf_and_zlab_dump_compares_equal(tmp_path, name):
    r = _dump(tmp_path, name)
    assert r.first is None, r.first.describe()
    keys = set(r.compared)
    assert any(k.endswith(".target.logits") for k in keys)
    assert any(k.endswith(".features") for k in keys)
    if name == "qwen3_chain":
        assert any(k.endswith(".target.layer01.q") for k in keys)  # per-layer detail step
    if name == "qwen3_5_hybrid":
        assert any(k.endswith(".gdn_recurrent") for k in keys)
        assert any(k.endswith(".gdn_conv") for k in keys)
    if HAS_ZLAB:
        assert any(k.endswith(".drafter.draft_logits") for k in keys)
        assert any(k.endswith(".drafter.encoder_out") for k in keys)


def test_gemma_target_compares_equal(tmp_path):
    r = _dump(tmp_path, "gemma3_swa", with_drafter=False)
    assert r.first is None, r.first.describe()
    assert "step0000.target.layer00.attn_out" in r.compared


def _first_captured_layer(name: str) -> int:
    manifest = json.loads((GOLDEN / name / "manifest.json").read_text())
    conv = manifest["conventions"]["Layer ids: which hidden state is captured"]
    return min(conv["target_layer_ids"])


@pytest.mark.parametrize("name,bug,key", [
    ("qwen3_chain", "layer_shift", "step0000.target.layer{first:02d}.features"),
    ("gemma3_swa", "layer_shift", "step0000.target.layer{first:02d}.features"),
    ("gemma3_swa", "no_embed_scale", "step0000.target.embed"),
    ("gemma3_swa", "swa_full", "step0000.target.layer00.attn_out"),
])
def test_planted_bug_is_located(tmp_path, name, bug, key):
    # a shifted layer id first shows in the first captured layer's features (the case's
    # target_layer_ids, from its manifest: [1, 2] for the trained demo pair)
    key = key.format(first=_first_captured_layer(name))
    r = _dump(tmp_path, name, bug, with_drafter=False)
    assert r.first is not None and r.first.key == key, r.first and r.first.describe()


@pytest.mark.skipif(not HAS_ZLAB, reason="the z-lab dflash package is not installed")
def test_zlab_drafter_leaves_gemma_draft_logits_uncapped(tmp_path):
    # docs/conventions.md, "The final logit softcap": the z-lab release caps draft logits only
    # with the drafter config's own final_logit_softcapping (absent in this tiny drafter); the
    # reference caps them with the target's. compare puts the difference exactly there.
    r = _dump(tmp_path, "gemma3_swa")
    assert r.first.key == "step0001.drafter.draft_logits"
    assert "step0001.drafter.encoder_out" in r.compared


def test_pooled_case_differs_only_once_the_pool_has_evicted(tmp_path):
    # HF attends to the whole context; the reference's KVFlash pool of 16 tokens evicts once
    # the context passes it, so every step that ends below position 16 must agree.
    m = json.loads((GOLDEN / "qwen3_pooled_gated" / "manifest.json").read_text())
    r = _dump(tmp_path, "qwen3_pooled_gated")
    ends = {s["step"]: s["start"] + len(s["committed"]) for s in m["steps"]}
    assert r.first is not None and ends[r.first.step] > m["run"]["pager"]["pool_tokens"]
