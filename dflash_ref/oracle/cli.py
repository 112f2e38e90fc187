"""``dflash-ref oracle export | compare``: the golden-vector verbs (docs/golden_vectors.md)."""

from __future__ import annotations

import argparse

from dflash_ref import cli_args


def add_oracle_arguments(p: argparse.ArgumentParser) -> None:
    """Fill the ``oracle`` sub-parser: ``export OUT ...`` and ``compare REF OTHER``."""
    sub = p.add_subparsers(dest="oracle_command", metavar="ACTION")
    ex = sub.add_parser("export", help="run one generation and write a golden-vector case")
    ex.add_argument("out", help="the case directory to write")
    ex.add_argument("--target", required=True, help="target directory (HF layout)")
    ex.add_argument("--drafter", required=True, help="drafter directory (z-lab layout)")
    src = ex.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", type=cli_args.utf8_text,
                     help="prompt text (needs the target's tokenizer)")
    src.add_argument("--ids", type=cli_args.nonempty_token_ids,
                     help="prompt token ids, comma- or space-separated")
    ex.add_argument("--max-new-tokens", type=cli_args.positive_int, default=16)
    ex.add_argument("--block-size", type=cli_args.positive_int, default=None)
    ex.add_argument("--verify", default="chain", choices=["chain", "tree"])
    ex.add_argument("--temperature", type=cli_args.temperature, default=0.0)
    ex.add_argument("--seed", type=cli_args.seed, default=None,
                    help="required with --temperature > 0")
    ex.add_argument("--gate", help="entropy[,ar_p1=..,tie_p1=..,sustain=..] or "
                    "commit-ema[,version=..,margin=..,sustain=..,warmup=..,cost_<field>=..]")
    ex.add_argument("--pager", help="KVFlash pool: pool=P[,chunk=T,sink=S,tail=W]")
    ex.add_argument("--detail-steps", default=[], type=cli_args.token_ids,
                    help="steps recorded per layer (after norm, q/k/v before and after RoPE, "
                    "attention and MLP outputs), comma-separated, e.g. 0,1")
    ex.add_argument("--no-gguf", dest="gguf", action="store_false",
                    help="do not write target.gguf / drafter.gguf")
    ex.add_argument("--backend", default="numpy", type=cli_args.backend,
                    help="numpy, cupy or auto")
    ex.add_argument("--force", action="store_true",
                    help="replace the files of the case an earlier export wrote in OUT (never "
                    "another folder or file)")
    ex.set_defaults(func=cmd_oracle)
    cp = sub.add_parser("compare", help="first tensor where another stack's dump diverges")
    cp.add_argument("ref", help="the reference case (written by export)")
    cp.add_argument("other", help="the other stack's dump directory (same layout, any subset), "
                    "or the stdout of llama.cpp's llama-eval-callback on the case's prompt")
    cp.add_argument("--tolerance-scale", type=cli_args.positive_float, default=1.0,
                    help="multiply every float tolerance (e.g. 30 for a bf16 stack)")
    cp.set_defaults(func=cmd_oracle)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _prompt_ids(args) -> list[int]:
    if args.ids is not None:
        return list(args.ids)
    try:
        from dflash_ref.io.tokenizer import load_tokenizer

        return list(load_tokenizer(args.target).encode(args.prompt))
    except ImportError as exc:  # no tokenizer module here, or its backend is not installed
        raise ImportError(f"--prompt needs a tokenizer ({exc}); pass --ids") from None


def cmd_oracle(args: argparse.Namespace) -> int:
    """Errors propagate to ``dflash_ref.cli.main``, which prints them as one line."""
    from pathlib import Path

    if args.oracle_command == "compare":
        from dflash_ref.oracle.compare import compare_main

        cli_args.existing_path(args.ref, "REF")
        cli_args.existing_path(args.other, "OTHER")
        if Path(args.other).is_file():  # a llama-eval-callback dump (docs/interop.md)
            from dflash_ref.oracle.llamacpp_dump import compare_eval_callback

            return compare_eval_callback(args.ref, args.other, args.tolerance_scale)
        return compare_main(args.ref, args.other, args.tolerance_scale)
    from dflash_ref.io.writing import check_output_folder
    from dflash_ref.oracle.export import check_replaceable, export_case, make_gate, make_pager

    cli_args.existing_path(args.target, "--target")
    cli_args.existing_path(args.drafter, "--drafter")
    check_output_folder(args.out, "OUT")  # a place that can be made and written
    check_replaceable(Path(args.out), args.force)
    if args.temperature > 0 and args.seed is None:
        raise cli_args.UsageError("--temperature > 0 needs --seed S (a case must be "
                                  "reproducible); add e.g. --seed 0")
    make_gate(args.gate, args.temperature > 0)  # a bad spec is refused before any model loads
    make_pager(args.pager)
    m = export_case(args.out, args.target, args.drafter, _prompt_ids(args),
                    max_new_tokens=args.max_new_tokens, block_size=args.block_size,
                    verify=args.verify, temperature=args.temperature, seed=args.seed,
                    gate=args.gate, pager=args.pager, detail_steps=args.detail_steps,
                    gguf=args.gguf, backend=args.backend, overwrite=args.force)
    print(f"wrote {args.out}: {len(m['steps'])} steps, {len(m['tensors'])} tensors; tokens "
          f"{m['result']['tokens']} (tau {m['result']['tau']:.2f})")
    return 0
