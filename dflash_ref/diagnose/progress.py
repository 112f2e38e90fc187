"""Progress over ``explain``'s phases: a tqdm bar per phase on a terminal, nothing in a pipe.

:class:`Phases` times every phase (the report's "time" line) whatever the stream;
only when the stream is a terminal (``isatty()``) does it draw a bar per run (one step per
token generated, ``tqdm`` when installed, else a line when the phase starts and ends) and a
line per step that has no bar (loading). Quiet when piped, so a saved report holds only the
report.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager

from dflash_ref.spec_decode.observe import Observer, Progress


class Phases:
    """Times and shows the phases of one ``explain`` (module docstring).

    Args:
        stream: where the progress goes (default: ``sys.stderr``).
        show: draw it; None (default): only when ``stream`` is a terminal.
    """

    def __init__(self, stream=None, show: bool | None = None):
        self.stream = sys.stderr if stream is None else stream
        tty = getattr(self.stream, "isatty", None)
        self.shown = bool(tty is not None and tty()) if show is None else show
        self.walls: dict[str, float] = {}

    def say(self, text: str) -> None:
        if self.shown:
            print(f"explain: {text}", file=self.stream, flush=True)

    @contextmanager
    def phase(self, name: str, total: int | None = None):
        """Time the ``with`` block into ``walls[name]``; yields an observer that advances the
        phase's bar by the tokens emitted (a no-op observer when nothing is shown)."""
        bar = self._bar(name, total) if self.shown and total else None
        if self.shown and bar is None:
            self.say(f"{name} ...")
        t0 = time.perf_counter()
        try:
            yield Progress(bar.update) if bar is not None else Observer()
        finally:
            self.walls[name] = time.perf_counter() - t0
            if bar is not None:
                bar.close()
            self.say(f"{name}: {self.walls[name]:.1f} s")

    def _bar(self, name, total):
        try:
            from tqdm.auto import tqdm
        except ImportError:  # the bar is optional: the start and end lines remain
            return None
        return tqdm(total=total, desc=f"explain: {name}", file=self.stream, leave=False,
                    unit="tok")
