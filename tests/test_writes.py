"""Every command that writes files follows one rule (dflash_ref/io/writing.py;
docs/architecture.md, "Writing files: the one rule"): checked before any work, never replacing or
deleting what a user owns (also a file that appears during the run), complete or absent, one
writer per folder, ordinary permissions, errors naming the user's path in words.

The table: each row plants user files, runs one command line, and expects either one ``error:``
line holding the given words, or success; in both cases every planted user file is kept byte for
byte and no temporary or lock file is left. Races and permissions follow the table.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from dflash_ref.cli import main
from dflash_ref.io import writing
from dflash_ref.tiny import write_tiny_drafter, write_tiny_target

USER = b"a user's file: do not touch\n"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny target and drafter, a GGUF convert wrote, and a GGUF of another arch."""
    from dflash_ref.io.convert_target import convert_target
    from dflash_ref.io.gguf_io import write_gguf

    r = tmp_path_factory.mktemp("writes_models")
    t = write_tiny_target(r / "t", "qwen3", seed=5)
    write_tiny_drafter(r / "d", t, seed=6)
    convert_target(t, r / "t.gguf", "f32")
    write_gguf(r / "bert.gguf", "bert", {"x": np.ones((2, 2), np.float32)})
    return r


def _hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _leftovers(root: Path) -> list[str]:
    """Temporary or lock files the rule forbids leaving behind."""
    return [str(p) for p in root.rglob("*") if ".partial-" in p.name or p.name == writing.LOCK_NAME]


# --- plants: each puts user files into ``w`` (and may patch the run); returns nothing --------

def plant_text_out(w, m, mp):
    (w / "out.gguf").write_bytes(USER)


def plant_foreign_gguf_out(w, m, mp):
    (w / "out.gguf").write_bytes((m / "bert.gguf").read_bytes())


def plant_converted_out(w, m, mp):
    (w / "out.gguf").write_bytes((m / "t.gguf").read_bytes())


def plant_dir_out(w, m, mp):
    (w / "out.gguf").mkdir()
    (w / "out.gguf" / "notes.txt").write_bytes(USER)


def plant_nothing(w, m, mp):
    (w / "notes.txt").write_bytes(USER)


def plant_unwritable_folder(w, m, mp):
    """The output's folder refuses writes (root ignores permission bits: patch the check)."""
    plant_nothing(w, m, mp)
    real = os.access
    mp.setattr(writing.os, "access", lambda p, mode: False if Path(p) == w else real(p, mode))


def plant_denied_at_write(w, m, mp):
    """The folder looks writable but the temporary file cannot be made there (a raw OSError
    naming the hidden temporary: the error must name the real path instead)."""
    plant_nothing(w, m, mp)

    def denied(prefix, suffix, dir):
        raise PermissionError(13, "Permission denied", str(Path(dir) / f"{prefix}x{suffix}"))

    mp.setattr(writing.tempfile, "mkstemp", denied)


def plant_disk_full_at_write(w, m, mp):
    import gguf

    plant_nothing(w, m, mp)

    def full(self, *a, **k):
        raise OSError(28, "No space left on device")

    mp.setattr(gguf.GGUFWriter, "write_tensors_to_file", full)


def plant_out_appears_during_convert(w, m, mp):
    """The user saves a file at OUT while convert runs."""
    import gguf

    real = gguf.GGUFWriter.write_tensors_to_file

    def and_user_saves(self, *a, **k):
        (w / "out.gguf").write_bytes(USER)
        return real(self, *a, **k)

    mp.setattr(gguf.GGUFWriter, "write_tensors_to_file", and_user_saves)


def plant_case_file(w, m, mp):
    (w / "case").write_bytes(USER)


def plant_nonempty_folder(w, m, mp):
    (w / "case").mkdir()
    (w / "case" / "notes.txt").write_bytes(USER)


def plant_lock_held(w, m, mp):
    """Another command is writing the case folder (it holds the lock) for the whole run."""
    (w / "case").mkdir()
    lock = writing.folder_lock(w / "case", "OUT")
    lock.__enter__()
    mp.setattr(_HELD, "locks", [*_HELD.locks, lock])


def plant_file_during_export(w, m, mp):
    """The user saves notes in the case folder while export runs; export must keep them."""
    import dflash_ref.oracle.export as export

    real = export._write_gguf

    def and_user_saves(out, *a, **k):
        (w / "case" / "notes.txt").write_bytes(USER)
        return real(out, *a, **k)

    mp.setattr(export, "_write_gguf", and_user_saves)


def plant_case_with_notes(w, m, mp):
    """An exported case (5 steps) with the user's notes in it: --force replaces the case's
    files, removes its stale step files and keeps the notes."""
    from dflash_ref.oracle.export import export_case

    export_case(w / "case", m / "t", m / "d", [3, 17], max_new_tokens=5, gguf=False)
    (w / "case" / "notes.txt").write_bytes(USER)
    (w / "case" / "step9999.safetensors").write_bytes(USER)  # the user's, by name only


def plant_disk_full_in_export(w, m, mp):
    import dflash_ref.oracle.export as export

    plant_nonempty_folder(w, m, mp)
    (w / "case" / "notes.txt").unlink()

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    mp.setattr(export, "_write_gguf", full)


def plant_figure(w, m, mp):
    (w / "figs").mkdir()
    (w / "figs" / "acceptance.png").write_bytes(USER)


def plant_figs_file(w, m, mp):
    (w / "figs").write_bytes(USER)


class _HELD:
    locks: list = []


CONVERT = ["convert", "{m}/d", "{w}/out.gguf", "--qtype", "f32"]
EXPORT = ["oracle", "export", "{w}/case", "--target", "{m}/t", "--drafter", "{m}/d", "--ids",
          "3,17", "--max-new-tokens", "2", "--no-gguf"]
EXPLAIN = ["explain", "--target", "{m}/t", "--drafter", "{m}/d", "--ids", "3,17",
           "--max-new-tokens", "2", "--ablations", "none"]

# (id, plant, argv, words of the one error line, or None for success; kept user files)
CASES = [
    # convert: OUT
    ("convert_onto_text_file", plant_text_out, CONVERT, ["out.gguf", "already exists",
                                                          "--force"], ["out.gguf"]),
    ("convert_force_onto_text_file", plant_text_out, [*CONVERT, "--force"],
     ["out.gguf", "not a GGUF file", "kept"], ["out.gguf"]),
    ("convert_force_onto_foreign_gguf", plant_foreign_gguf_out, [*CONVERT, "--force"],
     ["'bert'", "not one convert writes"], ["out.gguf"]),
    ("convert_onto_its_own_gguf_without_force", plant_converted_out, CONVERT,
     ["already exists"], ["out.gguf"]),
    ("convert_force_onto_its_own_gguf", plant_converted_out, [*CONVERT, "--force"], None, []),
    ("convert_out_without_gguf_suffix", plant_nothing, ["convert", "{m}/d", "{w}/out.bin"],
     ["{w}/out.bin", "does not end in .gguf", "out.bin.gguf"], ["notes.txt"]),
    ("convert_out_no_suffix", plant_nothing, ["convert", "{m}/d", "{w}/model"],
     ["does not end in .gguf"], ["notes.txt"]),
    ("convert_out_is_directory", plant_dir_out, CONVERT, ["is a directory"],
     ["out.gguf/notes.txt"]),
    ("convert_out_folder_unwritable", plant_unwritable_folder, CONVERT,
     ["cannot write OUT {w}/out.gguf", "not writable"], ["notes.txt"]),
    ("convert_denied_at_write_names_the_real_path", plant_denied_at_write, CONVERT,
     ["cannot write OUT {w}/out.gguf: Permission denied", "choose a folder you can write"],
     ["notes.txt"]),
    ("convert_disk_full_names_the_real_path", plant_disk_full_at_write, CONVERT,
     ["cannot write OUT {w}/out.gguf: No space left on device", "free some space"],
     ["notes.txt"]),
    ("convert_out_appears_during_the_run", plant_out_appears_during_convert, CONVERT,
     ["out.gguf appeared while this command ran", "kept"], ["out.gguf"]),
    ("convert_src_is_gguf", plant_nothing, ["convert", "{m}/t.gguf", "{w}/out.gguf"],
     ["SRC", "t.gguf is a qwen3 target GGUF", "already converted", "check-gguf"], ["notes.txt"]),
    ("convert_src_is_gguf_onto_itself", plant_converted_out,
     ["convert", "{w}/out.gguf", "{w}/out.gguf", "--force"], ["is a qwen3 target GGUF"],
     ["out.gguf"]),
    # oracle export: OUT
    ("export_onto_a_file", plant_case_file, EXPORT, ["case is a file"], ["case"]),
    ("export_into_a_users_folder", plant_nonempty_folder, EXPORT, ["not empty", "--force"],
     ["case/notes.txt"]),
    ("export_force_into_a_users_folder", plant_nonempty_folder, [*EXPORT, "--force"],
     ["not an exported case"], ["case/notes.txt"]),
    ("export_while_another_writes_there", plant_lock_held, EXPORT,
     ["being written by another dflash-ref command", writing.LOCK_NAME], []),
    ("export_keeps_a_file_saved_during_the_run", plant_file_during_export,
     [*EXPORT[:-1]], None, ["case/notes.txt"]),
    ("export_force_keeps_the_users_files_in_a_case", plant_case_with_notes, [*EXPORT, "--force"],
     None, ["case/notes.txt", "case/step9999.safetensors"]),
    ("export_disk_full_names_the_real_path", plant_disk_full_in_export, EXPORT[:-1],
     ["cannot write OUT {w}/case: No space left on device"], []),
    ("export_folder_unwritable", plant_unwritable_folder,
     ["oracle", "export", "{w}/new/case", *EXPORT[3:]], ["cannot write OUT", "not writable"],
     ["notes.txt"]),
    # explain --plot
    ("plot_onto_a_users_figure", plant_figure, [*EXPLAIN, "--plot", "{w}/figs"],
     ["acceptance.png already exists", "--force"], ["figs/acceptance.png"]),
    ("plot_onto_a_file", plant_figs_file, [*EXPLAIN, "--plot", "{w}/figs"],
     ["--plot", "figs is a file"], ["figs"]),
    ("plot_folder_unwritable", plant_unwritable_folder, [*EXPLAIN, "--plot", "{w}/figs"],
     ["cannot write --plot", "not writable"], ["notes.txt"]),
]


@pytest.mark.parametrize("plant, argv, words, kept", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_a_writing_command_keeps_what_the_user_owns(models, tmp_path, monkeypatch, capsys,
                                                    plant, argv, words, kept):
    # catches: an existing file overwritten, a planted file deleted, a temp left, an errno
    w = tmp_path / "w"
    w.mkdir()
    _HELD.locks = []
    plant(w, models, monkeypatch)
    mine = {k: v for k, v in _hashes(w).items() if k in kept}
    argv = [a.format(m=models, w=w) for a in argv]
    try:
        rc = main(argv)
    finally:
        for lock in _HELD.locks:
            lock.__exit__(None, None, None)
    err = capsys.readouterr().err.strip().splitlines()
    if words is None:
        assert rc == 0, err
    else:
        assert rc != 0 and len(err) == 1 and err[0].startswith("error: "), err
        for word in words:
            assert word.format(m=models, w=w) in err[0], err[0]
        assert ".partial" not in err[0] and "Errno" not in err[0], err[0]
    after = _hashes(w)
    for name in kept:  # as planted before the run, or as the user saved it during the run
        assert after.get(name) == mine.get(name, hashlib.sha256(USER).hexdigest()), name
    assert _leftovers(w) == []


def test_the_table_covers_every_writing_command():
    # catches: a command that writes files and has no row (convert, export, explain --plot)
    commands = {c[2][0] if c[2][0] != "oracle" else "oracle export" for c in CASES}
    assert commands == {"convert", "oracle export", "explain"}
    assert len(CASES) >= 20 and len({c[0] for c in CASES}) == len(CASES)


def test_force_over_a_case_replaces_its_files_and_removes_only_its_stale_steps(models,
                                                                               tmp_path):
    # catches: stale step files of the earlier case kept, or a user's file removed with them
    from dflash_ref.oracle.export import export_case

    case = tmp_path / "case"
    export_case(case, models / "t", models / "d", [3, 17], max_new_tokens=6, gguf=False)
    first = {p.name for p in case.iterdir()}
    (case / "notes.txt").write_bytes(USER)
    m = export_case(case, models / "t", models / "d", [3, 17], max_new_tokens=1, gguf=False,
                    overwrite=True)
    now = {p.name for p in case.iterdir()}
    written = {t["file"] for t in m["tensors"]} | {"manifest.json"}
    assert now == written | {"notes.txt"}
    assert len(first - now) > 0  # the first case had more step files, all removed
    assert (case / "notes.txt").read_bytes() == USER


# --- races --------------------------------------------------------------------------------

def _race(n, work):
    """Run ``work(i)`` in ``n`` threads started together; (results, errors)."""
    barrier = threading.Barrier(n)
    results, errors = [None] * n, [None] * n

    def run(i):
        barrier.wait()
        try:
            results[i] = work(i)
        except Exception as exc:  # the loser's refusal
            errors[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, errors


def test_two_exports_racing_into_one_folder_one_wins_the_other_is_refused(models, tmp_path):
    # catches: both printing "wrote" while one case is lost (a build-beside-and-swap export)
    from dflash_ref.oracle.export import export_case

    case = tmp_path / "case"
    prompts = ([3, 17], [5, 6, 7])
    results, errors = _race(2, lambda i: export_case(case, models / "t", models / "d",
                                                     prompts[i], max_new_tokens=2, gguf=False))
    winners = [i for i in range(2) if results[i] is not None]
    assert len(winners) == 1, errors
    loser = errors[1 - winners[0]]
    assert isinstance(loser, writing.OutputError)
    assert any(w in str(loser) for w in ("being written by another", "not empty")), loser
    manifest = json.loads((case / "manifest.json").read_text())
    assert manifest["run"]["prompt_ids"] == prompts[winners[0]]
    assert _leftovers(tmp_path) == []


def test_two_converts_racing_onto_one_file_one_wins_the_other_is_refused(models, tmp_path):
    # catches: the second convert silently replacing the first one's file
    from dflash_ref.io.convert_target import convert_target

    out = tmp_path / "out.gguf"
    results, errors = _race(2, lambda i: convert_target(models / "t", out, ("f32", "bf16")[i],
                                                        replace=writing.NEVER))
    assert sum(r is not None for r in results) == 1, errors
    loser = next(e for e in errors if e is not None)
    assert "appeared while this command ran" in str(loser) or "already exists" in str(loser)
    assert _leftovers(tmp_path) == []


def test_a_second_process_cannot_take_a_held_lock_and_takes_it_once_released(tmp_path):
    # catches: a lock that only excludes threads of one process, or one never released
    folder = tmp_path / "case"
    folder.mkdir()
    code = ("import sys\nfrom pathlib import Path\nfrom dflash_ref.io.writing import folder_lock\n"
            "with folder_lock(Path(sys.argv[1]), 'OUT'):\n    print('held', flush=True)\n"
            "    sys.stdin.read()\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    holder = subprocess.Popen([sys.executable, "-c", code, str(folder)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(writing.OutputError, match="being written by another"):
            with writing.folder_lock(folder, "OUT"):
                pass
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    with writing.folder_lock(folder, "OUT"):  # released when the holder ended
        assert (folder / writing.LOCK_NAME).exists()
    assert list(folder.iterdir()) == []


def test_a_stale_lock_file_left_by_a_killed_command_does_not_block(tmp_path):
    # catches: an O_EXCL-only lock that a crashed run leaves held forever
    (tmp_path / writing.LOCK_NAME).write_text("12345\n")
    with writing.folder_lock(tmp_path, "OUT"):
        pass
    assert list(tmp_path.iterdir()) == []


# --- permissions --------------------------------------------------------------------------

@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    yield 0o027
    os.umask(old)


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_exported_files_follow_the_umask(models, tmp_path, umask_027):
    # catches: a mkstemp/mkdtemp file (0600 / 0700) published without its mode fixed
    from dflash_ref.oracle.export import export_case

    case = tmp_path / "case"
    export_case(case, models / "t", models / "d", [3, 17], max_new_tokens=1, gguf=True)
    assert _mode(case) == 0o750  # 0777 & ~027
    modes = {p.name: _mode(p) for p in case.iterdir()}
    assert "drafter.gguf" in modes and set(modes.values()) == {0o640}, modes  # 0666 & ~027


def test_converted_file_follows_the_umask(models, tmp_path, umask_027):
    assert main(["convert", str(models / "d"), str(tmp_path / "d.gguf"), "--qtype", "f32"]) == 0
    assert _mode(tmp_path / "d.gguf") == 0o640


def test_figures_follow_the_umask_and_keep_the_users_files(tmp_path, umask_027):
    pytest.importorskip("matplotlib")
    from types import SimpleNamespace

    from dflash_ref.diagnose.plots import FIGURES, a_figure, write_figures

    stats = SimpleNamespace(p_at_least=[0.9, 0.5], p_conditional=[0.9, 0.55], histogram=[1, 2, 3],
                            tau=1.6, acceptance_rate=0.4, tau_by_context=[(0, 1.6, 3)])
    report = SimpleNamespace(stats=stats, ablations={"features zeroed": SimpleNamespace(tau=1.1)})
    figs = tmp_path / "figs"
    figs.mkdir()
    (figs / "notes.txt").write_bytes(USER)
    write_figures(report, figs)
    assert {p.name: _mode(p) for p in figs.iterdir() if p.name in FIGURES} == dict.fromkeys(
        FIGURES, 0o640)
    with pytest.raises(writing.OutputError, match="already exists"):
        write_figures(report, figs)  # a second run without --force
    write_figures(report, figs, a_figure)  # with --force: the figures only
    assert (figs / "notes.txt").read_bytes() == USER
    assert sorted(p.name for p in figs.iterdir()) == sorted([*FIGURES, "notes.txt"])


def test_the_umask_is_read_without_changing_it(umask_027):
    # catches: os.umask(0) to read it (for a moment every thread creates world-writable files)
    assert writing.current_umask() == 0o027
