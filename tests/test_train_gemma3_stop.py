"""scripts/train_gemma3_drafter.py's ``stop_on_signal``: the first Ctrl-C or SIGTERM asks the
training loop to validate and save at its next step; a second Ctrl-C interrupts at once."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_the_first_signal_sets_the_stop_and_the_second_is_the_default(sig, capsys):
    pytest.importorskip("torch", reason="the training script needs torch (the train extra)")
    sys.path.insert(0, str(ROOT / "scripts"))
    import train_gemma3_drafter as script

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        stop = script.stop_on_signal()
        assert not stop.is_set()
        signal.raise_signal(sig)
        assert stop.is_set()
        assert signal.getsignal(sig) == signal.SIG_DFL  # a second one is not caught
        assert "the next step validates and saves" in capsys.readouterr().out
    finally:
        for s, h in before.items():
            signal.signal(s, h)
