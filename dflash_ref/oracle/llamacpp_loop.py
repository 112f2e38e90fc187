"""dflash-ref's models driven the way llama.cpp's ``llama-speculative-simple`` drives its own.

llama.cpp's DFlash loop (examples/speculative-simple, ``--spec-type draft-dflash``) prefills the
prompt *without* its last token and drafts its first block from that token; dflash-ref's
``generate`` prefills the whole prompt and drafts from the first generated token, so its steps
sit one token later and its accepted counts per step are not llama.cpp's. :func:`llamacpp_loop`
runs our target and drafter in llama.cpp's order, greedy, each step recomputed from scratch (a
target forward over the sequence so far for the features, the drafter's block, a target forward
over the sequence plus the drafts), so that llama.cpp's per-step ``accepted A/D draft tokens``
(its ``-v`` lines) can be compared with ours one for one (docs/interop.md, "DFlash agrees").
"""

from __future__ import annotations

import re

import numpy as np


def llamacpp_loop(target, drafter, ids, n_new: int, n_draft: int = 7):
    """(generated tokens, accepted drafts per step) of greedy DFlash in llama.cpp's order: the
    anchor ``seq[-1]`` sits at position n = len(seq) - 1, the context features are those of
    ``seq[:-1]``, the block drafts ``n_draft`` tokens, the target's rows n..n+n_draft decide
    them, and the step commits the accepted drafts and the first disagreeing prediction."""
    seq, steps = [int(t) for t in ids], []
    while len(seq) - len(ids) < n_new:
        n = len(seq) - 1
        feats = np.asarray(target.forward(np.asarray(seq[:-1]), target.new_state()).features)
        logits, hidden = drafter.forward_block(feats, np.arange(n), seq[-1], n,
                                               n_rows=n_draft + 1, with_hidden=True)
        draft = [int(t) for t in drafter.propose(hidden, logits, seq[-1]).tokens[:n_draft]]
        out = target.forward(np.asarray(seq + draft), target.new_state())
        preds = np.argmax(np.asarray(out.logits)[n:n + n_draft + 1], axis=1)  # [n_draft + 1]
        a = 0
        while a < len(draft) and draft[a] == int(preds[a]):
            a += 1
        steps.append(a)
        seq += draft[:a] + [int(preds[a])]
    return seq[len(ids):], steps


def greedy_gaps(target, ids, tokens) -> np.ndarray:
    """The target's top-1 minus top-2 logit at each position that chose one of ``tokens`` (its
    greedy continuation of ``ids``), from one forward: [len(tokens)]. A small gap is a near tie,
    where two stacks' float results may choose differently (docs/interop.md, "Near-ties")."""
    seq = np.asarray([*ids, *tokens[:-1]], dtype=np.int64)
    logits = np.asarray(target.forward(seq, target.new_state()).logits, np.float64)
    rows = logits[len(ids) - 1:]  # [len(tokens), V]: row i chose tokens[i]
    top2 = np.sort(np.partition(rows, -2, axis=1)[:, -2:], axis=1)
    return top2[:, 1] - top2[:, 0]


def spec_steps(stderr: str) -> list[tuple[int, int]]:
    """[(accepted, drafted)] per verify step from llama.cpp's ``-v`` lines ``accepted A/D draft
    tokens`` (examples/speculative-simple)."""
    return [(int(a), int(d)) for a, d in
            re.findall(r"accepted (\d+)/(\d+) draft tokens", stderr)]


def full_block_steps(steps, n_draft: int = 7) -> list[int]:
    """Accepted drafts of llama.cpp's steps ``[(accepted, drafted)]`` before its first shorter
    draft: near the end it drafts at most ``n_predict - n_done - 1`` tokens, and the positions of
    the steps after that shift."""
    out = []
    for a, d in steps:
        if d != n_draft:
            break
        out.append(a)
    return out
