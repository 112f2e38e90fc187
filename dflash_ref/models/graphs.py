"""A step as one CUDA graph: captured once per shape, replayed after (issue 27, item 5).

On a GPU a decode step of a few-billion-parameter model is some 400-700 kernel launches, each
costing host time (docs/performance.md). A CUDA graph records the launches of one step once and
replays them with one call. A replay repeats the recorded kernels with the recorded arguments:
the same device addresses, the same scalars, the same grid. A step can be captured only when
everything that changes from step to step is a value in device memory, written before the
replay, never a Python number or a new array. :class:`StepGraphs` holds one recording per shape
key and replays it::

    graphs.run(key, step)      # the first time for ``key``: capture ``step``, then replay it
                               # afterwards: replay the recording (``step`` is not called)
    StepGraphs(be, enabled=False).run(key, step) == step()      # eager: graphs=False

What makes a target step graph-shaped (models/target.py, ``TargetModel.forward``; the state is
made with ``new_state(kv_capacity=C, graphs=True)``):

- per-step inputs in persistent device buffers: the batch's ids and positions are written into
  one buffer per batch shape, owned by the state (``BatchArrays(..., buffers=...)``: the one
  host -> device copy of the step, before the replay);
- fixed-capacity K/V stores (``models/stores.py``, ``FixedCacheStore``): rows [C, Hkv, D] written
  at the device positions, read whole; the key count is not a shape but the mask's rule
  ``k_pos <= q`` over the constant slot positions 0..C-1 against the device query positions, so
  rollback is a host length and stale rows stay hidden;
- at most :data:`GRAPH_MAX_ROWS` rows (CuPy refuses to capture cuBLAS; the ``linear`` kernel
  serves 1-16 rows, kernels_cupy/linear_plan.py), no tap, all logits rows.

Everything else (a prefill, a tree verify, a tap) runs eagerly on the same stores. The outputs
of a replay are the recording's buffers, rewritten by the next replay; the target copies them
out. ``be.capture`` is the backend's (dflash_ref/backend.py): a CUDA graph on CuPy
(kernels_cupy/graphs.py); on NumPy the step function made at the first step of its shape,
called again, so a step that reads a Python value of its first step (a length, a slice bound)
replays wrong on the CPU too. tests/models/test_graphs.py checks that, and with the recording
backend of tests/device_counter.py that a step body copies nothing to or from the host and
calls every kernel with the same arguments at every step.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from dflash_ref.errors import ConfigError

GRAPH_MAX_ROWS = 16
"""The most rows a captured step may run: the ``linear`` kernel's (kernels_cupy/linear_plan.py,
``MAX_ROWS``); more rows go to cuBLAS, which CuPy cannot capture."""


class StepGraphs:
    """Recordings of steps by shape key; ``enabled=False`` runs every step eagerly.

    Args:
        be: the Backend (its ``capture``).
        enabled: capture and replay (True), or call the step each time (False).
        capacity: the positions the state's fixed stores hold (a drafter's cache of a graphed
            state holds as many), or None.

    Attributes:
        captured: the shape keys captured so far, in order (what a test or a benchmark reads).
        buffers: the state's per-step input arrays by shape (``BatchArrays(..., buffers=)``).
    """

    def __init__(self, be, enabled: bool = True, capacity: int | None = None):
        self.be, self.enabled, self.capacity = be, bool(enabled), capacity
        self._replays: dict[Hashable, Callable] = {}
        self.captured: list = []
        self.buffers: dict = {}
        self._drafts: dict = {}

    def draft_cache(self, drafter):
        """The graphed draft cache of ``drafter`` for a state made with these graphs
        (``drafter.new_cache(capacity=...)``), made once and emptied on each later call, so a
        state reused for another ``generate`` (after ``state.truncate(0)``) replays the draft
        step captured before."""
        cache = self._drafts.get(id(drafter))
        if cache is None or cache.drafter is not drafter:
            cache = self._drafts[id(drafter)] = drafter.new_cache(capacity=self.capacity)
        cache.crop(0)
        return cache

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


def step_graphs(be, kv_capacity, pager, gdn_layers) -> StepGraphs:
    """The StepGraphs of a new state made with ``graphs=True`` (its ``buffers`` empty).

    Raises:
        ConfigError: graphs asked for over stores whose shapes move (no ``kv_capacity``), the
            KVFlash pool or Gated DeltaNet layers (not graph-shaped yet: they run eagerly).
    """
    if kv_capacity is None or pager is not None or gdn_layers:
        raise ConfigError(
            "graphs=True captures steps over fixed-shape stores: give kv_capacity (the longest "
            "context the state will hold) and no pager; a target with Gated DeltaNet layers "
            f"({len(gdn_layers)} here) runs eagerly (graphs=False)")
    return StepGraphs(be, capacity=kv_capacity)


def graph_key(batch, rows) -> int | None:
    """The shape key a step of ``batch`` (a :class:`~dflash_ref.models.state.Batch`) is
    captured under, its row count; None when it runs eagerly: a tree, chosen logits ``rows``,
    or more than :data:`GRAPH_MAX_ROWS` rows."""
    T = batch.ids.size
    if batch.parents is not None or rows is not None or T > GRAPH_MAX_ROWS:
        return None
    return T
