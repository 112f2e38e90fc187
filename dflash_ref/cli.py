"""The ``dflash-ref`` command line.

Subcommands:
    demo    the main job: plain vs speculative decoding on the shipped tiny target + drafter
            (real HF / z-lab layouts, no download), or on ``--target DIR --drafter DIR``.
    generate  text in, text out: ``--target`` (directory or GGUF), ``--prompt``, ``--drafter``.
    info    version, the backends here, the CuPy device or why not, the NVRTC version.
    convert SRC OUT   a z-lab drafter directory -> GGUF (``--naming llama.cpp|lucebox``), or a
            Qwen3 / Qwen3.5 / Gemma 3 target directory -> llama.cpp GGUF (docs/formats.md).
    inspect PATH      a GGUF or checkpoint: metadata, tensors, derived config, disagreements.
    compare-weights A B   per-tensor relative RMS / max-abs table; exit 1 on any flagged row.
    oracle export OUT | compare REF OTHER   golden vectors (docs/golden_vectors.md).
    check-gguf FILE [--target FILE]   every fault of a DFlash drafter GGUF (docs/check_gguf.md).
    conform --server URL --target PATH   certify a running server (docs/conformance.md).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
import warnings
from pathlib import Path

import numpy as np

import dflash_ref
from dflash_ref import cli_args
from dflash_ref.backend import cupy_device_description, cupy_unavailable_reason, limit_blas_threads


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


DEMO_PROMPT = (3, 17, 42, 99, 5, 128, 77, 64)  # for targets without a byte vocabulary
# the shipped pair's default prompt: the start of a method of a module held out of training
DEMO_TEXT = ("\tdef put(self, item, block=True, timeout=None):\n"
             "\t\t'''Put an item into the queue.\n")  # indents are tabs, as in training


def demo_dirs() -> tuple[Path, Path]:
    """The shipped demo checkpoints: (target dir, drafter dir)."""
    root = Path(dflash_ref.__file__).parent / "data" / "demo"
    return root / "target", root / "drafter"


def cmd_demo(args: argparse.Namespace) -> int:
    """Plain vs speculative decoding: the text with accepted drafts marked, then a table; exit 1
    if the outputs differ."""
    from dflash_ref import demo_text
    from dflash_ref.cli_generate import Status, check_pair, run_timed
    from dflash_ref.models.drafter import DFlashDrafter
    from dflash_ref.models.target import TargetModel
    from dflash_ref.spec_decode.warmup import warm_up

    if args.graphs and args.verify != "chain":
        print("error: --graphs needs --verify chain (a tree verify runs on growing caches)",
              file=sys.stderr)
        return 2
    if (args.target is None) != (args.drafter is None):
        print("error: give both --target and --drafter, or neither (shipped demo)",
              file=sys.stderr)
        return 2
    backend = cli_args.model_backend(args.backend, args.weights)
    target_dir, drafter_dir = ((cli_args.existing_path(args.target, "--target"),
                                cli_args.existing_path(args.drafter, "--drafter"))
                               if args.target else demo_dirs())
    as_bytes = demo_text.is_byte_vocabulary(target_dir)
    if args.prompt is None and args.text is not None and not as_bytes:
        print(f"error: --text needs a byte-level target (a tokenizer.json mapping byte b to id "
              f"b); {target_dir} has none, give --prompt ids", file=sys.stderr)
        return 2
    prompt = (list(args.prompt) if args.prompt else list(DEMO_PROMPT) if not as_bytes
              else demo_text.encode_text(DEMO_TEXT if args.text is None else args.text))
    with Status() as status:  # cleared before anything else is printed, an error included
        status.say(f"loading {target_dir}")
        check_pair(args, target_dir, drafter_dir, prompt)  # from config.json and headers
        target = TargetModel.from_pretrained(target_dir, backend=backend)
        drafter = DFlashDrafter.from_pretrained(drafter_dir, target)
    print(f"target  {target_dir}  ({target.config.family}, {target.config.num_hidden_layers} "
          f"layers, hidden {target.config.hidden_size}, vocab {target.config.vocab_size})")
    print(f"drafter {drafter_dir}  (block {drafter.block_size}, captures "
          f"{list(drafter.config.target_layer_ids)})")
    weights = "" if target.be.weights == "float32" else f" ({target.be.weights} weights)"
    print(f"backend {target.be.name}{weights}; {len(prompt)} prompt tokens; "
          f"{args.max_new_tokens} new tokens; verify {args.verify}"
          + ("; CUDA graphs" if args.graphs else ""))
    block = args.block_size or drafter.block_size
    # --graphs: one state for every run, its steps captured while warming up: fixed K/V rows
    # for the prompt, the new tokens, the warm-up's and a block's overrun (models/graphs.py)
    state = target.new_state(kv_capacity=len(prompt) + args.max_new_tokens + 4 * block + 1,
                             graphs=True) if args.graphs else None
    # A small model's products are too small to gain from BLAS threads, and threads of several
    # processes oversubscribe a busy machine (1.1x instead of 2-3x speedups, measured).
    with limit_blas_threads(target.config.hidden_size, vocab_size=target.config.vocab_size) \
            or contextlib.nullcontext():
        with Status() as status:  # the table compares modes: neither pays one-time costs
            status.say("warming up (untimed)")
            warm_up(target, drafter, prompt, block_size=args.block_size, verify=args.verify,
                    state=state)
        plain = run_timed(target, None, prompt, args, "plain", state)
        speculative = run_timed(target, drafter, prompt, args, "speculative", state)
    colour = sys.stdout.isatty()
    print()
    print("--- prompt ---")
    print(demo_text.decode_bytes(prompt) if as_bytes else prompt)
    print(f"--- continuation (accepted drafts {'highlighted' if colour else 'in [brackets]'}) ---")
    print(demo_text.render_marked(speculative.tokens, speculative.from_draft, as_bytes, colour))
    print("---\n\n(timed after one untimed warm-up run of each mode: kernels compiled and loaded)")
    print(f"{'mode':<12} {'tokens':>6} {'tau':>6} {'accept':>7} {'target fwd':>10} "
          f"{'wall s':>8} {'tok/s':>8} {'speedup':>8}")
    base = plain.timings.get("total", 0.0)
    for name, r in (("plain", plain), ("speculative", speculative)):
        wall = r.timings.get("total", 0.0)
        print(f"{name:<12} {len(r.tokens):>6} {r.tau:>6.2f} {r.acceptance_rate:>7.1%} "
              f"{r.target_forward_passes:>10} {wall:>8.3f} {len(r.tokens) / max(wall, 1e-9):>8.1f}"
              f" {base / max(wall, 1e-9):>7.2f}x")
    same = plain.tokens == speculative.tokens
    print()
    print(f"identical output: {'yes' if same else 'NO'}")
    return 0 if same else 1


def _formats_command(func):
    """Run a formats subcommand: its warnings become lines on stderr (errors: see main)."""

    @functools.wraps(func)
    def run(args: argparse.Namespace) -> int:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                return func(args)
            finally:
                for w in caught:
                    print(f"warning: {w.message}", file=sys.stderr)

    return run


def _is_drafter_config(config: dict | None) -> bool:
    archs = (config or {}).get("architectures") or []
    return "dflash_config" in (config or {}) or any("DFlash" in str(a) for a in archs)


@_formats_command
def cmd_convert(args: argparse.Namespace) -> int:
    """A drafter directory -> GGUF in either naming; a target directory -> llama.cpp GGUF."""
    from dflash_ref.io.convert_drafter import convert_drafter
    from dflash_ref.io.convert_target import convert_target
    from dflash_ref.io.gguf_io import open_gguf
    from dflash_ref.io.gguf_kinds import convert_output, refuse_gguf_source
    from dflash_ref.io.safetensors_io import open_checkpoint

    src = refuse_gguf_source(cli_args.existing_path(args.src, "SRC"), "SRC")
    out, replace = convert_output(args.out, args.force)  # the rule of io/writing.py
    if args.target is not None:
        cli_args.checkpoint_directory(args.target, "--target")
    kw = {"fallback": args.fallback, "progress": args.progress, "replace": replace}
    if _is_drafter_config(open_checkpoint(src).config):
        convert_drafter(src, out, args.qtype, args.naming, args.target, arch=args.arch, **kw)
        kind = f"drafter, {args.naming} naming"
    else:
        convert_target(src, out, args.qtype, **kw)
        kind = "target, llama.cpp names"
    g = open_gguf(out)
    types = sorted({g.tensor_info(n).ggml_type for n in g.tensor_names})
    print(f"wrote {out} ({out.stat().st_size} bytes): arch {g.arch} ({kind}), "
          f"{len(g.tensor_names)} tensors, types {', '.join(types)}")
    return 0


def _print_gguf(path: Path, show_all: bool) -> list[str]:
    """Print a GGUF file's metadata, tensors and derived config; return its warnings."""
    from dflash_ref.config import DrafterConfig, TargetConfig
    from dflash_ref.io.convert_common import describe_metadata_value, float_from_f32
    from dflash_ref.io.convert_target import FAMILY_OF_ARCH, target_config_dict_from_gguf
    from dflash_ref.io.drafter_from_gguf import drafter_config_dict_from_gguf
    from dflash_ref.io.gguf_io import open_gguf
    from dflash_ref.io.names import flavour_of_arch

    g = open_gguf(path)
    flavour = flavour_of_arch(g.arch)
    kind = ({"dflash": "DFlash drafter, llama.cpp naming (target ids stored + 1)",
             "lucebox": "DFlash drafter, lucebox naming (raw target ids)"}.get(flavour)
            or (f"{FAMILY_OF_ARCH[g.arch]} target" if g.arch in FAMILY_OF_ARCH
                else "not a model dflash-ref loads"))
    print(f"GGUF {path} ({path.stat().st_size} bytes): arch {g.arch!r}, {kind}")
    print("metadata:")
    for key in sorted(g.metadata):
        value, vtype = g.metadata[key], g.value_type(key)
        if vtype == "FLOAT32":
            value = float_from_f32(value)
        print(f"  {key:52} {vtype:14} {describe_metadata_value(value)}")
    _print_tensors([(n, g.tensor_info(n).ggml_type,
                     "{" + ", ".join(map(str, g.tensor_info(n).ggml_shape)) + "}",
                     list(g.tensor_info(n).numpy_shape)) for n in g.tensor_names], show_all,
                   "type", "ggml shape", "NumPy shape")
    print("derived config:")
    problems = []
    if flavour is not None:
        config = drafter_config_dict_from_gguf(g)
        cfg = DrafterConfig.from_hf(config)
        print(_indent(cfg.describe()))
        if flavour == "dflash":
            print(f"  (file stores target_layers {g.get('target_layers')}: HF ids + 1)")
        from dflash_ref.config import drafter_expected_tensors
        from dflash_ref.io.names import gguf_to_hf

        expected = drafter_expected_tensors(cfg)
        for name in g.tensor_names:
            hf = gguf_to_hf(name, flavour)
            if hf in expected and g.tensor_info(name).numpy_shape != expected[hf]:
                problems.append(f"{name} has NumPy shape {list(g.tensor_info(name).numpy_shape)}"
                                f", the metadata implies {list(expected[hf])}")
    elif g.arch in FAMILY_OF_ARCH:
        print(_indent(TargetConfig.from_hf(target_config_dict_from_gguf(g)).describe()))
    return problems


def _print_checkpoint(path: Path, show_all: bool) -> list[str]:
    """Print a checkpoint directory's config.json, tensors and derived config; return warnings."""
    from dflash_ref.config import TargetConfig, expected_tensors
    from dflash_ref.io.convert_drafter import drafter_config_from_checkpoint, drafter_shape_problems
    from dflash_ref.io.safetensors_io import open_checkpoint

    ckpt = open_checkpoint(path)
    config = ckpt.config
    print(f"checkpoint {path}: {len(ckpt)} tensors, config.json {'yes' if config else 'MISSING'}")
    print("config.json:")
    for key, value in (config or {}).items():
        print(f"  {key:40} {json.dumps(value)}")
    shapes = {n: tuple(ckpt.info(n).shape) for n in ckpt}
    _print_tensors([(n, ckpt.info(n).dtype, "", list(shapes[n])) for n in ckpt], show_all,
                   "dtype", "", "shape")
    print("derived config:")
    if _is_drafter_config(config):
        cfg = drafter_config_from_checkpoint(config, shapes)
        print(_indent(cfg.describe()))
        return drafter_shape_problems(shapes, cfg)
    cfg = TargetConfig.from_hf(config or {})
    print(_indent(cfg.describe()))
    problems = []
    for name, shape in expected_tensors(cfg).items():
        if name not in shapes:
            problems.append(f"missing tensor {name}")
        elif shapes[name] != shape:
            problems.append(f"tensor {name} has shape {list(shapes[name])}, config.json implies "
                            f"{list(shape)}")
    return problems


def _print_tensors(rows, show_all: bool, *headers) -> None:
    limit = None if show_all else 40
    print(f"tensors ({len(rows)}):")
    for name, typ, ggml, numpy_shape in rows[:limit]:
        print(f"  {name:44} {typ:6} {ggml:>16} {numpy_shape}")
    if limit is not None and len(rows) > limit:
        print(f"  ... {len(rows) - limit} more (--all lists every tensor)")


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


@_formats_command
def cmd_inspect(args: argparse.Namespace) -> int:
    """Metadata, tensors, derived config and warnings of a GGUF file or checkpoint directory."""
    path = cli_args.existing_path(args.path, "PATH")
    is_gguf = cli_args.gguf_file_or_directory(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        problems = _print_gguf(path, args.all) if is_gguf else _print_checkpoint(path, args.all)
    problems = [str(w.message) for w in caught] + problems
    print("warnings:" + ("" if problems else " none"))
    for p in problems:
        print(f"  - {p}")
    return 0


@_formats_command
def cmd_compare_weights(args: argparse.Namespace) -> int:
    """Per-tensor comparison table; exit 1 when any row is flagged."""
    from dflash_ref.io.compare import compare_weights

    cli_args.existing_path(args.a, "A")
    cli_args.existing_path(args.b, "B")
    rows = compare_weights(args.a, args.b, threshold_factor=args.threshold_factor)
    return 1 if any(r.flagged for r in rows) else 0


def build_parser() -> argparse.ArgumentParser:
    parser = cli_args.Parser(
        prog="dflash-ref",
        description="Reference implementation of DFlash speculative decoding (NumPy + CuPy).",
    )
    parser.add_argument("--version", action="version", version=dflash_ref.__version__)
    parser.add_argument("--debug", action="store_true",
                        help="show the Python traceback of an error (default: one error line)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p_demo = sub.add_parser("demo", help="plain vs speculative decoding on tiny checkpoints")
    p_demo.add_argument("--target", help="target directory (HF layout); default: shipped demo")
    p_demo.add_argument("--drafter", help="drafter directory (z-lab layout)")
    p_demo.add_argument("--backend", default="numpy", type=cli_args.backend,
                        help="numpy, cupy or auto")
    cli_args.add_weights_option(p_demo)
    p_demo.add_argument("--max-new-tokens", type=cli_args.positive_int, default=64)
    p_demo.add_argument("--block-size", type=cli_args.positive_int, default=None)
    p_demo.add_argument("--verify", default="chain", choices=["chain", "tree"])
    p_demo.add_argument("--graphs", action="store_true", help="replay each decode, verify and "
                        "draft step as one CUDA graph (chain verify; docs/performance.md)")
    p_demo.add_argument("--prompt", type=cli_args.nonempty_token_ids,
                        help="comma-separated token ids (default: a fixed prompt)")
    p_demo.add_argument("--text", type=cli_args.utf8_text, help="prompt text, for byte-level "
                        "targets such as the shipped one (default: a few lines of Python)")
    p_demo.set_defaults(func=cmd_demo)
    p_info = sub.add_parser("info", help="version, available backends, CUDA device")
    p_info.set_defaults(func=cmd_info)
    from dflash_ref.cli_generate import add_parser as add_generate
    from dflash_ref.diagnose.cli import add_explain_parser
    from dflash_ref.io.check_gguf import add_check_gguf_parser
    from dflash_ref.oracle.cli import add_oracle_arguments
    from dflash_ref.oracle.conform_cli import add_conform_parser

    add_generate(sub)
    add_explain_parser(sub)
    add_check_gguf_parser(sub)
    from dflash_ref.io.convert_common import QTYPES

    p_conv = sub.add_parser("convert", help="drafter or target directory -> GGUF")
    p_conv.add_argument("src", help="z-lab drafter or HF target directory (config.json + "
                        "safetensors)")
    p_conv.add_argument("out", help="the .gguf file to write (its folder must exist)")
    p_conv.add_argument("--qtype", default="bf16", choices=list(QTYPES),
                        help="matrix storage (norms are always f32); default bf16")
    p_conv.add_argument("--naming", default="llama.cpp", choices=["llama.cpp", "lucebox"],
                        help="drafter GGUF naming: llama.cpp arch 'dflash' (target ids + 1) or "
                        "lucebox '*-dflash-draft' (raw ids)")
    p_conv.add_argument("--target", help="the drafter's target directory: checks the pairing, "
                        "adds its softcap / embedding scale (Gemma)")
    p_conv.add_argument("--arch", help="lucebox arch string (default from the target)")
    p_conv.add_argument("--fallback", choices=list(QTYPES),
                        help="type for matrices whose rows do not fit --qtype blocks")
    p_conv.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="progress bar (default: only for large models)")
    p_conv.add_argument("--force", action="store_true", help="replace OUT if convert wrote it")
    p_conv.set_defaults(func=cmd_convert)
    p_insp = sub.add_parser("inspect", help="metadata, tensors and derived config of a GGUF "
                            "file or checkpoint directory")
    p_insp.add_argument("path")
    p_insp.add_argument("--all", action="store_true", help="list every tensor")
    p_insp.set_defaults(func=cmd_inspect)
    p_cmp = sub.add_parser("compare-weights", help="per-tensor rel. RMS / max-abs of two weight "
                           "sets (checkpoint directories or GGUF files)")
    p_cmp.add_argument("a", help="reference (e.g. the HF checkpoint)")
    p_cmp.add_argument("b", help="the other side (e.g. the converted GGUF)")
    p_cmp.add_argument("--threshold-factor", type=cli_args.positive_float, default=1.0,
                       help="flag rows with rel. RMS above factor x the type's budget")
    p_cmp.set_defaults(func=cmd_compare_weights)
    add_oracle_arguments(sub.add_parser("oracle", help="golden vectors: export a case, compare "
                                        "another stack's dump (docs/golden_vectors.md)"))
    add_conform_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; a user error is one ``error:`` line (cli_args.run_command)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    return cli_args.run_command(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
