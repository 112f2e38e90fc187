"""``dflash-ref conform`` against the pinned llama-server (scripts/build_llamacpp.sh) serving the
shipped demo pair with DFlash speculative decoding: greedy on four prompts, two sampled policies
and the draft counts of each hold (docs/conformance.md shows this run's table).

The pair is converted to F32 GGUFs with ``dflash-ref convert`` (the shipped weights are BF16, so
F32 holds them exactly, and llama.cpp's F32 path is within 1e-3 of dflash-ref's logits:
docs/interop.md), served by ``llama-server -m target -md drafter --spec-type draft-dflash
--spec-draft-n-max 7`` on one thread, and certified by ``dflash-ref conform`` on the same files.
llama.cpp's DFlash drafts its argmax at every temperature and checks each against a token sampled
from the target's row (``common_sampler_sample_and_accept_n``: no draft law, so no rejection
rule), hence ``--draft-rule argmax`` for the acceptance comparison.

The run's JSON is compared with the committed one (tests/llamacpp/conform_llama_server.json,
whose table docs/conformance.md quotes: tests/conform/test_conformance_doc.py): with fixed seeds
and one thread llama-server answers the same tokens, so the verdicts, the greedy tokens, the draft
counts and the statistics must be the committed ones.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
import requests

from dflash_ref.cli import main
from tests.conform.server import DEMO

pytestmark = pytest.mark.llamacpp

COMMITTED = Path(__file__).with_name("conform_llama_server.json")
HELD_OUT = json.loads((DEMO / "held_out_prompts.json").read_text())["prompts"]
# Sampled: prompt 11's first 46 ids (tests/conform/test_planted.py says why). Greedy: that one and
# held-out prompts 6, 9 and 23, whose greedy paths keep a top-2 gap >= 0.1 (test_dflash.py).
PROMPTS = [HELD_OUT[11][:46], HELD_OUT[6], HELD_OUT[9], HELD_OUT[23]]
POLICIES = ["greedy", "1.0,top_p=0.8", "0.7,top_k=20"]
N, N_PREDICT, DRAFT_MAX = 600, 8, 7
START_S = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    """The demo pair as F32 GGUFs, written by ``dflash-ref convert``."""
    tmp = tmp_path_factory.mktemp("conform")
    target, drafter = tmp / "target-f32.gguf", tmp / "drafter-f32.gguf"
    assert main(["convert", str(DEMO / "target"), str(target), "--qtype", "f32"]) == 0
    assert main(["convert", str(DEMO / "drafter"), str(drafter), "--qtype", "f32",
                 "--target", str(DEMO / "target")]) == 0
    return target, drafter


@pytest.fixture(scope="module")
def llama_server(llamacpp, pair):
    """llama-server on the pair, DFlash on, until the module ends; its address."""
    binary = llamacpp.tool("llama-server")
    if not binary.is_file():
        reason = f"{binary} is not built (rerun scripts/build_llamacpp.sh)"
        if os.environ.get("DFLASH_REQUIRE_LLAMACPP") == "1":
            pytest.fail(f"DFLASH_REQUIRE_LLAMACPP=1 but {reason}")
        pytest.skip(reason)
    port = free_port()
    log = open(pair[0].with_name("llama-server.log"), "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [str(binary), "-m", str(pair[0]), "-md", str(pair[1]), "--spec-type", "draft-dflash",
         "--spec-draft-n-max", str(DRAFT_MAX), "-t", "1", "-c", "512", "-np", "1",
         "--host", "127.0.0.1", "--port", str(port), "--no-webui"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, log.name)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def _wait_healthy(url: str, proc, log_name: str) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"llama-server exited {proc.returncode}:\n"
                                 f"{Path(log_name).read_text(errors='replace')[-3000:]}")
        try:
            if requests.get(url + "/health", timeout=2).status_code == 200:
                return
        except requests.exceptions.ConnectionError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"llama-server not healthy after {START_S} s")


def run_conform(url: str, pair, out: Path, capsys) -> tuple[int, str]:
    args = ["conform", "--server", url, "--target", str(pair[0]), "--drafter", str(pair[1]),
            "--draft-rule", "argmax", "--samples", str(N), "--n-predict", str(N_PREDICT),
            "--json", str(out)]
    for p in PROMPTS:
        args += ["--prompt-ids", ",".join(map(str, p))]
    for p in POLICIES:
        args += ["--policy", p]
    code = main(args)
    return code, capsys.readouterr().out


def test_llama_server_conforms(llama_server, pair, tmp_path, capsys):
    code, out = run_conform(llama_server, pair, tmp_path / "report.json", capsys)
    report = json.loads((tmp_path / "report.json").read_text())
    assert code == 0 and report["holds"], out  # greedy x 4, sampled x 2, acceptance x 3
    if os.environ.get("DFLASH_WRITE_CONFORM_REPORT") == "1":  # how the committed file was made
        COMMITTED.write_text(json.dumps({**report, "table": out.rstrip("\n")}, indent=1) + "\n")
    committed = json.loads(COMMITTED.read_text())
    for got, want in zip(report["checks"], committed["checks"], strict=True):
        assert (got["check"], got["policy"], got["n"], got["holds"]) == \
            (want["check"], want["policy"], want["n"], want["holds"])
        for key in ("tokens", "server", "reference"):  # greedy ids, draft counts
            assert got["detail"].get(key) == want["detail"].get(key), (got["check"], key)
        for key in ("chi2_p", "maxdev_p", "max_deviation", "p_value"):
            if key in want["detail"]:
                assert got["detail"][key] == pytest.approx(want["detail"][key], rel=1e-9)
