"""Every number docs/training.md ("A drafter for Gemma 3 270M") and the README's Gemma section
quote from the shipped drafter's logs (dflash_ref/data/gemma3_270m_drafter/*.json) is the log's
number, rounded as printed.

The expected strings are built from the committed logs, never typed twice: a log rewritten by a
new run without the docs, or a doc number edited by hand, fails here. CPU only, no model loads.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / "dflash_ref" / "data" / "gemma3_270m_drafter"


def _log(name: str) -> dict:
    return json.loads((LOGS / name).read_text())


def _section(path: Path, start: str, end: str | None) -> str:
    text = path.read_text()
    i = text.index(start)
    j = text.index(end, i) if end else len(text)
    return " ".join(text[i:j].split())  # one line: quotes may wrap anywhere


TRAINING = _section(ROOT / "docs" / "training.md", "# A drafter for Gemma 3 270M", None)
README = _section(ROOT / "README.md", "A DFlash drafter for this model ships", "From Python")
INTEROP = _section(ROOT / "docs" / "interop.md", "## What agrees", "### DFlash on the shipped pair")
EVAL, TRAIN, LLAMA = _log("eval_log.json"), _log("train_log.json"), _log("llamacpp_log.json")
LLAMA32 = _log("llamacpp_log_f32.json")  # the same pair, llama.cpp on the F32 weights


def f2(x: float) -> str:
    return f"{x:.2f}"


def e1(x: float) -> str:
    """4.0e-4, as the docs write it (Python prints 4.0e-04)."""
    mantissa, exp = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(exp)}"


def _curve(key: str, step: int) -> float:
    return next(p[key] for p in TRAIN["curve"] if p["step"] == step)


def _last_loss() -> dict:
    return [p for p in TRAIN["curve"] if "loss" in p][-1]


def lineage(log: dict) -> list[dict]:
    """The shipped run's log, then the run it continued (``warm_start``), and so on: newest
    first."""
    runs = [log]
    while "warm_start" in runs[-1]:
        runs.append(runs[-1]["warm_start"])
    return runs


RUNS = lineage(TRAIN)
WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}


def _eval_row(e: dict) -> str:
    """The eval table's numbers after the lossless column, as docs/training.md prints them."""
    n = e["prompts"]
    return (f"yes, {n}/{n} | {f2(e['tau'])} ({f2(e['tau_min'])}) | "
            f"{f2(e['tau_features_zeroed'])} | {f2(e['tau'] - e['tau_features_zeroed'])} | "
            f"{e['plain_s']:.1f} s | {e['spec_s']:.1f} s | {f2(e['speedup'])}x | "
            f"{f2(e['tau_p_min'])} | {e['spec_p_min_s']:.1f} s | {f2(e['speedup_p_min'])}x |")


def sp(n: float) -> str:
    """1 905, as the docs write thousands."""
    return f"{n:,.0f}".replace(",", " ")


def _steps(e: dict) -> float:
    """Speculative steps of an eval set: each prompt's new tokens over its tau."""
    return sum(e["new_tokens"] / t for t in e["per_prompt"]["tau"])


def claims() -> list[tuple[str, str, str]]:
    """(id, where, the exact text that must appear)."""
    ind, ood = EVAL["in_domain"], EVAL["out_of_domain"]
    data = TRAIN["data"]
    k = TRAIN["knobs"]
    pi = ind["per_prompt"]
    lower = sum(z < t for t, z in zip(pi["tau"], pi["tau_features_zeroed"]))
    n_code = ind["prompts"] // 2
    step_s, token_s = ind["spec_s"] / _steps(ind), ind["plain_s"] / (ind["prompts"]
                                                                    * ind["new_tokens"])
    blocks_s = TRAIN["blocks_seen"] / TRAIN["train_s"]
    first = RUNS[-1]
    first_rate = first["blocks_seen"] / first["train_s"]
    anchors = (TRAIN["windows"] - TRAIN["validation_windows"]) * (TRAIN["window"] - 3)
    epochs = TRAIN["blocks_seen"] / anchors
    data_s = sum(d["data_s"] for d in data)
    out = [
        ("data_windows", "t", f"| data: all {data[-1]['chunks']} chunks ({TRAIN['windows']} "
                              f"windows x {TRAIN['window']} ids) | "
                              f"{sp(data_s)} s ({WORDS[len(data)]} runs: "
                              + ", ".join(f"{sp(d['data_s'])} s" for d in data)
                              + f") | {sp(TRAIN['positions'])} positions"),
        ("corpus_windows", "t", f"({sp(data[-1]['windows_total'])} windows, about "
                                f"{data[-1]['windows_total'] * TRAIN['window'] // 1000} k "
                                f"positions)"),
        ("train_shape", "t", f"| drafter, continued: {TRAIN['steps_run']} steps x {k['batch']} "
                             f"windows x {k['anchors']} blocks | {sp(TRAIN['train_s'])} s |"),
        ("draft_vocab", "t", f"`draft_vocab` = {sp(TRAIN['draft_vocab'])} ids the target "
                             f"predicts most often in the training windows of the first run "
                             f"(the first part; a warm start keeps them), which cover "
                             f"{100 * TRAIN['draft_vocab_covers']:.1f}% of its predictions on "
                             f"all the training windows"),
        ("covers", "t", f"the 2 816 ids cover {100 * TRAIN['draft_vocab_covers']:.1f}% of"),
        ("loss_curve", "t", f"training loss {f2(_curve('loss', 50))} (step 50) -> "
                            f"{f2(_last_loss()['loss'])} ({_last_loss()['step']})"),
        ("val_tau", "t", "validation tau lower bound " + ", ".join(
            f"{f2(_curve('val_tau_estimate', s))} ({'step ' if s == 0 else ''}{s})"
            for s in (0, 2000, TRAIN["steps_run"]))),
        ("check", "t", f"torch vs `forward_block` draft rows "
                       f"{e1(TRAIN['torch_vs_dflash_ref_max_rel_diff'])}"),
        ("first_run", "t", f"the first (42 minutes, {first['steps_run']} steps of "
                           f"{first['knobs']['batch']} windows x {first['knobs']['anchors']} "
                           f"anchors in float32"),
        ("blocks", "t", f"The last run saw {sp(TRAIN['blocks_seen'])} blocks (the runs before it "
                        + " and ".join(sp(r["blocks_seen"]) for r in RUNS[1:])
                        + f"), about {epochs:.1f} epochs"),
        ("blocks_rate", "t", f"at {sp(round(blocks_s, -1))} blocks/s"),
        ("cheaper", "t", f"a block about {blocks_s / first_rate:.0f} times cheaper"),
        ("budget", "t", f"on all {data[-1]['chunks']} chunks of both parts "
                        f"({k['train_minutes']:.0f} minutes)"),
        ("runs", "t", f"The shipped drafter is {WORDS[len(RUNS)]} runs"),
        ("p_min", "t", f"cut at p_min {ind['p_min']}"),
        ("eval_in_domain", "t", _eval_row(ind)),
        ("eval_out_of_domain", "t", _eval_row(ood)),
        ("per_prompt_range", "t", f"in domain tau ranges {f2(min(pi['tau']))}-"
                                  f"{f2(max(pi['tau']))} (code "
                                  f"{f2(sum(pi['tau'][:n_code]) / n_code)} on average, prose "
                                  f"{f2(sum(pi['tau'][n_code:]) / n_code)}), and the ablation "
                                  f"lowers it on {lower} of {ind['prompts']} prompts"),
        ("plain_rate", "t", f"Plain decoding ran at "
                            f"{ind['prompts'] * ind['new_tokens'] / ind['plain_s']:.1f} tokens/s"),
        ("step_cost", "t", f"A step costs {ind['spec_s']:.1f} s / {_steps(ind):.0f} steps = "
                           f"{1e3 * step_s:.0f} ms against {1e3 * token_s:.0f} ms per plain "
                           f"token, {f2(step_s / token_s)} plain tokens"),
        ("cut_gain", "t", f"({f2(ind['speedup'])}x -> {f2(ind['speedup_p_min'])}x in domain) "
                          f"but also the drafts that would have passed (tau {f2(ind['tau'])} -> "
                          f"{f2(ind['tau_p_min'])})"),
        ("tau_rose", "t", f"tau rose from 1.58 to {f2(ind['tau'])} and the ablation's drop from "
                          f"0.495 to {ind['tau'] - ind['tau_features_zeroed']:.3f}"),
        ("readme_in", "r", f"| {ind['prompts']}/{ind['prompts']} | {f2(ind['tau'])} | "
                           f"{f2(ind['tau_features_zeroed'])} | {f2(ind['speedup'])}x | "
                           f"{f2(ind['speedup_p_min'])}x |"),
        ("readme_ood", "r", f"| {ood['prompts']}/{ood['prompts']} | {f2(ood['tau'])} | "
                            f"{f2(ood['tau_features_zeroed'])} | {f2(ood['speedup'])}x | "
                            f"{f2(ood['speedup_p_min'])}x |"),
        ("readme_head", "r", f"over its own {TRAIN['draft_vocab']:,}-row head"),
        ("readme_data", "r", f"The drafter saw {TRAIN['positions']:,} positions in "
                             f"{TRAIN['blocks_seen_in_all'] // 1000} k training blocks"),
        ("readme_reaches", "r", f"drafter reaches a tau of {f2(ind['tau'])}"),
        ("readme_cut", "r", f"cut at p_min {ind['p_min']} it runs at {f2(ind['speedup_p_min'])}x "
                            f"plain decoding over the held-out prompts"),
        ("readme_step", "r", f"A speculative step costs about {step_s / token_s:.1f} plain "
                             f"tokens here"),
    ]
    ll, lp = LLAMA, LLAMA["per_prompt"]
    taus = [r["tau"] for r in lp]
    sw = ll["same_way"]
    sw32 = LLAMA32["same_way"]
    assert LLAMA32["f32"] and LLAMA32["target"].endswith("-f32.gguf")
    out += [
        ("llamacpp_plain", "t", f"| llama.cpp plain | {ll['plain_tokens']} | "
                                f"{ll['plain_s']:.1f} s | {ll['plain_tok_s']:.1f} |"),
        ("llamacpp_dflash", "t", f"| llama.cpp DFlash | {ll['spec_tokens']} | "
                                 f"{ll['spec_s']:.1f} s | {ll['spec_tok_s']:.1f} | "
                                 f"{f2(ll['tau'])} ({f2(min(taus))}-{f2(max(taus))}) | "
                                 f"{100 * ll['acceptance']:.1f}% |"),
        ("llamacpp_speedup", "t", f"| speedup | | | **{f2(ll['speedup'])}x** |"),
        ("llamacpp_same_text", "t", f"agree on {sum(r['same_text'] for r in lp)} of the "
                                    f"{ll['prompts']} prompts"),
        ("llamacpp_vs_ours", "t", f"{f2(ll['speedup'])}x against {f2(ind['speedup'])}x): its "
                                  f"plain decoding runs at {ll['plain_tok_s']:.1f} tokens/s"),
        ("llamacpp_same_way", "t", f"tokens identical on {sw['same_tokens_all_prompts']} of "
                                   f"{ll['prompts']} prompts, accepted drafts per step identical "
                                   f"on {sw['same_accepted_all_prompts']}"),
        ("llamacpp_gaps", "t", f"under 0.1 on {ll['prompts'] - sw['prompts_gap_ge_0.1']} of the "
                               f"{ll['prompts']} prompts"),
        ("readme_llamacpp_same", "r", f"its tokens equal dflash-ref's on "
                                      f"{sw['same_tokens_all_prompts']} of them"),
        ("llamacpp_f32", "t", f"in float32 **tokens identical on "
                              f"{sw32['same_tokens_all_prompts']} of {LLAMA32['prompts']} "
                              f"prompts, accepted drafts per step identical on "
                              f"{sw32['same_accepted_all_prompts']}**"),
        ("llamacpp_f32_test", "t", f"replays the prompt whose gap is "
                                   f"{LLAMA32['per_prompt'][10]['min_gap']} with a hooked build"),
        ("llamacpp_f32_gaps", "t", f"though the smallest gap is under 0.1 on "
                                   f"{LLAMA32['prompts'] - sw32['prompts_gap_ge_0.1']} of them"),
        ("readme_llamacpp_f32", "r", f"on an F32 copy of the same weights (`--f32`) its tokens "
                                     f"equal dflash-ref's on {sw32['same_tokens_all_prompts']} "
                                     f"of {LLAMA32['prompts']} prompts and its accepted drafts "
                                     f"per step on {sw32['same_accepted_all_prompts']}"),
        ("interop_llamacpp", "i", f"it runs, tau {f2(ll['tau'])}"),
        ("readme_llamacpp", "r", f"tau {f2(ll['tau'])}, {ll['spec_tok_s']:.1f} tokens/s "
                                 f"against {ll['plain_tok_s']:.1f} for llama.cpp's plain "
                                 f"decoding, {f2(ll['speedup'])}x, on {ll['prompts']} held-out "
                                 f"prompts"),
    ]
    return out


CLAIMS = claims()


@pytest.mark.parametrize("where, text", [c[1:] for c in CLAIMS], ids=[c[0] for c in CLAIMS])
def test_the_docs_quote_the_logs(where, text):
    doc, name = {"t": (TRAINING, "docs/training.md"), "r": (README, "README.md"),
                 "i": (INTEROP, "docs/interop.md")}[where]
    assert text in doc, f"not in {name}: {text!r}"


def test_per_prompt_values_agree_with_the_summaries():
    """The per-prompt lists (copied from the eval's printed log) average to the summaries."""
    for part in ("in_domain", "out_of_domain"):
        e = EVAL[part]
        p = e["per_prompt"]
        assert len(p["tau"]) == e["prompts"]
        assert abs(sum(p["tau"]) / e["prompts"] - e["tau"]) < 0.01
        assert abs(sum(p["tau_features_zeroed"]) / e["prompts"] - e["tau_features_zeroed"]) < 0.01
        assert min(p["tau"]) == e["tau_min"]
        assert abs(e["plain_s"] / e["spec_s"] - e["speedup"]) < 0.005
        assert abs(e["plain_s"] / e["spec_p_min_s"] - e["speedup_p_min"]) < 0.005


def test_the_real_test_pins_the_logged_tau():
    """tests/real/test_gemma3_drafter.py pins the mean of the first prompts' logged tau."""
    src = (ROOT / "tests" / "real" / "test_gemma3_drafter.py").read_text()
    n = int(re.search(r"N_PROMPTS, NEW_TOKENS = (\d+), (\d+)", src).group(1))
    tau, zeroed = map(float, re.search(r"MEASURED_TAU, MEASURED_TAU_ZEROED = ([\d.]+), ([\d.]+)",
                                       src).groups())
    p = EVAL["in_domain"]["per_prompt"]
    assert tau == round(sum(p["tau"][:n]) / n, 2)
    assert zeroed == round(sum(p["tau_features_zeroed"][:n]) / n, 2)


def test_the_text_extrapolation_is_the_logs():
    """A line through (the first part's 402 k positions, tau 1.58) and (the shipped run's
    positions, its held-out tau) in log(positions) reaches 2.5 beyond 200 times the corpus, over
    300 M positions."""
    tau, first = EVAL["in_domain"]["tau"], 1.58
    ratio = TRAIN["positions"] / RUNS[1]["positions"]  # the run it continued: the first part
    assert f"With {ratio:.1f} times the text the held-out tau rose by {tau - first:.2f}" \
        in " ".join(TRAINING.split())
    factor = ratio ** ((2.5 - tau) / (tau - first))
    assert factor > 200 and factor * TRAIN["positions"] > 300e6
    assert "puts tau 2.5 beyond 200 times this corpus (over 300 M positions" \
        in " ".join(TRAINING.split())


def test_the_verify_cost_numbers_are_the_logs():
    """The verify_cost run docs/training.md quotes (docs/data/verify_cost_gemma3_2threads.json)."""
    log = json.loads((ROOT / "docs" / "data" / "verify_cost_gemma3_2threads.json").read_text())

    def step(form):
        return sum(log[form]["ms_per_step"].values())

    head, gemm = log["head_ms_by_rows"], log["head_ms_by_rows_matrix_product"]
    text = (f"two threads (load average {log['load_average_start']:.1f}; tau "
            f"{f2(log['eager']['tau'])}; `docs/data/verify_cost_gemma3_2threads.json`): the "
            f"default lazy grouping (`1,1+layers`) {step('lazy 1,1+layers'):.1f} ms a step, the "
            f"eager verify {step('eager'):.1f} ms, the cut at p_min 0.9 {step('cut 0.9'):.1f} ms "
            f"at tau {f2(log['cut 0.9']['tau'])}; the target's head {head[0]:.1f} ms for one "
            f"row, {head[1]:.1f} ms for 2 and {head[7]:.1f} ms for 8 (as one matrix product, "
            f"{gemm[1]:.1f} ms for 2).")
    assert log["blas_threads"] == 2
    assert text in TRAINING, text
    assert f"every step pays the draft, {log['cut 0.9']['ms_per_step']['draft']:.0f} ms" in TRAINING
