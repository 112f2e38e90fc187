"""A target's and a drafter's configs read from their files without reading a weight.

What every pairing check needs is metadata: a directory's ``config.json`` and its safetensors
headers (names, shapes), a GGUF's keys and tensor entries (``gguf.GGUFReader`` maps the file;
no tensor data is touched). So a command can refuse a wrong pair, a prompt past the context or
an option that does not fit, before the loaders read (and dequantize) the weights:

- :func:`target_config_of`: the :class:`~dflash_ref.config.TargetConfig` the loader will build
  (vocabulary, layers, widths, ``max_position_embeddings`` / the GGUF's ``context_length``);
- :func:`drafter_config_of`: the :class:`~dflash_ref.config.DrafterConfig` checked against that
  target as the drafter's loader checks it (:meth:`DrafterConfig.validate_against
  <dflash_ref.config.DrafterConfig.validate_against>`: hidden size, vocabulary, mask id, layer
  ids, the ``fc`` shape; a directory's every tensor shape from its header) and a reduced draft
  vocabulary's ``d2t`` map (io/draft_vocab.py: the one small tensor read here).

Warnings the checks raise are dropped here: the load that follows raises them again, once.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from dflash_ref.config import DrafterConfig, TargetConfig, drafter_expected_tensors
from dflash_ref.errors import FormatError
from dflash_ref.io.convert_target import target_config_dict_from_gguf
from dflash_ref.io.draft_vocab import D2T, d2t_from_checkpoint, d2t_from_gguf
from dflash_ref.io.drafter_from_gguf import drafter_config_dict_from_gguf
from dflash_ref.io.gguf_io import GGUFFile, open_gguf
from dflash_ref.io.names import flavour_of_arch, hf_to_gguf
from dflash_ref.io.safetensors_io import check_tensor_shapes, open_checkpoint


def target_config_of(source: Path | GGUFFile) -> TargetConfig:
    """The config of a target checkpoint directory or an opened target GGUF (metadata only)."""
    if isinstance(source, GGUFFile):
        return TargetConfig.from_hf(target_config_dict_from_gguf(source))
    path = Path(source) / "config.json"
    if not path.exists():
        raise FormatError(f"{source} has no config.json; expected a Hugging Face model directory")
    return TargetConfig.from_file(path)


def drafter_config_of(path: str | Path, target: TargetConfig) -> DrafterConfig:
    """The drafter at ``path`` (directory or GGUF), checked against ``target`` from metadata:
    the config the drafter's loader would run (ids reconciled with the ``fc`` width)."""
    path = Path(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if not path.is_dir():
            g = open_gguf(path)
            config = DrafterConfig.from_hf(drafter_config_dict_from_gguf(g, target))
            fc = g.tensor_info(hf_to_gguf(config.fc_name, flavour_of_arch(g.arch))).numpy_shape
            if D2T in g:  # the map alone: a few kB, no weight
                d2t_from_gguf(g, target.vocab_size)
            return config.validate_against(target, fc_shape=fc)
        if not (path / "config.json").exists():
            raise FormatError(f"{path} has no config.json; expected a DFlash drafter directory")
        config = DrafterConfig.from_file(path / "config.json")
        headers = open_checkpoint(path).infos  # name -> dtype and shape, no data
        if config.fc_name not in headers:
            raise FormatError(f"drafter checkpoint lacks {config.fc_name} ({config.layout} "
                              f"layout); found e.g. {sorted(headers)[:4]}")
        config = config.validate_against(target, fc_shape=tuple(headers[config.fc_name].shape))
        check_tensor_shapes(headers, drafter_expected_tensors(config),
                            f"the drafter checkpoint ({config.layout} layout)",
                            hint="is it complete and in this layout?")
        d2t_from_checkpoint(open_checkpoint(path), config.draft_vocab_size, target.vocab_size,
                            str(path))  # the map alone: a few kB, no weight
        return config

