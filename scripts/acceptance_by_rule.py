"""The acceptance each sampled drafting / verify rule gets on the shipped demo pair
(docs/lossless.md, "What each rule costs").

16 held-out prompts x 64 tokens (as tests/test_demo_checkpoints.py), seed = the prompt's index,
for each temperature and rule below; prints tau (mean tokens per target forward of a spec step)
and the verify rows per step. tests/testing/test_acceptance_by_rule.py (marker ``slow``)
re-measures the numbers docs/lossless.md quotes.

    python scripts/acceptance_by_rule.py
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

import dflash_ref
from dflash_ref.models.drafter import DFlashDrafter
from dflash_ref.models.target import TargetModel
from dflash_ref.ops.sampling import SamplingParams
from dflash_ref.spec_decode.extra_verifiers import GreedyDraftChainVerifier, SampledTreeVerifier
from dflash_ref.spec_decode.loop import generate
from dflash_ref.spec_decode.verifiers import RejectionChainVerifier

DEMO = Path(dflash_ref.__file__).parent / "data" / "demo"
TEMPERATURES = (0.3, 0.7, 1.0)
RULES = {
    "argmax drafts (GreedyDraftChainVerifier)": GreedyDraftChainVerifier(),
    "sampled drafts (RejectionChainVerifier)": RejectionChainVerifier(),
    "sampled tree, widths (2,) (SampledTreeVerifier)": SampledTreeVerifier(widths=(2,)),
    "sampled tree, widths (2, 2) (SampledTreeVerifier)": SampledTreeVerifier(widths=(2, 2)),
}
NEW_TOKENS = 64


def held_out_prompts(n: int = 16):
    spec = importlib.util.spec_from_file_location(
        "demo_corpus", Path(__file__).resolve().parent / "demo_corpus.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.held_out_prompts(n)


def measure(rules=RULES, temperatures=TEMPERATURES, n_prompts: int = 16) -> dict:
    """{(rule name, T): (tau, mean verify rows per step)}."""
    target = TargetModel.from_pretrained(DEMO / "target")
    drafter = DFlashDrafter.from_pretrained(DEMO / "drafter", target)
    prompts = held_out_prompts(16)[:n_prompts]
    out = {}
    for name, verifier in rules.items():
        for T in temperatures:
            lengths, rows = [], []
            for i, prompt in enumerate(prompts):
                r = generate(target, drafter, np.asarray(prompt), NEW_TOKENS, verify=verifier,
                             sampling=SamplingParams(T, seed=i))
                lengths += r.acceptance_lengths
                rows += [d + 1 for d in r.drafted]
            out[(name, T)] = (float(np.mean(lengths)), float(np.mean(rows)))
    return out


def main() -> None:
    table = measure()
    print("| rule | verify rows | " + " | ".join(f"tau at T = {T}" for T in TEMPERATURES) + " |")
    print("|---|---|" + "---|" * len(TEMPERATURES))
    for name in RULES:
        rows = table[(name, TEMPERATURES[0])][1]
        taus = " | ".join(f"{table[(name, T)][0]:.2f}" for T in TEMPERATURES)
        print(f"| {name} | {rows:.1f} | {taus} |")


if __name__ == "__main__":
    main()
