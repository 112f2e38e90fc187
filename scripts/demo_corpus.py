"""The demo pair's corpus, byte vocabulary and held-out prompts (docs/training.md).

The corpus is shipped in the repository (``scripts/corpus/cpython_3_11_lib.py.txt``): 36 modules
of the CPython 3.11 standard library, concatenated with a ``# ==== Lib/<path> ====`` header before
each, under the PSF license (``scripts/corpus/LICENSE-PSF.txt``). Tokens are bytes: id b is byte
b, and three special ids follow. Four modules are held out of training; the held-out prompts are
slices of them, chosen by a fixed seed. This module needs only NumPy, so the tests import it too.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

CORPUS = Path(__file__).resolve().parent / "corpus" / "cpython_3_11_lib.py.txt"
HELD_OUT_FILES = ("Lib/csv.py", "Lib/queue.py", "Lib/shlex.py", "Lib/textwrap.py")

# the vocabulary: 256 bytes, then the special tokens
EOT, MASK, PAD = 256, 257, 258
SPECIAL_TOKENS = {"<|endoftext|>": EOT, "<|mask|>": MASK, "<|pad|>": PAD}
VOCAB_SIZE = 259

_HEADER = re.compile(rb"^# ==== (Lib/\S+) ====\n", re.MULTILINE)


def indent_with_tabs(data: bytes) -> bytes:
    """Each leading group of 4 spaces becomes one tab (still valid Python, same meaning).

    A small byte-level model otherwise spends its capacity counting runs of up to 16 spaces, and
    its greedy text falls into an endless run of spaces after the first deep indent."""
    return re.sub(rb"^(?:    )+", lambda m: b"\t" * (len(m.group(0)) // 4), data,
                  flags=re.MULTILINE)


def load_files(path: Path = CORPUS) -> dict[str, bytes]:
    """The corpus as {module path: its bytes}, header lines removed, indents as tabs, in file
    order."""
    data = indent_with_tabs(Path(path).read_bytes())
    heads = list(_HEADER.finditer(data))
    return {m.group(1).decode(): data[m.end(): (heads[i + 1].start() if i + 1 < len(heads)
                                                  else len(data))]
            for i, m in enumerate(heads)}


def split_corpus(path: Path = CORPUS) -> tuple[np.ndarray, dict[str, bytes]]:
    """(training tokens, held-out files): the training modules joined with EOT between them."""
    files = load_files(path)
    train = [np.frombuffer(b, np.uint8).astype(np.int64) for name, b in files.items()
             if name not in HELD_OUT_FILES]
    joined = []
    for t in train:
        joined += [t, np.array([EOT], np.int64)]
    return np.concatenate(joined), {n: files[n] for n in HELD_OUT_FILES}


def held_out_prompts(n: int = 24, length: int = 64, seed: int = 15,
                     path: Path = CORPUS) -> list[np.ndarray]:
    """``n`` prompts of ``length`` bytes from the held-out modules, each starting at a line start
    whose line is not blank, spread over the four files (seeded, so the same everywhere)."""
    rng = np.random.default_rng(seed)
    held = split_corpus(path)[1]
    prompts = []
    names = list(held)
    for i in range(n):
        data = held[names[i % len(names)]]
        starts = [m.start() for m in re.finditer(rb"^[ \t]*\S", data, re.MULTILINE)
                  if m.start() + length <= len(data)]
        s = starts[int(rng.integers(len(starts)))]
        prompts.append(np.frombuffer(data[s: s + length], np.uint8).astype(np.int64))
    return prompts


def decode_bytes(ids) -> str:
    """Text of byte ids (special ids dropped; invalid UTF-8 shown as U+FFFD)."""
    return bytes(int(t) for t in ids if int(t) < 256).decode("utf-8", errors="replace")
