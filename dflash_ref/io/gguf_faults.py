"""The checks of ``dflash-ref check-gguf`` (:mod:`dflash_ref.io.check_gguf`, which lists them
with the off-by-one heuristics; docs/check_gguf.md): each reads a drafter GGUF's header (and the
target's, when given) and returns its :class:`Fault` lines."""

from __future__ import annotations

import re
from dataclasses import dataclass

from dflash_ref.config import DFLASH2_KEYS, build_target_layer_ids
from dflash_ref.errors import DFlashRefError
from dflash_ref.io.gguf_io import GGUFFile
from dflash_ref.io.names import (
    DFLASH2_GLOBAL_NAMES,
    DFLASH2_LAYER_NAMES,
    DSPARK_GLOBAL_NAMES,
    GLOBAL_NAMES,
    LAYER_NAMES,
)

CARRIED = ("token_embd.weight", "output.weight")  # the target's, which a drafter file may carry
D2T = ("d2t", "d2t.weight")  # the draft -> target id map of a reduced draft vocabulary
TOKENIZER_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.tokens")
SWA_FAMILIES = ("gemma3",)  # target archs whose config always has sliding windows
_BLK = re.compile(r"^blk\.(\d+)\.(.+)$")
RECONVERT = "re-convert the checkpoint: dflash-ref convert DRAFTER_DIR OUT.gguf --target TARGET_DIR"


@dataclass(frozen=True)
class Fault:
    """One fault: its kind (the table of dflash_ref/io/check_gguf.py), what is wrong, the fix."""

    kind: str
    what: str
    fix: str

    def line(self) -> str:
        return f"{self.kind}: {self.what}; fix: {self.fix}"


@dataclass(frozen=True)
class Drafter:
    """What the checks read of a drafter GGUF (header only)."""

    g: GGUFFile
    flavour: str  # "dflash" (llama.cpp naming) or "lucebox"

    def get_int(self, key: str) -> int | None:
        v = self.g.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    def shape(self, name: str) -> tuple[int, ...] | None:
        return self.g.tensor_info(name).numpy_shape if name in self.g else None

    @property
    def fc(self) -> str:
        return "fc.weight" if self.flavour == "dflash" else "dflash.fc.weight"

    @property
    def mask_key(self) -> str:
        return ("tokenizer.ggml.mask_token_id" if self.flavour == "dflash"
                else "dflash.mask_token_id")

    def stored_ids(self) -> list[int] | None:
        key = "target_layers" if self.flavour == "dflash" else "dflash.target_layer_ids"
        v = self.g.get(key)
        return list(v) if isinstance(v, list) and all(isinstance(x, int) for x in v) else None

    def hf_ids(self) -> list[int] | None:
        ids = self.stored_ids()
        if ids is None:
            return None
        return [i - 1 for i in ids] if self.flavour == "dflash" else ids


# the checks: each (drafter, target or None) -> faults


def check_tokenizer(d: Drafter, t: GGUFFile | None) -> list[Fault]:
    """llama.cpp loads a draft model's vocabulary like any model's: the keys must be there."""
    missing = [k for k in TOKENIZER_KEYS if k not in d.g.metadata]
    faults = []
    if missing:
        faults.append(Fault("tokenizer", f"{', '.join(missing)} missing (llama.cpp refuses the "
                            f"file: 'key not found in model: {missing[0]}')",
                            "re-convert with the target so its vocabulary is carried: dflash-ref "
                            "convert DRAFTER_DIR OUT.gguf --target TARGET_DIR"))
    mask = d.get_int(d.mask_key)
    if mask is None:
        faults.append(Fault("tokenizer", f"{d.mask_key} missing: the drafter's block is filled "
                            f"with this token", "re-convert from the checkpoint (its "
                            "dflash_config.mask_token_id)"))
    vocab = _target_vocab(d, t)
    if mask is not None and vocab is not None and mask >= vocab:
        faults.append(Fault("tokenizer", f"{d.mask_key} {mask} is outside the vocabulary of "
                            f"{vocab}", "re-convert with the target the drafter was trained for"))
    return faults


def _target_vocab(d: Drafter, t: GGUFFile | None) -> int | None:
    """The target's vocabulary size: --target's, else the tokens the drafter carries."""
    g = t if t is not None else d.g
    tokens = g.get("tokenizer.ggml.tokens")
    if t is not None and "token_embd.weight" in t:
        return t.tensor_info("token_embd.weight").numpy_shape[0]
    return len(tokens) if isinstance(tokens, list) else None


def check_layer_ids(d: Drafter, t: GGUFFile | None) -> list[Fault]:
    stored, ids = d.stored_ids(), d.hf_ids()
    key = d.g.arch_key("target_layers" if d.flavour == "dflash" else "dflash.target_layer_ids")
    if stored is None:
        if d.flavour == "lucebox":
            return []  # lucebox files may leave the ids to the default formula
        return [Fault("layer-ids", f"{key} missing: which target layers feed the drafter is "
                      f"unknown", RECONVERT)]
    faults = []
    fc, H = d.shape(d.fc), d.get_int("embedding_length")
    if fc is not None and H and fc[1] % H == 0 and fc[1] // H != len(stored):
        faults.append(Fault("layer-ids", f"{key} lists {len(stored)} layers but {d.fc} "
                            f"{list(fc)} implies {fc[1] // H} captures", RECONVERT))
    if d.flavour == "dflash" and min(stored) < 1:
        faults.append(Fault("layer-ids", f"{key} {stored} holds {min(stored)}, but the llama.cpp "
                            f"naming stores HF id + 1 (>= 1): the ids were written raw and "
                            f"llama.cpp captures one layer early",
                            f"store {[i + 1 for i in stored]} ({RECONVERT})"))
    if t is None:
        return faults
    L = t.get("block_count")
    if not isinstance(L, int):
        return faults
    return faults + _ids_vs_target(key, stored, ids, L, len(stored), d.flavour)


def _ids_vs_target(key, stored, ids, L, C, flavour) -> list[Fault]:
    out = [i for i in ids if not 0 <= i < L]
    if out:
        return [Fault("layer-ids", f"{key} {stored} names HF layer(s) {out} outside the target's "
                      f"{L} layers (0..{L - 1})", f"use the drafter trained for this target, "
                      f"or {RECONVERT}")]
    if L - 1 in ids:
        return [Fault("layer-ids", f"{key} {stored} captures HF layer {L - 1}, the target's last "
                      f"(its output is final-normed; DFlash never captures it): off by one",
                      f"store {[s - 1 for s in stored]} ({RECONVERT})")]
    try:
        default = build_target_layer_ids(L, C)
    except DFlashRefError:
        return []
    for shift, how in ((-1, "raw ids where the llama.cpp naming stores + 1"),
                       (1, "ids + 1 where raw ids are due")):
        if ids == [i + shift for i in default] and (flavour == "dflash") == (shift == -1):
            good = [i + 1 for i in default] if flavour == "dflash" else default
            return [Fault("layer-ids", f"{key} {stored} decodes to HF ids {ids}, the default "
                          f"ids {default} shifted by {shift:+d}: {how}", f"store {good}")]
    return []


def check_sliding_window(d: Drafter, t: GGUFFile | None) -> list[Fault]:
    pattern = d.g.get("attention.sliding_window_pattern")
    window = d.get_int("attention.sliding_window")
    faults = []
    slides = isinstance(pattern, list) and any(pattern)
    if slides and not window:
        faults.append(Fault("sliding-window", f"{d.g.arch_key('attention.sliding_window_pattern')}"
                            f" marks sliding layers but {d.g.arch_key('attention.sliding_window')}"
                            f" is missing or 0 (the layers would attend to everything)",
                            RECONVERT))
    if d.g.get("rope.freq_base_swa") is not None and not slides:
        faults.append(Fault("sliding-window", f"{d.g.arch_key('rope.freq_base_swa')} is set (the "
                            f"config has sliding layers) but no sliding pattern / window says "
                            f"which", RECONVERT))
    if window and pattern is None:
        faults.append(Fault("sliding-window", f"{d.g.arch_key('attention.sliding_window')} "
                            f"{window} without {d.g.arch_key('attention.sliding_window_pattern')}"
                            f": which layers slide is unknown", RECONVERT))
    if t is not None and t.arch in SWA_FAMILIES and not t.get("attention.sliding_window"):
        faults.append(Fault("sliding-window", f"the target ({t.arch}) has sliding layers in its "
                            f"config but {t.arch_key('attention.sliding_window')} is missing or "
                            f"0: llama.cpp then runs every layer global",
                            "re-convert the target with its sliding_window"))
    return faults


def check_dflash2_layout(d: Drafter, t: GGUFFile | None) -> list[Fault]:
    """DFlash 2 as upstream llama.cpp reads it (docs/formats.md, "DFlash drafter names")."""
    names = d.g.tensor_names
    old = [n for n in names if n.startswith(("candidate_selector.", "layers."))
           or re.match(r"^blk\.\d+\.(attn|ffn)_conv_base\.weight$", n)
           or n in ("selector_predecessor", "selector_successor", "selector_hidden")]
    new = [n for n in names if n in DFLASH2_GLOBAL_NAMES or
           (_BLK.match(n) and _BLK.match(n).group(2) in DFLASH2_LAYER_NAMES)]
    faults = []
    if old:
        faults.append(Fault("old-dflash2", f"tensor(s) {old[:4]} are in a DFlash 2 spelling "
                            f"llama.cpp does not load", f"{RECONVERT} (llama.cpp naming)"))
    if not (old or new):
        return faults
    if d.flavour == "lucebox":
        faults.append(Fault("old-dflash2", "DFlash 2 tensors in the lucebox naming, which has "
                            "none: the file runs as plain DFlash", f"{RECONVERT} --naming "
                            f"llama.cpp"))
        return faults
    missing = [d.g.arch_key(k) for k in DFLASH2_KEYS if d.get_int(k) is None]
    if missing:
        faults.append(Fault("old-dflash2", f"DFlash 2 tensors without the size key(s) {missing} "
                            f"(the layout before llama.cpp read DFlash 2)", RECONVERT))
    if new and "selector_hidden.weight" not in names:
        faults.append(Fault("old-dflash2", "DFlash 2 tensors without selector_hidden.weight: "
                            "llama.cpp switches to DFlash 2 on it and runs this as plain DFlash",
                            RECONVERT))
    return faults


def draft_vocab(d: Drafter) -> int | None:
    """The rows of the drafter's own lm_head (``output.weight``); None when it borrows the
    target's, so its vocabulary is the target's (a smaller ``vocab_size`` is then a pairing
    fault, not a reduced vocabulary)."""
    out = d.shape("output.weight")
    return out[0] if out is not None else None


def check_draft_vocab(d: Drafter, t: GGUFFile | None) -> list[Fault]:
    V, v = _target_vocab(d, t), draft_vocab(d)
    if "d2t" in d.g:
        return _d2t_faults(d, v)
    if V is None or v is None or v >= V or any(n in d.g for n in D2T):
        return []
    return [Fault("draft-vocab", f"the draft vocabulary has {v} entries, the target's {V}, and "
                  f"there is no d2t map: draft ids cannot be turned into target ids",
                  "convert with the checkpoint's d2t tensor, or use a full-vocabulary drafter")]


def _d2t_faults(d: Drafter, v: int | None) -> list[Fault]:
    """llama.cpp asserts d2t is I64 with one entry per row of ``output.weight``
    (src/models/dflash.cpp); its values are checked where the file loads (io/draft_vocab.py)."""
    info = d.g.tensor_info("d2t")
    faults = []
    if info.ggml_type != "I64":
        faults.append(Fault("draft-vocab", f"d2t is {info.ggml_type}, but llama.cpp reads it as "
                            f"I64 absolute target ids (GGML_ASSERT)", RECONVERT))
    if v is not None and info.numpy_shape != (v,):
        faults.append(Fault("draft-vocab", f"d2t has shape {list(info.numpy_shape)} but "
                            f"output.weight has {v} draft rows", RECONVERT))
    if v is None:
        faults.append(Fault("draft-vocab", "d2t without the drafter's own output.weight: the "
                            "draft rows it maps are missing", RECONVERT))
    return faults


def check_pairing(d: Drafter, t: GGUFFile | None) -> list[Fault]:
    if t is None:
        return []
    H, Ht = d.get_int("embedding_length"), t.get("embedding_length")
    faults = []
    if H is not None and H != Ht:
        faults.append(Fault("pairing", f"drafter width {d.g.arch_key('embedding_length')} {H} "
                            f"!= target {t.arch_key('embedding_length')} {Ht} (the drafter uses "
                            f"the target's embedding and lm_head)", "use the drafter trained "
                            "for this target"))
    th = d.get_int("target_hidden_size")
    if th is not None and th != Ht:
        faults.append(Fault("pairing", f"{d.g.arch_key('target_hidden_size')} {th} != target "
                            f"width {Ht}", "use the drafter trained for this target"))
    fc = d.shape(d.fc)
    if fc is not None and isinstance(Ht, int) and Ht and fc[1] % Ht:
        faults.append(Fault("pairing", f"{d.fc} {list(fc)} reads {fc[1]} features, not a "
                            f"multiple of the target width {Ht}", "use the drafter trained for "
                            "this target"))
    return faults + _vocab_pairing(d, t)


def _vocab_pairing(d: Drafter, t: GGUFFile) -> list[Fault]:
    V, v = _target_vocab(d, t), d.get_int("vocab_size")
    faults = []
    reduced = v is not None and V is not None and v < V and any(n in d.g for n in D2T)
    if v is not None and V is not None and v != V and not reduced:
        faults.append(Fault("pairing", f"drafter {d.g.arch_key('vocab_size')} {v} != target "
                            f"vocabulary {V}", "use the drafter trained for this target"))
    mine, theirs = d.g.get("tokenizer.ggml.tokens"), t.get("tokenizer.ggml.tokens")
    if isinstance(mine, list) and isinstance(theirs, list) and mine != theirs:
        diff = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b),
                    min(len(mine), len(theirs)))
        faults.append(Fault("pairing", f"the drafter's tokens ({len(mine)}) differ from the "
                            f"target's ({len(theirs)}) from id {diff} on", "re-convert the "
                            "drafter with this target's tokenizer (--target)"))
    return faults


def claimed(name: str, d: Drafter, n_layers: int | None) -> bool:
    """True when the drafter architecture of ``d``'s naming loads tensor ``name``."""
    if name in GLOBAL_NAMES[d.flavour] or name in CARRIED or name in D2T:
        return True
    if d.flavour == "dflash" and name in DSPARK_GLOBAL_NAMES:
        return True
    m = _BLK.match(name)
    if m is None or (n_layers is not None and int(m.group(1)) >= n_layers):
        return False
    stem = m.group(2)
    if stem.endswith(".weight") and stem[: -len(".weight")] in LAYER_NAMES:
        return True
    return d.flavour == "dflash" and stem in DFLASH2_LAYER_NAMES


def check_tensors(d: Drafter, t: GGUFFile | None) -> list[Fault]:
    n_layers = d.get_int("block_count")
    extra = [n for n in d.g.tensor_names if not claimed(n, d, n_layers)]
    old2 = {n for f in check_dflash2_layout(d, t) for n in extra if n in f.what}
    extra = [n for n in extra if n not in old2]  # reported as old DFlash 2 already
    if not extra:
        return []
    more = f" and {len(extra) - 6} more" if len(extra) > 6 else ""
    return [Fault("unclaimed-tensor", f"tensor(s) {extra[:6]}{more} are not part of the "
                  f"{d.g.arch} architecture ({n_layers} blocks): llama.cpp refuses a file with "
                  f"tensors it does not load", f"{RECONVERT}, or drop them")]


def check_rope(d: Drafter, t: GGUFFile | None) -> list[Fault]:
    base = d.g.get("rope.freq_base")
    if base is None:
        return [Fault("rope", f"{d.g.arch_key('rope.freq_base')} missing: llama.cpp falls back "
                      f"to 10000", RECONVERT)]
    if t is None:
        return []
    faults = []
    for key in ("rope.freq_base", "rope.scaling.type", "rope.scaling.factor"):
        mine, theirs = d.g.get(key), t.get(key)
        if theirs is not None and mine != theirs and not _both_linear_none(key, mine, theirs):
            faults.append(Fault("rope", f"drafter {d.g.arch_key(key)} {mine} != target "
                                f"{t.arch_key(key)} {theirs} (the drafter reads the target's "
                                f"positions: a default 10000 usually means a missed nested "
                                f"rope_parameters)", RECONVERT))
    return faults


def _both_linear_none(key, mine, theirs) -> bool:
    return key == "rope.scaling.type" and {mine, theirs} <= {None, "none"}
