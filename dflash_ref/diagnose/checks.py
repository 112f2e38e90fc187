"""The configuration checks of ``dflash-ref explain``: what a stack forgets (docs/acceptance.md).

Each check is ``(name, status, message)`` with status "ok", "warn" or "info":

- **mask token id**: inside the vocabulary, and (with a tokenizer) one of its added / special
  tokens, not an ordinary token of text (a mask that is a real token makes the drafter read its
  block as text);
- **block size**: the block drafted vs the drafter's trained block size (larger: positions never
  trained on; smaller: fine, tau is capped at B);
- **chat template / thinking mode**: whether the prompts went through the checkpoint's template
  (a chat-tuned drafter on raw text, or thinking mode on where training had it off, drafts out of
  distribution);
- **embedding scale**: the scale the drafter applies to its block's embeddings vs the target's
  (Gemma: sqrt(H)); a drafter on a scaled target that applies none reads embeddings off by
  sqrt(H);
- **sliding window**: the drafter's window vs the context length reached (context beyond it is
  not seen).
"""

from __future__ import annotations


def config_checks(target, drafter, block_size: int, tokenizer=None, templated: bool | None = None,
                  thinking: bool | None = None, max_context: int = 0) -> list[tuple[str, str, str]]:
    cfg, tcfg = drafter.config, target.config
    out = []
    mask = int(cfg.mask_token_id)
    if not 0 <= mask < tcfg.vocab_size:
        out.append(("mask token id", "warn", f"{mask} is outside the vocabulary "
                                             f"[0, {tcfg.vocab_size})"))
    elif tokenizer is not None:
        added = tokenizer.backend.get_added_tokens_decoder()
        if mask in added:
            out.append(("mask token id", "ok",
                        f"{mask} is the added token {added[mask].content!r}"))
        else:
            text = tokenizer.backend.decode([mask], skip_special_tokens=False)
            out.append(("mask token id", "warn",
                        f"{mask} is an ordinary token ({text!r}), not an added / special one: "
                        f"check dflash_config.mask_token_id against the tokenizer's mask token"))
    else:
        out.append(("mask token id", "info", f"{mask} (no tokenizer to check it against)"))
    trained = int(drafter.block_size)
    if block_size > trained:
        out.append(("block size", "warn", f"{block_size} drafts past the trained block size "
                                          f"{trained}: positions never trained on"))
    else:
        out.append(("block size", "ok", f"{block_size} (trained: {trained})"))
    if templated is None:
        out.append(("chat template", "info", "prompts given as ids: not checked"))
    else:
        has = tokenizer is not None and tokenizer.chat_template is not None
        status = "warn" if has and not templated else "ok"
        out.append(("chat template", status,
                    f"prompts {'went' if templated else 'did not go'} through the chat template"
                    f" (the checkpoint {'has' if has else 'has no'} template)"
                    + ("" if thinking is None
                       else f"; thinking mode {'on' if thinking else 'off'}")))
    scale = float(drafter.embedding_scale)
    t_scale = tcfg.embedding_scale
    if t_scale is not None and abs(scale - t_scale) > 1e-3 * t_scale:
        out.append(("embedding scale", "warn", f"the drafter scales its block embeddings by "
                                               f"{scale:g}, the target by {t_scale:g}"))
    else:
        out.append(("embedding scale", "ok", f"{scale:g} (target: "
                                             f"{'none' if t_scale is None else f'{t_scale:g}'})"))
    window = cfg.sliding_window
    if window is not None and max_context > window:
        out.append(("sliding window", "warn", f"the drafter sees the last {window} positions; "
                                              f"the context reached {max_context}"))
    else:
        out.append(("sliding window", "ok", "none" if window is None else f"{window} (context "
                                                                          f"{max_context})"))
    return out
