"""The speculative decoding loop, as the authors' ``dflash_generate`` (z-lab/dflash
``dflash/model.py``; docs/spec_decode.md):

1. **Prefill** the N prompt tokens with capture on; the first new token t_N is sampled from the
   last row (greedy below T = 1e-5). ``s = N`` is the anchor position: emitted, not yet run.
2. Each step, with the anchor t_s:
   a. **gate**: the gate may floor; the rest of the turn is then plain decoding (a gate may first
      ask for a few plain steps; without a gate the loop always speculates);
   b. **draft**: the drafter reads the features of positions 0..s-1 and the block
      [t_s, MASK x (n-1)] at positions s..s+n-1 and proposes d_1..d_{n-1};
   c. **verify**: the target runs [t_s, d_1..d_{n-1}] at positions s..s+n-1; a = the longest
      prefix of drafts it accepts (greedy, or sampled);
   d. **commit**: the a drafts and the bonus (the target's token after them) are emitted; the
      state keeps positions < s+a+1 (KV truncated, GDN rewound, features of rows 0..a kept);
      s <- s + a + 1; the bonus is the next anchor.
3. Stop after max_new_tokens, or just after a stop token.

Plain decoding is ``drafter=None`` or ``block_size=1`` (the block is the anchor alone, a = 0);
greedy speculative decoding emits exactly its tokens (tests/spec_decode/test_loop.py).
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
        drafter: a ``DFlashDrafter`` bound to ``target``, or None: plain decoding.
        sampling: ``SamplingParams`` (None: greedy); at T > 0 a seed is required.
        block_size: B, the step's rows (default: the drafter's trained block size; 1: plain);
            above the trained one only with ``ChainVerifier(draft_rows="verify")``.
        verify: "chain", "tree" (DDTree; sampled: drawn children), or a ``Verifier``.
        gate: an ``EntropyGate``, a ``CommitEmaGate`` or ``GateOptions``; None: always speculate.
        pager: a ``KVFlashPager``, the target's full-attention KV in a bounded pool
            (docs/kvflash.md).
        stop_token_ids: generation stops just after the first of these.
        state: a ``TargetState`` (same ``pager``) holding the first n < N prompt tokens: only
            ``prompt_ids[n:]`` is prefilled.
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
