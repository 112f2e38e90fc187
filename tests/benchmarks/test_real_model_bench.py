"""benchmarks/real_model.py on a tiny Gemma 3 GGUF: checks before it times, prints the table,
says why the torch side is skipped; fast, times nothing."""

from __future__ import annotations

import pytest

from dflash_ref.io.convert_target import convert_target
from dflash_ref.tiny import write_tiny_target
from tests.benchmarks import load_benchmark

SMALL = ["--prompt-tokens", "12", "--decode-tokens", "4", "--memory-tokens", "40",
         "--repeats", "1"]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    root = tmp_path_factory.mktemp("real_bench")
    return convert_target(write_tiny_target(root / "g", "gemma3", seed=2), root / "g.gguf")


def test_checked_then_table_then_memory(tiny_gguf, capsys, monkeypatch):
    bench = load_benchmark("real_model")
    monkeypatch.setattr(bench, "torch_unavailable", lambda: "torch is not installed")
    assert bench.main(["--gguf", str(tiny_gguf), *SMALL]) == 0
    out = capsys.readouterr().out
    assert out.index("checked:") < out.index("load (s, dequant incl.)")
    assert "prefill 12 tokens (s)" in out and "greedy decode (tok/s)" in out
    assert "torch side skipped: torch is not installed" in out
    assert "peak memory of generate on a 40-token prompt" in out


def test_a_wrong_decode_prints_no_timings(tiny_gguf, capsys, monkeypatch):
    bench = load_benchmark("real_model")
    real_generate = bench.generate

    def off_by_one(*args, **kw):
        res = real_generate(*args, **kw)
        res.tokens = [(t + 1) % 256 for t in res.tokens]
        return res

    monkeypatch.setattr(bench, "generate", off_by_one)
    assert bench.main(["--gguf", str(tiny_gguf), "--no-torch", *SMALL]) == 1
    captured = capsys.readouterr()
    assert "MISMATCH" in captured.err and "load (s" not in captured.out
