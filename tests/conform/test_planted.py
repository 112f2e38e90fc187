"""``conform`` against the demo test server (tests/conform/server.py): the correct server passes,
each planted bug (tests/conform/planted.py) is flagged by the sampled law, at the N used here.

**The CI settings.** Held-out prompt 11's first 46 ids: under T = 1, top-p 0.8 its first token is
certain (the nucleus holds one token), so every completion tests the first speculative step, and
its next token is uncertain with a drafter that is neither right nor wrong (acceptance ~0.7). The
first 3 tokens are judged, 3 asked per request (llama-server's draft window then drafts one
token at the first step). N = 200 completions per bug; ``top_p_after_ratio`` spreads its change
to the law over several cells, below the bias detectable at 200 (0.13), and is flagged at
N = 600, which the correct server is also run at (detectable bias 0.08).

**False alarms.** The correct server's run makes 3 statistical tests at alpha = 1e-3 (chi-square
and max deviation of one sampled policy, and its acceptance z-test): a correct server fails with
probability at most 3e-3 (Bonferroni); with fixed seeds the outcome here is reproducible.
"""

from __future__ import annotations

import json

import pytest

from dflash_ref.backend import limit_blas_threads
from dflash_ref.oracle.conform_http import ServerClient
from dflash_ref.oracle.conform_reference import ModelReference
from dflash_ref.testing.conform import ConformSettings, Policy, run_conform
from tests.conform.planted import BUGS
from tests.conform.server import DEMO, DemoServer, demo_pair

PROMPT = tuple(json.loads((DEMO / "held_out_prompts.json").read_text())["prompts"][11][:46])
POLICY = Policy(1.0, top_p=0.8)
N_CI = {bug: 200 for bug in BUGS} | {"top_p_after_ratio": 600}
N_CORRECT = 600


def settings(n: int) -> ConformSettings:
    return ConformSettings((PROMPT,), (Policy(), POLICY), n=n, length=3, n_predict=3,
                           acceptance_runs=50)


@pytest.fixture(scope="module")
def reference():
    with limit_blas_threads():
        target, drafter = demo_pair()
        yield ModelReference(target, drafter)


def conform(bug, n, reference, api="native"):
    with limit_blas_threads(), DemoServer(bug) as url:
        return run_conform(ServerClient(url, api), reference, settings(n))


def test_the_correct_server_passes(reference):
    report = conform(None, N_CORRECT, reference)
    assert report.holds, report.table()
    assert [c.check for c in report.checks] == ["greedy prompt 0", "acceptance", "sampled",
                                                "acceptance"]
    assert report.false_alarm_bound == pytest.approx(3e-3)  # the rate the docstring states
    sampled = report.checks[2].detail
    assert round(sampled["detectable_bias"], 2) == 0.08  # docs/conformance.md quotes it


@pytest.mark.parametrize("bug", BUGS)
def test_each_planted_bug_is_flagged_by_the_law(bug, reference):
    report = conform(bug, N_CI[bug], reference)
    sampled = next(c for c in report.checks if c.check == "sampled")
    assert not report.holds
    assert not sampled.holds, report.table()  # the law itself, not only the draft counts
    assert "FAILS" in report.table() and "NOT CONFORMANT" in report.table()


def test_the_openai_api_answers_the_same(reference):
    with limit_blas_threads(), DemoServer(None) as url:
        s = ConformSettings((PROMPT,), (Policy(),), n_predict=8)
        native = run_conform(ServerClient(url, "native"), reference, s)
        openai = run_conform(ServerClient(url, "openai"), reference, s)
    assert native.holds and openai.holds
    assert native.checks[0].detail["tokens"] == openai.checks[0].detail["tokens"]


def test_off_by_one_is_a_greedy_divergence_too(reference):
    with limit_blas_threads(), DemoServer("off_by_one") as url:
        report = run_conform(ServerClient(url), reference,
                             ConformSettings((PROMPT,), (Policy(),), n_predict=16))
    greedy = report.checks[0]
    assert not greedy.holds and greedy.detail["divergences"][0]["margin"] > 0.1
