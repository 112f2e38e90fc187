"""A reduced draft vocabulary on disk: the drafter's own head rows and ``d2t``, the map from
draft ids to target ids (docs/drafter.md, "A reduced draft vocabulary"; docs/interop.md).

The two files say the same map two ways::

    z-lab directory   config.json "draft_vocab_size": Vd ("vocab_size": the target's V)
                      lm_head.weight [Vd, H], d2t [Vd] int64 OFFSETS (EAGLE-3 / SpecForge):
                      target id of draft row i = i + d2t[i]
    GGUF (llama.cpp)  output.weight ggml {H, Vd}, d2t I64 [Vd] ABSOLUTE target ids
                      (ggml-org/llama.cpp convert_hf_to_gguf's DSparkModel / Eagle3 write
                      ``d2t + arange``; src/models/dflash.cpp reads ``d2t`` and scatters)

Inside dflash_ref the map is held as absolute ids; :func:`absolute_ids` and :func:`offsets`
convert at the file's edge. :func:`check_d2t` is the one check of a map (length, range,
duplicates), run on the map alone before a weight of the drafter is read.
"""

from __future__ import annotations

import numpy as np

from dflash_ref.errors import FormatError

D2T = "d2t"
"""The map's tensor name, in the directory and in the GGUF."""
HEAD = {"lm_head.weight": "output.weight"}
"""The reduced head's name: the directory's -> the GGUF's (llama.cpp's LLM_TENSOR_OUTPUT)."""


def absolute_ids(d2t_offsets) -> np.ndarray:
    """The directory's offsets -> absolute target ids: ``t_i = i + d2t[i]``, [Vd] int64."""
    d = np.asarray(d2t_offsets).reshape(-1).astype(np.int64)  # [Vd]
    return d + np.arange(d.size, dtype=np.int64)


def offsets(target_ids) -> np.ndarray:
    """Absolute target ids -> the directory's offsets: ``d2t[i] = t_i - i``, [Vd] int64."""
    t = np.asarray(target_ids).reshape(-1).astype(np.int64)  # [Vd]
    return t - np.arange(t.size, dtype=np.int64)


def check_d2t(target_ids, draft_vocab_size: int, vocab_size: int | None, where: str) -> None:
    """Refuse a map that is not ``draft_vocab_size`` distinct ids in ``[0, vocab_size)``, with one
    line naming the first offending entry and the fix. ``target_ids``: absolute, [Vd]."""
    t = np.asarray(target_ids)
    fix = "re-export the drafter with the d2t of its training vocabulary"
    if not np.issubdtype(t.dtype, np.integer):
        raise FormatError(f"{where}: d2t has dtype {t.dtype}; it holds token ids (int64); {fix}")
    if t.ndim != 1 or t.size != draft_vocab_size:
        raise FormatError(f"{where}: d2t has shape {list(t.shape)} but draft_vocab_size is "
                          f"{draft_vocab_size}: one target id per draft row; {fix}")
    bad = np.flatnonzero((t < 0) | (t >= (vocab_size if vocab_size is not None else np.inf)))
    if bad.size:
        i = int(bad[0])
        raise FormatError(f"{where}: d2t maps draft row {i} to target id {int(t[i])}, outside the "
                          f"target vocabulary [0, {vocab_size}) ({bad.size} such rows); {fix}")
    ids, first, counts = np.unique(t, return_index=True, return_counts=True)
    if np.any(counts > 1):
        j = int(np.argmax(counts > 1))
        rows = np.flatnonzero(t == ids[j])
        raise FormatError(f"{where}: d2t maps draft rows {rows[:4].tolist()} to the same target "
                          f"id {int(ids[j])}; each target id may have one draft row; {fix}")


def d2t_from_checkpoint(ckpt, draft_vocab_size: int | None, vocab_size: int | None,
                        where: str) -> np.ndarray | None:
    """The absolute ids of a directory's ``d2t`` (offsets on disk), checked; reads that one
    tensor only (``ckpt``: an opened safetensors checkpoint). None for a drafter on the
    target's head (no ``draft_vocab_size``), which must then hold no d2t."""
    if draft_vocab_size is None:
        if D2T in ckpt:
            n = ckpt.info(D2T).shape
            raise FormatError(f"{where}: the checkpoint holds d2t {list(n)} (a reduced draft "
                              f"vocabulary) but config.json has no draft_vocab_size; add "
                              f"\"draft_vocab_size\": {n[0] if n else '?'} to config.json")
        return None
    if D2T not in ckpt:
        raise FormatError(f"{where}: config.json gives draft_vocab_size {draft_vocab_size} but the "
                          f"checkpoint has no d2t tensor (draft id -> target id); add it, or "
                          f"remove draft_vocab_size for a drafter on the target's full head")
    stored = ckpt.load_native(D2T)
    if not np.issubdtype(stored.dtype, np.integer):
        check_d2t(stored, draft_vocab_size, vocab_size, where)  # names the dtype
    ids = absolute_ids(stored) if stored.ndim == 1 else stored
    check_d2t(ids, draft_vocab_size, vocab_size, where)
    return ids


def d2t_from_gguf(g, vocab_size: int | None) -> np.ndarray:
    """The absolute ids of a GGUF's ``d2t`` (I64 absolute on disk), checked against its own
    length and ``vocab_size``; reads that one tensor only (``g``: an opened GGUF)."""
    info = g.tensor_info(D2T)
    where = g.path.name
    if info.ggml_type != "I64":
        raise FormatError(f"{where}: d2t is {info.ggml_type}; llama.cpp reads it as I64 absolute "
                          f"target ids; re-convert: dflash-ref convert DRAFTER_DIR OUT.gguf")
    ids = np.asarray(g.load_native(D2T)).reshape(-1)
    check_d2t(ids, ids.size, vocab_size, where)
    return ids


__all__ = ["D2T", "HEAD", "absolute_ids", "check_d2t", "d2t_from_checkpoint", "d2t_from_gguf",
           "offsets"]
