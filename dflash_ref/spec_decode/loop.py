"""The speculative decoding loop: prefill, then per step gate -> draft -> verify -> commit.

This follows the authors' ``dflash_generate`` (z-lab/dflash ``dflash/model.py``;
docs/spec_decode.md) step by step:

1. **Prefill** the N prompt tokens (positions 0..N-1) with capture on; the first new token t_N is
   sampled from the last row (greedy below T = 1e-5). ``s = N`` is the anchor position: the
   newest token, emitted but not yet run through the target.
2. Each step, with the anchor t_s:
   a. **gate**: the gate may floor; the rest of the turn is then plain decoding;
   b. **draft**: the drafter reads the features of the committed positions 0..s-1 and the block
      [t_s, MASK x (B-1)] at positions s..s+B-1; drafts = argmax of rows 1..B-1;
   c. **verify**: the target runs the block [t_s, d_1..d_{B-1}] at positions s..s+B-1;
      a = the longest prefix of drafts equal to the target's tokens (greedy, or sampled);
   d. **commit**: the accepted drafts and the bonus (the target's token after them) are emitted;
      the target state keeps positions < s+a+1 (KV truncated, GDN rewound, features of verify
      rows 0..a kept); s <- s + a + 1; the bonus is the next anchor.
3. Stop after max_new_tokens, or just after a stop token.

Plain decoding is the same loop with ``drafter=None`` (or ``block_size=1``): the block is the
anchor alone, a = 0 and tau = 1. Greedy speculative decoding therefore emits exactly the tokens
plain greedy decoding emits (tests/spec_decode/test_loop.py checks it token for token).

Tree verify (``verify="tree"``) replaces c-d with DDTree: a best-first tree over the draft
log-probabilities, one target pass with an ancestor-only mask, follow the verified path, commit
the path's KV / features / GDN states (liranringel/ddtree ``ddtree.py``; docs/spec_decode.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dflash_ref.errors import ConfigError, StateError
from dflash_ref.spec_decode.cost import Clock, CostModel
from dflash_ref.spec_decode.ddtree import DDTreeOptions, build_ddtree, verify_tree
from dflash_ref.spec_decode.gate import GateObservation, StepObservation
from dflash_ref.spec_decode.sampling import (
    SAMPLED_VERIFY_FORMS,
    SamplingParams,
    propose_block,
    sample_next,
    verify_sampled,
)
from dflash_ref.spec_decode.stats import acceptance_rate as _acceptance_rate
from dflash_ref.spec_decode.verify import verify_chain_greedy

VERIFY_MODES = ("chain", "tree")
DRAFT_ROWS = ("trained", "verify")


@dataclass
class GenerationResult:
    """What :func:`generate` returns.

    Attributes:
        tokens: the generated ids (prompt excluded), at most max_new_tokens, cut after a stop id.
        acceptance_lengths: tokens produced per verify step (speculative steps only): a + 1, or
            fewer when max_new_tokens or a stop token cuts the step (as the release counts).
        drafted: drafts offered per speculative step (B - 1 chain, tree nodes - 1 tree).
        per_position_accepted: [B-1] how often draft position j (1-based j = index + 1) was
            accepted.
        timings: wall seconds per phase ("prefill", "draft", "verify", "plain", "total", and
            "reselect" with a KVFlash scorer).
        modelled_time: the cost model's time for the decode phase (None without a cost model).
        gate_decisions: the gate's decisions in order (empty without a gate).
        target_forward_passes: target forwards run, prefill included.
        floored_at: generated-token count when the gate floored (None: never).
        from_draft: one flag per token of ``tokens``: True where the token is an accepted draft,
            False for a bonus token, the first token and plain-decoded ones.
    """

    tokens: list[int]
    acceptance_lengths: list[int] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)
    per_position_accepted: np.ndarray | None = None
    timings: dict[str, float] = field(default_factory=dict)
    modelled_time: float | None = None
    gate_decisions: list = field(default_factory=list)
    target_forward_passes: int = 0
    floored_at: int | None = None
    from_draft: list[bool] = field(default_factory=list)

    @property
    def tau(self) -> float:
        """Mean acceptance length over verify steps (1.0 for plain decoding)."""
        return float(np.mean(self.acceptance_lengths)) if self.acceptance_lengths else 1.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts / drafted tokens, bonus excluded (0.0 without drafts)."""
        if not self.drafted:
            return 0.0
        return _acceptance_rate([n - 1 for n in self.acceptance_lengths], self.drafted)


def generate(target, drafter, prompt_ids, max_new_tokens: int, temperature: float = 0.0,
             block_size: int | None = None, verify: str = "chain", gate=None, pager=None,
             seed=None, stop_token_ids: Sequence[int] | None = None,
             cost_model: CostModel | None = None,
             tree_options: DDTreeOptions | None = None,
             on_tokens=None, top_p: float = 1.0, top_k: int = 0,
             sampled_verify: str = "rejection", draft_rows: str = "trained", state=None,
             on_ids=None, on_commit=None) -> GenerationResult:
    """Generate up to ``max_new_tokens`` after ``prompt_ids`` (see the module docstring).

    Args:
        target: a :class:`~dflash_ref.models.target.TargetModel`.
        drafter: a :class:`~dflash_ref.models.drafter.DFlashDrafter` bound to ``target``, or
            None for plain decoding.
        prompt_ids: [N] token ids, N >= 1.
        max_new_tokens: tokens to generate (the output is cut to this length).
        temperature: 0 (or < 1e-5) is greedy; otherwise tokens are sampled and chain verify is
            lossless (``sampled_verify``; docs/spec_decode.md, "Sampling").
        block_size: drafter block size B (default: the drafter's); 1 means plain decoding. A B
            above the drafter's trained block size needs ``draft_rows="verify"`` and chain
            verify: the drafter then drafts block positions it was never trained on (still
            lossless; the end-to-end notebook shows what that does to tau).
        verify: "chain" or "tree" (DDTree, greedy only).
        gate: an :class:`~dflash_ref.spec_decode.gate.EntropyGate` or
            :class:`~dflash_ref.spec_decode.gate.CommitEmaGate` (anything with their protocol),
            or None (always speculate).
        pager: a :class:`~dflash_ref.kvflash.pager.KVFlashPager` holding the target's
            full-attention KV in a bounded pool (None: the plain KV cache). With a pool at least
            as large as the context the tokens equal the unpooled run; a smaller pool evicts
            cold chunks (LRU, or the pager's score hook) and attention sees the resident ones.
            With a ``scorer`` on the pager, ``pager.maybe_reselect`` runs after every step:
            every max(tau, history // 45) generated tokens the history is rescored and the
            pool re-paged to the most relevant chunks (docs/kvflash.md).
        seed: int or ``np.random.Generator`` for sampling (required when temperature > 0).
        stop_token_ids: generation stops just after the first of these.
        cost_model: modelled costs fed to the gate instead of wall times, and summed into
            ``modelled_time``.
        tree_options: DDTree build options (authors' defaults when None).
        on_tokens: optional callback ``f(n)`` called with the number of tokens each step emits
            (for progress bars).
        top_p, top_k: applied to the target's and the drafter's rows alike at temperature > 0
            (the release's order; :func:`~dflash_ref.spec_decode.sampling.sampling_probs`).
        sampled_verify: "rejection" (the release: sampled drafts, rejection sampling with the
            residual; DFlash 2 on its candidates) or "greedy_draft" (greedy drafts, one sample
            per target row, accept on equality: the older reference).
        draft_rows: "trained" runs the drafter on its trained block and uses the first B rows;
            "verify" runs it on exactly the verify block, min(B, remaining + 1) rows, as the
            release's ``verify_size`` (acceptance lengths then match the release's).
        on_ids: optional callback ``f(ids)`` with the token ids each step emits, cut at
            max_new_tokens (for streaming text).
        state: a :class:`~dflash_ref.models.state.TargetState` that already holds the first n
            prompt tokens (n < N; restored from a snapshot or a prompt cache,
            :mod:`dflash_ref.models.prompt_cache`): only ``prompt_ids[n:]`` is prefilled. Made
            with the same ``pager``. None: a fresh state.
        on_commit: optional callback ``f(tokens)`` called with the ids each step commits (the
            prefill's first token, a plain step's token, or a speculative step's accepted drafts
            and bonus), after the state's rollback / commit and before the max_new_tokens cut
            (the golden-vector recorder, dflash_ref/oracle, is one).
    """
    prompt = np.asarray(prompt_ids, dtype=np.int64).reshape(-1)
    B = _check_arguments(target, drafter, prompt, max_new_tokens, temperature, block_size,
                         verify, seed, pager, draft_rows)
    params = SamplingParams(float(temperature), float(top_p), int(top_k))
    for name, value, allowed in (("sampled_verify", sampled_verify, SAMPLED_VERIFY_FORMS),
                                 ("draft_rows", draft_rows, DRAFT_ROWS)):
        if value not in allowed:
            raise ConfigError(f"{name}={value!r} is unknown; expected one of {allowed}")
    run = _Decoding(target, drafter, B, max_new_tokens, params, seed, pager=pager,
                    stops=stop_token_ids, cost_model=cost_model, tree_options=tree_options,
                    on_tokens=on_tokens, on_ids=on_ids, on_commit=on_commit, state=state,
                    form=sampled_verify, draft_rows=draft_rows)
    run.prefill(prompt)
    speculate = run.draft_cache is not None
    if gate is not None:  # e.g. the commit-EMA gate's t_ar measurement
        n_warmup = gate.start_turn(max_new_tokens, run.sampled)
        if speculate and n_warmup:
            walls = [run.plain_step() for _ in range(n_warmup) if not run.done()]
            gate.end_warmup([cost_model.t_ar] * len(walls) if cost_model else walls)
    while not run.done():
        if speculate and gate is not None:
            decision = gate.check(run.observation())  # a. gate
            run.result.gate_decisions.append(decision)
            if decision.floor:
                speculate = False
                run.result.floored_at = len(run.emitted)
        if not speculate:
            run.plain_step()
            continue
        step = run.chain_step() if verify == "chain" else run.tree_step()  # b-d
        if gate is not None:
            gate.observe(step)
    return run.finish()


def _check_arguments(target, drafter, prompt, max_new_tokens, temperature, block_size, verify,
                     seed, pager, draft_rows="trained") -> int:
    """Refuse bad arguments with the fix; return the block size B (1 without a drafter)."""
    if prompt.size == 0:
        raise ValueError("prompt_ids is empty; generation needs at least one prompt token")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if verify not in VERIFY_MODES:
        raise ConfigError(f"verify={verify!r} is unknown; expected one of {VERIFY_MODES}")
    sampled = not SamplingParams(float(temperature)).greedy
    if sampled and seed is None:
        raise ValueError("temperature > 0 needs a seed (int or np.random.Generator) so that the "
                         "sampled output is reproducible")
    if sampled and verify == "tree":
        raise ConfigError("tree verify is greedy only; use verify='chain' with temperature > 0")
    B = 1 if drafter is None else int(block_size or drafter.block_size)
    if drafter is not None and B > drafter.block_size and (draft_rows, verify) != ("verify",
                                                                                   "chain"):
        raise ConfigError(f"block_size {B} exceeds the drafter's trained block size "
                          f"{drafter.block_size}; to draft past it anyway (positions the "
                          f"drafter never saw in training), pass draft_rows='verify' with "
                          f"verify='chain'")
    if drafter is not None and drafter.target is not target:
        raise ConfigError("the drafter is bound to another TargetModel; load it with "
                          "DFlashDrafter.from_pretrained(path, target)")
    return B


class _Decoding:
    """One request's decoding: the target state, the draft cache, the tokens, the bookkeeping.

    Each method is one step of the module docstring's algorithm; :func:`generate` strings them.
    ``anchor`` is the newest emitted token t_s at position ``s`` (not yet run by the target);
    ``last_logits`` [1, V] is the target row that produced it (what a gate looks at).
    """

    def __init__(self, target, drafter, B, max_new_tokens, params: SamplingParams, seed,
                 pager=None, stops=None, cost_model=None, tree_options=None, on_tokens=None,
                 on_ids=None, on_commit=None, state=None, form: str = "rejection",
                 draft_rows: str = "trained"):
        self.target, self.drafter, self.B, self.be = target, drafter, B, target.be
        self.max_new_tokens, self.params = max_new_tokens, params
        self.form, self.draft_rows = form, draft_rows  # generate()'s sampled_verify, draft_rows
        self.sampled = not self.params.greedy
        self.rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        self.pager, self.cost, self.on_tokens, self.on_ids = pager, cost_model, on_tokens, on_ids
        self.tree_options, self.on_commit = tree_options, on_commit
        self.stops = {int(t) for t in (stops or ())}
        self.clock = Clock(self.be, cost_model)
        self.result = GenerationResult(tokens=[])
        self.result.per_position_accepted = np.zeros(max(B - 1, 0), dtype=np.int64)
        if state is not None and state.pager is not pager:
            raise ConfigError("generate(state=...): the state was made with another pager; pass "
                              "the pager it holds (or none)")
        # a fresh state attaches and resets the pager; a given one holds a restored prefix
        self.state = target.new_state(pager=pager) if state is None else state
        self.draft_cache = drafter.new_cache() if drafter is not None and B > 1 else None
        if self.draft_cache is not None and self.state.features is None:
            raise ConfigError("the target captures no features; bind the drafter first "
                              "(DFlashDrafter.from_pretrained(path, target) sets "
                              "target_layer_ids)")
        self.emitted: list[int] = []
        self.emitted_from_draft: list[bool] = []
        self.t_total = self.clock.start()

    # ------------------------------------------------------------------ bookkeeping

    def done(self) -> bool:
        return (len(self.emitted) >= self.max_new_tokens
                or any(t in self.stops for t in self.emitted))

    def observation(self) -> GateObservation:
        return GateObservation(self.be, self.last_logits[-1], len(self.emitted))

    def _emit(self, tokens: list[int], n_drafts: int = 0) -> None:
        """Append committed tokens (the first ``n_drafts`` are accepted drafts); report them
        (cut at max_new_tokens) and re-page KVFlash."""
        if self.on_commit is not None:
            self.on_commit(list(tokens))
        self.emitted.extend(tokens)
        self.emitted_from_draft.extend(i < n_drafts for i in range(len(tokens)))
        self.anchor = tokens[-1]
        before = len(self.emitted) - len(tokens)
        n_new = min(len(tokens), max(0, self.max_new_tokens - before))
        if self.on_tokens is not None:
            self.on_tokens(n_new)
        if self.on_ids is not None and n_new:
            self.on_ids([int(t) for t in tokens[:n_new]])
        if self.pager is not None and self.pager.scorer is not None and not self.done():
            # KVFlash relevance (docs/kvflash.md): rescore and re-page when the cadence
            # max(tau, history // 45) is due.
            t0 = self.clock.start()
            history = np.concatenate([self.prompt, self.emitted])
            self.pager.maybe_reselect(history, len(self.emitted), len(tokens))
            self.clock.stop("reselect", t0)

    # ------------------------------------------------------------------ the steps

    def prefill(self, prompt) -> None:
        """1. Run the prompt (capture on); sample the first token from its last row.

        Only that row's logits are computed (``logits_rows``): the other N-1 rows would be
        N x vocab floats that nothing reads. Verify steps still take every block row."""
        rest = self.prefill_ids(prompt)
        t0 = self.clock.start()
        out = self.target.forward(rest, self.state, logits_rows=slice(-1, None))
        self.clock.stop("prefill", t0)
        self.accept_prefill(out)

    def prefill_ids(self, prompt) -> np.ndarray:
        """The prompt tokens still to run (all but those a restored state already holds)."""
        self.prompt, self.s = prompt, prompt.size  # s: position of the anchor
        n = self.state.length  # prompt tokens a restored state already holds
        if n >= prompt.size or not np.array_equal(self.state.tokens, prompt[:n]):
            raise StateError(f"generate(state=...): the state holds {n} tokens that are not a "
                             f"proper prefix of the {prompt.size}-token prompt")
        return prompt[n:]

    def accept_prefill(self, out) -> None:
        self.result.target_forward_passes += 1
        self.last_logits = out.logits[-1:]
        self._emit([int(sample_next(self.be, self.last_logits, self.params, self.rng)[0])])

    def plain_step(self) -> float:
        """One plain decode step: run the anchor, sample the next token. Returns its wall."""
        t0 = self.clock.start()
        out = self.target.forward([self.anchor], self.state)
        wall = self.clock.stop("plain", t0)
        self.accept_plain(out)
        return wall

    def accept_plain(self, out) -> None:
        self.result.target_forward_passes += 1
        if self.cost is not None:
            self.clock.modelled += self.cost.t_ar
        self.last_logits = out.logits
        self.s += 1
        self._emit([int(sample_next(self.be, out.logits, self.params, self.rng)[0])])

    def draft(self):
        """2b. Draft logits [B_drafter, V] from the committed features 0..s-1 and the anchor."""
        t0 = self.clock.start()
        self._extend_draft_cache()
        logits = self.draft_cache.forward_block(self.anchor, self.s)
        self.clock.stop("draft", t0)
        return logits

    def _extend_draft_cache(self) -> None:
        cache, s = self.draft_cache, self.s
        cache.extend(self.state.features.rows(cache.length, s), np.arange(cache.length, s))

    def chain_step(self) -> StepObservation:
        """2b-d with chain verify: draft n-1 tokens, verify the block, keep rows 0..a."""
        step_t0 = self.clock.start()
        block, drafts = self.draft_block()
        t0 = self.clock.start()
        out = self.target.forward(block, self.state)  # c. positions s..s+n-1
        self.clock.stop("verify", t0)
        return self.accept_chain(block, drafts, out, step_t0)

    def draft_block(self):
        """2b. The block [anchor, d_1 .. d_{n-1}] to verify and the draft it came from.

        n = B, or with ``draft_rows="verify"`` at most the tokens still wanted + 1 (the
        release's verify_size). Drafts are greedy, or sampled (``sampled_verify="rejection"``).
        """
        n = self.B
        if self.draft_rows == "verify":  # the release's verify_size
            n = min(n, self.max_new_tokens - len(self.emitted) + 1)
        t0 = self.clock.start()
        self._extend_draft_cache()
        drafts = propose_block(self.drafter, self.draft_cache, self.anchor, self.s, n,
                               self.params, self.form, self.rng)
        self.clock.stop("draft", t0)
        block = np.concatenate([[self.anchor], drafts.tokens[: n - 1]]).astype(np.int64)
        return block, drafts

    def accept_chain(self, block, drafts, out, step_t0: float) -> StepObservation:
        """2c-d. Verify the block's logits, keep rows 0..a, emit the accepted drafts + bonus."""
        n = len(block)
        res = (verify_sampled(self.be, block, out.logits, drafts, self.params, self.form,
                              self.rng)
               if self.sampled else verify_chain_greedy(self.be, block, out.logits))
        self.state.rollback(self.s + res.a + 1)  # d. keep rows 0..a: KV, features, GDN
        self.last_logits = out.logits[res.a: res.a + 1]  # the bonus token's row
        return self._commit(res, width=n, drafted=n - 1, step_t0=step_t0)

    def tree_step(self) -> StepObservation:
        """2b-d with DDTree: build a tree from the draft, verify it in one pass, keep the path."""
        step_t0 = self.clock.start()
        draft_logits = self.draft()
        tree = build_ddtree(self.be, self.anchor, draft_logits[1:self.B], self.tree_options)
        t0 = self.clock.start()
        out = self.target.forward_tree(tree.tokens, tree.parents, self.state)
        self.clock.stop("verify", t0)
        res = verify_tree(self.be, tree, out.logits)
        self.state.commit_path(res.path)
        last = res.path[-1]
        self.last_logits = out.logits[last: last + 1]  # the bonus token's row
        return self._commit(res, width=tree.n_nodes, drafted=tree.n_nodes - 1, step_t0=step_t0)

    def _commit(self, res, width: int, drafted: int, step_t0: float) -> StepObservation:
        """2d. Emit the a + 1 tokens (accepted drafts + bonus) the step produced; record it.

        As the release counts: a step cut by max_new_tokens or by a stop token produces (and
        counts in acceptance_lengths) only the tokens up to the cut, the stop token included.
        """
        self.result.target_forward_passes += 1
        tokens = [int(t) for t in res.committed][: self.max_new_tokens - len(self.emitted)]
        for i, t in enumerate(tokens):
            if t in self.stops:
                tokens = tokens[: i + 1]
                break
        produced = len(tokens)
        self.s += produced
        self._emit(tokens, n_drafts=min(res.a, produced))
        self.result.per_position_accepted[: produced - 1] += 1
        self.result.acceptance_lengths.append(produced)
        self.result.drafted.append(drafted)
        wall = self.clock.elapsed(step_t0)  # the gate's step_wall, not a phase of its own
        if self.cost is None:
            return StepObservation(commit_n=produced, step_wall=wall)
        modelled = self.cost.spec_step(self.B, width)
        self.clock.modelled += modelled
        return StepObservation(commit_n=produced, step_wall=modelled, t_ar=self.cost.t_ar)

    def finish(self) -> GenerationResult:
        """3. Cut after max_new_tokens and after the first stop token."""
        tokens = self.emitted[: self.max_new_tokens]
        for i, t in enumerate(tokens):
            if t in self.stops:
                tokens = tokens[: i + 1]
                break
        self.result.tokens = [int(t) for t in tokens]
        self.result.from_draft = self.emitted_from_draft[: len(tokens)]
        self.clock.stop("total", self.t_total)
        self.result.timings = self.clock.walls
        self.result.modelled_time = self.clock.modelled
        return self.result
