"""Measure the numbers docs/architecture.md quotes about the code's shape ("The numbers").

Run from the repository root: ``python scripts/architecture_numbers.py`` (``--json`` for the raw
numbers). Every number is measured on the tree as it stands, so the script can be run on any
commit that has ``dflash_ref/`` (tests/test_architecture_numbers.py checks the page against it):

- **functions a path runs**: the distinct project functions (``dflash_ref/`` and
  ``kernels_cupy/``, by file and first line; comprehensions are not counted, since Python 3.12
  inlines them) called during one ``generate()`` on a tiny random Qwen3 target
  (``dflash_ref.tiny``), 8 new tokens after a 3-token prompt, measured after one warm-up run:
  plain greedy (no drafter) and the speculative chain (a tiny drafter, block 4);
- **the decoder layer**: lines, branches (``if`` statements and expressions, ``isinstance``,
  ``type(...) is``) and parameters of the forward of the decoder layer a target runs (found from
  a tiny Qwen3 target's layers), and how often Gemma 4 is named in its module; the ``if`` s
  (statements and expressions) of the drafter's decoder layer;
- **generate()**: its parameter count;
- **module sizes**: modules at 400+ lines, the longest, ``models/state.py``;
- **imports**: private names imported across packages, public names defined in two modules, and
  imports against the documented layer order (the rules of tests/test_layout.py);
- **a family and a verify rule**: the product files (``dflash_ref/``) whose code (names and
  strings, not comments or docstrings) names the last target family added (Gemma 4) and the last
  verify rule added (rejection sampling with the residual); and, from git history, the product
  files the commits that added them changed (``HISTORY``; "n/a" without the history).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.layout_rules import layout_report  # noqa: E402

FAMILY = re.compile(r"gemma ?4", re.I)
VERIFY_RULE = re.compile(r"rejection", re.I)
HISTORY = {  # the commit that added each, as merged into main
    "gemma4_commit_files": "3925bae",  # Gemma 4 text (dense, PLE + KV sharing, MoE), Qwen3.5 MoE
    "rejection_rule_commit_files": "93b1655",  # sampled drafts, rejection with the residual
}


def calls(fn) -> dict[tuple[str, int], str]:
    """The distinct project functions ``fn()`` calls: (file, first line) -> qualified name."""
    seen = {}
    roots = (str(ROOT / "dflash_ref"), str(ROOT / "kernels_cupy"))

    def profile(frame, event, arg):
        if event == "call":
            code = frame.f_code
            if code.co_filename.startswith(roots) and not code.co_name.startswith(
                    ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>")):
                seen[code.co_filename, code.co_firstlineno] = code.co_qualname

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


def _count_calls(fn) -> tuple[int, int]:
    """(distinct project functions, distinct files) that ``fn()`` calls."""
    seen = calls(fn)
    return len(seen), len({f for f, _ in seen})


def path_numbers(listing: str | None = None) -> dict:
    """Functions and files of the plain greedy path and the speculative chain path (``listing``
    "plain" or "spec": print that path's functions by file instead)."""
    import dflash_ref
    from dflash_ref.tiny import write_tiny_drafter, write_tiny_target

    assert Path(dflash_ref.__file__).resolve().is_relative_to(ROOT), dflash_ref.__file__
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        write_tiny_target(tmp / "t", "qwen3")
        write_tiny_drafter(tmp / "d", tmp / "t", block_size=4)
        target = dflash_ref.TargetModel.from_pretrained(tmp / "t")
        drafter = dflash_ref.DFlashDrafter.from_pretrained(tmp / "d", target)
        plain = lambda: dflash_ref.generate(target, None, [1, 5, 9], 8)  # noqa: E731
        spec = lambda: dflash_ref.generate(target, drafter, [1, 5, 9], 8)  # noqa: E731
        plain(), spec()  # warm-up: first-call caches are not the path
        if listing:
            _print_listing(calls(plain if listing == "plain" else spec))
            return {}
        return {"plain_greedy": _count_calls(plain), "spec_chain": _count_calls(spec)}


def _print_listing(seen: dict) -> None:
    by_file: dict[str, list[str]] = {}
    for (file, _), name in sorted(seen.items()):
        by_file.setdefault(str(Path(file).relative_to(ROOT)), []).append(name)
    for file, names in by_file.items():
        print(f"{file} ({len(names)}): {', '.join(names)}")
    print(f"{len(seen)} functions in {len(by_file)} files")


def _method(path: str, cls_name: str, names: tuple[str, ...]) -> ast.FunctionDef:
    tree = ast.parse((ROOT / path).read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name)
    return next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name in names)


def _ifs(fn: ast.FunctionDef) -> int:
    return sum(isinstance(n, (ast.If, ast.IfExp)) for b in fn.body for n in ast.walk(b))


def _branches(fn: ast.FunctionDef) -> int:
    """``if`` statements and expressions, ``isinstance(...)`` calls and ``type(...) is`` tests
    in ``fn``'s body: every way its code can branch on a value or a kind."""
    def branches(n) -> bool:
        if isinstance(n, (ast.If, ast.IfExp)):
            return True
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name):
            return n.func.id == "isinstance"
        return (isinstance(n, ast.Compare) and any(isinstance(o, (ast.Is, ast.IsNot))
                                                     for o in n.ops)
                and any(isinstance(x, ast.Call) and isinstance(x.func, ast.Name)
                        and x.func.id == "type" for x in (n.left, *n.comparators)))
    return sum(branches(n) for b in fn.body for n in ast.walk(b))


def _running_layer() -> tuple[str, ast.FunctionDef]:
    """The forward of the decoder layer a target runs (its file and definition): the
    ``__call__`` of the class of a tiny Qwen3 target's layers, found from the object, not by
    name."""

    from dflash_ref.config import TargetConfig, expected_tensors
    from dflash_ref.models.target import TargetModel
    from dflash_ref.tiny import tiny_target_config, tiny_weights

    cfg = TargetConfig.from_hf(tiny_target_config("qwen3"))
    target = TargetModel(cfg, tiny_weights(expected_tensors(cfg), 0, cfg.norm_offset))
    kinds = {type(layer) for layer in target.layers}
    assert len(kinds) == 1, kinds
    code = kinds.pop().__call__.__code__
    path = Path(code.co_filename).resolve()
    assert path.is_relative_to(ROOT), path
    fn = next(n for n in ast.walk(ast.parse(path.read_text()))
              if isinstance(n, ast.FunctionDef) and code.co_firstlineno in (
                  n.lineno, *(d.lineno for d in n.decorator_list)))
    return str(path.relative_to(ROOT)), fn


def layer_numbers() -> dict:
    """The decoder layer that runs (:func:`_running_layer`): the lines of its forward's body
    (docstring aside), its branches (:func:`_branches`) and parameters; how often its module
    names Gemma 4; the ``if`` s of the drafter's decoder layer."""
    path, fn = _running_layer()
    body = fn.body[1:] if ast.get_docstring(fn) else fn.body
    lines = sum(1 for n in body for _ in range(n.lineno, n.end_lineno + 1))
    params = len(fn.args.args) - 1 + len(fn.args.kwonlyargs)
    drafter = _method("dflash_ref/models/drafter.py", "DFlashDrafter", ("decoder_layer",))
    text = (ROOT / path).read_text()
    return {"decoder_layer_lines": lines, "decoder_layer_ifs": _branches(fn),
            "decoder_layer_params": params, "gemma4_named_in_layers": len(FAMILY.findall(text)),
            "drafter_layer_ifs": _ifs(drafter)}


def generate_params() -> int:
    import inspect

    from dflash_ref import generate
    return len(inspect.signature(generate).parameters)


def module_numbers() -> dict:
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines())
             for p in sorted((ROOT / "dflash_ref").rglob("*.py"))}
    longest = max(sizes, key=sizes.get)
    return {"modules_400_plus": sum(n >= 400 for n in sizes.values()),
            "longest_module": f"{longest} ({sizes[longest]})",
            "state_py_lines": sizes.get("dflash_ref/models/state.py", 0)}


def _code_words(tree: ast.Module):
    """Identifiers and string constants of a module, docstrings excluded."""
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr)
                  and isinstance(n.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            yield node.id
        elif isinstance(node, ast.Attribute):
            yield node.attr
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            yield node.name
        elif isinstance(node, ast.alias):
            yield node.name
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in docstrings):
            yield node.value


def naming_files(pattern: re.Pattern) -> list[str]:
    """The product files whose code (not comments or docstrings) matches ``pattern``."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "dflash_ref").rglob("*.py")
                  if any(pattern.search(w) for w in _code_words(ast.parse(p.read_text()))))


def commit_files(commit: str) -> int | str:
    """How many product files (``dflash_ref/``) ``commit`` changed ("n/a" without history)."""
    out = subprocess.run(["git", "show", "--name-only", "--format=", commit, "--", "dflash_ref"],
                         cwd=ROOT, capture_output=True, text=True)
    return len(out.stdout.split()) if out.returncode == 0 else "n/a"


def measure() -> dict:
    report = layout_report()
    return {
        **path_numbers(), **layer_numbers(), "generate_params": generate_params(),
        **module_numbers(),
        "private_imports_across_packages": len(report.private_imports),
        "public_names_defined_twice": len(report.duplicate_names),
        "layer_order_violations": len(report.order_violations),
        "files_naming_last_family": naming_files(FAMILY),
        "files_naming_last_verify_rule": naming_files(VERIFY_RULE),
        **{key: commit_files(commit) for key, commit in HISTORY.items()},
    }


def cell(value) -> str:
    """A number as the page's table writes it."""
    if isinstance(value, tuple):
        return f"{value[0]} in {value[1]} files"
    if isinstance(value, list):
        return str(len(value))
    return str(value)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the raw numbers as JSON")
    parser.add_argument("--list", choices=("plain", "spec"),
                        help="list the functions the plain greedy or speculative chain path runs")
    args = parser.parse_args(argv)
    if args.list:
        path_numbers(args.list)
        return
    numbers = measure()
    if args.json:
        print(json.dumps(numbers, indent=2))
        return
    for key, value in numbers.items():
        named = (": " + ", ".join(v.removeprefix("dflash_ref/") for v in value)
                 if isinstance(value, list) else "")
        print(f"{key:34s} {cell(value)}{named}")


if __name__ == "__main__":
    main()
