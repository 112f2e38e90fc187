"""``dflash-ref oracle export | compare``: the golden-vector verbs (docs/golden_vectors.md)."""

from __future__ import annotations

import argparse
import sys


def add_oracle_arguments(p: argparse.ArgumentParser) -> None:
    """Fill the ``oracle`` sub-parser: ``export OUT ...`` and ``compare REF OTHER``."""
    sub = p.add_subparsers(dest="oracle_command", metavar="ACTION")
    ex = sub.add_parser("export", help="run one generation and write a golden-vector case")
    ex.add_argument("out", help="the case directory to write")
    ex.add_argument("--target", required=True, help="target directory (HF layout)")
    ex.add_argument("--drafter", required=True, help="drafter directory (z-lab layout)")
    src = ex.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (needs the target's tokenizer)")
    src.add_argument("--ids", help="prompt token ids, comma- or space-separated")
    ex.add_argument("--max-new-tokens", type=int, default=16)
    ex.add_argument("--block-size", type=int, default=None)
    ex.add_argument("--verify", default="chain", choices=["chain", "tree"])
    ex.add_argument("--temperature", type=float, default=0.0)
    ex.add_argument("--seed", type=int, default=None, help="required with --temperature > 0")
    ex.add_argument("--gate", help="entropy[,ar_p1=..,tie_p1=..,sustain=..] or "
                    "commit-ema[,version=..,margin=..,sustain=..,warmup=..,cost_<field>=..]")
    ex.add_argument("--pager", help="KVFlash pool: pool=P[,chunk=T,sink=S,tail=W]")
    ex.add_argument("--detail-steps", default="",
                    help="steps recorded per layer (after norm, q/k/v before and after RoPE, "
                    "attention and MLP outputs), comma-separated, e.g. 0,1")
    ex.add_argument("--no-gguf", dest="gguf", action="store_false",
                    help="do not write target.gguf / drafter.gguf")
    ex.add_argument("--backend", default="numpy", choices=["numpy", "cupy", "auto"])
    ex.add_argument("--force", action="store_true", help="replace a non-empty OUT")
    ex.set_defaults(func=cmd_oracle)
    cp = sub.add_parser("compare", help="first tensor where another stack's dump diverges")
    cp.add_argument("ref", help="the reference case (written by export)")
    cp.add_argument("other", help="the other stack's dump directory (same layout, any subset)")
    cp.add_argument("--tolerance-scale", type=float, default=1.0,
                    help="multiply every float tolerance (e.g. 30 for a bf16 stack)")
    cp.set_defaults(func=cmd_oracle)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _prompt_ids(args) -> list[int]:
    if args.ids is not None:
        return [int(t) for t in args.ids.replace(",", " ").split()]
    try:
        from dflash_ref.io.tokenizer import load_tokenizer

        return list(load_tokenizer(args.target).encode(args.prompt))
    except ImportError as exc:  # no tokenizer module here, or its backend is not installed
        raise SystemExit(f"error: --prompt needs a tokenizer ({exc}); pass --ids") from None


def cmd_oracle(args: argparse.Namespace) -> int:
    from dflash_ref.errors import DFlashRefError

    try:
        if args.oracle_command == "compare":
            from dflash_ref.oracle.compare import compare_main

            return compare_main(args.ref, args.other, args.tolerance_scale)
        from dflash_ref.oracle.export import export_case

        detail = [int(s) for s in args.detail_steps.replace(",", " ").split()]
        m = export_case(args.out, args.target, args.drafter, _prompt_ids(args),
                        max_new_tokens=args.max_new_tokens, block_size=args.block_size,
                        verify=args.verify, temperature=args.temperature, seed=args.seed,
                        gate=args.gate, pager=args.pager, detail_steps=detail, gguf=args.gguf,
                        backend=args.backend, overwrite=args.force)
    except (DFlashRefError, FileExistsError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}: {len(m['steps'])} steps, {len(m['tensors'])} tensors; tokens "
          f"{m['result']['tokens']} (tau {m['result']['tau']:.2f})")
    return 0
