"""Gated DeltaNet benchmark: recurrent vs chunked, NumPy and CuPy, tokens/s against T.

    python benchmarks/gdn.py                 # T = 256 .. 16384, H = HV = 4, K = V = 128, float32
    python benchmarks/gdn.py --cpu-only      # NumPy only (the T = 4096 speedup line included)
    python benchmarks/gdn.py --quick         # T = 256, 1024 (a smoke run)
    python benchmarks/gdn.py --v-heads 8     # GQA (r = 2)

For every T the inputs are checked first: chunked vs recurrent on NumPy, and on a GPU each CuPy
form vs NumPy, with the ``float32_gdn`` tolerance (dflash_ref.testing). A mismatch aborts with
the case and the error before any timing is printed. NumPy times are the best of ``--repeats``
runs, recurrent and chunked interleaved so that both see the same machine state; CuPy times are
CUDA-event medians after a warm-up. A GPU section that cannot run says why and is skipped.
GFLOP/s uses the work measure 4 K V T HV of flashinfer's GDN tables (flashinfer-ai/flashinfer
pull 3788, the table in its description), the same for both forms, so it reads as throughput
comparable with the published numbers.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a source checkout

from dflash_ref.backend import cupy_device_description, cupy_unavailable_reason  # noqa: E402
from dflash_ref.ops.gdn import gdn_chunked, gdn_recurrent  # noqa: E402
from dflash_ref.testing import assert_close  # noqa: E402

DEFAULT_T = (256, 1024, 4096, 16384)
CRITERION_T = 4096


def make_inputs(T, H, HV, K, V, seed=0):
    """float32 q, k (L2-normalised), v, g in [-1, 0], beta in (0, 1), zero initial state."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((T, H, K))
    k = rng.standard_normal((T, H, K))
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((T, HV, V))
    g = rng.uniform(-1.0, 0.0, (T, HV))
    beta = rng.uniform(0.0, 1.0, (T, HV))
    return tuple(a.astype(np.float32) for a in (q, k, v, g, beta))


def check(actual, expected, what: str) -> None:
    for name, a, e in zip(("o", "state"), actual, expected):
        assert_close(a, e, "float32_gdn", op=what, tensor=name)


def bench_numpy(Ts, H, HV, K, V, repeats):
    """Check, then time; returns rows (T, recurrent s, chunked s)."""
    inputs = {T: make_inputs(T, H, HV, K, V, seed=T) for T in Ts}
    for T in Ts:  # correctness first: every T, before any timing
        check(gdn_chunked(*inputs[T]), gdn_recurrent(*inputs[T]),
              f"numpy chunked vs recurrent, T={T}")
    print(f"checked: NumPy chunked == recurrent (float32_gdn) for T in {list(Ts)}")
    rows = []
    for T in Ts:
        args = inputs[T]
        gdn_chunked(*args)  # warm-up
        rec, chk = [], []
        for _ in range(repeats):
            rec.append(_wall(gdn_recurrent, args))
            chk.append(_wall(gdn_chunked, args))
        rows.append((T, min(rec), min(chk)))
    return rows


def _wall(fn, args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def gflop(T, HV, K, V) -> float:
    """The 4 K V T HV work measure (flashinfer's GDN tables), in GFLOP."""
    return 4.0 * K * V * T * HV / 1e9


START_LOAD = os.getloadavg()[0]  # 1-minute load average when the script started


def load_note() -> str:
    """A warning when other processes competed for the CPU (the load average at start)."""
    cpus = os.cpu_count() or 1
    if START_LOAD < 0.75 * cpus:
        return ""
    return (f"  [load average {START_LOAD:.1f} on {cpus} CPUs at start: other processes compete "
            f"for the cores "
            f"and for the BLAS threads, so the chunked (BLAS-bound) times suffer most; rerun on "
            f"an idle machine]")


def print_numpy_table(rows, H, HV, K, V, repeats):
    print(f"\nNumPy float32, H={H} HV={HV} K={K} V={V}, best of {repeats} "
          f"(recurrent and chunked interleaved){load_note()}")
    print(f"{'T':>6} {'recurrent ms':>13} {'tok/s':>10} {'GFLOP/s':>8} {'chunked ms':>11} "
          f"{'tok/s':>10} {'GFLOP/s':>8} {'speedup':>8}")
    for T, r, c in rows:
        w = gflop(T, HV, K, V)
        print(f"{T:>6} {r * 1e3:>13.1f} {T / r:>10.0f} {w / r:>8.1f} {c * 1e3:>11.1f} "
              f"{T / c:>10.0f} {w / c:>8.1f} {r / c:>7.2f}x")
    for T, r, c in rows:
        if T == CRITERION_T:
            print(f"chunked vs recurrent NumPy speedup at T={T}: {r / c:.2f}x (target >= 4x)")


def bench_cupy(Ts, H, HV, K, V, iters):
    import cupy as cp

    from dflash_ref.backend import get_backend

    ops = get_backend("cupy").ops
    inputs = {T: make_inputs(T, H, HV, K, V, seed=T) for T in Ts}
    dev = {T: tuple(cp.asarray(a) for a in args) for T, args in inputs.items()}
    for T in Ts:  # correctness first
        ref = gdn_chunked(*inputs[T])
        check(ops.gdn_recurrent(*dev[T]), ref, f"cupy recurrent vs numpy, T={T}")
        check(ops.gdn_chunked(*dev[T]), ref, f"cupy chunked vs numpy, T={T}")
    print(f"checked: CuPy recurrent and chunked == NumPy (float32_gdn) for T in {list(Ts)}")
    rows = []
    for T in Ts:
        rows.append((T, _cuda_median(cp, ops.gdn_recurrent, dev[T], iters),
                     _cuda_median(cp, ops.gdn_chunked, dev[T], iters)))
    return rows


def _cuda_median(cp, fn, args, iters) -> float:
    for _ in range(2):
        fn(*args)
    times = []
    for _ in range(iters):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn(*args)
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) / 1e3)
    return float(np.median(times))


def print_cupy_table(rows, H, HV, K, V, iters):
    print(f"\nCuPy float32 on {cupy_device_description()}, H={H} HV={HV} K={K} V={V}, "
          f"median of {iters} (CUDA events)")
    print(f"{'T':>6} {'recurrent ms':>13} {'tok/s':>11} {'GFLOP/s':>8} {'chunked ms':>11} "
          f"{'tok/s':>11} {'GFLOP/s':>8} {'speedup':>8}")
    for T, r, c in rows:
        w = gflop(T, HV, K, V)
        print(f"{T:>6} {r * 1e3:>13.3f} {T / r:>11.0f} {w / r:>8.1f} {c * 1e3:>11.3f} "
              f"{T / c:>11.0f} {w / c:>8.1f} {r / c:>7.2f}x")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--T", type=int, nargs="+", default=list(DEFAULT_T), help="sequence lengths")
    p.add_argument("--heads", type=int, default=4, help="q/k heads H")
    p.add_argument("--v-heads", type=int, default=None, help="value heads HV (default H)")
    p.add_argument("--dim", type=int, default=128, help="K = V head dim")
    p.add_argument("--repeats", type=int, default=3, help="NumPy runs per form (best kept)")
    p.add_argument("--iters", type=int, default=20, help="CuPy timed runs (median kept)")
    p.add_argument("--cpu-only", action="store_true", help="skip the CuPy section")
    p.add_argument("--quick", action="store_true", help="T = 256, 1024 only")
    a = p.parse_args(argv)
    Ts = [256, 1024] if a.quick else a.T
    H, K = a.heads, a.dim
    HV = a.v_heads or H
    try:
        rows = bench_numpy(Ts, H, HV, K, K, a.repeats)
    except AssertionError as exc:
        print(f"MISMATCH, no timings printed:\n{exc}", file=sys.stderr)
        return 1
    print_numpy_table(rows, H, HV, K, K, a.repeats)
    if a.cpu_only:
        return 0
    reason = cupy_unavailable_reason()
    if reason is not None:
        print(f"\nCuPy section skipped: no usable CUDA GPU ({reason})")
        return 0
    try:
        gpu_rows = bench_cupy(Ts, H, HV, K, K, a.iters)
    except AssertionError as exc:
        print(f"MISMATCH, no GPU timings printed:\n{exc}", file=sys.stderr)
        return 1
    print_cupy_table(gpu_rows, H, HV, K, K, a.iters)
    return 0


if __name__ == "__main__":
    sys.exit(main())
