"""A NumPy backend that keeps a device's books: host -> device copies and device -> host reads.

On CuPy a host array is copied to the device wherever it meets device code: ``cp.asarray(host)``,
a host array given to a kernel wrapper (positions to ``rope``, a mask's ``np.arange`` to
``attention``, slots to ``scatter_rows``), a host operand of an array expression, a host index.
On the NumPy backend none of these costs anything, so a per-layer ``np.arange`` handed to an op
passes every CPU test and costs a copy per layer and step on a GPU. :func:`counting_backend`
makes them countable on a CPU. Its arrays are :class:`DeviceArray` (an ndarray subclass standing
for device memory), and :data:`LEDGER` records, where CuPy would copy:

- uploads: ``xp.asarray`` / ``xp.array`` / ``xp.ascontiguousarray`` / ``be.to_backend`` of
  anything that is not a DeviceArray; a host array (or a list of numbers) given to an op, directly
  or inside a MaskSpec; a host array beside a DeviceArray in a ufunc or a NumPy function; a host
  index array, or a host array value, in ``dev[idx]`` / ``dev[idx] = value``;
- downloads (each a host synchronisation on a GPU): ``be.to_numpy`` / ``.get()`` of a DeviceArray,
  and ``int()`` / ``float()`` / ``bool()`` / ``.item()`` / ``.tolist()`` of one.

and launches (each a kernel CuPy would start; :data:`TWIN_LAUNCHES` and ``_count_launches``):
an op call counts its twin's kernels plus one copy per non-contiguous array argument that its
twin does not read in place (the twins' ``f32`` makes them contiguous; ``READS_STRIDED_ROWS``);
a ufunc on a DeviceArray (``+``, ``@``, ``exp``, a reduction), a NumPy function computing on one
(``concatenate``, ``where``), an assignment into one, and ``ascontiguousarray`` / ``astype`` /
``copy`` that must copy count one each.

A CUDA-graph step (dflash_ref/models/graphs.py) is checked with the same books: the counting
backend's ``capture`` (:func:`capture_recorded`) replays a step by calling it again, as NumPy
does, and records each replay as a :class:`StepRecord`: its uploads, downloads and launches, and
its **tape**, every kernel-starting call (an op, a ufunc, a NumPy function, an assignment) and
every index with its arguments written as shapes, dtypes and host scalars. A step is
graph-shaped when every replay of a key has no upload, no download and the same tape (a CUDA
graph repeats the recorded arguments: a length, a slice bound or a shape that moves breaks it).

Each entry names the dflash_ref line that made it. Results are the NumPy backend's, bit for bit
(the ops are the reference ops, run on the same memory). The code base tells device arrays from
host ones by their type's module (``type(x).__module__.startswith("cupy")``:
dflash_ref/ops/masks.py, dflash_ref/testing/__init__.py, dflash_ref/spec_decode/verify.py), so
DeviceArray declares a CuPy-like module. Host reads that bypass these hooks (``np.asarray`` of a
DeviceArray) are not seen.
"""

from __future__ import annotations

import dataclasses
import traceback
from types import SimpleNamespace

import numpy as np

from dflash_ref.backend import Backend, get_backend
from dflash_ref.ops.masks import MaskSpec
from kernels_cupy.attention_decode_v3 import plan_decode_v3


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """One replay of a captured step (:func:`capture_recorded`): what it copied and launched,
    and its tape (module docstring)."""

    uploads: tuple[str, ...]
    downloads: tuple[str, ...]
    launches: tuple[str, ...]
    tape: tuple


class Ledger:
    """The copies seen since the last :meth:`reset`, each as "what at file:line (function)";
    ``steps``: the replays of captured steps (:class:`StepRecord`)."""

    def __init__(self):
        self.uploads: list[str] = []
        self.downloads: list[str] = []
        self.launches: list[str] = []
        self.steps: list[StepRecord] = []
        self.tape: list | None = None  # a list while a step replays

    def reset(self) -> None:
        self.uploads.clear()
        self.downloads.clear()
        self.launches.clear()
        self.steps.clear()

    def add(self, kind: str, what: str) -> None:
        getattr(self, kind).append(f"{what} at {_caller()}")

    def record(self, what: str, *args) -> None:
        """On the tape of the replaying step (if any): ``what`` and its arguments' signature."""
        if self.tape is not None:
            self.tape.append((what, _signature(args)))


def capture_recorded(step):
    """The counting backend's ``capture``: run ``step`` once (the warm-up), then return a
    replay that calls it again and appends a :class:`StepRecord` to ``LEDGER.steps``."""
    step()

    def replay():
        marks = len(LEDGER.uploads), len(LEDGER.downloads), len(LEDGER.launches)
        LEDGER.tape = []
        try:
            return step()
        finally:
            new = [tuple(getattr(LEDGER, k)[m:]) for k, m in
                   zip(("uploads", "downloads", "launches"), marks)]
            LEDGER.steps.append(StepRecord(*new, tuple(LEDGER.tape)))
            LEDGER.tape = None
    return replay


def _signature(obj):
    """What a kernel launch would bake in of ``obj``: shapes and dtypes of arrays (their
    contents are device memory), host scalars as values, slices, specs, containers."""
    if isinstance(obj, DeviceArray):
        return ("dev", obj.shape, obj.dtype.str)
    if isinstance(obj, np.ndarray):
        return ("host", obj.shape, obj.dtype.str)
    if isinstance(obj, slice):
        return ("slice", _signature(obj.start), _signature(obj.stop), _signature(obj.step))
    if isinstance(obj, MaskSpec):
        return ("mask", _signature((obj.q_pos, obj.k_pos, obj.ancestors)), obj.causal,
                obj.window, obj.window_mode, obj.base_pos)
    if isinstance(obj, (list, tuple)):
        return tuple(_signature(e) for e in obj)
    if isinstance(obj, dict):
        return tuple((k, _signature(v)) for k, v in sorted(obj.items()))
    if obj is None or isinstance(obj, (bool, int, float, str, np.generic, type(Ellipsis))):
        return obj
    if isinstance(obj, (type, np.dtype)):
        return str(obj)
    return type(obj).__name__


LEDGER = Ledger()  # module-global: a DeviceArray's methods have no other way to reach it

# Kernels the CuPy twin of each op starts for one call in a decode / verify / draft step (read from
# kernels_cupy/<family>.py; an op absent here starts one; a function of the call's arguments where
# it depends on the shape). Attention: decode v3 (its split combine inside the kernel) where its
# plan takes the shape (<= 16 query rows, d % 4 == 0, d <= 256; the twin also needs 16-byte
# aligned views, which a step's fresh products and cache halves are), else v2's key-split kernel
# and its combine; write_kv: K and V in one kernel (listed, though one is the default, because it
# replaced two). The chunked GDN is a prefill op (three kernels per block of chunks,
# kernels_cupy/gdn.py) and is not on a step's path.


def _attention_launches(q, k, *args, **kwargs) -> int:
    try:
        plan_decode_v3(q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[0], 132)
    except ValueError:
        return 2
    return 1


TWIN_LAUNCHES = {"attention": _attention_launches, "causal_conv1d": 2, "causal_conv1d_tree": 2,
                 "write_kv": 1}
# Ops whose twins read an array of these many axes in place when its last axis is contiguous
# (rows, and heads, may be strided: ``kernels_cupy._launch.f32_strided``); any other
# non-contiguous argument costs a copy.
READS_STRIDED_ROWS = {"swiglu": (2,), "geglu": (2,), "qk_norm_rope": (3,), "gdn_gates": (2,),
                      "sigmoid_gate": (2, 3), "l2_norm": (3,), "write_kv": (3,)}
# NumPy functions that start no kernel on CuPy: views, shapes, dtype and host-side queries.
_NO_KERNEL = frozenset({"reshape", "transpose", "swapaxes", "moveaxis", "expand_dims", "squeeze",
                        "broadcast_to", "result_type", "shape", "ndim", "size", "may_share_memory",
                        "shares_memory", "iscomplexobj", "atleast_1d", "atleast_2d", "ravel"})


def _caller() -> str:
    """The innermost dflash_ref frame of the current stack: the line that made the copy."""
    for fr in reversed(traceback.extract_stack()[:-1]):
        if "/dflash_ref/" in fr.filename:
            return f"dflash_ref/{fr.filename.split('/dflash_ref/')[-1]}:{fr.lineno} ({fr.name})"
    return "a test"


def _host_arrays(obj) -> int:
    """How many would-be uploads ``obj`` holds: host ndarrays (not 0-d), lists of numbers,
    MaskSpec fields; tuples (shapes, index tuples) and lists are searched, scalars are not."""
    if isinstance(obj, DeviceArray):
        return 0
    if isinstance(obj, np.ndarray):
        return int(obj.ndim > 0)
    if isinstance(obj, MaskSpec):
        return sum(_host_arrays(a) for a in (obj.q_pos, obj.k_pos, obj.ancestors))
    if isinstance(obj, list) and obj and all(
            isinstance(e, (bool, int, float, np.generic)) for e in obj):
        return 1  # CuPy would copy a list of numbers as an array
    if isinstance(obj, (list, tuple)):
        return sum(_host_arrays(e) for e in obj)
    if isinstance(obj, dict):
        return sum(_host_arrays(v) for v in obj.values())
    return 0


def _strip(obj):
    """DeviceArrays as plain ndarray views of the same memory (lists, tuples, MaskSpecs too)."""
    if isinstance(obj, DeviceArray):
        return obj.view(np.ndarray)
    if isinstance(obj, MaskSpec):
        return dataclasses.replace(obj, q_pos=_strip(obj.q_pos), k_pos=_strip(obj.k_pos),
                                   ancestors=_strip(obj.ancestors))
    if isinstance(obj, list):
        return [_strip(e) for e in obj]
    if isinstance(obj, tuple):
        items = [_strip(e) for e in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items()}
    return obj


def _wrap(obj):
    """Results as DeviceArrays (a NumPy scalar becomes a 0-d one, as CuPy returns)."""
    if isinstance(obj, DeviceArray):
        return obj
    if isinstance(obj, np.ndarray):
        return obj.view(DeviceArray)
    if isinstance(obj, np.generic):
        return np.asarray(obj).view(DeviceArray)
    if isinstance(obj, tuple):
        items = [_wrap(e) for e in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
    if isinstance(obj, list):
        return [_wrap(e) for e in obj]
    return obj


class DeviceArray(np.ndarray):
    """An array "on the device" of :func:`counting_backend` (module docstring)."""

    __module__ = "cupy_emulated_by_tests.device_counter"  # read as a device array (docstring)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        for x in inputs:
            if _host_arrays(x):
                LEDGER.add("uploads", f"a host operand of {ufunc.__name__}")
        LEDGER.add("launches", f"ufunc {ufunc.__name__}" + ("" if method == "__call__" else
                                                           f".{method}"))
        LEDGER.record(f"ufunc {ufunc.__name__}.{method}", inputs, kwargs)
        return _wrap(getattr(ufunc, method)(*_strip(inputs), **_strip(kwargs)))

    def __array_function__(self, func, types, args, kwargs):
        if _host_arrays(args) + _host_arrays(kwargs):
            LEDGER.add("uploads", f"a host argument of np.{func.__name__}")
        if func.__name__ not in _NO_KERNEL:
            LEDGER.add("launches", f"np.{func.__name__}")
        LEDGER.record(f"np.{func.__name__}", args, kwargs)
        return _wrap(func(*_strip(args), **_strip(kwargs)))

    def __getitem__(self, idx):
        if _host_arrays(idx if isinstance(idx, tuple) else (idx,)):
            LEDGER.add("uploads", "a host index")
        LEDGER.record("getitem", self, idx)
        return _wrap(np.ndarray.__getitem__(self.view(np.ndarray), _strip(idx)))

    def __setitem__(self, idx, value):
        if _host_arrays(idx if isinstance(idx, tuple) else (idx,)) + _host_arrays(value):
            LEDGER.add("uploads", "a host index or value in an assignment")
        LEDGER.add("launches", "an assignment")
        LEDGER.record("setitem", self, idx, value)
        np.ndarray.__setitem__(self.view(np.ndarray), _strip(idx), _strip(value))

    def _read(self, what: str):
        LEDGER.add("downloads", what)
        return self.view(np.ndarray)

    def __int__(self):
        return int(self._read("int()"))

    def __float__(self):
        return float(self._read("float()"))

    def __bool__(self):
        return bool(self._read("bool()"))

    def __index__(self):
        return self._read("an index").__index__()

    def item(self, *args):
        return self._read(".item()").item(*args)

    def tolist(self):
        return self._read(".tolist()").tolist()

    def get(self):
        return np.array(self._read(".get()"))

    def astype(self, dtype, *args, copy=True, **kwargs):
        if np.dtype(dtype) != self.dtype or copy:
            LEDGER.add("launches", ".astype")
        LEDGER.record(".astype", self, dtype, copy)
        return _wrap(self.view(np.ndarray).astype(dtype, *args, copy=copy, **kwargs))

    def copy(self, *args, **kwargs):
        LEDGER.add("launches", ".copy()")
        LEDGER.record(".copy", self)
        return _wrap(self.view(np.ndarray).copy(*args, **kwargs))

    def __repr__(self):
        return f"DeviceArray({np.ndarray.__repr__(self.view(np.ndarray))})"


class _DeviceXP:
    """numpy as a device array module: what it makes is a DeviceArray; ``asarray`` and friends
    of host data are uploads."""

    _UPLOADS = frozenset({"asarray", "array", "ascontiguousarray", "asanyarray"})

    def __getattr__(self, name):
        attr = getattr(np, name)
        if isinstance(attr, type) or not callable(attr):  # dtypes, scalar types, constants
            return attr
        if name in self._UPLOADS:
            def upload(a, *args, **kwargs):
                if not isinstance(a, DeviceArray):
                    LEDGER.add("uploads", f"xp.{name}")
                elif name == "array" or not a.flags.c_contiguous:
                    LEDGER.add("launches", f"xp.{name} (a copy)")
                LEDGER.record(f"xp.{name}", a, args, kwargs)
                return _wrap(attr(_strip(a), *args, **kwargs))
            return upload

        def on_device(*args, **kwargs):
            if _host_arrays(args) + _host_arrays(kwargs):
                LEDGER.add("uploads", f"a host argument of xp.{name}")
            if name not in _NO_KERNEL and name not in ("empty", "empty_like"):
                LEDGER.add("launches", f"xp.{name}")
            LEDGER.record(f"xp.{name}", args, kwargs)
            return _wrap(attr(*_strip(args), **_strip(kwargs)))
        return on_device


def _download(arr) -> np.ndarray:
    """``be.to_numpy`` of the counting backend: reading a DeviceArray is a download."""
    if isinstance(arr, DeviceArray):
        return np.array(arr._read("be.to_numpy"))
    return np.asarray(arr)


def _upload(arr):
    """``be.to_backend`` of the counting backend: anything but a DeviceArray is an upload."""
    if not isinstance(arr, DeviceArray):
        LEDGER.add("uploads", "be.to_backend")
    return _wrap(np.asarray(_strip(arr)))


def _read_in_place(op: str, a: np.ndarray) -> bool:
    """Whether op's twin reads ``a`` as it is (READS_STRIDED_ROWS; the rule of
    ``kernels_cupy._launch.f32_strided``)."""
    return (a.ndim in READS_STRIDED_ROWS.get(op, ()) and a.dtype == np.float32
            and a.strides[-1] == a.itemsize and all(s >= 0 and s % 4 == 0 for s in a.strides))


def _device_op(name: str, fn):
    def op(*args, **kwargs):
        for a in (*args, *kwargs.values()):
            if _host_arrays(a):
                LEDGER.add("uploads", f"a host argument of op {name}")
            if (isinstance(a, DeviceArray) and a.ndim and not a.flags.c_contiguous
                    and not _read_in_place(name, a)):
                LEDGER.add("launches", f"a contiguous copy for op {name}")
        launches = TWIN_LAUNCHES.get(name, 1)
        for _ in range(launches if isinstance(launches, int) else launches(*args, **kwargs)):
            LEDGER.add("launches", f"op {name}")
        LEDGER.record(f"op {name}", args, kwargs)
        return _wrap(fn(*_strip(args), **_strip(kwargs)))

    op.__name__ = op.__qualname__ = name
    return op


def counted(fn, *args, **kwargs):
    """Run ``fn(*args, **kwargs)`` with a fresh :data:`LEDGER`: (its result, and the uploads,
    downloads and launches that call made, each a list of "what at file:line")."""
    LEDGER.reset()
    out = fn(*args, **kwargs)
    return out, list(LEDGER.uploads), list(LEDGER.downloads), list(LEDGER.launches)


def counting_backend() -> Backend:
    """A fresh backend: NumPy's ops and results, with :data:`LEDGER` keeping the books (and
    the replays of captured steps: :func:`capture_recorded`)."""
    ref = get_backend("numpy")
    ops = SimpleNamespace(**{n: _device_op(n, f) for n, f in vars(ref.ops).items()})
    return Backend("numpy", _DeviceXP(), ops, to_numpy=_download, to_backend=_upload,
                   capture=capture_recorded)
