"""The RoPE-base rule (:func:`dflash_ref.config.resolve_rope_theta`): nested beats top level,
null falls through, per-layer-type entries, and no default ever.

Expected values are the numbers written in the fixture dicts (docs/config.md, "The RoPE-base
rule"), never produced by dflash_ref.config itself.
"""

from __future__ import annotations

import pytest

from dflash_ref.config import (
    resolve_rope_theta,
)
from dflash_ref.errors import ConfigError
from tests.config.configs import FULL, SLIDING, raises


def test_rope_theta_nested_wins_over_top_level():
    cfg = {"rope_parameters": {"rope_theta": 10000000}, "rope_theta": 1000000}
    assert resolve_rope_theta(cfg) == 1e7


def test_rope_theta_top_level_legacy():
    assert resolve_rope_theta({"rope_theta": 1000000, "rope_scaling": None}) == 1e6


def test_rope_theta_genuine_1e6_accepted_nested_and_top_level():
    assert resolve_rope_theta({"rope_parameters": {"rope_theta": 1000000.0}}) == 1e6
    assert resolve_rope_theta({"rope_theta": 1000000.0}) == 1e6


def test_rope_theta_null_falls_through():
    cfg = {"rope_parameters": {"rope_theta": None, "rope_type": "default"}, "rope_theta": 5e5}
    assert resolve_rope_theta(cfg) == 5e5
    cfg = {"rope_parameters": None, "rope_theta": 10000}
    assert resolve_rope_theta(cfg) == 1e4


def test_rope_theta_int_becomes_float():
    theta = resolve_rope_theta({"rope_theta": 10000000})
    assert isinstance(theta, float) and theta == 1e7


@pytest.mark.parametrize("cfg", [
    {}, {"rope_parameters": {}}, {"rope_parameters": None, "rope_theta": None},
    {"rope_parameters": {"rope_theta": None}},
])
def test_rope_theta_missing_fails_naming_both_keys(cfg):
    with pytest.raises(ConfigError) as exc:
        resolve_rope_theta(cfg, where="drafter config.json")
    msg = str(exc.value)
    assert "drafter config.json" in msg
    assert "rope_parameters.rope_theta" in msg and "top-level rope_theta" in msg
    assert "Add one" in msg and "never assumes a default" in msg


def test_rope_theta_per_layer_type_entry():
    # transformers-5 keyed dict with a null flat theta (a Gemma-4-based drafter's config).
    cfg = {"rope_parameters": {"full_attention": {"rope_theta": 1000000},
                               "sliding_attention": {"rope_theta": 10000},
                               "rope_theta": None}}
    assert resolve_rope_theta(cfg, layer_type=FULL) == 1e6
    assert resolve_rope_theta(cfg, layer_type=SLIDING) == 1e4
    with raises("rope_parameters.rope_theta"):
        resolve_rope_theta(cfg)  # no layer type: only the flat places count


@pytest.mark.parametrize("bad", ["1e7", -1.0, 0, True, float("inf")])
def test_rope_theta_rejects_non_positive_or_non_numeric(bad):
    with raises("positive finite number"):
        resolve_rope_theta({"rope_theta": bad})
