"""ptxas's report on a kernel family compiled by NVRTC (CPU only: no device needed)."""

from __future__ import annotations

import re

import pytest

from kernels_cupy import _build


def ptxas_entries(family: str, arch: str = "sm_90") -> tuple[list[tuple[str, str, str]], str]:
    """([(entry function, spill-store bytes, registers)], the whole log) of ``family``'s source
    compiled for ``arch`` with the project's options and ``--ptxas-options=-v``."""
    nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc")
    prog = nvrtc.createProgram(_build.source(family), f"{family}.cu", [], [])
    try:
        nvrtc.compileProgram(prog, [*_build.COMPILE_OPTIONS, f"--gpu-architecture={arch}",
                                    "--ptxas-options=-v"])
        log = nvrtc.getProgramLog(prog)
    finally:
        nvrtc.destroyProgram(prog)
    entries = re.findall(r"Compiling entry function '(\w+)'.*?(\d+) bytes spill stores.*?"
                         r"Used (\d+) registers", log, re.S)
    return entries, log
