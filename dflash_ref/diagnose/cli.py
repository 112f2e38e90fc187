"""``dflash-ref explain``: the acceptance report on the terminal (docs/acceptance.md).

    dflash-ref explain                                  the shipped pair, its held-out prompts
    dflash-ref explain --target T --drafter D --text "..." [--chat] [--thinking]
    dflash-ref explain --target T --drafter D --ids 3,17,42 --plot figs/
    dflash-ref explain --compare OURS THEIRS            first diverging tensor of two dumps
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dflash_ref import cli_args
from dflash_ref.diagnose.ablations import ABLATIONS

DEMO = Path(__file__).resolve().parents[1] / "data" / "demo"
DEMO_PROMPTS = 16


def ablation_names(text: str) -> list[str]:
    """``--ablations``: "all", "none", or comma-separated names of ABLATIONS."""
    if text == "all":
        return list(ABLATIONS)
    if text == "none":
        return []
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in ABLATIONS]
    if bad:
        raise argparse.ArgumentTypeError(f"{bad[0]!r} is not an ablation; expected all, none or "
                                         f"names from {', '.join(ABLATIONS)}")
    return names


def add_explain_parser(sub) -> None:
    p = sub.add_parser("explain", help="why acceptance is what it is: statistics, ablations, "
                       "config checks (docs/acceptance.md)")
    p.add_argument("--target", help="target directory (HF layout); default: the shipped pair")
    p.add_argument("--drafter", help="drafter directory (z-lab layout)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--ids", type=cli_args.nonempty_token_ids, action="append",
                     help="prompt token ids (repeat for several prompts)")
    src.add_argument("--text", type=cli_args.utf8_text, action="append",
                     help="prompt text through the target's tokenizer (repeat for several)")
    p.add_argument("--chat", action="store_true", help="wrap --text in the chat template")
    p.add_argument("--thinking", action="store_true", help="with --chat: thinking mode on")
    p.add_argument("--max-new-tokens", type=cli_args.positive_int, default=64)
    p.add_argument("--block-size", type=cli_args.positive_int, default=None)
    p.add_argument("--ablations", type=ablation_names, default=list(ABLATIONS),
                   help="all (default), none, or a comma-separated list")
    p.add_argument("--bucket", type=cli_args.positive_int, default=32,
                   help="context positions per bucket of the tau-by-context line")
    p.add_argument("--field", action="store_true", help="also run the field's named checks: "
                   "layer offset, context limit, Q4_K target, template (docs/acceptance.md)")
    p.add_argument("--plot", help="write the figures (PNG) into this directory")
    p.add_argument("--compare", nargs=2, metavar=("OURS", "THEIRS"),
                   help="only name the first diverging tensor and step of two golden-vector dumps")
    p.set_defaults(func=cmd_explain)


def _prompts(args, tokenizer):
    if args.ids:
        return args.ids, None
    if args.text:
        if tokenizer is None:
            raise cli_args.UsageError("--text needs the target's tokenizer (tokenizer.json); "
                                      "pass --ids")
        if not args.chat:
            return [tokenizer.encode(t) for t in args.text], False
        from dflash_ref.io.chat_template import render_chat_template

        if tokenizer.chat_template is None:
            raise cli_args.UsageError("--chat: the target has no chat template; drop --chat")
        return [tokenizer.encode(render_chat_template(
            tokenizer.chat_template, [{"role": "user", "content": t}], add_generation_prompt=True,
            enable_thinking=args.thinking, **tokenizer.special_tokens), add_bos=False)
            for t in args.text], True
    if args.target is not None:
        raise cli_args.UsageError("give the prompts with --ids or --text (the held-out prompts "
                                  "are the shipped pair's)")
    data = json.loads((DEMO / "held_out_prompts.json").read_text())
    return data["prompts"][:DEMO_PROMPTS], None


def cmd_explain(args: argparse.Namespace) -> int:
    from dflash_ref.diagnose import explain, first_divergence
    from dflash_ref.diagnose.field_checks import standard_checks

    if args.compare:
        ours, theirs = (cli_args.existing_path(x, "--compare") for x in args.compare)
        print(first_divergence(ours, theirs))
        return 0
    if (args.target is None) != (args.drafter is None):
        raise cli_args.UsageError("give both --target and --drafter, or neither (the shipped pair)")
    if args.thinking and not args.chat:
        raise cli_args.UsageError("--thinking needs --chat")
    target_dir = cli_args.existing_path(args.target or DEMO / "target", "--target")
    drafter_dir = cli_args.existing_path(args.drafter or DEMO / "drafter", "--drafter")
    from dflash_ref.models.drafter import DFlashDrafter
    from dflash_ref.models.target import TargetModel

    tokenizer = None
    if (target_dir / "tokenizer.json").exists():
        from dflash_ref.io.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(target_dir)
    prompts, templated = _prompts(args, tokenizer)
    target = TargetModel.from_pretrained(target_dir)
    for p in prompts:
        cli_args.check_ids_in_vocabulary(p, target.config.vocab_size, "--ids")
    drafter = DFlashDrafter.from_pretrained(drafter_dir, target)
    served = "chat, thinking" if args.thinking else "chat" if args.chat else "raw"
    field = (standard_checks(target_dir, args.max_new_tokens, texts=args.text, tokenizer=tokenizer,
                             served=served) if args.field else None)
    report = explain(target, drafter, prompts, args.max_new_tokens, block_size=args.block_size,
                     ablations=args.ablations, tokenizer=tokenizer, templated=templated,
                     thinking=args.thinking if args.chat else None, bucket=args.bucket,
                     field=field)
    print(report.summary())
    if args.plot:
        from dflash_ref.diagnose.plots import write_figures

        for path in write_figures(report, args.plot):
            print(f"wrote {path}")
    return 0
