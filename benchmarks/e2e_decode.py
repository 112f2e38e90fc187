"""End to end on one device: a Qwen3-4B-shaped target and a DFlash drafter through ``generate``
(docs/performance.md, "What remains to be measured", goals 4 and 5).

    python benchmarks/e2e_decode.py            # Qwen3-4B shapes on the GPU (~18 GB of float32)
    python benchmarks/e2e_decode.py --quick    # the same widths, 8 target layers (a smoke run)
    python benchmarks/e2e_decode.py --tiny     # tiny shapes, NumPy without a GPU (the CPU test)

Both models are built in memory from their config dicts with the project's own classes
(``TargetConfig``, ``DrafterConfig``, their tensor schemas, ``TargetModel``, ``DFlashDrafter``),
random float32 weights generated on the device; nothing is downloaded:

    target   Qwen/Qwen3-4B's config.json: hidden 2560, 36 layers, 32 query / 8 KV heads of 128,
             intermediate 9728, vocab 151936, tied embeddings (the fields
             tests/config/configs.py::qwen3_4b records); 4.02e9 parameters, 16.1 GB
    drafter  the shape of z-lab/Qwen3-4B-DFlash-b16: the z-lab layout of the published
             z-lab/Qwen3-8B-DFlash-b16 config (tests/config/configs.py) at the 4B's widths:
             5 layers, block 16, mask id 151669, captures [1, 9, 17, 25, 33] =
             build_target_layer_ids(36, 5) (docs/config.md, "target_layer_ids");
             5.37e8 parameters, the published checkpoint's count

Checks first (a mismatch prints MISMATCH on stderr, no table, exit 1):
    - a 16-row verify forward gives the logits of 16 one-token decode forwards of the same tokens;
    - greedy speculative ``generate`` emits plain greedy ``generate``'s tokens (a near tie of the
      two candidates' logits ends the comparison, and the line says where).

Rows:
    copy      device-to-device copy: the bandwidth the floor is read against
    decode    plain greedy ``generate``: tokens/s against the weight-read floor, copy bandwidth /
              target weight bytes (every weight is read once per token); goal 4: >= 50%
    verify    a 16-token verify forward against a 1-token decode forward at the prompt's context;
              goal 5: <= 1.5x
    generate  speculative greedy ``generate``'s wall time (draft and verify phases) beside plain
              ``generate``'s. Random weights make the drafts near worthless (tau close to 1), so
              the row measures what a step costs; the break-even tau (step time / decode time)
              is the acceptance a trained drafter needs for speculation to pay.
    graphs    the same with each decode and 16-row verify step replayed as one CUDA graph
              (``new_state(kv_capacity=..., graphs=True)``, dflash_ref/models/graphs.py), beside
              the eager forwards on the same fixed-capacity stores: a 1-token and a 16-token
              forward, plain and speculative ``generate`` (their tokens checked against the
              eager runs' first), each mode's state warmed up first (the graphed one's decode,
              verify and draft steps captured there, never inside a timing).

Times are wall clock with the device synchronised before and after (kernel launch overhead
included, as a decode step pays it), medians over ``--iters``. Without a usable GPU the script
exits 1 with one line on stderr and prints nothing on stdout, unless ``--tiny`` (then NumPy).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a source checkout

from dflash_ref.backend import (  # noqa: E402
    cupy_device_description,
    cupy_unavailable_reason,
    get_backend,
)
from dflash_ref.config import (  # noqa: E402
    DrafterConfig,
    TargetConfig,
    build_target_layer_ids,
    drafter_expected_tensors,
    expected_tensors,
)
from dflash_ref.models.drafter import DFlashDrafter  # noqa: E402
from dflash_ref.models.target import TargetModel  # noqa: E402
from dflash_ref.spec_decode.loop import generate  # noqa: E402
from dflash_ref.spec_decode.observe import Clock  # noqa: E402
from dflash_ref.spec_decode.warmup import warm_up  # noqa: E402

VERIFY = 16  # the verify width of goal 5 and the drafter's block size
VERIFY_TOL = 1e-3  # of max |logit|: 16-row and 1-row matrix products sum in different orders
TIE_TOL = 1e-4  # of max |logit|: two candidates this close may swap between those orders

# Qwen/Qwen3-4B's widths (goal 4's target), the same with 8 layers, and a tiny CPU shape.
SHAPES = {
    "full": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                 num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936),
    "tiny": dict(hidden_size=64, intermediate_size=160, num_hidden_layers=6,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=1000),
}
SHAPES["quick"] = {**SHAPES["full"], "num_hidden_layers": 8}
DRAFTER_LAYERS = {"full": 5, "quick": 5, "tiny": 2}
RUNS = {  # prompt tokens, new tokens, copy MiB
    "full": (512, 64, 1024), "quick": (128, 24, 64), "tiny": (48, 24, 8),
}


class Mismatch(AssertionError):
    pass


# ---------------------------------------------------------------------------------- the models


def target_config(shape: dict) -> dict:
    """A Qwen3 config.json dict (Qwen/Qwen3-4B's fields) with ``shape``'s sizes; torch_dtype
    float32, as the weights built here are."""
    return {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False,
        "hidden_act": "silu", "max_position_embeddings": 40960, "rms_norm_eps": 1e-06,
        "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
        "tie_word_embeddings": True, "torch_dtype": "float32", "use_sliding_window": False,
        **shape,
    }


def drafter_config(shape: dict, n_layers: int) -> dict:
    """A z-lab DFlash drafter config.json dict (z-lab/Qwen3-8B-DFlash-b16's fields) for a target
    of ``shape``: its widths, ``n_layers`` layers, the authors' default capture ids."""
    L, V = shape["num_hidden_layers"], shape["vocab_size"]
    return {
        **shape,
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "attention_bias": False,
        "block_size": VERIFY, "hidden_act": "silu", "max_position_embeddings": 40960,
        "dflash_config": {"mask_token_id": 151669 if V == 151936 else V - 1,
                          "target_layer_ids": build_target_layer_ids(L, n_layers)},
        "layer_types": ["full_attention"] * n_layers, "num_hidden_layers": n_layers,
        "num_target_layers": L, "rms_norm_eps": 1e-06, "rope_scaling": None,
        "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": False,
        "use_sliding_window": False,
    }


def random_weights(xp, shapes: dict, seed: int) -> dict:
    """Float32 weights on ``xp``'s device for every ``name -> shape`` (HF [out, in] layout):
    matrices N(0, 1/fan_in), embedding rows N(0, 1), norm weights 1 + 0.1 N(0, 1) (as
    ``dflash_ref.tiny``, so activations keep unit scale through the layers)."""
    rng = xp.random.default_rng(seed)
    out = {}
    for name in sorted(shapes):
        shape = shapes[name]
        w = rng.standard_normal(shape, dtype=xp.float32)
        if len(shape) == 1:
            w *= xp.float32(0.1)
            w += xp.float32(1.0)
        elif "embed_tokens" not in name:
            w *= xp.float32(1.0 / np.sqrt(shape[1]))
        out[name] = w
    return out


def build_pair(be, size: str):
    """(target, drafter, target weight bytes, drafter weight bytes) for ``size``."""
    shape = SHAPES[size]
    tcfg = TargetConfig.from_hf(target_config(shape))
    t_w = random_weights(be.xp, expected_tensors(tcfg), seed=1)
    target = TargetModel(tcfg, t_w, backend=be)
    dcfg = DrafterConfig.from_hf(drafter_config(shape, DRAFTER_LAYERS[size]))
    d_w = random_weights(be.xp, drafter_expected_tensors(dcfg), seed=2)
    drafter = DFlashDrafter(dcfg, d_w, target)
    return target, drafter, sum(w.nbytes for w in t_w.values()), sum(w.nbytes for w in d_w.values())


# ---------------------------------------------------------------------------------- checks


def _host(be, x) -> np.ndarray:
    return np.asarray(be.to_numpy(x), dtype=np.float64)


def prefilled(target, prompt):
    """A fresh state holding ``prompt`` (only the last row's logits are computed)."""
    state = target.new_state()
    target.forward(prompt, state, logits_rows=slice(-1, None))
    return state


def check_verify_equals_decodes(target, prompt, ids) -> float:
    """The verify forward of ``ids`` [n] after ``prompt`` gives the logits [n, V] of n one-token
    decode forwards of the same ids; returns max |difference| / max |logit|."""
    be = target.be
    state = prefilled(target, prompt)
    decodes = np.stack([_host(be, target.forward([t], state).logits[0]) for t in ids])
    verify = _host(be, target.forward(ids, prefilled(target, prompt)).logits)
    err = float(np.abs(verify - decodes).max() / np.abs(decodes).max())
    if not np.isfinite(err) or err > VERIFY_TOL:
        raise Mismatch(f"a {len(ids)}-row verify differs from {len(ids)} one-token decodes by "
                       f"{err:.3g} of max |logit| (> {VERIFY_TOL:g})")
    return err


def check_same_tokens(target, prompt, plain: list[int], spec: list[int]) -> str:
    """Speculative == plain greedy tokens, or equal up to a near tie (then say where)."""
    n = next((i for i, (a, b) in enumerate(zip(plain, spec)) if a != b), None)
    if n is None and len(plain) == len(spec):
        return f"speculative greedy == plain greedy ({len(plain)} tokens)"
    if n is None:
        raise Mismatch(f"speculative generate gave {len(spec)} tokens, plain {len(plain)}")
    history = np.concatenate([prompt, plain[:n]]).astype(np.int64)
    row = _host(target.be, target.forward(history, target.new_state(),
                                          logits_rows=slice(-1, None)).logits[0])
    gap = float(abs(row[plain[n]] - row[spec[n]]) / np.abs(row).max())
    if gap > TIE_TOL:
        raise Mismatch(f"speculative greedy emits {spec[n]} at token {n} where plain greedy "
                       f"emits {plain[n]}; their logits differ by {gap:.3g} of max (no tie)")
    return (f"speculative greedy == plain greedy for {n} tokens, then a near tie "
            f"({gap:.1e} of max |logit|)")


# ---------------------------------------------------------------------------------- timing


def measure_graphs(target, drafter, prompt, n_new: int, plain, spec, clock: Clock,
                   iters: int) -> tuple[str, dict]:
    """The graphs row (module docstring): one fixed-capacity state per mode, warmed up (the
    graphed one's decode, verify and draft steps captured there), the runs' tokens checked
    against the eager ``generate``'s, then timed."""
    cap = prompt.size + n_new + 4 * VERIFY + 1  # the prompt, the tokens, a warm-up's overrun
    runs = {}
    for mode in (False, True):
        state = target.new_state(kv_capacity=cap, graphs=mode)
        warm_up(target, drafter, prompt, state=state)
        state.truncate(0)  # every run reuses the state (and its captured steps)
        p = generate(target, None, prompt, n_new, state=state)
        state.truncate(0)
        s = generate(target, drafter, prompt, n_new, state=state)
        check_same_tokens(target, prompt, plain.tokens, p.tokens)
        check_same_tokens(target, prompt, spec.tokens, s.tokens)
        state.truncate(0)
        target.forward(prompt, state, logits_rows=slice(-1, None))
        t1 = forward_time(target, state, np.array([7]), clock, iters)
        t16 = forward_time(target, state, np.arange(VERIFY), clock, iters)
        decode_s = p.timings["plain"] / (len(p.tokens) - 1)
        runs[mode] = {"decode_tok_s": 1 / decode_s, "forward_1_ms": t1 * 1e3,
                      "forward_16_ms": t16 * 1e3, "spec_s": s.timings["total"]}
    g, e = runs[True], runs[False]
    return (f"decode {g['decode_tok_s']:9.1f} tok/s (eager {e['decode_tok_s']:.1f})   forward "
            f"1 / 16 tokens {g['forward_1_ms']:.3f} / {g['forward_16_ms']:.3f} ms (eager "
            f"{e['forward_1_ms']:.3f} / {e['forward_16_ms']:.3f})   speculative "
            f"{g['spec_s']:.3f} s (eager {e['spec_s']:.3f})", {"graphs": g, "eager": e})


def median_time(clock: Clock, fn, iters: int, warmup: int = 2) -> float:
    """Median wall seconds of ``fn()``, the device synchronised before and after each run."""
    times = []
    for i in range(warmup + iters):
        t0 = clock.now()
        fn()
        if i >= warmup:
            times.append(clock.now() - t0)
    return float(np.median(times))


def copy_bandwidth(be, clock: Clock, mib: int, iters: int) -> tuple[float, float]:
    """(seconds, bytes/s read + written) of a device-to-device copy of ``mib`` MiB."""
    src = be.xp.ones(mib * 2**18, be.xp.float32)
    dst = be.xp.empty_like(src)
    t = median_time(clock, lambda: dst.__setitem__(Ellipsis, src), iters)
    return t, 2 * src.nbytes / t


def forward_time(target, state, ids, clock: Clock, iters: int) -> float:
    """Median seconds of one forward of ``ids`` on ``state``, rolled back after each run."""
    n0 = state.length

    def run():
        target.forward(ids, state)
        state.rollback(n0)

    return median_time(clock, run, iters)


# ---------------------------------------------------------------------------------- main


def _size(n_bytes: int) -> str:
    return f"{n_bytes / 1e9:.2f} GB" if n_bytes >= 1e8 else f"{n_bytes / 1e6:.2f} MB"


def device_name(be) -> str:
    if be.name == "cupy":
        return cupy_device_description()
    return f"NumPy on the CPU ({os.cpu_count()} cores)"


def measure(be, size: str, iters: int) -> list[str]:
    """Check, then time; the table's lines (raises Mismatch before any timing)."""
    n_prompt, n_new, copy_mib = RUNS[size]
    target, drafter, t_bytes, d_bytes = build_pair(be, size)
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, target.config.vocab_size, n_prompt)
    for d in (None, drafter):  # warm-up: kernels loaded, the libraries' plans made
        generate(target, d, prompt, 4)
    plain = generate(target, None, prompt, n_new)
    spec = generate(target, drafter, prompt, n_new)
    err = check_verify_equals_decodes(target, prompt, rng.integers(0, 1000, VERIFY))
    same = check_same_tokens(target, prompt, plain.tokens, spec.tokens)

    clock = Clock(be, None)
    t_copy, bw = copy_bandwidth(be, clock, copy_mib, iters)
    decode_s = plain.timings["plain"] / (len(plain.tokens) - 1)
    floor_s = t_bytes / bw
    state = prefilled(target, prompt)
    t1 = forward_time(target, state, np.array([7]), clock, iters)
    t16 = forward_time(target, state, rng.integers(0, 1000, VERIFY), clock, iters)
    steps = len(spec.acceptance_lengths)
    step_s = (spec.timings.get("draft", 0.0) + spec.timings.get("verify", 0.0)) / max(steps, 1)
    graphs_line, _ = measure_graphs(target, drafter, prompt, n_new, plain, spec, clock, iters)
    cfg, dcfg = target.config, drafter.config
    return [
        f"device: {device_name(be)}",
        f"target: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
        f"{cfg.num_attention_heads}/{cfg.num_key_value_heads} heads of {cfg.head_dim}, "
        f"vocab {cfg.vocab_size}, float32 random weights {_size(t_bytes)}",
        f"drafter: {dcfg.num_hidden_layers} layers, captures {list(dcfg.target_layer_ids)}, "
        f"block {dcfg.block_size}, {_size(d_bytes)}; prompt {n_prompt} tokens",
        f"checked: {VERIFY}-row verify == {VERIFY} one-token decodes ({err:.1e} of max |logit|); "
        f"{same}",
        "wall times with the device synchronised, medians",
        f"copy      {copy_mib} MiB d2d {t_copy * 1e3:9.3f} ms   {bw / 1e9:8.1f} GB/s "
        f"(read + write)",
        f"decode    {1 / decode_s:9.1f} tok/s   floor {1 / floor_s:9.1f} tok/s "
        f"({_size(t_bytes)} / {bw / 1e9:.1f} GB/s)   ratio {floor_s / decode_s:5.2f}"
        f"   (goal >= 0.50)",
        f"verify    {VERIFY} tokens {t16 * 1e3:9.3f} ms   1-token decode {t1 * 1e3:9.3f} ms   "
        f"ratio {t16 / t1:5.2f}   (goal <= 1.50)",
        f"generate  {n_new} tokens speculative {spec.timings['total']:8.3f} s (draft "
        f"{spec.timings.get('draft', 0.0):.3f} s, verify {spec.timings.get('verify', 0.0):.3f} "
        f"s, {steps} steps, tau {spec.tau:.2f})   plain {plain.timings['total']:8.3f} s   "
        f"break-even tau {step_s / decode_s:5.2f}",
        f"graphs    {graphs_line}",
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="8 target layers (a smoke run)")
    size.add_argument("--tiny", action="store_true", help="tiny shapes; NumPy without a GPU")
    p.add_argument("--iters", type=int, default=10, help="timed runs per row (median kept)")
    a = p.parse_args(argv)
    reason = cupy_unavailable_reason()
    if reason is not None and not a.tiny:
        print(f"e2e_decode: no usable CUDA GPU ({reason}); nothing to measure", file=sys.stderr)
        return 1
    be = get_backend("auto")
    try:
        lines = measure(be, "tiny" if a.tiny else "quick" if a.quick else "full", a.iters)
    except Mismatch as exc:
        print(f"MISMATCH, no timings printed:\n{exc}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
