"""What Gemma 2 / 3 / 4 add to the reference decoder layer: sandwich norms and the GeGLU MLP.

Gemma norms both sides of each sub-block (huggingface/transformers
``models/gemma3/modeling_gemma3.py``, ``Gemma3DecoderLayer``)::

    x = x + post_attention_layernorm(attn(input_layernorm(x)))
    x = x + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(x)))

so each residual add of the layer is a :class:`PostNormAddNorm`: the sub-block's own norm, the
add, then the norm that reads the sum (the layer,
:class:`~dflash_ref.models.layers.DecoderLayer`, does not change;
:class:`~dflash_ref.models.fused.FusedPostNormAddNorm` is the same as one ``norm_add_rms_norm``).
The MLP's activation is GELU with the tanh approximation (HF ``gelu_pytorch_tanh``): written out
in :func:`gelu_tanh`, and run as the ``geglu`` op (``gelu_tanh(g) * up``, one launch on CuPy;
equal to the written-out form bit for bit on NumPy, tests/ops/test_activations.py).
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


class PostNormAddNorm:
    """A Gemma sandwich norm and the residual add after it: ``(x, b) -> (m, x + m, norm(x + m))``
    with ``m = post_norm(b)``, b what the mixer or the feed-forward returned (a residual add of
    :class:`~dflash_ref.models.layers.DecoderLayer`)."""

    def __init__(self, post_norm, norm):
        self.post_norm, self.norm = post_norm, norm

    def __call__(self, x, b, batch):
        """x, b [T, H] (``batch`` unused) -> three [T, H]."""
        m = self.post_norm(b)
        x = x + m
        return m, x, self.norm(x)
