"""The Gemma 3 drafter's data stage (scripts/gemma3_data.py, scripts/gemma3_corpus.py): which
labels of a teacher-forced window are exact, the windows, the draft vocabulary, the held-out split.

Expected values come from running the greedy continuation explicitly on a toy deterministic
"target" (a lookup table), not from the mask's own formula.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import gemma3_corpus  # noqa: E402
import gemma3_data  # noqa: E402


def _toy_next(prefix: tuple[int, ...]) -> int:
    """A deterministic toy target: its greedy next token depends on the last two tokens."""
    a = prefix[-2] if len(prefix) > 1 else 0
    return (3 * prefix[-1] + a) % 5


def _greedy_continuation(prefix: list[int], n: int) -> list[int]:
    out, seq = [], list(prefix)
    for _ in range(n):
        seq.append(_toy_next(tuple(seq)))
        out.append(seq[-1])
    return out


@pytest.mark.parametrize("seed", range(6))
def test_exact_labels_are_the_greedy_continuation(seed):
    # Catches: an off-by-one in the agreement chain (row j checked against x[s+j] instead of
    # x[s+j-1]), the mask not cumulative (a later agreement re-opening a row), rows past the
    # window's end marked exact.
    rng = np.random.default_rng(seed)
    W, rows = 24, 7
    ids = rng.integers(0, 5, W)
    for t in range(1, W):  # mostly the toy's own text, with some corpus surprises
        if rng.random() < 0.75:
            ids[t] = _toy_next(tuple(ids[:t]))
    pred = np.array([_toy_next(tuple(ids[: t + 1])) for t in range(W)])
    anchors = np.arange(W)
    exact = gemma3_data.exact_rows(ids, pred, anchors, rows)
    for s in anchors:
        truth = _greedy_continuation(list(ids[: s + 1]), rows)  # what verification accepts
        for j in range(rows):
            t = s + j
            if exact[s, j]:
                assert t < W and pred[t] == truth[j], (s, j)
        # exactness is a prefix: once a row is inexact, every later row is
        assert not np.any(np.diff(exact[s].astype(int)) > 0), exact[s]
        # and as long as the corpus agreed, it is exact (not too strict)
        n_exact = int(exact[s].sum())
        agree = [ids[s + i] == pred[s + i - 1] for i in range(1, rows) if s + i < W]
        expected = 1 + next((i for i, a in enumerate(agree) if not a), len(agree))
        assert n_exact == min(expected, W - s), (s, n_exact, expected)


def test_the_first_row_is_always_exact_and_the_last_position_ends_the_window():
    # Catches: row 1 masked by the agreement of x[s+1] (which row 1 does not need); a label
    # read past the window's end.
    ids, pred = np.array([2, 7, 7, 7]), np.array([1, 1, 1, 1])
    got = gemma3_data.exact_rows(ids, pred, np.array([0, 3]), 3)
    assert got.tolist() == [[True, False, False], [True, False, False]]


class _Tok:
    def encode(self, text, add_bos=False):
        return [ord(c) for c in text]


def test_windows_cover_each_text_and_start_with_bos():
    # Catches: a text's tail dropped (the last window must end at the text's end), <bos> missing,
    # a window of the wrong length, a text shorter than a window kept.
    texts = {"a": "x" * 10 + "yz", "b": "q" * 4, "e": "e" * 5, "c": "0123456789abcdefghij"}
    wins = gemma3_data.windows(texts, _Tok(), window=6, seed=0)
    by = {}
    for name, w in wins:
        assert w[0] == gemma3_corpus.BOS and w.size == 6
        by.setdefault(name, []).append("".join(map(chr, w[1:])))
    assert "b" not in by and by["e"] == ["eeeee"]  # exactly one window of text: kept
    assert sorted(by["c"]) == ["01234", "56789", "abcde", "fghij"]
    assert sorted(by["a"])[-1].endswith("yz") and "".join(sorted(by["a"])).count("x") >= 10


def test_the_draft_vocabulary_is_the_most_predicted_ids():
    # Catches: least frequent ids chosen, ties broken by the higher id, an unsorted vocabulary
    # (d2t offsets need draft row order = ascending target id here).
    preds = np.array([9, 9, 9, 4, 4, 7, 7, 1])
    assert gemma3_data.draft_vocabulary(preds, 3).tolist() == [4, 7, 9]
    assert gemma3_data.draft_vocabulary(preds, 2).tolist() == [4, 9]  # 4 and 7 tie: 4 wins


def test_the_held_out_prose_never_appears_in_training():
    # Catches: a held-out topic name misspelt (then it would train), pydoc's repeated text
    # leaking a held-out topic into a training one.
    prose = gemma3_corpus.prose_files()
    assert set(gemma3_corpus.HELD_OUT_TOPICS) <= set(prose)
    training = "".join(t for n, t in gemma3_corpus.training_texts().items())
    held = [line for n in gemma3_corpus.HELD_OUT_TOPICS for line in prose[n].splitlines()
            if len(line) > 40]
    assert held and not [line for line in held if line in training]
    assert not set(gemma3_corpus.training_texts()) & {"Lib/csv.py", "topic dict"}


def test_a_part_added_later_leaves_every_earlier_chunk_where_it_was():
    # The cache's chunk i must hold the same windows before and after a part is added, and the
    # new part's chunks start at a chunk boundary (the first part's last chunk stays short).
    # Catches: the parts' windows shuffled together, one chunking over all parts (the first
    # part's short last chunk then filled with the second part's windows).
    first = {"a": "a" * 23, "b": "b" * 13}
    second = {"c": "c" * 21}
    before = gemma3_data.chunks([first], _Tok(), window=6, chunk=3, seed=5)
    after = gemma3_data.chunks([first, second], _Tok(), window=6, chunk=3, seed=5)
    assert [len(c) for c in before] == [3, 3, 2]  # 5 + 3 windows of 5 ids, in chunks of 3
    assert len(after) == len(before) + 2
    for old, new in zip(before, after):
        assert [n for n, _ in old] == [n for n, _ in new]
        assert all((x == y).all() for (_, x), (_, y) in zip(old, new))
    assert {n for c in after[len(before):] for n, _ in c} == {"c"}


def test_the_added_code_holds_no_held_out_or_first_part_module():
    # scripts/corpus/cpython_3_11_lib_more.py.txt (scripts/corpus/build_more.py): the other
    # top-level modules only. Catches a held-out module (csv, queue, shlex, textwrap) copied in,
    # a module trained twice, a held-out module's code leaking in under another name.
    more = gemma3_corpus.corpus_files(gemma3_corpus.MORE_CODE)
    first = gemma3_corpus.corpus_files()
    assert len(more) == 131 and not set(more) & set(first)
    assert all(n.startswith("Lib/") and "/" not in n[4:] for n in more)
    text = "".join(more.values())
    pairs = []  # two consecutive held-out lines: a few single lines are common idioms
    for n in gemma3_corpus.demo_corpus.HELD_OUT_FILES:
        lines = [ln for ln in first[n].splitlines() if len(ln.strip()) > 20]
        pairs += [a + "\n" + b for a, b in zip(lines, lines[1:])]
    assert len(pairs) > 400 and not [p for p in pairs if p in text]
    assert gemma3_corpus.training_parts()[1] == more
