"""KVFlash: page-out / page-in throughput, and decode step time vs context with a fixed pool.

NumPy, and CuPy when a GPU is usable (otherwise CuPy is skipped with the reason).

    python benchmarks/kvflash.py                       # both parts
    python benchmarks/kvflash.py --only paging --layers 4 --dtype float32 --backend numpy
    python benchmarks/kvflash.py --only decode --contexts 512,2048,8192 --pool 1024

**Paging.**
For each backend: fill a pool with random rows, page every chunk out and back in, and check that
every (position -> rows) pair is bit-identical to what was written; only then time ``page_out``
(device -> host copy, zeroing of the freed block) and ``page_in`` (host -> device recall) over
many chunks and print time per chunk and achieved bandwidth. A mismatch stops the script before
any timing is printed. On CuPy the host store is pinned memory and the timing uses CUDA events
after a warm-up; on NumPy both sides are host memory (a memcpy benchmark, useful as the reference
point). Upstream (RTX 3090, synchronous era, Q8_0 KV of Qwen3.6-27B): page_out p50 1.26 ms,
page_in p50 0.63 ms per chunk (Luce-Org/lucebox ``optimizations/kvflash/``; docs/kvflash.md,
"Benchmark").

**Decode.** A small random Qwen3 target (``DECODE_MODEL``: 4 layers, hidden 256, 8 query heads,
2 kv heads, head_dim 64) is prefilled to each context length, then one-token decode steps are
timed with the plain KV cache (attention over the whole context) and with a KVFlash pool of
``--pool`` slots (attention over the pool; chunks evicted to the host as the context grows),
alternating the two step by step.
Checked first, per backend: with a pool that covers the context the pooled logits equal the
unpooled ones (teacher forced), and on CuPy every timed pooled step's logits equal NumPy's
(cuBLAS vs NumPy BLAS); the pool's shape never changes. Only then are the timings printed:
median wall time per step (the device synchronised), and the resident attention-KV bytes.
Upstream (RTX 3090, 27B, Q4_K_M): decode flat at 38.6 tok/s from 64K to 256K with a 4K pool,
vs 27.8 -> 13.1 tok/s on the full cache (the same source).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dflash_ref.backend import cupy_device_description, cupy_unavailable_reason  # noqa: E402
from dflash_ref.kvflash import KVFlashPager  # noqa: E402
from dflash_ref.models.target import TargetModel  # noqa: E402
from dflash_ref.testing import Tolerance, assert_close  # noqa: E402
from dflash_ref.tiny import write_tiny_target  # noqa: E402

SINK, TAIL, T = 1, 4, 64
DECODE_MODEL = dict(num_hidden_layers=4, hidden_size=256, intermediate_size=512,
                    num_attention_heads=8, num_key_value_heads=2, head_dim=64)
# Same visible keys in another (slot) order; masked slots add exact zeros.
POOLED = Tolerance(1e-5, 2e-5, "pooled vs plain cache: same keys, float32 reassociation")
TWIN = Tolerance(1e-4, 1e-4, "cuBLAS vs NumPy BLAS through 4 layers")
PREFILL_PIECE = 256  # plain-cache prefill batch (bounds the [T, S] attention scores)


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


# ---------------------------------------------------------------------- decode vs context


def _sync(be) -> None:
    if be.name == "cupy":
        be.xp.cuda.Stream.null.synchronize()


def _prefill(target, state, ids, pooled: bool) -> None:
    # The pooled forward splits into chunk pieces itself; the plain cache takes pieces here.
    step = ids.size if pooled else PREFILL_PIECE
    for a in range(0, ids.size, step):
        target.forward(ids[a:a + step], state)


def decode_pair(target, ids, n_ctx: int, steps: int, pool: int):
    """Prefill ids[:n_ctx] into a plain state and a pooled one, then decode ids[n_ctx:n_ctx+steps]
    one token at a time, alternating the two states step by step (so a noisy period on a shared
    machine slows both alike).

    Returns (seconds [2, steps] plain / pooled, logits [2, steps, V] on the host, the pager).
    """
    pager = KVFlashPager(pool, T, SINK, TAIL)
    states = [target.new_state(), target.new_state(pager=pager)]
    for state in states:
        _prefill(target, state, ids[:n_ctx], state.pager is not None)
    times, logits = np.zeros((2, steps)), [[], []]
    for i in range(steps):
        for j, state in enumerate(states):
            _sync(target.be)
            t0 = time.perf_counter()
            out = target.forward(ids[n_ctx + i: n_ctx + i + 1], state)
            _sync(target.be)
            times[j, i] = time.perf_counter() - t0
            logits[j].append(target.be.to_numpy(out.logits[0]))
    return times, np.array(logits), pager


def checked(actual, expected, tol: Tolerance, case: str) -> None:
    """assert_close, or stop the script before any timing is printed."""
    try:
        assert_close(actual, expected, tol, op="pooled target", case=case)
    except AssertionError as e:
        raise SystemExit(f"decode check FAILED: {e}\nno timings printed") from None


def check_pool_covering_context(target, ids, pool: int) -> None:
    """Pool >= context: the pooled decode logits equal the plain cache's (teacher forced)."""
    n_ctx = pool - 2 * T  # prefill + 8 steps stay inside the pool
    _, (plain, pooled), pager = decode_pair(target, ids, n_ctx, 8, pool)
    if pager.stats.page_outs:
        raise SystemExit("decode check: the covering pool paged out; no timings printed")
    checked(pooled, plain, POOLED, f"{target.be.name}, pool {pool} >= context")


def decode_bench(backend: str, args, model_dir: Path, reference: dict) -> list[str]:
    """Rows of the decode table for one backend; ``reference`` carries NumPy's logits to CuPy."""
    target = TargetModel.from_pretrained(model_dir, backend=backend)
    cfg = target.config
    rng = np.random.default_rng(0)
    ids = rng.integers(0, cfg.vocab_size, size=max(args.contexts) + args.steps + 2)
    check_pool_covering_context(target, ids, args.pool)
    kv_row = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4  # bytes
    results = []
    for n_ctx in args.contexts:
        (t_plain, t_pool), (l_plain, l_pool), pager = decode_pair(target, ids, n_ctx,
                                                                  args.steps + 2, args.pool)
        if pager.pool.data.shape[2] != args.pool or pager.resident_chunks().size > pager.n_blocks:
            raise SystemExit("decode check: the pool grew; no timings printed")
        if n_ctx + args.steps + 2 <= args.pool:
            checked(l_pool, l_plain, POOLED, f"{backend}, context {n_ctx} inside the pool")
        if backend == "numpy":
            reference[n_ctx] = l_pool
        else:
            checked(l_pool, reference[n_ctx], TWIN, f"CuPy vs NumPy, context {n_ctx}")
        # The first 2 steps are warm-up (kernels compiled, buffers primed).
        results.append((n_ctx, float(np.median(t_plain[2:])), float(np.median(t_pool[2:])),
                        pager.stats.page_outs))
    print(f"{backend}: checked (pool covering the context == plain cache; "
          f"{'CuPy == NumPy per step; ' if backend == 'cupy' else ''}pool bounded)")
    return [f"| {backend} | {n} | {tp * 1e3:.2f} | {tq * 1e3:.2f} | {tp / tq:.2f} | "
            f"{n * kv_row / 2**20:.1f} | {args.pool * kv_row / 2**20:.1f} | {outs} |"
            for n, tp, tq, outs in results]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=16, help="pooled full-attention layers")
    ap.add_argument("--heads", type=int, default=4, help="kv heads")
    ap.add_argument("--head-dim", type=int, default=256)
    ap.add_argument("--dtype", default="float16", choices=["float16", "float32"])
    ap.add_argument("--chunks", type=int, default=16, help="chunks paged per timed pass")
    ap.add_argument("--repeat", type=int, default=5, help="timed passes (median reported)")
    ap.add_argument("--backend", default="auto", choices=["auto", "numpy", "cupy"])
    ap.add_argument("--only", default="all", choices=["all", "paging", "decode"])
    ap.add_argument("--contexts", default="512,1024,2048,4096,8192",
                    help="decode: context lengths (comma-separated)")
    ap.add_argument("--pool", type=int, default=512, help="decode: pool slots (multiple of 64)")
    ap.add_argument("--steps", type=int, default=32, help="decode: timed steps (median reported)")
    args = ap.parse_args(argv)
    args.contexts = [int(c) for c in args.contexts.split(",")]

    backends = ["numpy"] if args.backend == "numpy" else []
    reason = cupy_unavailable_reason()
    if args.backend in ("auto", "cupy"):
        if args.backend == "auto":
            backends.insert(0, "numpy")
        if reason is None:
            backends.append("cupy")
        elif args.backend == "cupy":
            raise SystemExit(f"CuPy requested but unusable: {reason}")
    if reason is None:
        print(f"GPU: {cupy_device_description()}")
    if args.only in ("all", "paging"):
        print(f"KVFlash paging: {args.layers} layers x (K, V) x {T} tokens x {args.heads} heads "
              f"x {args.head_dim} x {args.dtype}, {args.chunks} chunks per pass, median of "
              f"{args.repeat}; round trip verified bit-exact before timing")
        rows = ["| backend | chunk MiB | page_out ms | GB/s | page_in ms | GB/s |",
                "|---|---|---|---|---|---|"]
        for be in backends:
            rows += bench(be, args)
        print("\n".join(rows))
    if args.only in ("all", "decode"):
        if args.pool % T or args.pool < (SINK + TAIL + 2) * T:
            raise SystemExit(f"--pool must be a multiple of {T} and >= {(SINK + TAIL + 2) * T}")
        print(f"\nKVFlash decode: random Qwen3 {DECODE_MODEL}, float32; pool {args.pool} slots "
              f"(chunk {T}, sink {SINK}, tail {TAIL}); median of {args.steps} one-token steps "
              f"after 2 warm-up steps")
        rows = ["| backend | context | plain ms/step | pooled ms/step | speed-up | plain KV MiB "
                "| pool KV MiB | page-outs |", "|---|---|---|---|---|---|---|---|"]
        reference: dict = {}
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = write_tiny_target(Path(tmp) / "target", "qwen3", seed=0, **DECODE_MODEL)
            # NumPy runs first: it is CuPy's reference (its rows print only if requested).
            order = ["numpy"] + [b for b in backends if b != "numpy"]
            for be in order:
                be_rows = decode_bench(be, args, model_dir, reference)
                rows += be_rows if be in backends else []
        print("\n".join(rows))
    if "cupy" not in backends:
        print(f"CuPy: skipped ({reason or 'not requested'})")


if __name__ == "__main__":
    main()
