"""What the pinned llama.cpp does with each fault ``check-gguf`` names (docs/check_gguf.md,
"What llama.cpp does with each fault").

Every plant of tests/io/test_check_gguf.py made on the demo pair in the llama.cpp naming (F32,
converted here) is run with ``llama-speculative-simple --spec-type draft-dflash`` (greedy, 32
tokens) beside the unplanted pair, and its outcome is one of:

- ``refuses``: a clean load error (exit 1);
- ``crashes``: killed by a signal (an assertion's abort, a segmentation fault);
- ``runs, fewer accepted``: the same text as the unplanted pair (up to the shorter one: a
  speculative run may stop a few tokens past ``-n``), fewer drafts accepted;
- ``runs, other text``: the target's own text changes;
- ``runs, unchanged``: the same text and counts (the fault is invisible at this length).

The ``runs`` rows are the faults only ``check-gguf`` catches.
"""

from __future__ import annotations

import re

import pytest

from tests.io.test_check_gguf import DEMO, PLANTS, plant

pytestmark = pytest.mark.llamacpp

# llama.cpp's logger may lose the summary on a loaded machine (harness.py, LlamaCpp.run): a run
# is cheap (0.2 s), so it is repeated more often than the harness's default until it arrives
TRIES = 20
PROMPT = "\tdef put(self, item, block=True, timeout=None):\n"
EXPECTED = {
    "tokenizer_missing": "refuses",
    "mask_token_missing": "crashes",
    "mask_token_past_vocab": "crashes",
    "ids_stored_raw_zero": "runs, fewer accepted",
    "ids_capture_the_last_layer": "crashes",
    "ids_out_of_range": "crashes",
    "ids_count_vs_fc": "refuses",
    "reduced_vocab_without_d2t": "refuses",
    "d2t_not_i64": "crashes",
    "d2t_length": "refuses",
    "width_mismatch": "crashes",
    "target_hidden_size_mismatch": "runs, unchanged",
    "vocab_size_mismatch": "runs, unchanged",
    "tokens_differ": "crashes",
    "unclaimed_bias": "refuses",
    "unclaimed_block_past_count": "refuses",
    "rope_base_missing": "runs, unchanged",
    "rope_base_differs": "runs, fewer accepted",
    "rope_scaling_differs": "runs, other text",
}
# (n_drafted, n_accept) the docs quote: the unplanted pair and the two "fewer accepted" rows
QUOTED = {"base": (36, 34), "ids_stored_raw_zero": (88, 20), "rope_base_differs": (85, 21)}
DEMO_PLANTS = [p for p in PLANTS if p[1] == "demo_llama.cpp"]


def run(llamacpp, target, drafter):
    """(return code, the text printed, (n_drafted, n_accept) or None)."""
    p = llamacpp.run("llama-speculative-simple", "-m", target, "-md", drafter, "--spec-type",
                     "draft-dflash", "--spec-draft-n-max", 7, "-n", 32, "-p", PROMPT, "--temp",
                     "0", "-t", "1", "-c", "512", check=False, until="n_accept", tries=TRIES)
    drafted = re.search(r"n_drafted\s*=\s*(\d+)", p.stderr_text)
    accepted = re.search(r"n_accept\s*=\s*(\d+)", p.stderr_text)
    counts = (int(drafted.group(1)), int(accepted.group(1))) if drafted and accepted else None
    return p.returncode, p.stdout.strip(b"\n"), counts


def outcome(result, base) -> str:
    rc, text, counts = result
    if rc < 0:
        return "crashes"
    if rc != 0:
        return "refuses"
    n = min(len(text), len(base[1]))  # a speculative run may stop a few tokens past -n
    if text[:n] != base[1][:n]:
        return "runs, other text"
    return "runs, fewer accepted" if counts[1] < base[2][1] else "runs, unchanged"


@pytest.fixture(scope="module")
def pair(llamacpp, tmp_path_factory):
    from dflash_ref.io.convert_drafter import convert_drafter
    from dflash_ref.io.convert_target import convert_target

    r = tmp_path_factory.mktemp("check_gguf_llamacpp")
    t = convert_target(DEMO / "target", r / "t.gguf", "f32")
    d = convert_drafter(DEMO / "drafter", r / "d.gguf", "f32", "llama.cpp",
                        target=DEMO / "target")
    base = run(llamacpp, t, d)
    assert base[0] == 0 and base[2] == QUOTED["base"], base
    return t, d, base


def test_the_table_covers_every_demo_plant():
    assert set(EXPECTED) == {p[0] for p in DEMO_PLANTS}


@pytest.mark.parametrize("pid, which, kw", [(p[0], p[2], p[3]) for p in DEMO_PLANTS],
                         ids=[p[0] for p in DEMO_PLANTS])
def test_what_llamacpp_does_with_each_planted_fault(llamacpp, pair, tmp_path, pid, which, kw):
    t, d, base = pair
    if which == "d":
        d = plant(d, tmp_path / "planted.gguf", **kw)
    else:
        t = plant(t, tmp_path / "planted.gguf", **kw)
    result = run(llamacpp, t, d)
    assert outcome(result, base) == EXPECTED[pid]
    if pid in QUOTED:
        assert result[2] == QUOTED[pid]
