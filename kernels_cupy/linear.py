"""CuPy twin of :mod:`dflash_ref.ops.linear` (kernels in cuda/linear.cu, plan in linear_plan.py).

1 to 16 rows: ``linear_rows*`` reads each weight element once (float4 loads when K % 4 == 0 and
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
from kernels_cupy.linear_plan import can_use_vec4, plan_linear, resident_blocks


@functools.cache
def _wave(device_id: int, name: str) -> int:
    """Blocks of kernel ``name`` that device ``device_id`` runs at once (SMs x blocks per SM)."""
    attrs = cp.cuda.Device(device_id).attributes
    per_sm = resident_blocks(get_kernel("linear", name).num_regs,
                             attrs["MaxRegistersPerMultiprocessor"],
                             attrs["MaxThreadsPerMultiProcessor"])
    return attrs["MultiProcessorCount"] * per_sm


@functools.lru_cache(maxsize=1024)
def _plan(T: int, N: int, K: int, vec4: bool, device_id: int) -> dict:
    p = plan_linear(T, N, K, vec4)
    if p["path"] != "kernel":
        return p
    return plan_linear(T, N, K, vec4, max_blocks=_wave(device_id, p["kernel"]))


def linear(x, w) -> cp.ndarray:
    """Twin of :func:`dflash_ref.ops.linear.linear`: x [T, K], w [N, K] -> x @ w.T [T, N] f32."""
    x, w = f32(x, "linear", "x"), f32(w, "linear", "w")
    check_linear_shapes(x.shape, w.shape)
    (T, K), N = x.shape, w.shape[0]
    p = _plan(T, N, K, can_use_vec4(K, x.data.ptr, w.data.ptr), x.device.id)
    if p["path"] == "empty":
        return cp.empty((T, N), cp.float32)
    if p["path"] == "cublas":
        return cp.matmul(x, w.T)  # [T, K] @ [K, N] -> [T, N]
    y = cp.empty((T, N), cp.float32)
    get_kernel("linear", p["kernel"])(p["grid"], p["block"], (x, w, y, i32(T), i32(N), i32(K)))
    return y
