"""benchmarks/attention.py: a clear exit without a GPU; a checked quick run with one."""

from __future__ import annotations

import pytest

from tests.benchmarks import BENCHMARKS, check_exits_cleanly_without_a_gpu, load_benchmark

BENCH = BENCHMARKS / "attention.py"


def test_without_a_gpu_it_exits_with_a_clear_message():
    check_exits_cleanly_without_a_gpu("attention")


@pytest.mark.gpu
def test_quick_run_checks_then_times(capsys):
    module = load_benchmark("attention")
    assert module.main(["--quick", "--heads", "8", "--kv-heads", "2", "--head-dim", "64"]) == 0
    out = capsys.readouterr().out
    assert out.index("checked") < out.index("kernel ms")  # correctness before timings
    for case in ("decode", "decode-swa", "drafter", "verify", "prefill"):
        assert f"\n{case} " in out, case



def test_dense_baseline_and_cases_are_right_on_cpu():
    # The dense baseline is xp-generic array code: run it with NumPy as xp against the
    # reference, for every case kind the benchmark builds.
    import numpy as np

    from dflash_ref.ops.attention import attention
    from dflash_ref.ops.masks import materialize
    from dflash_ref.testing import assert_close

    bench = load_benchmark("attention")
    rng = np.random.default_rng(1)
    cases = bench.build_cases([40], max_prefill=40)
    assert [c[0] for c in cases] == ["decode", "decode-swa", "drafter", "verify", "prefill"]
    for name, _, spec in cases:
        Tq, Tk = spec.shape
        q = rng.standard_normal((Tq, 4, 16), dtype=np.float32)
        k = rng.standard_normal((Tk, 2, 16), dtype=np.float32)
        v = rng.standard_normal((Tk, 2, 16), dtype=np.float32)
        dense = bench.dense_attention(np, q, k, v, materialize(spec), 16 ** -0.5)
        assert_close(dense, attention(q, k, v, spec), "float32_attention", op="attention",
                     case=f"benchmark dense baseline, {name}")
