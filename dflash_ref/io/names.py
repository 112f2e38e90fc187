"""Tensor names of a DFlash drafter: HF z-lab checkpoint <-> the two public GGUF namings.

docs/formats.md ("DFlash drafter names"): HF safetensors (no ``model.`` prefix; z-lab/dflash
``dflash/model.py``), upstream llama.cpp (arch ``dflash``; ggml-org/llama.cpp
``src/models/dflash.cpp``) and lucebox (arch ``*-dflash-draft``; Luce-Org/lucebox
``server/scripts/convert_dflash_to_gguf.py``)::

    HF (z-lab)                                   llama.cpp "dflash"        lucebox "*-dflash-draft"
    fc.weight                  [H, C*H]          fc.weight                 dflash.fc.weight
    hidden_norm.weight         [H]               enc.output_norm.weight    dflash.hidden_norm.weight
    norm.weight                [H]               output_norm.weight        output_norm.weight
    layers.N.input_layernorm.weight              blk.N.attn_norm.weight    (same as llama.cpp)
    layers.N.self_attn.{q,k,v,o}_proj.weight     blk.N.attn_{q,k,v,output}.weight
    layers.N.self_attn.{q,k}_norm.weight         blk.N.attn_{q,k}_norm.weight
    layers.N.post_attention_layernorm.weight     blk.N.ffn_norm.weight
    layers.N.mlp.{gate,up,down}_proj.weight      blk.N.ffn_{gate,up,down}.weight
    DFlash 2 (``DFlash2DraftModel``), llama.cpp only; lucebox has no such names:
    layers.N.attention_conv.base_kernel [2,K,H]  blk.N.attn_conv_base
    layers.N.attention_conv.kernel_projection.weight   blk.N.attn_conv_proj.weight
    layers.N.mlp_conv.base_kernel                blk.N.ffn_conv_base
    layers.N.mlp_conv.kernel_projection.weight   blk.N.ffn_conv_proj.weight
    candidate_selector.predecessor_codebook.weight     selector_predecessor.weight
    candidate_selector.successor_codebook.weight       selector_successor.weight
    candidate_selector.hidden_projection.weight        selector_hidden.weight

    DSpark (Markov and confidence heads; models/dspark.py), llama.cpp only:
    markov_head.markov_w1.weight   [V, R]        markov_w1.weight
    markov_head.markov_w2.weight   [V, R]        markov_w2.weight
    confidence_head.proj.{weight,bias} [1, H+R]  conf_proj.{weight,bias}

The conv base kernels carry no ``.weight`` suffix on either side (llama.cpp's loader asks for
``tn(LLM_TENSOR_DFLASH_ATTN_CONV_BASE, i)`` without one). The published checkpoints' bare
codebook names (``candidate_selector.predecessor_codebook``) map like their ``.weight`` form.

Shapes differ only in spelling: GGUF writes them in ggml order {in, out} (see
:mod:`dflash_ref.io.gguf_io`). Names outside the table (``fc.scale``, ``token_embd.weight``,
``d2t``, ``attn_sinks``...) map to themselves, so a comparison reports them as one-sided.
An older ``dflash-draft`` fork naming (``dflash_fc``, ``dflash_hidden_norm``) is not mapped: its
exact names were not confirmed from a primary source (docs/conventions.md, "Where things came
from", has both sources).
"""

from __future__ import annotations

import re

FLAVOURS = ("dflash", "lucebox")

# Per-layer GGUF stem -> HF module path (both flavours use the same blk.N names).
LAYER_NAMES: dict[str, str] = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}

# DFlash 2 per-layer GGUF suffix (after "blk.N.") -> HF suffix (after "layers.N."); llama.cpp
# only (src/models/dflash.cpp: LLM_TENSOR_DFLASH_{ATTN,FFN}_CONV_{BASE,PROJ}).
DFLASH2_LAYER_NAMES: dict[str, str] = {
    "attn_conv_base": "attention_conv.base_kernel",
    "attn_conv_proj.weight": "attention_conv.kernel_projection.weight",
    "ffn_conv_base": "mlp_conv.base_kernel",
    "ffn_conv_proj.weight": "mlp_conv.kernel_projection.weight",
}
# DFlash 2 selector (LLM_TENSOR_DFLASH_SELECTOR_{PREV,NEXT,HIDDEN}).
DFLASH2_GLOBAL_NAMES: dict[str, str] = {
    "selector_predecessor.weight": "candidate_selector.predecessor_codebook.weight",
    "selector_successor.weight": "candidate_selector.successor_codebook.weight",
    "selector_hidden.weight": "candidate_selector.hidden_projection.weight",
}

# DSpark's Markov and confidence heads (llama.cpp LLM_TENSOR_DSPARK_*; gguf-py tensor_mapping.py
# maps model.markov_head.markov_w{1,2} and model.confidence_head.proj); models/dspark.py.
DSPARK_GLOBAL_NAMES: dict[str, str] = {
    "markov_w1.weight": "markov_head.markov_w1.weight",
    "markov_w2.weight": "markov_head.markov_w2.weight",
    "conf_proj.weight": "confidence_head.proj.weight",
    "conf_proj.bias": "confidence_head.proj.bias",
}
# Whole-model GGUF name -> HF name, per flavour.
GLOBAL_NAMES: dict[str, dict[str, str]] = {
    "dflash": {
        "fc.weight": "fc.weight",
        "enc.output_norm.weight": "hidden_norm.weight",
        "output_norm.weight": "norm.weight",
        **DFLASH2_GLOBAL_NAMES,
        **DSPARK_GLOBAL_NAMES,
    },
    "lucebox": {
        "dflash.fc.weight": "fc.weight",
        "dflash.hidden_norm.weight": "hidden_norm.weight",
        "output_norm.weight": "norm.weight",
    },
}

_GGUF_LAYER = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
_HF_LAYER = re.compile(r"^layers\.(\d+)\.(.+)\.(weight|bias)$")
_HF_OF_STEM = {v: k for k, v in LAYER_NAMES.items()}
_GGUF_BLK = re.compile(r"^blk\.(\d+)\.(.+)$")
_HF_BLK = re.compile(r"^layers\.(\d+)\.(.+)$")
_HF_OF_DFLASH2 = {v: k for k, v in DFLASH2_LAYER_NAMES.items()}
# The published DFlash 2 checkpoints store the two codebooks without ".weight".
_BARE_CODEBOOKS = {v[: -len(".weight")]: v for v in DFLASH2_GLOBAL_NAMES.values()
                   if "codebook" in v}


def flavour_of_arch(arch: str | None) -> str | None:
    """"dflash" for llama.cpp's arch, "lucebox" for ``*-dflash-draft``, else None."""
    if arch == "dflash":
        return "dflash"
    if arch is not None and arch.endswith("-dflash-draft"):
        return "lucebox"
    return None


def _check(flavour: str) -> None:
    if flavour not in FLAVOURS:
        raise ValueError(f"unknown GGUF naming {flavour!r}; expected one of {FLAVOURS}")


def gguf_to_hf(name: str, flavour: str) -> str:
    """A GGUF tensor name of ``flavour`` -> the HF z-lab name (unknown names unchanged)."""
    _check(flavour)
    if name in GLOBAL_NAMES[flavour]:
        return GLOBAL_NAMES[flavour][name]
    m = _GGUF_LAYER.match(name)
    if m and m.group(2) in LAYER_NAMES:
        return f"layers.{m.group(1)}.{LAYER_NAMES[m.group(2)]}.{m.group(3)}"
    m = _GGUF_BLK.match(name)
    if flavour == "dflash" and m and m.group(2) in DFLASH2_LAYER_NAMES:
        return f"layers.{m.group(1)}.{DFLASH2_LAYER_NAMES[m.group(2)]}"
    return name


def hf_to_gguf(name: str, flavour: str) -> str:
    """An HF z-lab tensor name -> the GGUF name of ``flavour`` (unknown names unchanged)."""
    _check(flavour)
    name = canonical_hf_name(name)
    for gguf_name, hf_name in GLOBAL_NAMES[flavour].items():
        if name == hf_name:
            return gguf_name
    m = _HF_LAYER.match(name)
    if m and m.group(2) in _HF_OF_STEM:
        return f"blk.{m.group(1)}.{_HF_OF_STEM[m.group(2)]}.{m.group(3)}"
    m = _HF_BLK.match(name)
    if flavour == "dflash" and m and m.group(2) in _HF_OF_DFLASH2:
        return f"blk.{m.group(1)}.{_HF_OF_DFLASH2[m.group(2)]}"
    return name


def is_dflash2_tensor(gguf_name: str) -> bool:
    """Whether a llama.cpp GGUF tensor name is one of DFlash 2's (conv or selector)."""
    m = _GGUF_BLK.match(gguf_name)
    return gguf_name in DFLASH2_GLOBAL_NAMES or bool(m and m.group(2) in DFLASH2_LAYER_NAMES)


MARKOV_W1, MARKOV_W2 = "markov_head.markov_w1.weight", "markov_head.markov_w2.weight"
CONF_W, CONF_B = "confidence_head.proj.weight", "confidence_head.proj.bias"
DSPARK_HEAD_PREFIXES = ("markov_head.", "confidence_head.")


def dspark_head_shapes(shapes: dict, hidden: int, vocab: int | None) -> list[str]:
    """Problems (empty: fine) of the Markov / confidence head tensors' shapes ({name: shape})."""
    if MARKOV_W1 not in shapes or MARKOV_W2 not in shapes:
        return [f"a DSpark drafter needs {MARKOV_W1} and {MARKOV_W2}"]
    w1, w2 = tuple(shapes[MARKOV_W1]), tuple(shapes[MARKOV_W2])
    problems = []
    if len(w1) != 2 or w2 != w1:
        problems.append(f"{MARKOV_W1} {list(w1)} and {MARKOV_W2} {list(w2)} must both be "
                        "[vocab, rank] (a reduced draft vocabulary, d2t, is not read)")
    elif vocab is not None and w1[0] != vocab:
        problems.append(f"{MARKOV_W1} has {w1[0]} rows, the vocabulary {vocab}")
    rank = w1[-1]
    if CONF_W in shapes and tuple(shapes[CONF_W]) != (1, hidden + rank):
        problems.append(f"{CONF_W} is {list(shapes[CONF_W])}, expected [1, {hidden + rank}] "
                        "(hidden + Markov rank)")
    if CONF_B in shapes and tuple(shapes[CONF_B]) != (1,):
        problems.append(f"{CONF_B} is {list(shapes[CONF_B])}, expected [1]")
    extra = sorted(n for n in shapes if n.startswith(DSPARK_HEAD_PREFIXES)
                   and n not in (MARKOV_W1, MARKOV_W2, CONF_W, CONF_B))
    if extra:
        problems.append(f"DSpark head tensors dflash-ref does not read: {extra}")
    return problems


def is_dspark_tensor(gguf_name: str) -> bool:
    """Whether a llama.cpp GGUF tensor name is one of DSpark's heads."""
    return gguf_name in DSPARK_GLOBAL_NAMES


def canonical_hf_name(name: str) -> str:
    """The ``.weight`` spelling of a published DFlash 2 codebook name, else ``name`` unchanged
    (``candidate_selector.predecessor_codebook`` -> ``...predecessor_codebook.weight``)."""
    return _BARE_CODEBOOKS.get(name, name)
