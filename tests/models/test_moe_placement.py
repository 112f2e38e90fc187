"""Which layers of a Qwen MoE model are sparse, and what ``norm_topk_prob`` does.

The oracle is transformers 5.23.0 read by hand:

- ``Qwen3NextDecoderLayer`` (``models/qwen3_next/modeling_qwen3_next.py``): a layer gets the
  sparse block iff ``layer_idx not in mlp_only_layers and (layer_idx + 1) % decoder_sparse_step
  == 0``, else the dense MLP; ``Qwen3NextTopKRouter`` renormalises the top-k softmax weights only
  if ``norm_topk_prob``.
- ``Qwen3_5MoeDecoderLayer`` / ``Qwen3_5MoeTopKRouter``: every layer sparse, always
  renormalised; the keys are not read, so dflash-ref refuses a Qwen3.5 config that sets them.

Every test config so far had step 1 and renormalised: a placement off by one layer or a
``norm_topk_prob`` that is parsed and never read left the suite green.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from dflash_ref.backend import get_backend
from dflash_ref.config import TargetConfig
from dflash_ref.config.schema import expected_tensors, moe_expected_tensors
from dflash_ref.errors import ConfigError
from dflash_ref.models.moe import QwenSparseMoE, route_top_k
from tests.models.test_hf_fixtures import FIXTURES


def tiny_qwen3_next(**over) -> dict:
    """The qwen35_moe fixture's sizes as a Qwen3-Next config (dense MLP width 16)."""
    c = json.loads((FIXTURES / "qwen35_moe" / "config.json").read_text())
    c.update(architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next",
             intermediate_size=16, **over)
    return c


def hf_is_sparse(layer: int, step: int, mlp_only: list[int]) -> bool:
    """Qwen3NextDecoderLayer's rule, copied from transformers."""
    return layer not in mlp_only and (layer + 1) % step == 0


@pytest.mark.parametrize("step, mlp_only", [(2, [3]), (3, []), (2, [])])
def test_moe_sparse_step_above_1_places_experts_on_the_layers_transformers_does(step, mlp_only):
    """Config and tensor schema (what a loader checks): sparse layers hold the experts and no
    dense MLP, dense layers the reverse. (The model itself refuses Qwen3-Next MoE blocks.)"""
    cfg = TargetConfig.from_hf(tiny_qwen3_next(decoder_sparse_step=step,
                                               mlp_only_layers=mlp_only))
    expected = [hf_is_sparse(i, step, mlp_only) for i in range(4)]
    assert [cfg.moe.is_moe_layer(i) for i in range(4)] == expected
    assert [cfg.mlp_width_for(i) is None for i in range(4)] == expected
    t = expected_tensors(cfg)
    prefix = cfg.weight_prefix
    for i in range(4):
        assert (f"{prefix}layers.{i}.mlp.gate.weight" in t) == expected[i]
        assert (f"{prefix}layers.{i}.mlp.gate_proj.weight" in t) == (not expected[i])
    by_hand = {(2, (3,)): [False, True, False, False], (3, ()): [False, False, True, False],
               (2, ()): [False, True, False, True]}
    assert expected == by_hand[(step, tuple(mlp_only))]


def sparse_block(norm_topk_prob: bool):
    """One Qwen sparse block of a Qwen3-Next config, random weights (4 experts, top 2)."""
    cfg = TargetConfig.from_hf(tiny_qwen3_next(norm_topk_prob=norm_topk_prob))
    rng = np.random.default_rng(0)
    w = {k: (rng.standard_normal(shape)).astype(np.float32)
         for k, shape in moe_expected_tensors(cfg).items()}
    return QwenSparseMoE(cfg, get_backend("numpy"), 0, w), cfg


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_moe_norm_topk_prob_is_honoured_like_qwen3_next_router(norm_topk_prob):
    block, cfg = sparse_block(norm_topk_prob)
    assert cfg.moe.norm_topk_prob is norm_topk_prob
    u = np.random.default_rng(1).standard_normal((5, cfg.hidden_size)).astype(np.float32)
    seen = {}
    block(u, u, SimpleNamespace(tap=lambda layer, name, x: seen.setdefault(name, np.asarray(x))))
    logits = seen["router_logits"].astype(np.float64)  # [T, E]
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)  # float64 softmax
    ids = seen["experts"]
    assert np.array_equal(ids, np.argsort(-p, axis=1, kind="stable")[:, :2])
    expected = np.take_along_axis(p, ids, axis=1)  # the top-k probabilities
    if norm_topk_prob:
        expected /= expected.sum(1, keepdims=True)
    np.testing.assert_allclose(seen["expert_weights"], expected, rtol=1e-5)
    if not norm_topk_prob:  # 2 of 4 experts: the raw top-2 mass is below 1
        assert (seen["expert_weights"].sum(1) < 0.99).any()


def test_moe_route_top_k_without_renormalisation_by_hand():
    # p = 0.1, 0.2, 0.3, 0.4: top-2 = experts 3, 2 with their raw probabilities 0.4, 0.3
    logits = np.log(np.array([[1.0, 2.0, 3.0, 4.0]], np.float32))
    w, ids = route_top_k(np, logits, 2, renormalise=False)
    assert ids.tolist() == [[3, 2]]
    np.testing.assert_allclose(w, [[0.4, 0.3]], rtol=1e-6)


@pytest.mark.parametrize("key, value", [("norm_topk_prob", False), ("decoder_sparse_step", 2),
                                        ("mlp_only_layers", [1])])
def test_moe_qwen35_refuses_the_keys_transformers_ignores(key, value):
    c = json.loads((FIXTURES / "qwen35_moe" / "config.json").read_text())
    with pytest.raises(ConfigError, match=rf"{key}=.*Qwen3\.5 MoE.*remove the keys"):
        TargetConfig.from_hf({**c, key: value})
    TargetConfig.from_hf({**c, "norm_topk_prob": True, "decoder_sparse_step": 1})  # defaults: fine
