"""Loading a DFlash drafter: its checkpoint (directory or GGUF), the checks before it runs.

``DFlashDrafter.from_pretrained`` / ``from_gguf`` call these; the class of a config's kind
(DFlash, DFlash 2) is ``DFlashDrafter.class_for(config)``.
"""

from __future__ import annotations

from pathlib import Path

from dflash_ref.config import DrafterConfig, drafter_expected_tensors
from dflash_ref.errors import ConfigError, FormatError
from dflash_ref.io.compare import check_finite_weights
from dflash_ref.io.draft_vocab import D2T, d2t_from_checkpoint, offsets
from dflash_ref.io.safetensors_io import check_tensor_shapes, open_checkpoint
from dflash_ref.models.loading import read_checkpoint_weights
from dflash_ref.models.target import TargetModel


def load_pretrained(cls, path, target: TargetModel, backend=None,
                    swa_convention: str | None = None, check_finite: bool = False):
    """A drafter directory (``config.json`` + safetensors) for ``target``.

    Reads the z-lab layout (``fc``, ``hidden_norm``, ``layers.N.*``, ``norm``; DFlash keys at
    the top level or under ``dflash_config``) and the HF DFlash-assistant layout
    (``encoder.fc``, ``encoder.output_norm_enc``). ``backend`` must match the target's (the
    drafter shares the target's arrays); ``swa_convention`` overrides the config default;
    ``check_finite`` refuses weights holding NaN or inf, naming the tensors.
    """
    check_target(target, "from_pretrained")
    path = Path(path)
    if backend is not None and getattr(backend, "name", backend) != target.be.name:
        raise ConfigError(
            f"drafter backend {backend!r} differs from the target's {target.be.name!r}; the "
            f"drafter shares the target's embedding and lm_head, so load both on one backend"
        )
    cfg_path = path / "config.json"
    if not cfg_path.exists():
        raise FormatError(f"{path} has no config.json; expected a DFlash drafter directory")
    config = DrafterConfig.from_file(cfg_path, swa_convention=swa_convention)
    weights = read_drafter_weights(path, config, target)
    if check_finite:
        check_finite_weights(weights, path)
    return cls.class_for(config)(config, weights, target)


def read_drafter_weights(path: Path, config: DrafterConfig, target: TargetModel) -> dict:
    """Every tensor of a drafter directory as float32, but ``d2t`` (a reduced draft vocabulary's
    map, int64 offsets as stored), which is read and checked first, before any weight."""
    ids = d2t_from_checkpoint(open_checkpoint(path), config.draft_vocab_size,
                              target.config.vocab_size, f"{path}")
    if ids is None:
        return read_checkpoint_weights(path)
    return {**read_checkpoint_weights(path, skip=(D2T,)), D2T: offsets(ids)}


def load_gguf(cls, path, target: TargetModel, swa_convention: str | None = None):
    """A drafter GGUF for ``target``, in either public naming (docs/formats.md): llama.cpp files
    (arch ``dflash``) store the captured layers as HF ids + 1, lucebox files
    (arch ``*-dflash-draft``) raw ids; both become the z-lab config and HF-named weights."""
    from dflash_ref.io.drafter_from_gguf import read_gguf_drafter

    check_target(target, "from_gguf")
    config_dict, weights = read_gguf_drafter(path, target.config)
    config = DrafterConfig.from_hf(config_dict, swa_convention=swa_convention)
    return cls.class_for(config)(config, weights, target)


def checked_config(klass, config: DrafterConfig, weights: dict,
                   target: TargetModel) -> DrafterConfig:
    """``config`` checked against the class ``klass`` that runs it, the weights and the target
    (every tensor of the layout, with its shape)."""
    if config.kind != klass.kind:
        raise ConfigError(f"a {config.kind!r} drafter config cannot run as "
                          f"{klass.__name__} ({klass.kind!r}); load it with "
                          f"DFlashDrafter.from_pretrained (or from_gguf)")
    fc_name = config.fc_name
    if fc_name not in weights:
        raise FormatError(
            f"drafter checkpoint lacks {fc_name} ({config.layout} layout); found e.g. "
            f"{sorted(weights)[:4]}"
        )
    config = config.validate_against(target.config, fc_shape=tuple(weights[fc_name].shape))
    check_tensor_shapes(weights, drafter_expected_tensors(config),
                        f"the drafter checkpoint ({config.layout} layout)",
                        hint="is it complete and in this layout?")
    return config


def bind_capture(config: DrafterConfig, target: TargetModel) -> None:
    """Set the target's capture layers to the drafter's ``target_layer_ids`` when it has none;
    raise when they conflict."""
    ids = list(config.target_layer_ids)
    if not target.target_layer_ids:
        target.set_target_layer_ids(ids)
    elif list(target.target_layer_ids) != ids:
        raise ConfigError(
            f"the target captures layers {target.target_layer_ids} but this drafter reads "
            f"{ids}; load the target with target_layer_ids=None (the drafter sets them) or "
            f"with exactly the drafter's ids"
        )


def check_target(target, method: str) -> None:
    """Refuse a ``target`` that is not a loaded :class:`TargetModel` (say, its path)."""
    if not isinstance(target, TargetModel):
        raise ConfigError(f"DFlashDrafter.{method}(path, target): target must be a loaded "
                          f"TargetModel, got {type(target).__name__} {target!r:.80}; load it "
                          f"first: target = TargetModel.from_pretrained(target_path), then "
                          f"DFlashDrafter.{method}(path, target)")
