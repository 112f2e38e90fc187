"""The speculative decoding loop: prefill -> (gate) -> draft -> verify -> commit/rollback.

This follows the authors' ``dflash_generate`` (spec/dflash.md §5) step by step:

1. Prefill the N prompt tokens (positions 0..N-1) with capture on; the first new token t_N is
   sampled from the last row (greedy below T = 1e-5). ``s = N`` is the anchor position: the
   newest token, emitted but not yet run through the target.
2. Each step, with the anchor t_s:
   a. (gate) the gate may floor: the rest of the turn is plain decoding;
   b. draft: the drafter reads the features of the committed positions 0..s-1 and the block
      [t_s, MASK x (B-1)] at positions s..s+B-1; drafts = argmax of rows 1..B-1;
   c. verify: the target runs the block [t_s, d_1..d_{B-1}] at positions s..s+B-1;
   d. a = longest prefix of drafts equal to the target's tokens (greedy or sampled, §5.2d);
   e. commit: the accepted drafts and the bonus (the target's token after them) are emitted;
      the target state keeps positions < s+a+1 (KV truncated, GDN rewound, features of verify
      rows 0..a kept: §5.2f); s <- s + a + 1; the bonus is the next anchor.
3. Stop after max_new_tokens, or just after a stop token.

Plain decoding is the same loop with ``drafter=None`` (or ``block_size=1``): the block is the
anchor alone, a = 0 and tau = 1. Greedy speculative decoding therefore emits exactly the tokens
plain greedy decoding emits (tests/spec_decode/test_loop.py checks it token for token).

Tree verify (``verify="tree"``) replaces c-e with DDTree: a best-first tree over the draft
log-probabilities, one target pass with an ancestor-only mask, follow the verified path, commit
the path's KV / features / GDN states (spec/kvflash_gate.md §5a).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dflash_ref.errors import ConfigError
from dflash_ref.spec_decode.ddtree import DDTreeOptions, build_ddtree, verify_tree
from dflash_ref.spec_decode.gate import CommitEmaGate, CostModel, EntropyGate, p1_from_logits
from dflash_ref.spec_decode.stats import acceptance_rate as _acceptance_rate
from dflash_ref.spec_decode.verify import (
    GREEDY_BELOW_TEMPERATURE,
    sample_tokens,
    verify_chain_greedy,
    verify_chain_sampled,
)

VERIFY_MODES = ("chain", "tree")


@dataclass
class GenerationResult:
    """What :func:`generate` returns.

    Attributes:
        tokens: the generated ids (prompt excluded), at most max_new_tokens, cut after a stop id.
        acceptance_lengths: a + 1 per verify step (speculative steps only).
        drafted: drafts offered per speculative step (B - 1 chain, tree nodes - 1 tree).
        per_position_accepted: [B-1] how often draft position j (1-based j = index + 1) was
            accepted.
        timings: wall seconds per phase ("prefill", "draft", "verify", "plain", "total", and
            "reselect" with a KVFlash scorer).
        modelled_time: the cost model's time for the decode phase (None without a cost model).
        gate_decisions: the gate's decisions in order (empty without a gate).
        target_forward_passes: target forwards run, prefill included.
        floored_at: generated-token count when the gate floored (None: never).
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


class _Clock:
    """Wall time per phase (synchronising the device on CuPy) plus optional modelled time."""

    def __init__(self, be, cost: CostModel | None):
        self.be, self.cost = be, cost
        self.walls: dict[str, float] = {}
        self.modelled = 0.0 if cost is not None else None

    def sync(self):
        if self.be.name == "cupy":
            self.be.xp.cuda.Stream.null.synchronize()

    def start(self) -> float:
        self.sync()
        return time.perf_counter()

    def elapsed(self, t0: float) -> float:
        self.sync()
        return time.perf_counter() - t0

    def stop(self, phase: str, t0: float) -> float:
        """Add the time since ``t0`` to ``phase``; return it."""
        dt = self.elapsed(t0)
        self.walls[phase] = self.walls.get(phase, 0.0) + dt
        return dt


def generate(target, drafter, prompt_ids, max_new_tokens: int, temperature: float = 0.0,
             block_size: int | None = None, verify: str = "chain", gate=None, pager=None,
             seed=None, stop_token_ids: Sequence[int] | None = None,
             cost_model: CostModel | None = None,
             tree_options: DDTreeOptions | None = None,
             on_tokens=None) -> GenerationResult:
    """Generate up to ``max_new_tokens`` after ``prompt_ids`` (see the module docstring).

    Args:
        target: a :class:`~dflash_ref.models.target.TargetModel`.
        drafter: a :class:`~dflash_ref.models.drafter.DFlashDrafter` bound to ``target``, or
            None for plain decoding.
        prompt_ids: [N] token ids, N >= 1.
        max_new_tokens: tokens to generate (the output is cut to this length).
        temperature: 0 (or < 1e-5) is greedy; otherwise the target samples and chain verify is
            lossless rejection sampling with the greedy draft (spec/dflash.md §5).
        block_size: drafter block size B (default: the drafter's); 1 means plain decoding.
        verify: "chain" or "tree" (DDTree, greedy only).
        gate: an :class:`EntropyGate` or :class:`CommitEmaGate`, or None (always speculate).
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
    """
    be = target.be
    prompt = np.asarray(prompt_ids, dtype=np.int64).reshape(-1)
    if prompt.size == 0:
        raise ValueError("prompt_ids is empty; generation needs at least one prompt token")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if verify not in VERIFY_MODES:
        raise ConfigError(f"verify={verify!r} is unknown; expected one of {VERIFY_MODES}")
    sampled = temperature >= GREEDY_BELOW_TEMPERATURE
    if sampled and seed is None:
        raise ValueError("temperature > 0 needs a seed (int or np.random.Generator) so that the "
                         "sampled output is reproducible")
    if sampled and verify == "tree":
        raise ConfigError("tree verify is greedy only; use verify='chain' with temperature > 0")
    rng = np.random.default_rng(seed) if not isinstance(seed, np.random.Generator) else seed
    B = 1 if drafter is None else int(block_size or drafter.block_size)
    if drafter is not None and B > drafter.block_size:
        raise ConfigError(f"block_size {B} exceeds the drafter's trained block size "
                          f"{drafter.block_size}")
    if drafter is not None and drafter.target is not target:
        raise ConfigError("the drafter is bound to another TargetModel; load it with "
                          "DFlashDrafter.from_pretrained(path, target)")
    if pager is not None and verify == "tree":
        raise ConfigError("tree verify over a KVFlash pool is not implemented; use "
                          "verify='chain' with a pager")
    stops = set(int(t) for t in (stop_token_ids or ()))

    clock = _Clock(be, cost_model)
    result = GenerationResult(tokens=[])
    result.per_position_accepted = np.zeros(max(B - 1, 0), dtype=np.int64)
    state = target.new_state(pager=pager)  # the pager is attached and reset per request
    if drafter is not None and B > 1 and state.features is None:
        raise ConfigError("the target captures no features; bind the drafter first "
                          "(DFlashDrafter.from_pretrained(path, target) sets target_layer_ids)")
    t_total = clock.start()

    # 1. prefill
    t0 = clock.start()
    out = target.forward(prompt, state)
    clock.stop("prefill", t0)
    result.target_forward_passes += 1
    last_logits = out.logits[-1:]
    anchor = int(sample_tokens(be, last_logits, temperature, rng)[0])
    emitted = [anchor]
    if on_tokens is not None:
        on_tokens(1)
    s = prompt.size  # position of the anchor
    cache = drafter.new_cache() if drafter is not None and B > 1 else None

    def done() -> bool:
        return len(emitted) >= max_new_tokens or any(t in stops for t in emitted)

    def report(n: int) -> None:
        if on_tokens is not None:
            on_tokens(min(n, max(0, max_new_tokens - (len(emitted) - n))))

    def kv_reselect(n: int) -> None:
        # KVFlash relevance (spec/kvflash_gate.md §1.4): after each step, rescore and re-page
        # the pool when the cadence max(tau, history // 45) is due.
        if pager is not None and pager.scorer is not None and not done():
            t0 = clock.start()
            pager.maybe_reselect(np.concatenate([prompt, emitted]), len(emitted), n)
            clock.stop("reselect", t0)

    kv_reselect(1)  # the first generated token came from the prefill

    def plain_step():
        nonlocal anchor, s, last_logits
        t0 = clock.start()
        out = target.forward([anchor], state)
        wall = clock.stop("plain", t0)
        result.target_forward_passes += 1
        if clock.modelled is not None:
            clock.modelled += cost_model.t_ar
        last_logits = out.logits
        anchor = int(sample_tokens(be, out.logits, temperature, rng)[0])
        emitted.append(anchor)
        report(1)
        s += 1
        kv_reselect(1)
        return wall

    spec = cache is not None
    if gate is not None:
        gate.begin_turn()
        if isinstance(gate, CommitEmaGate) and not sampled:
            spec = spec and not gate.pure_ar_turn(max_new_tokens)
            if spec and gate.needs_t_ar_warmup:
                walls = [plain_step() for _ in range(3) if not done()]
                if cost_model is not None:
                    walls = [cost_model.t_ar] * len(walls)
                need = 1 if gate.version.t_ar_per_turn else 2
                if len(walls) >= 3:
                    gate.set_t_ar(walls[-need:])

    # 2. the loop
    while not done():
        if spec and gate is not None:
            if isinstance(gate, EntropyGate):
                decision = gate.decide(p1_from_logits(be, last_logits[-1]))
            else:
                decision = gate.decide()
            result.gate_decisions.append(decision)
            if decision.floor:
                spec = False
                result.floored_at = len(emitted)
        if not spec:
            plain_step()
            continue
        step_t0 = clock.start()
        # b. draft from the committed features 0..s-1
        t0 = clock.start()
        cache.extend(state.features.rows(cache.length, s), np.arange(cache.length, s))
        draft_logits = cache.forward_block(anchor, s)  # [B_drafter, V]
        clock.stop("draft", t0)
        if verify == "chain":
            block = np.concatenate([[anchor], drafter.draft_tokens(draft_logits)[: B - 1]])
            # c. verify the block at positions s..s+B-1
            t0 = clock.start()
            out = target.forward(block, state)
            clock.stop("verify", t0)
            res = (verify_chain_sampled(be, block, out.logits, temperature, rng) if sampled
                   else verify_chain_greedy(be, block, out.logits))
            # e. keep rows 0..a: KV, features, GDN
            state.rollback(s + res.a + 1)
            last_logits = out.logits[res.a: res.a + 1]
            width, drafted = B, B - 1
        else:
            tree = build_ddtree(be, anchor, draft_logits[1:B], tree_options)
            t0 = clock.start()
            out = target.forward_tree(tree.tokens, tree.parents, state)
            clock.stop("verify", t0)
            res = verify_tree(be, tree, out.logits)
            state.commit_path(res.path)
            last_logits = out.logits[res.path[-1]: res.path[-1] + 1]
            width, drafted = tree.n_nodes, tree.n_nodes - 1
        result.target_forward_passes += 1
        committed = list(res.committed)
        emitted.extend(committed)
        report(len(committed))
        s += len(committed)
        anchor = committed[-1]
        kv_reselect(len(committed))
        result.acceptance_lengths.append(res.a + 1)
        result.drafted.append(drafted)
        if verify == "chain":
            result.per_position_accepted[: res.a] += 1
        wall = clock.elapsed(step_t0)  # the gate's step_wall, not a phase of its own
        if clock.modelled is not None:
            clock.modelled += cost_model.spec_step(B, width)
        if gate is not None:
            if cost_model is not None:
                gate.record_step(res.a + 1, cost_model.t_ar, cost_model.spec_step(B, width))
            else:
                gate.record_step(res.a + 1, getattr(gate, "t_ar", None), wall)

    # 3. cut after max_new_tokens and after the first stop token
    tokens = emitted[:max_new_tokens]
    for i, t in enumerate(tokens):
        if t in stops:
            tokens = tokens[: i + 1]
            break
    result.tokens = [int(t) for t in tokens]
    clock.stop("total", t_total)
    result.timings = clock.walls
    result.modelled_time = clock.modelled
    return result
