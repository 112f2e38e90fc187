"""What a GGUF file is, from its header alone: a DFlash drafter (llama.cpp's ``dflash`` or
lucebox's ``*-dflash-draft``), a target of a family ``convert`` writes, or something else.

Used where a command must name a file before reading its weights: ``convert`` given a GGUF as
SRC, ``convert --force`` deciding whether OUT is a file it wrote (dflash_ref/io/writing.py, rule
2), and ``check-gguf`` refusing a GGUF that is not a drafter.
"""

from __future__ import annotations

from pathlib import Path

from dflash_ref.errors import ConfigError, FormatError


def kind_of_arch(arch: str | None) -> str:
    """``general.architecture`` in words: "a DFlash drafter GGUF (llama.cpp naming)", "a qwen3
    target GGUF", "a GGUF of arch 'bert'"."""
    from dflash_ref.io.convert_target import FAMILY_OF_ARCH
    from dflash_ref.io.names import flavour_of_arch

    flavour = flavour_of_arch(arch)
    if flavour is not None:
        naming = "llama.cpp" if flavour == "dflash" else "lucebox"
        return f"a DFlash drafter GGUF ({naming} naming, arch {arch!r})"
    if arch in FAMILY_OF_ARCH:
        return f"a {FAMILY_OF_ARCH[arch]} target GGUF (arch {arch!r})"
    return f"a GGUF of arch {arch!r}"


def describe_gguf(path: Path) -> str:
    """:func:`kind_of_arch` of the file at ``path`` (or that its header is unreadable)."""
    from dflash_ref.io.gguf_io import open_gguf

    try:
        return kind_of_arch(open_gguf(path).arch)
    except FormatError:
        return "a GGUF file (its header is unreadable)"


def written_by_convert(path: Path) -> str | None:
    """``convert --force``'s test for OUT: None for a GGUF of an architecture ``convert`` writes
    (a DFlash drafter or a target family it converts), else what the file is."""
    from dflash_ref.io.convert_target import FAMILY_OF_ARCH
    from dflash_ref.io.gguf_io import open_gguf
    from dflash_ref.io.names import flavour_of_arch

    if not Path(path).is_file():
        return "not a file"
    try:
        arch = open_gguf(path).arch
    except FormatError:
        return "not a GGUF file"
    if flavour_of_arch(arch) is None and arch not in FAMILY_OF_ARCH:
        return f"{kind_of_arch(arch)}, not one convert writes"
    return None


def is_gguf(path: Path) -> bool:
    """True when ``path`` is a file that starts with the GGUF magic (reads four bytes)."""
    from dflash_ref.io.gguf_io import GGUF_MAGIC

    if not Path(path).is_file():
        return False
    with open(path, "rb") as f:
        return f.read(4) == GGUF_MAGIC


def refuse_gguf_source(src: Path, option: str) -> Path:
    """``src`` unless it is a GGUF file, which a converter cannot take: say what it is."""
    if is_gguf(src):
        raise ConfigError(f"{option} {src} is {describe_gguf(src)}, already converted; convert "
                          f"takes a checkpoint directory (config.json + *.safetensors); read "
                          f"the file with 'dflash-ref inspect' or check it with 'dflash-ref "
                          f"check-gguf'")
    return src


def convert_output(out, force: bool):
    """``convert``'s OUT checked by the rule of dflash_ref/io/writing.py before any work: (the
    path, its ``replace`` test: :func:`written_by_convert` with ``--force``, else nothing)."""
    from dflash_ref.io.writing import check_output_file

    replace = written_by_convert if force else None
    return check_output_file(out, "OUT", suffix=".gguf", replace=replace), replace
