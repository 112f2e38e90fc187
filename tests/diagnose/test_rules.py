"""The report's rules (dflash_ref/diagnose/rules.py) on hand-made runs with known answers.

No model runs here: each run is a made-up list of steps whose counts are chosen so that the
answer is known without the code under test (the interval values are Newcombe's published
ones; the rest is counted in the comments). The statuses are what the rules must say: a
"features unused" fault only when the data show that zeroing the features costs little, never
when it costs significantly, whatever tau is.
"""

from __future__ import annotations

import pytest

from dflash_ref.diagnose import ExplainReport
from dflash_ref.diagnose.rules import (
    Finding,
    difference,
    features_finding,
    judged,
    mask_finding,
    miss_words,
    rise_finding,
    verdict,
)
from dflash_ref.diagnose.steps import Step, acceptance_stats

B = 8


def run(*counts: tuple[int, int], rank: int = 9):
    """The numbers of a made-up run: ``(a, n)`` pairs, n steps that accepted a of 7 drafts,
    each rejection ranked ``rank`` (9: outside the top 8)."""
    steps = [Step(16 * i, B - 1, a, None if a == B - 1 else rank)
             for a, n in counts for i in range(n)]
    return acceptance_stats(steps, B)


# Newcombe (1998), Statistics in Medicine 17:873-890, Table II, method 10 (hybrid score).
NEWCOMBE = [((56, 70, 48, 80), (0.0524, 0.3339)), ((9, 10, 3, 10), (0.1705, 0.8090)),
            ((6, 7, 2, 7), (0.0582, 0.8062)), ((5, 56, 0, 29), (-0.0381, 0.1926)),
            ((0, 10, 0, 20), (-0.1611, 0.2775)), ((10, 10, 0, 20), (0.6791, 1.0000))]


@pytest.mark.parametrize(("counts", "interval"), NEWCOMBE)
def test_difference_interval_is_newcombes(counts, interval):
    # catches: a Wald interval (collapses at 0/n and n/n), a 90% quantile, l and u swapped
    d, lo, hi = difference(*counts)
    x1, n1, x2, n2 = counts
    assert d == pytest.approx(x1 / n1 - x2 / n2)
    assert (lo, hi) == pytest.approx(interval, abs=6e-5)


def test_drafts_judged_count_the_rejected_draft_not_a_full_accept():
    # 3 steps accept 0 (1 judged each), 2 accept 2 (3 judged), 1 accepts all 7 (7 judged):
    # accepted 0 + 4 + 7 = 11, judged 3 + 6 + 7 = 16; catches rejected = n_steps (a full
    # accept counted as a rejection) and accepted = sum(a + 1)
    s = run((0, 3), (2, 2), (7, 1))
    assert (s.accepted, s.rejected) == (11, 5)
    assert judged(s) == (11, 16)


def test_low_tau_drafter_whose_features_matter_is_not_unused():
    # tau 1.13: 100 steps, 13 accept one draft. Zeroed: 100 steps, none accepts (tau 1.00).
    # A fixed gap in tau (0.13 < 0.2) called this "features unused"; 13/113 vs 0/100 is a
    # significant drop (the zeroed run's upper Wilson bound is 3.7%, the baseline's lower 6.9%)
    base, zeroed = run((0, 87), (1, 13)), run((0, 100))
    assert base.tau == pytest.approx(1.13)
    f = features_finding(base, zeroed)
    assert f.status == "ok", f.text
    assert "12% -> 0%" in f.text
    r = ExplainReport(base, B, {"features zeroed": zeroed})
    assert "features unused" not in r.signatures()


def test_drafter_ignoring_its_features_is_unused():
    # 200 steps each: 160 accept 0, 40 accept 1 -> 40 of 240 judged in both runs (17%); the
    # drop is 0 with a 95% bound near 7 points, under half of 17%: unused
    base = run((0, 160), (1, 40))
    f = features_finding(base, run((0, 160), (1, 40)))
    assert f.status == "fault" and f.name == "features unused"


def test_features_on_too_few_steps_are_unclear():
    # 0 + 1 + 6 = 7 accepted of 7 + 6 = 13 judged vs 0 + 2 + 4 = 6 of 6 + 8 = 14: no
    # significant drop, and a drop of half cannot be ruled out
    f = features_finding(run((0, 3), (1, 1), (3, 2)), run((0, 4), (1, 2), (2, 2)))
    assert judged(run((0, 3), (1, 1), (3, 2))) == (7, 13)
    assert f.status == "unclear"


@pytest.mark.parametrize("n", [20, 60, 200, 1000])
@pytest.mark.parametrize("accepted_share", [0.05, 0.13, 0.5, 0.9])
def test_a_significant_drop_is_never_unused(n, accepted_share):
    # whatever tau and size: when zeroing loses every accepted draft of a run with some, the
    # finding is never the fault (catches the checks reordered so that "unused" wins)
    k = max(1, round(accepted_share * n))
    base, zeroed = run((0, n - k), (1, k)), run((0, n))
    d, lo, hi = difference(*judged(zeroed), *judged(base))
    f = features_finding(base, zeroed)
    assert f.status != "fault"
    assert (f.status == "ok") == (hi < 0)


def test_rise_needs_significance_not_a_gap():
    # the shifted run accepts 7 of 19 judged vs 6 of 18: a rise, not significant: ok
    base = run((0, 6), (1, 6))
    up = run((0, 5), (1, 7))
    f = rise_finding("layers off by one (+1)", "one higher", base, up, "fix it")
    assert judged(base) == (6, 18) and judged(up) == (7, 19)
    assert f.status == "ok", f.text  # catches a rule on the point estimate (d > 0)
    # 120 of 300 judged vs 60 of 240: significant
    big = rise_finding("layers off by one (+1)", "one higher", run((0, 120), (1, 60)),
                       run((0, 60), (1, 120)), "fix it")
    assert big.status == "fault"
    # the opposite direction (the ablation is worse) is never a fault
    assert rise_finding("RoPE base", "x", run((0, 60), (1, 120)), run((0, 120), (1, 60)),
                        "f").status == "ok"
    assert rise_finding("RoPE base", "x", base, None, "f").status == "n/a"


def test_signatures_from_a_hand_report():
    base = run((0, 120), (1, 60))  # 60 of 240 judged
    r = ExplainReport(base, B, {"features zeroed": run((0, 180)),  # 0 of 180: used
                                "layers -1": run((0, 150), (1, 30)),  # lower: no
                                "layers +1": run((0, 60), (1, 120)),  # 120 of 300: higher
                                "RoPE base = target's": None},
                      checks=[("mask token id", "ok", "4 is the added token '<mask>'")])
    assert r.signatures() == ["layers off by one (+1)"]
    statuses = {f.name: f.status for f in r.findings()}
    assert statuses == {"features unused": "ok", "layers off by one (-1)": "ok",
                        "layers off by one (+1)": "fault", "RoPE base": "n/a",
                        "mask token": "ok", "misses": "info"}
    r.extra.append(Finding("template mismatch", "fault", "planted"))
    assert r.signatures() == ["layers off by one (+1)", "template mismatch"]


def test_mask_warning_is_a_fault():
    assert mask_finding([("mask token id", "warn", "32 is an ordinary token")]).status == "fault"
    assert mask_finding([("mask token id", "info", "4")]).status == "info"
    assert mask_finding([]).status == "n/a"


def test_miss_classes_in_words():
    # 4 rejections: ranks 1, 1, 5, 20 -> second choice 2, in top 8 1, absent 1
    steps = [Step(0, 7, 0, 1), Step(1, 7, 2, 1), Step(2, 7, 0, 5), Step(3, 7, 1, 20)]
    f = miss_words(acceptance_stats(steps, B))
    assert f.text.startswith("of 4 rejections, in 2 (50%) the target's token was the "
                             "drafter's second choice")
    assert "in 1 (25%) it was ranked 3rd to 8th" in f.text
    assert "in 1 (25%) it was outside the drafter's top 8" in f.text


def test_verdict_names_the_dominant_miss_class():
    # all 100 misses outside the top 8 (rank 9): the drafter has not learned this text
    base = run((0, 87), (1, 13))
    text = verdict(base, B, [])
    assert text.startswith("tau 1.13 of a possible 8: 12% of the drafts")
    assert "tokens the drafter does not rank in its top 8" in text
    # second choice everywhere: near misses
    assert "near misses" in verdict(run((0, 10), rank=1), B, [])
    # exactly half absent, half second choice: no majority (catches >= for >)
    half = acceptance_stats([Step(0, 7, 0, 1), Step(1, 7, 0, 9)], B)
    assert "spread over near and far ranks" in verdict(half, B, [])


def test_verdict_leads_with_a_fault():
    text = verdict(run((0, 10)), B, [Finding("RoPE base", "fault", "x")])
    assert "point at RoPE base: fix that first" in text


def test_summary_ends_with_findings_and_verdict():
    base, zeroed = run((0, 87), (1, 13)), run((0, 100))
    text = ExplainReport(base, B, {"features zeroed": zeroed}).summary()
    assert "13 of 113 drafts judged accepted" in text
    assert "ablation features zeroed        tau 1.00 (-0.13), 0 of 100 accepted (0%)" in text
    assert "  ok      features unused: zeroing the features lowers" in text
    assert "signatures: none" in text
    assert "verdict: tau 1.13 of a possible 8" in text
