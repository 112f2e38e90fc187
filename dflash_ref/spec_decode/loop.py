"""The speculative decoding loop: prefill, then per step gate -> draft -> verify -> commit.

Step by step as the authors' ``dflash_generate`` (z-lab/dflash ``dflash/model.py``;
docs/spec_decode.md):

1. **Prefill** the N prompt tokens (positions 0..N-1) with capture on; the first new token t_N is
   sampled from the last row (greedy below T = 1e-5). ``s = N`` is the anchor position: the
   newest token, emitted but not yet run through the target.
2. Each step, with the anchor t_s:
   a. **gate**: the gate may floor; the rest of the turn is then plain decoding (a gate may first
      ask for a few plain steps, its warm-up; without a gate the loop always speculates);
   b. **draft**: the drafter reads the features of the committed positions 0..s-1 and the block
      [t_s, MASK x (n-1)] at positions s..s+n-1 and proposes d_1..d_{n-1};
   c. **verify**: the target runs the block [t_s, d_1..d_{n-1}] at positions s..s+n-1;
      a = the longest prefix of drafts the target accepts (greedy, or sampled);
   d. **commit**: the accepted drafts and the bonus (the target's token after them) are emitted;
      the target state keeps positions < s+a+1 (KV truncated, GDN rewound, features of verify
      rows 0..a kept); s <- s + a + 1; the bonus is the next anchor.
3. Stop after max_new_tokens, or just after a stop token.

Plain decoding is the same loop with ``drafter=None`` (or ``block_size=1``): the block is the
anchor alone, a = 0 and tau = 1, so greedy speculative decoding emits exactly plain greedy
decoding's tokens (tests/spec_decode/test_loop.py). Steps b-d belong to the verify rule
(:mod:`~dflash_ref.spec_decode.verifiers`), which receives the step's data and hands back its
decision; no role calls back into the request
(:class:`~dflash_ref.spec_decode.decoding.Decoding`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dflash_ref.ops.sampling import GREEDY, SamplingParams
from dflash_ref.spec_decode.arguments import check_arguments
from dflash_ref.spec_decode.cost import CostModel
from dflash_ref.spec_decode.decoding import Decoding, GenerationResult
from dflash_ref.spec_decode.observe import Observer
from dflash_ref.spec_decode.verifiers import Verifier

__all__ = ["GateOptions", "GenerationResult", "generate"]


@dataclass(frozen=True)
class GateOptions:
    """A gate (or None: always speculate) and the ``cost_model`` whose modelled costs it judges
    by instead of wall times (a gated run is then deterministic); the modelled times are summed
    into ``GenerationResult.modelled_time``, also without a gate."""

    gate: object | None = None
    cost_model: CostModel | None = None


def generate(target, drafter, prompt_ids, max_new_tokens: int, *,
             sampling: SamplingParams | None = None, block_size: int | None = None,
             verify: str | Verifier = "chain", gate=None, pager=None,
             stop_token_ids: Sequence[int] | None = None, state=None,
             observer: Observer | None = None) -> GenerationResult:
    """Generate up to ``max_new_tokens`` after ``prompt_ids`` [N] (the module's steps).

    Args:
        target, drafter: a ``TargetModel`` and a ``DFlashDrafter`` bound to it (None: plain
            decoding).
        sampling: ``SamplingParams``; None is greedy. At T > 0 a seed is required and chain
            verify is lossless (docs/spec_decode.md, "Sampling").
        block_size: B, the step's rows (default: the drafter's trained block size; 1: plain
            decoding). Above the trained one only with ``ChainVerifier(draft_rows="verify")``.
        verify: "chain", "tree" (DDTree when greedy; sampled: drawn children and recursive
            rejection sampling, lossless), or a ``Verifier``; without a drafter none runs (an
            unknown mode is still refused).
        gate: an ``EntropyGate`` or ``CommitEmaGate``, or ``GateOptions`` with a cost model;
            None: always speculate.
        pager: a ``KVFlashPager`` holding the target's full-attention KV in a bounded pool
            (docs/kvflash.md); with a scorer it re-pages after steps (``Decoding.commit``).
        stop_token_ids: generation stops just after the first of these.
        state: a ``TargetState`` (made with the same ``pager``) already holding the first n < N
            prompt tokens (a snapshot, a prompt cache): only ``prompt_ids[n:]`` is prefilled.
        observer: an ``Observer`` (``Progress``, ``Stream``, the golden recorder, ``Observers``).
    """
    sampling = sampling or GREEDY
    gating = gate if isinstance(gate, GateOptions) else GateOptions(gate)
    prompt, block_size, verifier = check_arguments(target, drafter, prompt_ids, max_new_tokens,
                                                   sampling, block_size, verify)
    run = Decoding(target, drafter, prompt, block_size, max_new_tokens, sampling, verifier,
                   gate=gating.gate, pager=pager, stops=stop_token_ids, state=state,
                   observer=observer, cost_model=gating.cost_model)
    run.prefill()  # 1.
    run.warm_up()  # the gate's plain steps before it judges (none without a gate)
    while not run.cursor.done:
        if run.speculates():  # 2a. the gate, until it floors
            run.spec_step()  # 2b-d. draft, verify, commit
        else:
            run.plain_step()
    return run.finish()  # 3.
