"""The console script: `dflash-ref info`."""

from __future__ import annotations

import subprocess
import sys

import dflash_ref
from dflash_ref.backend import cupy_unavailable_reason
from dflash_ref.cli import main


def test_info_prints_version_backends_and_cupy_status(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert f"dflash-ref {dflash_ref.__version__}" in out
    assert "numpy    available" in out
    reason = cupy_unavailable_reason()
    if reason is None:
        assert "cupy     available" in out
    else:
        assert f"cupy     unavailable: {reason}" in out
    assert "nvrtc" in out


def test_console_script_entry_point_runs():
    # The same code path as the installed `dflash-ref` script, through the module entry.
    proc = subprocess.run([sys.executable, "-m", "dflash_ref.cli", "info"], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "backends:" in proc.stdout


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "info" in capsys.readouterr().out
