"""The HTTP side of ``dflash-ref conform``: one completion of a running server, as token ids.

Two APIs, both given token ids as the prompt and asked for token ids back:

- ``native``: llama-server's ``POST /completion`` (llama.cpp ``tools/server/server-schema.cpp``,
  ``server-task.cpp``): ``prompt`` [ids], ``n_predict``, ``temperature``, ``top_k``, ``top_p``,
  ``min_p``, ``seed``, ``samplers`` (the order the samplers run in), ``ignore_eos``,
  ``return_tokens``; the answer's ``tokens`` are the generated ids, and its ``timings`` carry
  ``draft_n`` / ``draft_n_accepted`` when the server drafted (``server-common.cpp``,
  ``server_slot_stats::to_json``).
- ``openai``: ``POST /v1/completions`` (vLLM, SGLang, llama-server): ``prompt`` [ids],
  ``max_tokens``, the same sampling fields, ``return_token_ids`` (vLLM: ``choices[0].token_ids``),
  ``return_tokens`` (llama-server: ``choices[0].tokens``) and ``logprobs`` with
  ``return_tokens_as_token_ids`` (vLLM: ``"token_id:N"`` strings) as the fallback; ``timings`` as
  above when the server is llama-server.

**The sampling law asked for** is dflash-ref's (docs/lossless.md): logits / T, top-k, softmax,
top-p. llama-server's default chain applies top-p before the temperature and adds ``min_p =
0.05`` and ``top_k = 40``; every request therefore names ``samplers = [top_k, temperature,
top_p]``, ``min_p = 0`` and ``top_k`` (0: off) explicitly (servers that do not know
``samplers`` ignore it).

Requests use ``requests`` with a connect / read timeout and retries on a refused connection
and on 502 / 503 / 504; what cannot be read as token ids is a :class:`ServerError` whose message
names the cause and the fix.
"""

from __future__ import annotations

from dflash_ref.errors import DFlashRefError
from dflash_ref.testing.conform import Completion, Policy

APIS = ("native", "openai")
SAMPLERS = ["top_k", "temperature", "top_p"]  # dflash-ref's order (module docstring)


class ServerError(DFlashRefError, RuntimeError):
    """The server is unreachable, refused a request, or answered something other than ids."""


class ServerClient:
    """Completions from the server at ``url`` through ``api`` ("native" or "openai").

    Args:
        url: e.g. ``http://127.0.0.1:8080`` (the API's path is added).
        api: "native" (llama-server ``/completion``) or "openai" (``/v1/completions``).
        model: the ``model`` field of an OpenAI request (vLLM and SGLang check it).
        timeout: (connect, read) seconds.
        retries: tries after the first on a refused connection or a 502 / 503 / 504.
    """

    def __init__(self, url: str, api: str = "native", model: str | None = None,
                 timeout: tuple[float, float] = (5.0, 300.0), retries: int = 3):
        import requests
        from requests.adapters import HTTPAdapter
        from urllib3.util.retry import Retry

        if api not in APIS:
            raise ServerError(f"api={api!r} is unknown; expected one of {APIS}")
        self.url, self.api, self.model, self.timeout = url.rstrip("/"), api, model, timeout
        self.session = requests.Session()
        retry = Retry(total=retries, connect=retries, read=0, backoff_factor=0.25,
                      status_forcelist=(502, 503, 504), allowed_methods=None,
                      raise_on_status=False)
        self.session.mount("http://", HTTPAdapter(max_retries=retry))
        self.session.mount("https://", HTTPAdapter(max_retries=retry))
        self.retries = retries

    @property
    def endpoint(self) -> str:
        return self.url + ("/completion" if self.api == "native" else "/v1/completions")

    def complete(self, prompt, n_predict: int, policy: Policy, seed: int) -> Completion:
        """``n_predict`` tokens after ``prompt`` (ids) under ``policy`` with ``seed``."""
        body = self.request_body(prompt, n_predict, policy, seed)
        answer = self._post(body)
        if self.api == "native":
            return self._native(answer, n_predict)
        return self._openai(answer, n_predict)

    def request_body(self, prompt, n_predict: int, policy: Policy, seed: int) -> dict:
        """The JSON of one request (module docstring)."""
        law = {"temperature": float(policy.temperature), "top_k": int(policy.top_k),
               "top_p": float(policy.top_p), "min_p": 0.0, "seed": int(seed),
               "samplers": SAMPLERS, "ignore_eos": True}
        ids = [int(t) for t in prompt]
        if self.api == "native":
            return {"prompt": ids, "n_predict": int(n_predict), "return_tokens": True,
                    "cache_prompt": True, **law}
        return {"model": self.model or "default", "prompt": ids, "max_tokens": int(n_predict),
                "return_token_ids": True, "return_tokens": True, "logprobs": 1,
                "return_tokens_as_token_ids": True, **law}

    def _post(self, body: dict) -> dict:
        import requests

        try:
            r = self.session.post(self.endpoint, json=body, timeout=self.timeout)
        except requests.exceptions.ConnectionError as exc:
            if "aborted" in str(exc) or "RemoteDisconnected" in str(exc):
                raise ServerError(f"the server at {self.url} closed the connection without an "
                                  f"answer; see the server's log") from None
            raise ServerError(f"cannot reach the server at {self.url} ({_reason(exc)}, after "
                              f"{self.retries + 1} tries); start it, or check --server") from None
        except requests.exceptions.Timeout:
            raise ServerError(f"the server at {self.url} did not answer within "
                              f"{self.timeout[1]:g} s; check that it is not stuck, or raise "
                              f"--timeout") from None
        if r.status_code != 200:
            raise ServerError(f"{self.endpoint} answered HTTP {r.status_code}: "
                              f"{_short(r.text)}; check --api ({self.api}) and the server's log")
        try:
            return r.json()
        except ValueError:
            raise ServerError(f"{self.endpoint} answered non-JSON text ({_short(r.text)}); "
                              f"expected a completion object: is --server the model server's "
                              f"address?") from None

    def _native(self, answer: dict, n_predict: int) -> Completion:
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not _is_ids(tokens) or (not tokens and answer.get("content")):
            raise ServerError(f"{self.endpoint} answered text, not token ids (no 'tokens' in "
                              f"{_short(str(answer))}); llama-server returns them for "
                              f"return_tokens=true: update an older build, or use --api openai")
        timings = answer.get("timings") or {}
        return Completion(tuple(int(t) for t in tokens), _int_or_none(timings, "draft_n"),
                          _int_or_none(timings, "draft_n_accepted"))

    def _openai(self, answer: dict, n_predict: int) -> Completion:
        choices = answer.get("choices") if isinstance(answer, dict) else None
        if not choices:
            raise ServerError(f"{self.endpoint} answered no choices: {_short(str(answer))}")
        c = choices[0]
        tokens = c.get("token_ids") or c.get("tokens") or _logprob_ids(c.get("logprobs"))
        if not _is_ids(tokens) or not tokens:
            raise ServerError(f"{self.endpoint} answered text, not token ids "
                              f"({_short(str(c))}); the server must return the generated ids "
                              f"(vLLM: return_token_ids or return_tokens_as_token_ids; "
                              f"llama-server: return_tokens), else certify it through --api "
                              f"native")
        timings = answer.get("timings") or {}
        return Completion(tuple(int(t) for t in tokens), _int_or_none(timings, "draft_n"),
                          _int_or_none(timings, "draft_n_accepted"))


def _logprob_ids(logprobs) -> list[int] | None:
    """vLLM's ``logprobs.tokens`` as ids when they read ``"token_id:N"``."""
    if not isinstance(logprobs, dict) or not isinstance(logprobs.get("tokens"), list):
        return None
    out = []
    for t in logprobs["tokens"]:
        if not (isinstance(t, str) and t.startswith("token_id:")):
            return None
        out.append(int(t.split(":", 1)[1]))
    return out


def _is_ids(x) -> bool:
    return isinstance(x, list) and all(isinstance(t, int) and not isinstance(t, bool)
                                       for t in x)


def _int_or_none(d: dict, key: str) -> int | None:
    v = d.get(key) if isinstance(d, dict) else None
    return int(v) if isinstance(v, (int, float)) else None


def _short(text: str, n: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n] + "..."


def _reason(exc: Exception) -> str:
    text = str(exc)
    for key in ("Connection refused", "Name or service not known", "No route to host",
                "timed out"):
        if key in text:
            return key.lower()
    return _short(text, 80)


__all__ = ["APIS", "SAMPLERS", "ServerClient", "ServerError"]
