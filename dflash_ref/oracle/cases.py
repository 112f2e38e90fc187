"""The golden cases committed under tests/golden/: how each is built, so that the suite can
re-export it and compare (tests/oracle/test_golden_cases.py) and scripts/make_golden_cases.py can
rewrite it after an intended change of the reference's outputs.

Models: the shipped demo pair (``dflash_ref/data/demo``: a drafter the target accepts, so steps
accept drafts) for the Qwen3 cases, and the seeded tiny builders of :mod:`dflash_ref.tiny` for the
hybrid and Gemma-style cases (random drafters: the target accepts little, but every path runs).
"""

from __future__ import annotations

from pathlib import Path

DEMO_PROMPT = [3, 17, 42, 99, 5, 128, 77, 64]
LONG_PROMPT = [3, 17, 42, 99, 5, 128, 77, 64, 9, 200, 31, 150]  # longer than the Gemma window 8

GOLDEN_CASES: dict[str, dict] = {
    "qwen3_chain": dict(models="demo", prompt=DEMO_PROMPT, max_new_tokens=12, block_size=4,
                        detail_steps=[1]),
    "qwen3_sampled": dict(models="demo", prompt=DEMO_PROMPT, max_new_tokens=10, block_size=4,
                          temperature=0.8, seed=7),
    "qwen3_ddtree": dict(models="demo", prompt=DEMO_PROMPT, max_new_tokens=8, block_size=4,
                         verify="tree"),
    "qwen3_pooled_gated": dict(models="demo", prompt=DEMO_PROMPT, max_new_tokens=16,
                               block_size=4, pager="pool=16,chunk=4,sink=1,tail=1",
                               gate="entropy,tie_p1=0.0,ar_p1=0.5,sustain=3"),
    "qwen3_5_hybrid": dict(models="tiny:qwen3_5", prompt=LONG_PROMPT[:10], max_new_tokens=6,
                           block_size=4),
    "gemma3_swa": dict(models="tiny:gemma3", prompt=LONG_PROMPT, max_new_tokens=6,
                       block_size=4, detail_steps=[0]),
}


def case_models(models: str, work: Path) -> tuple[Path, Path]:
    """(target dir, drafter dir) of a case's ``models``; tiny ones are written in ``work``."""
    if models == "demo":
        import dflash_ref

        root = Path(dflash_ref.__file__).parent / "data" / "demo"
        return root / "target", root / "drafter"
    from dflash_ref.tiny import write_tiny_drafter, write_tiny_target

    family = models.split(":", 1)[1]
    target = write_tiny_target(Path(work) / "target", family, seed=0)
    return target, write_tiny_drafter(Path(work) / "drafter", target, seed=1, block_size=4)


def export_golden_case(name: str, out, work) -> dict:
    """Export golden case ``name`` into ``out`` (tiny models built in ``work``); the manifest."""
    from dflash_ref.oracle.export import export_case

    spec = dict(GOLDEN_CASES[name])
    models = spec.pop("models")
    target, drafter = case_models(models, Path(work))
    prompt = spec.pop("prompt")
    return export_case(out, target, drafter, prompt, gguf=False, overwrite=True,
                       note=f"golden case {name!r} (dflash_ref/oracle/cases.py): models "
                            f"{models!r}", **spec)
