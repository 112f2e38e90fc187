"""Fixtures of the converter tests: ``tiny`` (tiny target checkpoints of three families and two
drafters, written once per test module) and ``anchor`` (a draft anchor without near-ties)."""

from __future__ import annotations

import numpy as np
import pytest

from dflash_ref.models.drafter import DFlashDrafter
from dflash_ref.models.target import TargetModel
from dflash_ref.tiny import write_tiny_drafter, write_tiny_target
from tests.io.convert_helpers import DRAFTER_TOL, PROMPT, features_of, top1_margin


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("convert")
    out = {"root": root}
    for fam in ("qwen3", "gemma3", "qwen3_5"):
        out[fam] = write_tiny_target(root / fam, fam, seed=11)
    out["drafter"] = write_tiny_drafter(root / "drafter", out["qwen3"], seed=12)
    out["gemma3_drafter"] = write_tiny_drafter(root / "gemma3_d", out["gemma3"], seed=12)
    return out


@pytest.fixture(scope="module")
def anchor(tiny):
    """An anchor whose draft rows have no near-ties: if every logit moves by at most atol, a
    top-1 lead over 2 * atol keeps the argmax, so drafted tokens must agree (greedy equality
    tests pick inputs without near-ties rather than loosen the check)."""
    target = TargetModel.from_pretrained(tiny["qwen3"])
    drafter = DFlashDrafter.from_pretrained(tiny["drafter"], target)
    feats = features_of(target)
    need = 2 * DRAFTER_TOL["q8_0"].atol
    for a in range(256):
        if top1_margin(drafter.forward_block(feats, np.arange(len(PROMPT)), a, len(PROMPT))) > need:
            return a
    pytest.fail("no anchor without near-ties")  # pragma: no cover
