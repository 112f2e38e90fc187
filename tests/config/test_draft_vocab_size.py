"""``draft_vocab_size``: a reduced draft vocabulary in a drafter's config.json (docs/config.md,
"Keys"; docs/drafter.md, "A reduced draft vocabulary")."""

from __future__ import annotations

import pytest

from dflash_ref.config import DrafterConfig, drafter_expected_tensors
from dflash_ref.errors import ConfigError
from dflash_ref.tiny import tiny_drafter_config, tiny_target_config

BASE = tiny_drafter_config(tiny_target_config("qwen3"))  # vocab_size 256, hidden 64


def test_read_from_dflash_config_or_the_top_level_and_expected_tensors():
    top = DrafterConfig.from_hf({**BASE, "draft_vocab_size": 40})
    nested = DrafterConfig.from_hf({**BASE, "dflash_config": {**BASE["dflash_config"],
                                                              "draft_vocab_size": 40}})
    assert top.draft_vocab_size == nested.draft_vocab_size == 40
    t = drafter_expected_tensors(top)
    H = BASE["hidden_size"]
    # catches the head's shape transposed, or d2t missing from the schema
    assert t["lm_head.weight"] == (40, H) and t["d2t"] == (40,)
    assert "lm_head.weight" not in drafter_expected_tensors(DrafterConfig.from_hf(BASE))
    assert "draft vocabulary 40 of 256" in top.describe()


def test_the_whole_vocabulary_is_a_valid_draft_vocabulary():
    assert DrafterConfig.from_hf({**BASE, "draft_vocab_size": 256}).draft_vocab_size == 256


@pytest.mark.parametrize(("change", "words"), [
    ({"draft_vocab_size": 257}, "exceeds vocab_size 256"),  # one past the edge
    ({"draft_vocab_size": 0}, "integer >= 1"),
    ({"draft_vocab_size": 40, "vocab_size": None}, "needs vocab_size"),
    ({"draft_vocab_size": 40, "architectures": ["DFlash2DraftModel"], "dflash_config": {
        **BASE["dflash_config"], "conv_kernel_size": 3, "conv_group_size": 8, "selector_rank": 4,
        "selector_top_k": 4}}, "not 'dflash2'"),
])
def test_bad_values_are_one_config_error(change, words):
    with pytest.raises(ConfigError, match=words):
        DrafterConfig.from_hf({**BASE, **change})
