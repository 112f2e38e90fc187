"""Warm-up before timing: what a timed run must not pay for.

The first call of each path pays one-time costs that are not decoding: on CuPy, NVRTC compiles each
kernel family and the driver loads it (seconds), attention kernels opt in to their shared memory,
cuBLAS makes its handle and plans; on NumPy, BLAS starts its threads. Timed inside a plain run,
they made ``dflash-ref demo --backend cupy`` print a 9.34x "speedup" on an H200 (the plain run had
paid the compiles). :func:`warm_up` runs every path a timed comparison will take once, untimed, on
the same prompt length, so that each later run meets only compiled kernels and made plans.
"""

from __future__ import annotations

from dflash_ref.spec_decode.loop import generate

WARM_UP_BLOCKS = 2
"""Speculative steps of the warm-up: the first and a later one (a later step verifies after a
commit, with the drafter's context cache already filled)."""


def warm_up(target, drafter, prompt_ids, *, block_size: int | None = None,
            verify="chain", state=None) -> None:
    """Run plain decoding, then (with a drafter) speculative decoding, once each, untimed.

    The runs prefill ``prompt_ids`` (the timed runs' prefill shapes) and decode a few tokens:
    enough for every kernel of a step to be launched once. Results are discarded; nothing is
    kept between runs (each ``generate`` makes its own state), unless ``state`` is given: the
    state the timed runs will reuse, emptied before each run (a state whose step runner records
    steps, ``dflash-ref demo --graphs``, records its decode, verify and draft steps here).
    """
    block = block_size or (drafter.block_size if drafter is not None else 1)
    new_tokens = WARM_UP_BLOCKS * block + 1
    for d in (None, drafter) if drafter is not None else (None,):
        if state is not None:
            state.truncate(0)
        spec = {} if d is None else {"block_size": block_size, "verify": verify}
        generate(target, d, prompt_ids, new_tokens, state=state, **spec)

