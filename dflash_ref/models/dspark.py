"""DSpark: a DFlash drafter with a low-rank Markov head and a confidence head (docs/drafter.md,
"DSpark"; docs/interop.md).

The source is llama.cpp, the first implementation to run it (build 11434: ``src/models/dflash.cpp``,
``build_dspark_markov_head``; ``common/speculative.cpp``, ``draft-dspark``;
``conversion/qwen.py``, ``DSparkModel``; ``docs/speculative.md``). DSpark keeps DFlash's one
forward per block and adds back some of the left-to-right signal that block diffusion loses: each
block row's draft logits get a bias keyed on the token before it, and that token is the previous
row's (biased) argmax, so the rows are chained:

    prev_0 = anchor                                         the last committed token
    l'_i   = l_i + W2 W1[prev_i]                            [V]; W1 [V, R], W2 [V, R], R << V
    d_i    = argmax l'_i,   prev_{i+1} = d_i                i = 0 .. n-1
    conf_i = sigmoid(w_c . [z_i ; W1[prev_i]] + b_c)       optional; z_i the final-normed row

**Anchor first.** A DSpark block reads its drafts from every row, the anchor's included: row i
(position s + i) drafts the token at s + i + 1, where DFlash reads rows 1..n-1 (llama.cpp
``sample_from_anchor``, true for the DeepSpec / DFlash-lineage exports this class reads). So the
``n_rows`` block the loop asks for (``[anchor, d_1 .. d_{n-1}]``) is drafted by a forward over
``n - 1`` rows ``[anchor, MASK x (n-2)]`` at positions s .. s+n-2: :meth:`block_rows` says so,
and every other piece (encoder, layers, cache, loop) is DFlash's, unchanged. With block size 8
that is 7 drafts from 7 rows, what llama.cpp drafts with ``--spec-draft-n-max 7``.

The chain is greedy (llama.cpp builds it in the graph with argmax; sampling would change only the
final pick), so DSpark drafts greedily: a sampled law is refused. ``conf`` predicts whether row i
will be accepted; llama.cpp truncates a draft at the first row under ``--spec-draft-p-min`` (off
by default). :meth:`confidence` computes it; the loop does not truncate (the default).

Not read: a reduced draft vocabulary (``d2t``), the ``markov_w2.scale`` of quantized exports,
``sample_from_anchor = false`` (SpecForge's bonus-anchor exports) and non-"vanilla" Markov heads.
"""

from __future__ import annotations

import numpy as np

from dflash_ref.config import DrafterConfig
from dflash_ref.errors import ConfigError, FormatError
from dflash_ref.io.names import (
    CONF_B,
    CONF_W,
    DSPARK_HEAD_PREFIXES,
    MARKOV_W1,
    MARKOV_W2,
    dspark_head_shapes,
)
from dflash_ref.models.drafter import DFlashDrafter
from dflash_ref.models.target import TargetModel
from dflash_ref.ops.sampling import DraftProposal, SamplingParams


class DSparkDrafter(DFlashDrafter):
    """A DSpark drafter: DFlash plus the Markov and confidence heads (module docstring).

    ``DFlashDrafter.from_pretrained`` / ``from_gguf`` return one for a DSpark config
    (``DSparkDraftModel``); its checkpoint holds the DFlash tensors and the heads.
    """

    kind = "dspark"

    def __init__(self, config: DrafterConfig, weights: dict, target: TargetModel):
        if config.raw.get("markov_head_type", "vanilla") != "vanilla":
            raise ConfigError(f"markov_head_type {config.raw['markov_head_type']!r}: only "
                              "'vanilla' is defined (llama.cpp refuses the others too)")
        if config.raw.get("sample_from_anchor", True) is not True:
            raise ConfigError("sample_from_anchor = false (a bonus-anchor export) is not read; "
                              "dflash-ref's DSpark drafts from the anchor row (module docstring)")
        heads = {k: v for k, v in weights.items() if k.startswith(DSPARK_HEAD_PREFIXES)}
        rest = {k: v for k, v in weights.items() if k not in heads}
        vocab = config.vocab_size or target.config.vocab_size
        problems = dspark_head_shapes({k: tuple(v.shape) for k, v in heads.items()},
                                      config.hidden_size, vocab)
        if problems:
            raise FormatError("DSpark drafter: " + "; ".join(problems))
        super().__init__(config, rest, target)
        xp = self.be.xp
        h = {k: xp.asarray(v, dtype=xp.float32) for k, v in heads.items()}
        self.markov_w1, self.markov_w2 = h[MARKOV_W1], h[MARKOV_W2]  # [V, R] each
        self.conf_w, self.conf_b = h.get(CONF_W), h.get(CONF_B)      # [1, H+R], [1] or None

    @property
    def has_confidence_head(self) -> bool:
        return self.conf_w is not None

    def block_rows(self, n_rows: int | None) -> int:
        """An ``n``-row block ``[anchor, d_1 .. d_{n-1}]`` is drafted by ``n - 1`` rows (anchor
        first: row i drafts d_{i+1}); at least the anchor row."""
        return max(super().block_rows(n_rows) - 1, 1)

    def embed_block(self, anchor_token: int, n_rows: int | None = None):
        """``[anchor, MASK x (n-1)]`` embedded, [n, H]: ``n_rows`` is the row count already
        (:meth:`block_rows` applied once, by the forward), the default that of a B block."""
        n = self.block_rows(None) if n_rows is None else int(n_rows)
        return self.embed_ids(self.be.xp.asarray(self.block_ids(anchor_token, n)))

    def markov_bias(self, prev: int):
        """``W2 W1[prev]``: the Markov head's bias on the next row's logits, [V]."""
        return self.markov_w2 @ self.markov_w1[int(prev)]

    def chain(self, logits, anchor_token: int):
        """The biased logits of every row and the chained argmax: ([n, V] float32, [n] int64).

        Row i is biased by the Markov head at ``prev_i`` (the anchor, then row i-1's argmax).
        """
        xp = self.be.xp
        rows, tokens, prev = [], [], int(anchor_token)
        for i in range(logits.shape[0]):
            row = logits[i] + self.markov_bias(prev)  # [V]
            prev = int(xp.argmax(row))
            rows.append(row)
            tokens.append(prev)
        return xp.stack(rows), np.asarray(tokens, dtype=np.int64)

    def confidence(self, hidden, logits, anchor_token: int):
        """``sigmoid(w_c . [z_i ; W1[prev_i]] + b_c)`` per row, [n] (None without the head)."""
        if self.conf_w is None:
            return None
        xp = self.be.xp
        _, tokens = self.chain(logits, anchor_token)
        prev = np.concatenate([[int(anchor_token)], tokens[:-1]])  # [n]
        feat = xp.concatenate([hidden, self.markov_w1[xp.asarray(prev)]], axis=1)  # [n, H+R]
        z = feat @ self.conf_w[0]
        if self.conf_b is not None:
            z = z + self.conf_b[0]
        return 1.0 / (1.0 + xp.exp(-z))

    def propose(self, hidden, logits, anchor_token: int, law: SamplingParams | None = None,
                rng=None) -> DraftProposal:
        """The chained argmax of every row (:meth:`chain`): tokens [n] for a block of n + 1."""
        if law is not None and not law.greedy:
            raise ConfigError("a DSpark drafter drafts greedily (its Markov chain is an argmax, "
                              "as in llama.cpp); use greedy decoding, or a DFlash drafter for "
                              "sampled drafts")
        return DraftProposal(self.chain(logits, anchor_token)[1])


__all__ = ["DSparkDrafter"]
