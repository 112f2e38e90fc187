"""Reading llama-eval-callback's dump (dflash_ref/oracle/llamacpp_dump.py).

The expected text is made by a transliteration of llama.cpp's printer (common/debug.cpp,
common_debug_print_tensor and the header line of common_debug_cb_eval) written here from that
source, not by the code under test.
"""

from __future__ import annotations

import numpy as np
import pytest

from dflash_ref.errors import FormatError
from dflash_ref.oracle.llamacpp_dump import by_name, check_against, parse_eval_callback


def print_like_llamacpp(name: str, x: np.ndarray, n: int = 3) -> str:
    """common_debug_print_tensor of x [ne3, ne2, ne1, ne0] (float32), header included."""
    x4 = x.reshape((1,) * (4 - x.ndim) + x.shape).astype(np.float32)
    ne = tuple(reversed(x4.shape))
    ne_s = ", ".join(str(v) for v in ne)
    out = [f"common_debug_cb_eval: {name:>24} = (f32) {'ADD':>10}(a{{{ne_s}}}, b{{{ne_s}}}}}) "
           f"= {{{ne_s}}}"]
    for i3 in range(ne[3]):
        total = np.float32(0)
        for v in x4[i3].ravel():
            total = np.float32(total + v)
        out.append("    [")
        i2 = 0
        while i2 < ne[2]:
            if i2 == n and ne[2] > 2 * n:
                out.append("        ..., ")
                i2 = ne[2] - n
            out.append("        [")
            i1 = 0
            while i1 < ne[1]:
                if i1 == n and ne[1] > 2 * n:
                    out.append("            ..., ")
                    i1 = ne[1] - n
                row, i0 = "            [", 0
                while i0 < ne[0]:
                    if i0 == n and ne[0] > 2 * n:
                        row += "   ..., "
                        i0 = ne[0] - n
                    row += f"{x4[i3, i2, i1, i0]:12.4f}" + (", " if i0 < ne[0] - 1 else "")
                    i0 += 1
                out.append(row + "  ],")
                i1 += 1
            out.append("        ],")
            i2 += 1
        out.append("    ]")
        out.append(f"    sum = {total:f}")
    return "\n".join(out) + "\n"


def test_corners_and_sums_are_read_back(rng):
    big = rng.standard_normal((5, 11)).astype(np.float32)   # both axes elided
    small = rng.standard_normal((2, 4)).astype(np.float32)  # nothing elided
    text = "noise before\n" + print_like_llamacpp("l_out-1", big) + print_like_llamacpp(
        "result_output", small) + "llama_perf_context_print: ...\n"
    dump = by_name(parse_eval_callback(text))
    t = dump["l_out-1"]
    assert t.ne == (11, 5, 1, 1) and t.shape == (5, 11)
    assert len(t.values) == 5 * 6  # 5 rows (not elided: 5 <= 6) x 3 + 3 columns
    assert t.values[(0, 0, 4, 10)] == pytest.approx(big[4, 10], abs=5e-5)
    assert (0, 0, 0, 5) not in t.values  # an elided column
    assert check_against(t, big, 1e-6, 1e-6) == []
    assert check_against(dump["result_output"], small, 1e-6, 1e-6) == []


def test_a_changed_value_or_sum_is_reported(rng):
    x = rng.standard_normal((4, 9)).astype(np.float32)
    dump = by_name(parse_eval_callback(print_like_llamacpp("l_out-0", x)))["l_out-0"]
    y = x.copy()
    y[3, 8] += 0.01  # a printed corner
    assert any("[0,0,3,8]" in p for p in check_against(dump, y, 1e-4, 0))
    z = x.copy()
    z[1, 4] += 0.5  # elided: only the sum sees it
    assert [p for p in check_against(dump, z, 1e-4, 0) if "sum" in p]


def test_not_a_dump_is_a_clear_error():
    with pytest.raises(FormatError, match="llama-eval-callback"):
        parse_eval_callback("hello\n")


# ------------------------------------------------------- dflash-ref oracle compare CASE DUMP


@pytest.fixture(scope="module")
def demo_case(tmp_path_factory):
    from pathlib import Path

    from dflash_ref.oracle.export import export_case

    demo = Path(__file__).resolve().parents[2] / "dflash_ref" / "data" / "demo"
    out = tmp_path_factory.mktemp("case") / "demo"
    export_case(out, demo / "target", demo / "drafter", list(b"def f(x):\n    return"),
                max_new_tokens=4, gguf=False)
    return out


def _dump_of(case, change=None):
    """An eval-callback-style dump of the case's own prefill tensors (``change`` edits one)."""
    from dflash_ref.oracle.layout import read_case

    manifest, ref = read_case(case)
    ids = [int(v) for v in ref["input.prompt_ids"]]
    text = f"number of input tokens = {len(ids)}\n" + "".join(f"  {i}\n" for i in ids)
    for t in manifest["tensors"]:
        k = t["key"]
        if k.startswith("step0000.target.layer") and k.endswith(".features"):
            layer = int(k.split(".")[2][len("layer"):])
            x = ref[k].copy()
            if change == layer:
                x[-1, -1] += 0.5
            text += print_like_llamacpp(f"l_out-{layer}", x)
        if k == "step0000.target.logits":
            text += print_like_llamacpp("result_output", ref[k])
    return text


def test_oracle_compare_reads_an_eval_callback_dump(demo_case, tmp_path, capsys):
    from dflash_ref.cli import main

    good = tmp_path / "good.txt"
    good.write_text(_dump_of(demo_case))
    assert main(["oracle", "compare", str(demo_case), str(good)]) == 0
    assert "3 tensors agree" in capsys.readouterr().out  # layers 1, 2 and the logits
    bad = tmp_path / "bad.txt"
    bad.write_text(_dump_of(demo_case, change=2))
    assert main(["oracle", "compare", str(demo_case), str(bad)]) == 1
    out = capsys.readouterr().out
    assert "first divergence: step0000.target.layer02.features (llama.cpp l_out-2)" in out
    other = tmp_path / "other.txt"
    other.write_text(_dump_of(demo_case).replace("\n  100\n", "\n  101\n", 1))  # "d" -> "e"
    assert main(["oracle", "compare", str(demo_case), str(other)]) == 1
    assert "the dump ran another prompt" in capsys.readouterr().out
