"""How every command writes files: the one rule (docs/architecture.md, "Writing files: the one
rule").

1. **Checked first.** A file's folder must exist and be writable, a name that must end in
   ``.gguf`` does, before any work starts (:func:`check_output_file`).
2. **Never replaced unless yours to replace.** An existing file is replaced only with ``--force``
   and only when it is one the command itself writes (``replace(path)`` says why not otherwise);
   nothing else is replaced or deleted, and a file that appears while the command runs stays.
3. **Complete or absent.** Each file is written under a hidden temporary name in its own folder
   and moved into place only when complete (:func:`new_file`); an output folder publishes all of
   its files only once every one is written (:class:`OutputFolder`). On a failure the temporary
   files go and what was there stays.
4. **One writer per folder.** An output folder is locked for the run (:data:`LOCK_NAME`, an
   ``flock``); a second command writing into it is refused at once.
5. **Ordinary permissions.** Files get ``0o666`` and folders ``0o777`` minus the umask, like any
   file the user creates there.
6. **Errors in words, with the user's path**: never a temporary name or an errno number.

``replace`` says which existing file may be replaced: :data:`NEVER` (None, the rule without
``--force``) nothing; a callable ``path -> None | str`` (the rule with ``--force``) returns None
when ``path`` may be replaced, else what ``path`` is, for the error line; :func:`replace_any` is
for library callers that own their paths (scripts, tests).
"""

from __future__ import annotations

import errno
import os
import re
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from dflash_ref.errors import DFlashRefError

try:
    import fcntl
except ImportError:  # not POSIX: the lock falls back to an exclusive create
    fcntl = None

LOCK_NAME = ".dflash-ref.lock"
NEVER = None  # replace nothing: the rule without --force
Replace = Callable[[Path], "str | None"] | None
# errors of the write itself (no file name attached): they are about the output
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES,
                 errno.EPERM, errno.EIO}


class OutputError(DFlashRefError, OSError):
    """An output cannot be written as the rule asks; the message names the path and the fix."""


def replace_any(path: Path) -> None:
    """Everything may be replaced: for callers that own the path (scripts, tests)."""
    return None


def current_umask() -> int:
    """The process umask, read without changing it (``os.umask`` sets it for every thread)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def in_words(exc: OSError) -> str:
    """An OSError's reason without its number or file name: "No space left on device"."""
    return exc.strerror or (os.strerror(exc.errno) if exc.errno else type(exc).__name__)


def cannot_write(path: Path, exc: OSError, option: str) -> OutputError:
    """The error for a failed write of ``path``, naming it (not a temporary) and the fix."""
    fix = {errno.ENOSPC: "free some space or choose another place",
           errno.EDQUOT: "free some space or choose another place",
           errno.EACCES: "choose a folder you can write or fix its permissions",
           errno.EPERM: "choose a folder you can write or fix its permissions",
           errno.EROFS: "choose a folder on a writable disk"}.get(exc.errno, f"choose another "
                                                                  f"{option}")
    return OutputError(f"cannot write {option} {path}: {in_words(exc)}; {fix}")


def _about_output(exc: OSError, temporaries: set[str]) -> bool:
    """True when ``exc`` is a failure to write the output (not, say, a missing input)."""
    if exc.filename is not None:
        return str(exc.filename) in temporaries
    return exc.errno in _WRITE_ERRNOS


def check_output_file(path, option: str = "OUT", *, suffix: str | None = None,
                      replace: Replace = NEVER) -> Path:
    """Refuse, before any work, a file output the rule would refuse at the end (rules 1, 2)."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{option} {path} is a directory; expected a file name such as "
                          f"{path / ('model' + (suffix or ''))}")
    if suffix is not None and path.suffix != suffix:
        raise OutputError(f"{option} {path}: the name does not end in {suffix}; name the file "
                          f"{path.with_name(path.name + suffix)} or similar")
    parent = path.parent
    if not parent.is_dir():
        raise OutputError(f"{option} {path}: the folder {parent} does not exist; create it first "
                          f"(mkdir -p {parent}) or choose another path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write {option} {path}: its folder {parent} is not writable "
                          f"(permission denied); choose a folder you can write")
    if path.exists() or path.is_symlink():
        refuse_existing(path, option, replace)
    return path


def check_output_folder(path, option: str, names=(), replace: Replace = NEVER) -> Path:
    """Refuse, before any work, a folder output the rule would refuse at the end (rules 1, 2):
    a file in its place, a folder that cannot be made or written, one of ``names`` (the files
    the command will write there) already present and not replaceable."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputError(f"{option} {path} is a file, not a folder; choose another {option}")
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write {option} {path}: the folder {existing} is not writable "
                          f"(permission denied); choose a folder you can write")
    for name in names:
        if (path / name).exists() or (path / name).is_symlink():
            refuse_existing(path / name, option, replace)
    return path


def refuse_existing(path: Path, option: str, replace: Replace) -> None:
    """Raise unless ``replace`` approves replacing the existing ``path``."""
    if replace is None:
        raise OutputError(f"{option} {path} already exists; choose another path (--force "
                          f"replaces a file this command wrote)")
    what = replace(path)
    if what is not None:
        raise OutputError(f"{option} {path} is {what}; --force replaces only a file this "
                          f"command wrote, so it is kept; choose another path")


def _publish(tmp: Path, path: Path, option: str, replace: Replace) -> None:
    """Move the complete ``tmp`` onto ``path`` (rule 2 checked again now: a file may have
    appeared during the run). Without replacement, a hard link makes the check and the move
    one step (it fails if ``path`` exists)."""
    os.chmod(tmp, 0o666 & ~current_umask())
    if path.exists() or path.is_symlink():
        refuse_late(path, option, replace)
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise appeared(path, option) from None
    except OSError:  # a filesystem without hard links: check, then rename
        if path.exists():
            raise appeared(path, option) from None
        os.replace(tmp, path)
        return
    tmp.unlink()


def appeared(path: Path, option: str) -> OutputError:
    return OutputError(f"{option} {path} appeared while this command ran; it is kept as it was "
                       f"and nothing was written there; choose another path")


def refuse_late(path: Path, option: str, replace: Replace) -> None:
    """:func:`refuse_existing` at the end of a run: without replacement, ``path`` appeared
    during the run (it was checked absent at the start)."""
    if replace is None:
        raise appeared(path, option)
    refuse_existing(path, option, replace)


def _temporary(path: Path, option: str) -> Path:
    """A new empty hidden file beside ``path`` (same suffix: writers that read the extension
    still work)."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.partial-", suffix=path.suffix,
                                   dir=path.parent)
    except OSError as exc:
        raise cannot_write(path, exc, option) from None
    os.close(fd)
    return Path(tmp)


@contextmanager
def new_file(path, option: str = "OUT", *, replace: Replace = NEVER):
    """Yield a temporary path to write ``path``'s content to; publish it when the block ends
    without an error (rules 2, 3, 5, 6)."""
    path = Path(path)
    tmp = _temporary(path, option)
    try:
        yield tmp
        _publish(tmp, path, option, replace)
    except OutputError:
        raise
    except OSError as exc:
        if _about_output(exc, {str(tmp)}):
            raise cannot_write(path, exc, option) from None
        raise
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def folder_lock(folder: Path, option: str):
    """Hold :data:`LOCK_NAME` in ``folder`` for the block; refuse at once if another command
    holds it (rule 4). The lock file is removed at the end."""
    lock = folder / LOCK_NAME
    fd = _take_lock(lock, folder, option)
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)
        os.close(fd)


def _take_lock(lock: Path, folder: Path, option: str) -> int:
    busy = OutputError(f"{option} {folder} is being written by another dflash-ref command (it "
                       f"holds {lock}); wait for it to finish or choose another folder")
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | (0 if fcntl else os.O_EXCL), 0o666)
        except FileExistsError:
            raise busy from None
        except OSError as exc:
            raise cannot_write(folder, exc, option) from None
        if fcntl is None:
            return fd
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise busy from None
        try:
            if os.fstat(fd).st_ino == os.stat(lock).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # the last holder removed the file between our open and our lock: retry


def folder_contents(folder: Path) -> list[str]:
    """The names in ``folder`` a user could own (the lock file is not one)."""
    return sorted(p.name for p in folder.iterdir() if p.name != LOCK_NAME)


class OutputFolder:
    """A folder of outputs, created if absent and locked while written (rules 3, 4).

    ``with OutputFolder(path, option, replace, check) as out:`` then ``out.new(name)``
    for each file (a temporary path to write), then ``out.commit(remove=...)``: every file is
    published (in the order asked: write a manifest last), then ``remove`` (names the command
    wrote in an earlier run) is deleted. ``check(folder)`` runs once the lock is held, for a
    command's own refusals of an existing folder. A failure before the commit leaves the
    folder as it was (and removes it if this run created it and it is still empty).
    """

    def __init__(self, path, option: str, *, replace: Replace = NEVER,
                 check: Callable[[Path], None] | None = None):
        self.path, self.option, self.replace = Path(path), option, replace
        self.check = check
        self.created = False
        self.pending: list[tuple[str, Path]] = []

    def __enter__(self) -> OutputFolder:
        self._create()
        self._lock = folder_lock(self.path, self.option)
        try:
            self._lock.__enter__()
            if self.check is not None:
                self.check(self.path)
            self.before = set(folder_contents(self.path))
        except BaseException:
            self._lock.__exit__(None, None, None)
            self._remove_if_created()
            raise
        return self

    def _create(self) -> None:
        if self.path.is_dir():
            return
        if self.path.exists():
            raise OutputError(f"{self.option} {self.path} is a file, not a folder; choose "
                              f"another {self.option}")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.path.mkdir()  # made with 0o777 minus the umask
            self.created = True
        except FileExistsError:  # another command made it just now: it is not ours
            pass
        except OSError as exc:
            raise cannot_write(self.path, exc, self.option) from None

    def new(self, name: str) -> Path:
        """A temporary path in the folder for the file ``name`` (published by :meth:`commit`)."""
        tmp = _temporary(self.path / name, self.option)
        self.pending.append((name, tmp))
        return tmp

    def commit(self, remove=()) -> list[Path]:
        """Publish every new file (all refusals checked before the first move), then delete
        ``remove``: names this command wrote before and does not write now."""
        for name, _ in self.pending:
            final = self.path / name
            if name in self.before:
                refuse_existing(final, self.option, self.replace)
            elif final.exists() or final.is_symlink():
                refuse_late(final, self.option, self.replace)
        done = []
        for name, tmp in self.pending:
            _publish(tmp, self.path / name, self.option, self.replace)
            done.append(self.path / name)
        self.pending = []
        for name in sorted(set(remove) - {p.name for p in done}):
            (self.path / name).unlink(missing_ok=True)
        return done

    def __exit__(self, kind, exc, tb) -> None:
        for _, tmp in self.pending:
            tmp.unlink(missing_ok=True)
        self._lock.__exit__(None, None, None)
        if kind is not None:
            self._remove_if_created()
        if isinstance(exc, OSError) and not isinstance(exc, OutputError):
            temps = {str(t) for _, t in self.pending}
            if _about_output(exc, temps) or re.search(r"\.partial-", str(exc.filename or "")):
                raise cannot_write(self.path, exc, self.option) from None

    def _remove_if_created(self) -> None:
        if self.created:
            try:
                self.path.rmdir()  # only if empty: a file a user put there keeps it
            except OSError:
                pass
