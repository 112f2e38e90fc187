"""docs/architecture.md, "The numbers", quotes scripts/architecture_numbers.py: check every "now"
cell against a fresh measurement, so the page cannot drift from the code it describes."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROW = re.compile(r"^\|[^|]*\(`(\w+)`\)[^|]*\|[^|]*\|[^|]*\|\s*([^|]+?)\s*\|$", re.M)


def _script():
    spec = importlib.util.spec_from_file_location(
        "architecture_numbers", ROOT / "scripts/architecture_numbers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _quoted() -> dict[str, str]:
    doc = (ROOT / "docs/architecture.md").read_text()
    section = doc[doc.index("## The numbers"):]
    section = section[: section.find("\n## ", 1)] if "\n## " in section[1:] else section
    return dict(ROW.findall(section))


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
