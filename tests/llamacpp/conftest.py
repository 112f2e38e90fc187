"""The ``llamacpp`` marker's skip rule and the build fixture (tests/llamacpp/harness.py).

Without the pinned build the tests skip with the reason (the path looked at, the script to run);
with DFLASH_REQUIRE_LLAMACPP=1 (CI, after scripts/build_llamacpp.sh) they fail instead, so a
broken build cannot pass by skipping.
"""

from __future__ import annotations

import os

import pytest

from tests.llamacpp.harness import LlamaCpp, build_dir, missing_reason


@pytest.fixture(scope="session")
def llamacpp() -> LlamaCpp:
    reason = missing_reason()
    if reason is not None:
        if os.environ.get("DFLASH_REQUIRE_LLAMACPP") == "1":
            pytest.fail(f"DFLASH_REQUIRE_LLAMACPP=1 but {reason}")
        pytest.skip(reason)
    return LlamaCpp(build_dir())
