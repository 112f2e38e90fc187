"""Page-out / page-in throughput of the KVFlash pager, NumPy and (when a GPU is usable) CuPy.

    python benchmarks/kvflash.py                       # 16 layers x 4 kv heads x 256, float16
    python benchmarks/kvflash.py --layers 4 --dtype float32 --backend numpy

For each backend: fill a pool with random rows, page every chunk out and back in, and check that
every (position -> rows) pair is bit-identical to what was written; only then time ``page_out``
(device -> host copy, zeroing of the freed block) and ``page_in`` (host -> device recall) over
many chunks and print time per chunk and achieved bandwidth. A mismatch stops the script before
any timing is printed (STYLE.md §10). On CuPy the host store is pinned memory and the timing uses
CUDA events after a warm-up; on NumPy both sides are host memory (a memcpy benchmark, useful as
the reference point). Upstream (RTX 3090, synchronous era, Q8_0 KV of Qwen3.6-27B): page_out p50
1.26 ms, page_in p50 0.63 ms per chunk (spec/kvflash_gate.md §3).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dflash_ref.backend import cupy_device_description, cupy_unavailable_reason  # noqa: E402
from dflash_ref.kvflash import KVFlashPager  # noqa: E402

SINK, TAIL, T = 1, 4, 64


def build(backend: str, args) -> tuple[KVFlashPager, dict[int, bytes]]:
    """A full pool (sink + tail + 2 + extra blocks) written chunk by chunk with random rows."""
    n_blocks = SINK + TAIL + 2 + args.chunks
    pager = KVFlashPager(n_blocks * T, T, SINK, TAIL, backend=backend, layers=args.layers,
                         n_kv_heads=args.heads, head_dim=args.head_dim, dtype=args.dtype)
    be, rng = pager.be, np.random.default_rng(0)
    for start in range(0, n_blocks * T, T):
        pager.alloc_span(start, T)
        pos = np.arange(start, start + T)
        for layer in pager.pool.layers:
            kv = rng.standard_normal((2, T, args.heads, args.head_dim)).astype(args.dtype)
            pager.write(layer, pos, be.to_backend(kv[0]), be.to_backend(kv[1]))
    return pager, snapshot(pager)


def snapshot(pager: KVFlashPager) -> dict[int, bytes]:
    """position -> bytes of its K and V rows in every layer, over the valid slots."""
    pos = pager.be.to_numpy(pager.slot_positions())
    data = pager.be.to_numpy(pager.pool.data)  # [L, 2, P, H, D]
    return {int(p): data[:, :, s].tobytes() for s, p in enumerate(pos) if p >= 0}


def verify_round_trip(pager: KVFlashPager, written: dict[int, bytes], chunks: list[int]) -> None:
    for c in chunks:
        pager.page_out(c)
    freed = pager.be.to_numpy(pager.pool.data)
    for c in chunks:
        pager.page_in(c)
    after = snapshot(pager)
    if after != written:
        bad = sorted(p for p in written if after.get(p) != written[p])
        raise SystemExit(f"round trip MISMATCH at positions {bad[:8]}...; no timings printed")
    resident_slots = pager.be.to_numpy(pager.slot_positions()) >= 0
    if freed[:, :, ~resident_slots].any():
        raise SystemExit("freed blocks do not read as zeros; no timings printed")


def timed(pager: KVFlashPager, fn, chunks: list[int]) -> float:
    """Seconds per chunk of ``fn(c)`` over ``chunks``: CUDA events on CuPy, perf_counter else."""
    if pager.be.name == "cupy":
        cp = pager.be.xp
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for c in chunks:
            fn(c)
        stop.record()
        stop.synchronize()
        return cp.cuda.get_elapsed_time(start, stop) / 1e3 / len(chunks)
    t0 = time.perf_counter()
    for c in chunks:
        fn(c)
    return (time.perf_counter() - t0) / len(chunks)


def bench(backend: str, args) -> list[str]:
    pager, written = build(backend, args)
    chunks = list(range(SINK, SINK + args.chunks))  # manual paging may take any resident chunk
    verify_round_trip(pager, written, chunks)
    for _ in range(2):  # warm-up: kernels compiled, host buffers allocated, pools primed
        timed(pager, pager.page_out, chunks)
        timed(pager, pager.page_in, chunks)
    outs, ins = [], []
    for _ in range(args.repeat):
        outs.append(timed(pager, pager.page_out, chunks))
        ins.append(timed(pager, pager.page_in, chunks))
    if snapshot(pager) != written:
        raise SystemExit("content changed during the timed loop; timings discarded")
    mb = pager.chunk_bytes / 2**20
    t_out, t_in = float(np.median(outs)), float(np.median(ins))
    return [
        f"| {backend} | {mb:.2f} | {t_out * 1e3:.3f} | {pager.chunk_bytes / t_out / 1e9:.2f} "
        f"| {t_in * 1e3:.3f} | {pager.chunk_bytes / t_in / 1e9:.2f} |"
    ]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=16, help="pooled full-attention layers")
    ap.add_argument("--heads", type=int, default=4, help="kv heads")
    ap.add_argument("--head-dim", type=int, default=256)
    ap.add_argument("--dtype", default="float16", choices=["float16", "float32"])
    ap.add_argument("--chunks", type=int, default=16, help="chunks paged per timed pass")
    ap.add_argument("--repeat", type=int, default=5, help="timed passes (median reported)")
    ap.add_argument("--backend", default="auto", choices=["auto", "numpy", "cupy"])
    args = ap.parse_args(argv)

    backends = ["numpy"] if args.backend == "numpy" else []
    reason = cupy_unavailable_reason()
    if args.backend in ("auto", "cupy"):
        if args.backend == "auto":
            backends.insert(0, "numpy")
        if reason is None:
            backends.append("cupy")
        elif args.backend == "cupy":
            raise SystemExit(f"CuPy requested but unusable: {reason}")
    print(f"KVFlash paging: {args.layers} layers x (K, V) x {T} tokens x {args.heads} heads x "
          f"{args.head_dim} x {args.dtype}, {args.chunks} chunks per pass, median of "
          f"{args.repeat}; round trip verified bit-exact before timing")
    if reason is None:
        print(f"GPU: {cupy_device_description()}")
    rows = ["| backend | chunk MiB | page_out ms | GB/s | page_in ms | GB/s |",
            "|---|---|---|---|---|---|"]
    for be in backends:
        rows += bench(be, args)
    print("\n".join(rows))
    if "cupy" not in backends:
        print(f"CuPy: skipped ({reason or 'not requested'})")


if __name__ == "__main__":
    main()
