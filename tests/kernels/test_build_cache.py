"""A kernel launch does no host work beyond the launch: the lookup is cached (issue 27).

Before the cache, ``get_kernel`` re-read and re-parsed the family's ``.cu`` file on every launch
(289 file reads per Qwen3-4B decode forward on an H200). These tests run on the CPU: the compiled
module is replaced by a stand-in, and ``Path.read_text`` is counted.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kernels_cupy import _build


class _FakeModule:
    def __init__(self):
        self.calls = 0

    def get_function(self, name):
        self.calls += 1
        return ("kernel", name)


@pytest.fixture
def fresh_caches(monkeypatch):
    """Empty lookup caches, a stand-in module per family, and a log of every file read."""
    modules: dict[str, _FakeModule] = {}
    monkeypatch.setattr(_build, "_module", lambda fam: modules.setdefault(fam, _FakeModule()))
    reads: list[str] = []
    real_read = Path.read_text

    def counting_read(self, *args, **kwargs):
        reads.append(self.name)
        return real_read(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", counting_read)
    _build.kernel_names.cache_clear()
    _build.get_kernel.cache_clear()
    yield modules, reads
    _build.kernel_names.cache_clear()  # the stand-in kernels must not outlive the test
    _build.get_kernel.cache_clear()


def test_repeated_lookups_read_no_file_and_load_once(fresh_caches):
    modules, reads = fresh_caches
    first = _build.get_kernel("norm", "rms_norm_f32")
    assert reads == ["norm.cu"]  # the name check parsed the source once
    for _ in range(200):
        assert _build.get_kernel("norm", "rms_norm_f32") is first
        _build.get_kernel("norm", "add_rms_norm_f32")
    assert reads == ["norm.cu"]  # no read per launch
    assert modules["norm"].calls == 2  # one get_function per kernel name, not per launch


def test_unknown_kernel_is_still_refused_with_the_declared_names(fresh_caches):
    with pytest.raises(KeyError, match="rms_norm_f32"):
        _build.get_kernel("norm", "rms_norm_f64")
