"""The CuPy pager's slot check, on CPU: host slots are validated on the host, never on the device.

kernels_cupy.pager._check_slots is called on every KV write. Host slots (what the pager computes)
must be checked with the reference's own check and uploaded without any device -> host copy; the
device functions that synchronise (``cp.unique``, ``cp.asnumpy``) are replaced here by traps.
"""

from __future__ import annotations

import numpy as np
import pytest

import kernels_cupy.pager as kpager


@pytest.fixture
def no_device(monkeypatch):
    """Trap every synchronising CuPy call; record what would be uploaded."""
    uploads = []

    def trap(*args, **kwargs):
        raise AssertionError("a synchronising device call on the per-step path")

    monkeypatch.setattr(kpager.cp, "unique", trap)
    monkeypatch.setattr(kpager.cp, "asnumpy", trap)
    monkeypatch.setattr(kpager.cp, "asarray", lambda a: uploads.append(a) or a)
    return uploads


def test_host_slots_are_checked_on_the_host_and_uploaded_as_int32(no_device):
    out = kpager._check_slots(np.array([3, 0, 2], np.int64), 4, "scatter_rows", distinct=True)
    assert len(no_device) == 1 and out is no_device[0]
    assert out.dtype == np.int32 and out.tolist() == [3, 0, 2]
    assert kpager._check_slots([1, 1], 4, "gather_rows", distinct=False).tolist() == [1, 1]


@pytest.mark.parametrize(("slots", "distinct", "match"), [
    ([1, 1], True, "distinct"), ([-1], False, "never allocated"), ([4], False, r"\[0, 4\)"),
    ([0.5], False, "integer"), ([[0]], False, "1-D"),
])
def test_bad_host_slots_raise_the_reference_errors_before_any_upload(no_device, slots, distinct,
                                                                     match):
    with pytest.raises(ValueError, match=match):
        kpager._check_slots(np.array(slots), 4, "scatter_rows", distinct=distinct)
    assert no_device == []


def test_device_slot_check_can_be_switched_off():
    old = kpager.check_device_slots(False)
    try:
        assert old is True and kpager._CHECK_DEVICE_SLOTS[0] is False
    finally:
        kpager.check_device_slots(old)
    assert kpager._CHECK_DEVICE_SLOTS[0] is True


def test_kernels_guard_the_slot_range():
    # The last line of defence for unchecked device slots: no access outside [0, P).
    from kernels_cupy import _build

    src = (_build.CUDA_DIR / "pager.cu").read_text()
    assert src.count("(p >= 0 && p < P)") == 2
