"""``TargetModel.forward(..., logits_rows=...)``: exactly the chosen rows of the full result.

The expected values are the same model's full forward (every row), which other tests check
against the float64 oracle; this test pins that choosing rows selects and changes nothing.
The lm_head product of fewer rows may take another BLAS kernel (measured: 3e-6 on logits of
size ~15), so rows are compared within float32 rounding of one dot product over H = 64 terms;
the argmax must be identical.
"""

from __future__ import annotations

import numpy as np
import pytest

from dflash_ref.kvflash.pager import KVFlashPager
from dflash_ref.models.target import TargetModel
from dflash_ref.testing import Tolerance, assert_close
from dflash_ref.tiny import TINY_FAMILIES, write_tiny_target

ROWS = Tolerance(1e-5, 1e-5, "the same float32 dot products over H = 64 (terms up to ~15, so a "
                             "few ulp of 16 = 1e-6 each), maybe summed by another BLAS kernel")
IDS = np.random.default_rng(7).integers(0, 256, size=40)


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    root = tmp_path_factory.mktemp("rows")
    return {f: TargetModel.from_pretrained(write_tiny_target(root / f, f, seed=5),
                                           target_layer_ids=[1])
            for f in TINY_FAMILIES}


@pytest.mark.parametrize("family", TINY_FAMILIES)
@pytest.mark.parametrize("rows", [slice(-1, None), slice(3, 30, 7), [0, 39, -2, 5, 5], []],
                         ids=["last", "strided", "picked", "none"])
@pytest.mark.parametrize("pooled", [False, True], ids=["cache", "pager"])
def test_logits_rows_are_exactly_the_rows_of_the_full_result(targets, family, rows, pooled):
    target = targets[family]

    def state():  # chunks of 8: a pooled 40-token forward runs in pieces
        pager = KVFlashPager(96, chunk_tokens=8, sink_chunks=1, tail_window_chunks=1) \
            if pooled else None
        return target.new_state(pager=pager)

    full = target.forward(IDS, state())
    picked_state = state()
    picked = target.forward(IDS, picked_state, logits_rows=rows)
    want = full.logits[np.arange(IDS.size)[rows] if isinstance(rows, slice) else rows]
    assert picked.logits.shape == want.shape
    assert_close(picked.logits, want, ROWS, op="forward", tensor="logits", case=str(rows))
    if want.shape[0]:
        assert (picked.logits.argmax(-1) == want.argmax(-1)).all()
    # features and the state are those of the full run: every row, whatever logits_rows says
    np.testing.assert_array_equal(picked.features, full.features)
    assert picked_state.length == IDS.size


def test_logits_rows_are_checked(targets):
    target = targets["qwen3"]
    for bad in ([40], [-41], [[0, 1]], [0.5]):
        with pytest.raises(ValueError, match="logits_rows"):
            target.forward(IDS, target.new_state(), logits_rows=bad)
