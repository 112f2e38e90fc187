"""CuPy twin of :mod:`dflash_ref.ops.linear` (kernels in cuda/linear.cu and cuda/linear_mma.cu,
plan in linear_plan.py).

1 to 16 rows: on sm_80+ the tensor-core kernel ``linear_mma_rows16_f32`` (3xTF32, within the
bound of kernels_cupy/tf32.py of the exact product); below sm_80, and always through
:func:`linear_cuda_cores` (the float32 reference twin it is checked against), ``linear_rows*``,
which reads each weight element once (float4 loads when K % 4 == 0 and
x, w start on 16 bytes; else the scalar-load kernel, same summation order per element group of
one), with at most one wave of resident blocks. More rows: cuBLAS through ``cupy.matmul``. No
rows or no columns: an empty [T, N] array. Nothing here synchronises with the host or builds an
array on the host; the output comes from CuPy's memory pool (``cupy.empty``); the plan of a
shape is computed once per device (cached).
"""

from __future__ import annotations

import functools

import cupy as cp

from dflash_ref.ops.linear import check_linear_shapes
from kernels_cupy._build import get_kernel
from kernels_cupy._launch import f32, i32
from kernels_cupy.linear_mma_plan import MIN_SM
from kernels_cupy.linear_plan import can_use_vec4, plan_linear, resident_blocks


@functools.cache
def has_tensor_cores(device_id: int) -> bool:
    """Whether device ``device_id`` runs the TF32 ``mma.sync`` kernels (sm_80 and later)."""
    return int(cp.cuda.Device(device_id).compute_capability) >= MIN_SM


@functools.cache
def _wave(device_id: int, family: str, name: str) -> int:
    """Blocks of kernel ``name`` that device ``device_id`` runs at once (SMs x blocks per SM)."""
    attrs = cp.cuda.Device(device_id).attributes
    per_sm = resident_blocks(get_kernel(family, name).num_regs,
                             attrs["MaxRegistersPerMultiprocessor"],
                             attrs["MaxThreadsPerMultiProcessor"])
    return attrs["MultiProcessorCount"] * per_sm


@functools.lru_cache(maxsize=1024)
def _plan(T: int, N: int, K: int, vec4: bool, device_id: int, tensor_cores: bool) -> dict:
    p = plan_linear(T, N, K, vec4, tensor_cores=tensor_cores)
    if p["path"] != "kernel":
        return p
    return plan_linear(T, N, K, vec4, max_blocks=_wave(device_id, p["family"], p["kernel"]),
                       tensor_cores=tensor_cores)


def linear(x, w) -> cp.ndarray:
    """Twin of :func:`dflash_ref.ops.linear.linear`: x [T, K], w [N, K] -> x @ w.T [T, N] f32."""
    return _linear(x, w, tensor_cores=None)


def linear_cuda_cores(x, w) -> cp.ndarray:
    """:func:`linear` on float32 CUDA cores on every device (``linear_rows*``: the reference
    twin of the tensor-core kernel, equal to its CPU emulation bit for bit)."""
    return _linear(x, w, tensor_cores=False)


def _linear(x, w, tensor_cores: bool | None) -> cp.ndarray:
    """x @ w.T; ``tensor_cores`` None: the device decides (:func:`has_tensor_cores`)."""
    x, w = f32(x, "linear", "x"), f32(w, "linear", "w")
    check_linear_shapes(x.shape, w.shape)
    (T, K), N = x.shape, w.shape[0]
    dev = x.device.id
    tc = has_tensor_cores(dev) if tensor_cores is None else tensor_cores
    p = _plan(T, N, K, can_use_vec4(K, x.data.ptr, w.data.ptr), dev, tc)
    if p["path"] == "empty":
        return cp.empty((T, N), cp.float32)
    if p["path"] == "cublas":
        return cp.matmul(x, w.T)  # [T, K] @ [K, N] -> [T, N]
    y = cp.empty((T, N), cp.float32)
    get_kernel(p["family"], p["kernel"])(p["grid"], p["block"], (x, w, y, i32(T), i32(N), i32(K)))
    return y
