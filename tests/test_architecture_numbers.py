"""docs/architecture.md, "The numbers", quotes scripts/architecture_numbers.py: check every "now"
cell (a row's last) against a fresh measurement, and the line counts of the reading order's
tiers, so the page cannot drift from the code it describes."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROW = re.compile(r"^\|[^|\n]*\(`(\w+)`\)[^|\n]*\|(?:[^|\n]*\|)*?\s*([^|\n]+?)\s*\|$", re.M)
TIER = re.compile(r"^### Tier (\d): [^\n]*\((absent|\d+ lines)\)$", re.M)


def _script():
    spec = importlib.util.spec_from_file_location(
        "architecture_numbers", ROOT / "scripts/architecture_numbers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _section(title: str) -> str:
    doc = (ROOT / "docs/architecture.md").read_text()
    section = doc[doc.index(f"## {title}"):]
    return section[: section.find("\n## ", 1)] if "\n## " in section[1:] else section


def _quoted() -> dict[str, str]:
    return dict(ROW.findall(_section("The numbers")))


def test_the_page_quotes_every_measured_number():
    script = _script()
    quoted = _quoted()
    numbers = script.measure()
    assert set(quoted) == set(numbers), (
        f"rows missing from the page: {sorted(set(numbers) - set(quoted))}; "
        f"rows the script does not measure: {sorted(set(quoted) - set(numbers))}")
    wrong = {k: (quoted[k], script.cell(v)) for k, v in numbers.items()
             if quoted[k] != script.cell(v)}
    assert not wrong, f"page vs measurement (quoted, measured): {wrong}"


def test_the_row_pattern_reads_a_hand_made_table():
    table = ("| measure | a | b | now |\n|---|---|---|---|\n"
             "| functions (`plain_greedy`) | 69 in 16 files | 91 in 20 files | 60 in 15 files |\n")
    assert ROW.findall(table) == [("plain_greedy", "60 in 15 files")]
    table = ("| measure | a | b | c | now |\n|---|---|---|---|---|\n"
             "| calls (`spec_step_calls`) | (later) | 9 | 761 in 24 files | 40 in 9 files |\n")
    assert ROW.findall(table) == [("spec_step_calls", "40 in 9 files")]


def test_the_reading_order_quotes_each_tiers_lines():
    script = _script()
    lines = script.tier_numbers()["tier_lines"]
    quoted = {int(t): n for t, n in TIER.findall(_section("Reading order for a newcomer"))}
    measured = {t: "absent" if t == 0 and not n else f"{n} lines" for t, n in lines.items()}
    assert quoted == measured, f"tiers' lines (quoted, measured): {quoted}, {measured}"
