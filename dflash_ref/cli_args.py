"""Argument checks of the ``dflash-ref`` command line, run while parsing: before any model loads.

Every check raises :class:`argparse.ArgumentTypeError` (inside ``type=``) or
:class:`~dflash_ref.errors.ConfigError` (after parsing) with what was wrong, what was expected
and the fix; :class:`Parser` prints argparse's own refusals as one ``error:`` line, and
:func:`report_error` turns anything a command raises into one line (``--debug``: the traceback).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from dflash_ref.errors import ConfigError, DFlashRefError


class UsageError(ConfigError):
    """Options that do not fit together (exit 2, as argparse's own refusals)."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose refusals are one ``error:`` line (no usage block), exit 2."""

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {message} (see '{self.prog} --help')\n")


def int_at_least(lowest: int):
    """An argparse type: an integer >= ``lowest``, refused with what was expected."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer; expected an integer "
                                             f">= {lowest}") from None
        if value < lowest:
            raise argparse.ArgumentTypeError(f"{value} is not allowed; expected an integer "
                                             f">= {lowest}")
        return value

    return parse


positive_int = int_at_least(1)  # --max-new-tokens, --block-size
seed = int_at_least(0)  # --seed (numpy.random.default_rng refuses negative seeds)


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def _at_least_zero(text: str, example: str) -> float:
    """A finite number >= 0, or the error naming the option's ``example``."""
    value = _float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; expected a finite number >= 0 "
                                         f"({example})")
    return value


def temperature(text: str) -> float:
    """``--temperature``: a finite number >= 0 (0 is greedy)."""
    return _at_least_zero(text, "0: greedy")


def probability_floor(text: str) -> float:
    """``--draft-p-min``: a finite number >= 0 (0 keeps every draft; above 1 none)."""
    return _at_least_zero(text, "a probability, e.g. 0.5")


def positive_float(text: str) -> float:
    """``--tolerance-scale`` / ``--threshold-factor``: a finite number > 0."""
    value = _float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; expected a finite number > 0 "
                                         f"(1: as stated)")
    return value


def token_ids(text: str) -> list[int]:
    """``--prompt`` (demo) / ``--ids`` / ``--detail-steps``: comma- or space-separated ints >= 0."""
    items = text.replace(",", " ").split()
    bad = [t for t in items if not t.isdigit()]
    if bad:
        raise argparse.ArgumentTypeError(f"{text!r}: {bad[0]!r} is not a non-negative integer; "
                                         f"expected ids such as 3,17,42")
    return [int(t) for t in items]


def nonempty_token_ids(text: str) -> list[int]:
    ids = token_ids(text)
    if not ids:
        raise argparse.ArgumentTypeError(f"{text!r} holds no id; expected ids such as 3,17,42")
    return ids


def utf8_text(text: str) -> str:
    """``--prompt`` / ``--text``: text that is valid UTF-8 (argv bytes that are not arrive as
    lone surrogates, which no tokenizer can encode)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start:exc.end].encode("utf-8", "surrogateescape")
        raise argparse.ArgumentTypeError(f"the text is not valid UTF-8 (bytes {bad!r} at "
                                         f"character {exc.start}); pass UTF-8 text") from None
    return text


def backend(text: str) -> str:
    """``--backend``: numpy, auto, or cupy where CuPy and a GPU are usable here."""
    if text not in ("numpy", "cupy", "auto"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a backend; expected numpy, cupy or "
                                         f"auto")
    if text == "cupy":
        from dflash_ref.backend import cupy_unavailable_reason

        reason = cupy_unavailable_reason()
        if reason is not None:
            raise argparse.ArgumentTypeError(f"cupy is unavailable here ({reason}); use "
                                             f"--backend numpy or auto")
    return text


def add_weights_option(parser) -> None:
    """``--weights float32|bf16``: how a CuPy backend stores the projections' weights."""
    parser.add_argument("--weights", default="float32", choices=["float32", "bf16"],
                        help="projection weight storage: float32 (default) or bf16 (cupy "
                        "only: half the bytes a decode reads; docs/performance.md)")


def model_backend(name: str, weights: str = "float32"):
    """The backend the loaders get for ``--backend name --weights weights``; ``--weights bf16``
    where the backend is (or "auto" resolves to) NumPy is a UsageError, raised before anything
    loads."""
    from dflash_ref.backend import cupy_unavailable_reason, get_backend

    if weights == "float32":
        return name  # the loaders resolve the name themselves, as before
    if name == "numpy" or (name == "auto" and cupy_unavailable_reason() is not None):
        why = "" if name == "numpy" else " (--backend auto found no usable GPU here)"
        raise UsageError(f"--weights {weights} is an option of the cupy backend{why}; the NumPy "
                         f"reference keeps float32 weights: drop --weights or use "
                         f"--backend cupy on a GPU")
    return get_backend("cupy", weights=weights)


def existing_path(text: str | Path, option: str) -> Path:
    """A path that exists, else a ConfigError naming ``option``."""
    path = Path(text)
    if not path.exists():
        where = path.parent if str(path.parent) not in ("", ".") else Path(".")
        hint = ("" if where.is_dir() else f" (its folder {where} does not exist either)")
        raise ConfigError(f"{option} {path}: no such file or directory{hint}; expected a "
                          f"checkpoint directory or a .gguf file")
    return path


def checkpoint_directory(text: str | Path, option: str) -> Path:
    """An existing checkpoint directory (or its config.json); a GGUF or other file is refused."""
    path = existing_path(text, option)
    if not (path.is_dir() or path.suffix == ".json"):
        raise ConfigError(f"{option} takes the target's checkpoint directory (config.json, "
                          f"tokenizer.json), got the file {path}; pass the HF directory the "
                          f"target was converted from, or leave {option} out (the GGUF then "
                          f"has no vocabulary keys: docs/training.md, \"llama.cpp\", adds a "
                          f"GGUF target's)")
    return path


def gguf_file_or_directory(path: Path) -> bool:
    """True for a GGUF file, False for a directory; a FormatError for any other file. Reads the
    first four bytes only (never the whole file: a model can be gigabytes)."""
    from dflash_ref.errors import FormatError
    from dflash_ref.io.gguf_io import GGUF_MAGIC

    if path.is_dir():
        return False
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise FormatError(f"{path}: the file is not GGUF (it starts with {magic!r}, not "
                          f"{GGUF_MAGIC!r}); expected a .gguf file or a checkpoint directory "
                          f"(config.json + *.safetensors)")
    return True


def target_source(path: Path, need_tokenizer: bool = True):
    """(the source a target loads its weights from, its tokenizer or None): metadata only. A
    GGUF's tokenizer is its own metadata, the file opened once for it and for the weights; a
    directory's is its tokenizer.json (loaded when ``need_tokenizer`` or when it exists)."""
    from dflash_ref.io.gguf_io import open_gguf
    from dflash_ref.io.tokenizer import load_tokenizer

    if not gguf_file_or_directory(path):
        return path, (load_tokenizer(path) if need_tokenizer
                      or (path / "tokenizer.json").exists() else None)
    gguf = open_gguf(path)
    return gguf, load_tokenizer(gguf)


def load_target(source, backend: str = "numpy"):
    """The target from :func:`target_source`'s source: a checkpoint directory or an open GGUF."""
    from dflash_ref.models.target import TargetModel

    if isinstance(source, Path):
        return TargetModel.from_pretrained(source, backend=backend)
    return TargetModel.from_gguf(source, backend=backend)


def load_drafter(path: Path, target):
    """The drafter at ``path`` bound to ``target``: a z-lab directory or a llama.cpp GGUF."""
    from dflash_ref.models.drafter import DFlashDrafter

    if gguf_file_or_directory(Path(path)):
        return DFlashDrafter.from_gguf(path, target)
    return DFlashDrafter.from_pretrained(path, target)


def check_ids_in_vocabulary(ids, vocab_size: int, option: str) -> None:
    """Token ids the loaded target can embed: each below its vocabulary size."""
    bad = [i for i in ids if i >= vocab_size]
    if bad:
        raise ConfigError(f"{option}: id {bad[0]} is outside the target's vocabulary of "
                          f"{vocab_size}; expected ids 0..{vocab_size - 1}")


def check_positions(n_prompt: int, max_new_tokens: int, max_positions: int | None) -> None:
    """Prompt + continuation within the target's trained positions (``max_position_embeddings``
    L, a GGUF's ``context_length``): past them the output is not what the model was trained to
    give. The N prompt tokens sit at positions 0..N-1 and the M new ones at N..N+M-1, and the
    model was trained on 0..L-1: so N + M == L is the longest run allowed, N + M == L + 1 the
    first refused. (A last verify block may compute rows past N+M-1; they are cut, and causal
    attention keeps them from changing an emitted token.)"""
    if max_positions and n_prompt + max_new_tokens > max_positions:
        raise ConfigError(f"{n_prompt} prompt tokens + --max-new-tokens {max_new_tokens} = "
                          f"{n_prompt + max_new_tokens} positions, past the target's "
                          f"max_position_embeddings {max_positions}; lower --max-new-tokens to "
                          f"at most {max(max_positions - n_prompt, 0)} or shorten the prompt")


def one_line(exc: BaseException) -> str:
    """An exception as one line: its message with line breaks folded."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, KeyError):
        text = f"missing key {text}"
    return text


USER_ERRORS = (DFlashRefError, OSError, ValueError, KeyError, ImportError)


def report_error(exc: BaseException) -> int:
    """Print ``exc`` as one ``error:`` line on stderr and return the exit status."""
    if isinstance(exc, KeyboardInterrupt):
        print("error: interrupted", file=sys.stderr)
        return 130
    if isinstance(exc, USER_ERRORS):
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2 if isinstance(exc, UsageError) else 1
    print(f"error: internal error {type(exc).__name__}: {one_line(exc)}; rerun with "
          f"'dflash-ref --debug ...' for the traceback and report it", file=sys.stderr)
    return 1


def run_command(func, args: argparse.Namespace) -> int:
    """``func(args)``, with any error as one ``error:`` line and its exit status (``--debug`` or
    ``DFLASH_REF_DEBUG=1``: the traceback). A closed stdout (``dflash-ref inspect ... | head``)
    ends the command quietly."""
    try:
        return func(args)
    except BrokenPipeError:  # the reader went away: nothing more to say, and nowhere to say it
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush stays quiet
        return 141  # 128 + SIGPIPE, as a shell reports it
    except (Exception, KeyboardInterrupt) as exc:
        if getattr(args, "debug", False) or os.environ.get("DFLASH_REF_DEBUG"):
            raise
        return report_error(exc)
