"""Convert the shipped demo pair to GGUF with the project's converters (docs/training.md):

    PYTHONPATH=$PWD python scripts/convert_demo_pair.py [DEMO_DIR]   # default: dflash_ref/data/demo

writes ``DEMO_DIR/gguf/target.gguf`` (:func:`dflash_ref.io.convert_target.convert_target`,
arch ``qwen3``) and ``DEMO_DIR/gguf/drafter.gguf``
(:func:`dflash_ref.io.convert_drafter.convert_drafter`, llama.cpp naming, arch ``dflash``, with
the target so the pairing is checked). Matrices are stored BF16, the precision of the shipped
safetensors: every weight is already a bf16 value, so the files hold exactly the same numbers
(norms go to F32 as the converters always do, an exact widening). ``scripts/train_demo_pair.py``
runs this as its last step; ``tests/test_demo_checkpoints.py`` checks that the shipped files equal
a fresh conversion and generate the same tokens. NumPy only.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DEMO = ROOT / "dflash_ref" / "data" / "demo"
QTYPE = "bf16"  # the shipped safetensors' dtype: lossless


def convert_demo_pair(demo: Path = DEFAULT_DEMO, out: Path | None = None) -> tuple[Path, Path]:
    """(target.gguf, drafter.gguf) converted from ``demo/{target,drafter}`` into ``out``
    (default ``demo/gguf``)."""
    from dflash_ref.io.convert_drafter import convert_drafter
    from dflash_ref.io.convert_target import convert_target

    demo = Path(demo)
    out = demo / "gguf" if out is None else Path(out)
    out.mkdir(parents=True, exist_ok=True)
    target = convert_target(demo / "target", out / "target.gguf", QTYPE, progress=False)
    drafter = convert_drafter(demo / "drafter", out / "drafter.gguf", QTYPE, "llama.cpp",
                              target=demo / "target", progress=False)
    return target, drafter


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    sys.path.insert(0, str(ROOT))
    for path in convert_demo_pair(Path(args[0]) if args else DEFAULT_DEMO):
        print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
