"""`domino regen --endpoint URL`: the target's answers from a serving engine instead of 🤗 `generate`.

vLLM, SGLang and llama.cpp's server all speak the OpenAI completions API, and at scale they are the only
practical way to regenerate hundreds of thousands of answers. This module drives such a server with the same
contract as `regen.regenerate`: the chat template is applied here (thinking off), the answers are stored as
target-tokenizer ids in the same append-only JSONL, and a killed run resumes where it stopped.

* The templated prompt is sent as token ids when the server accepts them (vLLM, SGLang), else as its text
  (llama-cpp-python); a server whose tokenizer differs from the target's is refused up front.
* Token ids in the answer are used as they are when the server returns them (vLLM's `return_token_ids`);
  otherwise the text is tokenized here, and answers whose text does not round-trip (or whose token count
  differs from the server's) are counted as `token_mismatches`.
* Requests run concurrently; 429s, 5xx, timeouts and dropped connections are retried with exponential
  backoff. Answers are appended as they arrive, so a kill or a dead server loses only the requests in flight.
"""

from __future__ import annotations

import http.client
import json
import logging
import random
import re
import threading
import time
import zlib
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tqdm.auto import tqdm

from ..prompt_records import PromptSet
from .answers import RegenOptions, append_lines, make_row, plan_turns, special_ids, summarize
from .turns import TurnPrompt

logger = logging.getLogger(__name__)

# The options that shape a request, fixed when an `EndpointRegen` is made.
GENERATION_OPTIONS = ("max_new_tokens", "temperature", "seed")
# `owned_by` in /v1/models tells the engines apart; each has its own names for the sampling switches.
_VLLM_LIKE = {"vllm", "sglang"}
_LLAMA_CPP_LIKE = {"me", "llamacpp", "llama.cpp"}  # llama-cpp-python says "me"
# A sample for the tokenizer check beyond the chat template's own tokens: spaces, digits, code, non-ASCII.
_TOKENIZER_SAMPLE = "Tokenizer check: 12345 + 0.5 = ?\n    def f(x):  return x**2  # ok\nnaïve café 東京 🙂"


class EndpointError(RuntimeError):
    """A problem with the server or the request, stated in one line with the fix."""


class EndpointClient:
    """Minimal thread-safe JSON client for an OpenAI-compatible server, with retries.

    `base_url` is the API root (`http://host:port/v1`). Each thread keeps one keep-alive connection. Transient
    failures (connection refused/reset, timeouts, 429, 5xx that do not name a request field) are retried
    `retries` times with exponential backoff from `backoff` seconds (honouring `Retry-After`); anything else
    raises `EndpointError` at once.
    """

    def __init__(self, base_url: str, timeout: float = 600.0, retries: int = 5, backoff: float = 0.5,
                 api_key: str | None = None):
        parts = urlsplit(base_url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise EndpointError(f"--endpoint {base_url!r} is not an http(s) URL; pass e.g. http://127.0.0.1:8000/v1")
        if timeout <= 0 or retries < 0 or backoff < 0:
            raise ValueError("timeout must be positive, retries and backoff non-negative")
        self.base_url = base_url.rstrip("/")
        self._scheme, self._host, self._port = parts.scheme, parts.hostname, parts.port
        self._prefix = parts.path  # "/v1"
        self.timeout, self.retries, self.backoff = timeout, retries, backoff
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._local = threading.local()

    def get(self, path: str, root: bool = False) -> Any:
        return self.request("GET", path, None, root=root)

    def post(self, path: str, body: dict[str, Any], root: bool = False) -> Any:
        return self.request("POST", path, body, root=root)

    def request(self, method: str, path: str, body: dict[str, Any] | None, root: bool = False) -> Any:
        """The decoded JSON reply of `method path` (under the API root, or the server root if `root`)."""
        full_path = path if root else self._prefix + path
        payload = None if body is None else json.dumps(body).encode()
        for attempt in range(self.retries + 1):
            retry_after = None
            try:
                status, headers, data = self._send(method, full_path, payload)
            except (OSError, http.client.HTTPException) as err:  # refused, reset, timed out, cut short
                problem = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
            else:
                if status < 300:
                    try:
                        return json.loads(data)
                    except ValueError:
                        raise EndpointError(
                            f"{method} {self._url(full_path)} answered HTTP {status} with something that is not "
                            "JSON; is --endpoint the API root of an OpenAI-compatible server (.../v1)?"
                        ) from None
                reply = _json_or_text(data)
                if status == 429 or (status >= 500 and _field_of(reply) is None):
                    problem = f"HTTP {status}: {_message_of(reply)}"
                    retry_after = _seconds(headers.get("retry-after"))
                else:
                    raise RequestRejected(status, reply, method, self._url(full_path))
            if attempt == self.retries:
                raise ServerUnavailable(self.base_url, problem, attempt + 1)
            delay = retry_after if retry_after is not None else self.backoff * 2**attempt * random.uniform(1, 1.5)
            logger.debug("%s %s failed (%s); retry %d/%d in %.1fs", method, full_path, problem, attempt + 1,
                         self.retries, delay)
            time.sleep(min(delay, 60.0))
        raise AssertionError("unreachable")

    def _send(self, method: str, path: str, payload: bytes | None) -> tuple[int, Any, bytes]:
        """One request on this thread's keep-alive connection. A kept connection the server closed while idle
        (uvicorn does after 5 s) fails before any reply: it is reopened once and the request sent again, as
        urllib3 does, without counting as a retry; a fresh connection's failure is raised."""
        conn = getattr(self._local, "conn", None)
        for fresh in (False, True) if conn is not None else (True,):
            if fresh:
                cls = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
                conn = self._local.conn = cls(self._host, self._port, timeout=self.timeout)
            try:
                conn.request(method, path, body=payload, headers=self._headers)
                response = conn.getresponse()
                return response.status, response.headers, response.read()
            except BaseException as err:
                conn.close()  # a fresh connection for the retry
                self._local.conn = None
                stale = isinstance(err, (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError))
                if fresh or not stale:
                    raise
                logger.debug("%s %s: the server had closed the kept connection; reconnecting", method, path)
        raise AssertionError("unreachable")

    def _url(self, full_path: str) -> str:
        port = f":{self._port}" if self._port else ""
        return f"{self._scheme}://{self._host}{port}{full_path}"


class ServerUnavailable(EndpointError):
    def __init__(self, url: str, problem: str, attempts: int):
        super().__init__(f"cannot reach the server at {url} ({problem}; {attempts} attempt(s)); start it or fix "
                         "--endpoint")


class RequestRejected(EndpointError):
    """An HTTP error the client will not retry: the request itself is wrong."""

    def __init__(self, status: int, reply: Any, method: str, url: str):
        self.status, self.reply, self.field = status, reply, _field_of(reply)
        field = f", field `{self.field}`" if self.field else ""
        super().__init__(f"the server rejected {method} {url} (HTTP {status}{field}): {_message_of(reply)}")


def _json_or_text(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return data.decode(errors="replace")


def _message_of(reply: Any) -> str:
    """The first line of the error message in an OpenAI / vLLM / FastAPI error reply."""
    if isinstance(reply, dict):
        error = reply.get("error", reply)
        if isinstance(error, dict):
            message = error.get("message") or error.get("detail") or error.get("msg")
        else:
            message = error
        if isinstance(message, list):  # FastAPI: [{"loc": [...], "msg": ...}, ...]
            message = "; ".join(f"{'.'.join(map(str, m.get('loc', [])))}: {m.get('msg')}" for m in message
                                if isinstance(m, dict))
        reply = message if message else json.dumps(reply)
    lines = [line.strip() for line in str(reply).splitlines() if line.strip()]
    # llama-cpp-python puts "N validation errors:" first and the useful line second.
    if len(lines) > 1 and re.fullmatch(r"\d+ validation errors?:", lines[0]):
        lines = [f"{lines[0]} {lines[1]}"]
    return (lines[0] if lines else "(empty reply)")[:400]


def _field_of(reply: Any) -> str | None:
    """The request field an error reply blames, if it names one."""
    if not isinstance(reply, dict):
        return None
    error = reply.get("error", reply)
    if isinstance(error, dict):
        if error.get("param"):
            return str(error["param"])
        detail = error.get("detail") or error.get("message")
    else:
        detail = error
    if isinstance(detail, list):  # FastAPI validation errors
        for item in detail:
            loc = [str(part) for part in item.get("loc", []) if part != "body"] if isinstance(item, dict) else []
            if loc:
                return loc[0]
    if isinstance(detail, str):  # llama-cpp-python wraps them in text: 'loc': ('body', 'max_tokens', ...)
        match = re.search(r"'loc': \('body', '([^']+)'", detail)
        if match:
            return match.group(1)
    return None


def _seconds(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


# ------------------------------------------------------------------------------------------- the run


class EndpointRegen:
    """Answers prompts through one served model; see the module docstring for the contract.

    `options` (a `RegenOptions`, with `changes` applied) are the run's; its `GENERATION_OPTIONS` shape every
    request (a sampling run without a seed uses seed 0). Construction checks the server: it is reachable, it
    serves `model` (or exactly one model when `model` is None), and where it exposes a tokenize route, its
    tokenizer matches `tokenizer`.
    """

    def __init__(self, client: EndpointClient, tokenizer: Any, generation_config: Any, model: str | None = None,
                 options: RegenOptions | None = None, **changes: Any):
        self.options = RegenOptions.of(options, **changes)
        if self.options.max_new_tokens < 1 or self.options.temperature < 0:
            raise ValueError("max_new_tokens must be positive and temperature non-negative")
        self.client, self.tokenizer = client, tokenizer
        self.max_new_tokens, self.temperature = self.options.max_new_tokens, self.options.temperature
        self.seed = self.options.seed or 0
        _, self.eos_ids = special_ids(generation_config, tokenizer)
        self.model, self.engine = self._pick_model(model)
        self.send_ids: bool | None = None  # decided by the first request: ids if the server takes them
        self._check_tokenizer()

    def _pick_model(self, model: str | None) -> tuple[str, str]:
        try:
            reply = self.client.get("/models")
        except RequestRejected as err:
            if err.status != 404:
                raise
            raise EndpointError(f"{self.client.base_url}/models was not found (HTTP 404); --endpoint must be the "
                                "server's API root, e.g. http://127.0.0.1:8000/v1") from None
        served = (reply.get("data") if isinstance(reply, dict) else None) or []
        names = {str(entry.get("id")): str(entry.get("owned_by", "")).lower() for entry in served}
        if model is None:
            if len(names) != 1:
                raise EndpointError(f"{self.client.base_url} serves {len(names)} models ({', '.join(names)}); "
                                    "choose one with --model")
            model = next(iter(names))
        elif model not in names:
            raise EndpointError(f"model {model!r} is not served at {self.client.base_url}; it serves: "
                                f"{', '.join(names) or 'nothing'} (pass one of them to --model)")
        engine = names[model]
        if engine not in _VLLM_LIKE | _LLAMA_CPP_LIKE:
            logger.warning("unknown server (owned_by=%r): only standard OpenAI sampling fields are sent, so its own "
                           "defaults (e.g. repetition penalties) may make answers differ from `generate`", engine)
        return model, engine

    def _server_tokens(self, text: str) -> list[int] | None:
        """The server's tokenization of `text` (no special tokens added), if it has a tokenize route."""
        body = {"model": self.model, "prompt": text, "input": text, "content": text,
                "add_special_tokens": False, "add_special": False, "with_pieces": False}
        for path in ("/tokenize", "/extras/tokenize"):  # vLLM / SGLang / llama.cpp; llama-cpp-python
            try:
                reply = self.client.post(path, body, root=True)
            except RequestRejected:
                continue
            tokens = reply.get("tokens") if isinstance(reply, dict) else None
            if isinstance(tokens, list) and all(isinstance(t, int) for t in tokens):
                return tokens
        return None

    def _check_tokenizer(self) -> None:
        text = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": _TOKENIZER_SAMPLE}], tokenize=False, add_generation_prompt=True,
            enable_thinking=False,
        ) if getattr(self.tokenizer, "chat_template", None) else _TOKENIZER_SAMPLE
        ours = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        theirs = self._server_tokens(text)
        if theirs is None:
            logger.info("the server has no tokenize route; the tokenizer is checked on the first answer instead")
        elif theirs != ours:
            raise TokenizerMismatch(ours, theirs)

    def request_body(self, prompt_ids: list[int], prompt_text: str, record_id: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model, "prompt": prompt_ids if self.send_ids else prompt_text,
            "max_tokens": self.max_new_tokens, "temperature": self.temperature, "top_p": 1.0, "n": 1,
            "stream": False, "presence_penalty": 0.0, "frequency_penalty": 0.0,
        }
        if self.temperature > 0:  # a per-prompt seed: the same answers whatever the order or concurrency
            body["seed"] = (self.seed * 1_000_003 + zlib.crc32(record_id.encode())) % 2**31
        if self.engine in _VLLM_LIKE:
            body.update(top_k=-1, min_p=0.0, repetition_penalty=1.0, stop_token_ids=self.eos_ids,
                        skip_special_tokens=False, return_token_ids=True)
        elif self.engine in _LLAMA_CPP_LIKE:  # its defaults: top_k 40, min_p 0.05, repeat_penalty 1.1
            body.update(top_k=0, min_p=0.0, repeat_penalty=1.0)
        return body

    def complete(self, prompt_ids: list[int], prompt_text: str, record_id: str) -> dict[str, Any]:
        """The server's reply for one prompt (called from worker threads)."""
        return self.client.post("/completions", self.request_body(prompt_ids, prompt_text, record_id))

    def first_request(self, prompt_ids: list[int], prompt_text: str, record_id: str) -> dict[str, Any]:
        """Send the first prompt as ids; if the server refuses ids for `prompt`, switch to text for the run."""
        self.send_ids = True
        try:
            return self.complete(prompt_ids, prompt_text, record_id)
        except RequestRejected as err:
            if err.field != "prompt":
                raise
            logger.info("the server does not take token ids as a prompt; sending the templated text instead")
        self.send_ids = False
        reply = self.complete(prompt_ids, prompt_text, record_id)
        served = (reply.get("usage") or {}).get("prompt_tokens")
        if served is not None and served != len(prompt_ids):
            raise EndpointError(
                f"the server read the templated prompt as {served} tokens where the target's tokenizer makes "
                f"{len(prompt_ids)}: it serves another tokenizer, or adds special tokens to text prompts; serve "
                "the model given as --target (or one that takes token ids)"
            )
        return reply

    def answer_ids(self, reply: dict[str, Any], counts: Counter[str]) -> tuple[list[int], bool]:
        """`(response ids in the target's vocabulary, finished)` from a completion reply.

        Finished answers end with an EOS id, as `generate`'s do; text that does not survive tokenize → decode
        here, or whose token count differs from the server's, is counted in `counts["token_mismatches"]`.
        """
        choice = (reply.get("choices") or [None])[0]
        if not isinstance(choice, dict) or not isinstance(choice.get("text", ""), str):
            raise EndpointError(f"the server's completion reply has no choices[0].text: {json.dumps(reply)[:200]}")
        finished = choice.get("finish_reason") == "stop"
        token_ids = choice.get("token_ids")
        if isinstance(token_ids, list) and all(isinstance(t, int) for t in token_ids):
            ids = list(token_ids)
        else:
            text = choice.get("text", "")
            ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            served = (reply.get("usage") or {}).get("completion_tokens")
            round_trip = self.tokenizer.decode(ids, skip_special_tokens=False) == text
            # Servers differ on whether the EOS they stopped at is counted.
            if not round_trip or (served is not None and served not in (len(ids), len(ids) + finished)):
                counts["token_mismatches"] += 1
        if finished and (not ids or ids[-1] not in self.eos_ids):
            ids.append(self.eos_ids[0])
        return ids, finished


class TokenizerMismatch(EndpointError):
    def __init__(self, ours: list[int], theirs: list[int]):
        at = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        super().__init__(
            f"the server's tokenizer does not match the target's: a sample prompt is {len(theirs)} tokens there "
            f"and {len(ours)} here, first different at token {at} ({theirs[at:at + 3]} vs {ours[at:at + 3]}); "
            "pass the served model's tokenizer as --target"
        )


def regenerate_via_endpoint(
    engine: EndpointRegen, prompts: PromptSet, out_path: str | Path, concurrency: int = 8, **changes: Any,
) -> dict[str, Any]:
    """Like `regen.regenerate`, with the answers coming from `engine`'s server, `concurrency` at a time.

    The run's options are the engine's, with `changes` applied to those that do not shape a request (which
    prompts and turns are answered). Rows are appended in the order answers arrive (ids stay keyed to their
    answers); with `turns="all"` a turn is sent once every answer of the turn before it is in. On a server error
    the requests already in flight are finished and written before the error is raised, so nothing answered is
    lost and a rerun resumes. Returns the run's counts, plus `token_mismatches`.
    """
    if concurrency < 1:
        raise ValueError("concurrency must be positive")
    if fixed := sorted(set(changes) & set(GENERATION_OPTIONS)):
        raise TypeError(f"{', '.join(fixed)} shape every request: give them to the EndpointRegen")
    out_path = Path(out_path)
    tokenizer = engine.tokenizer
    plan = plan_turns(tokenizer, prompts, out_path, RegenOptions.of(engine.options, **changes))
    counts = plan.counts
    counts["token_mismatches"] += 0
    start = time.perf_counter()
    failure: BaseException | None = None

    def text_of(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=False)

    with out_path.open("a", encoding="utf-8") as fh, \
            tqdm(total=0, unit="answer", desc="regen (endpoint)") as bar, \
            ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="regen") as pool:

        def write(done: list[tuple[TurnPrompt, dict[str, Any]]]) -> None:
            rows = [make_row(tokenizer, item, *engine.answer_ids(reply, counts), counts) for item, reply in done]
            append_lines(fh, rows)
            plan.answered(rows)
            bar.update(len(rows))
            bar.set_postfix(tok_s=f"{counts['response_tokens'] / (time.perf_counter() - start):.1f}")

        for todo in plan:  # one turn at a time: the next turn's prompts hold this turn's answers
            bar.total += len(todo)
            bar.refresh()
            queue = iter(todo)
            if counts["written"] == 0:  # the run's first request, alone: it settles how prompts are sent
                first = next(queue)
                write([(first, engine.first_request(first.prompt_ids, text_of(first.prompt_ids), first.id))])
            in_flight: dict[Future, TurnPrompt] = {}
            while True:
                while failure is None and len(in_flight) < concurrency:
                    item = next(queue, None)
                    if item is None:
                        break
                    ids = item.prompt_ids
                    in_flight[pool.submit(engine.complete, ids, text_of(ids), item.id)] = item
                if not in_flight:
                    break
                finished, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                done = []
                for future in finished:
                    item = in_flight.pop(future)
                    if future.exception() is not None:
                        failure = failure or future.exception()
                    else:
                        done.append((item, future.result()))
                if done:
                    write(done)
            if failure is not None:
                break
    seconds = time.perf_counter() - start
    if failure is not None:
        fix = ("restart the server if it died, then rerun the same command to resume"
               if isinstance(failure, ServerUnavailable) else "rerun to resume once fixed")
        raise EndpointError(f"{failure} — {counts['written']} answers written to {out_path} this run; {fix}") \
            from failure
    summary = summarize(counts, seconds, out_path, extra=("token_mismatches", *plan.extra_counts))
    summary["answers_per_s"] = round(counts["written"] / max(seconds, 1e-9), 2)
    if counts["token_mismatches"]:
        logger.warning("%d of %d answers did not round-trip exactly through the target's tokenizer (their text is "
                       "kept, tokenized by the target)", counts["token_mismatches"], counts["written"])
    return summary
