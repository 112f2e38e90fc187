"""``dflash-ref generate``: text in, text out, on any target (directory or GGUF).

    dflash-ref generate --target PATH [--drafter PATH] --prompt TEXT [--chat
                        [--chat-template FILE|NAME]]
                        [--max-new-tokens N] [--temperature T --seed S]
                        [--backend auto|numpy|cupy] [--weights float32|bf16]
                        [--block-size B] [--verify chain|tree] [--draft-p-min P]

The prompt is tokenized with the target's own tokenizer (``load_tokenizer``: ``tokenizer.json``
in a directory, or the GGUF's ``tokenizer.ggml.*`` metadata); ``--chat`` wraps it as one user
message with the checkpoint's chat template (its BOS comes from the template, so none is added
again); ``--chat-template`` gives the template for a checkpoint that has none (a jinja file, or
a name shipped in ``dflash_ref/data/chat_templates``, e.g. ``gemma3`` for the Gemma 3 instruct
models).

Every check runs before a weight is read: the options from the command line alone
(:func:`check_options`; ``--verify``, ``--block-size`` and ``--draft-p-min`` need ``--drafter``;
``--draft-p-min``, llama.cpp's ``--spec-draft-p-min``, verifies only the drafts up to the first
the drafter doubts: spec_decode/confident_verify.py, greedy chain only), then the pair
from its metadata (:mod:`dflash_ref.io.pair_configs`: the drafter against the target, the
prompt's ids in the vocabulary, prompt + ``--max-new-tokens`` within the target's positions,
:func:`check_run`). On a terminal one status line on stderr says what is loading, with the
loaders' progress bars over the weights; in a pipe stderr stays quiet. The continuation streams
as it is produced, then one line of statistics: its tok/s is measured in the run itself, after
its first step (:class:`StepRate`): no untimed warm-up run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from dflash_ref import cli_args
from dflash_ref.spec_decode.observe import Observer


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="generate text from a prompt (plain or speculative)")
    p.add_argument("--target", required=True, help="target: HF directory or llama.cpp GGUF")
    p.add_argument("--drafter", help="DFlash drafter directory (z-lab layout) or GGUF; "
                   "without it, plain decoding")
    p.add_argument("--prompt", required=True, type=cli_args.utf8_text, help="the prompt text")
    p.add_argument("--chat", action="store_true", help="apply the chat template (one user turn)")
    p.add_argument("--chat-template", metavar="FILE|NAME",
                   help="chat template for --chat: a jinja file, or a shipped name "
                   f"({', '.join(chat_template_names())}); default: the checkpoint's own")
    p.add_argument("--max-new-tokens", type=cli_args.positive_int, default=64)
    p.add_argument("--temperature", type=cli_args.temperature, default=0.0, help="0: greedy")
    p.add_argument("--seed", type=cli_args.seed, default=None,
                   help="required when --temperature > 0")
    p.add_argument("--backend", default="auto", type=cli_args.backend, help="auto, numpy or cupy")
    cli_args.add_weights_option(p)
    p.add_argument("--block-size", type=cli_args.positive_int, default=None,
                   help="with --drafter: the verify block (default: the drafter's trained one)")
    p.add_argument("--verify", default=None, choices=["chain", "tree"],
                   help="with --drafter: chain (default) or tree (DDTree)")
    p.add_argument("--draft-p-min", type=cli_args.probability_floor, default=None, metavar="P",
                   help="with --drafter, greedy chain: verify the drafts only up to the first "
                        "whose probability (over the drafter's 10 best) is below P, as "
                        "llama.cpp's --spec-draft-p-min")
    p.set_defaults(func=cmd_generate)


def _weights(be) -> str:
    """The weight storage for the statistics line ("" for the default float32)."""
    return "" if be.weights == "float32" else f", {be.weights} weights"


TEMPLATE_DIR = Path(__file__).parent / "data" / "chat_templates"


def chat_template_names() -> list[str]:
    """The chat templates shipped with the package (``--chat-template NAME``)."""
    return sorted(p.stem for p in TEMPLATE_DIR.glob("*.jinja"))


def read_chat_template(spec: str) -> str:
    """``--chat-template FILE|NAME`` -> the template text, parsed once so that a syntax error
    is found before any model loads."""
    import jinja2

    from dflash_ref.errors import ConfigError

    path = Path(spec)
    if not path.is_file():
        if spec not in chat_template_names():
            raise ConfigError(f"--chat-template {spec}: neither a file nor a shipped template; "
                              f"expected a jinja file or one of {chat_template_names()}")
        path = TEMPLATE_DIR / f"{spec}.jinja"
    try:
        text = path.read_text(encoding="utf-8")
        jinja2.Environment().parse(text)
    except UnicodeDecodeError as exc:
        raise ConfigError(f"--chat-template {path}: not UTF-8 text ({exc.reason} at byte "
                          f"{exc.start}); expected a jinja template file") from None
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(f"--chat-template {path}: jinja syntax error on line {exc.lineno}: "
                          f"{exc.message}; fix the template") from None
    return text


def _open(path: Path):
    """(the source the weights load from, its tokenizer): cheap, no weights read yet."""
    from dflash_ref.io.gguf_io import open_gguf
    from dflash_ref.io.tokenizer import load_tokenizer

    if path.is_dir():
        return path, load_tokenizer(path)
    gguf = open_gguf(path)  # opened once: the tokenizer and the weights read the same file
    return gguf, load_tokenizer(gguf)


def _prompt_ids(args, tok, template: str | None) -> list[int]:
    """The prompt as ids: plain text, or one user turn in the chat template."""
    import jinja2

    from dflash_ref.errors import ConfigError

    if not args.chat:
        return tok.encode(args.prompt)
    if template is None and tok.chat_template is None:
        raise ConfigError(f"--chat: {args.target} has no chat template (base models usually "
                          f"have none); add --chat-template FILE|NAME, e.g. --chat-template "
                          f"gemma3 for the Gemma 3 instruct template")
    try:
        text = tok.apply_chat_template([{"role": "user", "content": args.prompt}],
                                       chat_template=template)
    except jinja2.TemplateError as exc:
        raise ConfigError(f"--chat: the chat template failed: {exc}; fix the template or give "
                          f"another with --chat-template") from None
    return tok.encode(text, add_bos=False)  # the template writes its own BOS


def check_options(args: argparse.Namespace) -> None:
    """The options that fit together, from the command line alone (nothing opened yet)."""
    if args.temperature > 0 and args.seed is None:
        raise cli_args.UsageError("--temperature > 0 needs --seed S (sampled output must be "
                                  "reproducible); add e.g. --seed 0")
    if args.chat_template is not None and not args.chat:
        raise cli_args.UsageError("--chat-template is used only with --chat; add --chat")
    given = [o for o, v in (("--verify", args.verify), ("--block-size", args.block_size),
                            ("--draft-p-min", args.draft_p_min)) if v is not None]
    if args.drafter is None and given:
        named = " and ".join(given)
        raise cli_args.UsageError(f"{named} {'apply' if len(given) > 1 else 'applies'} to "
                                  f"speculative decoding, and without --drafter generate "
                                  f"decodes plainly; add --drafter PATH or leave {named} out")
    if args.draft_p_min is not None and (args.temperature > 0 or args.verify == "tree"):
        raise cli_args.UsageError("--draft-p-min cuts a greedy chain's drafts; use it with "
                                  "--temperature 0 and --verify chain, or leave it out")


def verify_rule(args: argparse.Namespace):
    """``generate``'s verify argument: the mode named, or with ``--draft-p-min`` the greedy
    chain cut at the first doubted draft."""
    if args.draft_p_min is None:
        return args.verify or "chain"
    from dflash_ref.spec_decode.confident_verify import ConfidentChainVerifier

    return ConfidentChainVerifier(p_min=args.draft_p_min)


def check_pair(args: argparse.Namespace, source, drafter_path: Path | None, ids) -> None:
    """The pair and the run checked from metadata, before a weight is read: the target (a
    checkpoint directory or an opened GGUF) supported, the prompt's ids in its vocabulary, the
    drafter against it (:mod:`dflash_ref.io.pair_configs`), then :func:`check_run`."""
    from dflash_ref.io.pair_configs import drafter_config_of, target_config_of
    from dflash_ref.models.loading import check_supported

    target = target_config_of(source)
    check_supported(target)
    cli_args.check_ids_in_vocabulary(ids, target.vocab_size, "--prompt")
    drafter = drafter_config_of(drafter_path, target) if drafter_path is not None else None
    check_run(args, target, drafter, len(ids))


def check_run(args: argparse.Namespace, target, drafter, n_prompt: int) -> None:
    """The run against the pair's configs, before a weight is read: the prompt and
    ``--max-new-tokens`` within the target's positions, ``--block-size`` within the drafter's
    trained block (``target``, ``drafter``: TargetConfig, DrafterConfig or None)."""
    cli_args.check_positions(n_prompt, args.max_new_tokens, target.max_position_embeddings)
    if drafter is not None and args.block_size and args.block_size > drafter.block_size:
        raise cli_args.UsageError(f"--block-size {args.block_size} exceeds the drafter's "
                                  f"trained block size {drafter.block_size}; give at most "
                                  f"{drafter.block_size}, or leave --block-size out")


def cmd_generate(args: argparse.Namespace) -> int:
    from dflash_ref.ops.sampling import SamplingParams
    from dflash_ref.spec_decode.loop import generate
    from dflash_ref.spec_decode.observe import Observers, Stream

    target_path = cli_args.existing_path(args.target, "--target")
    d = cli_args.existing_path(args.drafter, "--drafter") if args.drafter else None
    check_options(args)
    backend = cli_args.model_backend(args.backend, args.weights)
    template = read_chat_template(args.chat_template) if args.chat_template else None
    t0 = time.perf_counter()
    with Status() as status:  # cleared before anything else is printed, an error included
        status.say(f"loading {target_path.name}: metadata and tokenizer")
        source, tok = _open(target_path)
        ids = _prompt_ids(args, tok, template)
        check_pair(args, source, d, ids)  # metadata only: no weight read yet
        status.say(f"loading {target_path.name}: weights")
        target = cli_args.load_target(source, backend)
        drafter = None
        if d is not None:
            status.say(f"loading {d.name}")
            drafter = cli_args.load_drafter(d, target)
    load_s = time.perf_counter() - t0
    stream, rate = _Stream(tok, ids), StepRate()
    if not args.chat:  # the prompt as the tokenizer reads it back, then the continuation
        print(stream.shown, end="", flush=True)
    res = generate(target, drafter, ids, args.max_new_tokens,
                   sampling=SamplingParams(args.temperature, seed=args.seed),
                   block_size=args.block_size, verify=verify_rule(args),
                   stop_token_ids=list(tok.stop_token_ids),
                   observer=Observers(Stream(stream.add), rate))
    print()
    print(f"[{len(res.tokens)} tokens, tau {res.tau:.2f}, acceptance {res.acceptance_rate:.1%}, "
          f"{res.target_forward_passes} target forwards, {rate.describe()}; "
          f"load {load_s:.1f} s; backend {target.be.name}{_weights(target.be)}]")
    return 0


class Status:
    """One line of progress on stderr, rewritten in place, when stderr is a terminal (quiet in
    a pipe or a file). The loaders' tqdm bars draw on the same line while they read weights."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.on = self.stream.isatty()

    def say(self, text: str) -> None:
        if self.on:
            self.stream.write(f"\r\033[K{text} ...")
            self.stream.flush()

    def clear(self) -> None:
        if self.on:
            self.stream.write("\r\033[K")
            self.stream.flush()

    def __enter__(self) -> Status:
        return self

    def __exit__(self, *exc) -> None:
        self.clear()


class StepRate(Observer):
    """Tokens per second after the run's first step, in the timed run itself (no warm-up run).

    The prefill and the first step pay the one-time costs (BLAS threads started, CuPy kernels
    compiled, caches allocated) that an untimed warm-up run used to absorb; the rate counts the
    tokens of the later steps over the time since the first step emitted. A run of fewer than
    three emits (prefill, first step, one more) is timed whole, and says so.
    """

    def __init__(self):
        self.t_start = time.perf_counter()
        self.times: list[float] = []  # when each emit came (the prefill's token first)
        self.counts: list[int] = []

    def on_emit(self, ids) -> None:
        self.times.append(time.perf_counter())
        self.counts.append(len(ids))

    def describe(self) -> str:
        if len(self.times) < 3:
            wall = (self.times[-1] if self.times else time.perf_counter()) - self.t_start
            rate = sum(self.counts) / max(wall, 1e-9)
            return f"{rate:.1f} tok/s (the whole run, first step included)"
        rate = sum(self.counts[2:]) / max(self.times[-1] - self.times[1], 1e-9)
        return f"{rate:.1f} tok/s after the first step"


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


def run_timed(target, drafter, prompt, args, label: str, state=None):
    """One of ``dflash-ref demo``'s timed runs: ``generate`` with the demo's arguments and a
    progress bar; ``state`` (``--graphs``: one graphed state for every run) is emptied first."""
    from dflash_ref.spec_decode.loop import generate
    from dflash_ref.spec_decode.observe import Progress

    try:
        from tqdm.auto import tqdm
    except ImportError:  # the progress bar is optional
        tqdm = None
    bar = (tqdm(total=args.max_new_tokens, desc=label, leave=False, disable=None)  # None: off
           if tqdm else None)  # when stderr is not a terminal
    if state is not None:  # reused (its captured steps with it): emptied first
        state.truncate(0)
    res = generate(target, drafter, prompt, args.max_new_tokens, block_size=args.block_size,
                   verify=args.verify, observer=Progress(bar.update) if bar else None,
                   state=state)
    if bar:
        bar.close()
    return res
