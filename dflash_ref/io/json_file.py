"""A checkpoint directory's optional JSON files (``tokenizer_config.json``,
``generation_config.json``): absent is allowed, unreadable is one error that says to fix or
remove the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dflash_ref.errors import FormatError


def read_json(path: Path, without: str) -> Any:
    """The JSON value in ``path``, None when there is no such file; a file that is not JSON is a
    FormatError saying to fix or remove it (``without``: what removing it leaves)."""
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FormatError(f"{path} is not valid JSON ({e}); fix the file or remove it "
                          f"({without})") from e
