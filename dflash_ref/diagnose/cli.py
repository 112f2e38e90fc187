"""``dflash-ref explain``: the acceptance report on the terminal (docs/acceptance.md).

    dflash-ref explain                                  the shipped pair, its held-out prompts
    dflash-ref explain --target T --drafter D --text "..." [--chat] [--thinking]
    dflash-ref explain --target T --drafter D --ids 3,17,42 --plot figs/
    dflash-ref explain --compare OURS THEIRS            first diverging tensor of two dumps

The target and the drafter load as ``generate`` loads them: a checkpoint directory or a GGUF
file each, the target's tokenizer from its ``tokenizer.json`` or from the GGUF's own metadata
(read, with the prompts encoded, before any weight). Progress goes to stderr on a terminal (a
line per load, a bar per run; nothing in a pipe), and a last line says what ran and how long
each phase took. ``--ablations auto`` (the default) runs every ablation on a small target and
only "features zeroed" on a big one (:data:`BIG_TARGET` parameters): each ablation is one more
run over every prompt; ``--max-new-tokens`` is 64 by default, 32 on a big target (enough
drafts judged for the features rule at tau near 1, in a few minutes on a 2-core CPU).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dflash_ref import cli_args
from dflash_ref.diagnose.ablations import ABLATIONS

DEMO = Path(__file__).resolve().parents[1] / "data" / "demo"
DEMO_PROMPTS = 16
BIG_TARGET = 50_000_000
"""Parameters (estimated from the config) from which ``--ablations auto`` runs one ablation."""
BIG_DEFAULT = ("features zeroed",)
NEW_TOKENS = (64, 32)
"""``--max-new-tokens`` by default: on a small target, on a big one."""


def ablation_names(text: str) -> list[str] | None:
    """``--ablations``: "auto" (None: chosen by the target's size), "all", "none", or
    comma-separated names of ABLATIONS."""
    if text == "auto":
        return None
    if text == "all":
        return list(ABLATIONS)
    if text == "none":
        return []
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in ABLATIONS]
    if bad:
        raise argparse.ArgumentTypeError(f"{bad[0]!r} is not an ablation; expected auto, all, "
                                         f"none or names from {', '.join(ABLATIONS)}")
    return names


def parameters(config) -> int:
    """A target's parameter count, estimated from its config: the embedding plus 12 H^2 per
    layer (attention 4 H^2, a 4H-wide MLP 8 H^2)."""
    H = int(config.hidden_size)
    return int(config.vocab_size) * H + int(config.num_hidden_layers) * 12 * H * H


def auto_ablations(config) -> list[str]:
    """``--ablations auto``: all of them, or only :data:`BIG_DEFAULT` on a big target."""
    return list(BIG_DEFAULT) if parameters(config) >= BIG_TARGET else list(ABLATIONS)


def auto_new_tokens(config) -> int:
    """``--max-new-tokens`` by default (:data:`NEW_TOKENS`)."""
    return NEW_TOKENS[parameters(config) >= BIG_TARGET]


def add_explain_parser(sub) -> None:
    p = sub.add_parser("explain", help="why acceptance is what it is: statistics, ablations, "
                       "config checks (docs/acceptance.md)")
    p.add_argument("--target", help="target: HF directory or llama.cpp GGUF; default: the "
                   "shipped pair")
    p.add_argument("--drafter", help="drafter: directory (z-lab layout) or GGUF")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--ids", type=cli_args.nonempty_token_ids, action="append",
                     help="prompt token ids (repeat for several prompts)")
    src.add_argument("--text", type=cli_args.utf8_text, action="append",
                     help="prompt text through the target's tokenizer (repeat for several)")
    p.add_argument("--chat", action="store_true", help="wrap --text in the chat template")
    p.add_argument("--thinking", action="store_true", help="with --chat: thinking mode on")
    p.add_argument("--max-new-tokens", type=cli_args.positive_int, default=None,
                   help=f"tokens per prompt (default: {NEW_TOKENS[0]}, {NEW_TOKENS[1]} on a big "
                   f"target)")
    p.add_argument("--block-size", type=cli_args.positive_int, default=None)
    p.add_argument("--ablations", type=ablation_names, default=None,
                   help="auto (default: all on a small target, 'features zeroed' on one of "
                   f"{BIG_TARGET // 10**6}M+ parameters), all, none, or a comma-separated list")
    p.add_argument("--bucket", type=cli_args.positive_int, default=32,
                   help="context positions per bucket of the tau-by-context line")
    p.add_argument("--field", action="store_true", help="also run the field's named checks: "
                   "layer offset, context limit, Q4_K target, template (docs/acceptance.md)")
    p.add_argument("--plot", help="write the figures (PNG) into this directory")
    p.add_argument("--force", action="store_true", help="with --plot: replace figures an "
                   "earlier run wrote there (never another file)")
    p.add_argument("--compare", nargs=2, metavar=("OURS", "THEIRS"),
                   help="only name the first diverging tensor and step of two golden-vector dumps")
    p.set_defaults(func=cmd_explain)


def _prompts(args, tokenizer):
    if args.ids:
        return args.ids, None
    if args.text:
        if not args.chat:
            return [tokenizer.encode(t) for t in args.text], False
        from dflash_ref.io.chat_template import render_chat_template

        if tokenizer.chat_template is None:
            raise cli_args.UsageError(f"--chat: {args.target} has no chat template (base models "
                                      f"usually have none); drop --chat")
        return [tokenizer.encode(render_chat_template(
            tokenizer.chat_template, [{"role": "user", "content": t}], add_generation_prompt=True,
            enable_thinking=args.thinking, **tokenizer.special_tokens), add_bos=False)
            for t in args.text], True
    if args.target is not None:
        raise cli_args.UsageError("give the prompts with --ids or --text (the held-out prompts "
                                  "are the shipped pair's)")
    data = json.loads((DEMO / "held_out_prompts.json").read_text())
    return data["prompts"][:DEMO_PROMPTS], None


def time_line(walls: dict[str, float], prompts: int, max_new_tokens: int) -> str:
    """What ran and how long each phase took, one line."""
    total = sum(walls.values())
    return (f"time: {total:.0f} s for {prompts} prompts x {max_new_tokens} tokens ("
            + ", ".join(f"{name} {s:.0f} s" for name, s in walls.items()) + ")")


def cmd_explain(args: argparse.Namespace) -> int:
    from dflash_ref.diagnose import explain, first_divergence
    from dflash_ref.diagnose.field_checks import standard_checks
    from dflash_ref.diagnose.progress import Phases

    if args.compare:
        ours, theirs = (cli_args.existing_path(x, "--compare") for x in args.compare)
        print(first_divergence(ours, theirs))
        return 0
    if (args.target is None) != (args.drafter is None):
        raise cli_args.UsageError("give both --target and --drafter, or neither (the shipped pair)")
    if args.thinking and not args.chat:
        raise cli_args.UsageError("--thinking needs --chat")
    if args.plot:  # refused now, not after the run (dflash_ref/io/writing.py, rule 1)
        from dflash_ref.diagnose.plots import FIGURES, a_figure
        from dflash_ref.io.writing import check_output_folder

        check_output_folder(args.plot, "--plot", FIGURES, a_figure if args.force else None)
    target_path = cli_args.existing_path(args.target or DEMO / "target", "--target")
    drafter_path = cli_args.existing_path(args.drafter or DEMO / "drafter", "--drafter")
    phases = Phases()
    with phases.phase("tokenizer"):  # a GGUF's vocabulary is parsed here: seconds
        source, tokenizer = cli_args.target_source(target_path, need_tokenizer=bool(args.text))
        prompts, templated = _prompts(args, tokenizer)
    with phases.phase(f"loading the target {target_path.name}"):
        target = cli_args.load_target(source)
    for p in prompts:
        cli_args.check_ids_in_vocabulary(p, target.config.vocab_size, "--ids")
    with phases.phase(f"loading the drafter {drafter_path.name}"):
        drafter = cli_args.load_drafter(drafter_path, target)
    ablations = auto_ablations(target.config) if args.ablations is None else args.ablations
    new = auto_new_tokens(target.config) if args.max_new_tokens is None else args.max_new_tokens
    served = "chat, thinking" if args.thinking else "chat" if args.chat else "raw"
    field = (standard_checks(target_path, new, texts=args.text, tokenizer=tokenizer,
                             served=served) if args.field else None)
    report = explain(target, drafter, prompts, new, block_size=args.block_size,
                     ablations=ablations, tokenizer=tokenizer, templated=templated,
                     thinking=args.thinking if args.chat else None, bucket=args.bucket,
                     phases=phases, field=field)
    print(report.summary())
    print(time_line(report.walls, len(prompts), new))
    if args.plot:
        from dflash_ref.diagnose.plots import write_figures

        for path in write_figures(report, args.plot, a_figure if args.force else None):
            print(f"wrote {path}")
    return 0
