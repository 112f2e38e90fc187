"""Attention benchmark: the CuPy inline-mask kernel vs a materialised-mask CuPy version.

    python benchmarks/attention.py                 # Qwen3-8B heads: nh 32, nkv 8, d 128
    python benchmarks/attention.py --head-dim 256  # Gemma / Qwen3.5 full-attention layers
    python benchmarks/attention.py --quick         # small contexts (a smoke run)

Cases, for each context length ctx:
    decode      Tq = 1,   causal over ctx keys
    decode-swa  Tq = 1,   sliding window 1024 over ctx keys (the kernel skips the tiles outside)
    drafter     Tq = 16,  non-causal over ctx context keys + 16 noise keys (docs/drafter.md)
    verify      Tq = 16,  committed prefix ctx + causal among the 16 batch tokens
    prefill     Tq = ctx, causal (only up to --max-prefill, the dense version's scores are
                nh x ctx x ctx floats)

"kernel" is ``kernels_cupy.attention.attention`` (the MaskSpec evaluated inline, online softmax,
split-K for short grids). "dense" is the same math with the mask materialised on the device
(``kernels_cupy.masks.materialize``) and cuBLAS matmuls over every key; the mask is built before
timing. Every case is checked (kernel vs dense, and vs the NumPy reference where that is cheap)
before any timing is printed; a mismatch aborts with the case and the error. Times are CUDA-event
medians after warm-up. GB/s counts q, k, v and out once; TFLOP/s counts 4 * d flops per visible
(query head, key) pair.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a source checkout

from dflash_ref.backend import cupy_device_description, cupy_unavailable_reason  # noqa: E402
from dflash_ref.ops.attention import attention as np_attention  # noqa: E402
from dflash_ref.ops.masks import (  # noqa: E402
    causal_mask,
    committed_prefix_mask,
    drafter_mask,
    visible,
)
from dflash_ref.testing import assert_close  # noqa: E402

SWA_WINDOW = 1024
NUMPY_CHECK_LIMIT = 2_000_000  # check against NumPy when Tq * Tk * nh is below this


def build_cases(contexts, max_prefill):
    """(name, ctx, MaskSpec) for every case and context length."""
    cases = []
    for ctx in contexts:
        cases.append(("decode", ctx, causal_mask([ctx - 1], np.arange(ctx))))
        cases.append(("decode-swa", ctx, causal_mask([ctx - 1], np.arange(ctx),
                                                     window=SWA_WINDOW)))
        cases.append(("drafter", ctx, drafter_mask(np.arange(ctx), ctx + np.arange(16))))
        cases.append(("verify", ctx, committed_prefix_mask(ctx + np.arange(16),
                                                           np.arange(ctx + 16), ctx)))
        if ctx <= max_prefill:
            cases.append(("prefill", ctx, causal_mask(np.arange(ctx), np.arange(ctx))))
    return cases


def dense_attention(cp, q, k, v, mask_add, scale):
    """Attention with a materialised additive mask [Tq, Tk]: scores for every key, cuBLAS."""
    Tq, nh, d = q.shape
    nkv = k.shape[1]
    g = nh // nkv
    qg = q.reshape(Tq, nkv, g, d).transpose(1, 2, 0, 3)  # [nkv, g, Tq, d]
    kt = k.transpose(1, 2, 0)[:, None]  # [nkv, 1, d, Tk]
    s = cp.matmul(qg, kt) * np.float32(scale) + mask_add  # [nkv, g, Tq, Tk]
    m = s.max(axis=-1, keepdims=True)
    m = cp.where(cp.isfinite(m), m, np.float32(0.0))
    p = cp.exp(s - m)
    denom = p.sum(axis=-1, keepdims=True)
    o = cp.matmul(p, v.transpose(1, 0, 2)[:, None])  # [nkv, g, Tq, d]
    o = o / cp.where(denom > 0, denom, np.float32(1.0))
    return o.transpose(2, 0, 1, 3).reshape(Tq, nh, d)


def time_ms(cp, fn, warmup: int, reps: int) -> float:
    """Median CUDA-event time of ``fn()`` in milliseconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop))
    return float(np.median(times))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--contexts", type=int, nargs="+", default=[512, 2048, 8192, 32768])
    ap.add_argument("--max-prefill", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="contexts 256 and 1024, 5 reps")
    args = ap.parse_args(argv)
    if args.quick:
        args.contexts, args.reps, args.max_prefill = [256, 1024], 5, 1024

    reason = cupy_unavailable_reason()
    if reason is not None:
        print(f"benchmarks/attention.py: no usable CUDA GPU, nothing to time ({reason})",
              file=sys.stderr)
        return 1
    import cupy as cp

    from kernels_cupy.attention import attention as kernel_attention
    from kernels_cupy.masks import materialize as cp_materialize

    nh, nkv, d = args.heads, args.kv_heads, args.head_dim
    scale = d ** -0.5
    rng = np.random.default_rng(0)
    cases = build_cases(args.contexts, args.max_prefill)
    print(f"device: {cupy_device_description()}")
    print(f"heads {nh} / kv heads {nkv} / head dim {d}; float32\n")

    # 1. Correctness first: every case, before any timing is printed.
    prepared = []
    for name, ctx, spec in cases:
        Tq, Tk = spec.shape
        q = cp.asarray(rng.standard_normal((Tq, nh, d), dtype=np.float32))
        k = cp.asarray(rng.standard_normal((Tk, nkv, d), dtype=np.float32))
        v = cp.asarray(rng.standard_normal((Tk, nkv, d), dtype=np.float32))
        mask_add = cp_materialize(spec)  # [Tq, Tk]
        out_kernel = kernel_attention(q, k, v, spec)
        out_dense = dense_attention(cp, q, k, v, mask_add, scale)
        label = f"{name} ctx={ctx}"
        try:
            assert_close(out_kernel, out_dense, "float32_attention", op="attention",
                         tensor="kernel vs dense", case=label)
            if Tq * Tk * nh <= NUMPY_CHECK_LIMIT:
                ref = np_attention(q.get(), k.get(), v.get(), spec)
                assert_close(out_kernel, ref, "float32_attention", op="attention",
                             tensor="kernel vs NumPy", case=label)
        except AssertionError as exc:
            print(f"MISMATCH, no timings printed:\n{exc}", file=sys.stderr)
            return 1
        n_visible = int(np.count_nonzero(visible(spec)))
        prepared.append((name, ctx, spec, q, k, v, mask_add, n_visible))
    print(f"checked {len(prepared)} cases: kernel == dense (== NumPy where cheap)\n")

    # 2. Timings.
    header = (f"{'case':<11} {'ctx':>6} {'Tq':>5} {'Tk':>6} {'kernel ms':>10} {'dense ms':>10} "
              f"{'speedup':>8} {'kernel GB/s':>12} {'kernel TFLOP/s':>15} {'mask MiB':>9}")
    print(header)
    print("-" * len(header))
    for name, ctx, spec, q, k, v, mask_add, n_visible in prepared:
        Tq, Tk = spec.shape
        t_kernel = time_ms(cp, partial(kernel_attention, q, k, v, spec), 3, args.reps)
        t_dense = time_ms(cp, partial(dense_attention, cp, q, k, v, mask_add, scale), 3,
                          args.reps)
        nbytes = 4 * (2 * Tq * nh * d + 2 * Tk * nkv * d)
        flops = 4.0 * d * nh * n_visible
        print(f"{name:<11} {ctx:>6} {Tq:>5} {Tk:>6} {t_kernel:>10.3f} {t_dense:>10.3f} "
              f"{t_dense / t_kernel:>7.2f}x {nbytes / t_kernel / 1e6:>12.1f} "
              f"{flops / t_kernel / 1e9:>15.2f} {mask_add.nbytes / 2**20:>9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
