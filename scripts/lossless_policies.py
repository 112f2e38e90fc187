"""What each sampled verify policy costs on the shipped demo pair, and whether it is lossless
(docs/lossless.md, "Every policy: lossless or not, and its tau").

For T in TEMPERATURES and each policy of POLICIES: 6 held-out prompts x 32 tokens (as
scripts/acceptance_by_rule.py), seed = the prompt's index; tau = mean tokens a spec step emits,
rows = the target's verify rows per step. Whether a policy is lossless is not measured here: the
certificate decides it (tests/testing/test_policies_certified.py, which asserts the same
``lossless`` flag as POLICIES below). Writes docs/data/lossless_policies.json (the artifact the
doc's table is checked against by tests/testing/test_lossless_policies_doc.py) and prints the
table.

    python scripts/lossless_policies.py            # measure, write the artifact, print
    python scripts/lossless_policies.py --check    # measure and compare with the artifact
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing
import sys
from pathlib import Path

import numpy as np

import dflash_ref
from dflash_ref.models.drafter import DFlashDrafter
from dflash_ref.models.target import TargetModel
from dflash_ref.ops.sampling import SamplingParams
from dflash_ref.spec_decode.ddtree import DDTreeOptions
from dflash_ref.spec_decode.extra_verifiers import SampledTreeVerifier
from dflash_ref.spec_decode.loop import generate
from dflash_ref.spec_decode.sampled_policies import (
    DDTreeSampleMatchVerifier,
    OneHotRejectionChainVerifier,
    TopKRatioTreeVerifier,
)
from dflash_ref.spec_decode.verifiers import RejectionChainVerifier

ROOT = Path(__file__).resolve().parents[1]
DEMO = Path(dflash_ref.__file__).parent / "data" / "demo"
ARTIFACT = ROOT / "docs" / "data" / "lossless_policies.json"
TEMPERATURES = (0.6, 1.0)
N_PROMPTS, NEW_TOKENS = 6, 32
TREE = DDTreeOptions(budget=14)  # 15 verify rows, as the sampled tree of widths (2,)
POLICIES = {  # name: (verifier or None when the demo pair cannot run it, lossless)
    "chain, argmax drafts, one-hot q": (OneHotRejectionChainVerifier(), True),
    "chain, v1 independent per-position sampling": (RejectionChainVerifier(), True),
    "chain, DFlash 2 sparse q": (None, True),  # no DFlash 2 demo pair
    "DDTree (budget 14), sample-and-match": (DDTreeSampleMatchVerifier(TREE), True),
    "sampled tree, widths (2,), drawn children": (SampledTreeVerifier(widths=(2,)), True),
    "DDTree (budget 14), min(1, p/q) over top-k children": (TopKRatioTreeVerifier(TREE), False),
}


def held_out_prompts(n: int):
    spec = importlib.util.spec_from_file_location(
        "demo_corpus", Path(__file__).resolve().parent / "demo_corpus.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.held_out_prompts(n)


def measure_cell(cell: tuple[str, float]) -> dict:
    """One policy at one temperature: {policy, lossless, T, tau, verify_rows, steps}."""
    name, T = cell
    verifier, lossless = POLICIES[name]
    row = {"policy": name, "lossless": lossless, "T": T, "tau": None, "verify_rows": None,
           "steps": 0}
    if verifier is None:
        return row
    target = TargetModel.from_pretrained(DEMO / "target")
    drafter = DFlashDrafter.from_pretrained(DEMO / "drafter", target)
    lengths, widths = [], []
    for i, prompt in enumerate(held_out_prompts(16)[:N_PROMPTS]):
        r = generate(target, drafter, np.asarray(prompt), NEW_TOKENS, verify=verifier,
                     sampling=SamplingParams(T, seed=i))
        lengths += r.acceptance_lengths
        widths += [d + 1 for d in r.drafted]
    row.update(tau=round(float(np.mean(lengths)), 4),
               verify_rows=round(float(np.mean(widths)), 4), steps=len(lengths))
    return row


def measure(processes: int = 2) -> dict:
    """{"settings": ..., "rows": [one :func:`measure_cell` per policy and temperature]}."""
    cells = [(name, T) for name in POLICIES for T in TEMPERATURES]
    with multiprocessing.Pool(processes) as pool:
        rows = pool.map(measure_cell, cells, chunksize=1)
    settings = {"pair": "dflash_ref/data/demo", "prompts": N_PROMPTS, "new_tokens": NEW_TOKENS,
                "seed": "the prompt's index", "temperatures": list(TEMPERATURES)}
    return {"settings": settings, "rows": rows}


def table(data: dict) -> str:
    """The markdown table docs/lossless.md quotes."""
    temps = data["settings"]["temperatures"]
    lines = ["| policy | lossless | verify rows | "
             + " | ".join(f"tau at T = {T}" for T in temps) + " |",
             "|---|---|---|" + "---|" * len(temps)]
    by = {(r["policy"], r["T"]): r for r in data["rows"]}
    for name in dict.fromkeys(r["policy"] for r in data["rows"]):
        first = by[(name, temps[0])]
        rows = "-" if first["verify_rows"] is None else f"{first['verify_rows']:.1f}"
        taus = " | ".join("-" if by[(name, T)]["tau"] is None else f"{by[(name, T)]['tau']:.2f}"
                          for T in temps)
        lines.append(f"| {name} | {'yes' if first['lossless'] else 'NO'} | {rows} | {taus} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed artifact")
    args = ap.parse_args()
    data = measure()
    print(table(data))
    if args.check:
        same = data == json.loads(ARTIFACT.read_text())
        print("artifact " + ("matches" if same else "DIFFERS"))
        return 0 if same else 1
    ARTIFACT.parent.mkdir(exist_ok=True)
    tmp = ARTIFACT.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(ARTIFACT)
    print(f"wrote {ARTIFACT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
