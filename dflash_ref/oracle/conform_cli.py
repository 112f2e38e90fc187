"""``dflash-ref conform``: certify a running server against dflash-ref (docs/conformance.md).

    dflash-ref conform --server URL --target GGUF|DIR [--drafter GGUF|DIR]
                       (--prompt-ids IDS | --text TEXT)...
                       [--policy greedy|T[,top_k=K][,top_p=P]]...
                       [--samples N] [--length L] [--n-predict N] [--api native|openai]
                       [--json FILE]

Every argument is checked, and the server asked once for a token, before any weight is read; the
verdict table goes to stdout, a progress bar over the requests to stderr (a terminal only), the
JSON report to ``--json`` (a new file). Exit status 0 only when every check holds, 1 when one
fails (or on an error, one ``error:`` line).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dflash_ref import cli_args

DEFAULT_POLICIES = ("greedy", "1.0", "0.7,top_k=20,top_p=0.9")


def policy(text: str):
    """``--policy``: ``greedy``, or ``T[,top_k=K][,top_p=P]`` (T > 0)."""
    from dflash_ref.testing.conform import Policy

    if text == "greedy":
        return Policy()
    head, *rest = text.split(",")
    try:
        t = float(head)
        kw = dict(_key_value(r) for r in rest)
        p = Policy(t, int(kw.pop("top_k", 0)), float(kw.pop("top_p", 1.0)))
    except ValueError:
        p, kw = None, {}
    if p is None or kw or not (p.temperature > 0 and p.top_k >= 0 and 0 < p.top_p <= 1):
        raise argparse.ArgumentTypeError(f"{text!r} is not a policy; expected 'greedy' or "
                                         f"T[,top_k=K][,top_p=P] with T > 0, K >= 0, "
                                         f"0 < P <= 1, e.g. 0.7,top_k=20,top_p=0.9")
    return p


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or key not in ("top_k", "top_p"):
        raise ValueError(text)
    return key, value


def add_conform_parser(sub) -> None:
    p = sub.add_parser("conform", help="certify a running server (llama-server, vLLM, SGLang) "
                       "against dflash-ref: greedy, sampled, acceptance")
    p.add_argument("--server", required=True, help="the server's address, e.g. "
                   "http://127.0.0.1:8080")
    p.add_argument("--target", required=True, help="the target it serves: GGUF or HF directory")
    p.add_argument("--drafter", help="its drafter (GGUF or directory): compares draft counts")
    p.add_argument("--api", default="native", choices=["native", "openai"],
                   help="native: llama-server /completion; openai: /v1/completions")
    p.add_argument("--model", help="the 'model' field of --api openai requests")
    p.add_argument("--prompt-ids", dest="prompts", action="append", default=[],
                   type=cli_args.nonempty_token_ids, help="a prompt as token ids (repeatable)")
    p.add_argument("--text", dest="texts", action="append", default=[], type=cli_args.utf8_text,
                   help="a prompt as text, tokenized by the target's tokenizer (repeatable)")
    p.add_argument("--policy", dest="policies", action="append", type=policy,
                   help=f"greedy or T[,top_k=K][,top_p=P] (repeatable; default: "
                   f"{' '.join(DEFAULT_POLICIES)})")
    p.add_argument("--samples", type=cli_args.positive_int, default=2000,
                   help="completions per sampled policy (default 2000)")
    p.add_argument("--length", type=cli_args.positive_int, default=3,
                   help="sampled: the first L tokens are judged (default 3)")
    p.add_argument("--n-predict", type=cli_args.positive_int, default=8,
                   help="tokens asked per request (default 8; at least --length)")
    p.add_argument("--seed", type=cli_args.seed, default=0, help="first request seed")
    p.add_argument("--alpha", type=cli_args.positive_float, default=None,
                   help="significance of each statistical test (default 1e-3)")
    p.add_argument("--tie-margin", type=cli_args.positive_float, default=None,
                   help="greedy: a divergence at a reference logit gap <= this is a near-tie "
                   "(default 0.1)")
    p.add_argument("--block-size", type=cli_args.positive_int, default=None,
                   help="the server's drafts + 1 (default: the drafter's block size)")
    p.add_argument("--draft-rule", default="sampled", choices=["sampled", "argmax"],
                   help="how the server drafts at T > 0, for the acceptance comparison")
    p.add_argument("--json", dest="json_out", help="write the JSON report here (a new file)")
    p.add_argument("--timeout", type=cli_args.positive_float, default=300.0,
                   help="seconds to wait for one answer (default 300)")
    p.add_argument("--retries", type=cli_args.int_at_least(0), default=3)
    p.add_argument("--backend", default="numpy", type=cli_args.backend)
    p.set_defaults(func=cmd_conform)


def cmd_conform(args: argparse.Namespace) -> int:
    from dflash_ref.oracle.conform_http import ServerClient
    from dflash_ref.testing.conform import ConformSettings, run_conform, total_requests

    target_path = cli_args.existing_path(args.target, "--target")
    drafter_path = cli_args.existing_path(args.drafter, "--drafter") if args.drafter else None
    json_out = _new_file(args.json_out) if args.json_out else None
    if not args.prompts and not args.texts:
        raise cli_args.UsageError("give a prompt: --prompt-ids 1,2,3 or --text 'def f(x):' "
                                  "(repeatable)")
    if args.n_predict < args.length:
        raise cli_args.UsageError(f"--n-predict {args.n_predict} < --length {args.length}; ask "
                                  f"for at least as many tokens as are judged")
    source, tok = cli_args.target_source(target_path)
    prompts = [tuple(p) for p in args.prompts] + [tuple(tok.encode(t)) for t in args.texts]
    client = ServerClient(args.server, args.api, args.model, (5.0, args.timeout), args.retries)
    client.complete(prompts[0], 1, policy("greedy"), args.seed)  # reachable, answers ids
    print(f"conform: loading the reference from {target_path}", file=sys.stderr, flush=True)
    target, drafter = _load(source, drafter_path, args.backend)
    for p in prompts:
        cli_args.check_ids_in_vocabulary(p, target.config.vocab_size, "prompt")
    settings = ConformSettings(
        tuple(prompts), tuple(args.policies or [policy(p) for p in DEFAULT_POLICIES]),
        args.samples, args.length, args.n_predict, args.seed,
        **{k: v for k, v in (("alpha", args.alpha), ("tie_margin", args.tie_margin))
           if v is not None})
    from dflash_ref.oracle.conform_reference import ModelReference

    reference = ModelReference(target, drafter, args.block_size, args.draft_rule)
    print(f"conform: {total_requests(settings)} requests to {args.server}", file=sys.stderr,
          flush=True)
    with _progress(total_requests(settings)) as bar:
        report = run_conform(client, reference, settings, bar.update if bar else None)
    print(report.table())
    if json_out is not None:
        _write_new(json_out, json.dumps(report.to_json(), indent=1) + "\n")
    return 0 if report.holds else 1


def _load(source, drafter_path, backend: str):
    from dflash_ref.backend import limit_blas_threads

    target = cli_args.load_target(source, backend)
    limit_blas_threads(target.config.hidden_size,  # small models: one BLAS thread, for good
                       vocab_size=target.config.vocab_size)
    drafter = None
    if drafter_path is not None:
        drafter = cli_args.load_drafter(drafter_path, target)
    return target, drafter


def _new_file(text: str) -> Path:
    """``--json``: checked before any request (dflash_ref/io/writing.py: never an existing file)."""
    from dflash_ref.io.writing import check_output_file

    return check_output_file(text, "--json")


def _write_new(path: Path, text: str) -> None:
    """Write the report by the one rule: never half-written, never over a file that appeared."""
    from dflash_ref.io.writing import new_file

    with new_file(path, "--json") as tmp:
        tmp.write_text(text, encoding="utf-8")


class _progress:
    """A tqdm bar on stderr when it is a terminal (else None)."""

    def __init__(self, total: int):
        self.total, self.bar = total, None

    def __enter__(self):
        if sys.stderr.isatty():
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total, desc="requests", file=sys.stderr, leave=False)
        return self.bar

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()
