"""Decode / verify attention per layer on a GPU: the v2 kernel vs v1 (Qwen3-4B heads: 32 query
heads, 8 kv heads, d = 128), at 1, 4 and 16 query rows over a committed prefix of 512 to 32k keys.

    python benchmarks/attention_decode.py            # needs CuPy and a GPU

Each row first checks v2 against v1 (they must agree to float32 rounding, else no timing), then
times both on the GPU alone (scripts/gpu_report.py ``_gpu_time``: calls queued behind a spin
kernel, so the host's launch cost is not in the number). The anchors (torch SDPA, FlashInfer)
are scripts/gpu_report.py's "decode attention/layer" rows.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_report  # noqa: E402

from dflash_ref.ops.masks import committed_prefix_mask  # noqa: E402

TOL = 2e-4  # v2 vs v1: two float32 orders of the same sums, relative to max |v1|


def main() -> int:
    import cupy as cp

    from kernels_cupy.attention import attention_using
    from kernels_cupy.attention_decode import plan_decode

    dev = gpu_report.Device(False)
    print(dev.description, flush=True)
    report = gpu_report.Report(json_path=Path("/dev/null"), meta={})
    ph = gpu_report.Phase("anchors", report, dev, gpu_report.GPU_SIZES, time.perf_counter() + 300,
                          {})
    for ctx in gpu_report.GPU_SIZES.att_decode_ctxs:
        ph.measure(f"decode attention/layer Tk={ctx}",
                   lambda ctx=ctx: gpu_report._decode_attention_vs_anchors(ph, ctx, 32, 8, 128))
    sm = int(cp.cuda.Device().attributes["MultiProcessorCount"])
    for Tq in (1, 4, 16):
        for ctx in (512, 4096, 32768):
            rng = np.random.default_rng(ctx + Tq)
            q = cp.asarray(rng.standard_normal((Tq, 32, 128)).astype(np.float32))
            k, v = (cp.asarray(rng.standard_normal((ctx + Tq, 8, 128)).astype(np.float32))
                    for _ in range(2))
            spec = committed_prefix_mask(  # device int32 positions: no copy per call
                cp.asarray(ctx + np.arange(Tq, dtype=np.int32)),
                cp.arange(ctx + Tq, dtype=np.int32), ctx)
            a = attention_using("decode_v2", q, k, v, spec)
            b = attention_using("decode", q, k, v, spec)
            err = float(cp.abs(a - b).max() / cp.abs(b).max())
            if not err <= TOL:
                print(f"Tq={Tq} Tk={ctx + Tq}: v2 differs from v1 by {err:.2e}: not timed")
                continue
            t2, t1 = (gpu_report._gpu_time(
                dev, lambda name=name, args=(q, k, v, spec): attention_using(name, *args), 5)
                for name in ("decode_v2", "decode"))
            p = plan_decode(Tq, 32, 8, 128, ctx + Tq, sm)
            print(f"Tq={Tq:2d} Tk={ctx + Tq:6d}  v2 {t2 * 1e6:8.1f} us  v1 {t1 * 1e6:8.1f} us  "
                  f"(err {err:.1e}; grid {p['grid']}, {p['stages']} stages, {p['R']} rows)",
                  flush=True)
    from kernels_cupy._build import get_kernel

    for name in ("attention_decode_d128_vec4_f32", "attention_decode_d256_vec4_f32",
                 "attention_decode_d128_f32"):
        kern = get_kernel("attention_decode", name)
        print(f"{name}: {kern.num_regs} registers, {kern.local_size_bytes} bytes local")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
