"""Timed runs come after an untimed warm-up of every path they take (issue 27, item 6).

On a GPU the first call of a path compiles and loads its kernels; the demo once timed that inside
its plain run and printed a 9.34x "speedup". These tests spy on ``generate`` (CPU) and check the
order of calls: the warm-up's plain and speculative runs come first, then the timed ones.
"""

from __future__ import annotations

import dflash_ref.spec_decode.loop as loop
import dflash_ref.spec_decode.warmup as warmup
from dflash_ref.cli import main


def _spy(monkeypatch):
    calls = []
    real = loop.generate

    def spy(target, drafter, prompt, max_new_tokens, **kwargs):
        calls.append(("speculative" if drafter is not None else "plain", max_new_tokens))
        return real(target, drafter, prompt, max_new_tokens, **kwargs)

    monkeypatch.setattr(loop, "generate", spy)
    monkeypatch.setattr(warmup, "generate", spy)
    return calls


def test_demo_warms_both_modes_up_before_it_times_them(monkeypatch, capsys):
    calls = _spy(monkeypatch)
    assert main(["demo", "--max-new-tokens", "40"]) == 0
    block = 8  # the shipped drafter's block size (dflash_ref/data/demo/drafter/config.json)
    warm = warmup.WARM_UP_BLOCKS * block + 1
    assert calls == [("plain", warm), ("speculative", warm), ("plain", 40), ("speculative", 40)]
    assert "untimed warm-up" in capsys.readouterr().out


def test_warm_up_without_a_drafter_runs_the_plain_path_only(monkeypatch):
    from dflash_ref.cli import demo_dirs
    from dflash_ref.models.target import TargetModel

    calls = _spy(monkeypatch)
    target = TargetModel.from_pretrained(demo_dirs()[0])
    warmup.warm_up(target, None, [65, 66, 67])
    assert calls == [("plain", warmup.WARM_UP_BLOCKS + 1)]


def test_demo_with_graphs_captures_in_the_warm_up_and_replays_in_the_timed_runs(monkeypatch,
                                                                              capsys):
    # One graphed state for all four runs: its steps are captured while warming up (NumPy: the
    # first step function of each shape kept), so the timed runs only replay them.
    from dflash_ref.models.graphs import StepGraphs

    captured_at = []
    real = StepGraphs.run

    def run(self, key, step):
        if key not in self.captured:
            captured_at.append(len(calls))
        return real(self, key, step)

    calls = _spy(monkeypatch)
    monkeypatch.setattr(StepGraphs, "run", run)
    assert main(["demo", "--graphs", "--max-new-tokens", "24"]) == 0
    out = capsys.readouterr().out
    assert "identical output: yes" in out and "; CUDA graphs" in out
    assert captured_at and max(captured_at) <= 2  # during the two warm-up runs
    assert [c[0] for c in calls] == ["plain", "speculative", "plain", "speculative"]


def test_demo_refuses_graphs_with_a_tree_verify(capsys):
    assert main(["demo", "--graphs", "--verify", "tree"]) == 2
    assert "--graphs needs --verify chain" in capsys.readouterr().err
