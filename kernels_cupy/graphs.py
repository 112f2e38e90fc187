"""CUDA graph capture of one step on CuPy: the ``capture`` of the CuPy Backend (docs/backend.md,
"CUDA graphs").

:func:`capture` records every kernel a step function launches into one CUDA graph and returns
``replay``, which launches that graph on the current stream and returns the arrays the step
returned at capture (the graph writes them again on each replay). The recipe (CuPy's
``Stream.begin_capture`` docstring; the CUDA programming guide, "CUDA Graphs", stream capture):

1. a private memory pool (``cupy.cuda.MemoryPool``) serves every allocation of the step, and a
   non-blocking side stream runs it: the step's intermediates live in memory nobody else is
   handed between replays, and the graph's outputs stay alive with ``replay``;
2. a warm-up run on the side stream, outside the capture: kernels compile and load, launch plans
   and shared-memory attributes are cached, and the pool holds blocks of every size the step
   asks for, so the captured run allocates from them (no ``cudaMalloc`` inside the capture);
3. the capture (CuPy's default relaxed mode) of a second run.

What the step may do is the graph's contract (models/graphs.py): read every per-step input from
device buffers the host writes before the replay; launch only RawKernels and CuPy's elementwise
kernels (CuPy refuses to capture cuBLAS: only ``linear`` of 1-16 rows); never synchronise with
the host, never read a value back, never allocate what must outlive the step.
"""

from __future__ import annotations

import cupy as cp


def capture(step):
    """Capture ``step()`` (a function of no arguments returning CuPy arrays or a tuple of them /
    None) as one CUDA graph; return ``replay()`` -> what ``step`` returned at capture, rewritten
    by the graph. The step runs twice here (warm-up, then capture: it must be idempotent, as a
    step over fixed buffers is)."""
    pool = cp.cuda.MemoryPool()
    stream = cp.cuda.Stream(non_blocking=True)
    stream.wait_event(cp.cuda.get_current_stream().record())  # after the work queued so far
    with cp.cuda.using_allocator(pool.malloc), stream:
        step()  # warm-up: compile, plan, fill the private pool
        stream.synchronize()
        stream.begin_capture()
        try:
            out = step()
        except BaseException:  # raise the step's own error (a cuBLAS call, a host read), not
            try:  # the invalidated capture's
                stream.end_capture()
            except Exception:  # noqa: BLE001 - the capture is dropped either way
                pass
            raise
        graph = stream.end_capture()

    def replay():
        graph.launch(cp.cuda.get_current_stream())
        return out

    replay.graph, replay.pool, replay.stream = graph, pool, stream  # alive as long as replay
    return replay
