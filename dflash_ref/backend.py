"""The backend contract (docs/backend.md): an array module ``xp`` (numpy or cupy) and the op
table ``ops``, chosen by :func:`get_backend`; components are written once against a Backend.
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
WEIGHT_STORAGE = ("float32", "bf16")


@dataclass(frozen=True)
class Backend:
    """A compute backend: ``name`` ("numpy" | "cupy"), array module ``xp``, op table ``ops``.

    ``to_numpy(arr)`` / ``to_backend(arr)``: the only ways data moves between host and backend
    (given, or chosen for ``xp``). ``capture(step) -> replay``: records a step function once
    (a CUDA graph on CuPy; :func:`capture_by_calling` on NumPy). ``weights``: how the
    projections store their weights ("float32"; "bf16" on CuPy: kernels_cupy/linear_bf16.py).
    """

    name: str
    xp: ModuleType
    ops: SimpleNamespace
    to_numpy: Callable[[Any], np.ndarray] | None = None
    to_backend: Callable[[Any], Any] | None = None
    capture: Callable[[Callable], Callable] | None = None
    weights: str = "float32"

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
        extra = "" if self.weights == "float32" else f", weights={self.weights!r}"
        return f"Backend(name={self.name!r}, ops={len(vars(self.ops))}{extra})"


def capture_by_calling(step: Callable) -> Callable:
    """The NumPy backend's capture: run ``step()`` once (the warm-up), return ``step`` as the
    replay, with the values it closed over, as a CUDA graph replays its recorded arguments."""
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
    """Why the CuPy backend cannot run here (import, driver, device, allocation), or None."""
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
def get_backend(name: str = "numpy", weights: str = "float32") -> Backend:
    """The backend ``name``: "numpy", "cupy" or "auto" (CuPy when usable, else NumPy); raises
    BackendUnavailable (saying why) for an unusable "cupy".

    ``weights="bf16"`` (CuPy only, off by default): the projections read their weights rounded
    to bf16, half the bytes, within their own tolerance class (kernels_cupy/linear_bf16.py)."""
    if name not in BACKEND_NAMES:
        raise ValueError(f"unknown backend {name!r}; expected one of {BACKEND_NAMES}")
    if weights not in WEIGHT_STORAGE:
        raise ValueError(f"unknown weight storage {weights!r}; expected one of {WEIGHT_STORAGE}")
    if name == "auto":
        name = "cupy" if cupy_unavailable_reason() is None else "numpy"
    if name == "numpy":
        if weights != "float32":
            raise ValueError("weights='bf16' is an option of the cupy backend; the NumPy "
                             "reference keeps float32 weights (drop weights= or use 'cupy')")
        ops = _op_table("dflash_ref.ops")
        ops.linear = importlib.import_module("dflash_ref.ops.linear").linear_few_rows
        return Backend("numpy", np, ops)
    reason = cupy_unavailable_reason()
    if reason is not None:
        raise BackendUnavailable(f"the cupy backend is unavailable: {reason}")
    import cupy

    graphs = importlib.import_module("kernels_cupy.graphs")
    ops = _op_table("kernels_cupy")
    if weights == "bf16":
        ops.linear = importlib.import_module("kernels_cupy.linear_bf16").Bf16Weights()
    return Backend("cupy", cupy, ops, capture=graphs.capture, weights=weights)


def as_backend(backend: str | Backend) -> Backend:
    """Accept a Backend or a backend name; components call this on their ``backend`` argument."""
    return backend if isinstance(backend, Backend) else get_backend(backend)


SMALL_MODEL_HIDDEN = 1024
"""Below this hidden size a matmul is too small for BLAS threads to pay (the demo's speedup fell
from 1.87-2.87x to 1.09-1.21x with the default threads on a busy machine)..."""

LARGE_HEAD = 1 << 24
"""...unless the head is this many weights or more (64 MiB in float32): then every token reads
it from memory, and more threads read it faster (Gemma 3 270M's 262,144 x 640 head;
docs/backend.md)."""


def limit_blas_threads(hidden_size: int | None = None, threads: int = 1,
                       vocab_size: int | None = None):
    """Limit the host BLAS to ``threads`` threads for a small model: ``hidden_size`` below
    :data:`SMALL_MODEL_HIDDEN` (or None) and ``hidden_size * vocab_size`` (when given) below
    :data:`LARGE_HEAD`; returns the threadpoolctl limiter (a context manager), or None for a
    larger model."""
    if hidden_size is not None and hidden_size >= SMALL_MODEL_HIDDEN:
        return None
    if hidden_size is not None and vocab_size is not None and \
            hidden_size * vocab_size >= LARGE_HEAD:
        return None
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=threads, user_api="blas")
