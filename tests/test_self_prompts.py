"""`domino self-prompts`: the target writes user turns, kept only when finished, new and benchmark-free; resumes
to the same records as one uninterrupted run; `domino regen` answers the file."""

from __future__ import annotations

import json
import logging

import pytest

from domino_hf.data import read_prompts
from domino_hf.training.regen import regenerate
from domino_hf.training.self_prompts import user_turn_prefix, write_self_prompts
from conftest import make_tiny_tokenizer


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def writer(tiny_llama):
    """The tiny Llama with a common word as its end of turn, so that some questions finish."""
    model, tokenizer = tiny_llama
    model.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids("w7")
    return model, tokenizer


def test_the_prefix_opens_the_user_turn(tiny_tokenizer):
    assert user_turn_prefix(tiny_tokenizer) == "<|im_start|>user "
    assert user_turn_prefix(tiny_tokenizer, system="w1 w2") == "<|im_start|>system w1 w2<|im_end|> <|im_start|>user "
    with pytest.raises(ValueError, match="need a chat template.*--chat_template FILE"):
        user_turn_prefix(make_tiny_tokenizer(chat_template=None))


def test_questions_are_sampled_user_turns_and_drops_are_counted(writer, tmp_path):
    model, tokenizer = writer
    out = tmp_path / "self.jsonl"
    counts = write_self_prompts(model, tokenizer, out, num_prompts=6, batch_size=8, max_new_tokens=12,
                                starts=("", "w3 w4"), exclude=lambda text: "w9" in text.split())
    rows = _rows(out)
    assert len(rows) == 6 == counts["written"]
    assert all(list(r) == ["id", "prompt", "turns"] and r["turns"] == [r["prompt"]] for r in rows)
    assert len({r["prompt"] for r in rows}) == 6 and not any("w9" in r["prompt"].split() for r in rows)
    assert counts["unfinished"] > 0  # some ran past 12 tokens without closing the turn
    for row in rows:  # batch b began with starts[b % 2]
        batch = int(row["id"].split("-")[2])
        assert row["prompt"].startswith("w3 w4") == (batch % 2 == 1)
    assert [r.id for r in read_prompts(str(out)).records] == [r["id"] for r in rows]


def test_a_rerun_resumes_to_the_records_of_one_run(writer, tmp_path):
    model, tokenizer = writer
    kwargs = dict(batch_size=4, max_new_tokens=12, seed=3)
    write_self_prompts(model, tokenizer, tmp_path / "one.jsonl", num_prompts=7, **kwargs)
    write_self_prompts(model, tokenizer, tmp_path / "two.jsonl", num_prompts=3, **kwargs)
    with open(tmp_path / "two.jsonl", "a") as handle:
        handle.write('{"id": "self-3-99-0", "prom')  # a line cut short by a kill: cut off, not a batch index
    write_self_prompts(model, tokenizer, tmp_path / "two.jsonl", num_prompts=7, **kwargs)
    assert _rows(tmp_path / "one.jsonl") == _rows(tmp_path / "two.jsonl")
    assert write_self_prompts(model, tokenizer, tmp_path / "two.jsonl", num_prompts=7, **kwargs)["written"] == 0


def test_regen_answers_the_self_written_prompts(writer, tmp_path):
    model, tokenizer = writer
    write_self_prompts(model, tokenizer, tmp_path / "self.jsonl", num_prompts=3, batch_size=4, max_new_tokens=12)
    prompts = read_prompts(str(tmp_path / "self.jsonl"))
    summary = regenerate(model, tokenizer, prompts, tmp_path / "regen.jsonl", batch_size=4, max_new_tokens=4)
    assert summary["written"] == 3


def test_cli_without_a_chat_template_is_a_clean_error(tmp_path, monkeypatch, caplog):
    import domino_hf.targets
    from domino_hf.cli import main
    from conftest import make_tiny_llama

    tokenizer = make_tiny_tokenizer(chat_template=None)
    monkeypatch.setattr(domino_hf.targets, "load_target", lambda *a, **k: (make_tiny_llama(tokenizer), tokenizer))
    caplog.set_level(logging.ERROR)
    assert main(["self-prompts", "--target", "tiny", "--num-prompts", "2", "--out", str(tmp_path / "x.jsonl")]) == 2
    assert "need a chat template" in caplog.text and not (tmp_path / "x.jsonl").exists()
