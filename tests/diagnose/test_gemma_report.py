"""docs/acceptance.md's Gemma 3 270M report against its committed output.

``docs/explain_gemma3_270m.txt`` is what the command quoted in the doc printed (stdout, the
report and its time line); ``docs/explain_gemma3_270m_time.txt`` holds the CPU figures GNU time
gave for it. The doc must show that output verbatim and quote only numbers found there, and the
output's findings must be what today's rules say of the counts it prints (a stale report, one
written by older rules, fails here). No model runs.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from dflash_ref.diagnose.rules import features_finding, miss_words
from dflash_ref.diagnose.steps import Step, acceptance_stats

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "acceptance.md"
OUTPUT = ROOT / "docs" / "explain_gemma3_270m.txt"
TIME = ROOT / "docs" / "explain_gemma3_270m_time.txt"
SECTION = "## On a real model: Gemma 3 270M and its drafter"


def _section() -> str:
    text = DOC.read_text()
    rest = text[text.index(SECTION):]
    return rest[:rest.find("\n## ", 1)] if "\n## " in rest[1:] else rest  # to the next section


def _counts(line: str, tail: str) -> tuple[int, int]:
    x, n = re.search(r"(\d+) of (\d+) " + tail, line).groups()
    return int(x), int(n)


def _run(accepted: int, judged: int, B: int = 8):
    """A made-up run with these counts: every step rejects one draft (judged = accepted +
    steps), the accepted ones spread over the steps as evenly as they go."""
    steps = judged - accepted
    q, r = divmod(accepted, steps)
    return acceptance_stats([Step(i, B - 1, q + int(i < r), 9) for i in range(steps)], B)


def test_the_doc_shows_the_committed_output():
    block = _section().split("Its output")[1].split("```\n")[1]  # the fence after the words
    assert block.rstrip("\n") == OUTPUT.read_text().rstrip("\n")


def test_the_doc_quotes_the_command_that_made_it():
    cmd = _section().split("```bash\n")[1].split("```")[0]
    for part in ("dflash-ref explain --target", "--drafter dflash_ref/data/gemma3_270m_drafter",
                 '--text "def read_rows(path):"', '--text "class Stack:"', '--text "import os"',
                 "--max-new-tokens 32"):
        assert part in cmd, part


def test_the_findings_are_todays_rules_on_its_counts():
    out = OUTPUT.read_text()
    base = _counts(out.splitlines()[0], "drafts judged accepted")
    zeroed_line = next(ln for ln in out.splitlines() if ln.startswith("ablation features zeroed"))
    zeroed = _counts(zeroed_line, "accepted")
    f = features_finding(_run(*base), _run(*zeroed))
    shown = textwrap.fill(f.line(), 100, initial_indent="  ", subsequent_indent=" " * 10)
    assert shown in out
    assert f.status != "fault"  # the shipped drafter reads its features


def test_the_miss_words_match_its_classes():
    out = OUTPUT.read_text()
    misses = re.search(r"misses: +second choice (\d+), in top 8 (\d+), absent (\d+)", out)
    ranks = [1] * int(misses[1]) + [3] * int(misses[2]) + [9] * int(misses[3])
    s = acceptance_stats([Step(i, 7, 0, r) for i, r in enumerate(ranks)], 8)
    shown = textwrap.fill(miss_words(s).line(), 100, initial_indent="  ",
                          subsequent_indent=" " * 10)
    assert shown in out


# each number the doc's prose quotes, as it appears in the output (or GNU time's figures)
QUOTES = ["tau 2.02", "47 of 91 drafts judged accepted", "7 of 93", "tau 1.08", "14 (32%)",
          "13 (30%)", "17 (39%)", "3 prompts x 32 tokens", "13 s", "tokenizer 3 s",
          "baseline 4 s", "features zeroed 3 s", "User time (seconds): 19.60",
          "System time (seconds): 1.61", "Percent of CPU this job got: 158%"]


@pytest.mark.parametrize("quote", QUOTES)
def test_the_prose_quotes_only_the_outputs_numbers(quote):
    prose = re.sub(r"\s+", " ", _section().split("```")[-1])  # after the output's block
    said = quote
    assert said in prose, quote
    assert quote in OUTPUT.read_text() + TIME.read_text(), quote


def test_the_cpu_minutes_are_the_sum_of_gnu_times_figures():
    t = TIME.read_text()
    user = float(re.search(r"User time \(seconds\): ([\d.]+)", t)[1])
    system = float(re.search(r"System time \(seconds\): ([\d.]+)", t)[1])
    assert f"about {(user + system) / 60:.1f} minutes of CPU" in re.sub(r"\s+", " ", _section())
