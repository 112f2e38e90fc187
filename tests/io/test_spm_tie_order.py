"""The SentencePiece ("llama") GGUF tokenizer breaks score ties the way llama.cpp does.

llama.cpp (src/llama-vocab.cpp, llm_tokenizer_spm_session) merges the adjacent pair whose
merged token has the highest score and, among equal scores, the leftmost pair. The oracle here
is an independent brute force of that rule written in this file (scan every adjacent pair after
each merge), checked on issue 26's example and on a randomized tie-heavy search. A BPE merge
list ranked by score breaks ties between different merged tokens by rank instead: the bug these
tests catch.
"""

from __future__ import annotations

import numpy as np
import pytest

from dflash_ref.io.spm import spm_pieces
from dflash_ref.io.tokenizer import load_tokenizer
from tests.io.test_tokenizer import NORMAL, write_tokenizer_gguf

# issue 26's example: different merged tokens of equal score
ISSUE_TOKENS = "a b c cb ca ccabb acb acaa ccab ccc aabc aab cacaa cc ac".split()
ISSUE_SCORES = [-1, -1, -3, -3, -2, -3, -3, -2, -1, -3, -3, -1, -3, -2, -2]


def brute_force_llama_cpp(text, score):
    """Highest score first, then the leftmost pair; stop when no adjacent pair is a token."""
    symbols = list(text)
    while True:
        best = None  # (score, position)
        for i in range(len(symbols) - 1):
            merged = symbols[i] + symbols[i + 1]
            if merged in score and (best is None or score[merged] > best[0]):
                best = (score[merged], i)  # strict '>': an equal score further right loses
        if best is None:
            return symbols
        i = best[1]
        symbols[i:i + 2] = [symbols[i] + symbols[i + 1]]


def test_spm_tie_order_issue_example_is_llama_cpps():
    score = dict(zip(ISSUE_TOKENS, map(float, ISSUE_SCORES)))
    expected = "b cc a ac cc b b a".split()  # issue 26, llama.cpp's rule
    assert brute_force_llama_cpp("bccaacccbba", score) == expected
    assert spm_pieces("bccaacccbba", score) == expected


def test_spm_tie_order_issue_example_through_a_gguf(tmp_path):
    path = write_tokenizer_gguf(tmp_path / "ties.gguf", "llama", "llama", ISSUE_TOKENS,
                                [NORMAL] * len(ISSUE_TOKENS), scores=ISSUE_SCORES,
                                add_bos=False, add_space_prefix=False)
    ids = load_tokenizer(path).encode("bccaacccbba")
    assert [ISSUE_TOKENS[i] for i in ids] == "b cc a ac cc b b a".split()


def random_vocab(rng):
    """Tokens over {a, b, c} with scores drawn from three values: many ties."""
    tokens = {"a", "b", "c"}
    while len(tokens) < int(rng.integers(6, 20)):
        tokens.add("".join(rng.choice(list("abc"), size=int(rng.integers(2, 6)))))
    return {t: float(rng.integers(-3, 0)) for t in sorted(tokens)}


def test_spm_tie_order_randomized_matches_llama_cpps_rule():
    rng = np.random.default_rng(26)
    for _ in range(400):
        score = random_vocab(rng)
        text = "".join(rng.choice(list("abc"), size=int(rng.integers(1, 24))))
        assert spm_pieces(text, score) == brute_force_llama_cpp(text, score), (score, text)


@pytest.mark.parametrize("seed", range(3))
def test_spm_tie_order_randomized_through_a_gguf(tmp_path, seed):
    rng = np.random.default_rng(seed)
    score = random_vocab(rng)
    tokens = list(score)
    path = write_tokenizer_gguf(tmp_path / "r.gguf", "llama", "llama", tokens,
                                [NORMAL] * len(tokens), scores=[score[t] for t in tokens],
                                add_bos=False, add_space_prefix=False)
    tok = load_tokenizer(path)
    for _ in range(40):
        text = "".join(rng.choice(list("abc"), size=int(rng.integers(1, 30))))
        assert [tokens[i] for i in tok.encode(text)] == brute_force_llama_cpp(text, score)


# Equal scores, left pieces of different lengths. "yz" merges first, then "xyz" (left piece "x",
# one character, at position 0) and "yzw" (left piece "yz", two characters, at position 1) tie.
# llama.cpp breaks the tie by the left symbol's index alone, whatever the pieces' lengths
# (src/llama-vocab.cpp, llm_bigram_spm::comparator: ``(l.score < r.score) || (l.score ==
# r.score && l.left > r.left)``; sentencepiece's src/bpe_model.cc SymbolPair comparator is the
# same), and a merged symbol keeps its left part's index: "xyz" wins. The second case puts the
# longer left piece first, the third the longer merge last. Catches a tie broken by the left
# piece's (or the merged piece's) length instead of its position.
LENGTH_TIES = [
    ("xyzw", {"x": -9.0, "y": -9.0, "z": -9.0, "w": -9.0, "yz": 5.0, "xyz": 0.0, "yzw": 0.0},
     ["xyz", "w"]),
    ("xyzw", {"x": -9.0, "y": -9.0, "z": -9.0, "w": -9.0, "xy": 5.0, "xyz": 0.0, "zw": 0.0},
     ["xyz", "w"]),
    ("xyzw", {"x": -9.0, "y": -9.0, "z": -9.0, "w": -9.0, "zw": 5.0, "xy": 0.0, "yzw": 0.0},
     ["xy", "zw"]),
]


@pytest.mark.parametrize(("text", "score", "expected"), LENGTH_TIES)
def test_spm_tie_between_left_pieces_of_different_lengths(tmp_path, text, score, expected):
    assert brute_force_llama_cpp(text, score) == expected  # the hand result is the rule's
    assert spm_pieces(text, score) == expected
    tokens = list(score)
    path = write_tokenizer_gguf(tmp_path / "len.gguf", "llama", "llama", tokens,
                                [NORMAL] * len(tokens), scores=[score[t] for t in tokens],
                                add_bos=False, add_space_prefix=False)
    assert [tokens[i] for i in load_tokenizer(path).encode(text)] == expected
