"""docs/conformance.md quotes the committed llama-server run verbatim
(tests/llamacpp/conform_llama_server.json, written by tests/llamacpp/test_conform_server.py), and
the file's table says what its checks say."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "conformance.md"
COMMITTED = ROOT / "tests" / "llamacpp" / "conform_llama_server.json"


def quoted_table() -> str:
    text = DOC.read_text()
    start, end = text.index("<!-- conform-table -->"), text.index("<!-- /conform-table -->")
    block = text[start:end].split("```")
    assert len(block) == 3, "the table is one fenced block between the markers"
    return block[1].strip("\n")


def test_the_doc_quotes_the_committed_run():
    committed = json.loads(COMMITTED.read_text())
    assert quoted_table() == committed["table"]


def test_the_committed_table_is_its_checks():
    committed = json.loads(COMMITTED.read_text())
    rows = committed["table"].splitlines()[2:-1]  # header, rule ... summary
    assert len(rows) == len(committed["checks"])
    for row, check in zip(rows, committed["checks"]):
        assert row.startswith(check["check"]) and check["result"] in row
        assert row.endswith("holds" if check["holds"] else "FAILS")
    assert committed["holds"] and committed["table"].splitlines()[-1].startswith("all checks hold")
