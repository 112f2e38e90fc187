"""Loading and compile-checking the CUDA sources of ``kernels_cupy/cuda/``.

One tuple of compile options, ``COMPILE_OPTIONS``, serves both paths:

- at run time :func:`get_kernel` builds a ``cupy.RawModule`` per family (cached) and returns a
  kernel from it;
- in CI :func:`compile_all` calls NVRTC directly for explicit architectures (sm_80, sm_90). It
  never touches a GPU: CuPy's own compile path asks the driver for the current device first,
  which fails on a machine without one.

A family's compiled source is ``cuda/common.cuh``, then the family's own headers
(``FAMILY_HEADERS``), then ``cuda/<family>.cu`` (textual concatenation rather than ``#include``,
so CuPy's source-keyed cache always sees the headers).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

CUDA_DIR = Path(__file__).parent / "cuda"
COMMON_HEADER = CUDA_DIR / "common.cuh"
# Headers shared by some families only: the GDN token step of the chain and tree recurrences;
# the MaskSpec predicate of the attention kernels that evaluate masks inline; the 3xTF32 split
# and MMA of the tensor-core kernels that keep the non-finite rule.
FAMILY_HEADERS: dict[str, tuple[str, ...]] = {"gdn": ("gdn_step.cuh",),
                                              "gdn_tree": ("gdn_step.cuh",),
                                              "attention": ("attention_mask.cuh",),
                                              "attention_decode": ("attention_mask.cuh",),
                                              "attention_decode_v3": ("attention_mask.cuh",),
                                              "attention_prefill": ("attention_mask.cuh",),
                                              "attention_prefill_tc": ("attention_mask.cuh",
                                                                       "tf32_mma.cuh"),
                                              "gdn_chunk_tc": ("tf32_mma.cuh",)}

# Deliberately no --use_fast_math: the twins must track the float32 reference to a few ulp
# (precise expf/logf/sincosf/division). -ftz=true flushes subnormals, as CuPy kernels usually
# run; tests draw inputs without subnormals.
COMPILE_OPTIONS: tuple[str, ...] = ("--std=c++17", "-ftz=true")
CHECK_ARCHS: tuple[str, ...] = ("sm_80", "sm_90")

# Threads per block for the row kernels (one block per row). 256 = 8 warps: enough to stride a
# 4096-wide hidden row in 16 steps and a 152k vocabulary row in ~600.
ROW_BLOCK = 256
ELEMENTWISE_BLOCK = 256
# Threads per block of qk_norm_rope_f32 (cuda/rope.cu): one block per head row of d channels;
# 128 covers a d = 128 head in one step and d = 256 in two.
QK_THREADS = 128

_KERNEL_RE = re.compile(
    r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(')


class KernelCompileError(RuntimeError):
    """NVRTC rejected a source; the message carries the compiler log."""


def families() -> list[str]:
    """Names of the kernel families: one ``cuda/<family>.cu`` file each, sorted."""
    return sorted(p.stem for p in CUDA_DIR.glob("*.cu"))


def source(family: str) -> str:
    """The exact text compiled for ``family``: common.cuh, its own headers, ``<family>.cu``."""
    path = CUDA_DIR / f"{family}.cu"
    if not path.exists():
        raise FileNotFoundError(f"no CUDA source {path}; families are {families()}")
    parts = [COMMON_HEADER] + [CUDA_DIR / h for h in FAMILY_HEADERS.get(family, ())] + [path]
    return "\n".join(p.read_text() for p in parts)


@functools.cache
def kernel_names(family: str) -> tuple[str, ...]:
    """The ``extern "C" __global__`` kernels declared in ``<family>.cu`` (not the header).

    Read and parsed once per family (cached): :func:`get_kernel` checks names against it, and a
    launch must never read a file (with a read per launch an ``rms_norm`` call took 67.7 us of
    host time, 13.4 us with this cache: docs/performance.md)."""
    return tuple(_KERNEL_RE.findall((CUDA_DIR / f"{family}.cu").read_text()))


@functools.cache
def _module(family: str):
    import cupy

    return cupy.RawModule(code=source(family), options=COMPILE_OPTIONS, backend="nvrtc")


@functools.cache
def get_kernel(family: str, name: str):
    """The compiled ``cupy.RawKernel`` ``name`` of ``family``.

    Cached per (family, name): the first call compiles and loads the family's module (NVRTC, then
    the driver) and checks the name; every later call is one dictionary lookup, with no file read
    and no compile (tests/kernels/test_build_cache.py)."""
    if name not in kernel_names(family):
        raise KeyError(f"kernel {name!r} is not declared in {family}.cu: "
                       f"{list(kernel_names(family))}")
    return _module(family).get_function(name)


def nvrtc_compile(family: str, arch: str) -> bytes:
    """Compile ``family`` with NVRTC for ``arch`` (e.g. "sm_90") and return the CUBIN.

    Uses ``COMPILE_OPTIONS`` plus ``--gpu-architecture=arch``; needs the NVRTC library (from the
    CUDA toolkit or the ``nvidia-cuda-nvrtc-cu12`` wheel) but no GPU and no driver.
    """
    from cupy_backends.cuda.libs import nvrtc

    prog = nvrtc.createProgram(source(family), f"{family}.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, [*COMPILE_OPTIONS, f"--gpu-architecture={arch}"])
        except nvrtc.NVRTCError as exc:
            log = nvrtc.getProgramLog(prog)
            raise KernelCompileError(f"{family}.cu failed to compile for {arch}:\n{log}") from exc
        return nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)


def compile_all(archs: tuple[str, ...] = CHECK_ARCHS) -> dict[str, list[str]]:
    """Compile every family for every arch; check each declared kernel is in the CUBIN.

    Returns ``{family: [kernel names]}``. Raises :class:`KernelCompileError` on any failure.
    """
    report = {}
    for family in families():
        names = kernel_names(family)
        for arch in archs:
            cubin = nvrtc_compile(family, arch)
            missing = [n for n in names if n.encode() not in cubin]
            if missing:
                raise KernelCompileError(f"{family}.cu for {arch}: kernels {missing} not in CUBIN")
        report[family] = names
    return report


def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC library that :func:`nvrtc_compile` uses."""
    from cupy_backends.cuda.libs import nvrtc

    return tuple(nvrtc.getVersion())
