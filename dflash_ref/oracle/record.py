"""Recording proxies: watch :func:`~dflash_ref.spec_decode.loop.generate` without changing it.

The loop is handed stand-ins for the target, the drafter (and its draft cache) and the gate. Each
forwards every call to the real object and writes what it saw into a :class:`Recorder` under the
golden-vector keys (:mod:`dflash_ref.oracle.layout`); ``generate(on_commit=recorder.on_commit)``
reports what each step commits, after the state's rollback, when the state is snapshotted.

A step opens with its first event (gate check, draft-cache extend, draft, or a target forward
when the current step already ran one) and has a kind: ``prefill``, ``chain``, ``tree`` or
``plain``. Keys are recorded in execution order; the committed rows' features are placed right
after the forward that computed them (after each capture layer's ``h`` when intermediates are
recorded).
"""

from __future__ import annotations

import numpy as np

from dflash_ref.oracle.layout import tensor_key


def _host(be, x) -> np.ndarray:
    a = np.asarray(be.to_numpy(x))
    if a.dtype.kind == "f":
        return a.astype(np.float32)
    if a.dtype.kind in "iub":
        return a.astype(np.int64)
    return a


class Recorder:
    """Tensors by key in execution order, plus one descriptive dict per step.

    Args:
        target: the real :class:`~dflash_ref.models.target.TargetModel`.
        detail_steps: steps whose target forward records every layer's intermediates
            (``embed``, ``attn_norm``, ``q``/``k``/``v`` before and after RoPE, ``attn_out``,
            ``mlp_norm``, ``mlp_out``, ``h``).
        prefill_logits: "last" (the row that samples the first token) or "all".
    """

    def __init__(self, target, detail_steps=(), prefill_logits: str = "last"):
        self.target, self.be = target, target.be
        self.detail_steps = {int(s) for s in detail_steps}
        self.prefill_logits = prefill_logits
        self.tensors: dict[str, np.ndarray | None] = {}
        self.steps: list[dict] = []
        self.state = None  # the real TargetState (set by RecordingTarget.new_state)
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

    # ------------------------------------------------------------------ target forward

    def before_forward(self, ids, positions, parents=None) -> object:
        """Record the forward's inputs; returns the tap to pass (None without detail)."""
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

    def after_forward(self, out) -> None:
        logits = out.logits
        if self.steps[-1]["kind"] == "prefill" and self.prefill_logits == "last":
            logits = logits[-1:]
        self.put("target", "logits", logits)
        self.steps[-1]["forward_done"] = True

    # ------------------------------------------------------------------ commit

    def on_commit(self, tokens) -> None:
        """What the step committed (``generate(on_commit=...)``), then the state after it."""
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


class RecordingTarget:
    """Stands in for the target in ``generate``; forwards everything else to the real one."""

    def __init__(self, target, recorder: Recorder):
        self._target, self._rec = target, recorder

    def __getattr__(self, name):
        return getattr(self._target, name)

    def new_state(self, *args, **kwargs):
        state = self._target.new_state(*args, **kwargs)
        self._rec.state, self._rec.pager = state, kwargs.get("pager")
        return state

    def forward(self, ids, state, tap=None, logits_rows=None):
        # logits_rows is ignored: the case records every row (the loop reads the rows it needs)
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        my_tap = self._rec.before_forward(ids, state.length + np.arange(ids.size))
        if tap is not None and my_tap is not None:
            def both(layer, name, x, _a=tap, _b=my_tap):
                _a(layer, name, x)
                _b(layer, name, x)
            tap = both
        out = self._target.forward(ids, state, tap=tap or my_tap)
        self._rec.after_forward(out)
        return out

    def forward_tree(self, ids, parents, state):
        from dflash_ref.ops.masks import tree_depths

        parents = np.asarray(parents, dtype=np.int64).reshape(-1)
        self._rec.before_forward(ids, state.length + tree_depths(parents), parents)
        out = self._target.forward_tree(ids, parents, state)
        self._rec.after_forward(out)
        return out


class RecordingDraftCache:
    """Stands in for the drafter's :class:`~dflash_ref.models.drafter.DraftCache`."""

    def __init__(self, cache, drafter, recorder: Recorder):
        self._cache, self._drafter, self._rec = cache, drafter, recorder

    def __getattr__(self, name):
        return getattr(self._cache, name)

    def extend(self, features, positions):
        rec = self._rec
        rec.open_step()
        rec.steps[-1]["drafted"] = True
        pos = np.asarray(positions, dtype=np.int64).reshape(-1)
        rec.put_int("drafter", "context_positions", pos)
        if pos.size:
            rec.put("drafter", "encoder_out", self._drafter.encode(features))
        return self._cache.extend(features, positions)

    def forward_block(self, anchor_token, anchor_position, n_rows=None, with_hidden=False):
        rec, d = self._rec, self._drafter
        rec.open_step()
        rec.steps[-1]["drafted"] = True
        B = d.block_size if n_rows is None else int(n_rows)
        rec.put_int("drafter", "block_ids", [anchor_token] + [d.config.mask_token_id] * (B - 1))
        rec.put_int("drafter", "block_positions", anchor_position + np.arange(B))
        out = self._cache.forward_block(anchor_token, anchor_position, n_rows=n_rows,
                                        with_hidden=with_hidden)
        logits = out[0] if with_hidden else out
        rec.put("drafter", "draft_logits", logits[1:])
        return out


class RecordingDrafter:
    """Stands in for the drafter; its ``target`` is the recording target (the loop checks it)."""

    def __init__(self, drafter, target: RecordingTarget, recorder: Recorder):
        self._drafter, self.target, self._rec = drafter, target, recorder

    def __getattr__(self, name):
        return getattr(self._drafter, name)

    def new_cache(self, *args, **kwargs):
        return RecordingDraftCache(self._drafter.new_cache(*args, **kwargs), self._drafter,
                                   self._rec)

    def draft_tokens(self, logits):
        tokens = self._drafter.draft_tokens(logits)
        self._rec.put_int("drafter", "draft_tokens", tokens)
        return tokens

    def propose(self, hidden, logits, anchor):
        """The greedy draft (DFlash: argmax rows; DFlash 2: the selector's path), recorded."""
        tokens = self._drafter.propose(hidden, logits, anchor)
        self._rec.put_int("drafter", "draft_tokens", tokens)
        return tokens


class RecordingGate:
    """Stands in for a gate: records each observation and decision."""

    def __init__(self, gate, recorder: Recorder):
        self._gate, self._rec = gate, recorder

    def __getattr__(self, name):
        return getattr(self._gate, name)

    def check(self, observation):
        rec = self._rec
        rec.open_step()
        decision = self._gate.check(observation)
        rec.put_int("gate", "n_generated", [observation.n_generated])
        if decision.p1 is not None:
            rec.put_float64("gate", "p1", [decision.p1])
        rec.put_float64("gate", "ema", [decision.ema])
        rec.put_int("gate", "streak", [decision.streak])
        rec.put_int("gate", "n_draft_steps", [decision.n_draft_steps])
        rec.put_int("gate", "floor", [int(decision.floor)])
        rec.steps[-1]["gate_reason"] = decision.reason
        return decision
