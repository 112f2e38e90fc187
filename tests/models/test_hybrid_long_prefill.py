"""A Qwen3.5 hybrid after a prefill longer than the GDN trace limit (TRACE_MAX_TOKENS = 64).

A long prefill takes the chunked scan and keeps no per-token trace, so nothing it returns is
checked by a rewind; what must hold is that every Gated DeltaNet layer carries its state (the
recurrent matrix and the conv tail) out of that batch into the decode steps and verify batches
that follow. Every logit is compared with the independent float64 forward in
tests/models/oracle.py run over the whole committed sequence from position 0.
"""

from __future__ import annotations

import json

import numpy as np
from safetensors.numpy import load_file

from dflash_ref.models.target import TargetModel
from dflash_ref.testing import Tolerance, assert_close
from dflash_ref.tiny import write_tiny_target
from tests.models.oracle import qwen35_forward

# float32 model (chunked scan over 150 tokens, then recurrent steps) vs the float64 per-token
# delta rule; the GDN state is a decaying average, so errors do not grow with the length.
VS_ORACLE = Tolerance(2e-4, 2e-4, "float32 chunked + recurrent GDN vs float64 oracle, 160 tokens")
N_PROMPT = 150


def test_long_prefill_then_decode_matches_oracle(tmp_path):
    path = write_tiny_target(tmp_path / "h", "qwen3_5", seed=17)
    config = json.loads((path / "config.json").read_text())
    assert config["layer_types"].count("linear_attention") == 3
    tensors = load_file(path / "model.safetensors")
    ids = np.random.default_rng(3).integers(0, 256, size=N_PROMPT + 16)
    model = TargetModel.from_pretrained(path)
    state = model.new_state()
    to_np = model.be.to_numpy
    prefill = to_np(model.forward(ids[:N_PROMPT], state).logits)  # one batch of 150 > 64 tokens
    decode = [to_np(model.forward(ids[t:t + 1], state).logits)
              for t in range(N_PROMPT, N_PROMPT + 3)]  # three single-token steps
    verify = to_np(model.forward(ids[N_PROMPT + 3:N_PROMPT + 11], state).logits)  # 8 rows
    state.rollback(N_PROMPT + 6)  # keep 3 of the 8 verify rows (rewind inside that batch)
    assert state.length == N_PROMPT + 6
    # After the rollback, a different continuation from position N + 6.
    tail_ids = np.array([7, 77, 177, 27, 127])
    tail = to_np(model.forward(tail_ids, state).logits)

    # Oracle 1: prompt + 3 decoded + all 8 verify tokens.
    seq_a = ids[:N_PROMPT + 11]
    _, ref_a = qwen35_forward(config, tensors, seq_a)
    got_a = np.concatenate([prefill, *decode, verify])
    assert_close(got_a, ref_a, VS_ORACLE, op="TargetModel.forward", tensor="logits",
                 case="prefill 150, decode 3, verify 8")
    # Oracle 2: the committed prefix (3 verify rows kept) then the new tail.
    seq_b = np.concatenate([ids[:N_PROMPT + 6], tail_ids])
    _, ref_b = qwen35_forward(config, tensors, seq_b)
    assert_close(tail, ref_b[N_PROMPT + 6:], VS_ORACLE, op="TargetModel.forward",
                 tensor="logits", case="after rollback to N + 6")
