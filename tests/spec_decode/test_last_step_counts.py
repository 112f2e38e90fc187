"""The last speculative step's counts: what it drafted, what it produced, the acceptance rate.

With ``draft_rows="verify"`` a chain drafts exactly the verify block, ``min(B, remaining + 1)``
rows (the release's ``verify_size``), so the last step of a run drafts ``min(B - 1, remaining)``
tokens; the default ``"trained"`` drafts the whole block every step. A drafter that knows the
target's greedy continuation (error rate 0) is accepted in full, so every count below is written
by hand from B and max_new_tokens alone.
"""

from __future__ import annotations

import numpy as np
import pytest

from dflash_ref.models.target import TargetModel
from dflash_ref.spec_decode.loop import generate
from dflash_ref.spec_decode.verifiers import ChainVerifier
from dflash_ref.tiny import write_tiny_target
from tests.spec_decode.drafters import ScriptedDrafter

B, N = 8, 20  # 1 token from the prefill, then steps of 8, 8 and the last 3 (remaining 3)
PROMPT = np.array([3, 17, 42, 99, 5])


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    path = write_tiny_target(tmp_path_factory.mktemp("last") / "t", "qwen3", seed=8)
    target = TargetModel.from_pretrained(path, target_layer_ids=[0])
    truth = np.concatenate([PROMPT, generate(target, None, PROMPT, N + 2 * B).tokens])
    return target, ScriptedDrafter(target, truth, B, error_rate=0.0)


def test_the_last_step_drafts_min_b_remaining_plus_one_rows_with_draft_rows_verify(pair):
    # Catches the last block sized min(B, remaining) or remaining + 2, and a drafted count of
    # B - 1 whatever the block's width. The last step: remaining 3, a block of 4 rows (3
    # drafts), all accepted; the bonus is cut, so it produced 3 tokens (a + 1 cut at 3).
    target, drafter = pair
    res = generate(target, drafter, PROMPT, N, block_size=B,
                   verify=ChainVerifier(draft_rows="verify"))
    assert res.acceptance_lengths == [8, 8, 3]
    assert res.drafted == [7, 7, 3]
    assert res.acceptance_rate == pytest.approx((7 + 7 + 2) / (7 + 7 + 3), abs=1e-15)
    assert res.tokens == list(drafter.truth[PROMPT.size: PROMPT.size + N])


def test_the_trained_block_drafts_b_minus_one_every_step(pair):
    # The default drafts the trained block in the last step too: 7 offered, 2 counted accepted.
    target, drafter = pair
    res = generate(target, drafter, PROMPT, N, block_size=B)
    assert res.acceptance_lengths == [8, 8, 3]
    assert res.drafted == [7, 7, 7]
    assert res.acceptance_rate == pytest.approx((7 + 7 + 2) / 21, abs=1e-15)
