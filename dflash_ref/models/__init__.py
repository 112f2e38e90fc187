"""Components written once against a Backend: target model, drafter, GDN layer, caches."""

# DFlash2Drafter subclasses DFlashDrafter: importing the package defines it, so that the drafter
# loaders (DFlashDrafter.from_pretrained / from_gguf) find the class of a DFlash 2 config.
# DSparkDrafter (models/dspark.py) the same way.
from dflash_ref.models import dflash2, dspark  # noqa: F401, E402
