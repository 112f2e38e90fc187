"""benchmarks/kvflash.py: a quick CPU run checks before it times, in both parts."""

from __future__ import annotations

import numpy as np
import pytest

from tests.benchmarks import load_benchmark


def test_quick_cpu_run_checks_then_times(capsys):
    bench = load_benchmark("kvflash")
    bench.main(["--backend", "numpy", "--layers", "1", "--heads", "1", "--head-dim", "32",
                "--dtype", "float32", "--chunks", "2", "--repeat", "1",
                "--contexts", "512", "--pool", "448", "--steps", "2"])
    out = capsys.readouterr().out
    assert out.index("verified bit-exact") < out.index("page_out ms")
    assert out.index("numpy: checked") < out.index("plain ms/step")
    rows = [line for line in out.splitlines() if line.startswith("| numpy | ")]
    assert len(rows) == 2  # one paging row, one decode row
    assert rows[-1].split("|")[-2].strip() != "0"  # context 512 > pool 448: page-outs


def test_a_mismatch_stops_before_any_timing():
    bench = load_benchmark("kvflash")
    with pytest.raises(SystemExit, match="no timings printed"):
        bench.checked(np.zeros(3), np.ones(3), bench.POOLED, "forced mismatch")
