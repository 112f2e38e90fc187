"""Several sequences at once: prefill and verify every active sequence in one target forward.

:func:`generate_batch` is :func:`~dflash_ref.spec_decode.loop.generate` for a list of prompts.
Each sequence keeps its own state, drafter cache, acceptance and finish time; per step::

    blocks = [seq.draft_block() for seq in active]          # the drafter, per sequence
    outs   = forward_batch(target, blocks, states)           # ONE target forward for all
    for seq, block, out in ...: seq.accept_chain(block, out) # verify, rollback, emit

Sequences of different lengths sit at their own positions (ragged), and a sequence that has
finished leaves the batch. Each sequence emits exactly the tokens and acceptance lengths of its
own single-sequence run (tests/spec_decode/test_batch.py); its features never reach another
sequence's drafter (models/batch.py keeps every state's rows apart).

Scope of this reference: chain verify, greedy or sampled (one seed per sequence), no gate, no
pager. The drafter runs once per sequence, and GDN layers loop over sequences inside the
forward; a device path without those loops is future work.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dflash_ref.errors import ConfigError
from dflash_ref.models.batch import forward_batch
from dflash_ref.spec_decode.loop import GenerationResult, _check_arguments, _Decoding
from dflash_ref.spec_decode.sampling import SamplingParams


def generate_batch(target, drafter, prompts: Sequence, max_new_tokens: int,
                   temperature: float = 0.0, block_size: int | None = None, seeds=None,
                   stop_token_ids: Sequence[int] | None = None) -> list[GenerationResult]:
    """Generate after each of ``prompts`` (see the module docstring); one result per prompt.

    Args:
        target, drafter, max_new_tokens, temperature, block_size, stop_token_ids: as for
            :func:`~dflash_ref.spec_decode.loop.generate` (drafter None: plain decoding).
        prompts: a list of [N_j] token-id sequences (different lengths are fine).
        seeds: one seed per prompt when temperature > 0 (sequence j samples as
            ``generate(..., seed=seeds[j])`` would).
    """
    prompts = [np.asarray(p, dtype=np.int64).reshape(-1) for p in prompts]
    if not prompts:
        raise ValueError("generate_batch: no prompts")
    seeds = [None] * len(prompts) if seeds is None else list(seeds)
    if len(seeds) != len(prompts):
        raise ConfigError(f"generate_batch: {len(seeds)} seeds for {len(prompts)} prompts; "
                          f"pass one seed per prompt")
    B = 1
    for p, seed in zip(prompts, seeds):
        B = _check_arguments(target, drafter, p, max_new_tokens, temperature, block_size,
                             "chain", seed, None)
    params = SamplingParams(float(temperature))
    runs = [_Decoding(target, drafter, B, max_new_tokens, params, seed, stops=stop_token_ids)
            for seed in seeds]
    outs = forward_batch(target, [r.prefill_ids(p) for r, p in zip(runs, prompts)],
                         [r.state for r in runs])  # 1. one prefill for all
    for r, out in zip(runs, outs):
        r.accept_prefill(out)
    while True:
        active = [r for r in runs if not r.done()]
        if not active:
            break
        speculate = [r.draft_cache is not None for r in active]
        t0 = [r.clock.start() for r in active]
        drafted = [r.draft_block() if sp else (np.array([r.anchor]), None) for r, sp in
                   zip(active, speculate)]  # 2b. (block, draft), per sequence
        blocks = [block for block, _ in drafted]
        outs = forward_batch(target, blocks, [r.state for r in active])  # 2c. one verify
        for r, sp, (block, draft), out, t in zip(active, speculate, drafted, outs, t0):
            if sp:
                r.accept_chain(block, draft, out, t)  # 2d. keep rows 0..a, emit a + 1 tokens
            else:
                r.accept_plain(out)
    return [r.finish() for r in runs]
