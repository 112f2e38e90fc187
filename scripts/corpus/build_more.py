"""Writes scripts/corpus/cpython_3_11_lib_more.py.txt: the rest of CPython 3.11.7's top-level
``Lib/*.py`` modules, for the Gemma 3 drafter's data (docs/training.md, "The corpus").

    python scripts/corpus/build_more.py /usr/lib/python3.11

Every top-level module in name order, except those already in cpython_3_11_lib.py.txt (the
held-out ones among them), the generated or distribution-specific files (build configuration,
Debian's additions and patches) and the jokes; one ``# ==== Lib/<name> ====`` line before each,
as in the first file. The PSF's text, under scripts/corpus/LICENSE-PSF.txt.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIRST = HERE / "cpython_3_11_lib.py.txt"
OUT = HERE / "cpython_3_11_lib_more.py.txt"
LEFT_OUT = ("_distutils_system_mod.py", "sitecustomize.py", "site.py", "sysconfig.py",  # Debian
            "this.py", "antigravity.py", "__hello__.py", "stringprep.py")  # jokes, tables


def modules(lib: Path) -> list[Path]:
    have = set(re.findall(r"^# ==== Lib/(\S+) ====$", FIRST.read_text(), re.MULTILINE))
    return [p for p in sorted(lib.glob("*.py"))
            if p.name not in have and p.name not in LEFT_OUT
            and not p.name.startswith("_sysconfigdata")]


def main(argv: list[str]) -> int:
    lib = Path(argv[1] if len(argv) > 1 else "/usr/lib/python3.11")
    if sys.version_info[:3] != (3, 11, 7) and lib == Path(sys.prefix) / "lib" / "python3.11":
        print(f"note: this Python is {sys.version.split()[0]}; the pinned file is 3.11.7's")
    parts = [f"# ==== Lib/{p.name} ====\n" + p.read_text() for p in modules(lib)]
    tmp = OUT.with_suffix(".tmp")
    tmp.write_text("".join(parts))
    tmp.replace(OUT)
    print(f"{len(parts)} modules, {OUT.stat().st_size} bytes -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
