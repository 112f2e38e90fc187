"""The relevance scorer wired into the target, the pager and generate: the target's q/k probe,
ModelTailScorer, the pager's cadence (max(tau, history // 45), hand-listed), the hook's
lifetime, and generate calling the pager after every step (plain and speculative)."""

from __future__ import annotations

import numpy as np
import pytest

from dflash_ref.errors import ConfigError, PagerError
from dflash_ref.kvflash import KVFlashPager
from dflash_ref.kvflash.scorers import LRUScorer, ModelTailScorer
from dflash_ref.models.target import TargetModel
from dflash_ref.spec_decode.loop import generate
from dflash_ref.testing import assert_close
from dflash_ref.tiny import write_tiny_target
from tests.spec_decode.drafters import ScriptedDrafter

CHUNK = dict(chunk_tokens=8, sink_chunks=1, tail_window_chunks=1)


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    root = tmp_path_factory.mktemp("wiring")
    out = {fam: TargetModel.from_pretrained(write_tiny_target(root / fam, fam, seed=41))
           for fam in ("qwen3", "qwen3_5")}
    # Capturing features, for speculative decoding with a scripted drafter.
    out["qwen3_capture"] = TargetModel.from_pretrained(root / "qwen3", target_layer_ids=[0, 2])
    return out


def _ids(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, size=n)


class SpyScorer:
    """Records each rescore's history; returns fixed random chunk scores (or None)."""

    def __init__(self, give_scores: bool = True):
        self.histories, self.give_scores = [], give_scores
        self.rng = np.random.default_rng(0)

    def chunk_scores(self, history_ids, chunk_tokens=64):
        self.histories.append(np.array(history_ids))
        n = -(-len(history_ids) // chunk_tokens)
        return self.rng.normal(size=n) if self.give_scores else None


# ---------------------------------------------------------------- the target's q/k probe


def _rms(x, w, eps):
    x = x.astype(np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def test_attention_qk_pre_rope_matches_an_independent_computation(targets):
    # Layer 0 of Qwen3: k = k_norm(rms_norm(embed(ids)) @ Wk^T per head), before RoPE; the
    # tail queries likewise with Wq and q_norm. Float64 NumPy from the weights, no model code.
    t = targets["qwen3"]
    cfg, w = t.config, t.layers[0].w
    ids = _ids(37)
    q_tail, keys = t.attention_qk(ids, n_tail=5, layers=[0], piece_tokens=16)
    x = _rms(t.embed_tokens[ids], w["input_layernorm.weight"], cfg.rms_norm_eps)  # [S, 64]
    k = (x @ w["self_attn.k_proj.weight"].T).reshape(37, 2, 16)
    q = (x[-5:] @ w["self_attn.q_proj.weight"].T).reshape(5, 4, 16)
    k = _rms(k, w["self_attn.k_norm.weight"], cfg.rms_norm_eps)
    q = _rms(q, w["self_attn.q_norm.weight"], cfg.rms_norm_eps)
    assert q_tail.shape == (1, 5, 4, 16) and keys.shape == (1, 37, 2, 16)
    assert_close(keys[0], k, "float32_attention", op="attention_qk", tensor="keys")
    assert_close(q_tail[0], q, "float32_attention", op="attention_qk", tensor="q_tail")


def test_attention_qk_post_rope_keys_are_the_cache_keys(targets):
    # With rope=True the recorded keys are exactly what the KV cache holds, every layer (same
    # 13-token pieces, so the same matmul shapes and the same rounding).
    t = targets["qwen3"]
    ids = _ids(40, seed=1)
    _, keys = t.attention_qk(ids, rope=True, piece_tokens=13)
    state = t.new_state()
    for a in range(0, 40, 13):
        t.forward(ids[a:a + 13], state)
    assert keys.shape == (4, 40, 2, 16)
    for i in range(4):
        np.testing.assert_array_equal(keys[i], t.be.to_numpy(state.kv[i].k))


def test_attention_qk_layers_and_errors(targets):
    t = targets["qwen3_5"]  # layers: GDN, GDN, GDN, full attention
    q_tail, keys = t.attention_qk(_ids(20), n_tail=8)
    assert q_tail.shape == (1, 8, 4, 32) and keys.shape == (1, 20, 2, 32)
    with pytest.raises(ConfigError, match="attention layers"):
        t.attention_qk(_ids(20), layers=[0])
    with pytest.raises(ValueError, match="n_tail"):
        t.attention_qk(_ids(5), n_tail=8)


def test_the_probe_leaves_the_forward_unchanged(targets):
    t = targets["qwen3"]
    ids = _ids(30, seed=2)
    ref = t.forward(ids, t.new_state()).logits
    state = t.new_state()
    from dflash_ref.models.qk_probe import QKProbe

    probe = QKProbe([0, 3], rope=False, n_tail=8)
    np.testing.assert_array_equal(t.forward(ids, state, tap=probe).logits, ref)


# ---------------------------------------------------------------- ModelTailScorer


def test_model_tail_scorer_shapes_short_histories_and_vocab(targets):
    scorer = ModelTailScorer(targets["qwen3"])
    assert scorer.chunk_scores(_ids(8), 8) is None  # fewer than lookahead + 1 tokens
    scores = scorer.chunk_scores(_ids(50), 8)
    assert scores.shape == (7,) and np.all(np.isfinite(scores))
    assert abs(np.mean(scorer.token_scores(_ids(50)))) < 1e-9  # z-normalised over the segment
    with pytest.raises(ValueError, match="vocab_clamp"):
        scorer.chunk_scores(np.append(_ids(20), 300), 8)


def test_model_tail_scorer_bisects_when_the_forward_runs_out_of_memory(targets):
    # A forward over more than 24 tokens "runs out of memory": a 40-token history is scored as
    # its left half (20 + the true last 8 ids = 28 tokens: fails again, halves to 14 + 8 and
    # 14) and its right half (20), as resilient_token_scores does; every token gets a score.
    t = targets["qwen3"]

    class SmallMemory:
        config = t.config

        def attention_qk(self, ids, **kw):
            if len(ids) > 24:
                raise MemoryError("simulated")
            return t.attention_qk(ids, **kw)

    scorer = ModelTailScorer(SmallMemory(), min_segment=8)
    scores = scorer.chunk_scores(_ids(40, seed=3), 8)
    assert scores.shape == (5,) and np.all(np.isfinite(scores))
    assert scorer.calls == 1 + 1 + 2 + 1  # 40 fails; 28 fails, 22 and 14 pass; 20 passes
    assert ModelTailScorer(SmallMemory(), min_segment=64).chunk_scores(_ids(40), 8) is None


# ---------------------------------------------------------------- the pager's cadence


def test_cadence_after_each_token_is_max_tau_history_over_45():
    # Prompt 400, tau 4: tau_eff = max(4, (400 + g) // 45) is 8 for g <= 4, 9 for 5 <= g <= 49,
    # 10 for g >= 50. Due when g % tau_eff == 0: 9, 18, 27, 36, 45 (multiples of 9), then 50
    # and 60 (multiples of 10); never at g <= 4 (no multiple of 8).
    spy = SpyScorer(give_scores=False)
    pager = KVFlashPager(32, **CHUNK, scorer=spy, tau=4)
    history = _ids(460, seed=4)
    for g in range(1, 61):
        pager.maybe_reselect(history[: 400 + g], g)
    fired = [len(h) - 400 for h in spy.histories]
    assert fired == [9, 18, 27, 36, 45, 50, 60]
    assert pager.stats.rescores == 7 and pager.stats.reselects == 0  # no scores, no reselect


def test_cadence_of_multi_token_steps_fires_once_per_passed_due_count():
    # tau 8, short history: due counts 8, 16, 24. Steps end at generated 1, 3, 9 (passes 8),
    # 10, 17 (passes 16), 24 (is 24), 40 (passes 32 and 40: fires once).
    spy = SpyScorer(give_scores=False)
    pager = KVFlashPager(32, **CHUNK, scorer=spy, tau=8)
    ends, fired, prev = [1, 3, 9, 10, 17, 24, 40], [], 0
    for g in ends:
        before = len(spy.histories)
        pager.maybe_reselect(_ids(10 + g), g, n_new=g - prev)
        if len(spy.histories) > before:
            fired.append(g)
        prev = g
    assert fired == [9, 17, 24, 40]


def test_the_scorer_hook_lives_for_one_request_and_a_user_hook_stays():
    pager = KVFlashPager(32, **CHUNK, scorer=SpyScorer(), tau=1)
    for start in range(0, 40, 8):  # 5 chunks: reselect has candidates
        pager.alloc_span(start, 8)
    pager.maybe_reselect(_ids(40), 1)
    assert pager.score_hook is not None and pager.stats.reselects == 1
    pager.reset()
    assert pager.score_hook is None
    user = KVFlashPager(32, **CHUNK, score_hook=lambda c: -np.asarray(c, float))
    user.reset()
    assert user.score_hook is not None
    with pytest.raises(PagerError, match="tau"):
        KVFlashPager(32, **CHUNK, tau=0)


def test_lru_scorer_never_reselects():
    pager = KVFlashPager(32, **CHUNK, scorer=LRUScorer(), tau=1)
    for start in range(0, 40, 8):  # 5 chunks: reselect has candidates
        pager.alloc_span(start, 8)
    assert pager.maybe_reselect(_ids(40), 1) == 0 and pager.score_hook is None
    assert pager.stats.rescores == 1 and pager.stats.reselects == 0


# ---------------------------------------------------------------- generate calls the pager


def test_generate_rescores_the_prompt_and_generated_ids_on_the_cadence(targets):
    t = targets["qwen3"]
    prompt = _ids(40, seed=5)
    spy = SpyScorer()
    res = generate(t, None, prompt, 30, pager=KVFlashPager(32, **CHUNK, scorer=spy, tau=8))
    # History 40 + g < 360, so tau_eff = 8: rescores after the 8th, 16th and 24th token, each
    # reading the prompt and the tokens generated so far.
    assert [len(h) - 40 for h in spy.histories] == [8, 16, 24]
    for h in spy.histories:
        np.testing.assert_array_equal(h, np.concatenate([prompt, res.tokens[: len(h) - 40]]))


def test_generate_speculative_steps_rescore_when_they_pass_a_due_count(targets):
    t = targets["qwen3_capture"]
    prompt = _ids(20, seed=6)
    truth = np.concatenate([prompt, generate(t, None, prompt, 60).tokens])
    spy = SpyScorer()
    pager = KVFlashPager(32, **CHUNK, scorer=spy, tau=8)
    res = generate(t, ScriptedDrafter(t, truth, 8, error_rate=0.3, seed=7), prompt, 40,
                   pager=pager)
    # Generated counts after each step: 1 from the prefill, then + (a + 1) per verify step.
    ends = np.cumsum([1] + res.acceptance_lengths)
    expected = [int(g) for g, p in zip(ends[1:], ends[:-1]) if g // 8 > p // 8 and g < 40]
    assert [len(h) - 20 for h in spy.histories] == expected and expected
    assert pager.stats.reselects == len(expected) and len(res.tokens) == 40
