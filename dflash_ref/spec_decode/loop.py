"""The speculative decoding loop: prefill, then per step gate -> draft -> verify -> commit.

This follows the authors' ``dflash_generate`` (z-lab/dflash ``dflash/model.py``;
docs/spec_decode.md) step by step:

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
anchor alone, a = 0 and tau = 1. Greedy speculative decoding therefore emits exactly the tokens
plain greedy decoding emits (tests/spec_decode/test_loop.py checks it token for token).

Steps b-d belong to the verify rule, an object built once from the arguments
(:mod:`~dflash_ref.spec_decode.verifiers`): chain verify (greedy, or the release's rejection
sampling) or tree verify (DDTree: a best-first tree over the draft log-probabilities, one target
pass with an ancestor-only mask, the verified path's KV / features / GDN states kept;
liranringel/ddtree ``ddtree.py``). Data flows one way through a step: the request
(:class:`~dflash_ref.spec_decode.decoding.Decoding`) hands the verifier a
:class:`~dflash_ref.spec_decode.drafting.DraftingContext` (the anchor, its position, the block
size, the sampling law, the drafter's proposer), the verifier returns the block, the target runs
it, the verifier's decision goes back to the request's token cursor; no role calls back into the
request. Progress, streaming and recording watch through one observer
(:mod:`~dflash_ref.spec_decode.observe`), and the request's clock times each phase.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dflash_ref.errors import ConfigError, PositionWarning
from dflash_ref.ops.sampling import GREEDY, SamplingParams
from dflash_ref.spec_decode.cost import CostModel
from dflash_ref.spec_decode.decoding import Decoding, GenerationResult
from dflash_ref.spec_decode.observe import Observer
from dflash_ref.spec_decode.verifiers import (
    VERIFY_MODES,
    Verifier,
    make_verifier,
    unknown_verify_mode,
)

__all__ = ["GateOptions", "GenerationResult", "check_arguments", "generate"]


@dataclass(frozen=True)
class GateOptions:
    """A gate and the clock it judges by.

    Attributes:
        gate: an :class:`~dflash_ref.spec_decode.gate.EntropyGate` or
            :class:`~dflash_ref.spec_decode.gate.CommitEmaGate` (anything with their protocol),
            or None (always speculate: :data:`~dflash_ref.spec_decode.gate.ALWAYS_SPECULATE`).
        cost_model: modelled costs fed to the gate instead of wall times (so a gated run is
            deterministic), and summed into ``GenerationResult.modelled_time`` (also without a
            gate).
    """

    gate: object | None = None
    cost_model: CostModel | None = None


def generate(target, drafter, prompt_ids, max_new_tokens: int, *,
             sampling: SamplingParams | None = None, block_size: int | None = None,
             verify: str | Verifier = "chain", gate=None, pager=None,
             stop_token_ids: Sequence[int] | None = None, state=None,
             observer: Observer | None = None) -> GenerationResult:
    """Generate up to ``max_new_tokens`` after ``prompt_ids`` (see the module docstring).

    Args:
        target: a :class:`~dflash_ref.models.target.TargetModel`.
        drafter: a :class:`~dflash_ref.models.drafter.DFlashDrafter` bound to ``target``, or
            None for plain decoding.
        prompt_ids: [N] token ids, N >= 1.
        max_new_tokens: tokens to generate (the output is cut to this length).
        sampling: :class:`~dflash_ref.ops.sampling.SamplingParams` (temperature, top_p, top_k,
            seed); None is greedy. At T > 0 a seed is required and chain verify is lossless
            (docs/spec_decode.md, "Sampling").
        block_size: the block size B, the step's rows (default: the drafter's trained block
            size); 1 means plain decoding. A block size above the trained one needs a chain
            verifier with ``draft_rows="verify"``: the drafter then drafts block positions it
            was never trained on (still lossless; the end-to-end notebook shows what that does
            to tau).
        verify: "chain", "tree" (DDTree when greedy; sampled: drawn children and recursive
            rejection sampling, lossless), or a
            :class:`~dflash_ref.spec_decode.verifiers.Verifier` (e.g.
            ``TreeVerifier(DDTreeOptions.lucebox())``, ``ChainVerifier(draft_rows="verify")``,
            ``GreedyDraftChainVerifier()``); without a drafter no verifier runs (an unknown mode
            is still refused).
        gate: a gate (an :class:`~dflash_ref.spec_decode.gate.EntropyGate` or
            :class:`~dflash_ref.spec_decode.gate.CommitEmaGate`), or :class:`GateOptions` with
            a cost model; None: always speculate.
        pager: a :class:`~dflash_ref.kvflash.pager.KVFlashPager` holding the target's
            full-attention KV in a bounded pool (None: the plain KV cache). With a pool at least
            as large as the context the tokens equal the unpooled run; a smaller pool evicts
            cold chunks (LRU, or the pager's score hook) and attention sees the resident ones.
            With a ``scorer`` on the pager, ``pager.maybe_reselect`` runs after every step:
            every max(tau, history // 45) generated tokens the history is rescored and the
            pool re-paged to the most relevant chunks (docs/kvflash.md).
        stop_token_ids: generation stops just after the first of these.
        state: a :class:`~dflash_ref.models.state.TargetState` that already holds the first n
            prompt tokens (n < N; restored from a snapshot or a prompt cache,
            :mod:`dflash_ref.models.prompt_cache`): only ``prompt_ids[n:]`` is prefilled. Made
            with the same ``pager``. None: a fresh state.
        observer: an :class:`~dflash_ref.spec_decode.observe.Observer` that watches the run:
            progress (``Progress``), streaming (``Stream``), the golden-vector recorder
            (:mod:`dflash_ref.oracle`), or several (``Observers``).
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


def check_arguments(target, drafter, prompt_ids, max_new_tokens: int, sampling: SamplingParams,
                    block_size: int | None, verify) -> tuple[np.ndarray, int, Verifier]:
    """Refuse what the arguments cannot mean, with the fix, before anything runs; return the
    prompt as [N] int64, the block size and the verifier built from ``verify`` (plain
    decoding, without a drafter: block size 1 and no verifier).

    Refused (:class:`~dflash_ref.errors.ConfigError`): a prompt that is not one non-empty
    sequence of integer ids in [0, vocab) (a 2-D batch goes to ``generate_batch``), a
    ``max_new_tokens`` or ``block_size`` that is not an integer >= 1, T > 0 without a seed, a
    drafter bound to another target. Warned (:class:`~dflash_ref.errors.PositionWarning`): a run
    that would reach past the target's ``max_position_embeddings``.
    """
    prompt = np.asarray(prompt_ids)
    if prompt.ndim != 1:
        raise ConfigError(f"prompt_ids must be one sequence of token ids, shape [N]; got shape "
                          f"{list(prompt.shape)}; pass one prompt's ids (text: load_tokenizer(path)"
                          f".encode(text); several prompts: generate_batch(target, drafter, "
                          f"prompts, ...))")
    if prompt.size == 0:
        raise ConfigError("prompt_ids is empty; generation needs at least one prompt token")
    if prompt.dtype.kind not in "iu":
        raise ConfigError(f"prompt_ids must be integer token ids, got dtype {prompt.dtype} "
                          f"(e.g. {prompt.reshape(-1)[0].item()!r}); pass ints, e.g. "
                          f"load_tokenizer(path).encode(text)")
    vocab = target.config.vocab_size
    if prompt.min() < 0 or prompt.max() >= vocab:
        raise ConfigError(f"prompt_ids must lie in [0, {vocab}) (the target's vocab_size); got "
                          f"ids from {prompt.min()} to {prompt.max()}; encode the text with "
                          f"this target's tokenizer")
    if not isinstance(max_new_tokens, (int, np.integer)) or isinstance(max_new_tokens, bool) \
            or max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}; "
                          f"pass e.g. max_new_tokens=32")
    if block_size is not None and (not isinstance(block_size, (int, np.integer))
                                   or isinstance(block_size, bool) or block_size < 1):
        raise ConfigError(f"block_size must be an integer >= 1 (1: plain decoding), got "
                          f"{block_size!r}; pass e.g. block_size=drafter.block_size, or None for "
                          f"the drafter's")
    if not sampling.greedy and sampling.seed is None:
        raise ConfigError("temperature > 0 needs a seed (SamplingParams(..., seed=int or "
                          "np.random.Generator)) so that the sampled output is reproducible")
    limit = target.config.max_position_embeddings
    if limit is not None and prompt.size + max_new_tokens > limit:
        warnings.warn(f"the prompt ({prompt.size} tokens) and max_new_tokens={max_new_tokens} "
                      f"reach position {prompt.size + max_new_tokens - 1}, past the target's "
                      f"max_position_embeddings={limit}: positions it was never trained on; "
                      f"shorten the prompt or lower max_new_tokens", PositionWarning,
                      stacklevel=3)
    prompt = prompt.astype(np.int64)
    if drafter is None:  # plain decoding runs no verifier; a mode that does not exist is refused
        if not isinstance(verify, Verifier) and verify not in VERIFY_MODES:
            raise unknown_verify_mode(verify)
        return prompt, 1, None
    verifier = make_verifier(verify, sampling)
    trained_block_size = int(drafter.block_size)
    block_size = trained_block_size if block_size is None else int(block_size)
    verifier.check(sampling, block_size, trained_block_size)
    if drafter.target is not target:
        raise ConfigError("the drafter is bound to another TargetModel; load it with "
                          "DFlashDrafter.from_pretrained(path, target)")
    return prompt, block_size, verifier
