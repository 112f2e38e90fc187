"""``greedy_gaps``: the top-1 minus top-2 logit of each row that chose a continuation token
(dflash_ref/oracle/llamacpp_loop.py). ``llamacpp_loop`` itself is checked against llama.cpp's
own per-step counts (tests/llamacpp/test_dflash.py)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from dflash_ref.oracle.llamacpp_loop import greedy_gaps, spec_steps


class _Rows:
    """A stand-in target whose logits row i is a fixed vector: [5, 3, 0] shifted by i, and a
    tie at row 2."""

    def new_state(self):
        return None

    def forward(self, seq, state):
        rows = np.array([[5.0, 3.0, 0.0], [0.0, 1.0, 4.5], [2.0, 2.0, -1.0], [0.0, 0.0, 9.0]])
        return SimpleNamespace(logits=rows[: len(seq)].astype(np.float32))


def test_gaps_are_read_from_the_rows_that_chose_the_tokens():
    # prompt of 2 ids, 2 generated: rows 1 and 2 chose them (gaps 3.5 and 0, the tie); an
    # off-by-one that read rows 2 and 3 would give 0 and 9, the top-1 alone 4.5 and 2
    gaps = greedy_gaps(_Rows(), [7, 8], [2, 0])
    np.testing.assert_array_equal(gaps, [3.5, 0.0])


def test_full_block_steps_stop_at_the_first_shorter_draft():
    # a hand case: the 3rd step drafts 5 of 7, so it and everything after are left out; a
    # check of `a != n_draft` instead of `d != n_draft` would stop at the 2nd step
    from dflash_ref.oracle.llamacpp_loop import full_block_steps

    assert full_block_steps([(0, 7), (7, 7), (2, 5), (1, 7)]) == [0, 7]
    assert full_block_steps([(3, 4)], n_draft=4) == [3]


def test_spec_steps_reads_each_accepted_line_of_llama_cpps_verbose_log():
    # Lines as examples/speculative-simple prints them with -v (build 11434), among others that
    # look alike. Catches accepted and drafted swapped, a line with other words counted.
    err = ("main: accepted 3/7 draft tokens, the rest generated\n"
           "draft candidate   0, pos   0:   1234 ( 0.9) 'x'\n"
           "main: accepted 0/7 draft tokens, the rest generated\n"
           "n_accept  = 3\n"
           "main: accepted 12/15 draft tokens, the rest generated\n")
    assert spec_steps(err) == [(3, 7), (0, 7), (12, 15)]
    assert spec_steps("n_drafted = 14\nn_accept  = 3\n") == []
