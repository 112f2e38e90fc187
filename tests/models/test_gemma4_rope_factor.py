"""Gemma 4's proportional RoPE with a scaling factor, from config.json to the rotation.

No earlier test config had a ``factor`` on a proportional layer type, so a factor parsed and then
dropped (or applied to the zero frequencies only, or to the default layers) left the suite green.
The oracle is transformers 5.23.0's ``_compute_proportional_rope_parameters``
(``src/transformers/modeling_rope_utils.py``) written out in float64 here::

    inv_freq_i = theta^(-2i / head_dim) / factor      i < int(partial_rotary_factor * head_dim // 2)
    inv_freq_i = 0                                    up to head_dim / 2

and ``apply_rotary_pos_emb`` with ``rotate_half`` over the whole head: channel i pairs with
i + head_dim / 2.
"""

from __future__ import annotations

import numpy as np

from dflash_ref.backend import get_backend
from dflash_ref.config import TargetConfig
from dflash_ref.models.batch_arrays import BatchArrays
from dflash_ref.models.gemma4 import ProportionalRope
from tests.config.configs import gemma4_31b

FACTOR = 8.0


def gemma4_with_factor() -> dict:
    c = gemma4_31b()
    full = c["text_config"]["rope_parameters"]["full_attention"]
    full["factor"] = FACTOR
    return c


def closed_form(x, positions, theta, head_dim, prf, factor):
    """transformers' proportional RoPE in float64. x [T, h, d]."""
    angles = int(prf * head_dim // 2)
    inv = np.zeros(head_dim // 2)
    inv[:angles] = theta ** (-np.arange(0, 2 * angles, 2) / head_dim)
    inv /= factor
    a = positions[:, None].astype(np.float64) * inv[None, :]  # [T, d/2]
    cos, sin = np.cos(a)[:, None, :], np.sin(a)[:, None, :]
    x1, x2 = x[..., : head_dim // 2], x[..., head_dim // 2:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def test_gemma4_proportional_rope_factor_reaches_the_rotation():
    cfg = TargetConfig.from_hf(gemma4_with_factor())
    glob, loc = cfg.rope_for(5), cfg.rope_for(0)
    assert (glob.rope_type, glob.factor) == ("proportional", FACTOR)
    assert (loc.rope_type, loc.factor) == ("default", 1.0)  # the sliding layers keep theirs
    rng = np.random.default_rng(0)
    T, h, d = 5, 2, glob.head_dim
    positions = np.array([0, 1, 7, 300, 2049])
    x = rng.standard_normal((T, h, d)).astype(np.float32)
    be = get_backend("numpy")
    arrays = BatchArrays(be, np.zeros(T, np.int64), positions, start=0)
    got = ProportionalRope(be, glob)(x, arrays)
    expected = closed_form(x.astype(np.float64), positions, 1e6, d, 0.25, FACTOR)
    # float32 angles (HF computes them in float32 too): |pos * inv| <= 2049 / 8, error ~1e-5
    np.testing.assert_allclose(got, expected, atol=2e-4, rtol=1e-4)
    # and the factor matters here: without it the rotation is far from this one
    unscaled = closed_form(x.astype(np.float64), positions, 1e6, d, 0.25, 1.0)
    assert np.abs(unscaled - expected).max() > 0.5
