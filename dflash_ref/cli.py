"""The ``dflash-ref`` command line.

Subcommands:
    demo    the main job: plain vs speculative decoding on the shipped tiny target + drafter
            (real HF / z-lab layouts, no download), or on ``--target DIR --drafter DIR``.
    info    package version, the backends available here, and for CuPy the device or the
            precise reason it is unavailable; the NVRTC version used by the compile check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

import dflash_ref
from dflash_ref.backend import cupy_device_description, cupy_unavailable_reason


def _nvrtc_line() -> str:
    try:
        from kernels_cupy._build import families, kernel_names, nvrtc_version

        major, minor = nvrtc_version()
        n_kernels = sum(len(kernel_names(f)) for f in families())
        return f"NVRTC {major}.{minor} (compiles {len(families())} sources, {n_kernels} kernels)"
    except Exception as exc:  # no CuPy or no NVRTC library: say which
        return f"unavailable ({type(exc).__name__}: {exc})"


def cmd_info(args: argparse.Namespace) -> int:
    """Print version, backends and device facts."""
    print(f"dflash-ref {dflash_ref.__version__}")
    print(f"python     {sys.version.split()[0]}")
    print("backends:")
    print(f"  numpy    available (numpy {np.__version__})")
    reason = cupy_unavailable_reason()
    if reason is None:
        import cupy

        print(f"  cupy     available (cupy {cupy.__version__}): {cupy_device_description()}")
    else:
        print(f"  cupy     unavailable: {reason}")
    print(f"  auto     -> {'cupy' if reason is None else 'numpy'}")
    print(f"nvrtc      {_nvrtc_line()}")
    return 0


DEMO_PROMPT = (3, 17, 42, 99, 5, 128, 77, 64)


def demo_dirs() -> tuple[Path, Path]:
    """The shipped demo checkpoints: (target dir, drafter dir)."""
    root = Path(dflash_ref.__file__).parent / "data" / "demo"
    return root / "target", root / "drafter"


def _run_timed(target, drafter, prompt, args, label):
    from dflash_ref.spec.loop import generate

    try:
        from tqdm.auto import tqdm
    except ImportError:  # the progress bar is optional
        tqdm = None
    bar = tqdm(total=args.max_new_tokens, desc=label, leave=False) if tqdm else None
    res = generate(target, drafter, prompt, args.max_new_tokens, block_size=args.block_size,
                   verify=args.verify, on_tokens=bar.update if bar else None)
    if bar:
        bar.close()
    return res


def cmd_demo(args: argparse.Namespace) -> int:
    """Plain vs speculative decoding, with a table; exit 1 if the outputs differ."""
    from dflash_ref.models.drafter import DFlashDrafter
    from dflash_ref.models.target import TargetModel

    if (args.target is None) != (args.drafter is None):
        print("error: give both --target and --drafter, or neither (shipped demo)",
              file=sys.stderr)
        return 2
    target_dir, drafter_dir = ((Path(args.target), Path(args.drafter)) if args.target
                               else demo_dirs())
    target = TargetModel.from_pretrained(target_dir, backend=args.backend)
    drafter = DFlashDrafter.from_pretrained(drafter_dir, target)
    prompt = [int(t) for t in args.prompt.split(",")] if args.prompt else list(DEMO_PROMPT)
    print(f"target  {target_dir}  ({target.config.family}, {target.config.num_hidden_layers} "
          f"layers, hidden {target.config.hidden_size}, vocab {target.config.vocab_size})")
    print(f"drafter {drafter_dir}  (block {drafter.block_size}, captures "
          f"{list(drafter.config.target_layer_ids)})")
    print(f"backend {target.be.name}; prompt {prompt}; {args.max_new_tokens} new tokens; "
          f"verify {args.verify}")
    plain = _run_timed(target, None, prompt, args, "plain")
    spec = _run_timed(target, drafter, prompt, args, "speculative")
    rows = [("plain", plain), ("speculative", spec)]
    print()
    print(f"{'mode':<12} {'tokens':>6} {'tau':>6} {'accept':>7} {'target fwd':>10} "
          f"{'wall s':>8} {'tok/s':>8}")
    for name, r in rows:
        wall = r.timings.get("total", 0.0)
        print(f"{name:<12} {len(r.tokens):>6} {r.tau:>6.2f} {r.acceptance_rate:>7.1%} "
              f"{r.target_forward_passes:>10} {wall:>8.3f} {len(r.tokens) / max(wall, 1e-9):>8.1f}")
    same = plain.tokens == spec.tokens
    print()
    print(f"identical output: {'yes' if same else 'NO'}")
    print(f"tokens: {spec.tokens}")
    return 0 if same else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dflash-ref",
        description="Reference implementation of DFlash speculative decoding (NumPy + CuPy).",
    )
    parser.add_argument("--version", action="version", version=dflash_ref.__version__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p_demo = sub.add_parser("demo", help="plain vs speculative decoding on tiny checkpoints")
    p_demo.add_argument("--target", help="target directory (HF layout); default: shipped demo")
    p_demo.add_argument("--drafter", help="drafter directory (z-lab layout)")
    p_demo.add_argument("--backend", default="numpy", choices=["numpy", "cupy", "auto"])
    p_demo.add_argument("--max-new-tokens", type=int, default=64)
    p_demo.add_argument("--block-size", type=int, default=None)
    p_demo.add_argument("--verify", default="chain", choices=["chain", "tree"])
    p_demo.add_argument("--prompt", help="comma-separated token ids (default: a fixed prompt)")
    p_demo.set_defaults(func=cmd_demo)
    p_info = sub.add_parser("info", help="version, available backends, CUDA device")
    p_info.set_defaults(func=cmd_info)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
