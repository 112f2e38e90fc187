"""Write the demo checkpoints shipped in ``dflash_ref/data/demo`` and report how well they draft.

    python scripts/make_demo_checkpoints.py          # (re)writes dflash_ref/data/demo/*
    python scripts/make_demo_checkpoints.py OUT_DIR  # writes OUT_DIR/{target,drafter} instead

The checkpoints come from :func:`demo_fit.write_demo_checkpoints` (scripts/demo_fit.py, next to
this file), which is deterministic; docs/demo.md explains the construction. After writing, the
script runs plain and speculative greedy decoding on held-out prompts and prints tau and the
acceptance rate.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
from demo_fit import random_prompts, write_demo_checkpoints  # scripts/demo_fit.py

from dflash_ref.models.drafter import DFlashDrafter
from dflash_ref.models.target import TargetModel
from dflash_ref.spec_decode.loop import generate

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "dflash_ref" / "data" / "demo"
HELD_OUT_SEED = 2024  # prompts for the report; the fit draws its own with DEMO_FIT_SEED


def report(target_dir: Path, drafter_dir: Path, n_prompts: int = 16, length: int = 64) -> None:
    """Plain vs speculative greedy decoding on held-out prompts: tau and acceptance rate."""
    target = TargetModel.from_pretrained(target_dir)
    drafter = DFlashDrafter.from_pretrained(drafter_dir, target)
    prompts = random_prompts(n_prompts, target.config.vocab_size, HELD_OUT_SEED,
                             avoid_token=drafter.config.mask_token_id)
    taus, rates, same = [], [], True
    for prompt in prompts:
        spec = generate(target, drafter, prompt, length)
        same &= spec.tokens == generate(target, None, prompt, length).tokens
        taus.append(spec.tau)
        rates.append(spec.acceptance_rate)
    print(f"held-out: {n_prompts} prompts x {length} tokens, block {drafter.block_size}: "
          f"tau {np.mean(taus):.2f} (min {np.min(taus):.2f}), acceptance rate "
          f"{np.mean(rates):.1%}, speculative == plain: {same}")


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else DEFAULT_OUT
    t0 = time.perf_counter()
    target_dir, drafter_dir = write_demo_checkpoints(out)
    print(f"wrote {target_dir} and {drafter_dir} in {time.perf_counter() - t0:.1f} s")
    for d in (target_dir, drafter_dir):
        print(f"  {d.name}: " + ", ".join(f"{p.name} {p.stat().st_size / 1024:.0f} KiB"
                                         for p in sorted(d.iterdir())))
    report(target_dir, drafter_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
