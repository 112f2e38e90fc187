"""``dflash-ref check-gguf FILE [--target FILE]``: a conformance checker for DFlash drafter GGUFs
(docs/check_gguf.md).

It reads the header only (metadata and tensor names and shapes, never a weight) and names every
fault it finds, one line each with its fix:

==================  ===========================================================================
fault               what is checked
==================  ===========================================================================
tokenizer           ``tokenizer.ggml.model`` / ``tokens`` present (llama.cpp refuses a draft
                    without them), the mask token id present and inside the vocabulary
layer-ids           the captured target layers: count equal to the ``fc`` width's, stored ids
                    of the llama.cpp naming >= 1, every HF id below the target's block count
                    and not its last layer, and the off-by-one heuristics below
sliding-window      a sliding pattern with a window, a SWA RoPE base with a pattern; a Gemma 3
                    target with its window (llama.cpp reads a missing one as "no SWA")
old-dflash2         DFlash 2 tensors in the names and keys upstream llama.cpp reads: the four
                    size keys, ``selector_hidden.weight``, the llama.cpp naming
draft-vocab         a draft vocabulary smaller than the target's needs a ``d2t`` map; a
                    ``d2t`` is I64 with one entry per row of the drafter's ``output.weight``
pairing             drafter vs target: hidden width, ``target_hidden_size``, ``fc`` width,
                    vocabulary size and tokens
unclaimed-tensor    every tensor is one the drafter architecture loads
rope                the drafter's RoPE base and scaling present and equal to the target's
==================  ===========================================================================

**Off-by-one heuristics** (need ``--target``, whose block count is L; HF ids count from 0 and the
llama.cpp naming stores HF id + 1, docs/conventions.md, "Layer ids in GGUF files: the +1"):

- llama.cpp naming storing a 0: the ids were written raw (one layer early in llama.cpp);
- an HF id equal to L - 1: the last layer's output is the final-normed state, never captured
  (ids stored + 1 twice, or raw ids of a lucebox file relabelled);
- the HF ids equal the default formula's ids (:func:`~dflash_ref.config.build_target_layer_ids`)
  shifted by exactly -1 or +1: the ids were stored raw where + 1 was due, or + 1 where raw ids
  were due.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dflash_ref.errors import ConfigError
from dflash_ref.io.gguf_faults import (
    Drafter,
    Fault,
    check_dflash2_layout,
    check_draft_vocab,
    check_layer_ids,
    check_pairing,
    check_rope,
    check_sliding_window,
    check_tensors,
    check_tokenizer,
)
from dflash_ref.io.gguf_io import GGUFFile, open_gguf
from dflash_ref.io.gguf_kinds import is_gguf, kind_of_arch
from dflash_ref.io.names import flavour_of_arch


def open_drafter(path) -> Drafter:
    """The drafter GGUF at ``path``, or one error naming what the file is instead."""
    path = Path(path)
    if not path.is_file() or not is_gguf(path):
        what = "does not exist" if not path.exists() else "is not a GGUF file"
        raise ConfigError(f"FILE {path} {what}; check-gguf takes a DFlash drafter .gguf file")
    g = open_gguf(path)
    flavour = flavour_of_arch(g.arch)
    if flavour is None:
        raise ConfigError(f"FILE {path} is {kind_of_arch(g.arch)}, not a DFlash drafter "
                          f"(arch 'dflash' or '*-dflash-draft'); pass the drafter as FILE and "
                          f"its target with --target")
    return Drafter(g, flavour)


def open_target(path) -> GGUFFile:
    """The target GGUF given with ``--target``: a GGUF that is not a drafter."""
    path = Path(path)
    if not path.is_file() or not is_gguf(path):
        what = "does not exist" if not path.exists() else "is not a GGUF file"
        raise ConfigError(f"--target {path} {what}; pass the target model's .gguf file")
    g = open_gguf(path)
    if flavour_of_arch(g.arch) is not None:
        raise ConfigError(f"--target {path} is {kind_of_arch(g.arch)}; --target takes the "
                          f"target model's GGUF, the drafter goes first")
    return g


CHECKS = (check_tokenizer, check_layer_ids, check_sliding_window, check_dflash2_layout,
          check_draft_vocab, check_pairing, check_tensors, check_rope)


def check_gguf(path, target=None) -> list[Fault]:
    """Every fault of the drafter GGUF at ``path`` (paired with the target GGUF ``target`` when
    given), in the order of :data:`CHECKS`. Reads headers only."""
    d = open_drafter(path)
    t = open_target(target) if target is not None else None
    return [f for check in CHECKS for f in check(d, t)]


# --- the command line ---------------------------------------------------------------------


def add_check_gguf_parser(sub) -> None:
    p = sub.add_parser("check-gguf", help="conformance check of a DFlash drafter GGUF: every "
                       "fault in one line with its fix (docs/check_gguf.md)")
    p.add_argument("file", help="the drafter .gguf")
    p.add_argument("--target", help="the target's .gguf: checks the pairing (widths, vocabulary, "
                   "layer ids, RoPE, sliding windows)")
    p.set_defaults(func=cmd_check_gguf)


def cmd_check_gguf(args: argparse.Namespace) -> int:
    """Print each fault; exit 1 when there is any, 0 with one "ok" line when there is none. On a
    terminal a first line says the headers are being read (gguf's reader parses a 262k-token
    vocabulary for about a minute on a loaded 2-core machine)."""
    if sys.stderr.isatty():
        both = f"{args.file}" + (f" and {args.target}" if args.target else "")
        print(f"reading the GGUF headers of {both} ...", file=sys.stderr, flush=True)
    faults = check_gguf(args.file, args.target)
    for f in faults:
        print(f.line())
    paired = f" with target {args.target}" if args.target else " (no --target: pairing unchecked)"
    print(f"{args.file}: {len(faults)} fault(s){paired}" if faults else f"ok {args.file}{paired}")
    return 1 if faults else 0
