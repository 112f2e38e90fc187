"""Several sequences at once: prefill and verify every active sequence in one target forward.

:func:`generate_batch` is :func:`~dflash_ref.spec_decode.loop.generate` for a list of prompts.
Each sequence keeps its own state, drafter cache, acceptance and finish time; per step::

    ctxs   = [run.drafting_context() for run in active]       # each step's data
    blocks = [run.verifier.draft(ctx) for ...]                # the drafter, per sequence
    outs   = target.forward_batch(ids, states)                # ONE target forward for all
    for run, ctx, block, out in ...: run.accept(ctx, block, out)  # verify, rollback, emit

Sequences of different lengths sit at their own positions (ragged), and a sequence that has
finished leaves the batch. Each sequence emits exactly the tokens and acceptance lengths of its
own single-sequence run (tests/spec_decode/test_batch.py); its features never reach another
sequence's drafter (models/batch.py keeps every state's rows apart).

Scope of this reference: chain verify, greedy or sampled (one seed per sequence), no gate, no
pager. The drafter runs once per sequence, and GDN layers loop over sequences inside the
forward; a device path without those loops is future work.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from dflash_ref.errors import ConfigError
from dflash_ref.ops.sampling import GREEDY, SamplingParams
from dflash_ref.spec_decode.arguments import check_arguments, check_roles
from dflash_ref.spec_decode.decoding import Decoding, GenerationResult


def generate_batch(target, drafter, prompts: Sequence, max_new_tokens: int, *,
                   sampling: SamplingParams | None = None, seeds=None,
                   block_size: int | None = None,
                   stop_token_ids: Sequence[int] | None = None) -> list[GenerationResult]:
    """Generate after each of ``prompts`` (see the module docstring); one result per prompt.

    Args:
        target, drafter, max_new_tokens, sampling, block_size, stop_token_ids: as for
            :func:`~dflash_ref.spec_decode.loop.generate` (drafter None: plain decoding).
        prompts: a list of [N_j] token-id sequences (different lengths are fine).
        seeds: one seed per prompt when sampling at T > 0 (sequence j samples as
            ``generate(..., sampling=replace(sampling, seed=seeds[j]))`` would); None: every
            sequence takes ``sampling.seed``.
    """
    prompts = list(prompts)
    if not prompts:
        raise ValueError("generate_batch: no prompts")
    sampling = sampling or GREEDY
    check_roles(target, drafter, sampling)  # before a field of sampling is read
    seeds = [sampling.seed] * len(prompts) if seeds is None else list(seeds)
    if len(seeds) != len(prompts):
        raise ConfigError(f"generate_batch: {len(seeds)} seeds for {len(prompts)} prompts; "
                          f"pass one seed per prompt")
    laws = [dataclasses.replace(sampling, seed=seed) for seed in seeds]
    checked = [check_arguments(target, drafter, p, max_new_tokens, law, block_size, "chain")
               for p, law in zip(prompts, laws)]
    runs = [Decoding(target, drafter, p, block_size, max_new_tokens, law, verifier,
                     stops=stop_token_ids)
            for (p, block_size, verifier), law in zip(checked, laws)]
    outs = target.forward_batch([r.cursor.prompt[r.state.length:] for r in runs],
                                [r.state for r in runs])  # 1. one prefill for all
    for r, out in zip(runs, outs):
        r.sample_next(out)
    while True:
        active = [r for r in runs if not r.cursor.done]
        if not active:
            break
        t0 = [r.clock.now() for r in active]
        ctxs = [r.drafting_context() if r.proposer is not None else None
                for r in active]  # None: a plain step
        blocks = [r.verifier.draft(c) if c is not None else None for r, c in zip(active, ctxs)]
        ids = [b.tokens if b is not None else np.array([r.cursor.anchor])
               for r, b in zip(active, blocks)]  # 2b. per sequence
        outs = target.forward_batch(ids, [r.state for r in active])  # 2c. one verify
        for r, ctx, block, out, t in zip(active, ctxs, blocks, outs, t0):
            if block is not None:
                r.accept(ctx, block, out, t)  # 2d. keep rows 0..a, emit a + 1 tokens
            else:
                r.sample_next(out)
    return [r.finish() for r in runs]
