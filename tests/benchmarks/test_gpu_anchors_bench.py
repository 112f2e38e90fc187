"""benchmarks/gpu_anchors.py: a clear exit without a GPU; a checked quick run with one."""

from __future__ import annotations

import numpy as np
import pytest

from dflash_ref.ops.masks import visible
from tests.benchmarks import BENCHMARKS, check_exits_cleanly_without_a_gpu, load_benchmark

BENCH = BENCHMARKS / "gpu_anchors.py"


def test_without_a_gpu_it_exits_with_a_clear_message():
    check_exits_cleanly_without_a_gpu("gpu_anchors")


def test_attention_cases_have_the_issue_shapes():
    module = load_benchmark("gpu_anchors")
    cases = module.attention_cases((4096, 32768), 8192)
    names = [(n, Tq, Tk) for n, Tq, Tk, _ in cases]
    assert names == [("decode", 1, 4096), ("verify", 16, 4096 + 16), ("decode", 1, 32768),
                     ("verify", 16, 32768 + 16), ("prefill", 4096, 4096)]
    _, _, _, verify = cases[1]
    ok = visible(verify)  # committed prefix + causal among the 16: hand-checked corners
    assert ok[:, :4096].all() and ok[0, 4096] and not ok[0, 4097] and ok[15, 4096:].all()


def test_check_refuses_a_mismatch_and_passes_a_match():
    module = load_benchmark("gpu_anchors")
    with pytest.raises(module.Mismatch, match="differ by 0.5"):
        module.check("x", np.ones(3), np.full(3, 2.0), 1e-3)  # |1 - 2| / 2
    with pytest.raises(module.Mismatch):
        module.check("x", np.full(3, np.nan), np.ones(3), 1e-3)
    assert module.check("x", np.ones(3), np.ones(3) * (1 + 1e-6), 1e-3) < 1e-5


@pytest.mark.gpu
def test_quick_run_checks_then_times(capsys):
    module = load_benchmark("gpu_anchors")
    assert module.main(["--quick", "--iters", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("device: ")
    for row in ("copy ", "gdn ", "attention  decode", "attention  verify", "attention  prefill"):
        assert f"\n{row}" in out, row
