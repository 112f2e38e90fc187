"""What Gemma 2 / 3 / 4 add to the reference decoder layer: sandwich norms and the GeGLU MLP.

Gemma norms both sides of each sub-block (huggingface/transformers
``models/gemma3/modeling_gemma3.py``, ``Gemma3DecoderLayer``)::

    x = x + post_attention_layernorm(attn(input_layernorm(x)))
    x = x + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(x)))

so the layer's mixer and feed-forward are :class:`PostNormed`: the sub-block, then its own norm
(the reference layer, :class:`~dflash_ref.models.layers.DecoderLayer`, does not change). The
MLP's activation is GELU with the tanh approximation (HF ``gelu_pytorch_tanh``).
"""

from __future__ import annotations

import numpy as np


def gelu_tanh(xp, g):
    """GELU with the tanh approximation (HF ``gelu_pytorch_tanh``):
    ``0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))``."""
    c = xp.float32(np.sqrt(2.0 / np.pi))
    return 0.5 * g * (1.0 + xp.tanh(c * (g + xp.float32(0.044715) * g * g * g)))


class GeGLU:
    """The gated MLP's activation ``gelu_tanh(g) * up`` (g, up [T, F] -> [T, F])."""

    def __init__(self, xp):
        self.xp = xp

    def __call__(self, g, up):
        return gelu_tanh(self.xp, g) * up


class PostNormed:
    """A sub-block followed by its own norm: ``post_norm(block(*args))`` (a Gemma sandwich norm
    around a mixer or a feed-forward; same call interface as the block it wraps)."""

    def __init__(self, block, post_norm):
        self.block, self.post_norm = block, post_norm

    def __call__(self, *args):
        return self.post_norm(self.block(*args))
