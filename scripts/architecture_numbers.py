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
  files the commits that added them changed (``HISTORY``; "n/a" without the history);
- **the reading order** (``TIERS``): the lines of each tier and of tiers 1 + 2, and the lines of
  the one page (``dflash_ref/minimal.py``; "absent" where it does not exist);
- **the step's shape**: the product files whose code names the CUDA-graph concept, the attributes
  of the live ``Decoding`` object after a speculative run, the verifier methods that receive the
  run, the lines of ``generate()``'s body;
- **one speculative step on the demo pair** (``dflash_ref/data/demo``, the demo's prompt, traced
  after the prefill and one warm-up step): the project functions it calls and how often
  consecutive calls switch files, and the share of docstring lines in the files it runs.
"""

from __future__ import annotations

import argparse
import ast
import functools
import inspect
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


# ---------------------------------------------------------------- the reading order in tiers

# Each tier: a name and the patterns (regular expressions on the file's path from the
# repository root) of its files, in reading order. A product file (``dflash_ref/**``,
# ``kernels_cupy/**``, ``.py``) belongs to the first tier, 0 to 4, with a pattern that matches
# it, so a new file lands in a tier; tier 4 ends with a pattern that takes every other file.
# ``(.*/)?`` lets a part move into a sub-folder of its package and keep its tier.
SPEC = r"dflash_ref/spec_decode/(.*/)?"
MODELS = r"dflash_ref/models/(.*/)?"
TIERS = (
    ("the one page", (r"dflash_ref/minimal\.py",)),
    ("the real loop", (
        SPEC + r"loop\.py", SPEC + r"decoding\.py", SPEC + r"(cursor|context|drafting)\w*\.py",
        SPEC + r"gating\.py", SPEC + r"verifiers\.py", SPEC + r"verify\.py")),
    ("the real target, state and drafter", (
        MODELS + r"target\.py", MODELS + r"output\.py", MODELS + r"(step_)?runners?\.py",
        MODELS + r"assemble\.py", MODELS + r"layers\.py", MODELS + r"fused\.py",
        MODELS + r"batch_arrays\.py", MODELS + r"kv_store\.py", MODELS + r"state\.py",
        MODELS + r"stores\.py", MODELS + r"cache\.py", MODELS + r"drafter\.py",
        MODELS + r"draft_cache\.py")),
    ("the ops", (
        r"dflash_ref/ops/sampling\.py",  # the sampling law the drafter and the verifiers share
        r"dflash_ref/backend\.py", r"dflash_ref/ops/_dtypes\.py", r"dflash_ref/ops/linear\.py",
        r"dflash_ref/ops/norm\.py", r"dflash_ref/ops/rope\.py", r"dflash_ref/ops/activations\.py",
        r"dflash_ref/ops/masks\.py", r"dflash_ref/ops/attention\.py",
        r"dflash_ref/ops/reductions\.py", r"dflash_ref/ops/pager\.py", r"dflash_ref/ops/.*")),
    ("the extras, each optional", (
        SPEC + r"observe\.py", SPEC + r"arguments\.py",  # watching a run, checking its input
        SPEC + r"(gate|cost)\.py",  # gates
        SPEC + r"extra_verifiers\.py",  # the verify rules off the default path, trees among them
        SPEC + r"(ddtree|tree_sampling)\.py", r"dflash_ref/ops/gdn_tree\.py",  # trees
        r"dflash_ref/kvflash/.*",  # the pager
        MODELS + r"graphs\.py", SPEC + r"warmup\.py",  # CUDA graphs
        MODELS + r"(loading|tree|pooled)\.py",  # the target's loaders, tree verify, pooled pieces
        MODELS + r"(gemma|gemma4|qwen3_5|moe|gdn_\w+)\.py",  # the other families
        MODELS + r"dflash2\w*\.py", MODELS + r"dspark\.py",  # DFlash 2, DSpark
        r"kernels_cupy/.*",  # the GPU twins
        MODELS + r"(pool_store|fixed_stores|tree_verify|drafter_loading)\.py",  # stores, loaders
        r".*")),  # batches, prompt caches, diagnose, oracle, io, config, cli, ...
)


def product_files() -> list[str]:
    """Every product file (``dflash_ref/**``, ``kernels_cupy/**``, ``.py``), from the root."""
    return sorted(str(p.relative_to(ROOT)) for d in ("dflash_ref", "kernels_cupy")
                  for p in (ROOT / d).rglob("*.py"))


def tier_of(path: str) -> tuple[int, int]:
    """(tier, rank of the first pattern in it that matches ``path``)."""
    for tier, (_, patterns) in enumerate(TIERS):
        for rank, pattern in enumerate(patterns):
            if re.fullmatch(pattern, path):
                return tier, rank
    raise AssertionError(f"{path}: in no tier (the last pattern of tier 4 takes every file)")


def tiers() -> list[list[str]]:
    """The files of each tier, in reading order (pattern order, then path)."""
    ranked = sorted((tier_of(f), f) for f in product_files())
    return [[f for (t, _), f in ranked if t == tier] for tier in range(len(TIERS))]


def _lines(path: str) -> int:
    return len((ROOT / path).read_text().splitlines())


def tier_numbers() -> dict:
    """Lines per tier (``wc -l`` of its files), tiers 1 + 2, the one page (or "absent")."""
    lines = [sum(map(_lines, files)) for files in tiers()]
    minimal = "dflash_ref/minimal.py"
    return {"minimal_lines": _lines(minimal) if (ROOT / minimal).exists() else "absent",
            "tier_lines": dict(enumerate(lines)), "tier12_lines": lines[1] + lines[2]}


# ---------------------------------------------------------------- the step's shape

SPEC_DIR = "dflash_ref/spec_decode"
GRAPH = (re.compile(r"(?i)(?:^|_|\b)graphs?(?:$|_|\b)"), re.compile(r"(?<=[a-z])Graphs?"))


def _names_and_strings(tree: ast.Module):
    """``_code_words`` and the names of parameters and keyword arguments."""
    yield from _code_words(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.arg):
            yield node.arg
        elif isinstance(node, ast.keyword) and node.arg:
            yield node.arg


def graph_files() -> list[str]:
    """Product files whose code (identifiers, parameter names, string literals; no comment, no
    docstring) names the graph concept: graph_key, step_graphs, StepGraphs, "--graphs" count,
    "lexicographic" does not."""
    return [f for f in product_files()
            if any(p.search(w) for w in _names_and_strings(ast.parse((ROOT / f).read_text()))
                   for p in GRAPH)]


def _verifier_classes(trees: list[ast.Module]) -> list[ast.ClassDef]:
    """Classes named ``*Verifier`` and their subclasses (by base names, transitively)."""
    classes = [n for t in trees for n in ast.walk(t) if isinstance(n, ast.ClassDef)]
    names = {c.name for c in classes if c.name.endswith("Verifier")}
    grew = True
    while grew:
        more = {c.name for c in classes
                if any(isinstance(b, ast.Name) and b.id in names for b in c.bases)}
        grew, names = not more <= names, names | more
    return [c for c in classes if c.name in names]


def verifiers_receiving_run() -> list[str]:
    """Methods of the verifier classes in ``spec_decode/`` (the interface ``Verifier`` and its
    subclasses) with a parameter named ``run``."""
    trees = [ast.parse(p.read_text()) for p in sorted((ROOT / SPEC_DIR).rglob("*.py"))]
    return [f"{c.name}.{m.name}" for c in _verifier_classes(trees) for m in c.body
            if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
            and "run" in {a.arg for a in m.args.args + m.args.kwonlyargs}]



def generate_body_lines() -> int:
    """Lines of ``generate()``'s body: from the first statement after the docstring to the end
    of the last (found through ``dflash_ref.generate``, wherever it is defined)."""
    from dflash_ref import generate
    fn = inspect.unwrap(generate)
    tree = ast.parse(Path(inspect.getsourcefile(fn)).read_text())
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
                and n.name == fn.__name__ and n.body[-1].end_lineno >= fn.__code__.co_firstlineno
                and min([n.lineno, *(d.lineno for d in n.decorator_list)])
                <= fn.__code__.co_firstlineno)
    body = node.body[1:] if ast.get_docstring(node) else node.body
    return body[-1].end_lineno - body[0].lineno + 1


# ---------------------------------------------------------------- one speculative step

STEP = re.compile(r"_?(spec|speculative)_?step")  # the name of the function that runs one step
COMPREHENSIONS = ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>")


def _demo_run():
    """A speculative ``generate()`` on the shipped demo pair with the demo's prompt, as a
    function of no arguments."""
    import dflash_ref
    from dflash_ref import demo_text
    from dflash_ref.cli import DEMO_TEXT, demo_dirs

    target_dir, drafter_dir = demo_dirs()
    target = dflash_ref.TargetModel.from_pretrained(target_dir)
    drafter = dflash_ref.DFlashDrafter.from_pretrained(drafter_dir, target)
    prompt = demo_text.encode_text(DEMO_TEXT)
    return lambda: dflash_ref.generate(target, drafter, prompt, 48)


def trace_steps(run, keep: int = 2):
    """Run ``run()`` under ``sys.setprofile``; return (the project calls of its ``keep``-th
    speculative step, in order, as (file, qualified name); the ``Decoding`` object it ran).

    The step is the outermost call of a function of ``spec_decode/`` whose whole name matches
    ``STEP`` (today ``Decoding.spec_step``), so the prefill and the steps before ``keep`` are not
    in it. The ``Decoding`` object is a local, of a class of that name, of a frame of
    ``spec_decode/``."""
    roots = (str(ROOT / "dflash_ref"), str(ROOT / "kernels_cupy"))
    spec_dir = str(ROOT / SPEC_DIR)
    steps, calls_, found, open_step = [0], [], [], [None]

    def profile(frame, event, arg):
        code = frame.f_code
        if event == "return" and frame is open_step[0]:
            open_step[0] = None
        if event != "call" or not code.co_filename.startswith(roots):
            return
        in_loop = code.co_filename.startswith(spec_dir)
        if open_step[0] is None and in_loop and STEP.fullmatch(code.co_name):
            open_step[0], steps[0] = frame, steps[0] + 1
        if in_loop:
            found.extend(v for v in frame.f_locals.values() if type(v).__name__ == "Decoding")
        if open_step[0] is not None and steps[0] == keep and code.co_name not in COMPREHENSIONS:
            calls_.append((code.co_filename, code.co_qualname))

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    if steps[0] < keep:
        raise RuntimeError(f"the demo run made {steps[0]} calls of a spec_decode/ function named "
                           f"{STEP.pattern!r}, {keep} wanted: if the speculative step has another "
                           f"name now, change STEP in scripts/architecture_numbers.py")
    if not found:
        raise RuntimeError("no object of class Decoding ran in spec_decode/: name the loop's "
                           "object in trace_steps (scripts/architecture_numbers.py)")
    return calls_, found[-1]


def _docstring_lines(path: str) -> int:
    """Lines of the module, class and function docstrings of ``path``."""
    tree = ast.parse((ROOT / path).read_text())
    return sum(n.body[0].end_lineno - n.body[0].lineno + 1 for n in ast.walk(tree)
               if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                 ast.AsyncFunctionDef))
               and ast.get_docstring(n, clean=False) is not None)


@functools.cache
def spec_step() -> tuple[list[tuple[str, str]], list[str], object]:
    """The demo pair's traced step (``trace_steps``): its calls, the files it runs (from the
    root), the ``Decoding`` object."""
    calls_, decoding = trace_steps(_demo_run())
    calls_ = [(str(Path(f).relative_to(ROOT)), name) for f, name in calls_]
    return calls_, sorted({f for f, _ in calls_}), decoding


def step_numbers() -> dict:
    """One speculative step on the demo pair: calls of project functions (comprehensions not
    counted), switches between files from one call to the next, the docstring share of the
    files it runs; and the ``Decoding`` object's attributes after the run."""
    calls_, files, decoding = spec_step()
    lines = sum(map(_lines, files))
    share = sum(map(_docstring_lines, files)) / lines
    return {"decoding_attributes": len(vars(decoding)),
            "spec_step_calls": (len(calls_), len(files)),
            "spec_step_file_switches": sum(a != b for (a, _), (b, _) in zip(calls_, calls_[1:])),
            "hot_path_docstring_share": f"{share:.0%} of {lines} lines"}


def _print_step() -> None:
    calls_, files, _ = spec_step()
    for f in files:
        names = sorted({n for g, n in calls_ if g == f})
        print(f"tier {tier_of(f)[0]}  {f} ({sum(g == f for g, _ in calls_)} calls): "
              f"{', '.join(names)}")
    print(f"{len(calls_)} calls in {len(files)} files")


def _print_tiers() -> None:
    for tier, ((name, _), files) in enumerate(zip(TIERS, tiers())):
        print(f"tier {tier}, {name} ({sum(map(_lines, files))} lines):")
        for f in files:
            print(f"  {f} ({_lines(f)})")

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
        **tier_numbers(),
        "graph_files": graph_files(),
        "verifiers_receiving_run": verifiers_receiving_run(),
        "generate_body_lines": generate_body_lines(),
        **step_numbers(),
    }


def cell(value) -> str:
    """A number as the page's table writes it."""
    if isinstance(value, tuple):
        return f"{value[0]} in {value[1]} files"
    if isinstance(value, list):
        return str(len(value))
    if isinstance(value, dict):  # tier -> lines
        return " / ".join(f"{k}: {v}" for k, v in value.items())
    return str(value)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the raw numbers as JSON")
    parser.add_argument("--list", choices=("plain", "spec", "step", "tiers"),
                        help="list the functions the plain greedy or speculative chain path "
                             "runs, the demo pair's speculative step, or the tiers' files")
    args = parser.parse_args(argv)
    if args.list in ("plain", "spec"):
        path_numbers(args.list)
        return
    if args.list:
        (_print_step if args.list == "step" else _print_tiers)()
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
