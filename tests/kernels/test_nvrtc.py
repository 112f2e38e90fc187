"""Every CUDA source compiles under NVRTC for sm_80 and sm_90, with or without a GPU.

This runs in CI on CPU-only machines: the NVRTC library comes from the nvidia-cuda-nvrtc-cu12
wheel of the test extra, and kernels_cupy._build calls it directly with an explicit architecture.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kernels_cupy import _build


def test_every_cuda_source_compiles(capsys):
    report = _build.compile_all(_build.CHECK_ARCHS)
    n_kernels = sum(len(v) for v in report.values())
    assert set(report) == set(_build.families())
    assert all(report.values()), f"a source declares no kernel: {report}"
    with capsys.disabled():
        print(
            f"\nNVRTC {'.'.join(map(str, _build.nvrtc_version()))}: compiled {len(report)} "
            f"sources, {n_kernels} kernels for {', '.join(_build.CHECK_ARCHS)}: "
            + "; ".join(f"{fam}: {', '.join(names)}" for fam, names in report.items())
        )


def test_compile_errors_carry_the_log(tmp_path, monkeypatch):
    broken = tmp_path / "broken.cu"
    broken.write_text('extern "C" __global__ void oops(float* x) { x[0] = undefined_name; }\n')
    monkeypatch.setattr(_build, "CUDA_DIR", tmp_path)
    (tmp_path / "common.cuh").write_text("")
    monkeypatch.setattr(_build, "COMMON_HEADER", tmp_path / "common.cuh")
    with pytest.raises(_build.KernelCompileError, match="undefined_name"):
        _build.nvrtc_compile("broken", "sm_80")


_LAUNCH_RE = re.compile(r'launch_(?:rows|elementwise)\(\s*"(\w+)",\s*"?(\w+)"?')
_GET_RE = re.compile(r'get_kernel\(\s*"(\w+)",\s*"(\w+)"')


def test_wrappers_only_launch_declared_kernels():
    # A typo in a kernel name would otherwise surface only on a GPU machine.
    declared = {fam: set(_build.kernel_names(fam)) for fam in _build.families()}
    pkg = Path(_build.__file__).parent
    found = 0
    for py in pkg.glob("*.py"):
        text = py.read_text()
        for fam, name in _LAUNCH_RE.findall(text) + _GET_RE.findall(text):
            if fam in ("family",):  # the helpers' own signatures
                continue
            if name in ("name", "kernel"):  # a name passed through a variable, checked below
                continue
            found += 1
            assert fam in declared, f"{py.name} launches family {fam!r}, which has no .cu"
            assert name in declared[fam], f"{py.name} launches {fam}.{name}, not declared"
    assert found > 0


def test_kernel_names_used_through_variables_exist():
    # activations/reductions pass kernel names through a helper's argument.
    pkg = Path(_build.__file__).parent
    names = set(re.findall(r'"(\w+_f32)"', "".join(p.read_text() for p in pkg.glob("*.py"))))
    declared = {n for fam in _build.families() for n in _build.kernel_names(fam)}
    assert names and names <= declared, f"undeclared kernels: {names - declared}"


def test_every_cuda_file_ships_as_package_data():
    # A non-editable install copies only the package-data globs; a missing header would break
    # every kernel on a GPU machine while CI (editable install) stays green.
    tomllib = pytest.importorskip("tomllib", reason="tomllib needs Python >= 3.11")
    root = Path(_build.__file__).parents[1]
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["kernels_cupy"]
    shipped = {p for g in globs for p in (root / "kernels_cupy").glob(g)}
    sources = {p for p in _build.CUDA_DIR.iterdir() if p.suffix in (".cu", ".cuh")}
    assert sources <= shipped, f"not in package-data: {sorted(p.name for p in sources - shipped)}"
