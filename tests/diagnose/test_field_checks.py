"""dflash_ref.diagnose.field_checks and field_stats: the statistics by hand and against the t
distribution, the re-quantization against gguf-py, and each named check recognising its planted
case on the shipped demo pair.

The planted cases and where their expected verdicts come from (never from the check's numbers):

- template: the drafter was trained on raw Python text (docs/training.md); the served template
  opens a thinking block with a line of prose before the answer. Served that way -> "warn";
  served raw (as trained) -> "ok" (the same run on both sides).
- domain: the drafter saw Python source only; JSON is another language -> "warn", naming
  the JSON set.
- quantized target: a target whose every matrix went through Q4_K -> "warn"; the message
  reports a feature drift larger for Q4_K than for Q8_0 (Q4_K keeps 4 bits a weight, Q8_0 8).
- context limit: the drafter's position limit set to 64 and its RoPE positions read modulo 64
  past it (a stack whose RoPE table has max_position_embeddings rows) -> "warn" naming that
  limit; the shipped pair reaches no limit -> "ok".
- layer offset: the shipped drafter with its target layer ids shifted to [0, 1] (trained on
  [1, 2]; [2, 3] is refused at load, layer 3 being the last) -> "warn", off by +1; the shipped
  pair -> "ok".
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest

import dflash_ref
from dflash_ref.cli import main
from dflash_ref.diagnose import explain
from dflash_ref.diagnose.field_checks import (
    PROBES,
    FieldFinding,
    context_limit_check,
    domain_check,
    layer_offset_check,
    position_limits,
    quantized_target_check,
    renderings,
    requantize,
    template_check,
)
from dflash_ref.diagnose.field_stats import (
    T_995,
    Difference,
    paired_difference,
    t_quantile,
    welch_difference,
)
from dflash_ref.io.quant import quantize_q4_k, quantize_q8_0
from dflash_ref.io.safetensors_io import load_checkpoint
from dflash_ref.models.drafter import DFlashDrafter
from dflash_ref.models.target import TargetModel

DEMO = Path(dflash_ref.__file__).parent / "data" / "demo"
HELD_OUT = json.loads((DEMO / "held_out_prompts.json").read_text())["prompts"]
PROMPTS = HELD_OUT[:16]
DOC = (Path(__file__).resolve().parents[2] / "docs" / "acceptance.md").read_text()
# A chat template whose thinking mode opens a thinking block with a line of prose (as a server
# that prefills the model's reasoning does); thinking off: the plain assistant turn.
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking %}"
    "<think>\nOkay, let me think about what the user wants.\n{% endif %}{% endif %}")


@pytest.fixture(scope="module")
def pair():
    target = TargetModel.from_pretrained(DEMO / "target")
    return target, DFlashDrafter.from_pretrained(DEMO / "drafter", target)


# ------------------------------------------------------------------------------ statistics


def _t_upper_tail(x: float, df: int) -> float:
    """P(T > x) for Student's t with ``df``, by integrating its density (closed form) with
    Simpson's rule on [x, x + 4000] after t = x + u^2 (the tail past it is below 1e-6)."""
    c = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
    u = np.linspace(0.0, math.sqrt(4000.0), 200_001)
    t = x + u ** 2
    f = c * (1 + t ** 2 / df) ** (-(df + 1) / 2) * 2 * u  # dt = 2u du
    h = u[1] - u[0]
    return float(h / 3 * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum()))


@pytest.mark.parametrize("df", [2, 3, 5, 10, 15, 30, 120])
def test_t_table_is_the_995_quantile(df):
    # the table's row against the distribution itself: a typo in a row moves its tail
    assert _t_upper_tail(T_995[df], df) == pytest.approx(0.005, rel=2e-3)


def test_t_quantile_takes_the_row_at_or_below():
    assert t_quantile(15) == 2.947
    assert t_quantile(35.7) == 2.750  # between 30 and 40: the 30 row (wider)
    assert t_quantile(121) == 2.576  # the normal
    with pytest.raises(ValueError, match="df >= 1"):
        t_quantile(0.5)


def test_paired_difference_hand_case():
    # d = 2, 3, 2, 3: mean 2.5, sd sqrt(1/3); half width t(3) 5.841 * sqrt(1/3) / 2 = 1.6862
    d = paired_difference([3, 5, 4, 6], [1, 2, 2, 3])
    assert (d.mean, d.low, d.high, d.n) == pytest.approx((2.5, 0.8138, 4.1862, 4), abs=1e-4)
    assert d.significant  # catches ddof=0 or df = n (both still significant: see the next)
    # d = 1, -1, 2, 0: mean 0.5, sd sqrt(5/3) = 1.2910; half 5.841 * 1.2910 / 2 = 3.770
    e = paired_difference([2, 0, 3, 1], [1, 1, 1, 1])
    assert (e.low, e.high) == pytest.approx((0.5 - 3.770, 0.5 + 3.770), abs=1e-3)
    assert not e.significant
    assert not paired_difference([4.0], [1.0]).significant  # one prompt: no interval


def test_welch_difference_hand_case():
    # x: mean 2.5, var 5/3 -> 5/12; y: mean 6, var 10 -> 2; se^2 = 29/12;
    # df = (29/12)^2 / ((5/12)^2 / 3 + 2^2 / 4) = 5.52 -> row 5, 4.032; half 4.032 * 1.5546
    d = welch_difference([1, 2, 3, 4], [2, 4, 6, 8, 10])
    assert d.mean == pytest.approx(-3.5)
    assert (d.low, d.high) == pytest.approx((-3.5 - 6.268, -3.5 + 6.268), abs=2e-3)
    assert not d.significant
    far = welch_difference([10, 11, 10, 11], [1, 2, 1, 2])
    assert far.significant and far.low > 0


def test_difference_significance_is_strict_at_zero():
    assert not Difference(1.0, 0.0, 2.0, 5).significant  # the interval touches 0
    assert Difference(-1.0, -2.0, -1e-9, 5).significant


# ------------------------------------------------------------------------------ requantize


def test_requantize_q8_0_is_ggml_on_padded_rows(rng):
    w = rng.standard_normal((3, 40)).astype(np.float32)  # 40: not a whole Q8_0 block
    padded = np.pad(w, ((0, 0), (0, 24)))
    want = gguf.quants.dequantize(gguf.quants.quantize(padded, gguf.GGMLQuantizationType.Q8_0),
                                  gguf.GGMLQuantizationType.Q8_0)[:, :40]
    got = requantize(w, "Q8_0")
    assert got.shape == (3, 40)
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(got, w)


def test_requantize_q4_k_pads_each_row_to_a_super_block(rng):
    w = rng.standard_normal((2, 100)).astype(np.float32)
    padded = np.pad(w, ((0, 0), (0, 156)))  # each row alone: a row never shares a block
    want = gguf.quants.dequantize(quantize_q4_k(padded),
                                  gguf.GGMLQuantizationType.Q4_K)[:, :100]
    np.testing.assert_array_equal(requantize(w, "Q4_K"), want)
    assert quantize_q8_0(np.zeros((1, 32))).shape == (1, 34)


# ------------------------------------------------------------------------------ planted cases


def test_template_mismatch_is_named(pair, demo_tokenizer):
    target, drafter = pair
    texts = [bytes(p).decode() for p in PROMPTS]
    ways = renderings(demo_tokenizer, texts[0], THINKING_TEMPLATE)
    assert list(ways) == ["raw", "chat", "chat, thinking"]
    assert ways["raw"] == list(texts[0].encode())  # the byte tokenizer: ids are the bytes
    served = template_check(target, drafter, texts, demo_tokenizer, "chat, thinking",
                            trained="raw", template=THINKING_TEMPLATE)
    assert (served.name, served.status) == ("template", "warn"), served.message
    assert "served (chat, thinking) vs raw (as trained)" in served.message
    assert served.line() in DOC  # the page quotes this finding
    as_trained = template_check(target, drafter, texts[:4], demo_tokenizer, "raw", trained="raw",
                                template=THINKING_TEMPLATE)
    assert as_trained.status == "ok", as_trained.message


def test_out_of_domain_prompts_are_named(pair):
    target, drafter = pair
    sets = {"python": HELD_OUT, "json": [list(t.encode()) for t in PROBES["json"]]}
    f = domain_check(target, drafter, sets, "python")
    assert (f.name, f.status) == ("domain", "warn"), f.message
    assert f.message.endswith("out of the training domain: json")
    assert f.line() in DOC
    with pytest.raises(ValueError, match="'code' is not one of"):
        domain_check(target, drafter, sets, "code")


def test_a_q4_target_is_named(pair):
    target, drafter = pair
    weights = load_checkpoint(DEMO / "target")
    q4 = quantized_target_check(target, drafter, PROMPTS, weights, "Q4_K")
    assert (q4.name, q4.status) == ("quantized target", "warn"), q4.message
    q8 = quantized_target_check(target, drafter, PROMPTS[:4], weights, "Q8_0", 16)
    drift = [float(m.split("feature drift ")[1].split("%")[0]) for m in (q4.message, q8.message)]
    assert drift[0] > drift[1] > 0  # 4 bits a weight drift more than 8
    assert q4.line() in DOC and q8.line() in DOC


class _WrappedPositions(DFlashDrafter):
    """The planted fault: RoPE positions read modulo the config's max_position_embeddings."""

    def context_kv(self, layer, c, positions):
        return super().context_kv(layer, c, np.asarray(positions) %
                                  self.config.max_position_embeddings)

    def attention(self, i, u, join_kv, ctx_pos, noise_pos):
        return super().attention(i, u, join_kv, ctx_pos, np.asarray(noise_pos) %
                                 self.config.max_position_embeddings)


def test_a_position_limit_is_named(pair):
    target, _ = pair
    prompts = [p[:40] for p in HELD_OUT]  # anchors 40..103 with 64 new tokens
    d = _WrappedPositions.from_pretrained(DEMO / "drafter", target)
    d.config = dataclasses.replace(d.config, max_position_embeddings=64)
    assert position_limits(target, d)[0] == ("drafter max_position_embeddings", 64)
    f = context_limit_check(target, d, prompts, 64)
    assert (f.name, f.status) == ("context limit", "warn"), f.message
    assert f.message.endswith("acceptance falls past drafter max_position_embeddings 64")
    assert f.line() in DOC


def test_the_shipped_pair_reaches_no_limit(pair):
    target, drafter = pair
    assert [at for _, at in position_limits(target, drafter)] == [4096, 4096]  # config.json
    f = context_limit_check(target, drafter, PROMPTS[:2], 16)
    assert f.status == "ok" and "no limit inside" in f.message, f.message
    assert "no speculative step" in context_limit_check(target, drafter, PROMPTS[:1], 1).message


def test_shifted_layer_ids_are_named(pair, tmp_path):
    target, _ = pair
    shutil.copytree(DEMO / "drafter", tmp_path / "d")
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    cfg["dflash_config"]["target_layer_ids"] = [0, 1]  # trained on [1, 2]
    (tmp_path / "d" / "config.json").write_text(json.dumps(cfg))
    target.set_target_layer_ids(None)  # the drafter sets them, as on a fresh load
    try:
        shifted = DFlashDrafter.from_pretrained(tmp_path / "d", target)
        assert target.target_layer_ids == [0, 1]
        f = layer_offset_check(target, shifted, PROMPTS)
    finally:
        target.set_target_layer_ids([1, 2])
    assert (f.name, f.status) == ("layer offset", "warn"), f.message
    assert f.message.endswith("the ids look off by +1")
    assert "[-1, 0] (-1): outside the target" in f.message
    assert f.line() in DOC


def test_the_shipped_layer_ids_are_not_flagged(pair):
    target, drafter = pair
    f = layer_offset_check(target, drafter, PROMPTS[:8])
    assert f.status == "ok", f.message
    assert list(target.target_layer_ids) == [1, 2]  # restored
    assert f.line() in DOC


# ------------------------------------------------------------------------------ explain


def test_explain_runs_the_field_checks_and_prints_them(pair):
    target, drafter = pair
    seen = []

    def check(t, d, p):
        seen.append((t, d, p))
        return FieldFinding("planted", "warn", "one sentence")

    report = explain(target, drafter, PROMPTS[:1], 8, ablations=(), field=[check])
    assert seen == [(target, drafter, PROMPTS[:1])]
    assert report.extra == [FieldFinding("planted", "warn", "one sentence")]
    assert "\n  field planted          warn one sentence\n" in report.summary()


def test_explain_cli_field_flag(capsys):
    text = "\tdef put(self, item):\n\t\treturn self._put(item)\n"
    rc = main(["explain", "--target", str(DEMO / "target"), "--drafter", str(DEMO / "drafter"),
               "--text", text, "--text", text[1:], "--ablations", "none", "--max-new-tokens",
               "12", "--field"])
    out = capsys.readouterr().out
    assert rc == 0
    for name in ("layer offset", "context limit", "quantized target", "template"):
        assert f"\n  field {name:16s} " in out  # every standard check ran and printed its line
    assert "Q4_K vs as loaded" in out


def test_thinking_on_a_template_without_a_switch_is_served_as_chat(pair, demo_tokenizer):
    target, drafter = pair
    plain = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"  # no enable_thinking
    text = bytes(PROMPTS[0]).decode()
    assert list(renderings(demo_tokenizer, text, plain)) == ["raw", "chat"]
    f = template_check(target, drafter, [text], demo_tokenizer, "chat, thinking", trained="raw",
                       template=plain, max_new_tokens=8)
    assert "served (chat) vs raw (as trained)" in f.message
