"""Golden vectors: export what a faithful DFlash stack must produce, compare another stack's dump.

``dflash-ref oracle export`` / ``compare`` (docs/golden_vectors.md). Modules: :mod:`.layout` (key
grammar, tolerances, reading a case), :mod:`.record` (recording stand-ins around ``generate``),
:mod:`.export`, :mod:`.compare`, :mod:`.conventions`, :mod:`.cases` (the committed cases),
:mod:`.cli`.
"""
