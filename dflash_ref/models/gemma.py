"""What Gemma 2 / 3 / 4 add to the reference decoder layer: sandwich norms and the GeGLU MLP.

Gemma norms both sides of each sub-block (huggingface/transformers
``models/gemma3/modeling_gemma3.py``, ``Gemma3DecoderLayer``)::

    x = x + post_attention_layernorm(attn(input_layernorm(x)))
    x = x + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(x)))

so the layer's mixer and feed-forward are :class:`PostNormed`: the sub-block, then its own norm
(the reference layer, :class:`~dflash_ref.models.layers.DecoderLayer`, does not change). The
MLP's activation is GELU with the tanh approximation (HF ``gelu_pytorch_tanh``): written out in
:func:`gelu_tanh`, and run as the ``geglu`` op (``gelu_tanh(g) * up``, one launch on CuPy; equal
to the written-out form bit for bit on NumPy, tests/ops/test_activations.py).
"""

from __future__ import annotations

import numpy as np


def gelu_tanh(xp, g):
    """GELU with the tanh approximation (HF ``gelu_pytorch_tanh``, i.e. PyTorch's
    ``gelu(g, approximate="tanh")``): ``0.5 g (1 + tanh(z))`` with
    ``z = sqrt(2/pi) (g + 0.044715 g^3)``.

    Evaluated as ``g * sigmoid(2 z) = g / (1 + exp(-2 z))``, the same function in real arithmetic
    (``1 + tanh(z) = 2 / (1 + exp(-2 z))``) without the cancellation of ``1 + tanh(z)`` in float32:
    at ``g = -9.9`` (``tanh(z) ~ -1 + 1e-37``) the sum keeps no correct digit, the quotient keeps
    them all. ``exp`` overflows to ``inf`` below ``g ~ -10.3``, where the quotient is ``-0`` (the
    true value is under 1e-37).
    """
    c = xp.float32(2.0 * np.sqrt(2.0 / np.pi))
    two_z = c * (g + xp.float32(0.044715) * g * g * g)  # 2 z, shape of g
    with np.errstate(over="ignore"):  # exp(-2 z) = inf for g < -10.3: g / inf = -0, as it should
        return g / (1.0 + xp.exp(-two_z))


class PostNormed:
    """A sub-block followed by its own norm: ``post_norm(block(*args))`` (a Gemma sandwich norm
    around a mixer or a feed-forward; same call interface as the block it wraps)."""

    def __init__(self, block, post_norm):
        self.block, self.post_norm = block, post_norm

    def __call__(self, *args):
        return self.post_norm(self.block(*args))
