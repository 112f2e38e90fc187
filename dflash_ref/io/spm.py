"""SentencePiece pieces by llama.cpp's rule, for the GGUF "llama" tokenizer (docs/tokenizer.md).

:func:`spm_pieces` cuts a normalized text into pieces the way llama.cpp's
``llm_tokenizer_spm_session`` does; :class:`SpmPreTokenizer` wraps it as a ``tokenizers`` custom
pre-tokenizer (:mod:`dflash_ref.io.tokenizer` puts it in front of a BPE model that only looks
pieces up).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping


def spm_pieces(text: str, score: Mapping[str, float]) -> list[str]:
    """``text`` cut into SentencePiece pieces by llama.cpp's rule (``src/llama-vocab.cpp``,
    ``llm_tokenizer_spm_session::tokenize``).

    Start from single characters; repeatedly merge the adjacent pair whose concatenation is in
    ``score`` with the **highest score, the leftmost such pair on a tie**; stop when no adjacent
    pair concatenates to a vocabulary entry. Like llama.cpp this keeps a priority queue of
    bigrams ordered by (score descending, left position ascending) and skips entries made stale
    by an earlier merge. Every piece is a vocabulary entry or a single character (which the
    caller spells as ``<0xNN>`` byte tokens when it is not one).

    A BPE merge list cannot express this: BPE orders merges by rank, and two different merged
    tokens of equal score get two different ranks, so the tie is broken by rank, not position
    (docs/conventions.md, "SPM tie order").
    """
    chars = list(text)
    piece = chars[:]  # piece[i]: the text of the symbol starting at character i ("" once absorbed)
    right_of = list(range(1, len(chars) + 1))  # next live symbol (len(chars): none)
    left_of = list(range(-1, len(chars) - 1))
    queue: list[tuple[float, int, int, int]] = []  # (-score, left, right, merged length)

    def push(left: int, right: int) -> None:
        if left < 0 or right >= len(chars):
            return
        merged = piece[left] + piece[right]
        if merged in score:
            heapq.heappush(queue, (-score[merged], left, right, len(merged)))

    for i in range(len(chars) - 1):
        push(i, i + 1)
    while queue:
        _, left, right, size = heapq.heappop(queue)
        if not piece[left] or not piece[right] or len(piece[left]) + len(piece[right]) != size:
            continue  # stale: one side was merged away since this bigram was queued
        piece[left] += piece[right]
        piece[right] = ""
        right_of[left] = right_of[right]
        if right_of[left] < len(chars):
            left_of[right_of[left]] = left
        push(left_of[left], left)
        push(left, right_of[left])
    return [p for p in piece if p]


class SpmPreTokenizer:
    """A ``tokenizers`` custom pre-tokenizer cutting each normalized fragment into the pieces
    :func:`spm_pieces` gives; the BPE model behind it (``ignore_merges=True``, no merges) then
    maps a vocabulary piece to its id and a character outside the vocabulary to byte tokens."""

    def __init__(self, score: Mapping[str, float]):
        self.score = score

    def _split(self, _index, normalized):
        out, start = [], 0
        for p in spm_pieces(str(normalized), self.score):
            out.append(normalized[start:start + len(p)])
            start += len(p)
        return out

    def pre_tokenize(self, pretok) -> None:
        pretok.split(self._split)
