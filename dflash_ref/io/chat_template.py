"""Chat templates rendered the way transformers' ``apply_chat_template`` does.

Public source: ``src/transformers/utils/chat_template_utils.py``: a sandboxed jinja2
environment with ``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension, a
``tojson`` filter that is ``json.dumps`` without HTML escaping, and globals
``raise_exception`` and ``strftime_now``. A template that fails gives
:class:`ChatTemplateError` naming where the template came from.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2

from dflash_ref.errors import ConfigError

__all__ = ["ChatTemplateError", "render_chat_template"]


class ChatTemplateError(ConfigError, jinja2.TemplateError):
    """A chat template failed to parse or render; the message names the template's source.

    Also a ``jinja2.TemplateError``, so code written against jinja2 still catches it."""


def render_chat_template(template: str, messages: Sequence[Mapping[str, Any]],
                         add_generation_prompt: bool = True, *,
                         template_source: str = "the chat template", **variables: Any) -> str:
    """Render a chat template as transformers' ``apply_chat_template`` does (module docstring).

    The template sees ``messages``, ``tools`` (None), ``documents`` (None),
    ``add_generation_prompt`` and ``variables``. A template that does not parse, or that
    raises while rendering (``raise_exception(msg)``, an undefined attribute, a Python error in
    a filter), gives :class:`ChatTemplateError` (a ``ConfigError``) naming ``template_source`` (the
    file or checkpoint it came from) and the template's own message.
    """
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # jinja2's own tojson escapes <, >, & and ' for HTML; transformers' does not
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    context = {"tools": None, "documents": None, **variables}
    try:
        return env.from_string(template).render(
            messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt,
            **context)
    except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError,
            AttributeError) as e:
        line = getattr(e, "lineno", None)
        at = f" (template line {line})" if line else ""
        raise ChatTemplateError(
            f"{template_source} failed{at}: {type(e).__name__}: {e}; the template does not "
            f"accept these messages: check their roles and order (many templates want "
            f"user/assistant turns alternating) or pass another template") from e
