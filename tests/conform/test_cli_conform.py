"""``dflash-ref conform`` end to end on the demo test server, and its bad inputs: each one
``error:`` line naming the cause, before any weight is read."""

from __future__ import annotations

import json
import socket

import pytest

from dflash_ref.cli import main
from dflash_ref.oracle.conform_http import ServerClient, ServerError
from dflash_ref.testing.conform import Policy
from tests.conform.server import DEMO, DemoServer

PROMPT = ",".join(map(str, json.loads((DEMO / "held_out_prompts.json").read_text())
                      ["prompts"][11][:46]))
TARGET, DRAFTER = str(DEMO / "target"), str(DEMO / "drafter")


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # nothing listens there once the socket is closed


def run(capsys, *args) -> tuple[int, str, str]:
    try:
        code = main(["conform", *args])
    except SystemExit as exc:  # argparse's own refusals (cli_args.Parser: one error line)
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def test_a_correct_server_exits_0_and_writes_the_report(capsys, tmp_path):
    report = tmp_path / "report.json"
    with DemoServer() as url:
        code, out, err = run(capsys, "--server", url, "--target", TARGET, "--drafter", DRAFTER,
                             "--prompt-ids", PROMPT, "--policy", "greedy", "--json", str(report))
        assert code == 0, out + err
        assert "all checks hold" in out and "greedy prompt 0" in out
        assert "conform: 1 requests to" in err  # no silent wait: what it is doing, on stderr
        data = json.loads(report.read_text())
        assert data["holds"] is True and data["checks"][0]["check"] == "greedy prompt 0"
        # the report is never overwritten
        code, out, err = run(capsys, "--server", url, "--target", TARGET, "--prompt-ids", PROMPT,
                             "--json", str(report))
        assert code == 1 and err.startswith("error: --json") and "exists" in err  # writing.py


def test_a_planted_bug_exits_1_naming_the_failed_check(capsys):
    with DemoServer("residual_not_renormalised") as url:
        code, out, err = run(capsys, "--server", url, "--target", TARGET, "--drafter", DRAFTER,
                             "--prompt-ids", PROMPT, "--policy", "1.0,top_p=0.8", "--samples",
                             "200", "--n-predict", "3")
    assert code == 1
    line = next(x for x in out.splitlines() if x.startswith("sampled"))
    assert line.endswith("FAILS") and "probability 0" in line


def test_an_unreachable_server_is_one_error_line(capsys):
    code, out, err = run(capsys, "--server", closed_port(), "--target", TARGET, "--prompt-ids",
                         PROMPT, "--retries", "0")
    assert code == 1 and err.count("\n") == 1
    assert err.startswith("error: cannot reach the server at") and "connection refused" in err


@pytest.mark.parametrize(("mode", "api", "says"), [
    ("text", "native", "answered text, not token ids"),
    ("text", "openai", "answered text, not token ids"),
    ("html", "native", "non-JSON text"),
])
def test_a_server_without_ids_is_one_error_line(capsys, mode, api, says):
    with DemoServer(mode=mode) as url:
        code, out, err = run(capsys, "--server", url, "--target", TARGET, "--api", api,
                             "--prompt-ids", PROMPT)
    assert code == 1 and err.count("\n") == 1 and says in err, err


def test_bad_arguments_are_refused_before_the_server_is_asked(capsys, tmp_path):
    for args, says in [
        (["--policy", "hot"], "is not a policy"),
        (["--policy", "0.7,top_q=3"], "is not a policy"),
        (["--prompt-ids", PROMPT, "--length", "5", "--n-predict", "4"], "--n-predict 4 < --length"),
        ([], "give a prompt"),
    ]:
        code, out, err = run(capsys, "--server", closed_port(), "--target", TARGET, *args)
        assert code == 2 and says in err and err.count("\n") == 1, err
    code, out, err = run(capsys, "--server", closed_port(), "--target", str(tmp_path / "none"),
                         "--prompt-ids", PROMPT)
    assert code == 1 and "no such file or directory" in err


def test_the_client_sends_dflash_refs_sampling_law():
    # llama-server's defaults (top_k 40, min_p 0.05, top-p before the temperature) are
    # overridden in every request: catches a request that leaves one of them to the server
    body = ServerClient("http://x").request_body([1, 2], 4, Policy(0.7, top_p=0.9), seed=5)
    assert body["samplers"] == ["top_k", "temperature", "top_p"]
    assert (body["top_k"], body["min_p"], body["top_p"], body["temperature"], body["seed"]) == \
        (0, 0.0, 0.9, 0.7, 5)
    assert body["prompt"] == [1, 2] and body["return_tokens"] is True
    with pytest.raises(ServerError, match="unknown"):
        ServerClient("http://x", api="grpc")
