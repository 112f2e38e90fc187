"""What a target GGUF means where it leaves a key out: the values llama.cpp's loader uses.

Read in ggml-org/llama.cpp ``src/llama-model.cpp`` (``load_hparams``: the generic defaults, then the
``LLM_ARCH_GEMMA3`` case), ``src/llama-hparams.cpp`` (``set_swa_pattern``) and
``src/models/gemma3.cpp`` (the graph: ``ggml_scale(inpL, sqrtf(n_embd))``)::

    attention.head_count_kv   absent -> n_head
    attention.key_length      absent -> n_embd / n_head
    gemma3 sliding_window     absent or 0 -> no SWA: every layer global, one RoPE base
    gemma3 sliding pattern    hard-coded set_swa_pattern(6): layer il slides iff il % 6 < 5
    gemma3 local RoPE base    hard-coded 10000 (rope_freq_base_train_swa; no key is read)
    gemma3 attention scale    head_dim^-0.5; (n_embd / n_head)^-0.5 for the 27B (62 layers)
    gemma3 final softcap      absent -> none
    gemma3 embedding scale    sqrtf(n_embd): float32, not rounded to bf16 as HF does for bf16

``attention.sliding_window_pattern``, ``rope.freq_base_swa``, ``attention.scale`` and
``embedding_scale`` are dflash-ref's own keys (its converter writes them so tiny models with other
values survive a round trip); they win when present. The RoPE base is never defaulted (llama.cpp
takes 10000; the caller refuses). Each value taken is listed, as text, under
:data:`LLAMA_CPP_DEFAULTS_KEY` in the config dict; ``TargetModel.from_gguf`` appends the list to
``TargetConfig.defaults_used``. docs/conventions.md, "GGUF metadata a file leaves out".
"""

from __future__ import annotations

import numpy as np

from dflash_ref.config import FULL, SLIDING, embedding_scale_for
from dflash_ref.errors import FormatError
from dflash_ref.io.convert_common import meta
from dflash_ref.io.gguf_io import GGUFFile

GEMMA3_LLAMA_CPP_SWA_PATTERN = 6  # set_swa_pattern(6)
GEMMA3_LLAMA_CPP_SWA_THETA = 10000.0  # rope_freq_base_train_swa, hard-coded
LLAMA_CPP_DEFAULTS_KEY = "dflash_ref_llama_cpp_defaults"


def head_dims(g: GGUFFile, n_embd: int, n_head: int, taken: list[str]) -> tuple[int, int]:
    """(head_dim, num_key_value_heads), with llama.cpp's defaults for absent keys."""
    head_dim = meta(g, "attention.key_length", "int", None)
    if head_dim is None:
        head_dim = n_embd // n_head
        taken.append(f"attention.key_length={head_dim} (llama.cpp: n_embd / n_head)")
    n_kv = meta(g, "attention.head_count_kv", "int", None)
    if n_kv is None:  # llama.cpp: "n_head_kv is optional, default to n_head"
        n_kv = n_head
        taken.append(f"attention.head_count_kv={n_kv} (llama.cpp: n_head)")
    return head_dim, n_kv


def gemma3_config(g: GGUFFile, n_layers: int, n_embd: int, n_head: int, head_dim: int,
                  taken: list[str]) -> dict:
    """The Gemma 3 part of the HF config dict of a ``gemma3`` GGUF (RoPE base excluded)."""
    window = meta(g, "attention.sliding_window", "int", 0)
    pattern = meta(g, "attention.sliding_window_pattern", "bools", None)
    if not window:  # llama.cpp: LLAMA_SWA_TYPE_NONE, the non-iswa graph
        pattern = [False] * n_layers
        taken.append("attention.sliding_window absent: every layer global (llama.cpp)")
    elif pattern is None:
        pattern = [(i + 1) % GEMMA3_LLAMA_CPP_SWA_PATTERN != 0 for i in range(n_layers)]
        taken.append(f"sliding pattern: every {GEMMA3_LLAMA_CPP_SWA_PATTERN}th layer global "
                     f"(llama.cpp)")
    scale = meta(g, "attention.scale", "float", None)
    if scale is not None:
        qpas = 1.0 / scale ** 2
        qpas = float(round(qpas)) if abs(qpas - round(qpas)) < 1e-3 else qpas
    else:
        qpas = n_embd / n_head if n_layers == 62 else float(head_dim)
        taken.append(f"attention scale {qpas:g}^-0.5 (llama.cpp)")
    theta_swa = meta(g, "rope.freq_base_swa", "float", None)
    if theta_swa is None and any(pattern):
        theta_swa = GEMMA3_LLAMA_CPP_SWA_THETA
        taken.append(f"sliding-layer RoPE base {theta_swa:g} (llama.cpp)")
    dtype = _embedding_dtype(g, n_embd)
    if dtype is None:
        dtype = "float32"
        taken.append(f"embedding scale sqrt({n_embd}) in float32 (llama.cpp's sqrtf(n_embd); "
                     f"no embedding_scale key)")
    return dict(
        architectures=["Gemma3ForCausalLM"], model_type="gemma3_text",
        hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=qpas,
        # without sliding layers the local base is never used; the global one stands in
        rope_local_base_freq=theta_swa if theta_swa is not None else meta(g, "rope.freq_base",
                                                                           "float"),
        sliding_window=window or None,
        layer_types=[SLIDING if s else FULL for s in pattern],
        final_logit_softcapping=meta(g, "final_logit_softcapping", "float", None),
        attn_logit_softcapping=None, torch_dtype=dtype)


def _embedding_dtype(g: GGUFFile, hidden: int) -> str | None:
    """The torch_dtype whose rounding of sqrt(hidden) equals the file's embedding_scale (None:
    no such key, as in every file llama.cpp writes)."""
    scale = meta(g, "embedding_scale", "float", None)
    if scale is None:
        return None
    for dtype in ("bfloat16", "float16", "float32"):
        if np.float32(embedding_scale_for(hidden, dtype)) == np.float32(scale):
            return dtype
    raise FormatError(f"{g.path.name}: embedding_scale {scale:g} is not sqrt({hidden}) rounded to "
                      f"bfloat16, float16 or float32; Gemma multiplies embeddings by that value")

