"""scripts/gpu_report.py: the --dry-run runs every phase's plumbing on the CPU (so the script
cannot break on the GPU), rows for missing anchors and spent budgets instead of crashes, the
pytest summary parsed, and clear errors for bad input."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_report.py"
PHASES = ("env", "compile", "tests", "micro", "anchors", "e2e", "profile")
# The rows each phase must print in a dry run (hand list from the issue's scope).
DRY_ROWS = {
    "env": ["python", "numpy", "cupy", "cuda", "device", "torch", "fla-core", "flashinfer-python"],
    "compile": ["attention", "gdn", "norm", "pager"],
    "tests": ["pytest -m gpu"],
    "micro": ["launch: bare RawKernel", "launch: op (rms_norm)", "proj tiny M=1",
              "proj tiny M=16"],
    "anchors": ["copy", "gdn chunked vs fla T=64", "gdn chunked vs fla T=128",
                "gdn chunked vs recurrent T=256", "attention decode Tq=1 Tk=32",
                "attention verify Tq=16 Tk=48", "attention prefill Tq=64 Tk=64",
                "decode attention/layer Tk=48", "decode attention anchors Tk=48"],
    "e2e": ["build", "check", "decode", "verify 16 vs decode 1", "speculative generate",
            "cuda graphs vs eager", "dflash step graphed vs eager", "decode after 16 tokens",
            "decode after 48 tokens"],
    "profile": ["decode kernel", "decode step", "gdn kernel", "chunked gdn call"],
}


def load_script():
    """Import scripts/gpu_report.py (registered first: its dataclasses look their module up)."""
    if "gpu_report" not in sys.modules:
        spec = importlib.util.spec_from_file_location("gpu_report", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules["gpu_report"] = module
        spec.loader.exec_module(module)
    return sys.modules["gpu_report"]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1"}


def test_dry_run_prints_every_phases_rows_then_the_summary_and_json(tmp_path):
    out = tmp_path / "report.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--json", str(out)],
                         capture_output=True, text=True, timeout=600, cwd=ROOT, env=_env())
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    lines = run.stdout.splitlines()
    for phase in PHASES:
        start = lines.index(next(ln for ln in lines if ln.startswith(f"== {phase} ")))
        for name in DRY_ROWS[phase]:  # each row printed under its phase's header
            assert any(f"] {phase:<8} {name:<34} " in ln for ln in lines[start:]), (phase, name)
    assert "== summary" in run.stdout and "goal rows:" in run.stdout
    assert run.stdout.index("== summary") > run.stdout.index("== profile")
    doc = json.loads(out.read_text())
    assert doc["dry_run"] is True and list(doc["phases"]) == list(PHASES)
    assert all(p["status"] == "done" for p in doc["phases"].values())
    assert not [r for r in doc["rows"] if r["status"] in ("failed", "error")]
    # a missing anchor is a skipped row with the reason, never a crash
    fla = next(r for r in doc["rows"] if r["name"] == "gdn chunked vs fla T=64")
    assert fla["status"] == "skipped" and "fla: skipped (" in fla["text"]
    assert not (tmp_path / "report.json.tmp").exists()


def test_the_shell_wrapper_runs_the_script_with_a_missing_wheel_folder(tmp_path):
    out = tmp_path / "r.json"
    run = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_report.sh"), "--dry-run",
                          "--only", "env", "--json", str(out)], capture_output=True, text=True,
                         timeout=300,
                         env={**_env(), "WHEELS": str(tmp_path / "none"), "PYTHON": sys.executable})
    assert run.returncode == 0, run.stderr
    assert "== env " in run.stdout and "== micro" not in run.stdout
    assert list(json.loads(out.read_text())["phases"]) == ["env"]


def _phase(module, tmp_path, budget: float = 60.0):
    report = module.Report(tmp_path / "r.json", {"device": "test"})
    dev = module.Device(dry=True)
    import time

    return module.Phase("anchors", report, dev, module.DRY_SIZES, time.perf_counter() + budget,
                        {}), report


def test_a_missing_anchor_a_mismatch_and_an_exception_are_rows_not_crashes(tmp_path, capsys):
    module = load_script()
    ph, report = _phase(module, tmp_path)

    def missing():
        raise module.Skip("fla not installed")

    def mismatch():
        raise module.gpu_anchors.Mismatch("differ by 0.5")

    def broken():
        raise ZeroDivisionError("boom")

    for name, fn in (("a", missing), ("b", mismatch), ("c", broken),
                     ("d", lambda: ("1.0 ms", {"ms": 1.0}))):
        ph.measure(name, fn)
    assert [(r["name"], r["status"]) for r in report.rows] == [
        ("a", "skipped"), ("b", "failed"), ("c", "error"), ("d", "ok")]
    assert report.rows[3]["ms"] == 1.0
    out = capsys.readouterr().out
    assert "[skipped] fla not installed" in out and "MISMATCH, not timed: differ by 0.5" in out
    assert "[error] ZeroDivisionError: boom" in out


def test_a_phase_past_its_budget_stops_with_a_row_and_keeps_its_json(tmp_path, monkeypatch):
    module = load_script()
    calls = []

    def spent_inside():  # e.g. pytest still running at the deadline
        raise module.PastBudget("pytest still running")

    def phase(ph):
        ph.measure("first", lambda: calls.append(1) or ("done", {}))
        ph.deadline = 0.0  # the budget is spent now
        ph.measure("second", lambda: calls.append(2) or ("done", {}))

    monkeypatch.setitem(module.PHASES, "anchors", phase)
    report = module.Report(tmp_path / "r.json", {"device": "test"})
    module.run_phase(report, "anchors", module.Device(dry=True), module.DRY_SIZES, {}, 30.0)
    assert calls == [1]
    assert [r["status"] for r in report.rows] == ["ok", "stopped"]
    assert "past its 30 s budget" in report.rows[1]["text"]
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["phases"]["anchors"]["status"] == "stopped"
    assert "stopped" in "\n".join(module.summary(report))

    monkeypatch.setitem(module.PHASES, "tests", lambda ph: ph.measure("pytest", spent_inside))
    module.run_phase(report, "tests", module.Device(dry=True), module.DRY_SIZES, {}, 30.0)
    assert report.rows[-1]["status"] == "stopped" and "pytest still running" in \
        report.rows[-1]["text"]


def test_parse_pytest_reads_the_counts_and_the_failing_tests():
    module = load_script()
    out = """....F..s
=========================== short test summary info ============================
SKIPPED [1] tests/x.py:3: no gguf
FAILED tests/ops/test_a.py::test_b[case-1] - AssertionError: 1 != 2
ERROR tests/ops/test_c.py::test_d - RuntimeError: boom
1 failed, 314 passed, 1 skipped, 12 deselected, 1 error in 46.68s
"""
    counts, failures = module.parse_pytest(out)
    assert counts == {"failed": 1, "passed": 314, "skipped": 1, "deselected": 12, "error": 1}
    assert failures == ["tests/ops/test_a.py::test_b[case-1]", "tests/ops/test_c.py::test_d"]
    counts, _ = module.parse_pytest("3/20 tests collected (17 deselected) in 0.5s\n")
    assert counts == {"deselected": 17, "collected": 3}


def test_a_json_path_in_a_missing_folder_is_one_error_line_before_anything_runs(tmp_path):
    run = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--json",
                          str(tmp_path / "nowhere" / "r.json")], capture_output=True, text=True,
                         timeout=300, env=_env())
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and "error: --json" in run.stderr
    assert "does not exist" in run.stderr and "Traceback" not in run.stderr


def test_without_a_gpu_the_full_run_is_one_error_line_naming_the_dry_run(tmp_path):
    from tests.gpu import gpu_skip_reason

    if gpu_skip_reason() is None:
        pytest.skip("a GPU is usable here: the full run would measure")
    run = subprocess.run([sys.executable, str(SCRIPT), "--json", str(tmp_path / "r.json")],
                         capture_output=True, text=True, timeout=300, env=_env())
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.startswith("gpu_report.py: error: no usable CUDA GPU")
    assert "--dry-run" in run.stderr and run.stderr.count("\n") == 1
    assert not (tmp_path / "r.json").exists()


# ---------------------------------------------------------------- rows from made-up timings


def test_the_decode_attention_row_is_kv_bytes_over_copy_bandwidth():
    module = load_script()
    # 32768 keys x 8 kv heads x 128 x 4 bytes x (K and V) = 268.4 MB; in 100 us that is
    # 2684 GB/s, 0.671 of a 4000 GB/s copy: the 32k goal (>= 0.6) met.
    text, values = module.decode_attention_text(32768, 8, 128, {"ours": 100e-6, "v2": 535e-6},
                                                4000.0)
    assert values["kv_MB"] == 268.435456 and abs(values["kv_of_copy"] - 0.67108864) < 1e-12
    assert values["met"] is True and values["goal"] == "ours >= 0.6 of copy"
    assert "ours    100.0 us   v2    535.0 us   K/V 268.4 MB at  0.67 of copy" in text
    _, slow = module.decode_attention_text(32768, 8, 128, {"ours": 200e-6}, 4000.0)
    assert slow["met"] is False  # 0.34 of copy
    # 512 keys: the goal is the time (12 us), not the fraction; 4k keys: no goal
    _, v512 = module.decode_attention_text(512, 8, 128, {"ours": 12.5e-6}, 4000.0)
    assert v512["goal"] == "ours <= 12 us" and v512["met"] is False
    assert "goal" not in module.decode_attention_text(4096, 8, 128, {"ours": 1e-5}, 4e3)[1]
    # no copy row measured: the fraction is NaN, never a made-up number
    assert np.isnan(module.decode_attention_text(4096, 8, 128, {"ours": 1e-5}, None)[1][
        "kv_of_copy"])


def test_the_anchor_row_is_a_second_row_with_its_own_fraction():
    module = load_script()
    text, values = module.anchor_text(4096, 8, 128, {"sdpa": 205.2e-6}, 77.3e-6, 4000.0)
    # 33.55 MB in 205.2 us = 163.5 GB/s = 0.041 of copy; ours / SDPA = 77.3 / 205.2 = 0.377
    assert abs(values["sdpa_of_copy"] - 33554432 / 205.2e-6 / 4e12) < 1e-12
    assert abs(values["ours_over_sdpa"] - 77.3 / 205.2) < 1e-12
    assert "sdpa    205.2 us,  0.04 of copy, ours / sdpa  0.38" in text


def test_the_step_ratio_row_puts_graphed_beside_eager():
    module = load_script()
    # the sixth run's eager 1.94x, and a graphed decode of 7.02 ms with a 18.95 ms step: 2.70x
    text, values = module.step_ratio_text({"step_s": 0.01975, "decode_s": 0.01018},
                                          {"step_s": 0.01895, "decode_s": 0.00702})
    assert f"{values['eager_ratio']:.2f}" == "1.94" and f"{values['graphed_ratio']:.2f}" == "2.70"
    assert "= 2.70x   eager:" in text and "= 1.94x (goal graphed <= 1.5)" in text


def test_the_context_decode_row_has_both_floors():
    module = load_script()
    # 16.09 GB of weights at 4146 GB/s: a 3.881 ms floor; 36 layers x 8192 keys x 8 x 128 x 8
    # bytes = 2.416 GB of K/V. A 7.02 ms graphed step is 0.553 of the weight floor.
    kv = 36 * module.kv_bytes(8192, 8, 128)
    assert kv == 2415919104
    text, values = module.context_decode_text(8192, {"eager": 0.0102, "graphs": 0.00702},
                                              16_090_000_000, kv, 4146.0)
    assert abs(values["graphs_of_floor"] - 16.09e9 / 0.00702 / 4146e9) < 1e-12
    assert abs(values["graphs_of_floor_with_kv"] - (16.09e9 + kv) / 0.00702 / 4146e9) < 1e-12
    assert values["goal"] == "graphed >= 0.5 of the weight floor"
    assert module.context_decode_text(512, {"graphs": 0.007}, 1, 1, 1.0)[1]["goal"] == \
        "graphed >= 0.65 of the weight floor"
    assert "8192 tokens of context: eager     98.0 tok/s" in text and "K/V 2.42 GB" in text


def test_projection_rows_report_gpu_time_and_host_time_apart():
    module = load_script()
    # q_proj: 41.9 MB read in 12.5 us of GPU time = 3355 GB/s, 0.80 of 4184; host 9.0 us/call
    text, values = module.projection_text("ours", 12.5e-6, 9.0e-6, 4096 * 2560 * 4, 4184.0)
    assert "ours GPU     12.5 us  3355.4 GB/s  0.80 of copy, host    9.0 us/call;" in text
    assert values["ours_host_us"] == 9.0 and abs(values["ours_of_copy"] - 0.80196) < 1e-4


def test_the_gpu_sizes_measure_the_issues_contexts():
    module = load_script()
    assert module.GPU_SIZES.att_decode_ctxs == (512, 4096, 8192, 32768)
    assert module.GPU_SIZES.e2e_contexts == (512, 8192)
