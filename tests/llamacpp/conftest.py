"""The ``llamacpp`` marker's skip rule and the build fixture (tests/llamacpp/harness.py).

Without the pinned build the tests skip with the reason (the path looked at, the script to run);
with DFLASH_REQUIRE_LLAMACPP=1 (CI, after scripts/build_llamacpp.sh) they fail instead, so a
broken build cannot pass by skipping.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from tests.llamacpp.harness import LlamaCpp, build_dir, missing_reason, source_dir


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("DFLASH_REQUIRE_LLAMACPP") == "1":
        pytest.fail(f"DFLASH_REQUIRE_LLAMACPP=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def llamacpp() -> LlamaCpp:
    """The built tools (and the source tree beside them)."""
    reason = missing_reason()
    if reason is not None:
        _skip_or_fail(reason)
    return LlamaCpp(build_dir())


@pytest.fixture(scope="session")
def llamacpp_src() -> Path:
    """The llama.cpp source tree (convert_hf_to_gguf.py, gguf-py): the build's copy, or
    $DFLASH_LLAMACPP_SRC (any llama.cpp checkout). The converter also needs torch."""
    src = source_dir()
    if not (src / "convert_hf_to_gguf.py").is_file():
        _skip_or_fail(f"no llama.cpp source at {src} (run scripts/build_llamacpp.sh, or set "
                      "DFLASH_LLAMACPP_SRC to a llama.cpp checkout)")
    if importlib.util.find_spec("torch") is None:
        pytest.skip("llama.cpp's convert_hf_to_gguf.py needs torch (the compat extra)")
    return src
