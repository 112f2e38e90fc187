"""The report's rules: what ``dflash-ref explain``'s numbers mean, as named findings in words.

Each rule compares two runs by their **drafts judged**: a spec step that accepts ``a`` drafts and
rejects the next one judged ``a + 1`` drafts (``a`` after a full accept), so over a run the
acceptance per draft judged is ``accepted / (accepted + rejected)``: the chance that a draft
which the verifier reached was accepted, pooled over the block positions (under a constant rate
per position it is that rate's maximum-likelihood estimate). Unlike a fixed gap in tau, this is
sound at every tau: a drafter at tau 1.13 accepts 13 drafts per 100 steps, and losing them all
(tau 1.00) is a clear drop.

Two runs are compared by the difference of these proportions and its 95% interval (Newcombe's
hybrid score interval, method 10 of Newcombe 1998, *Statistics in Medicine* 17:873-890: exact
enough at 0 and 1, where a Wald interval collapses):

- **features unused** (fault): zeroing the features leaves acceptance where it was, and the
  interval shows it: the largest drop the data allow is under half the baseline's acceptance.
  A significant drop (the interval above 0) is the opposite finding (ok); anything in between is
  "unclear" (too few drafts judged to tell). No rule calls a drafter's features unused when
  zeroing them lowers acceptance significantly.
- **layers off by one (-1 / +1)** (fault): capturing every feature layer one lower / higher
  raises acceptance significantly (the interval of ablation minus baseline above 0).
- **RoPE base** (fault): the drafter run with the target's RoPE base accepts significantly more.
- **mask token** (fault): the mask-id configuration check warns.

:func:`miss_words` says the miss classes of :mod:`~dflash_ref.diagnose.steps` in words, and
:func:`verdict` is the one-paragraph "what this means".
"""

from __future__ import annotations

from dataclasses import dataclass
from math import sqrt

from dflash_ref.diagnose.steps import TOP_K, AcceptanceNumbers

Z = 1.959963984540054
"""The two-sided 95% normal quantile."""

UNUSED_SHARE = 0.5
"""Features are "unused" when the largest drop the data allow is under this share of the
baseline's acceptance per draft judged."""

STATUSES = ("fault", "unclear", "ok", "n/a", "info")


@dataclass(frozen=True)
class Finding:
    """One named finding: ``status`` is one of :data:`STATUSES`; a "fault" names a signature."""

    name: str
    status: str
    text: str

    def line(self) -> str:
        return f"{self.status:7s} {self.name}: {self.text}"


def judged(s: AcceptanceNumbers) -> tuple[int, int]:
    """(drafts accepted, drafts judged) of a run (module docstring)."""
    return s.accepted, s.accepted + s.rejected


def rate(s: AcceptanceNumbers) -> float:
    """Acceptance per draft judged (0 when none was judged)."""
    x, n = judged(s)
    return x / n if n else 0.0


def wilson(x: int, n: int) -> tuple[float, float]:
    """Wilson's 95% score interval of the proportion x / n."""
    p, c = x / n, Z * Z
    mid = (p + c / (2 * n)) / (1 + c / n)
    half = Z * sqrt(p * (1 - p) / n + c / (4 * n * n)) / (1 + c / n)
    return mid - half, mid + half


def difference(x1: int, n1: int, x2: int, n2: int) -> tuple[float, float, float]:
    """``x1/n1 - x2/n2`` and its 95% interval (Newcombe's hybrid score, method 10)."""
    p1, p2 = x1 / n1, x2 / n2
    l1, u1 = wilson(x1, n1)
    l2, u2 = wilson(x2, n2)
    d = p1 - p2
    return d, d - sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)


def _pct(p: float) -> str:
    return f"{100 * p:.0f}%"


def _compare(base: AcceptanceNumbers, other: AcceptanceNumbers) -> tuple[float, float, float]:
    """``other``'s acceptance per draft judged minus ``base``'s, with its 95% interval."""
    return difference(*judged(other), *judged(base))


def _moved(base, other) -> str:
    d, lo, hi = _compare(base, other)
    return (f"acceptance per draft judged {_pct(rate(base))} -> {_pct(rate(other))} "
            f"({100 * d:+.0f} points, 95% CI {100 * lo:+.0f} to {100 * hi:+.0f})")


def features_finding(base: AcceptanceNumbers, zeroed: AcceptanceNumbers | None) -> Finding:
    """"features unused" (module docstring)."""
    name = "features unused"
    if zeroed is None:
        return Finding(name, "n/a", "the features-zeroed ablation did not run")
    if judged(base)[1] == 0 or judged(zeroed)[1] == 0:
        return Finding(name, "unclear", "no draft was judged in one of the runs")
    d, lo, hi = _compare(base, zeroed)
    moved = _moved(base, zeroed)
    if hi < 0:
        return Finding(name, "ok", f"zeroing the features lowers {moved}: the drafter reads "
                                   f"the target's hidden states")
    if -lo < UNUSED_SHARE * rate(base):
        return Finding(name, "fault", f"zeroing the features leaves {moved}: the drafter does "
                                      f"not use the target's hidden states (check that they "
                                      f"reach it: fc, the layer ids, the capture)")
    return Finding(name, "unclear", f"zeroing the features changes {moved}, within what "
                                    f"chance allows: too few drafts judged to tell; run more "
                                    f"prompts or tokens")


def rise_finding(name: str, what: str, base: AcceptanceNumbers,
                 other: AcceptanceNumbers | None, fix: str, moot: str = "") -> Finding:
    """A fault when the run with ``what`` changed accepts significantly more than ``base``;
    "n/a" (saying ``moot``) when there was nothing to change (``other`` None)."""
    if other is None:
        return Finding(name, "n/a", moot or f"{what}: nothing to change")
    if judged(base)[1] == 0 or judged(other)[1] == 0:
        return Finding(name, "unclear", "no draft was judged in one of the runs")
    d, lo, hi = _compare(base, other)
    moved = _moved(base, other)
    if lo > 0:
        return Finding(name, "fault", f"{what} raises {moved}: {fix}")
    return Finding(name, "ok", f"{what} does not raise acceptance significantly ({moved})")


def mask_finding(checks) -> Finding:
    """"mask token": the mask-id check's status, in words."""
    for n, status, msg in checks:
        if n == "mask token id":
            if status == "warn":
                return Finding("mask token", "fault", f"{msg}: the drafter reads its block's "
                                                      f"masks as text")
            return Finding("mask token", "ok" if status == "ok" else "info", msg)
    return Finding("mask token", "n/a", "not checked")


MISS_WORDS = {
    "second choice": "the target's token was the drafter's second choice (a near miss)",
    f"in top {TOP_K}": f"it was ranked 3rd to {TOP_K}th by the drafter",
    "absent": f"it was outside the drafter's top {TOP_K} (the drafter did not consider it)",
}
"""Each miss class of :func:`~dflash_ref.diagnose.steps.acceptance_stats` in words."""


def miss_words(s: AcceptanceNumbers) -> Finding:
    """The rejections by class, in words."""
    total = sum(s.misses.values())
    if total == 0:
        return Finding("misses", "info", "no draft was rejected")
    parts = [f"in {n} ({_pct(n / total)}) {MISS_WORDS[k]}" for k, n in s.misses.items() if n]
    return Finding("misses", "info", f"of {total} rejections, " + "; ".join(parts))


def _dominant_miss(s: AcceptanceNumbers) -> str | None:
    """The miss class holding more than half of the rejections, if one does."""
    total = sum(s.misses.values())
    top = max(s.misses, key=s.misses.get)
    return top if total and 2 * s.misses[top] > total else None


MISS_MEANING = {
    "second choice": "most misses are the drafter's second choice: near misses, which a tree "
                     "verify (--verify tree) would recover",
    f"in top {TOP_K}": f"most misses are ranked 3rd to {TOP_K}th: the drafter is close but "
                       f"unsure; a wider tree or more training helps",
    "absent": f"most misses are tokens the drafter does not rank in its top {TOP_K}: it has not "
              f"learned to predict this text (out of its training domain, or too little "
              f"training), which no wiring fix or tree verify recovers",
}


def verdict(s: AcceptanceNumbers, block_size: int, findings: list[Finding]) -> str:
    """"What this means": one paragraph from the findings and the miss classes."""
    faults = [f.name for f in findings if f.status == "fault"]
    out = [f"tau {s.tau:.2f} of a possible {block_size}: {_pct(rate(s))} of the drafts the "
           f"verifier judged were accepted."]
    if faults:
        out.append(f"The numbers point at {', '.join(faults)}: fix that first; every other "
                   f"number here is measured with the fault in place.")
    top = _dominant_miss(s)
    if top is not None:
        out.append(MISS_MEANING[top][0].upper() + MISS_MEANING[top][1:] + ".")
    elif sum(s.misses.values()):
        out.append("The misses are spread over near and far ranks: no single cause dominates.")
    feats = {f.name: f for f in findings}.get("features unused")
    if feats is not None and feats.status == "ok" and not faults:
        out.append("The features reach the drafter and it uses them.")
    elif feats is not None and feats.status == "unclear":
        out.append("Whether the drafter uses its features cannot be told from this many "
                   "drafts: run more prompts.")
    return " ".join(out)
