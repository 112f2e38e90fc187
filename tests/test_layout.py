"""The repository's shape: the rules a newcomer relies on (docs/architecture.md).

- no module in ``dflash_ref/`` or ``kernels_cupy/`` is longer than a reader can hold (450 lines);
- no import cycle inside ``dflash_ref`` (function-level imports count: a cycle hidden in a
  function still ties two modules into one);
- every citation resolves inside the repository: nothing cites the project's private notes
  (``spec/*.md`` files or their bare section marks), which a reader who clones it cannot open;
- the public entry points import from the top;
- the documented layer order holds (which part may import which), no private name is imported
  from another part, and each public name is defined once (tests/layout_rules.py);
- the one page, ``dflash_ref/minimal.py``, imports only the checkpoint loaders, and nothing
  imports it.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.layout_rules import LAYERS, NEVER, RANK, layout_report, modules, part

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 450


@pytest.mark.parametrize("pkg", ["dflash_ref", "kernels_cupy"])
def test_no_module_is_longer_than_a_reader_can_hold(pkg):
    long = {name: n for name, path in modules(pkg).items()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them along their seams): {long}"


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The dflash_ref modules ``name`` imports, anywhere in the file (resolved to known names)."""
    is_pkg = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                anchor = name.split(".") if is_pkg else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for t in targets:
            while t and t not in known:  # `from a.b import c`: module a.b.c if it exists, else a.b
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state, stack = {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (c := visit(m)):
                return c
        state[n] = 2
        stack.pop()
        return None

    for n in sorted(graph):
        if n not in state and (c := visit(n)):
            return c
    return None


def test_cycle_finder_finds_a_planted_cycle():
    # Hand-made graph: a -> b -> c -> a is a cycle; d -> a is not part of it.
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_in_dflash_ref():
    mods = modules("dflash_ref")
    known = set(mods)
    # A package imports nothing but its own modules' names by being a parent: edges from a
    # module to its enclosing packages' __init__ are how Python imports work, not a design
    # choice, so only explicit import statements count.
    graph = {name: _imports(path, name, known) for name, path in mods.items()}
    cycle = _find_cycle(graph)
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


CITATION = re.compile(r"spec/(dflash|gdn|kvflash_gate)\.md|§|\.\./shared|shared/(spec|seeds)/")


def _tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", *patterns], cwd=ROOT, capture_output=True,
                         text=True)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    return [ROOT / p for p in out.stdout.split()]


def test_every_citation_resolves_inside_the_repository():
    files = _tracked("*.py", "*.md", "*.ipynb", "*.cu", "*.cuh", "*.toml")
    bad = [f"{p.relative_to(ROOT)}:{i}: {line.strip()[:90]}"
           for p in files if p.name != "test_layout.py"
           for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
           if CITATION.search(line)]
    assert not bad, "citations of files outside the repository:\n" + "\n".join(bad[:40])


def test_public_entry_points_import_from_the_top():
    code = "from dflash_ref import TargetModel, DFlashDrafter, generate; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


TEST_REF = re.compile(r"(tests/[\w/]+\.py)(?:::(\w+))?")


def test_every_test_the_docs_name_exists():
    # docs/conventions.md pins each convention to a test by file::name; a renamed or moved test
    # must not leave the docs pointing at nothing.
    missing = []
    for doc in _tracked("*.md"):
        for path, name in TEST_REF.findall(doc.read_text()):
            file = ROOT / path
            if not file.exists():
                missing.append(f"{doc.relative_to(ROOT)}: {path}")
            elif name and not re.search(rf"^(def|class) {name}\b", file.read_text(), re.M):
                missing.append(f"{doc.relative_to(ROOT)}: {path}::{name}")
    assert not missing, "docs name tests that do not exist:\n" + "\n".join(sorted(set(missing)))


def test_the_layer_order_holds():
    report = layout_report()
    assert not report.unranked, (f"modules in no layer of tests/layout_rules.py (add their part "
                                 f"to LAYERS and to docs/architecture.md): {report.unranked}")
    assert not report.order_violations, (
        "imports against the layer order of docs/architecture.md (a part imports only the "
        "parts before it):\n" + "\n".join(report.order_violations))


def test_no_private_name_is_imported_from_another_part():
    private = layout_report().private_imports
    assert not private, ("private names imported across parts (make the name public where it "
                         "lives, or move the caller):\n" + "\n".join(private))


def test_each_public_name_is_defined_once():
    duplicates = layout_report().duplicate_names
    assert not duplicates, f"public names defined in more than one module: {duplicates}"


def test_the_layer_order_is_the_documented_one():
    # docs/architecture.md states the order in one line; the rules above enforce LAYERS.
    doc = (ROOT / "docs/architecture.md").read_text()
    line = " -> ".join(" | ".join(parts) for parts in LAYERS)
    assert line in doc, f"docs/architecture.md does not state the enforced order: {line}"
    assert all(p in RANK for pair in NEVER for p in pair)


def test_the_rules_catch_planted_violations(tmp_path, monkeypatch):
    # A hand-made package: models importing spec_decode (against the order), spec_decode
    # importing models (forbidden besides the order), a private import across parts and a
    # public name defined twice must each be reported.
    import tests.layout_rules as rules

    pkg = tmp_path / "dflash_ref"
    for sub in ("models", "spec_decode", "ops"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "models" / "a.py").write_text("def f():\n    from dflash_ref.spec_decode import b\n")
    (pkg / "spec_decode" / "b.py").write_text("from dflash_ref.models.a import f\n")
    (pkg / "ops" / "c.py").write_text("def f():\n    pass\n\ndef _g():\n    pass\n")
    (pkg / "models" / "d.py").write_text("from dflash_ref.ops.c import _g\n")
    monkeypatch.setattr(rules, "ROOT", tmp_path)
    report = rules.layout_report()
    assert sorted(report.order_violations) == [
        "dflash_ref.models.a imports dflash_ref.spec_decode",
        "dflash_ref.spec_decode.b imports dflash_ref.models.a"]
    assert report.private_imports == ["dflash_ref.models.d imports dflash_ref.ops.c._g"]
    assert report.duplicate_names == {"f": ["dflash_ref.models.a", "dflash_ref.ops.c"]}
    assert part("dflash_ref.models.a") == "models" and part("dflash_ref") is None


def test_the_one_page_imports_only_the_loaders(tmp_path, monkeypatch):
    # dflash_ref/minimal.py is tested against the package, so it must not run the package's
    # code: of dflash_ref it imports the loaders BESIDE names and nothing else (not even the
    # front door), and no part imports it. Planted in a hand-made package, each is reported.
    import tests.layout_rules as rules

    assert rules.BESIDE["minimal"][0] == "io" and RANK["io"] < RANK["minimal"] < RANK["models"]
    pkg = tmp_path / "dflash_ref"
    for sub in ("io", "models"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "io" / "safetensors_io.py").write_text("def load_checkpoint():\n    pass\n")
    (pkg / "io" / "other.py").write_text("")
    (pkg / "minimal.py").write_text(
        "from dflash_ref.io.safetensors_io import load_checkpoint\n"
        "from dflash_ref.io import other\n"
        "def f():\n    import dflash_ref\n    from dflash_ref.models import x\n")
    (pkg / "models" / "m.py").write_text("from dflash_ref.minimal import f\n")
    monkeypatch.setattr(rules, "ROOT", tmp_path)
    report = rules.layout_report()
    assert sorted(report.order_violations) == [
        "dflash_ref.minimal imports dflash_ref", "dflash_ref.minimal imports dflash_ref.io",
        "dflash_ref.minimal imports dflash_ref.models",
        "dflash_ref.models.m imports dflash_ref.minimal"]
    assert not report.unranked and not report.duplicate_names
