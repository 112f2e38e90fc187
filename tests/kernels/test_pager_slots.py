"""The CuPy pager's checks, on CPU: host slots and chunk tables are validated on the host.

kernels_cupy.pager._check_slots is called on every KV write. Host slots (what the pager computes)
must be checked with the reference's own check and uploaded without any device -> host copy, and
device slots the caller checked already (``checked=True``) are not checked again; so must the
host chunk table of ``fill_slot_pos``. The device functions that synchronise (``cp.unique``,
``cp.asnumpy``) are replaced here by traps.
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


class _DeviceSlots(np.ndarray):
    """Stands for a CuPy array in ``isinstance(slots, cp.ndarray)`` (no device here)."""


def test_checked_device_slots_skip_the_synchronising_check(no_device, monkeypatch):
    # The pager checks a forward's slots on the host once and hands every layer's write the
    # same device copy with checked=True: no cp.unique, no copy back. Unchecked device slots
    # still get the check (the trap fires).
    monkeypatch.setattr(kpager.cp, "ndarray", _DeviceSlots)
    monkeypatch.setattr(kpager.cp, "issubdtype", np.issubdtype)
    monkeypatch.setattr(kpager.cp, "ascontiguousarray", np.ascontiguousarray)
    dev = np.array([3, 0, 2], np.int32).view(_DeviceSlots)
    out = kpager._check_slots(dev, 4, "scatter_rows", distinct=True, checked=True)
    assert out.tolist() == [3, 0, 2] and no_device == []
    with pytest.raises(AssertionError, match="synchronising"):
        kpager._check_slots(dev, 4, "scatter_rows", distinct=True)


def test_fill_slot_pos_checks_a_host_table_on_the_host_and_uploads_it_once(no_device,
                                                                           monkeypatch):
    launches = []
    monkeypatch.setattr(kpager.cp, "full", np.full)
    monkeypatch.setattr(kpager, "launch_elementwise", lambda *a: launches.append(a))
    kpager.fill_slot_pos(np.array([2, -1, 0], np.int64), 2, 6)
    assert len(no_device) == 1 and no_device[0].dtype == np.int32
    assert no_device[0].tolist() == [2, -1, 0] and len(launches) == 1
    for table, T, P, match in [([0, 0], 2, 4, "distinct blocks"), ([2], 2, 4, "distinct blocks"),
                               ([0], 3, 4, "multiple")]:  # the reference's errors, before upload
        with pytest.raises(ValueError, match=match):
            kpager.fill_slot_pos(np.array(table), T, P)
    assert len(no_device) == 1
