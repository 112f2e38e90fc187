"""CuPy twin of :mod:`dflash_ref.ops.attention` (kernels in cuda/attention.cu).

The MaskSpec is never materialised: its positions and scalars go to the kernel, which evaluates
the predicate per (row, key slot) inline and skips key tiles that no row of a block can see.
K and V tiles are staged in shared memory together, with float4 loads when d % 4 == 0 and the
arrays are 16-byte aligned, and double-buffered where shared memory allows (one barrier per key
tile; :func:`plan_launch`).
Long contexts are split over the key axis (flash-decoding style) when the (query, head) grid
alone would leave the GPU mostly idle; a second kernel combines the splits.

A decode step or a verify block (at most 16 query rows, d % 4 == 0, d <= 256, aligned arrays)
runs v3 (:mod:`kernels_cupy.attention_decode_v3`: every warp busy, on keys or on its own rows,
at most 8 key splits, the split combine inside the kernel: one launch). Other decode shapes
(d % 4 != 0, misaligned views, 17..63 query rows) run the v2
kernels (:mod:`kernels_cupy.attention_decode`: one block per GQA group, a cp.async ring of K/V
tiles, key splits filling the GPU, a log-sum-exp combine); ``attention_fwd_*`` above (v1) stays
as their fallback where v2's plan does not fit the device's shared memory (d = 256 on an sm_86 /
sm_89) and as a named kernel for tests.
Many query rows (prefill, a long verify) go to the prefill kernels instead
(:mod:`kernels_cupy.attention_prefill`: 64 query rows of one head per block, K/V streamed once
per query tile, the same per-row arithmetic); :func:`attention` picks one by shape
(``choose_kernel``), :func:`attention_using` names it (tests).
"""

from __future__ import annotations

import functools
import math

import cupy as cp

from dflash_ref.ops.attention import check_attention_args
from dflash_ref.ops.masks import WINDOW_MODES, MaskSpec
from kernels_cupy._build import get_kernel
from kernels_cupy._launch import f32, fp32, i32
from kernels_cupy.attention_decode import COMBINE_THREADS, DEC_WARPS, plan_decode
from kernels_cupy.attention_decode_v3 import MAX_COUNTERS, plan_decode_v3
from kernels_cupy.attention_prefill import PF_WARPS, choose_kernel, plan_prefill, plan_prefill_v2
from kernels_cupy.attention_prefill_tc import FAMILY as TC_FAMILY
from kernels_cupy.attention_prefill_tc import plan_prefill_tc, prefill_kernel
from kernels_cupy.linear import has_tensor_cores

# Must match attention.cu.
WARPS = 4  # ATT_WARPS: threads per block = 128
KEY_TILE = 32  # ATT_KT: one key slot per lane
MAX_RPW = 4  # ATT_MAX_RPW
MAX_HEAD_DIM = 256  # ATT_MAX_D
SHARED_DEFAULT = 48 * 1024  # dynamic shared memory a kernel gets without opting in
# Shared memory per block the plan may use (opting in above SHARED_DEFAULT): fits sm_80 (163 KiB
# opt-in), sm_86 / sm_89 (99 KiB) and sm_90 (227 KiB), and leaves room for two blocks per SM on
# an A100 and an H100. The wrapper lowers it to the device's opt-in maximum if that is smaller.
SHARED_LIMIT = 96 * 1024
COMBINE_BLOCK = 128

# Split the keys only while the grid has fewer than BLOCKS_PER_SM blocks per SM, and never into
# splits shorter than MIN_TILES_PER_SPLIT tiles (each split costs a partial write and a combine).
BLOCKS_PER_SM = 2
MIN_TILES_PER_SPLIT = 8
MAX_SPLITS = 128
KERNEL_CHOICES = ("auto", "decode", "decode_v2", "decode_v3", "prefill", "prefill_v2",
                  "prefill_tc")


def plan_launch(Tq: int, nh: int, nkv: int, d: int, Tk: int, sm_count: int,
                vec4: bool | None = None, shared_limit: int = SHARED_LIMIT) -> dict:
    """The launch geometry of ``attention_fwd_f32`` / ``attention_fwd_vec4_f32`` (pure: tested
    on CPU).

    ``vec4`` (default: ``d % 4 == 0``) selects the float4 kernel; the caller also needs q, k, v
    16-byte aligned (:func:`can_use_vec4`). Returns a dict with rpw (rows per warp), R (rows per
    block), grid (x, y, z), keys_per_split, n_splits, vec4, ld (shared row stride in floats),
    nbuf (K/V buffers: 2 = one barrier per key tile, 1 = two) and shared_mem (bytes).
    """
    vec4 = d % 4 == 0 if vec4 is None else vec4
    if vec4 and d % 4:
        raise ValueError(f"plan_launch: the float4 kernel needs d % 4 == 0, got d={d}")
    g = nh // nkv
    rows = Tq * g  # (query, head) rows per kv head
    rpw_max = MAX_RPW if d <= 128 else 2  # keeps sQ <= 8 KiB up to d = 256
    rpw = max(1, min(rpw_max, math.ceil(rows / WARPS)))
    R = WARPS * rpw
    gx = max(1, math.ceil(rows / R))
    n_tiles = max(1, math.ceil(Tk / KEY_TILE))
    blocks = gx * nkv
    target = BLOCKS_PER_SM * sm_count
    n_splits = 1
    if blocks < target:
        n_splits = min(math.ceil(target / blocks), n_tiles // MIN_TILES_PER_SPLIT, MAX_SPLITS)
        n_splits = max(1, n_splits)
    tiles_per_split = math.ceil(n_tiles / n_splits)
    n_splits = math.ceil(n_tiles / tiles_per_split)  # no empty split
    ld = d + 4 if vec4 else d + 1
    nbuf = 2
    while nbuf > 1 and shared_bytes(R, d, ld, nbuf) > shared_limit:
        nbuf -= 1
    shared_mem = shared_bytes(R, d, ld, nbuf)
    if shared_mem > shared_limit:
        raise ValueError(f"attention: head dim {d} needs {shared_mem} bytes of shared memory per "
                         f"block, more than this device's {shared_limit}")
    return {
        "rpw": rpw, "R": R, "grid": (gx, nkv, n_splits), "n_splits": n_splits,
        "keys_per_split": tiles_per_split * KEY_TILE, "vec4": vec4, "ld": ld, "nbuf": nbuf,
        "shared_mem": shared_mem,
    }


def shared_bytes(R: int, d: int, ld: int, nbuf: int) -> int:
    """Dynamic shared memory of the forward kernels: sQ [R, d] + nbuf x (K, V) [KEY_TILE, ld]."""
    return (R * d + nbuf * 2 * KEY_TILE * ld) * 4


def can_use_vec4(d: int, *ptrs: int) -> bool:
    """float4 loads need d % 4 == 0 and every base address 16-byte aligned (a CuPy view into a
    larger buffer can start anywhere)."""
    return d % 4 == 0 and all(p % 16 == 0 for p in ptrs)


@functools.cache
def _sm_count(device_id: int) -> int:
    return int(cp.cuda.Device(device_id).attributes["MultiProcessorCount"])


@functools.cache
def _shared_limit(device_id: int) -> int:
    optin = int(cp.cuda.Device(device_id).attributes["MaxSharedMemoryPerBlockOptin"])
    return min(SHARED_LIMIT, optin)


@functools.cache
def _shared_per_sm(device_id: int) -> int:
    return int(cp.cuda.Device(device_id).attributes["MaxSharedMemoryPerMultiprocessor"])


@functools.cache
def _optin(device_id: int) -> int:
    return int(cp.cuda.Device(device_id).attributes["MaxSharedMemoryPerBlockOptin"])


@functools.cache
def _kernel(name: str, shared_mem: int, device_id: int, family: str = "attention"):
    """Kernel ``name``, its dynamic shared memory limit raised to ``shared_mem`` if needed."""
    kernel = get_kernel(family, name)
    if shared_mem > SHARED_DEFAULT and kernel.max_dynamic_shared_size_bytes < shared_mem:
        kernel.max_dynamic_shared_size_bytes = shared_mem  # cudaFuncAttributeMaxDynamicShared...
    return kernel


@functools.lru_cache(maxsize=64)
def _no_mask_arrays(Tq: int, Tk: int, device_id: int) -> tuple:
    """q_pos, k_pos (zeros) and a dummy ancestor byte for mask=None: made once per shape and
    device (no allocation or fill launch per call); the kernels only read them."""
    return cp.zeros(Tq, cp.int32), cp.zeros(Tk, cp.int32), cp.zeros(1, cp.uint8)


def _mask_args(mask: MaskSpec | None, Tq: int, Tk: int) -> tuple:
    """(q_pos, k_pos, anc, causal, window, window_mode, has_base, base_pos, has_anc) for C."""
    if mask is None:  # every key visible: valid slots (k_pos 0 >= 0), no rule, no window
        zeros_q, zeros_k, anc = _no_mask_arrays(Tq, Tk, cp.cuda.Device().id)
        return (zeros_q, zeros_k, anc, i32(0), i32(0), i32(0), i32(0), i32(0), i32(0))
    q_pos = cp.ascontiguousarray(cp.asarray(mask.q_pos).astype(cp.int32, copy=False))
    k_pos = cp.ascontiguousarray(cp.asarray(mask.k_pos).astype(cp.int32, copy=False))
    if mask.ancestors is not None:
        anc = cp.ascontiguousarray(cp.asarray(mask.ancestors).astype(cp.uint8))  # [Tq, Tk]
    else:
        anc = cp.zeros(1, cp.uint8)  # never read (has_anc = 0)
    return (
        q_pos, k_pos, anc, i32(mask.causal), i32(mask.window or 0),
        i32(WINDOW_MODES.index(mask.window_mode)), i32(mask.base_pos is not None),
        i32(mask.base_pos or 0), i32(mask.ancestors is not None),
    )


def attention(q, k, v, mask=None, scale=None, softcap=None) -> cp.ndarray:
    """Twin of :func:`dflash_ref.ops.attention.attention`: q [Tq, nh, d], k/v [Tk, nkv, d].

    Rows with no visible key are zeros, as in the reference. d must be <= 256. The kernel is
    chosen by shape (:func:`kernels_cupy.attention_prefill.choose_kernel`): the prefill kernel
    for Tq >= 64 with a grid of at least one block per SM, the v3 decode kernel for the decode and
    verify shapes it takes, the v2 decode kernel otherwise (v1 where v2's plan does not fit the
    device's shared memory).
    """
    return attention_using("auto", q, k, v, mask, scale, softcap)


def attention_using(kernel: str, q, k, v, mask=None, scale=None, softcap=None) -> cp.ndarray:
    """:func:`attention` with the kernel named: "auto" (by shape, as :func:`attention`),
    "decode_v3" (``attention_decode_v3_*``; a ValueError for the shapes it does not take:
    more than 16 query rows, d % 4, d > 256, misaligned views),
    "decode_v2" (``attention_decode_*``; a ValueError where its plan does not fit the device),
    "decode" (v1, ``attention_fwd_*``), "prefill" (``attention_prefill_*``), "prefill_v2"
    (``attention_prefill_v2_f32``; a ValueError where it does not fit: d % 4, d > 128,
    misaligned views) or "prefill_tc" (``attention_prefill_tc_f32``, 3xTF32 tensor cores,
    sm_80+; the same ValueError); the others take any shape. "auto" runs v3 for the decode
    shapes it takes, v2 for the other decode shapes, v1 only where v2's plan does not fit, and
    for the prefill shapes the kernel ``attention_prefill_tc.prefill_kernel`` names (tensor
    cores on sm_80+, else prefill v2, else v1; its flags ``PREFILL_TC``, ``PREFILL_V2``). Same
    result either way, to float32 rounding (the tensor-core kernel: within its derived bound);
    tests run the kernels on the same inputs."""
    if kernel not in KERNEL_CHOICES:
        raise ValueError(f"attention_using: kernel must be one of {KERNEL_CHOICES}, got "
                         f"{kernel!r}")
    q, k, v = f32(q, "attention", "q"), f32(k, "attention", "k"), f32(v, "attention", "v")
    Tq, nh, d, Tk, nkv = check_attention_args(q, k, v, mask, softcap)
    if d > MAX_HEAD_DIM:
        raise ValueError(
            f"attention: head dim {d} > {MAX_HEAD_DIM}, the CuPy kernel's limit; use the NumPy "
            "backend or extend ATT_MAX_DC in attention.cu"
        )
    if Tq == 0 or nh == 0 or d == 0 or Tk == 0:
        return cp.zeros((Tq, nh, d), cp.float32)  # no key at all: every row is empty -> 0
    scale = d ** -0.5 if scale is None else scale
    dev = cp.cuda.Device().id
    vec4 = can_use_vec4(d, q.data.ptr, k.data.ptr, v.data.ptr)
    if kernel == "auto":
        kernel = choose_kernel(Tq, nh, nkv, d, Tk, _sm_count(dev), _shared_limit(dev), vec4)
        kernel = "decode_auto" if kernel == "decode" else kernel  # v2, v1 as its fallback
        if kernel == "prefill":  # tensor cores on sm_80+, else v2, else v1
            kernel = prefill_kernel(d, vec4, has_tensor_cores(dev))
    out = cp.empty((Tq, nh, d), cp.float32)
    margs = _mask_args(mask, Tq, Tk)
    softcap = fp32(0.0 if softcap is None else softcap)
    if kernel == "prefill_tc":
        plan = plan_prefill_tc(Tq, nh, nkv, d, _optin(dev), _shared_per_sm(dev), vec4)
        _kernel(plan["kernel"], plan["shared_mem"], dev, TC_FAMILY)(
            plan["grid"], plan["block"],
            (q, k, v, *margs[:3], out, i32(Tq), i32(Tk), i32(nh), i32(nkv), i32(d), fp32(scale),
             softcap, *margs[3:], i32(plan["stages"]), i32(plan["ldk"]), i32(plan["ldv"])),
            shared_mem=plan["shared_mem"],
        )
        return out
    if kernel == "prefill_v2":
        plan = plan_prefill_v2(Tq, nh, nkv, d, _optin(dev), _shared_per_sm(dev), vec4)
        _kernel(plan["kernel"], plan["shared_mem"], dev, "attention_prefill")(
            plan["grid"], plan["block"],
            (q, k, v, *margs[:3], out, i32(Tq), i32(Tk), i32(nh), i32(nkv), i32(d), fp32(scale),
             softcap, *margs[3:], i32(plan["stages"])),
            shared_mem=plan["shared_mem"],
        )
        return out
    if kernel == "prefill":
        plan = plan_prefill(Tq, nh, nkv, d, Tk, _shared_limit(dev), vec4)
        _kernel(plan["kernel"], plan["shared_mem"], dev)(
            plan["grid"], (PF_WARPS * 32,),
            (q, k, v, *margs[:3], out, i32(Tq), i32(Tk), i32(nh), i32(nkv), i32(d), fp32(scale),
             softcap, *margs[3:], i32(plan["ld"]), i32(plan["kv_bufs"])),
            shared_mem=plan["shared_mem"],
        )
        return out
    if kernel in ("decode_auto", "decode_v3"):
        try:
            plan = plan_decode_v3(Tq, nh, nkv, d, Tk, _sm_count(dev))
            if not vec4:
                raise ValueError("attention (decode v3): q, k and v must be 16-byte aligned")
        except ValueError:
            if kernel == "decode_v3":
                raise
        else:
            _decode_v3(plan, q, k, v, margs, out, scale, softcap, dev)
            return out
    if kernel in ("decode_auto", "decode_v2"):
        try:
            plan = plan_decode(Tq, nh, nkv, d, Tk, _sm_count(dev), vec4, _optin(dev),
                               _shared_per_sm(dev))
        except ValueError:
            if kernel == "decode_v2":
                raise
        else:
            _decode_v2(plan, q, k, v, margs, out, scale, softcap, dev)
            return out
    plan = plan_launch(Tq, nh, nkv, d, Tk, _sm_count(dev), vec4=vec4,
                       shared_limit=_shared_limit(dev))
    n_splits = plan["n_splits"]
    if n_splits == 1:
        part_o, part_ml = cp.empty(1, cp.float32), cp.empty(2, cp.float32)  # never written
    else:
        part_o = cp.empty((n_splits, Tq * nh, d), cp.float32)
        part_ml = cp.empty((n_splits, Tq * nh, 2), cp.float32)
    args = (
        q, k, v, *margs[:3], out, part_o, part_ml,
        i32(Tq), i32(Tk), i32(nh), i32(nkv), i32(d), fp32(scale), softcap, *margs[3:],
        i32(plan["rpw"]), i32(plan["keys_per_split"]), i32(n_splits), i32(plan["ld"]),
        i32(plan["nbuf"]),
    )
    name = "attention_fwd_vec4_f32" if plan["vec4"] else "attention_fwd_f32"
    _kernel(name, plan["shared_mem"], dev)(
        plan["grid"], (WARPS * 32,), args, shared_mem=plan["shared_mem"]
    )
    if n_splits > 1:
        get_kernel("attention", "attention_combine_f32")(
            (Tq * nh,), (COMBINE_BLOCK,), (part_o, part_ml, out, i32(Tq * nh), i32(d),
                                           i32(n_splits))
        )
    return out


@functools.cache
def _ticket_counters(device_id: int) -> cp.ndarray:
    """The split tickets of ``attention_decode_v3_*``, one uint32 per (kv head, row block)
    (``MAX_COUNTERS``, checked by the plan), zeroed once per device: the last block of each
    (kv head, row block) sets its counter back to 0, so no
    call needs a memset and a captured graph replays with the same buffer. One launch at a time
    (the package runs one stream). Allocated from CuPy's default pool even when the first call
    is a graph capture's warm-up under its private pool, which may be released later."""
    with cp.cuda.using_allocator(cp.get_default_memory_pool().malloc):
        return cp.zeros(MAX_COUNTERS, cp.uint32)


def _decode_v3(plan: dict, q, k, v, margs: tuple, out, scale: float, softcap, dev: int) -> None:
    """Launch ``attention_decode_v3_*`` into ``out`` (its split combine is in the kernel)."""
    Tq, nh, d = q.shape
    nkv = k.shape[1]
    n_splits = plan["n_splits"]
    if n_splits == 1:
        part_o, part_ml = out, out  # never written
    else:
        part_o = cp.empty((n_splits, Tq * nh, d), cp.float32)
        part_ml = cp.empty((n_splits, Tq * nh, 2), cp.float32)
    _kernel(plan["kernel"], plan["shared_mem"], dev, "attention_decode_v3")(
        plan["grid"], plan["block"],
        (q, k, v, *margs[:3], out, part_o, part_ml, _ticket_counters(dev), i32(Tq),
         i32(k.shape[0]), i32(nh), i32(nkv), i32(d), fp32(scale), softcap, *margs[3:],
         i32(plan["keys_per_split"]), i32(n_splits), i32(plan["rows_per_block"]),
         i32(plan["key_warps"])),
        shared_mem=plan["shared_mem"],
    )


def _decode_v2(plan: dict, q, k, v, margs: tuple, out, scale: float, softcap, dev: int) -> None:
    """Launch ``attention_decode_*`` (and the combine when the keys are split) into ``out``."""
    Tq, nh, d = q.shape
    Tk = k.shape[0]
    n_splits = plan["n_splits"]
    if n_splits == 1:
        part_o, part_ml = out, out  # never written
    else:
        part_o = cp.empty((n_splits, Tq * nh, d), cp.float32)
        part_ml = cp.empty((n_splits, Tq * nh, 2), cp.float32)
    _kernel(plan["kernel"], plan["shared_mem"], dev, "attention_decode")(
        plan["grid"], (DEC_WARPS * 32,),
        (q, k, v, *margs[:3], out, part_o, part_ml, i32(Tq), i32(Tk), i32(nh),
         i32(k.shape[1]), i32(d), fp32(scale), softcap, *margs[3:], i32(plan["R"]),
         i32(plan["keys_per_split"]), i32(n_splits), i32(plan["ld"]), i32(plan["stages"])),
        shared_mem=plan["shared_mem"],
    )
    if n_splits > 1:
        get_kernel("attention_decode", "attention_decode_combine_f32")(
            (Tq * nh,), (COMBINE_THREADS,), (part_o, part_ml, out, i32(Tq * nh), i32(d),
                                              i32(n_splits)))
