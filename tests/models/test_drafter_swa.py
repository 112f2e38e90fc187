"""The drafter's sliding window at its edge, per SWA convention, against the float64 oracle.

The visible key sets are written out by hand below from the conventions' definitions
(docs/config.md, W = sliding_window, q / k absolute positions of a noise query / a key):

    causal_block      0 <= q - k <= W - 1     (HF: the window includes the current token; causal)
    noncausal_window  |q - k| <= W - 1        (same window, no causality inside the block)
    bidirectional     |q - k| <= W            (HF DFlash-assistant sliding layers)
    ignore            every key               (the window is not applied)

Full-attention layers see every key. With W = 10, block 8 and 19 context positions every noise
query at s .. s+7 = 19 .. 26 has its edge key (q - 9, or q - 10 when bidirectional) inside the
context, so a window one too small (or too large) hides (or shows) one key per query and moves the
logits (W > B keeps a window of W - 1 legal, so the wrong window runs instead of raising).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import load_file

from dflash_ref.models.drafter import DFlashDrafter
from dflash_ref.models.target import TargetModel
from dflash_ref.testing import Tolerance, assert_close
from dflash_ref.tiny import write_tiny_drafter, write_tiny_target
from tests.models.oracle import drafter_forward

VS_ORACLE = Tolerance(1e-4, 1e-4, "float32 drafter vs float64 oracle through 2 layers")
W = 10
PROMPT = np.array([3, 17, 42, 99, 5, 250, 7, 61, 13, 128, 77, 200, 31, 8, 190, 64, 11, 2, 150])
LAYER_TYPES = ["sliding_attention", "full_attention"]

HAND_RULES = {  # (q, k, w) -> visible, for a sliding layer of window w
    "causal_block": lambda q, k, w: 0 <= q - k <= w - 1,
    "noncausal_window": lambda q, k, w: abs(q - k) <= w - 1,
    "bidirectional": lambda q, k, w: abs(q - k) <= w,
    "ignore": lambda q, k, w: True,
}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("drafter_swa")
    target = write_tiny_target(root / "t", "qwen3", seed=11)
    drafter = write_tiny_drafter(root / "d", target, seed=12, layer_types=LAYER_TYPES,
                                 sliding_window=W, use_sliding_window=True)
    return target, drafter


def _oracle(dirs, feats, rule, w=W):
    tdir, ddir = dirs
    dcfg = json.loads((ddir / "config.json").read_text())
    D, T = load_file(ddir / "model.safetensors"), load_file(tdir / "model.safetensors")
    n = len(PROMPT)

    def visible(layer, q, k):
        return rule(q, k, w) if LAYER_TYPES[layer] == "sliding_attention" else True

    return drafter_forward(dcfg, D, T["model.embed_tokens.weight"], T["lm_head.weight"], feats,
                           np.arange(n), anchor=9, s=n, visible=visible)


@pytest.mark.parametrize("convention", list(HAND_RULES))
def test_sliding_window_edge_per_convention(dirs, convention):
    target = TargetModel.from_pretrained(dirs[0])
    drafter = DFlashDrafter.from_pretrained(dirs[1], target, swa_convention=convention)
    feats = target.be.to_numpy(target.forward(PROMPT, target.new_state()).features)
    n = len(PROMPT)
    expected = _oracle(dirs, feats, HAND_RULES[convention])
    got = drafter.forward_block(feats, np.arange(n), 9, n)
    assert_close(got, expected, VS_ORACLE, op="forward_block", tensor="logits", case=convention)
    cache = drafter.new_cache()
    cache.extend(feats, np.arange(n))
    assert_close(cache.forward_block(9, n), expected, VS_ORACLE, op="DraftCache.forward_block",
                 tensor="logits", case=convention)
    if convention != "ignore":
        # The edge matters: the same rule with a window one smaller gives other logits.
        narrower = _oracle(dirs, feats, HAND_RULES[convention], w=W - 1)
        assert np.abs(narrower - expected).max() > 100 * VS_ORACLE.atol
