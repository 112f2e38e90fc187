"""What ``oracle export`` and ``convert`` write are ordinary files: their modes follow the umask.

A file first written under a temporary name (``tempfile.mkstemp`` makes it 0600, ``mkdtemp``
0700) and renamed into place keeps that private mode unless it is changed: another user of a
shared machine, or a group that reads the results, could not read the exported case or the
converted model. The expected mode is POSIX's for a file an ordinary ``open`` creates,
``0o666 & ~umask`` (a folder: ``0o777 & ~umask``), whatever way the command writes it. Two umasks
that differ from the private modes in different bits, so neither 0600/0700 nor a hard-wired
0644/0755 passes.
"""

from __future__ import annotations

import os
import stat

import pytest

from dflash_ref.cli import main
from dflash_ref.tiny import write_tiny_drafter, write_tiny_target

UMASKS = [0o027, 0o002]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("modes")
    t = write_tiny_target(root / "t", "qwen3", seed=11)
    return t, write_tiny_drafter(root / "d", t, seed=12)


@pytest.fixture(params=UMASKS, ids=oct)
def umask(request):
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_exported_case_follows_the_umask(pair, tmp_path, umask, capsys):
    t, d = pair
    out = tmp_path / "case"
    assert main(["oracle", "export", str(out), "--target", str(t), "--drafter", str(d),
                 "--ids", "3,17,42", "--max-new-tokens", "2", "--block-size", "4"]) == 0
    capsys.readouterr()
    assert _mode(out) == 0o777 & ~umask, oct(_mode(out))
    files = sorted(p for p in out.rglob("*") if p.is_file())
    assert {p.suffix for p in files} >= {".json", ".safetensors", ".gguf"}
    wrong = {p.name: oct(_mode(p)) for p in files if _mode(p) != 0o666 & ~umask}
    assert not wrong, f"expected {oct(0o666 & ~umask)}: {wrong}"


@pytest.mark.parametrize("role", ["target", "drafter"])
def test_converted_gguf_follows_the_umask(pair, tmp_path, umask, role, capsys):
    t, d = pair
    out = tmp_path / f"{role}.gguf"
    args = [str(t), str(out)] if role == "target" else [str(d), str(out), "--target", str(t)]
    assert main(["convert", *args, "--qtype", "f32"]) == 0
    capsys.readouterr()
    assert _mode(out) == 0o666 & ~umask, oct(_mode(out))
