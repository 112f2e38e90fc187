"""The field's reasons for low acceptance, as named checks (docs/acceptance.md, "The field's
reasons for low acceptance").

Each check measures one thing users of DFlash stacks report as the cause of a low tau, and
returns a :class:`FieldFinding` (a name, "ok" or "warn", one sentence with the numbers):

- **template** (:func:`template_check`): tau with the prompts rendered as the drafter was
  trained vs as served (raw text, the chat template, the chat template with thinking on);
- **domain** (:func:`domain_check`): tau by prompt set against the set of the training domain;
- **quantized target** (:func:`quantized_target_check`): the target re-quantized by the
  project's own quantizer (:mod:`dflash_ref.io.quant`) against the target as loaded: top-1
  agreement, captured-feature drift and the tau each gives;
- **context limit** (:func:`context_limit_check`): tau before and after each position limit of
  both models that the run reaches (``max_position_embeddings``, sliding windows);
- **layer offset** (:func:`layer_offset_check`): tau with the capture layer ids as configured
  and one lower / one higher.

The statistics. A prompt is the independent unit: its tau is the mean ``a + 1`` of its spec
steps (steps of one prompt are correlated, so they are not counted as independent trials). Two
runs over the same prompts compare by the paired differences of their per-prompt tau; two
prompt sets by Welch's difference of means. A difference is **significant** when its 99%
confidence interval (Student's t, :mod:`~dflash_ref.diagnose.field_stats`) excludes 0; a check
warns only on a significant difference in the harmful direction.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dflash_ref.diagnose.field_stats import paired_difference, welch_difference
from dflash_ref.diagnose.steps import Step, StepLog
from dflash_ref.io.quant import Q8_0_BLOCK, QK_K, quantize_q4_k, quantize_q8_0
from dflash_ref.ops.dequant import dequantize_q4_k, dequantize_q8_0
from dflash_ref.spec_decode.loop import generate


@dataclass(frozen=True)
class FieldFinding:
    """One check's result: ``name``, ``status`` ("ok" or "warn"), one sentence with numbers."""

    name: str
    status: str
    message: str

    def line(self) -> str:
        return f"field {self.name:16s} {self.status:4s} {self.message}"


# ------------------------------------------------------------------------------ runs


def prompt_steps(target, drafter, prompts, max_new_tokens: int,
                 block_size: int | None = None) -> list[list[Step]]:
    """Greedy chain decoding of each prompt, watched: the :class:`Step` records per prompt."""
    out = []
    for p in prompts:
        log = StepLog()
        generate(target, drafter, np.asarray(p), max_new_tokens, block_size=block_size,
                 observer=log)
        out.append(log.steps)
    return out


def tau_of(steps: Sequence[Step]) -> float:
    """Mean ``a + 1`` of ``steps`` (NaN for none)."""
    return float(np.mean([s.a + 1 for s in steps])) if steps else float("nan")


def prompt_taus(target, drafter, prompts, max_new_tokens: int,
                block_size: int | None = None) -> np.ndarray:
    """tau of each prompt [n]."""
    return np.array([tau_of(s) for s in prompt_steps(target, drafter, prompts, max_new_tokens,
                                                       block_size)])


def _pooled(taus) -> float:
    return float(np.nanmean(taus))


# ------------------------------------------------------------------------------ template


def renderings(tokenizer, text: str, template: str | None = None) -> dict[str, list[int]]:
    """``text`` as prompt ids, each way a server may render it: "raw" (plain encode), "chat"
    (one user turn through the chat template, thinking off) and "chat, thinking" (thinking on;
    left out when the template renders it the same). ``template``: the tokenizer's own when
    None; without any, raw only."""
    out = {"raw": tokenizer.encode(text)}
    if template is None and tokenizer.chat_template is None:
        return out
    msgs = [{"role": "user", "content": text}]
    chats = {name: tokenizer.apply_chat_template(msgs, chat_template=template,
                                                 enable_thinking=on)
             for name, on in (("chat", False), ("chat, thinking", True))}
    out["chat"] = tokenizer.encode(chats["chat"], add_bos=False)
    if chats["chat, thinking"] != chats["chat"]:
        out["chat, thinking"] = tokenizer.encode(chats["chat, thinking"], add_bos=False)
    return out


def template_check(target, drafter, texts: Sequence[str], tokenizer, served: str, *,
                   trained: str | None = None, template: str | None = None,
                   max_new_tokens: int = 64) -> FieldFinding:
    """tau with ``texts`` rendered each way (:func:`renderings`): warns when the ``served``
    rendering's tau is significantly below the ``trained`` one's (paired by text; None: the
    best other rendering)."""
    ways = [renderings(tokenizer, t, template) for t in texts]
    names = list(ways[0])
    if served == "chat, thinking" and served not in names and "chat" in names:
        served = "chat"  # the template has no thinking switch: thinking on renders as chat
    for name in (served, trained):
        if name is not None and name not in names:
            raise ValueError(f"rendering {name!r} is not one of {names}")
    taus = {n: prompt_taus(target, drafter, [w[n] for w in ways], max_new_tokens)
            for n in names}
    ref = trained or max((n for n in names if n != served), key=lambda n: _pooled(taus[n]),
                         default=served)
    diff = paired_difference(taus[served], taus[ref])
    warn = ref != served and diff.significant and diff.mean < 0
    each = "; ".join(f"{n} {_pooled(taus[n]):.2f}" for n in names)
    how = "as trained" if trained else "the best other"
    return FieldFinding("template", "warn" if warn else "ok",
                   f"tau by rendering over {len(texts)} prompts: {each}; served ({served}) vs "
                   f"{ref} ({how}): {diff.text()}"
                   + (": render the prompts as the drafter was trained" if warn else ""))


# ------------------------------------------------------------------------------ domain


def domain_check(target, drafter, sets: Mapping[str, Sequence[Sequence[int]]], trained: str,
                 max_new_tokens: int = 64) -> FieldFinding:
    """tau of each prompt set (ids) against the set ``trained`` (the training domain): warns
    when a set's tau is significantly below it (Welch, per-prompt tau)."""
    if trained not in sets:
        raise ValueError(f"the training-domain set {trained!r} is not one of {list(sets)}")
    taus = {n: prompt_taus(target, drafter, p, max_new_tokens) for n, p in sets.items()}
    below, parts = [], []
    for name, t in taus.items():
        if name == trained:
            continue
        diff = welch_difference(t, taus[trained])
        parts.append(f"{name} {_pooled(t):.2f} ({diff.text()})")
        if diff.significant and diff.mean < 0:
            below.append(name)
    return FieldFinding("domain", "warn" if below else "ok",
                   f"tau {trained} (trained) {_pooled(taus[trained]):.2f}; "
                   + "; ".join(parts)
                   + (f": out of the training domain: {', '.join(below)}" if below else ""))


# ------------------------------------------------------------------------------ quantized


def requantize(w, fmt: str) -> np.ndarray:
    """A float matrix [rows, n] through ``fmt`` ("Q8_0" or "Q4_K") and back, row by row; a row
    is padded with zeros to a whole number of blocks (32 or 256) first, and cut after."""
    w = np.asarray(w, dtype=np.float32)
    block, quant, dequant = {"Q8_0": (Q8_0_BLOCK, quantize_q8_0, dequantize_q8_0),
                             "Q4_K": (QK_K, quantize_q4_k, dequantize_q4_k)}[fmt]
    padded = np.pad(w, ((0, 0), (0, -w.shape[1] % block)))  # [rows, n'] with n' % block == 0
    return dequant(quant(padded), padded.shape)[:, :w.shape[1]]


def requantized_target(target, weights: Mapping[str, np.ndarray], fmt: str):
    """A new target of ``target``'s config from ``weights`` with every matrix through ``fmt``
    (vectors, the norms, as they are), capturing the same layers."""
    q = {k: requantize(v, fmt) if np.ndim(v) == 2 else v for k, v in weights.items()}
    return type(target)(target.config, q, backend=target.be,
                        target_layer_ids=target.target_layer_ids)


def _rebound(drafter, target):
    """``drafter`` (a shallow copy) reading ``target``'s embedding, head and features."""
    d = copy.copy(drafter)
    d.target = target
    d.draft_head = copy.copy(drafter.draft_head)  # a head borrowed from the target follows it
    d.draft_head.target = target
    return d


def _teacher_forced(target, ids):
    """(greedy next ids [T], features [T, C*H]) of ``target`` over ``ids`` in one forward."""
    out = target.forward(np.asarray(ids), target.new_state())
    be = target.be
    return (be.to_numpy(out.logits).argmax(axis=1),
            np.asarray(be.to_numpy(out.features), dtype=np.float64))


def agreement_and_drift(reference, other, prompts, max_new_tokens: int):
    """Over each prompt + ``reference``'s greedy continuation: the fraction of the generated
    positions where both targets' argmax agree, the positions counted, and the relative drift
    ``||f_other - f_ref|| / ||f_ref||`` of each captured layer's features (Frobenius)."""
    agree, total = 0, 0
    num = den = 0.0
    H = reference.config.hidden_size
    for p in prompts:
        ids = list(p) + list(generate(reference, None, np.asarray(p), max_new_tokens).tokens)
        a, fa = _teacher_forced(reference, ids)
        b, fb = _teacher_forced(other, ids)
        gen = slice(len(p) - 1, len(ids) - 1)  # rows that predict the generated tokens
        agree += int(np.sum(a[gen] == b[gen]))
        total += len(ids) - len(p)
        diff = (fb - fa).reshape(len(ids), -1, H)  # [T, C, H]
        num = num + np.sum(diff ** 2, axis=(0, 2))
        den = den + np.sum(fa.reshape(len(ids), -1, H) ** 2, axis=(0, 2))
    return agree / max(total, 1), total, np.sqrt(num / den)


def quantized_target_check(target, drafter, prompts, weights: Mapping[str, np.ndarray],
                           fmt: str = "Q4_K", max_new_tokens: int = 64) -> FieldFinding:
    """The target rebuilt from ``weights`` (the float32 tensors it was loaded from) through
    ``fmt`` against ``target``: top-1 agreement, feature drift, tau each (paired by prompt);
    warns when the re-quantized target's tau is significantly lower."""
    other = requantized_target(target, weights, fmt)
    agree, n, drift = agreement_and_drift(target, other, prompts, max_new_tokens)
    base = prompt_taus(target, drafter, prompts, max_new_tokens)
    quant = prompt_taus(other, _rebound(drafter, other), prompts, max_new_tokens)
    diff = paired_difference(quant, base)
    warn = diff.significant and diff.mean < 0
    layers = ", ".join(str(i) for i in target.target_layer_ids)
    return FieldFinding("quantized target", "warn" if warn else "ok",
                   f"{fmt} vs as loaded: top-1 agreement {100 * agree:.1f}% over {n} positions, "
                   f"feature drift {' / '.join(f'{100 * x:.1f}%' for x in drift)} (layers "
                   f"{layers}); tau {_pooled(quant):.2f} vs {_pooled(base):.2f} ({diff.text()})"
                   + (f": the drafter drafts worse for the {fmt} target; serve the precision it "
                      f"was trained on" if warn else ""))


# ------------------------------------------------------------------------------ context


def position_limits(target, drafter) -> list[tuple[str, int]]:
    """(label, position) of each limit of both models: ``max_position_embeddings`` and, for
    a model with sliding layers, its window; sorted by position."""
    out = []
    for who, cfg in (("drafter", drafter.config), ("target", target.config)):
        if cfg.max_position_embeddings is not None:
            out.append((f"{who} max_position_embeddings", int(cfg.max_position_embeddings)))
        if cfg.sliding_window is not None and "sliding_attention" in cfg.layer_types:
            out.append((f"{who} sliding window", int(cfg.sliding_window)))
    return sorted(out, key=lambda x: x[1])


def _rope_note(target, drafter) -> str:
    scaled = [f"{who} {t} RoPE {r.rope_type} x{r.factor:g}"
              for who, cfg in (("drafter", drafter.config), ("target", target.config))
              for t, r in cfg.rope_by_type.items() if r.rope_type != "default"]
    return f" ({', '.join(scaled)})" if scaled else ""


def context_limit_check(target, drafter, prompts, max_new_tokens: int = 64) -> FieldFinding:
    """tau before vs after each limit of :func:`position_limits` inside the anchor positions
    the run reaches (paired by prompt, prompts with steps on both sides): warns when tau after
    a limit is significantly lower."""
    runs = prompt_steps(target, drafter, prompts, max_new_tokens)
    pos = [s.position for r in runs for s in r]
    if not pos:
        return FieldFinding("context limit", "ok", "no speculative step ran (max_new_tokens < 2?)")
    lo, hi = min(pos), max(pos)
    limits = position_limits(target, drafter)
    inside = [(label, at) for label, at in limits if lo < at <= hi]
    if not inside:
        marks = ", ".join(f"{label} {at}" for label, at in limits) or "none stated"
        return FieldFinding("context limit", "ok",
                       f"no limit inside the anchor positions {lo}..{hi} reached (limits: "
                       f"{marks}){_rope_note(target, drafter)}")
    parts, fell = [], []
    for label, at in inside:
        both = [r for r in runs if any(s.position < at for s in r)
                and any(s.position >= at for s in r)]
        before = [tau_of([s for s in r if s.position < at]) for r in both]
        after = [tau_of([s for s in r if s.position >= at]) for r in both]
        diff = paired_difference(after, before)
        parts.append(f"{label} {at}: tau {_pooled(before):.2f} before, {_pooled(after):.2f} "
                     f"after ({diff.text()}, {len(both)} prompts)")
        if diff.significant and diff.mean < 0:
            fell.append(f"{label} {at}")
    return FieldFinding("context limit", "warn" if fell else "ok",
                   "; ".join(parts) + _rope_note(target, drafter)
                   + (f": acceptance falls past {', '.join(fell)}" if fell else ""))


# ------------------------------------------------------------------------------ layers


def layer_offset_check(target, drafter, prompts, max_new_tokens: int = 64) -> FieldFinding:
    """tau with the capture layer ids as configured, one lower and one higher (where inside
    the target), paired by prompt: warns when an offset is significantly better."""
    ids = list(target.target_layer_ids)
    base = prompt_taus(target, drafter, prompts, max_new_tokens)
    parts, better = [f"ids {ids} (as configured) tau {_pooled(base):.2f}"], []
    for delta in (-1, +1):
        moved = [i + delta for i in ids]
        if min(moved) < 0 or max(moved) >= target.config.num_hidden_layers:
            parts.append(f"{moved} ({delta:+d}): outside the target")
            continue
        target.set_target_layer_ids(moved)
        try:
            taus = prompt_taus(target, drafter, prompts, max_new_tokens)
        finally:
            target.set_target_layer_ids(ids)
        diff = paired_difference(taus, base)
        parts.append(f"{moved} ({delta:+d}) {_pooled(taus):.2f} ({diff.text()})")
        if diff.significant and diff.mean > 0:
            better.append(f"{delta:+d}")
    return FieldFinding("layer offset", "warn" if better else "ok",
                   "; ".join(parts) + (f": the ids look off by {', '.join(better)}"
                                       if better else ""))


# ------------------------------------------------------------------------------ explain


PROBES = {
    "json": ['{"name": "Alice", "age": 30, "tags": [',
             '{"id": 17, "items": [{"sku": "A-1", "qty": 2}, ',
             '[{"x": 1.5, "y": -2.0}, {"x": 3.25, ',
             '{"config": {"debug": false, "port": 8080, "hosts": ["',
             '{"type": "Feature", "geometry": {"type": "Point", "coordinates": [',
             '{"user": {"login": "octocat", "id": 1, "url": "',
             '{"a": [1, 2, 3], "b": {"c": null, "d": true}, "e": "',
             '[["2024-01-01", 10.5], ["2024-01-02", 11.25], ['],
    "prose": ["The history of the Roman Empire spans",
              "Once upon a time, in a small village by the sea,",
              "To bake a simple loaf of bread, you will need",
              "The mitochondria is the part of the cell that",
              "Dear Sir or Madam, I am writing to inform you that",
              "The three primary colors are"],
}
"""Texts outside a code drafter's domain, for :func:`domain_check` (encode them first)."""


def checkpoint_weights(path) -> dict[str, np.ndarray]:
    """The float32 tensors of a target checkpoint: an HF directory or a GGUF (dequantized)."""
    from pathlib import Path

    if Path(path).is_dir():
        from dflash_ref.io.safetensors_io import load_checkpoint

        return load_checkpoint(path)
    from dflash_ref.io.convert_target import read_gguf_target

    return read_gguf_target(path)[1]


def standard_checks(target_path, max_new_tokens: int = 64, *, texts=None, tokenizer=None,
                    served: str = "raw", domains=None, trained_domain: str | None = None):
    """The checks ``explain(..., field=...)`` runs, each ``(target, drafter, prompts) ->
    FieldFinding``: layer offset, context limit, the target re-quantized to Q4_K from the checkpoint
    at ``target_path``; the template check with ``texts`` and a tokenizer (``served``: the
    rendering the prompts had); the domain check with prompt sets ``domains`` (ids) and the
    name of the trained one."""
    n = max_new_tokens
    out = [lambda t, d, p: layer_offset_check(t, d, p, n),
           lambda t, d, p: context_limit_check(t, d, p, n),
           lambda t, d, p: quantized_target_check(t, d, p, checkpoint_weights(target_path),
                                                  "Q4_K", n)]
    if texts and tokenizer is not None:
        out.append(lambda t, d, p: template_check(t, d, texts, tokenizer, served,
                                                  max_new_tokens=n))
    if domains and trained_domain is not None:
        out.append(lambda t, d, p: domain_check(t, d, domains, trained_domain, n))
    return out


__all__ = ["PROBES", "FieldFinding", "checkpoint_weights", "context_limit_check",
           "domain_check", "layer_offset_check", "quantized_target_check", "standard_checks",
           "template_check"]
