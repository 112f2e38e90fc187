"""The backend contract (docs/backend.md).

A :class:`Backend` bundles an array module ``xp`` (numpy or cupy) with the op table ``ops``.
Components are written once against a Backend::

    be = get_backend("auto")
    y = be.ops.rms_norm(be.xp.asarray(x), be.xp.asarray(w), 1e-6)
    y_host = be.to_numpy(y)

``get_backend("numpy")`` always works. ``get_backend("cupy")`` raises
:class:`~dflash_ref.errors.BackendUnavailable` with the precise reason (CuPy not installed, no
driver, no device) when CuPy cannot run. ``get_backend("auto")`` picks CuPy when it can run and
NumPy otherwise.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np

from dflash_ref.errors import BackendUnavailable
from dflash_ref.ops import OP_FAMILIES

BACKEND_NAMES = ("numpy", "cupy", "auto")


@dataclass(frozen=True)
class Backend:
    """A compute backend: ``name`` ("numpy" | "cupy"), array module ``xp``, op table ``ops``.

    State objects (KV caches, GDN states, pager pools) hold arrays of the backend that made them;
    moving data between backends is explicit, through two functions chosen once, when the
    backend is made:

    - ``to_numpy(arr)``: ``arr`` as a host NumPy array: ``np.asarray`` on NumPy,
      ``cupy.asnumpy`` on CuPy (a copy from the device for a CuPy array);
    - ``to_backend(arr)``: ``arr`` as an array of this backend: ``xp.asarray`` (a host-to-device
      copy on CuPy).

    Either may be given instead (tests/device_counter.py gives both, to count the copies).

    ``capture(step) -> replay`` records a step function (no arguments, fixed buffers) once and
    returns ``replay()``, which runs it again and returns its outputs: a CUDA graph on CuPy
    (:func:`kernels_cupy.graphs.capture`); on NumPy :func:`capture_by_calling`, which keeps the
    step function as it was built and calls it again (models/graphs.py).
    """

    name: str
    xp: ModuleType
    ops: SimpleNamespace
    to_numpy: Callable[[Any], np.ndarray] | None = None
    to_backend: Callable[[Any], Any] | None = None
    capture: Callable[[Callable], Callable] | None = None

    def __post_init__(self):
        """Choose ``to_numpy`` and ``to_backend`` for ``xp`` where they were not given."""
        if self.to_numpy is None:
            to_numpy = self.xp.asnumpy if self.name == "cupy" else np.asarray
            object.__setattr__(self, "to_numpy", to_numpy)
        if self.to_backend is None:
            object.__setattr__(self, "to_backend", self.xp.asarray)
        if self.capture is None:
            object.__setattr__(self, "capture", capture_by_calling)

    def __repr__(self) -> str:
        return f"Backend(name={self.name!r}, ops={len(vars(self.ops))})"


def capture_by_calling(step: Callable) -> Callable:
    """The NumPy backend's graph capture: run ``step()`` once (the warm-up CuPy's capture runs
    too), then return ``step`` itself as the replay.

    Replaying calls the step function made at the first step of its shape, with the Python
    values it closed over then: as a CUDA graph replays the kernels and arguments recorded at
    capture. A step that reads anything other than its fixed buffers gives a different result
    from an eager step here, on the CPU (tests/models/test_graphs.py).
    """
    step()
    return step


def _op_table(package: str) -> SimpleNamespace:
    """Collect every op of ``OP_FAMILIES`` from ``<package>.<family>`` into one namespace."""
    table = {}
    for family, names in OP_FAMILIES.items():
        module = importlib.import_module(f"{package}.{family}")
        for name in names:
            table[name] = getattr(module, name)
    return SimpleNamespace(**table)


@functools.lru_cache(maxsize=1)
def cupy_unavailable_reason() -> str | None:
    """Why the CuPy backend cannot run here, or ``None`` when it can.

    Checks, in order: CuPy importable, CUDA driver usable, at least one device, and a tiny
    allocation on device 0. The first failure is reported with a hint for the fix.
    """
    try:
        import cupy
    except ImportError as exc:
        return (
            f"CuPy is not installed ({exc}); install it with "
            "pip install 'dflash-ref[cuda12]' (or [cuda13] for a CUDA 13 driver)"
        )
    except Exception as exc:  # a broken CuPy install raises other errors at import
        return f"CuPy failed to import: {type(exc).__name__}: {exc}"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return (
            f"CuPy {cupy.__version__} is installed but the CUDA driver is not usable "
            f"({type(exc).__name__}: {exc}); is this a machine with an NVIDIA GPU and driver?"
        )
    if count == 0:
        return f"CuPy {cupy.__version__} found the CUDA driver but no CUDA device"
    try:
        cupy.zeros(1, dtype=cupy.float32).sum().item()
    except Exception as exc:
        return f"CUDA device 0 is present but unusable ({type(exc).__name__}: {exc})"
    return None


def cupy_device_description() -> str:
    """Name, compute capability and memory of CUDA device 0 (call only when CuPy is usable)."""
    import cupy

    dev = cupy.cuda.Device(0)
    props = cupy.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    mem_gib = props["totalGlobalMem"] / 2**30
    rt = cupy.cuda.runtime.runtimeGetVersion()
    return (
        f"{name} (sm_{dev.compute_capability}, {mem_gib:.1f} GiB), "
        f"CUDA runtime {rt // 1000}.{(rt % 1000) // 10}"
    )


@functools.cache
def get_backend(name: str = "numpy") -> Backend:
    """Return the backend ``name``: "numpy", "cupy" or "auto" (CuPy when usable, else NumPy).

    Raises:
        BackendUnavailable: ``name == "cupy"`` and CuPy cannot run here (the message says why).
        ValueError: ``name`` is not one of ``BACKEND_NAMES``.
    """
    if name not in BACKEND_NAMES:
        raise ValueError(f"unknown backend {name!r}; expected one of {BACKEND_NAMES}")
    if name == "auto":
        name = "cupy" if cupy_unavailable_reason() is None else "numpy"
    if name == "numpy":
        return Backend("numpy", np, _op_table("dflash_ref.ops"))
    reason = cupy_unavailable_reason()
    if reason is not None:
        raise BackendUnavailable(f"the cupy backend is unavailable: {reason}")
    import cupy

    graphs = importlib.import_module("kernels_cupy.graphs")
    return Backend("cupy", cupy, _op_table("kernels_cupy"), capture=graphs.capture)


def as_backend(backend: str | Backend) -> Backend:
    """Accept a Backend or a backend name; components call this on their ``backend`` argument."""
    return backend if isinstance(backend, Backend) else get_backend(backend)


SMALL_MODEL_HIDDEN = 1024
"""Below this hidden size a matmul is too small for BLAS threads to pay (the demo's speedup fell
from 1.87-2.87x to 1.09-1.21x with the default threads on a busy machine)."""


def limit_blas_threads(hidden_size: int | None = None, threads: int = 1):
    """Limit the host BLAS (OpenBLAS, MKL, BLIS) to ``threads`` threads for a small model.

    A model of hidden size below :data:`SMALL_MODEL_HIDDEN` multiplies [T, 128] by [128, 512]
    matrices: each thread's share is smaller than the cost of waking it, and threads of several
    processes on one machine oversubscribe its cores. Uses ``threadpoolctl`` (a runtime
    dependency). Returns the limiter, also a context manager (``with limit_blas_threads(128):
    ...``; ``limiter.restore_original_limits()`` undoes a plain call), or None for a larger model,
    whose threads are left alone. ``hidden_size=None``: limit anyway (the caller knows its
    models are small, e.g. a notebook of tiny random models).
    """
    if hidden_size is not None and hidden_size >= SMALL_MODEL_HIDDEN:
        return None
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=threads, user_api="blas")
