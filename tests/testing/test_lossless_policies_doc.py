"""docs/lossless.md's policy table ("Every policy: lossless or not, and its tau") against the
artifact docs/data/lossless_policies.json that scripts/lossless_policies.py writes, and the
table's lossless column against the certificate's verdicts (tests/testing/
test_policies_certified.py). The slow test re-measures the artifact.

Seeded, but the draws follow float32 logits and BLAS may round a product differently with
another thread count: a draw near an inverse-CDF boundary can move and the run continue from
there (tests/testing/test_acceptance_by_rule.py measured 0.011 on tau over ~350 steps); here
~100-200 steps per cell, hence TAU_TOL.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from tests.testing.test_acceptance_by_rule import lossless_table

ROOT = Path(__file__).resolve().parents[2]
ARTIFACT = ROOT / "docs" / "data" / "lossless_policies.json"
TAU_TOL = 0.05  # the module docstring says why
# the script's policy -> the certificate's (tests/testing/test_policies_certified.py POLICIES)
CERTIFIED_AS = {
    "chain, argmax drafts, one-hot q": "chain, argmax drafts, one-hot q",
    "chain, v1 independent per-position sampling": "chain, v1 independent per-position sampling",
    "chain, DFlash 2 sparse q": "chain, DFlash 2 sparse q",
    "DDTree (budget 14), sample-and-match": "DDTree, sample-and-match",
    "sampled tree, widths (2,), drawn children": "sampled tree, drawn children",
    "DDTree (budget 14), min(1, p/q) over top-k children":
        "DDTree, min(1, p/q) over top-k children",
}


def script():
    """scripts/lossless_policies.py as a module, registered so its pool can pickle its cells."""
    name = "lossless_policies_script"
    if name not in sys.modules:
        path = ROOT / "scripts" / "lossless_policies.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def doc_rows() -> dict:
    """{policy: (lossless, rows, {T: tau})} as docs/lossless.md quotes it ("-" is None)."""
    temps, rows = lossless_table("policy | lossless | verify rows")
    out = {}
    for cells in rows:
        num = [None if c == "-" else float(c) for c in cells[2:]]
        out[cells[0]] = (cells[1] == "yes", num[0], dict(zip(temps, num[1:])))
    return out


def test_the_doc_table_is_the_artifact():
    # Catches a number retyped or rounded wrongly, a row dropped, a verdict flipped.
    data = json.loads(ARTIFACT.read_text())
    doc = doc_rows()
    assert set(doc) == {r["policy"] for r in data["rows"]}
    for r in data["rows"]:
        lossless, rows, taus = doc[r["policy"]]
        assert lossless == r["lossless"], r["policy"]
        if r["tau"] is None:
            assert taus[r["T"]] is None and rows is None, r["policy"]
            continue
        assert taus[r["T"]] == round(r["tau"], 2), (r["policy"], r["T"])
        if r["T"] == data["settings"]["temperatures"][0]:
            assert rows == round(r["verify_rows"], 1), r["policy"]


def test_the_prose_quotes_only_the_artifacts_taus():
    # The paragraph under the table compares taus: each one it names is a cell of the artifact.
    text = (ROOT / "docs" / "lossless.md").read_text()
    head = text.index("| policy | lossless | verify rows |")
    prose = text[head:text.index("## What each rule costs", head)]
    prose = "\n".join(ln for ln in prose.splitlines() if not ln.startswith("|"))
    taus = {f"{r['tau']:.2f}" for r in json.loads(ARTIFACT.read_text())["rows"] if r["tau"]}
    quoted = re.findall(r"\b\d\.\d\d\b", prose)
    assert quoted and set(quoted) <= taus, set(quoted) - taus


def test_the_lossless_column_is_the_certificates_verdict():
    from tests.testing.test_policies_certified import POLICIES as CERTIFIED

    module = script()
    assert set(module.POLICIES) == set(CERTIFIED_AS)
    for name, (_, lossless) in module.POLICIES.items():
        assert CERTIFIED[CERTIFIED_AS[name]][2] == lossless, name
    assert [r["policy"] for r in json.loads(ARTIFACT.read_text())["rows"]][::2] == \
        list(module.POLICIES)


@pytest.mark.slow
def test_the_artifact_is_what_the_script_measures():
    measured = script().measure()
    committed = json.loads(ARTIFACT.read_text())
    assert measured["settings"] == committed["settings"]
    for m, c in zip(measured["rows"], committed["rows"]):
        assert (m["policy"], m["T"], m["lossless"]) == (c["policy"], c["T"], c["lossless"])
        if c["tau"] is not None:
            assert m["tau"] == pytest.approx(c["tau"], abs=TAU_TOL), (c["policy"], c["T"])
            assert m["verify_rows"] == pytest.approx(c["verify_rows"], abs=0.2), c["policy"]
