"""A small DFlash server for the conform tests: llama-server's ``/completion`` and the OpenAI
``/v1/completions`` over dflash-ref's own loop on the shipped demo pair, with a planted bug
(tests/conform/planted.py) or none.

Standard library only (``http.server`` in a thread). It answers what tests/conform needs of the
two APIs (llama.cpp ``tools/server``): ids in ``prompt``, ``n_predict`` / ``max_tokens``,
``temperature``, ``top_k``, ``top_p``, ``seed``; the generated ids in ``tokens`` (native) or
``choices[0].tokens`` (OpenAI), and ``timings.draft_n`` / ``draft_n_accepted`` when it drafted.
``mode="text"`` answers text only (a server that cannot return ids); ``mode="html"`` answers an
HTML page (a wrong address).

Each request restores the prompt's prefill (all but its last token, captured once) instead of
running it again: the run is the same, ``generate(state=...)`` prefills the rest.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np

import dflash_ref
from dflash_ref import DFlashDrafter, TargetModel, generate
from dflash_ref.ops.sampling import SamplingParams
from dflash_ref.oracle.conform_reference import ServerDraftWindow
from tests.conform.planted import Planted

DEMO = Path(dflash_ref.__file__).parent / "data" / "demo"
_MODELS: dict = {}


def demo_pair():
    """The shipped demo target and drafter, loaded once per process."""
    if not _MODELS:
        target = TargetModel.from_pretrained(DEMO / "target")
        _MODELS["pair"] = (target, DFlashDrafter.from_pretrained(DEMO / "drafter", target))
    return _MODELS["pair"]


class DemoServer:
    """``with DemoServer(bug) as url:`` a server on 127.0.0.1 (a free port) until the block ends."""

    def __init__(self, bug: str | None = None, mode: str = "ids", speculative: bool = True):
        self.verifier = ServerDraftWindow(Planted(bug=bug))
        self.mode, self.speculative = mode, speculative
        self.target, self.drafter = demo_pair()
        self._lock = threading.Lock()
        self._prefix: tuple | None = None
        self._state = self._snap = None

    def __enter__(self) -> str:
        handler = type("Handler", (_Handler,), {"app": self})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def run(self, prompt, n_predict: int, temperature: float, top_k: int, top_p: float,
            seed: int) -> tuple[list[int], int, int]:
        """(tokens, drafted, accepted) of one request."""
        with self._lock:
            law = SamplingParams(temperature, top_p=top_p, top_k=top_k,
                                 seed=seed if temperature > 0 else None)
            res = generate(self.target, self.drafter if self.speculative else None, prompt,
                           n_predict, sampling=law, verify=self.verifier,
                           state=self._restored(prompt))
        return (list(res.tokens), int(sum(res.drafted)),
                int(sum(n - 1 for n in res.acceptance_lengths)))

    def _restored(self, prompt):
        prefix = tuple(prompt[:-1])
        if not prefix:
            return None
        if prefix != self._prefix:
            self._state = self.target.new_state()
            self.target.forward(np.asarray(prefix, np.int64), self._state,
                                logits_rows=slice(-1, None))
            self._snap, self._prefix = self._state.snapshot(), prefix
        self._state.restore(self._snap)
        return self._state


class _Handler(BaseHTTPRequestHandler):
    app: DemoServer

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.app.mode == "html":
            return self._send(200, b"<html><body>not a model server</body></html>", "text/html")
        native = self.path == "/completion"
        if not native and self.path != "/v1/completions":
            return self._send(404, b'{"error": "not found"}')
        n = int(body.get("n_predict", body.get("max_tokens", 16)))
        tokens, drafted, accepted = self.app.run(
            body["prompt"], n, float(body.get("temperature", 0.8)), int(body.get("top_k", 40)),
            float(body.get("top_p", 0.95)), int(body.get("seed", 0)))
        timings = {"predicted_n": len(tokens)}
        if drafted:
            timings.update(draft_n=drafted, draft_n_accepted=accepted)
        text = bytes(t for t in tokens if t < 256).decode("latin-1")
        ids = tokens if self.app.mode == "ids" else []
        if native:
            answer = {"content": text, "tokens": ids, "timings": timings}
        else:
            answer = {"choices": [{"text": text, **({"tokens": ids} if ids else {})}],
                      "timings": timings}
        self._send(200, json.dumps(answer).encode())

    def _send(self, code: int, data: bytes, kind: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
