"""The ``dflash-ref`` command line.

Subcommands:
    info    package version, the backends available here, and for CuPy the device or the
            precise reason it is unavailable; the NVRTC version used by the compile check.
"""

from __future__ import annotations

import argparse
import sys

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dflash-ref",
        description="Reference implementation of DFlash speculative decoding (NumPy + CuPy).",
    )
    parser.add_argument("--version", action="version", version=dflash_ref.__version__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
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
