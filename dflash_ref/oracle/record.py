"""The golden-vector recorder: an observer of :func:`~dflash_ref.spec_decode.loop.generate`.

``generate(..., observer=Recorder(target, drafter))`` reports each event of the loop
(:mod:`dflash_ref.spec_decode.observe`) and the recorder writes what it saw under the
golden-vector keys (:mod:`dflash_ref.oracle.layout`): the gate's decision, the drafter's context
and block, the target's forwards (with a tap for the per-layer intermediates of detail steps),
and after each commit the state, when it is snapshotted. It reads no verify mode: a step's kind
follows from what ran.

A step opens with its first event (gate decision, draft context, draft, or a target forward
when the current step already ran one) and has a kind: ``prefill``, ``chain``, ``tree`` or
``plain``. Keys are recorded in execution order; the committed rows' features are placed right
after the forward that computed them (after each capture layer's ``h`` when intermediates are
recorded).
"""

from __future__ import annotations

import numpy as np

from dflash_ref.oracle.layout import tensor_key
from dflash_ref.spec_decode.observe import Observer


def _host(be, x) -> np.ndarray:
    a = np.asarray(be.to_numpy(x))
    if a.dtype.kind == "f":
        return a.astype(np.float32)
    if a.dtype.kind in "iub":
        return a.astype(np.int64)
    return a


class Recorder(Observer):
    """Tensors by key in execution order, plus one descriptive dict per step.

    The prefill computes every row's logits while recording (``full_prefill_logits``), as it
    always has for the committed cases.

    Args:
        target: the :class:`~dflash_ref.models.target.TargetModel` generate runs.
        drafter: its drafter (it encodes the context rows for ``encoder_out``), or None.
        detail_steps: steps whose target forward records every layer's intermediates
            (``embed``, ``attn_norm``, ``q``/``k``/``v`` before and after RoPE, ``attn_out``,
            ``mlp_norm``, ``mlp_out``, ``h``).
        prefill_logits: "last" (the row that samples the first token) or "all".
    """

    full_prefill_logits = True

    def __init__(self, target, drafter=None, detail_steps=(), prefill_logits: str = "last"):
        self.target, self.drafter, self.be = target, drafter, target.be
        self.detail_steps = {int(s) for s in detail_steps}
        self.prefill_logits = prefill_logits
        self.tensors: dict[str, np.ndarray | None] = {}
        self.steps: list[dict] = []
        self.state = None  # the request's TargetState (on_start)
        self.pager = None
        self._feature_keys: dict[int, str] = {}  # capture layer -> placeholder key this step

    # ------------------------------------------------------------------ steps and keys

    @property
    def step(self) -> int:
        return len(self.steps) - 1

    def open_step(self, kind: str | None = None) -> None:
        """Open a new step unless the current one has not run its target forward yet."""
        if not self.steps or self.steps[-1].get("forward_done"):
            self.steps.append({"step": len(self.steps), "kind": kind or "plain"})
        elif kind is not None:
            self.steps[-1]["kind"] = kind

    def put(self, component: str, name: str, x, layer: int | None = None, raw=False) -> str:
        key = tensor_key(self.step, component, name, layer)
        self.tensors[key] = x if raw else _host(self.be, x)
        return key

    def put_int(self, component: str, name: str, values, layer: int | None = None) -> str:
        return self.put(component, name, np.asarray(values, dtype=np.int64).reshape(-1), layer,
                        raw=True)

    def put_float64(self, component: str, name: str, values) -> str:
        return self.put(component, name, np.asarray(values, dtype=np.float64).reshape(-1),
                        raw=True)

    # ------------------------------------------------------------------ the observer's events

    def on_start(self, state) -> None:
        self.state, self.pager = state, state.pager

    def on_gate(self, observation, decision) -> None:
        """The gate's input and decision open the step."""
        self.open_step()
        self.put_int("gate", "n_generated", [observation.n_generated])
        if decision.p1 is not None:
            self.put_float64("gate", "p1", [decision.p1])
        self.put_float64("gate", "ema", [decision.ema])
        self.put_int("gate", "streak", [decision.streak])
        self.put_int("gate", "n_draft_steps", [decision.n_draft_steps])
        self.put_int("gate", "floor", [int(decision.floor)])
        self.steps[-1]["gate_reason"] = decision.reason

    def _drafted(self) -> None:
        self.open_step()
        self.steps[-1]["drafted"] = True

    def on_draft_context(self, features, positions) -> None:
        """The positions joining the drafter's context and their encoding."""
        self._drafted()
        pos = np.asarray(positions, dtype=np.int64).reshape(-1)
        self.put_int("drafter", "context_positions", pos)
        if pos.size:
            self.put("drafter", "encoder_out", self.drafter.encode(features))

    def on_draft(self, anchor, positions, logits, proposal) -> None:
        """The drafter's block, its logits (rows 1..), and greedy draft tokens."""
        self._drafted()
        n = len(positions)
        mask = self.drafter.config.mask_token_id
        self.put_int("drafter", "block_ids", [anchor] + [mask] * (n - 1))
        self.put_int("drafter", "block_positions", positions)
        self.put("drafter", "draft_logits", logits[1:])
        if proposal is not None and proposal.q is None:  # the layout holds greedy drafts only
            self.put_int("drafter", "draft_tokens", proposal.tokens)

    def before_forward(self, ids, positions, parents=None):
        """Record the forward's inputs; returns the tap to pass (None without detail)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        first = not self.steps
        self.open_step("prefill" if first else ("tree" if parents is not None else None))
        info = self.steps[-1]
        if info["kind"] == "plain" and info.get("drafted"):
            info["kind"] = "chain"
        info["start"] = int(positions[0])
        self.put_int("target", "input_ids", ids)
        self.put_int("target", "positions", positions)
        if parents is not None:
            self.put_int("target", "tree_parents", parents)
        capture = list(self.target.target_layer_ids)
        self._feature_keys = {}
        if self.step in self.detail_steps and parents is None:  # a tree forward takes no tap
            self.put("target", "embed", self.target.embed(np.asarray(ids)))
            return self._tap
        for layer in capture:  # placeholders: filled with the committed rows at on_commit
            self._feature_keys[layer] = self._placeholder("features", layer)
        return None

    def _placeholder(self, name: str, layer: int) -> str:
        key = tensor_key(self.step, "target", name, layer)
        self.tensors[key] = None
        return key

    def _tap(self, layer: int, name: str, x) -> None:
        self.put("target", name, x, layer)
        if name == "h" and layer in self.target.target_layer_ids:
            self._feature_keys[layer] = self._placeholder("features", layer)

    def after_forward(self, logits) -> None:
        if self.steps[-1]["kind"] == "prefill" and self.prefill_logits == "last":
            logits = logits[-1:]
        self.put("target", "logits", logits)
        self.steps[-1]["forward_done"] = True

    # ------------------------------------------------------------------ commit

    def on_commit(self, tokens) -> None:
        """What the step committed, then the state after its rollback / path commit."""
        info, st = self.steps[-1], self.state
        kind = info["kind"]
        if kind in ("chain", "tree"):
            self.put_int("verify", "accepted", [len(tokens) - 1])
        self.put_int("verify", "bonus", [tokens[-1]])
        self.put_int("verify", "committed", tokens)
        info["committed"] = [int(t) for t in tokens]
        start, H = info["start"], self.target.config.hidden_size
        if st.features is not None and self._feature_keys:
            rows = _host(self.be, st.features.rows(start, st.length))
            for c, layer in enumerate(self.target.target_layer_ids):
                self.tensors[self._feature_keys[layer]] = rows[:, c * H:(c + 1) * H].copy()
        self._feature_keys = {}
        self.put_int("state", "length", [st.length])
        if st.features is not None:
            self.put_int("state", "features_length", [len(st.features)])
        for i in sorted(st.kv):
            self.put_int("state", "kv_length", [st.kv[i].length], layer=i)
        for i in sorted(st.gdn):
            if st.gdn[i] is not None:
                self.put("state", "gdn_recurrent", st.gdn[i].recurrent, layer=i)
                self.put("state", "gdn_conv", st.gdn[i].conv, layer=i)
        if self.pager is not None:
            self.put_int("pager", "chunk_blocks", self.pager.chunk_blocks())
            self.put_int("pager", "slot_positions", self.pager.fill_slot_pos())
        info["forward_done"] = True  # the next event opens a new step

    def finished(self) -> dict[str, np.ndarray]:
        """The recorded tensors (placeholders never filled are dropped: uncommitted forwards)."""
        return {k: v for k, v in self.tensors.items() if v is not None}
