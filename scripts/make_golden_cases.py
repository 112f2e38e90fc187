"""Rewrite the golden cases under tests/golden/ (dflash_ref/oracle/cases.py says how each is
built). Run after an intended change of the reference's outputs; the diff of the manifests and
the changed step files is what a reviewer reads.

    python scripts/make_golden_cases.py [NAME ...]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from dflash_ref.oracle.cases import GOLDEN_CASES, export_golden_case

ROOT = Path(__file__).resolve().parents[1] / "tests" / "golden"


def main(names: list[str]) -> int:
    for name in names or list(GOLDEN_CASES):
        with tempfile.TemporaryDirectory() as work:
            m = export_golden_case(name, ROOT / name, work)
        size = sum(p.stat().st_size for p in (ROOT / name).iterdir())
        print(f"{name:20} {len(m['steps']):3} steps {len(m['tensors']):4} tensors "
              f"{size / 1024:7.1f} KiB  tokens {m['result']['tokens']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
