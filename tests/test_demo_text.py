"""dflash_ref.demo_text: byte vocabularies and the accepted-draft marking of ``dflash-ref demo``."""

from __future__ import annotations

import json

from dflash_ref.demo_text import (
    ACCEPTED_COLOUR,
    RESET,
    decode_bytes,
    encode_text,
    is_byte_vocabulary,
    render_marked,
)


def test_render_marked_brackets_runs_of_accepted_drafts():
    ids = encode_text("def f(x):")  # 9 bytes
    flags = [False, True, True, False, False, True, True, True, False]
    # by hand: "d" + "[ef]" + " f" + "[(x)]" + ":"
    assert render_marked(ids, flags, as_bytes=True, colour=False) == "d[ef] f[(x)]:"
    assert render_marked(ids, flags, as_bytes=True, colour=True) == (
        f"d{ACCEPTED_COLOUR}ef{RESET} f{ACCEPTED_COLOUR}(x){RESET}:")
    assert render_marked([5, 6, 7], [False, True, True], as_bytes=False, colour=False) == "5 [6 7]"
    assert render_marked([], [], as_bytes=True, colour=False) == ""


def test_decode_bytes_drops_special_ids_and_replaces_bad_utf8():
    assert decode_bytes([104, 105, 256, 33]) == "hi!"
    assert decode_bytes(list("é".encode())) == "é"
    assert decode_bytes([0xC3]) == "\ufffd"  # half of a two-byte character


def _byte_level_json(vocab):
    return {"model": {"type": "BPE", "vocab": vocab, "merges": []},
            "decoder": {"type": "ByteLevel"}}


def test_is_byte_vocabulary(tmp_path):
    # GPT-2's table by hand for three bytes: "!" is itself, space is U+0120, byte 0 is U+0100
    from dflash_ref.demo_text import bytes_to_unicode
    table = bytes_to_unicode()
    assert (table[ord("!")], table[ord(" ")], table[0]) == ("!", "\u0120", "\u0100")
    assert not is_byte_vocabulary(tmp_path)  # no tokenizer.json
    good = {table[b]: b for b in range(256)}
    (tmp_path / "tokenizer.json").write_text(json.dumps(_byte_level_json(good)))
    assert is_byte_vocabulary(tmp_path)
    swapped = dict(good, **{table[0]: 1, table[1]: 0})
    (tmp_path / "tokenizer.json").write_text(json.dumps(_byte_level_json(swapped)))
    assert not is_byte_vocabulary(tmp_path)
