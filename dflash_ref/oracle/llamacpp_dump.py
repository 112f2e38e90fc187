"""Read what llama.cpp's ``llama-eval-callback`` prints, and check it against full tensors
(docs/interop.md, "Golden vectors for llama.cpp").

``llama-eval-callback`` (llama.cpp ``examples/eval-callback``, printing through
``common/debug.cpp``, ``common_debug_cb_eval``) runs one prompt through a model and prints every
graph tensor as it is computed::

    common_debug_cb_eval:   l_out-1 = (f32)   ADD(ffn_out-1{128, 5, 1, 1}, ...) = {128, 5, 1, 1}
        [
            [
                [      0.1234,      -0.5678,       0.9012,    ...,  ...  ],
                ...
            ],
        ]
        sum = 12.345678

that is: the name, the ggml type, the op, and ``ne`` (ggml order: ``ne0`` the fastest axis, so a
NumPy array of shape ``[ne3, ne2, ne1, ne0]``); then, per ``i3``, the values with ``"%12.4f"``
where each axis longer than 6 shows only its first 3 and last 3 indices; then the sum of every
element (float32, in index order, ``"%f"``). So a dump holds 4 decimals of up to 6 x 6 corners per
matrix and one exact-ish sum: enough to find the first tensor that disagrees, not to bisect
inside it.

Names (llama.cpp ``src/models/*.cpp``, the ``cb(cur, name, il)`` calls): ``l_out-N`` is the
output of layer ``N`` (0-based, after the second residual add), which is dflash-ref's capture
id ``N`` and llama.cpp's DFlash ``target_layers`` value ``N + 1`` (the input of layer
``N + 1``; docs/conventions.md); ``result_norm`` is the final norm; ``result_output`` the logits
``{n_vocab, n_outputs}`` (eval-callback asks for the last token's only).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dflash_ref.errors import FormatError

# the name may hold spaces: ggml names views "Kcur-0 (reshaped)", "... (view)", "... (permuted)"
_HEADER = re.compile(r"^common_debug_cb_eval:\s+(.+?) = \((\w+)\)\s.* = \{([\d, ]+)\}\s*$")
_SUM = re.compile(r"^\s*sum = (\S+)\s*$")
_ROW = re.compile(r"^\s*\[([^\[\]]*)\],?\s*$")
SHOWN = 3  # common_debug_print_tensor's n: corners of 3 per side


@dataclass
class DumpTensor:
    """One printed tensor: ``name``, ggml ``type``, ``ne`` (ggml order, 4 entries), ``values``
    {(i3, i2, i1, i0): value} for the printed corners, ``sums`` (one per i3)."""

    name: str
    type: str
    ne: tuple[int, int, int, int]
    values: dict[tuple[int, int, int, int], float] = field(default_factory=dict)
    sums: list[float] = field(default_factory=list)

    @property
    def shape(self) -> tuple[int, ...]:
        """The NumPy shape ``[ne3, ne2, ne1, ne0]`` with leading 1s dropped."""
        dims = list(reversed(self.ne))
        while len(dims) > 1 and dims[0] == 1:
            dims.pop(0)
        return tuple(dims)


def shown_indices(n: int) -> list[int]:
    """The indices of an axis of length ``n`` that the dump prints."""
    return list(range(n)) if n <= 2 * SHOWN else [*range(SHOWN), *range(n - SHOWN, n)]


def _fill(t: DumpTensor, rows: list[list[float]], i3: int, where: str) -> None:
    ne0, ne1, ne2, _ = t.ne
    coords = [(i2, i1) for i2 in shown_indices(ne2) for i1 in shown_indices(ne1)]
    if len(rows) != len(coords):
        raise FormatError(f"{where}: tensor {t.name!r} {list(t.ne)}: {len(rows)} printed rows "
                          f"for i3={i3}, expected {len(coords)}")
    cols = shown_indices(ne0)
    for (i2, i1), row in zip(coords, rows):
        if len(row) != len(cols):
            raise FormatError(f"{where}: tensor {t.name!r}: a row of {len(row)} values, "
                              f"expected {len(cols)}")
        for i0, v in zip(cols, row):
            t.values[(i3, i2, i1, i0)] = v


def parse_eval_callback(text: str, where: str = "eval-callback output") -> list[DumpTensor]:
    """Every tensor printed in ``text`` (llama-eval-callback's stdout), in print order."""
    out: list[DumpTensor] = []
    cur: DumpTensor | None = None
    rows: list[list[float]] = []
    for line in text.splitlines():
        m = _HEADER.match(line)
        if m:
            ne = tuple(int(x) for x in m.group(3).split(","))
            cur = DumpTensor(m.group(1), m.group(2), (ne + (1, 1, 1, 1))[:4])
            out.append(cur)
            rows = []
            continue
        if cur is None:
            continue
        m = _ROW.match(line)
        if m and m.group(1).strip():
            rows.append([float(v) for v in m.group(1).split(",")
                         if v.strip() and v.strip() != "..."])
            continue
        m = _SUM.match(line)
        if m:
            _fill(cur, rows, len(cur.sums), where)
            cur.sums.append(float(m.group(1)))
            rows = []
    if not out:
        raise FormatError(f"{where}: no 'common_debug_cb_eval:' tensor lines; pass the stdout of "
                          "llama.cpp's llama-eval-callback (examples/eval-callback)")
    return out


def read_eval_callback(path) -> list[DumpTensor]:
    """:func:`parse_eval_callback` of a file."""
    path = Path(path)
    return parse_eval_callback(path.read_text(encoding="utf-8", errors="replace"), str(path))


def by_name(tensors: list[DumpTensor]) -> dict[str, DumpTensor]:
    """name -> the last printed tensor of that name (a name repeats when a graph runs twice)."""
    return {t.name: t for t in tensors}


def check_against(t: DumpTensor, ref: np.ndarray, atol: float, rtol: float) -> list[str]:
    """Problems (empty: agrees) of dump tensor ``t`` against the full array ``ref``.

    ``ref`` is in NumPy order, any shape with ``ne0 * ne1 * ne2 * ne3`` elements. Each printed
    value must be within ``atol + rtol * |ref|`` plus the print rounding (0.5e-4); each sum
    within ``atol * sqrt(n) + rtol * sum(|ref|)`` of the float64 sum.
    """
    ne0, ne1, ne2, ne3 = t.ne
    x = np.asarray(ref, dtype=np.float64)
    if x.size != ne0 * ne1 * ne2 * ne3:
        return [f"{t.name}: {x.size} reference elements for ne {list(t.ne)}"]
    x = x.reshape(ne3, ne2, ne1, ne0)
    problems = []
    for (i3, i2, i1, i0), v in t.values.items():
        r = x[i3, i2, i1, i0]
        if not abs(v - r) <= atol + rtol * abs(r) + 0.5e-4:
            problems.append(f"{t.name}[{i3},{i2},{i1},{i0}] = {v} in the dump, {r:.6f} here")
    for i3, s in enumerate(t.sums):
        want = float(x[i3].sum())
        n = x[i3].size
        if not abs(s - want) <= atol * np.sqrt(n) + rtol * float(np.abs(x[i3]).sum()):
            problems.append(f"{t.name}: sum {s} in the dump, {want:.6f} here")
    return problems


def dump_prompt_ids(text: str) -> list[int] | None:
    """The prompt ids eval-callback prints (``number of input tokens = N`` then N lines), or
    None when the dump lacks them."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.search(r"number of input tokens = (\d+)", line)
        if m:
            n = int(m.group(1))
            ids = [re.sub(r"^.*?\s(-?\d+)\s*$", r"\1", s) for s in lines[i + 1:i + 1 + n]]
            return [int(v) for v in ids] if all(v.lstrip("-").isdigit() for v in ids) else None
    return None


def dump_name_of(key: str) -> str | None:
    """The eval-callback tensor a case key of the prefill (step 0) is compared with: the capture
    layer's features or a layer's output ``h`` -> ``l_out-N``; the logits -> ``result_output``."""
    from dflash_ref.oracle.layout import parse_key

    p = parse_key(key)
    if p.step != 0 or p.component != "target":
        return None
    if p.name in ("features", "h") and p.layer is not None:
        return f"l_out-{p.layer}"
    return "result_output" if p.name == "logits" else None


def compare_eval_callback(ref_dir, dump_path, tolerance_scale: float = 1.0, out=None) -> int:
    """``dflash-ref oracle compare CASE DUMP.txt``: a case's prefill against llama.cpp's
    ``llama-eval-callback`` run on the same prompt (docs/interop.md). Prints the tensors in
    execution order, the first divergence first; 0 agree, 1 diverge, 2 nothing compared."""
    import sys

    from dflash_ref.oracle.compare import _tolerances
    from dflash_ref.oracle.layout import kind_of, read_case

    out = out or sys.stdout
    manifest, ref = read_case(ref_dir)
    if manifest is None:
        raise FormatError(f"{ref_dir} has no manifest.json; the reference must be a case written "
                          "by 'dflash-ref oracle export'")
    text = Path(dump_path).read_text(encoding="utf-8", errors="replace")
    dump = by_name(parse_eval_callback(text, str(dump_path)))
    ids, want = dump_prompt_ids(text), [int(v) for v in ref["input.prompt_ids"]]
    if ids is not None and ids != want:
        print(f"the dump ran another prompt: {len(ids)} ids {ids[:8]}..., the case "
              f"{len(want)} ids {want[:8]}...; run llama-eval-callback on the case's prompt",
              file=out)
        return 1
    table = _tolerances(manifest, tolerance_scale)
    compared, first = 0, None
    for t in manifest["tensors"]:
        name = dump_name_of(t["key"])
        if name is None or name not in dump:
            continue
        tol = table[t.get("kind") or kind_of(t["key"])]
        problems = check_against(dump[name], ref[t["key"]], tol.atol, tol.rtol)
        compared += 1
        verdict = "ok" if not problems else problems[0]
        print(f"  {t['key']} vs {name}: {verdict}", file=out)
        if problems and first is None:
            first = (t["key"], name, problems)
    if first is not None:
        print(f"first divergence: {first[0]} (llama.cpp {first[1]}), {len(first[2])} problem(s)",
              file=out)
        return 1
    print(f"{compared} tensors agree (printed corners and sums)" if compared else
          "nothing compared: the dump has no l_out-N / result_output of the case's tensors",
          file=out)
    return 0 if compared else 2


__all__ = [
    "compare_eval_callback",
    "dump_name_of",
    "dump_prompt_ids",
    "DumpTensor",
    "by_name",
    "check_against",
    "parse_eval_callback",
    "read_eval_callback",
    "shown_indices",
]
