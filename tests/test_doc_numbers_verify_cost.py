"""Every number docs/spec_decode.md ("Verify that costs what it must") quotes from the Gemma 3
verify-cost log (docs/data/verify_cost_gemma3.json, scripts/verify_cost.py) is the log's number,
rounded as printed; the table is the least flattering run's. CPU only, no model loads.

The expected strings are built from the committed log, never typed twice: a log rewritten by a
new run without the doc, or a doc number edited by hand, fails here.
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOG = json.loads((ROOT / "docs" / "data" / "verify_cost_gemma3.json").read_text())
PHASES = ("draft", "verify layers", "verify head", "rollback", "rest")
DEFAULT = "lazy 1,1+layers"


def _section(heading: str) -> str:
    """docs/spec_decode.md from ``heading`` to the next ``###`` heading."""
    text = (ROOT / "docs" / "spec_decode.md").read_text()
    i = text.index(heading)
    return text[i: text.index("\n### ", i + 1)]


SECTION = _section("### Verify that costs what it must")
FLAT = " ".join(SECTION.split())  # one line: quotes may wrap anywhere


def speedup(run: dict) -> float:
    return run[DEFAULT]["tokens_per_s"] / run["eager"]["tokens_per_s"]


def forms(run: dict) -> list[str]:
    return [k for k, v in run.items() if isinstance(v, dict) and "tokens_per_s" in v]


WORST = min(LOG["runs"], key=speedup)


def test_the_table_is_the_least_flattering_runs_row_by_row():
    # Catches the table copied from a kinder run, or a phase column shifted.
    for form in forms(WORST):
        ms = WORST[form]["ms_per_step"]
        row = (f"| `{form}` | " + " | ".join(f"{ms[p]:.1f}" for p in PHASES)
               + f" | {sum(ms.values()):.1f} | {WORST[form]['tokens_per_s']:.2f} |")
        assert row in SECTION, row


def test_the_speedup_range_tau_load_and_head_costs_are_the_logs():
    ratios = sorted(speedup(r) for r in LOG["runs"])
    assert f"{ratios[0]:.2f}x to {ratios[-1]:.2f}x" in FLAT
    assert f"over the {len(LOG['runs'])} runs" in FLAT
    assert f"tau {WORST['eager']['tau']:.2f}" in FLAT
    assert f"load average {WORST['load_average_start']:.1f}" in FLAT
    c = WORST["head_ms_by_rows"]
    assert f"1 row {c[0]:.1f} ms, 2 rows {c[1]:.1f} ms, 8 rows {c[7]:.1f} ms" in FLAT
    assert f"({WORST['eager']['ms_per_step']['rollback']:.1f} ms)" in FLAT


def test_every_run_compares_the_default_with_eager_at_one_tau():
    # The forms of a run emitted the same tokens (the script writes no times otherwise), so one
    # tau; the form the doc calls the default is the rule make_verifier builds for NumPy.
    from dflash_ref.ops.sampling import SamplingParams
    from dflash_ref.spec_decode.arguments import make_verifier
    from dflash_ref.spec_decode.lazy_verify import LazyChainVerifier
    v = make_verifier("chain", SamplingParams(), "numpy")
    assert v == LazyChainVerifier(head_groups=(1, 1), layers_later=True)
    for run in LOG["runs"]:
        assert {"eager", DEFAULT} <= set(forms(run))
        assert len({round(run[f]["tau"], 9) for f in forms(run)}) == 1


# ---------------------------------------------------------------- two threads, few-row products

LOG2 = json.loads((ROOT / "docs" / "data" / "verify_cost_gemma3_2threads.json").read_text())
CUT = "cut 0.9"


SECTION2 = _section("### A few rows on a CPU")
FLAT2 = " ".join(SECTION2.split())


def test_the_two_thread_table_is_the_logs_row_by_row():
    # Catches a row copied from the one-thread run, or a phase column shifted.
    assert LOG2["blas_threads"] == 2
    for form in forms(LOG2):
        ms = LOG2[form]["ms_per_step"]
        row = (f"| `{form}` | " + " | ".join(f"{ms[p]:.1f}" for p in PHASES)
               + f" | {sum(ms.values()):.1f} | {LOG2[form]['tokens_per_s']:.2f} | "
               f"{LOG2[form]['tau']:.2f} |")
        assert row in SECTION2, row


def test_the_two_thread_head_costs_and_load_are_the_logs():
    few, gemm = LOG2["head_ms_by_rows"], LOG2["head_ms_by_rows_matrix_product"]
    assert (f"the head costs {few[0]:.1f} ms for one row and {few[1]:.1f}, {few[3]:.1f} and "
            f"{few[7]:.1f} ms for 2, 4 and 8 rows (as one matrix product: {gemm[1]:.1f}, "
            f"{gemm[3]:.1f} and {gemm[7]:.1f} ms)") in FLAT2
    assert f"load average {LOG2['load_average_start']:.1f}" in FLAT2
    lazy, whole = (sum(LOG2[f]["ms_per_step"].values()) for f in (DEFAULT, "lazy ()"))
    assert f"{lazy:.1f} ms a step against {whole:.1f} ms" in FLAT2
    assert "--threads 2" in LOG2["command"]
    assert "docs/data/verify_cost_gemma3_2threads.json" in FLAT2


def test_the_two_thread_forms_agree_on_tokens():
    # Every form but the cut accepts the same drafts, so one tau; the cut's is lower.
    taus = {round(LOG2[f]["tau"], 9) for f in forms(LOG2) if f != CUT}
    assert len(taus) == 1 and LOG2[CUT]["tau"] <= min(taus)
