"""The import rules of docs/architecture.md ("Imports"), as data and one AST walk.

tests/test_layout.py asserts them; scripts/architecture_numbers.py counts them.

**The layer order.** Each part of ``dflash_ref`` (a subpackage, or a top-level module) has a rank;
a module imports only parts of a lower rank, or its own part::

    errors, testing -> config -> ops -> backend -> io -> models -> kvflash | spec_decode
      -> tiny -> cli_args -> oracle -> demo_text -> diagnose -> cli_generate -> cli

``kvflash`` and ``spec_decode`` share a rank and never import each other, nor ``models`` (the
loop and the pager receive the objects they work on). ``dflash_ref/__init__.py`` is the
package's front door and may import anything. Function-level imports count.

**Beside the order.** ``minimal`` (``dflash_ref/minimal.py``, DFlash in one page: the independent
oracle the package is tested against) ranks just above ``io`` but imports only the loaders it
names in ``BESIDE``, and no part imports it. Its functions carry the package's names on purpose
(``rms_norm``, ``rope``, ``generate``, ...): the one-definition rule below is for the parts in the
order.

**Private names** (``_x``) are never imported from another part. **A public name** (a top-level
function or class without a leading underscore) is defined in one module only.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "testing"), ("config",), ("ops",), ("backend",), ("io",), ("models",),
    ("kvflash", "spec_decode"), ("tiny",), ("cli_args",), ("oracle",), ("demo_text",),
    ("diagnose",), ("cli_generate",), ("cli",),
)
# part -> (the part it ranks just above, the only dflash_ref modules it may import)
BESIDE = {"minimal": ("io", ("dflash_ref.io.safetensors_io", "dflash_ref.io.tokenizer"))}
RANK = {part: r for r, parts in enumerate(LAYERS) for part in parts}
RANK.update({part: RANK[below] + 0.5 for part, (below, _) in BESIDE.items()})
NEVER = {("kvflash", "models"), ("spec_decode", "models")}  # besides the order


@dataclass
class LayoutReport:
    order_violations: list[str]
    private_imports: list[str]
    duplicate_names: dict[str, list[str]]
    unranked: list[str]


def modules(pkg: str = "dflash_ref") -> dict[str, Path]:
    """Dotted module name -> file for every .py under ``pkg`` (a package's __init__ is itself)."""
    out = {}
    for path in sorted((ROOT / pkg).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def part(module: str) -> str | None:
    """``dflash_ref.models.state`` -> ``models``; the package itself -> None."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else None


def imported_module(name: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` statement of module ``name`` reads from."""
    base = node.module or ""
    if node.level:  # relative import
        anchor = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join(anchor + ([base] if base else []))
    return base


def _imports(tree: ast.Module, name: str, path: Path):
    """(imported module, imported names) for every import statement, anywhere in the file."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, []
        elif isinstance(node, ast.ImportFrom):
            yield imported_module(name, path, node), [a.name for a in node.names]


def _allowed(src: str, dst: str) -> bool:
    if src in BESIDE or dst in BESIDE:  # a part beside the order: its imports are checked alone
        return src == dst or src in BESIDE
    return src == dst or ((src, dst) not in NEVER and RANK[dst] < RANK[src])


def _beside_allows(src: str, target: str) -> bool:
    """A part beside the order imports of dflash_ref (the front door included) only its list."""
    inside = target == "dflash_ref" or target.startswith("dflash_ref.")
    return src not in BESIDE or not inside or target in BESIDE[src][1]


def layout_report() -> LayoutReport:
    order, private, unranked = [], [], []
    defined = defaultdict(list)
    for name, path in modules().items():
        tree = ast.parse(path.read_text())
        for node in tree.body if part(name) not in BESIDE else ():
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                defined[node.name].append(name)
        src = part(name)
        if src is None:  # the package's front door
            continue
        if src not in RANK:
            unranked.append(name)
            continue
        for target, names in _imports(tree, name, path):
            if not _beside_allows(src, target):
                order.append(f"{name} imports {target}")
            dst = part(target) if target.startswith("dflash_ref.") else None
            if dst is None or dst not in RANK:
                continue
            if not _allowed(src, dst):
                order.append(f"{name} imports {target}")
            if dst != src:
                private += [f"{name} imports {target}.{n}" for n in names
                            if n.startswith("_") and not n.startswith("__")]
    duplicates = {n: mods for n, mods in defined.items() if len(mods) > 1}
    return LayoutReport(order, private, duplicates, unranked)
