"""Every number docs/spec_decode.md ("Verify that costs what it must", "A few rows on a CPU",
"When a step pays") quotes from the Gemma 3 verify-cost logs (docs/data/verify_cost_gemma3*.json,
scripts/verify_cost.py) is the log's number, rounded as printed; the first table is the least
flattering run's; the break-even model's numbers are refitted from its log by
dflash_ref.spec_decode.break_even. CPU only, no model loads.

The expected strings are built from the committed log, never typed twice: a log rewritten by a
new run without the doc, or a doc number edited by hand, fails here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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


# ---------------------------------------------------------------- the break-even model

LOG3 = json.loads((ROOT / "docs" / "data" / "verify_cost_gemma3_model.json").read_text())
MODEL = LOG3["model"]
SECTION3 = _section("### When a step pays: the break-even model")
FLAT3 = " ".join(SECTION3.split())


def _x(v: float) -> str:
    return f"{v:.2f}x"


def test_the_model_table_is_the_logs_row_by_row():
    # Catches a row copied from another run, a model column swapped with a measured one, or a
    # break-even tau typed by hand.
    for name, f in MODEL["forms"].items():
        label = f"`{name}` (`verify=\"chain\"`)" if name == DEFAULT else f"`{name}`"
        measured = ((f"{f['measured_step_ms']:.1f} ms", _x(f["measured_speedup"]))
                    if "measured_step_ms" in f else ("-", "-"))
        row = (f"| {label} | {f['step_ms']:.1f} ms | {measured[0]} | {_x(f['speedup'])} | "
               f"{measured[1]} | {f['break_even_tau']:.2f} | {f['tau_for_1.3x']:.2f} | "
               f"{_x(f['speedup_at_tau']['2.5'])} |")
        assert row in SECTION3, row
    for cut in ("cut 0.9", "cut 0.7"):
        step = sum(LOG3[cut]["ms_per_step"].values())
        speed = LOG3[cut]["tokens_per_s"] / LOG3["plain"]["tokens_per_s"]
        assert f"| `{cut}` | - | {step:.1f} ms | - | {_x(speed)} | - | - | - |" in SECTION3


def test_the_model_refits_from_the_logged_costs_and_accepts():
    # The model's numbers are dflash_ref's break_even on the logged costs: catches a log whose
    # "model" was edited, or a model that changed since the run without a new log.
    from dflash_ref.spec_decode import break_even as be
    c = MODEL["costs"]
    costs = be.RowCosts(tuple(c["layers"]), tuple(c["head"]), c["draft"], c["rest"], c["plain"])
    law = be.measured_law(MODEL["eager_accepts"], len(c["layers"]))
    forms = {"eager": be.EAGER, DEFAULT: be.Form("lazy", (1, 1), True),
             "lazy ()": be.Form("lazy", (), False), "oracle": be.ORACLE}
    for name, form in forms.items():
        f = MODEL["forms"][name]
        assert be.speedup(costs, form, law) == pytest.approx(f["speedup"], rel=1e-9)
        assert be.break_even_tau(costs, form, 1.0) == pytest.approx(f["break_even_tau"],
                                                                    rel=1e-6)
        assert be.break_even_tau(costs, form, 1.3) == pytest.approx(f["tau_for_1.3x"], rel=1e-6)
    assert be.law_tau(law) == pytest.approx(MODEL["tau"])
    assert LOG3["model"]["costs"]["layers"] == LOG3["loop_ms_by_rows"]["layers"]


def test_the_model_costs_and_claims_are_the_logs():
    c, f = MODEL["costs"], MODEL["forms"]
    L, H = c["layers"], c["head"]
    assert (f"L(1) {L[0]:.1f} ms and H(1) {H[0]:.1f} ms; L(2) {L[1]:.1f} and H(2) {H[1]:.1f}; "
            f"L(8) {L[7]:.1f} and H(8) {H[7]:.1f}), D {c['draft']:.1f} ms, R {c['rest']:.1f} ms, "
            f"P {c['plain']:.1f} ms") in FLAT3
    assert f"accept counts (tau {MODEL['tau']:.2f})" in FLAT3
    added = max(L[r] + H[r] - L[r - 1] - H[r - 1] for r in range(1, len(L)))
    assert added < 0.5 * c["plain"] and "every added row costs under half a plain token" in FLAT3
    assert f"load average {LOG3['load_average_start']:.1f}" in FLAT3
    worst = max(abs(v["step_ms"] / v["measured_step_ms"] - 1) for v in f.values()
                if "measured_step_ms" in v)
    assert worst < 0.05 and "within 5% of every measured step" in FLAT3
    assert f"eager step's own rest is {LOG3['eager']['ms_per_step']['rest']:.1f} ms" in FLAT3
    lazy, eager, oracle = f[DEFAULT], f["eager"], f["oracle"]
    assert (f"needs {lazy['break_even_tau']:.2f} for parity and {lazy['tau_for_1.3x']:.2f} "
            f"for 1.3x") in FLAT3
    assert (f"pays from {eager['break_even_tau']:.2f} and reaches 1.3x at "
            f"{eager['tau_for_1.3x']:.2f}") in FLAT3
    at = (eager["speedup_at_tau"]["2.5"], lazy["speedup_at_tau"]["2.5"])
    assert max(at) < 1 and f"({_x(at[0])}, {_x(at[1])})" in FLAT3
    assert (f"pay from tau {oracle['break_even_tau']:.2f} and, at this drafter's acceptance, "
            f"run at {_x(oracle['speedup'])}") in FLAT3
    cuts = [LOG3[k]["tokens_per_s"] / LOG3["plain"]["tokens_per_s"] for k in ("cut 0.9", "cut 0.7")]
    assert f"reach {_x(cuts[0])} (p_min 0.9) and {_x(cuts[1])} (p_min 0.7)" in FLAT3
    assert ("--prompts 16 --eval-prompts --threads 2" in LOG3["command"]
            and "docs/data/verify_cost_gemma3_model.json" in FLAT3)


def test_docs_training_quotes_the_model():
    text = (ROOT / "docs" / "training.md").read_text()
    flat = " ".join(text[text.index("## What it would take"):].split())
    f = MODEL["forms"]
    lazy, eager, oracle = f[DEFAULT], f["eager"], f["oracle"]
    at = (eager["speedup_at_tau"]["2.5"], lazy["speedup_at_tau"]["2.5"])
    cut = LOG3["cut 0.9"]["tokens_per_s"] / LOG3["plain"]["tokens_per_s"]
    for claim in (
            f"default chain pays from tau {lazy['break_even_tau']:.2f} and reaches 1.3x from "
            f"{lazy['tau_for_1.3x']:.2f}, one forward of the whole block (`ChainVerifier`) from "
            f"{eager['break_even_tau']:.2f} and {eager['tau_for_1.3x']:.2f}",
            f"slower than plain decoding ({_x(at[0])}, {_x(at[1])})",
            f"its 1.3x takes a tau of about {eager['tau_for_1.3x']:.1f} with the whole block",
            f"would pay from tau {oracle['break_even_tau']:.2f} and run at "
            f"{_x(oracle['speedup'])} with this drafter's acceptance",
            f"runs at {_x(cut)} in that run (p_min 0.9)"):
        assert claim in flat, claim


def test_the_readme_quotes_the_model():
    flat = " ".join((ROOT / "README.md").read_text().split())
    f = MODEL["forms"]
    assert (f"the whole block pays from a tau of {f['eager']['break_even_tau']:.2f} (one forward) "
            f"or {f[DEFAULT]['break_even_tau']:.2f} (generate's default lazy rows)") in flat
    assert f"would already run at {_x(f['oracle']['speedup'])}" in flat
