"""The exact edges of the argument checks: the first id past the vocabulary, and the last
continuation that fits the trained positions.

The rules, from what the model is: a target embeds ids 0..vocab_size-1, so id vocab_size - 1 is
the last one accepted and vocab_size the first refused; it was trained on positions
0..max_position_embeddings-1, and a prompt of N tokens with M new ones puts its last token at
position N + M - 1, so N + M == max_position_embeddings is the longest run that stays inside
and N + M == max_position_embeddings + 1 the first that leaves (a last verify block may run rows
past the last token; they are discarded, and under the causal mask no kept row reads them).
Each rule is checked in the three places that state it: the CLI's helpers (cli_args),
``generate``'s checks (spec_decode/arguments.py) and a ``dflash-ref generate`` run. Catches ``>``
written ``>=`` (the edge refused) and an off-by-one that lets the first bad value through.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

from dflash_ref import cli_args
from dflash_ref.cli import main
from dflash_ref.errors import ConfigError, PositionWarning
from dflash_ref.ops.sampling import GREEDY
from dflash_ref.spec_decode.arguments import check_arguments
from dflash_ref.spec_decode.loop import generate
from dflash_ref.tiny import write_tiny_target

LIMIT = 24  # the tiny target's max_position_embeddings
VOCAB = 256  # the tiny target's vocab_size
DEMO_TARGET = Path(__file__).resolve().parents[1] / "dflash_ref" / "data" / "demo" / "target"


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    """A tiny target with LIMIT positions and the demo's byte tokenizer (byte b -> id b)."""
    t = write_tiny_target(tmp_path_factory.mktemp("edges") / "t", "qwen3", seed=5,
                          max_position_embeddings=LIMIT)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DEMO_TARGET / name, t / name)
    return t


@pytest.fixture(scope="module")
def target(target_dir):
    from dflash_ref.models.target import TargetModel

    t = TargetModel.from_pretrained(target_dir)
    assert (t.config.vocab_size, t.config.max_position_embeddings) == (VOCAB, LIMIT)
    return t


# ---------------------------------------------------------------- the vocabulary's edge


def test_cli_ids_last_in_vocabulary_and_first_past_it():
    cli_args.check_ids_in_vocabulary([0, VOCAB - 1], VOCAB, "--prompt")  # accepted
    with pytest.raises(ConfigError, match=f"id {VOCAB} is outside .* 0..{VOCAB - 1}"):
        cli_args.check_ids_in_vocabulary([3, VOCAB], VOCAB, "--prompt")


def test_generate_ids_last_in_vocabulary_and_first_past_it(target):
    check_arguments(target, None, [0, VOCAB - 1], 1, GREEDY, None, "chain")  # accepted
    assert len(generate(target, None, [VOCAB - 1], 1).tokens) == 1  # and it embeds
    with pytest.raises(ConfigError, match=rf"\[0, {VOCAB}\)"):
        check_arguments(target, None, [0, VOCAB], 1, GREEDY, None, "chain")


# ---------------------------------------------------------------- the positions' edge


@pytest.mark.parametrize("n_prompt", [1, 5, LIMIT - 1])
def test_cli_positions_exactly_at_the_limit_and_one_past(n_prompt):
    cli_args.check_positions(n_prompt, LIMIT - n_prompt, LIMIT)  # last position LIMIT - 1
    with pytest.raises(ConfigError, match=f"at most {LIMIT - n_prompt} "):
        cli_args.check_positions(n_prompt, LIMIT - n_prompt + 1, LIMIT)


@pytest.mark.parametrize("n_prompt", [1, 5, LIMIT - 1])
def test_generate_positions_exactly_at_the_limit_and_one_past(target, n_prompt):
    prompt = np.arange(1, n_prompt + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # at the limit: no warning
        check_arguments(target, None, prompt, LIMIT - n_prompt, GREEDY, None, "chain")
    with pytest.warns(PositionWarning, match=f"reach position {LIMIT}, past"):
        check_arguments(target, None, prompt, LIMIT - n_prompt + 1, GREEDY, None, "chain")


def test_cli_generate_runs_at_the_limit_and_refuses_one_past(target_dir, capsys):
    prompt = "abcde"  # 5 byte ids, no BOS (the demo tokenizer adds none)
    base = ["generate", "--target", str(target_dir), "--prompt", prompt, "--backend", "numpy"]
    assert main([*base, "--max-new-tokens", str(LIMIT - 5)]) == 0
    capsys.readouterr()
    assert main([*base, "--max-new-tokens", str(LIMIT - 5 + 1)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error:") and f"at most {LIMIT - 5} " in err
