"""Test doubles for the loop: drafters that know the target's true continuation.

A real tiny drafter with random weights is almost never accepted, which would leave the loop's
acceptance paths untested. :class:`ScriptedDrafter` has the drafter interface the loop uses
(``block_size``, ``target``, ``new_cache()`` with ``extend`` / ``forward_block``, ``propose``)
and drafts the known greedy continuation, corrupting each row with probability ``error_rate``
(the true token then falls to rank 2, so DDTree can still find it). With ``adversarial_token``
it always drafts that token.
"""

from __future__ import annotations

import numpy as np

from dflash_ref.ops.sampling import DraftProposal, sample_rows


class ScriptedDrafter:
    def __init__(self, target, truth, block_size: int, error_rate: float = 0.3, seed: int = 0,
                 adversarial_token: int | None = None):
        self.target, self.block_size = target, block_size
        self.truth = np.asarray(truth)  # prompt + the plain greedy continuation
        self.error_rate, self.adversarial_token = error_rate, adversarial_token
        self.rng = np.random.default_rng(seed)
        self.V = target.config.vocab_size

    def new_cache(self, window=None):
        return _ScriptedCache(self)

    def cache_for(self, state):
        return self.new_cache()

    def draft_tokens(self, logits):
        return np.argmax(self.target.be.to_numpy(logits)[1:], axis=-1).astype(np.int64)

    def draft_probs(self, logits, drafts, top_k):
        """As ``DFlashDrafter.draft_probs``: each draft's probability over its row's top_k."""
        from dflash_ref.models.draft_head import draft_probs
        return draft_probs(self.target.be, logits[1:], np.asarray(drafts), top_k)

    def propose(self, hidden, logits, anchor_token, law=None, rng=None) -> DraftProposal:
        """As ``DFlashDrafter.propose``: argmax rows, or one draw per row from ``law``."""
        if law is None or law.greedy:
            return DraftProposal(self.draft_tokens(logits))
        return sample_rows(self.target.be, logits[1:], law, rng)

    def logits_for(self, anchor_position: int):
        B, V = self.block_size, self.V
        logits = self.rng.normal(0.0, 0.1, (B, V)).astype(np.float32)
        for j in range(1, B):
            pos = anchor_position + j
            true = int(self.truth[pos]) if pos < self.truth.size else int(self.rng.integers(V))
            if self.adversarial_token is not None:
                logits[j, self.adversarial_token] = 10.0
                continue
            logits[j, true] = 10.0
            if self.rng.random() < self.error_rate:
                wrong = int(self.rng.integers(V))
                if wrong != true:
                    logits[j, wrong] = 12.0
        return self.target.be.to_backend(logits)


class _ScriptedCache:
    def __init__(self, drafter):
        self.drafter, self.length = drafter, 0

    def extend(self, features, positions):
        positions = np.asarray(positions)
        if positions.size:
            assert positions[0] == self.length, "features must arrive in position order"
            self.length = int(positions[-1]) + 1

    def forward_block(self, anchor_token, anchor_position, n_rows=None, with_hidden=False):
        assert anchor_position == self.length, "the drafter must see features up to s - 1"
        logits = self.drafter.logits_for(anchor_position)[:n_rows]  # [n, V]: rows of a B block
        return (logits, None) if with_hidden else logits


# Three families; gemma3 untied so its greedy text varies (tied tiny Gemmas repeat one token).
FAMILIES = {"qwen3": {}, "qwen3_5": {}, "gemma3": {"tie_word_embeddings": False}}


def tiny_pairs(root, target_seed: int, drafter_seed: int, block_size: int) -> dict:
    """family -> (TargetModel, its real tiny DFlashDrafter), written under ``root`` and loaded
    through the code a user runs (random weights: the drafter is almost never accepted)."""
    from dflash_ref.models.drafter import DFlashDrafter
    from dflash_ref.models.target import TargetModel
    from dflash_ref.tiny import write_tiny_drafter, write_tiny_target

    out = {}
    for fam, kw in FAMILIES.items():
        t = write_tiny_target(root / fam, fam, seed=target_seed, **kw)
        d = write_tiny_drafter(root / (fam + "_d"), t, seed=drafter_seed, block_size=block_size)
        target = TargetModel.from_pretrained(t)
        out[fam] = (target, DFlashDrafter.from_pretrained(d, target))
    return out
