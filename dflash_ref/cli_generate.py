"""``dflash-ref generate``: text in, text out, on any target (directory or GGUF).

    dflash-ref generate --target PATH [--drafter PATH] --prompt TEXT [--chat]
                        [--max-new-tokens N] [--temperature T --seed S]
                        [--backend auto|numpy|cupy] [--block-size B] [--verify chain|tree]

The prompt is tokenized with the target's own tokenizer (``load_tokenizer``: ``tokenizer.json``
in a directory, or the GGUF's ``tokenizer.ggml.*`` metadata); ``--chat`` wraps it as one user
message with the checkpoint's chat template (its BOS comes from the template, so none is added
again). The continuation streams as it is produced, then one line of statistics.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="generate text from a prompt (plain or speculative)")
    p.add_argument("--target", required=True, help="target: HF directory or llama.cpp GGUF")
    p.add_argument("--drafter", help="DFlash drafter directory (z-lab layout) or GGUF; "
                   "without it, plain decoding")
    p.add_argument("--prompt", required=True, help="the prompt text")
    p.add_argument("--chat", action="store_true", help="apply the chat template (one user turn)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument("--seed", type=int, default=None, help="required when --temperature > 0")
    p.add_argument("--backend", default="auto", choices=["auto", "numpy", "cupy"])
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--verify", default="chain", choices=["chain", "tree"])
    p.set_defaults(func=cmd_generate)


def _load(path: Path, backend: str):
    from dflash_ref.io.gguf_io import open_gguf
    from dflash_ref.io.tokenizer import load_tokenizer
    from dflash_ref.models.target import TargetModel

    if path.is_dir():
        return TargetModel.from_pretrained(path, backend=backend), load_tokenizer(path)
    gguf = open_gguf(path)  # opened once: the tokenizer and the weights read the same file
    return TargetModel.from_gguf(gguf, backend=backend), load_tokenizer(gguf)


def cmd_generate(args: argparse.Namespace) -> int:
    from dflash_ref.models.drafter import DFlashDrafter
    from dflash_ref.ops.sampling import SamplingParams
    from dflash_ref.spec_decode.loop import generate
    from dflash_ref.spec_decode.observe import Stream

    target_path = Path(args.target)
    if not target_path.exists():
        print(f"error: --target {target_path} does not exist", file=sys.stderr)
        return 2
    if args.temperature > 0 and args.seed is None:
        print("error: --temperature > 0 needs --seed S (sampled output must be reproducible)",
              file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    target, tok = _load(target_path, args.backend)
    drafter = None
    if args.drafter:
        d = Path(args.drafter)
        drafter = (DFlashDrafter.from_pretrained(d, target) if d.is_dir()
                   else DFlashDrafter.from_gguf(d, target))
    load_s = time.perf_counter() - t0
    if args.chat:
        text = tok.apply_chat_template([{"role": "user", "content": args.prompt}])
        ids = tok.encode(text, add_bos=False)  # the template writes its own BOS
    else:
        ids = tok.encode(args.prompt)
    stream = _Stream(tok, ids)
    if not args.chat:  # the prompt as the tokenizer reads it back, then the continuation
        print(stream.shown, end="", flush=True)
    t1 = time.perf_counter()
    res = generate(target, drafter, ids, args.max_new_tokens,
                   sampling=SamplingParams(args.temperature, seed=args.seed),
                   block_size=args.block_size, verify=args.verify,
                   stop_token_ids=[t for t in (tok.eos_token_id,) if t is not None],
                   observer=Stream(stream.add))
    wall = time.perf_counter() - t1
    print()
    rate = len(res.tokens) / max(wall, 1e-9)
    print(f"[{len(res.tokens)} tokens, tau {res.tau:.2f}, acceptance {res.acceptance_rate:.1%}, "
          f"{res.target_forward_passes} target forwards, {rate:.1f} tok/s; load {load_s:.1f} s; "
          f"backend {target.be.name}]")
    return 0


class _Stream:
    """Print the decoded continuation as ids arrive.

    Decodes prompt + continuation and prints what is new, so spacing at the join follows the
    tokenizer and a character split across tokens appears once it is complete.
    """

    def __init__(self, tok, prompt_ids):
        self.tok, self.ids = tok, list(prompt_ids)
        self.shown = tok.decode(self.ids)

    def add(self, ids) -> None:
        self.ids.extend(ids)
        text = self.tok.decode(self.ids)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next token
            return
        print(text[len(self.shown):], end="", flush=True)
        self.shown = text
