"""docs/golden_vectors.md's worked example matches the committed case it quotes (issue 25, item 8).

The page's example had gone stale (anchor 193, mask 255, ``draft_logits [7, 256]``, layers 0
and 2, a = 1) against ``tests/golden/qwen3_chain/`` (anchor 101, mask 257, ``[3, 259]``, layers 1
and 2, a = 0), and still said ``--prompt`` was refused. Here every tensor line of the example
(key, dtype, shape, and the values it shows) and the prose around it (prompt, block sizes,
capture layers, committed length, anchor, a) are read from the page and checked against the
committed files, which are the oracle.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
from safetensors import safe_open

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "golden_vectors.md"
CASE = ROOT / "tests" / "golden" / "qwen3_chain"
DTYPES = {"i64": np.int64, "f32": np.float32, "f64": np.float64}
LINE = re.compile(r"^(step(\d{4})\.\S+)\s+(i64|f32|f64)\s+\[([\d, ]+)\](?:\s+(\[[\d, ]+\]))?")


def _ints(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"-?\d+", text)]


def _example() -> tuple[str, list[str]]:
    """(the prose before the block, the block's lines) of the "Worked example" section."""
    section = PAGE.read_text(encoding="utf-8").split("## Worked example", 1)[1]
    prose, block = section.split("```", 2)[:2]
    return prose, [ln for ln in block.splitlines() if ln.strip()]


def _tensor(step: int, key: str) -> np.ndarray:
    with safe_open(str(CASE / f"step{step:04d}.safetensors"), framework="numpy") as f:
        return f.get_tensor(key)


def test_worked_example_tensors_match_the_committed_case():
    _, lines = _example()
    checked = 0
    for line in lines:
        m = LINE.match(line)
        assert m, f"unparsed line of the worked example: {line!r}"
        key, step, dtype, shape, values = m.groups()
        x = _tensor(int(step), key)
        assert x.dtype == DTYPES[dtype], (key, x.dtype, dtype)
        assert list(x.shape) == _ints(shape), (key, x.shape, shape)
        if values:
            assert x.tolist() == _ints(values), (key, x.tolist(), values)
        if "argmax per row:" in line:
            quoted = _ints(line.split("argmax per row:", 1)[1])
            assert x.argmax(axis=-1).tolist() == quoted, (key, x.argmax(axis=-1).tolist())
        if "(a = " in line:
            a = int(re.search(r"\(a = (\d+)\)", line).group(1))
            assert _tensor(int(step), f"step{int(step):04d}.verify.accepted").tolist() == [a]
            assert x.shape[0] == a + 1
        checked += 1
    assert checked >= 10


def test_worked_example_prose_matches_the_manifest():
    prose, lines = _example()
    manifest = json.loads((CASE / "manifest.json").read_text())
    run = manifest["run"]
    step = int(LINE.match(lines[0]).group(2))
    prompt = re.search(r"prompt `([\d,]+)`", prose).group(1)
    assert _ints(prompt) == run["prompt_ids"]
    assert int(re.search(r"--block-size (\d+)", prose).group(1)) == run["block_size"]
    drafter = manifest["models"]["drafter"]
    drafter_config = json.dumps(drafter)
    block = int(re.search(r"drafter block (\d+)", prose).group(1))
    assert f'"block_size": {block}' in drafter_config
    layers = _ints(re.search(r"capture layers ([\d, and]+)\)", prose).group(1))
    keys = [t["key"] for t in manifest["tensors"]]
    keys = [k for k in keys if k.startswith(f"step{step:04d}.target.layer")
            and k.endswith(".features")]
    assert sorted(int(k.split(".layer")[1][:2]) for k in keys) == layers
    length, anchor = _ints(re.search(r"committed length is (\d+) and the anchor is (\d+)",
                                     prose).group(0))
    before = manifest["steps"][step]
    assert before["start"] == length
    assert manifest["steps"][step - 1]["committed"][-1] == anchor
    # the mask id the example shows is the drafter's own
    block_ids = _tensor(step, f"step{step:04d}.drafter.block_ids").tolist()
    assert f'"mask_token_id": {block_ids[1]}' in drafter_config


def test_page_no_longer_says_prompt_is_refused():
    text = PAGE.read_text(encoding="utf-8")
    assert "until then it says so" not in text
    for shape in re.findall(r'"shape": \[(\d+), (\d+)\]', text):  # the dumper's header example
        assert int(shape[1]) == 259, shape
