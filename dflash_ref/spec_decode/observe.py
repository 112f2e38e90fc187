"""Watching a generation: one observer protocol (progress, streaming, recording), and the clock.

``generate(..., observer=...)`` reports what the loop does to an :class:`Observer`: a progress
bar (:class:`Progress`), a text stream (:class:`Stream`), the golden-vector recorder, or several
(:class:`Observers`). An observer watches: it never changes what is generated. Without one the
events go to :data:`UNWATCHED`, one no-op. The events are :class:`Observer`'s methods, in the
order a step sends them (docs/spec_decode.md, "Observers"). The loop's timing is its
:class:`Clock`.
"""

from __future__ import annotations

import time
from contextlib import contextmanager


class Observer:
    """The protocol, with no-op defaults: subclass it and override the events you need.

    Attributes:
        full_prefill_logits: True makes the prefill compute every row's logits (the loop
            otherwise computes only the last row, the one it samples from) and report them.
    """

    full_prefill_logits = False

    def on_start(self, state) -> None:
        """Before the prefill; ``state`` is the request's target state."""

    def on_gate(self, observation, decision) -> None:
        """A gate took ``decision`` on ``observation`` at the top of a step."""

    def on_draft_context(self, features, positions) -> None:
        """Feature rows [n, C*H] of committed ``positions`` [n] join the drafter's context."""

    def on_draft(self, anchor: int, positions, logits, proposal) -> None:
        """The drafter ran ``[anchor, MASK x (n-1)]`` at ``positions`` [n]: ``logits`` [n, V];
        ``proposal`` its ``DraftProposal``, None when only the logits were used (a tree)."""

    def before_forward(self, ids, positions, parents=None):
        """The target will run ``ids`` [T] at ``positions`` [T] (``parents`` [T] for a tree);
        return a ``tap(layer, name, x)`` for the per-layer intermediates, or None."""
        return None

    def after_forward(self, logits) -> None:
        """The target's ``logits`` [T, V] for the forward just reported (prefill: the last row,
        or every row when an observer sets ``full_prefill_logits``)."""

    def on_commit(self, tokens) -> None:
        """The step committed ``tokens`` (the state already holds them), before the
        ``max_new_tokens`` cut."""

    def on_emit(self, ids) -> None:
        """``ids`` (cut at max_new_tokens) were emitted."""

    def on_finish(self, result) -> None:
        """``result`` is complete."""


class Unwatched(Observer):
    """The observer of a run nobody watches: every event is one and the same no-op, so the loop
    reports every event unconditionally (no ``if observer is not None`` at its call sites)."""

    def ignore(self, *args, **kwargs) -> None:
        """Nothing: nobody is watching (``before_forward`` thus returns no tap)."""

    on_start = on_gate = on_draft_context = on_draft = before_forward = ignore
    after_forward = on_commit = on_emit = on_finish = ignore


UNWATCHED = Unwatched()


class Observers(Observer):
    """Several observers as one: every event goes to each, in order (None entries skipped)."""

    def __init__(self, *observers: Observer | None):
        self.observers = [o for o in observers if o is not None]
        self.full_prefill_logits = any(o.full_prefill_logits for o in self.observers)

    def on_start(self, state) -> None:
        for o in self.observers:
            o.on_start(state)

    def on_gate(self, observation, decision) -> None:
        for o in self.observers:
            o.on_gate(observation, decision)

    def on_draft_context(self, features, positions) -> None:
        for o in self.observers:
            o.on_draft_context(features, positions)

    def on_draft(self, anchor, positions, logits, proposal) -> None:
        for o in self.observers:
            o.on_draft(anchor, positions, logits, proposal)

    def before_forward(self, ids, positions, parents=None):
        taps = [t for o in self.observers
                if (t := o.before_forward(ids, positions, parents)) is not None]
        if len(taps) <= 1:
            return taps[0] if taps else None

        def tap(layer, name, x):
            for t in taps:
                t(layer, name, x)
        return tap

    def after_forward(self, logits) -> None:
        for o in self.observers:
            o.after_forward(logits)

    def on_commit(self, tokens) -> None:
        for o in self.observers:
            o.on_commit(tokens)

    def on_emit(self, ids) -> None:
        for o in self.observers:
            o.on_emit(ids)

    def on_finish(self, result) -> None:
        for o in self.observers:
            o.on_finish(result)


class Lap:
    """The seconds one :meth:`Clock.phase` took (set when it ends)."""

    seconds = 0.0


class Clock:
    """The loop's clock: wall seconds per phase, written into ``GenerationResult.timings``.

    ``phase(name)`` times a block of the loop and adds it to ``walls[name]`` ("prefill",
    "draft", "verify", "plain", "reselect"); "total" runs from the clock's creation (the start of
    the request) to :meth:`finish`. Every reading synchronises the device first on CuPy, so a
    phase holds its kernels; ``now()`` is such a reading (a gate's step time is two of them).
    ``modelled`` sums a cost model's times (None without one); :meth:`finish` writes it into
    ``GenerationResult.modelled_time``.
    """

    def __init__(self, be, cost=None):
        self.be, self.cost = be, cost
        self.walls: dict[str, float] = {}
        self.modelled = 0.0 if cost is not None else None
        self.t_start = self.now()

    def now(self) -> float:
        """``time.perf_counter()`` once the device has run all it was given (CuPy)."""
        if self.be.name == "cupy":
            self.be.xp.cuda.Stream.null.synchronize()
        return time.perf_counter()

    @contextmanager
    def phase(self, name: str):
        """Time the ``with`` block into ``walls[name]``; yields a :class:`Lap` with its seconds."""
        lap, t0 = Lap(), self.now()
        try:
            yield lap
        finally:
            lap.seconds = self.now() - t0
            self.walls[name] = self.walls.get(name, 0.0) + lap.seconds

    def finish(self, result) -> None:
        """Close "total"; write the walls and the modelled time into ``result``."""
        self.walls["total"] = self.now() - self.t_start
        result.timings = self.walls
        result.modelled_time = self.modelled


class Progress(Observer):
    """Calls ``update(n)`` with the number of tokens each step emits (a progress bar's update,
    e.g. ``tqdm(total=max_new_tokens).update``)."""

    def __init__(self, update):
        self.update = update

    def on_emit(self, ids) -> None:
        self.update(len(ids))


class Stream(Observer):
    """Calls ``write(ids)`` with the token ids each step emits, as they come (streaming text)."""

    def __init__(self, write):
        self.write = write

    def on_emit(self, ids) -> None:
        if ids:
            self.write(ids)
