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

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_report.py"
PHASES = ("env", "compile", "tests", "micro", "anchors", "e2e", "profile")
# The rows each phase must print in a dry run (hand list from the scope).
DRY_ROWS = {
    "env": ["python", "numpy", "cupy", "cuda", "device", "torch", "fla-core", "flashinfer-python"],
    "compile": ["attention", "gdn", "norm", "pager"],
    "tests": ["pytest -m gpu"],
    "micro": ["launch: bare RawKernel", "launch: op (rms_norm)", "proj tiny M=1",
              "proj tiny M=16"],
    "anchors": ["copy", "gdn chunked vs fla T=64", "gdn chunked vs fla T=128",
                "gdn chunked vs recurrent T=256", "attention decode Tq=1 Tk=32",
                "attention verify Tq=16 Tk=48", "attention prefill Tq=64 Tk=64"],
    "e2e": ["build", "check", "decode", "verify 16 vs decode 1", "speculative generate",
            "cuda graphs vs eager"],
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
