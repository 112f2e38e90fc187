"""The README's two set-up commands are exactly what CI runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_setup_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Set up", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line.strip() for line in block.splitlines() if line.strip()]


def test_readme_has_exactly_two_setup_commands_and_ci_runs_them():
    commands = readme_setup_commands()
    assert len(commands) == 2, commands
    assert "dflash-ref" in commands[0] and "pytest" in commands[1]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    for command in commands:
        assert command in ci, f".ci/run does not run the README command {command!r}"


def test_readme_python_examples_run():
    # Examples run as tests, so the README cannot drift from the API.
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert len(blocks) >= 2
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {"__name__": "readme"})
