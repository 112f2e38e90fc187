"""Text for ``dflash-ref demo``: byte-level vocabularies and accepted-draft marking.

The shipped demo pair reads bytes (id b is byte b; docs/training.md). Its ``tokenizer.json`` is a
byte-level BPE without merges; :func:`is_byte_vocabulary` recognises that layout from the JSON
alone, so the demo needs no tokenizer library. :func:`render_marked` prints a continuation with
the characters that came from accepted drafts marked: coloured on a terminal, in [brackets]
otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path

ACCEPTED_COLOUR, RESET = "\x1b[30;42m", "\x1b[0m"  # black on green


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (the ByteLevel pre-tokenizer's alphabet)."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def is_byte_vocabulary(model_dir) -> bool:
    """True when ``model_dir/tokenizer.json`` maps byte b to id b (byte-level, no merges)."""
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        return False
    try:
        tok = json.loads(path.read_text(encoding="utf-8"))
        vocab, merges = tok["model"]["vocab"], tok["model"].get("merges") or []
        decoder = (tok.get("decoder") or {}).get("type")
    except (ValueError, KeyError, TypeError, AttributeError):
        return False
    table = bytes_to_unicode()
    return (decoder == "ByteLevel" and not merges and len(vocab) == 256
            and all(vocab.get(table[b]) == b for b in range(256)))


def encode_text(text: str) -> list[int]:
    """Byte ids of ``text`` (UTF-8)."""
    return list(text.encode("utf-8"))


def decode_bytes(ids) -> str:
    """Text of byte ids (ids >= 256 are special tokens and dropped; bad UTF-8 shows as U+FFFD)."""
    return bytes(int(t) for t in ids if 0 <= int(t) < 256).decode("utf-8", errors="replace")


def _runs(flags):
    start = 0
    for i in range(1, len(flags) + 1):
        if i == len(flags) or flags[i] != flags[start]:
            yield start, i, bool(flags[start])
            start = i


def render_marked(tokens, from_draft, as_bytes: bool, colour: bool) -> str:
    """The tokens with the runs of accepted drafts marked (ANSI colour or [brackets]).

    ``as_bytes``: decode byte ids to text run by run; otherwise print ids separated by spaces.
    """
    parts = []
    for a, b, drafted in _runs(list(from_draft)):
        piece = (decode_bytes(tokens[a:b]) if as_bytes
                 else " ".join(str(int(t)) for t in tokens[a:b]))
        if drafted:
            piece = f"{ACCEPTED_COLOUR}{piece}{RESET}" if colour else f"[{piece}]"
        parts.append(piece)
    return ("" if as_bytes else " ").join(parts)


def demo_held_out_prompts(n: int = 16) -> list[list[int]]:
    """The first ``n`` (at most 24) held-out prompts of the demo pair, 64 byte ids each, read
    from package data (``data/demo/held_out_prompts.json``, written from
    ``scripts/demo_corpus.py``'s ``held_out_prompts(24)``), so an installed package needs no
    source checkout."""
    from importlib.resources import files

    path = files("dflash_ref") / "data" / "demo" / "held_out_prompts.json"
    prompts = json.loads(path.read_text(encoding="utf-8"))["prompts"]
    return prompts[:n]
