"""benchmarks/e2e_decode.py: a clear exit without a GPU; the --tiny run (NumPy here) checks, then
prints its table; a wrong speculative token is a mismatch, not a tie."""

from __future__ import annotations

import numpy as np
import pytest

from tests.benchmarks import check_exits_cleanly_without_a_gpu, load_benchmark


def test_without_a_gpu_it_exits_with_a_clear_message():
    check_exits_cleanly_without_a_gpu("e2e_decode")


def test_tiny_run_checks_then_prints_every_row(capsys):
    bench = load_benchmark("e2e_decode")
    assert bench.main(["--tiny", "--iters", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("device: ")
    assert "speculative greedy == plain greedy" in out
    assert out.index("checked: 16-row verify == 16 one-token decodes") < out.index("tok/s")
    for row in ("\ncopy ", "\ndecode ", "\nverify ", "\ngenerate ", "\ngraphs "):
        assert row in out, row
    assert "captures [1, 3]" in out  # build_target_layer_ids(6, 2), by hand: 1 + i * 2 / 1


def test_qwen3_4b_pair_has_the_published_shapes():
    # Hand-counted from the configs: Qwen3-4B 4.02e9 parameters (tied embeddings), the
    # z-lab Qwen3-4B-DFlash-b16 drafter 5.37e8 (5 layers of 1.0093e8 plus fc 2560 x 12800).
    from dflash_ref.config import (
        DrafterConfig,
        TargetConfig,
        drafter_expected_tensors,
        expected_tensors,
    )

    bench = load_benchmark("e2e_decode")
    shape = bench.SHAPES["full"]
    t = TargetConfig.from_hf(bench.target_config(shape))
    d = DrafterConfig.from_hf(bench.drafter_config(shape, bench.DRAFTER_LAYERS["full"]))
    d.validate_against(t)
    assert list(d.target_layer_ids) == [1, 9, 17, 25, 33] and d.block_size == 16
    count = lambda shapes: sum(int(np.prod(s)) for s in shapes.values())  # noqa: E731
    layer = 2560 * (4096 + 1024 + 1024) + 4096 * 2560 + 3 * 2560 * 9728 + 2 * 2560 + 2 * 128
    assert count(expected_tensors(t)) == 151936 * 2560 + 36 * layer + 2560
    assert count(drafter_expected_tensors(d)) == 2560 * 5 * 2560 + 2560 + 5 * layer + 2560
    assert round(count(expected_tensors(t)) / 1e7) == 402
    assert round(count(drafter_expected_tensors(d)) / 1e6) == 537


def test_a_wrong_speculative_token_is_a_mismatch_and_prints_no_table(capsys, monkeypatch):
    bench = load_benchmark("e2e_decode")
    real = bench.generate

    def spec_off_by_one(target, drafter, prompt, n, **kw):
        res = real(target, drafter, prompt, n, **kw)
        if drafter is not None and n > 4:
            res.tokens[5] = (res.tokens[5] + 1) % target.config.vocab_size
        return res

    monkeypatch.setattr(bench, "generate", spec_off_by_one)
    assert bench.main(["--tiny", "--iters", "1"]) == 1
    captured = capsys.readouterr()
    assert "MISMATCH" in captured.err and "at token 5" in captured.err
    assert captured.out == ""


@pytest.mark.gpu
def test_quick_run_checks_then_times(capsys):
    bench = load_benchmark("e2e_decode")
    assert bench.main(["--quick", "--iters", "3"]) == 0
    out = capsys.readouterr().out
    assert out.index("checked") < out.index("tok/s")
    assert "hidden 2560" in out and "captures [1, 2, 3, 4, 5]" in out
