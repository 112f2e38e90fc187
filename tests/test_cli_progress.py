"""No silent wait on the command line: on a terminal, ``generate`` and ``demo`` say on stderr
what is loading, with a progress bar while weights are read; in a pipe stderr stays empty. And
generate's tok/s comes from its one run, after the first step (no untimed warm-up run).

The terminal is a real pseudo-terminal (``pty``) holding the child's stderr; the pipe is a
plain ``subprocess.PIPE``. The tiny checkpoints load in well under a second, so the tests look
for the lines and the bar, not for how long they stay.
"""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from dflash_ref.tiny import write_tiny_drafter, write_tiny_target

ROOT = Path(__file__).resolve().parents[1]
tokenizers = pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    root = tmp_path_factory.mktemp("progress")
    t = write_tiny_target(root / "t", "qwen3", seed=5)
    d = write_tiny_drafter(root / "d", t, seed=6)
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(256)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.save(str(t / "tokenizer.json"))
    wide = write_tiny_target(root / "wide_t", "qwen3", seed=7, hidden_size=96)
    write_tiny_drafter(root / "wide_d", wide, seed=8)
    return t, d


def _cmd(*argv) -> list[str]:
    return [sys.executable, "-m", "dflash_ref.cli", *map(str, argv)]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm"}


def run_on_a_terminal(argv) -> tuple[int, str, str]:
    """(status, stdout, stderr) with stderr a pseudo-terminal (stdout a pipe)."""
    master, slave = pty.openpty()
    # a terminal 100 columns wide (a new pty has 0, and tqdm draws its bar to the width)
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=slave, env=_env())
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # EIO: every holder of the terminal's other end has exited
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    out = proc.stdout.read().decode()
    return proc.wait(timeout=300), out, b"".join(chunks).decode(errors="replace")


def run_in_a_pipe(argv) -> tuple[int, str, str]:
    proc = subprocess.run(argv, capture_output=True, env=_env(), timeout=300)
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


def _generate(pair, *extra):
    t, d = pair
    return _cmd("generate", "--target", t, "--drafter", d, "--prompt", "w3 w17 w42",
                "--max-new-tokens", "12", "--backend", "numpy", *extra)


def test_generate_on_a_terminal_says_what_loads_with_a_bar(pair):
    status, out, err = run_on_a_terminal(_generate(pair))
    assert status == 0, err
    t, d = pair
    # The status line names each thing loading; the loaders' bar counts tensors.
    assert f"loading {t.name}: metadata and tokenizer ..." in err
    assert f"loading {d.name} ..." in err
    assert "tensor" in err and "%|" in err  # tqdm's bar: "loading t:  50%|#####  | 5/10 ..."
    assert err.endswith("\r\x1b[K")  # cleared before the continuation is printed
    assert "tok/s after the first step" in out


def test_an_error_on_a_terminal_starts_its_own_line(pair):
    """The status line is cleared before the error: the line reads 'error: ...', not
    'loading t: metadata and tokenizer ...error: ...'."""
    t, d = pair
    status, _, err = run_on_a_terminal(_cmd("generate", "--target", t, "--drafter",
                                            t.parent / "wide_d", "--prompt", "w3"))
    assert status == 1
    last = err.split("\x1b[K")[-1]  # what stays on the screen after the last clear
    assert last.startswith("error: ") and "hidden_size 96" in last, repr(err)


def test_generate_in_a_pipe_keeps_stderr_empty(pair):
    status, out, err = run_in_a_pipe(_generate(pair))
    assert status == 0 and err == "", err
    assert out.splitlines()[-1].startswith("[12 tokens, tau ")


def test_demo_on_a_terminal_says_it_warms_up_and_in_a_pipe_nothing(pair):
    status, _, err = run_on_a_terminal(_cmd("demo", "--max-new-tokens", "16"))
    assert status == 0, err
    assert "loading " in err and "warming up (untimed) ..." in err
    status, out, err = run_in_a_pipe(_cmd("demo", "--max-new-tokens", "16"))
    # before, the timed runs' tqdm bars were written into the pipe
    assert status == 0 and err == "", err
    assert "identical output: yes" in out


def test_generate_runs_once_no_warm_up_run(pair, monkeypatch, capsys):
    """The drafter's untimed warm-up run (~30 s on Gemma) only served the tok/s figure: gone."""
    import dflash_ref.spec_decode.loop as loop
    from dflash_ref.cli import main

    calls = []
    real = loop.generate
    monkeypatch.setattr(loop, "generate", lambda *a, **kw: (calls.append(1), real(*a, **kw))[1])
    monkeypatch.setattr("dflash_ref.spec_decode.warmup.generate", loop.generate)
    assert main(_generate(pair)[3:]) == 0
    assert len(calls) == 1
    assert "tok/s after the first step" in capsys.readouterr().out


def test_step_rate_counts_the_steps_after_the_first(monkeypatch):
    """Emits of 1 (prefill), 3, 2 and 4 tokens at t = 1.0, 2.0, 2.5, 3.5 s: after the first
    step, 2 + 4 tokens in 3.5 - 2.0 s = 4.0 tok/s (counting the first step too would give 6.0;
    timing from the prefill, 3.0)."""
    import dflash_ref.cli_generate as cg

    clock = iter([0.0, 1.0, 2.0, 2.5, 3.5])
    monkeypatch.setattr(cg.time, "perf_counter", lambda: next(clock))
    rate = cg.StepRate()
    for n in (1, 3, 2, 4):
        rate.on_emit([0] * n)
    assert rate.describe() == "4.0 tok/s after the first step"


def test_step_rate_of_a_run_too_short_to_leave_out_its_first_step(monkeypatch):
    """Prefill (1 token at 1.0 s) and one step (3 tokens at 3.0 s) from t = 0: 4 / 3.0 s."""
    import dflash_ref.cli_generate as cg

    clock = iter([0.0, 1.0, 3.0])
    monkeypatch.setattr(cg.time, "perf_counter", lambda: next(clock))
    rate = cg.StepRate()
    rate.on_emit([0])
    rate.on_emit([0, 0, 0])
    assert rate.describe() == "1.3 tok/s (the whole run, first step included)"
