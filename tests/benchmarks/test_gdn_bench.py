"""benchmarks/gdn.py: checks before it times, prints the table, skips the GPU part clearly."""

from __future__ import annotations

import pytest

from tests.benchmarks import load_benchmark
from tests.gpu import gpu_skip_reason


def test_cpu_table_is_checked_then_timed(capsys):
    bench = load_benchmark("gdn")
    assert bench.main(["--T", "70", "4096", "--dim", "8", "--heads", "1", "--v-heads", "2",
                       "--repeats", "1", "--cpu-only"]) == 0
    out = capsys.readouterr().out
    assert out.index("checked") < out.index("recurrent ms")  # correctness before timings
    assert "\n    70 " in out and "speedup at T=4096" in out


def test_mismatch_prints_no_timings(capsys, monkeypatch):
    bench = load_benchmark("gdn")
    def off_by_one(*args):
        return tuple(x + 1 for x in bench.gdn_recurrent(*args))

    monkeypatch.setattr(bench, "gdn_chunked", off_by_one)
    assert bench.main(["--T", "16", "--dim", "4", "--repeats", "1", "--cpu-only"]) == 1
    captured = capsys.readouterr()
    assert "MISMATCH" in captured.err and "recurrent ms" not in captured.out


def test_gpu_section_skips_with_a_reason(capsys):
    if gpu_skip_reason() is None:
        pytest.skip("a GPU is usable here: the CuPy section runs instead")
    bench = load_benchmark("gdn")
    assert bench.main(["--T", "16", "--dim", "4", "--repeats", "1"]) == 0
    assert "CuPy section skipped: no usable CUDA GPU" in capsys.readouterr().out


@pytest.mark.gpu
def test_gpu_section_runs(capsys):
    bench = load_benchmark("gdn")
    assert bench.main(["--T", "100", "300", "--dim", "64", "--repeats", "1", "--iters", "3"]) == 0
    out = capsys.readouterr().out
    assert out.index("checked: CuPy") < out.index("CuPy float32 on")
