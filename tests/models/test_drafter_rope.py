"""The drafter's RoPE base comes from its own config.json, not from a constant.

A drafter with rope_theta 1e4 (its target uses 1e6) drafts over context positions 500..518 and a
block at 519..526, and is compared with the independent float64 drafter forward in
tests/models/oracle.py, which builds its inverse frequencies from ``dcfg["rope_theta"]``. Channel
pair i turns by theta^(-i/8) rad per position (head_dim 16): pair 1 by 0.316 rad at 1e4 against
0.178 rad at 1e6, about 70 rad apart at position 500, so a base taken from anywhere else moves
every logit.
"""

from __future__ import annotations

import json

import numpy as np
from safetensors.numpy import load_file

from dflash_ref.models.drafter import DFlashDrafter
from dflash_ref.models.target import TargetModel
from dflash_ref.testing import Tolerance, assert_close
from dflash_ref.tiny import write_tiny_drafter, write_tiny_target
from tests.models.oracle import drafter_forward

VS_ORACLE = Tolerance(1e-4, 1e-4, "float32 drafter vs float64 oracle through 2 layers")
PROMPT = np.array([3, 17, 42, 99, 5, 250, 7, 61, 13, 128, 77, 200, 31, 8, 190, 64, 11, 2, 150])
START = 500  # absolute position of the first context feature


def test_drafter_rope_base_read_from_config(tmp_path):
    tdir = write_tiny_target(tmp_path / "t", "qwen3", seed=11)  # rope_theta 1e6
    ddir = write_tiny_drafter(tmp_path / "d", tdir, seed=12, rope_theta=10000.0)
    target = TargetModel.from_pretrained(tdir)
    drafter = DFlashDrafter.from_pretrained(ddir, target)
    feats = target.be.to_numpy(target.forward(PROMPT, target.new_state()).features)
    n = len(PROMPT)
    ctx_pos, s = np.arange(START, START + n), START + n
    dcfg = json.loads((ddir / "config.json").read_text())
    assert dcfg["rope_theta"] == 10000.0
    D, T = load_file(ddir / "model.safetensors"), load_file(tdir / "model.safetensors")
    E, head = T["model.embed_tokens.weight"], T["lm_head.weight"]
    expected = drafter_forward(dcfg, D, E, head, feats, ctx_pos, anchor=9, s=s)
    got = drafter.forward_block(feats, ctx_pos, 9, s)
    assert_close(got, expected, VS_ORACLE, op="forward_block", tensor="logits", case="theta 1e4")
    # The base matters here: the oracle with the target's 1e6 is far from the 1e4 answer.
    other = drafter_forward({**dcfg, "rope_theta": 1e6}, D, E, head, feats, ctx_pos, 9, s)
    assert np.abs(other - expected).max() > 100 * VS_ORACLE.atol
