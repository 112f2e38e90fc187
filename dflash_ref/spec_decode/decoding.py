"""One request's decoding: the steps :func:`~dflash_ref.spec_decode.loop.generate` strings.

:class:`Decoding` holds what changes while a request runs (the target state, the drafter's
cache, the anchor and its position, the emitted tokens, the statistics) and does each step of
the loop's docstring: the prefill, a plain step, a speculative step (its verifier drafts, the
target runs the block, the verifier decides and keeps), the commit. It is also the ``run`` a
verifier sees (:mod:`dflash_ref.spec_decode.verifiers`, "The interface"). Everything a caller
may watch goes through one observer (:mod:`dflash_ref.spec_decode.observe`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dflash_ref.errors import ConfigError, StateError
from dflash_ref.ops.sampling import DraftProposal, SamplingParams, sample_tokens
from dflash_ref.spec_decode.gate import GateObservation, StepObservation
from dflash_ref.spec_decode.observe import UNWATCHED, Clock
from dflash_ref.spec_decode.stats import acceptance_rate as _acceptance_rate
from dflash_ref.spec_decode.verifiers import ChainBlock


@dataclass
class GenerationResult:
    """What :func:`~dflash_ref.spec_decode.loop.generate` returns.

    Attributes:
        tokens: the generated ids (prompt excluded), at most max_new_tokens, cut after a stop id.
        acceptance_lengths: tokens produced per verify step (speculative steps only): a + 1, or
            fewer when max_new_tokens or a stop token cuts the step (as the release counts).
        drafted: drafts offered per speculative step (n - 1 chain, tree nodes - 1 tree).
        per_position_accepted: [B-1] how often draft position j (1-based j = index + 1) was
            accepted.
        timings: wall seconds per phase ("prefill", "draft", "verify", "plain", "total", and
            "reselect" with a KVFlash scorer), written by the loop's clock.
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


class Decoding:
    """One request: each method is one step of the loop (module docstring).

    ``anchor`` is the newest emitted token t_s at position ``s`` (not yet run by the target);
    ``last_logits`` [1, V] is the target row that produced it (what a gate looks at).
    ``remaining`` counts the tokens still wanted and ``done`` turns True once none are, or a stop
    token was emitted (both kept by :meth:`_emit`).

    Args:
        target, drafter: the models (drafter None: plain decoding).
        prompt: [N] the prompt ids; a given ``state`` must hold a proper prefix of them.
        B: the block size (1 without a drafter).
        sampling: the run's :class:`~dflash_ref.ops.sampling.SamplingParams`.
        verifier: the verify rule (:mod:`~dflash_ref.spec_decode.verifiers`; None without a
            drafter).
        pager, stops, state: as for ``generate`` (``stops``: its stop_token_ids).
        observer: an :class:`~dflash_ref.spec_decode.observe.Observer`, or None: the events then
            go to :data:`~dflash_ref.spec_decode.observe.UNWATCHED` (one no-op).
        cost_model: modelled times for a gate and ``modelled_time`` (or None).
    """

    def __init__(self, target, drafter, prompt, B: int, max_new_tokens: int,
                 sampling: SamplingParams, verifier, pager=None, stops=None, state=None,
                 observer=None, cost_model=None):
        self.target, self.drafter, self.B, self.be = target, drafter, B, target.be
        self.max_new_tokens, self.sampling, self.verifier = max_new_tokens, sampling, verifier
        self.rng = None if sampling.greedy else sampling.generator()  # greedy draws nothing
        self.pager, self.cost = pager, cost_model
        self.stops = {int(t) for t in (stops or ())}
        self.observer = UNWATCHED if observer is None else observer
        self.result = GenerationResult(tokens=[])
        self.result.per_position_accepted = np.zeros(max(B - 1, 0), dtype=np.int64)
        if state is not None and state.pager is not pager:
            raise ConfigError("generate(state=...): the state was made with another pager; pass "
                              "the pager it holds (or none)")
        # a fresh state attaches and resets the pager; a given one holds a restored prefix
        self.state = target.new_state(pager=pager) if state is None else state
        n = self.state.length  # prompt tokens a restored state already holds
        if n >= prompt.size or (n and not np.array_equal(self.state.tokens, prompt[:n])):
            raise StateError(f"generate(state=...): the state holds {n} tokens that are not a "
                             f"proper prefix of the {prompt.size}-token prompt")
        self.prompt, self.s = prompt, prompt.size  # s: position of the anchor
        self.to_prefill = prompt[n:]  # the prompt tokens the prefill runs
        self.draft_cache = None if drafter is None or B == 1 else drafter.cache_for(self.state)
        if self.draft_cache is not None and self.state.features is None:
            raise ConfigError("the target captures no features; bind the drafter first "
                              "(DFlashDrafter.from_pretrained(path, target) sets "
                              "target_layer_ids)")
        self.emitted: list[int] = []
        self.emitted_from_draft: list[bool] = []
        self.remaining, self.done = max_new_tokens, False
        self.clock = Clock(self.be, cost_model)
        self.observer.on_start(self.state)

    # ------------------------------------------------------------------ bookkeeping

    def observation(self) -> GateObservation:
        return GateObservation(self.be, self.last_logits[-1], len(self.emitted))

    def _emit(self, tokens: list[int], n_drafts: int = 0) -> None:
        """Append committed tokens (the first ``n_drafts`` are accepted drafts); report them
        (cut at max_new_tokens), update ``remaining`` and ``done``, and re-page KVFlash."""
        n_new = min(len(tokens), max(0, self.remaining))
        self.emitted.extend(tokens)
        self.emitted_from_draft.extend(i < n_drafts for i in range(len(tokens)))
        self.anchor = tokens[-1]
        self.remaining -= len(tokens)
        self.done = self.done or self.remaining <= 0 or any(t in self.stops for t in tokens)
        self.observer.on_commit(list(tokens))
        self.observer.on_emit([int(t) for t in tokens[:n_new]])
        if self.pager is not None and self.pager.scorer is not None and not self.done:
            # KVFlash relevance (docs/kvflash.md): rescore and re-page when the cadence
            # max(tau, history // 45) is due.
            with self.clock.phase("reselect"):
                history = np.concatenate([self.prompt, self.emitted])
                self.pager.maybe_reselect(history, len(self.emitted), len(tokens))

    def run_target(self, block, phase: str, logits_rows=None):
        """The target's forward over ``block`` at its positions, timed as ``phase`` and
        reported to the observer.

        Returns ``(output, seconds)``: the forward's wall time is a plain step's ``t_ar``."""
        tap = self.observer.before_forward(block.tokens, block.positions(self.state.length),
                                           block.parents)
        with self.clock.phase(phase) as lap:
            out = block.forward(self.target, self.state, tap, logits_rows)
        self.observer.after_forward(out.logits)
        return out, lap.seconds

    # ------------------------------------------------------------------ the steps

    def prefill(self) -> None:
        """1. Run the prompt (capture on); sample the first token from its last row.

        Only that row's logits are computed (``logits_rows``) unless the observer asks for every
        row: the other N-1 rows would be N x vocab floats that nothing reads."""
        every_row = self.observer.full_prefill_logits
        out, _ = self.run_target(ChainBlock(self.to_prefill), "prefill",
                                 logits_rows=None if every_row else slice(-1, None))
        self.sample_next(out)

    def sample_next(self, out) -> None:
        """After a forward that ends at the anchor (the prefill, a plain step): the next token,
        sampled from the last row, is emitted; it is the anchor at ``s``, the state's length."""
        self.result.target_forward_passes += 1
        self.last_logits = out.logits[-1:]
        self.s = self.state.length
        self._emit([int(sample_tokens(self.be, self.last_logits, self.sampling, self.rng)[0])])

    def plain_step(self) -> float:
        """One plain decode step: run the anchor, sample the next token. Returns the forward's
        wall seconds (a gate's t_ar)."""
        out, wall = self.run_target(ChainBlock(np.array([self.anchor], np.int64)), "plain")
        if self.cost is not None:
            self.clock.modelled += self.cost.t_ar
        self.sample_next(out)
        return wall

    def spec_step(self) -> StepObservation:
        """2b-d: the verifier drafts a block, the target runs it, the verifier decides."""
        step_t0 = self.clock.now()
        block = self.verifier.draft(self)  # b. (calls back propose or draft_logits)
        out, _ = self.run_target(block, "verify")  # c. positions s..
        return self.accept(block, out, step_t0)

    def accept(self, block, out, step_t0: float) -> StepObservation:
        """2c-d. The verifier's decision on the block's logits; keep its rows, emit its tokens."""
        res = self.verifier.verify(block, out.logits, self)
        self.verifier.keep(self.state, self.s, res)  # d. KV, features, GDN
        self.last_logits = out.logits[res.bonus_row: res.bonus_row + 1]  # the bonus token's row
        return self._commit(res, width=len(block.tokens), step_t0=step_t0)

    # ------------------------------------------------------------------ what a verifier calls

    def propose(self, n_rows: int, law: SamplingParams | None) -> DraftProposal:
        """2b. The drafter's proposal for ``[anchor, d_1 .. d_{n-1}]`` at positions s..s+n-1:
        greedy drafts for ``law=None``, else sampled from ``law``."""
        with self.clock.phase("draft"):
            self._extend_draft_cache()
            logits, hidden = self.draft_cache.forward_block(self.anchor, self.s, n_rows=n_rows,
                                                            with_hidden=True)
            proposal = self.drafter.propose(hidden, logits, self.anchor, law, self.rng)
        self.observer.on_draft(self.anchor, self.s + np.arange(n_rows), logits, proposal)
        return proposal

    def draft_logits(self):
        """2b. The drafter's logits [Bd, V] over its trained block ``[anchor, MASK x (Bd-1)]``."""
        with self.clock.phase("draft"):
            self._extend_draft_cache()
            logits = self.draft_cache.forward_block(self.anchor, self.s)
        self.observer.on_draft(self.anchor, self.s + np.arange(logits.shape[0]), logits, None)
        return logits

    def _extend_draft_cache(self) -> None:
        """The features of positions committed since the last draft join its context."""
        cache, s = self.draft_cache, self.s
        features, positions = self.state.features.rows(cache.length, s), np.arange(cache.length, s)
        self.observer.on_draft_context(features, positions)
        cache.extend(features, positions)

    # ------------------------------------------------------------------ commit and finish

    def _commit(self, res, width: int, step_t0: float) -> StepObservation:
        """2d. Emit the a + 1 tokens (accepted drafts + bonus) the step produced; record it.

        As the release counts: a step cut by max_new_tokens or by a stop token produces (and
        counts in acceptance_lengths) only the tokens up to the cut, the stop token included.
        """
        self.result.target_forward_passes += 1
        tokens = [int(t) for t in res.committed][: self.remaining]
        for i, t in enumerate(tokens):
            if t in self.stops:
                tokens = tokens[: i + 1]
                break
        produced = len(tokens)
        self.s += produced
        self._emit(tokens, n_drafts=min(res.a, produced))
        self.result.per_position_accepted[: produced - 1] += 1
        self.result.acceptance_lengths.append(produced)
        self.result.drafted.append(width - 1)
        wall = self.clock.now() - step_t0  # the gate's step_wall, not a phase of its own
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
        self.clock.finish(self.result)  # timings and modelled time
        self.observer.on_finish(self.result)
        return self.result
