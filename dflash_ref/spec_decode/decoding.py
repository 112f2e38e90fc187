"""One request's decoding: the steps :func:`~dflash_ref.spec_decode.loop.generate` strings.

A speculative step flows one way: the verifier drafts from a
:class:`~dflash_ref.spec_decode.drafting.DraftingContext`, the target runs the block, the
verifier decides and keeps the accepted rows, the :class:`TokenCursor` commits the tokens; no
role calls back into the request. Everything a caller may watch goes through one observer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dflash_ref.errors import ConfigError, StateError
from dflash_ref.ops.sampling import SamplingParams, sample_tokens
from dflash_ref.spec_decode.drafting import DraftingContext, Proposer
from dflash_ref.spec_decode.gating import ALWAYS_SPECULATE, GateObservation, StepObservation
from dflash_ref.spec_decode.observe import UNWATCHED, Clock
from dflash_ref.spec_decode.stats import acceptance_rate as _acceptance_rate
from dflash_ref.spec_decode.verifiers import ChainBlock


@dataclass
class GenerationResult:
    """What :func:`~dflash_ref.spec_decode.loop.generate` returns.

    Attributes:
        tokens: the generated ids (prompt excluded), at most max_new_tokens, cut after a stop id.
        acceptance_lengths: tokens produced per speculative step: a + 1, or fewer when
            max_new_tokens or a stop token cuts the step (as the release counts).
        drafted: drafts offered per speculative step (n - 1 chain, tree nodes - 1 tree).
        per_position_accepted: [B-1] how often draft position j = index + 1 was accepted.
        timings: wall seconds per phase ("prefill", "draft", "verify": the forward, not a lazy
            chain's later rows, "plain", "total", and "reselect" with a KVFlash scorer).
        modelled_time: the cost model's time for the decode phase (None without a cost model).
        gate_decisions: the gate's decisions in order (empty without a gate).
        target_forward_passes: target passes, prefill included, one a step (a lazy chain's too).
        floored_at: generated-token count when the gate floored (None: never).
        from_draft: per token, True where it is an accepted draft.
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


@dataclass
class TokenCursor:
    """Where a request stands: the ``anchor`` t_s at ``position`` s (N - 1 before the first
    commit), emitted, not yet run; ``anchor_logits`` [1, V], the row that chose it (what a gate
    reads); ``remaining``; ``done`` once none remain or a stop id was emitted. Tokens enter by
    :meth:`commit` only, cut there at ``remaining`` and by :meth:`cut`, the one stop cut, so
    what was emitted is already the run's output."""

    prompt: np.ndarray
    max_new_tokens: int
    stops: frozenset
    position: int
    remaining: int
    anchor: int = -1
    anchor_logits: object = None
    emitted: list[int] = field(default_factory=list)
    from_draft: list[bool] = field(default_factory=list)
    done: bool = False

    def cut(self, tokens) -> list[int]:
        """``tokens`` up to and including the first stop id (all of them without one)."""
        tokens = list(map(int, tokens))
        for i, t in enumerate(tokens):
            if t in self.stops:
                return tokens[: i + 1]
        return tokens

    def commit(self, tokens, n_drafts: int, anchor_logits) -> list[int]:
        """Emit ``tokens`` (the first ``n_drafts`` accepted drafts) cut at ``remaining`` and
        after a stop; the last, chosen by the row ``anchor_logits``, is the new anchor."""
        tokens = self.cut(tokens[: self.remaining])
        n_drafts = min(n_drafts, len(tokens))
        self.emitted.extend(tokens)
        self.from_draft.extend([True] * n_drafts + [False] * (len(tokens) - n_drafts))
        self.anchor, self.anchor_logits = tokens[-1], anchor_logits
        self.position += len(tokens)
        self.remaining -= len(tokens)
        self.done = self.remaining <= 0 or tokens[-1] in self.stops
        return tokens

    def tokens(self) -> list[int]:
        return list(self.emitted)


@dataclass(frozen=True)
class Sampler:
    """The request's sampling law and the generator of its draws (None when greedy: greedy
    draws nothing)."""

    law: SamplingParams
    rng: np.random.Generator | None

    def sample(self, be, logits) -> int:
        """One token from the last row of ``logits`` [1, V] (the argmax when greedy)."""
        return int(sample_tokens(be, logits, self.law, self.rng)[0])


class RecordedGate:
    """A given gate, its decisions recorded in the result (``gate_decisions``, ``floored_at``)
    and by the observer (``on_gate``). A run given no gate holds ``ALWAYS_SPECULATE`` instead."""

    def __init__(self, gate, observer, result: GenerationResult):
        self.gate, self.observer, self.result = gate, observer, result

    def start_turn(self, max_new_tokens: int, sampled: bool) -> int:
        return self.gate.start_turn(max_new_tokens, sampled)

    def end_warmup(self, walls) -> None:
        self.gate.end_warmup(walls)

    def check(self, observation: GateObservation):
        decision = self.gate.check(observation)
        self.observer.on_gate(observation, decision)
        self.result.gate_decisions.append(decision)
        if decision.floor:
            self.result.floored_at = observation.n_generated
        return decision

    def observe(self, step: StepObservation) -> None:
        self.gate.observe(step)


class Decoding:
    """One request; each method is a step of the loop (:mod:`~dflash_ref.spec_decode.loop`).

    The arguments are ``generate``'s, checked (``stops``: its stop_token_ids; block size 1 and
    no verifier without a drafter). The ``proposer`` is None for plain decoding, the ``gate`` a
    :class:`RecordedGate` or ``ALWAYS_SPECULATE``, the ``observer`` ``UNWATCHED`` by default."""

    def __init__(self, target, drafter, prompt, block_size: int, max_new_tokens: int,
                 sampling: SamplingParams, verifier, gate=None, pager=None, stops=None,
                 state=None, observer=None, cost_model=None):
        self.target, self.verifier = target, verifier
        self.sampler = Sampler(sampling, None if sampling.greedy else sampling.generator())
        self.observer = UNWATCHED if observer is None else observer
        self.result = GenerationResult(tokens=[])
        self.result.per_position_accepted = np.zeros(max(block_size - 1, 0), dtype=np.int64)
        self.gate = ALWAYS_SPECULATE if gate is None else RecordedGate(gate, self.observer,
                                                                       self.result)
        if state is not None and state.pager is not pager:
            raise ConfigError("generate(state=...): the state was made with another pager; pass "
                              "the pager it holds (or none)")
        # a fresh state attaches and resets the pager; a given one holds a restored prefix
        self.state = target.new_state(pager=pager) if state is None else state
        n = self.state.length  # prompt tokens a restored state already holds
        if n >= prompt.size or (n and not np.array_equal(self.state.tokens, prompt[:n])):
            raise StateError(f"generate(state=...): the state holds {n} tokens that are not a "
                             f"proper prefix of the {prompt.size}-token prompt")
        self.cursor = TokenCursor(prompt, max_new_tokens, frozenset(int(t) for t in stops or ()),
                                  position=prompt.size - 1, remaining=max_new_tokens)
        self.clock = Clock(target.be, cost_model)
        self.proposer = None if drafter is None or block_size == 1 else Proposer(
            drafter, self.state, block_size, self.observer, self.clock)
        self.observer.on_start(self.state)

    def prefill(self) -> None:
        """1. Run the prompt (what the state lacks), sample the first token from its last row
        (the only row computed unless the observer asks for every row)."""
        every_row = self.observer.full_prefill_logits
        to_prefill = self.cursor.prompt[self.state.length:]  # [n] what the state lacks
        out, _ = self.run_target(ChainBlock(to_prefill), "prefill",
                                 logits_rows=None if every_row else slice(-1, None))
        self.sample_next(out)

    def warm_up(self) -> None:
        """Begin the gate's turn; run the plain steps it asks for before it judges, and hand it
        their times (modelled with a cost model)."""
        n = self.gate.start_turn(self.cursor.max_new_tokens, not self.sampler.law.greedy)
        if self.proposer is None or not n:
            return
        walls = [self.plain_step() for _ in range(n) if not self.cursor.done]
        cost = self.clock.cost
        self.gate.end_warmup([cost.t_ar] * len(walls) if cost else walls)

    def speculates(self) -> bool:
        """2a. Whether this step drafts: with a drafter, until the gate floors."""
        if self.proposer is None or self.result.floored_at is not None:
            return False
        c = self.cursor
        observation = GateObservation(self.target.be, c.anchor_logits[-1], len(c.emitted))
        return not self.gate.check(observation).floor

    def plain_step(self) -> float:
        """Run the anchor, sample the next token; return the forward's seconds (a gate's t_ar)."""
        out, wall = self.run_target(ChainBlock(np.array([self.cursor.anchor], np.int64)),
                                    "plain")
        if self.clock.cost is not None:
            self.clock.modelled += self.clock.cost.t_ar
        self.sample_next(out)
        return wall

    def spec_step(self) -> None:
        """2b-d: the verifier drafts from the step's context, the target runs the block, the
        verifier decides and keeps, the cursor commits."""
        step_t0 = self.clock.now()
        ctx = self.drafting_context()
        block = self.verifier.draft(ctx)  # b. the proposer drafts
        out, _ = self.run_target(block, "verify")  # c. positions s..
        self.accept(ctx, block, out, step_t0)  # d.

    def drafting_context(self) -> DraftingContext:
        """2b. What the verifier drafts from (one sequence of a batch too)."""
        c, p = self.cursor, self.proposer
        return DraftingContext(c.anchor, c.position, p.block_size, c.remaining, self.sampler.law,
                               self.sampler.rng, self.target.be, p)

    def accept(self, ctx: DraftingContext, block, out, step_t0: float) -> None:
        """2c-d. The verifier's decision on the block's logits; keep its rows, commit its
        tokens; the gate observes the step."""
        res = self.verifier.verify(block, out.logits, ctx)
        self.verifier.keep(self.state, ctx.position, res)  # KV, features, GDN
        k = res.bonus_row  # the verify row whose logits chose the bonus
        row = out.logits[k: k + 1]  # [1, V]
        tokens = self.commit(res.committed, res.a, row)
        self.gate.observe(self.step_observation(len(tokens), len(block.tokens), step_t0))

    def sample_next(self, out) -> None:
        """Commit the token sampled from the last row of a forward ending at the anchor."""
        self.result.target_forward_passes += 1
        row = out.logits[-1:]
        self.commit([self.sampler.sample(self.target.be, row)], 0, row)

    def run_target(self, block, phase: str, logits_rows=None):
        """The target's forward over ``block`` timed as ``phase``: ``(output, seconds)``."""
        tap = self.observer.before_forward(block.tokens, block.positions(self.state.length),
                                           block.parents)
        with self.clock.phase(phase) as lap:
            out = block.forward(self.target, self.state, tap, logits_rows)
        self.observer.after_forward(out.logits)
        return out, lap.seconds

    def commit(self, tokens, n_drafts: int, row) -> list[int]:
        """Commit ``tokens`` through the cursor, report them and re-page KVFlash; return the
        tokens committed."""
        tokens = self.cursor.commit(tokens, n_drafts, row)
        self.observer.on_commit(list(tokens))
        self.observer.on_emit(list(tokens))
        pager = self.state.pager
        if pager is not None and pager.scorer is not None and not self.cursor.done:
            # KVFlash relevance (docs/kvflash.md): rescore and re-page when the cadence
            # max(tau, history // 45) is due.
            with self.clock.phase("reselect"):
                history = np.concatenate([self.cursor.prompt, self.cursor.emitted])
                pager.maybe_reselect(history, len(self.cursor.emitted), len(tokens))
        return tokens

    def step_observation(self, produced: int, width: int, step_t0: float) -> StepObservation:
        """Record a step's ``produced`` tokens (to a cut, as the release counts) for the gate."""
        self.result.target_forward_passes += 1
        self.result.per_position_accepted[: produced - 1] += 1
        self.result.acceptance_lengths.append(produced)
        self.result.drafted.append(width - 1)
        wall = self.clock.now() - step_t0  # the gate's step_wall, not a phase of its own
        cost = self.clock.cost
        if cost is None:
            return StepObservation(commit_n=produced, step_wall=wall)
        modelled = cost.spec_step(self.proposer.block_size, width)
        self.clock.modelled += modelled
        return StepObservation(commit_n=produced, step_wall=modelled, t_ar=cost.t_ar)

    def finish(self) -> GenerationResult:
        """3. The tokens (the cursor cut them at max_new_tokens and after a stop) and timings."""
        self.result.tokens = self.cursor.tokens()
        self.result.from_draft = list(self.cursor.from_draft)
        self.clock.finish(self.result)  # timings and modelled time
        self.observer.on_finish(self.result)
        return self.result
