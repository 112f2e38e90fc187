"""A step as one CUDA graph: captured once per shape, replayed after; the state's runner that
decides which steps replay.

On a GPU a decode step of a few-billion-parameter model is some 400-700 kernel launches, each
costing host time (docs/performance.md). A CUDA graph records the launches of one step once and
replays them with one call. A replay repeats the recorded kernels with the recorded arguments:
the same device addresses, the same scalars, the same grid. A step can be captured only when
everything that changes from step to step is a value in device memory, written before the
replay, never a Python number or a new array. :class:`StepGraphs` holds one recording per shape
key and replays it::

    graphs.run(key, step)      # the first time for ``key``: capture ``step``, then replay it
                               # afterwards: replay the recording (``step`` is not called)
    StepGraphs(be, enabled=False).run(key, step) == step()      # eager

Every target state has a step runner (models/state.py, ``state.runner``); the target hands it
each forward's step (``TargetModel.forward``) and the drafter asks it for its draft cache
(``DFlashDrafter.cache_for``), neither knowing which runner it is. A state made with
``new_state(kv_capacity=C, graphs=True)`` gets a :class:`GraphRunner` (:func:`graph_runner`;
``new_state`` is the one place a runner is chosen), which replays a graph-shaped step (SGLang's
``CudaGraphRunner``: ``can_run``, then replay) and runs any other eagerly. What makes a target
step graph-shaped:

- per-step inputs in persistent device buffers: the batch's ids and positions are written into
  one buffer per batch shape, owned by the runner (``BatchArrays(..., buffers=...)``: the one
  host -> device copy of the step, before the replay);
- fixed-capacity K/V stores (``models/fixed_stores.py``, ``FixedCacheStore``; the same serve an
  eager state made with ``kv_capacity`` alone): rows [C, Hkv, D] written at the device
  positions, read whole; the key count is not a shape but the mask's rule ``k_pos <= q`` over
  the constant slot positions 0..C-1 against the device query positions, so rollback is a host
  length and stale rows stay hidden;
- at most :data:`GRAPH_MAX_ROWS` rows (CuPy refuses to capture cuBLAS; the ``linear`` kernel
  serves 1-16 rows, kernels_cupy/linear_plan.py), no tap, no tree, all logits rows
  (:func:`graph_key`).

The draft cache of a graphed state is the drafter's fixed-row one (models/fixed_stores.py,
``FixedDraftCache``), its draft step replayed by row count. The outputs of a replay are the
recording's buffers, rewritten by the next replay; the runner copies them out. ``be.capture`` is
the backend's (dflash_ref/backend.py): a CUDA graph on CuPy (kernels_cupy/graphs.py); on NumPy
the step function made at the first step of its shape, called again, so a step that reads a
Python value of its first step (a length, a slice bound) replays wrong on the CPU too.
tests/models/test_graphs.py checks that, and with the recording backend of
tests/device_counter.py that a step body copies nothing to or from the host and calls every
kernel with the same arguments at every step.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from dflash_ref.errors import ConfigError
from dflash_ref.models.state import no_tap

GRAPH_MAX_ROWS = 16
"""The most rows a captured step may run: the ``linear`` kernel's (kernels_cupy/linear_plan.py,
``MAX_ROWS``); more rows go to cuBLAS, which CuPy cannot capture."""


class StepGraphs:
    """Recordings of steps by shape key; ``enabled=False`` runs every step eagerly.

    Args:
        be: the Backend (its ``capture``).
        enabled: capture and replay (True), or call the step each time (False).

    Attributes:
        captured: the shape keys captured so far, in order (what a test or a benchmark reads).
    """

    def __init__(self, be, enabled: bool = True):
        self.be, self.enabled = be, bool(enabled)
        self._replays: dict[Hashable, Callable] = {}
        self.captured: list = []

    def run(self, key: Hashable, step: Callable):
        """``step()``'s result: eager, or the replay of ``key``'s recording (captured from this
        ``step`` the first time ``key`` is seen)."""
        if not self.enabled:
            return step()
        replay = self._replays.get(key)
        if replay is None:
            replay = self._replays[key] = self.be.capture(step)
            self.captured.append(key)
        return replay()

    def replay(self, key: Hashable, step: Callable):
        """:meth:`run`, its outputs (an array, or a tuple of arrays and None) copied out of the
        recording's buffers, which the next replay rewrites."""
        return _copied(self.run(key, step))


class GraphRunner:
    """The step runner of a state made with ``graphs=True``: a graph-shaped step replays, any
    other runs eagerly (module docstring).

    Args:
        be: the Backend (its ``capture``).
        capacity: the positions the state's fixed stores hold (a draft cache made for the state
            holds as many), or None.

    Attributes:
        graphs: the target's steps, keyed by row count (:class:`StepGraphs`).
        captured: its keys captured so far, in order.
        buffers: the per-step input arrays by shape (``BatchArrays(..., buffers=)``).
    """

    lazy_rows = False  # a recording computes every row: a lazy verify's forward runs whole

    def __init__(self, be, capacity: int | None = None):
        self.be, self.capacity = be, capacity
        self.graphs = StepGraphs(be)
        self.captured = self.graphs.captured
        self.buffers: dict = {}
        self._drafts: dict = {}

    def run(self, batch, rows, step: Callable):
        """``step()``'s (logits, features) for ``batch`` (a
        :class:`~dflash_ref.models.state.Batch`) and its logits ``rows``: replayed when the step
        is graph-shaped (:func:`graph_key`), else run eagerly."""
        key = graph_key(batch, rows)
        return step() if key is None else self.graphs.replay(key, step)

    def draft_cache(self, drafter):
        """The drafter's fixed-row cache of ``capacity`` positions, its draft step replayed
        (``drafter.fixed_cache``), made once and emptied on each later call, so a state reused
        for another ``generate`` (after ``state.truncate(0)``) replays the draft step captured
        before."""
        cache = self._drafts.get(id(drafter))
        if cache is None or cache.drafter is not drafter:
            drafts = StepGraphs(drafter.be)  # its own keys: (rows, with_hidden)
            cache = self._drafts[id(drafter)] = drafter.fixed_cache(self.capacity,
                                                                    run_step=drafts.replay)
        cache.crop(0)
        return cache


def graph_runner(be, kv_capacity, pager, gdn_layers) -> GraphRunner:
    """The step runner of a new state made with ``graphs=True`` (``TargetModel.new_state``).

    Raises:
        ConfigError: graphs asked for over stores whose shapes move (no ``kv_capacity``), the
            KVFlash pool or Gated DeltaNet layers (not graph-shaped yet: they run eagerly).
    """
    if kv_capacity is None or pager is not None or gdn_layers:
        raise ConfigError(
            "graphs=True captures steps over fixed-shape stores: give kv_capacity (the longest "
            "context the state will hold) and no pager; a target with Gated DeltaNet layers "
            f"({len(gdn_layers)} here) runs eagerly (graphs=False)")
    return GraphRunner(be, kv_capacity)


def graph_key(batch, rows) -> int | None:
    """The shape key a step of ``batch`` (a :class:`~dflash_ref.models.state.Batch`) is
    captured under, its row count; None when it runs eagerly: an observer's tap, a tree, chosen
    logits ``rows``, or more than :data:`GRAPH_MAX_ROWS` rows."""
    T = batch.ids.size
    if batch.tap is not no_tap:
        return None
    if batch.parents is not None or rows is not None or T > GRAPH_MAX_ROWS:
        return None
    return T


def _copied(out):
    """``out`` (an array, or a tuple of arrays and None) as copies."""
    if isinstance(out, tuple):
        return tuple(None if x is None else x.copy() for x in out)
    return out.copy()
