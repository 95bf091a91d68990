"""`domino regen`: output schema, resuming, kill tolerance, skip counts, batched == unbatched greedy."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from domino_hf.data import PromptRecord, PromptSet, chat_input_ids
from domino_hf.training import regen, regen_cli
from domino_hf.training.answers import read_existing
from domino_hf.training.regen import generate_batch, regenerate

FIELDS = ["id", "prompt", "response", "prompt_ids", "response_ids", "finished"]


def _prompts(n: int, skipped: int = 0) -> PromptSet:
    # Different lengths, so batches really are left-padded.
    records = [PromptRecord(id=f"p{i}", turns=[" ".join(f"w{(i * 7 + j) % 90}" for j in range(1 + i % 5))])
               for i in range(n)]
    return PromptSet(records, skipped, "test")


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _eos_from_output(model, tokenizer, prompts):
    """Make a token of the first answer its EOS, so some answers finish and some do not.

    Returns `(eos id, length of the first answer)`: the first token that does not repeat an earlier one.
    """
    ids = chat_input_ids(tokenizer, prompts.records[0].turns)
    answer = model.generate(torch.tensor([ids]), max_new_tokens=5, do_sample=False)[0, len(ids):].tolist()
    end = next(i for i in range(1, len(answer)) if answer[i] not in answer[:i])
    model.generation_config.eos_token_id = answer[end]
    return answer[end], end + 1


def test_regen_writes_the_schema(tiny_llama, tmp_path):
    model, tokenizer = tiny_llama
    prompts = _prompts(6, skipped=2)
    eos, length = _eos_from_output(model, tokenizer, prompts)
    out = tmp_path / "out" / "regen.jsonl"
    summary = regenerate(model, tokenizer, prompts, out, batch_size=4, max_new_tokens=6)
    rows = sorted(_rows(out), key=lambda r: int(r["id"][1:]))  # batches go by prompt length (length_batches)
    assert [r["id"] for r in rows] == [f"p{i}" for i in range(6)]
    assert all(list(r) == FIELDS for r in rows)
    assert rows[0]["finished"] and rows[0]["response_ids"][-1] == eos and len(rows[0]["response_ids"]) == length
    for row, record in zip(rows, prompts.records):
        assert row["prompt"] == record.turns[0]
        assert row["prompt_ids"] == chat_input_ids(tokenizer, record.turns)
        assert row["response"] == tokenizer.decode(row["response_ids"], skip_special_tokens=True)
        if row["finished"]:
            assert row["response_ids"].count(eos) == 1 and row["response_ids"][-1] == eos
        else:
            assert len(row["response_ids"]) == 6 and eos not in row["response_ids"]
    assert summary["written"] == 6 and summary["skipped_malformed"] == 2
    assert summary["response_tokens"] == sum(len(r["response_ids"]) for r in rows)
    assert summary["finished"] == sum(r["finished"] for r in rows)
    assert 0 < summary["finished"] < len(rows)  # both kinds of rows were checked


def test_rerun_skips_existing_and_repairs_a_truncated_last_line(tiny_llama, tmp_path):
    model, tokenizer = tiny_llama
    out = tmp_path / "regen.jsonl"
    regenerate(model, tokenizer, _prompts(3), out, batch_size=2, max_new_tokens=4)
    complete = _rows(out)
    # Simulate a kill mid-write: half of a fourth line without its newline.
    with out.open("a") as fh:
        fh.write(json.dumps({**complete[0], "id": "p3"})[:20])
    assert read_existing(out) == {"p0", "p1", "p2"}
    assert out.read_text().endswith("\n")  # the partial tail was cut off

    summary = regenerate(model, tokenizer, _prompts(5), out, batch_size=2, max_new_tokens=4)
    assert (summary["written"], summary["skipped_existing"]) == (2, 3)
    rows = _rows(out)
    assert [r["id"] for r in rows] == ["p0", "p1", "p2", "p3", "p4"]
    assert rows[:3] == complete
    # Same answers as a fresh run: resuming does not change the data.
    fresh = tmp_path / "fresh.jsonl"
    regenerate(model, tokenizer, _prompts(5), fresh, batch_size=2, max_new_tokens=4)
    assert _rows(fresh) == rows


def test_too_long_prompts_and_limit_are_counted(tiny_llama, tmp_path):
    model, tokenizer = tiny_llama
    prompts = _prompts(4)
    prompts.records.append(PromptRecord(id="long", turns=["w1 " * 50]))
    prompts.records.append(PromptRecord(id="p0", turns=["duplicate id"]))
    summary = regenerate(model, tokenizer, prompts, tmp_path / "o.jsonl", max_new_tokens=2, max_prompt_tokens=20)
    assert (summary["written"], summary["skipped_too_long"], summary["skipped_existing"]) == (4, 1, 1)
    summary = regenerate(model, tokenizer, _prompts(4), tmp_path / "l.jsonl", max_new_tokens=2, limit=2)
    assert summary["written"] == 2


def test_min_prompt_tokens_adds_the_long_prompts_a_capped_run_left_out(tiny_llama, tmp_path):
    """A run capped at --max-prompt-tokens, then one with --min-prompt-tokens just above that cap: the second
    answers only what the first left out, and the two together hold one answer per prompt."""
    model, tokenizer = tiny_llama
    prompts = _prompts(3)
    prompts.records += [PromptRecord(id=f"long{i}", turns=["w1 " * (30 + i)]) for i in range(2)]
    out = tmp_path / "o.jsonl"
    short = regenerate(model, tokenizer, prompts, out, max_new_tokens=2, max_prompt_tokens=20)
    assert (short["written"], short["skipped_too_long"]) == (3, 2)
    long = regenerate(model, tokenizer, prompts, out, max_new_tokens=2, max_prompt_tokens=200, min_prompt_tokens=21)
    assert (long["written"], long["skipped_existing"], long["skipped_too_short"]) == (2, 3, 0)
    fresh = regenerate(model, tokenizer, prompts, tmp_path / "f.jsonl", max_new_tokens=2, max_prompt_tokens=200,
                       min_prompt_tokens=21)
    assert (fresh["written"], fresh["skipped_too_short"]) == (2, 3)
    assert sorted(r["id"] for r in _rows(out)) == ["long0", "long1", "p0", "p1", "p2"]
    with pytest.raises(ValueError, match="--min_prompt_tokens 30 is over --max_prompt_tokens 20"):
        regenerate(model, tokenizer, prompts, tmp_path / "bad" / "x.jsonl", max_prompt_tokens=20, min_prompt_tokens=30)
    assert not (tmp_path / "bad").exists()  # refused before anything was written


@pytest.mark.parametrize("decoder", regen.DECODERS)
def test_batched_left_padded_greedy_equals_unbatched(tiny_llama, decoder):
    model, tokenizer = tiny_llama
    prompt_ids = [chat_input_ids(tokenizer, r.turns) for r in _prompts(5).records]
    assert len({len(ids) for ids in prompt_ids}) > 1
    kwargs = dict(max_new_tokens=8, decoder=decoder)
    pad, eos = tokenizer.pad_token_id, [tokenizer.eos_token_id]
    batched = generate_batch(model, prompt_ids, pad, eos, **kwargs)
    single = [generate_batch(model, [ids], pad, eos, **kwargs)[0] for ids in prompt_ids]
    assert batched == single


def test_sampling_is_seeded(tiny_llama, tmp_path):
    model, tokenizer = tiny_llama
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for path in (a, b):
        regenerate(model, tokenizer, _prompts(3), path, max_new_tokens=5, temperature=1.5, seed=3)
    assert _rows(a) == _rows(b)


def test_cli_help_and_run(tiny_llama, tmp_path, monkeypatch, capsys):
    parser = argparse.ArgumentParser(prog="domino")
    regen_cli.register(parser.add_subparsers())
    with pytest.raises(SystemExit):
        parser.parse_args(["regen", "--help"])
    help_text = capsys.readouterr().out
    for flag in ("--target", "--prompts", "--out", "--batch_size", "--max_new_tokens", "--max_prompt_tokens",
                 "--temperature", "--limit", "--dtype"):
        assert flag in help_text

    prompts_file = tmp_path / "p.jsonl"
    prompts_file.write_text("".join(json.dumps({"id": r.id, "prompt": r.turns[0]}) + "\n"
                                    for r in _prompts(3).records) + "{broken\n")
    monkeypatch.setattr("domino_hf.targets.load_target", lambda name, dtype, device, **hub_options: tiny_llama)
    out = tmp_path / "o.jsonl"
    args = parser.parse_args(["regen", "--prompts", str(prompts_file), "--out", str(out), "--max-new-tokens", "3",
                              "--device", "cpu"])
    assert args.func(args) == 0
    assert [r["id"] for r in _rows(out)] == ["p0", "p1", "p2"]


@pytest.mark.parametrize("native_bf16", [True, False])
def test_cli_dtype_auto_follows_the_cpu(native_bf16, tiny_llama, tmp_path, monkeypatch):
    """`--dtype auto` loads the target in bf16 only where bf16 is fast (an AVX2-only CPU emulates it, ~60x
    slower than fp32); whatever it picks, the answers are written."""
    import domino_hf.dtypes as dtypes

    monkeypatch.setattr(dtypes, "cpu_has_native_bf16", lambda: native_bf16)
    loaded = []
    monkeypatch.setattr("domino_hf.targets.load_target",
                        lambda name, dtype, device, **kw: loaded.append(dtype) or tiny_llama)
    parser = argparse.ArgumentParser(prog="domino")
    regen_cli.register(parser.add_subparsers())
    prompts_file = tmp_path / "p.jsonl"
    prompts_file.write_text(json.dumps({"id": "p0", "prompt": "hello"}) + "\n")
    args = parser.parse_args(["regen", "--prompts", str(prompts_file), "--out", str(tmp_path / "o.jsonl"),
                              "--max-new-tokens", "2", "--device", "cpu", "--dtype", "auto"])
    assert args.func(args) == 0
    assert loaded == [torch.bfloat16 if native_bf16 else torch.float32]
    assert len(_rows(tmp_path / "o.jsonl")) == 1


def test_cli_bad_source_is_a_clean_error(tmp_path, caplog):
    parser = argparse.ArgumentParser(prog="domino")
    regen_cli.register(parser.add_subparsers())
    args = parser.parse_args(["regen", "--prompts", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o")])
    assert args.func(args) == 2
    assert "neither a file nor" in caplog.text


def test_stop_strings_end_answers_and_count_as_finished(tiny_llama, tmp_path):
    model, tokenizer = tiny_llama
    prompts = _prompts(4)
    regenerate(model, tokenizer, prompts, tmp_path / "a.jsonl", max_new_tokens=8)
    rows = _rows(tmp_path / "a.jsonl")
    stop = tokenizer.decode(rows[0]["response_ids"][2:4])  # text the first answer reaches by its 4th token
    regenerate(model, tokenizer, prompts, tmp_path / "b.jsonl", max_new_tokens=8, stop=[stop])
    for full, cut in zip(rows, _rows(tmp_path / "b.jsonl")):
        ids = full["response_ids"]
        end = next((k for k in range(1, len(ids) + 1) if stop in tokenizer.decode(ids[:k])), None)
        if end is None:  # the stop text never comes: the answer is unchanged
            assert cut["response_ids"] == ids and cut["finished"] == full["finished"]
        else:  # cut right after the token that completes the stop text
            assert cut["response_ids"] == ids[:end] and cut["finished"]
    assert len(_rows(tmp_path / "b.jsonl")[0]["response_ids"]) <= 4


def test_length_batches_sort_within_windows_and_keep_every_prompt():
    """Each window of `window` batches is sorted by prompt length (less left padding per batch); windows keep
    the source's order, every prompt comes out exactly once, and the batching is the same on a rerun."""
    from types import SimpleNamespace

    lengths = [7, 1, 30, 4, 4, 12, 2, 9, 25, 3, 6, 18, 5]
    todo = [SimpleNamespace(id=i, prompt_ids=[0] * n) for i, n in enumerate(lengths)]
    batches = list(regen.length_batches(todo, batch_size=3, window=2))
    assert [len(b) for b in batches] == [3, 3, 3, 3, 1]
    assert [[len(item.prompt_ids) for item in b] for b in batches[:2]] == [[1, 4, 4], [7, 12, 30]]
    assert [[len(item.prompt_ids) for item in b] for b in batches[2:4]] == [[2, 3, 6], [9, 18, 25]]
    assert sorted(item.id for b in batches for item in b) == list(range(len(lengths)))
    assert [item.id for b in batches for item in b] == [
        item.id for b in regen.length_batches(todo, batch_size=3, window=2) for item in b]


# ------------------------------------------------------------------------------------------- --draft
@pytest.fixture
def tiny_draft(tiny_llama):
    """A random Domino draft for `tiny_llama`, its suffix cache on: a second pass over the same prompts drafts
    whole spans from the first pass's answers, so rows accept different numbers of tokens per step."""
    from conftest import make_tiny_draft

    draft = make_tiny_draft(tiny_llama[0])
    draft.generation_config.use_suffix_cache = True
    return draft


@pytest.mark.parametrize("stop", [False, True])
def test_draft_gives_the_answers_of_plain_decoding(tiny_llama, tiny_draft, tmp_path, stop, caplog, monkeypatch):
    """`regenerate(draft=...)`: every batch through `generate(assistant_model=draft)` (batches of 4, 4 and 1 over
    prompts of different lengths; some answers end at EOS, some at a stop text, some at the length limit) writes
    exactly the rows of the default decoder, on a first pass and on a second one that drafts from the suffix cache;
    the summary and the log carry the draft's τ."""
    import logging

    model, tokenizer = tiny_llama
    prompts = _prompts(9)
    _eos_from_output(model, tokenizer, prompts)
    stops = None
    if stop:
        regenerate(model, tokenizer, prompts, tmp_path / "full.jsonl", batch_size=4, max_new_tokens=10)
        stops = [tokenizer.decode(_rows(tmp_path / "full.jsonl")[1]["response_ids"][1:3])]
        assert stops[0]
    plain = regenerate(model, tokenizer, prompts, tmp_path / "plain.jsonl", batch_size=4, max_new_tokens=10,
                       stop=stops)
    assert "tau" not in plain
    batches = []
    generate = model.generate
    monkeypatch.setattr(model, "generate", lambda **kw: batches.append(len(kw["input_ids"])) or generate(**kw))
    passes = []
    for name in ("first", "second"):
        with caplog.at_level(logging.INFO, logger="domino_hf"):
            caplog.clear()
            passes.append(regenerate(model, tokenizer, prompts, tmp_path / f"{name}.jsonl", batch_size=4,
                                     max_new_tokens=10, stop=stops, draft=tiny_draft))
        assert _rows(tmp_path / f"{name}.jsonl") == _rows(tmp_path / "plain.jsonl")
        assert "the draft's tau" in caplog.text
    rows = _rows(tmp_path / "plain.jsonl")
    assert 0 < sum(r["finished"] for r in rows) < len(rows)  # answers that end and answers cut at the limit
    if stop:  # and answers that end at the stop text
        assert any(len(r["response_ids"]) < len(full["response_ids"]) and r["finished"]
                   for r, full in zip(rows, _rows(tmp_path / "full.jsonl")))
    first, second = passes
    assert first["verify_steps"] > 0 and first["tau"] >= 1.0
    assert second["tau"] > first["tau"]  # the suffix cache of the first pass was drafted from, and accepted
    assert batches == [4, 4, 1] * 2


def test_draft_run_resumes(tiny_llama, tiny_draft, tmp_path):
    """A run with the draft resumes a file (here one written without it) and ends with the rows of a fresh run."""
    model, tokenizer = tiny_llama
    out = tmp_path / "regen.jsonl"
    regenerate(model, tokenizer, _prompts(3), out, batch_size=2, max_new_tokens=6)
    summary = regenerate(model, tokenizer, _prompts(7), out, batch_size=3, max_new_tokens=6, draft=tiny_draft)
    assert (summary["written"], summary["skipped_existing"]) == (4, 3)
    fresh = tmp_path / "fresh.jsonl"
    regenerate(model, tokenizer, _prompts(7), fresh, batch_size=3, max_new_tokens=6)
    assert sorted(_rows(out), key=lambda r: r["id"]) == sorted(_rows(fresh), key=lambda r: r["id"])


def test_a_draft_needs_the_generate_decoder(tiny_llama, tiny_draft):
    model, tokenizer = tiny_llama
    with pytest.raises(ValueError, match="decoder='generate'"):
        generate_batch(model, [[5, 6]], tokenizer.pad_token_id, [tokenizer.eos_token_id], 2, draft=tiny_draft)


def test_cli_draft(tiny_llama, tiny_draft, tmp_path, monkeypatch, caplog):
    """`domino regen --draft FOLDER`: the draft loads in the target's dtype, drafts every batch, the answers are
    those without it and the log says its τ; with --endpoint or --responses source, or built for another target, it
    is refused before anything is written."""
    import logging

    parser = argparse.ArgumentParser(prog="domino")
    regen_cli.register(parser.add_subparsers())
    tiny_draft.save_pretrained(tmp_path / "draft")
    prompts_file = tmp_path / "p.jsonl"
    prompts_file.write_text("".join(json.dumps({"id": r.id, "prompt": r.turns[0]}) + "\n"
                                    for r in _prompts(5).records))
    monkeypatch.setattr("domino_hf.targets.load_target", lambda name, dtype, device, **hub_options: tiny_llama)
    common = ["regen", "--prompts", str(prompts_file), "--max-new-tokens", "6", "--device", "cpu", "--batch-size", "3"]
    args = parser.parse_args([*common, "--out", str(tmp_path / "plain.jsonl")])
    assert args.func(args) == 0
    args = parser.parse_args([*common, "--out", str(tmp_path / "draft.jsonl"), "--draft", str(tmp_path / "draft")])
    assert args.draft == str(tmp_path / "draft")
    with caplog.at_level(logging.INFO, logger="domino_hf"):
        assert args.func(args) == 0
    assert _rows(tmp_path / "draft.jsonl") == _rows(tmp_path / "plain.jsonl")
    assert "the draft's tau" in caplog.text and "drafting with" in caplog.text
    for extra in (["--endpoint", "http://127.0.0.1:9/v1"], ["--responses", "source"]):
        caplog.clear()
        args = parser.parse_args([*common, "--out", str(tmp_path / "x.jsonl"), "--draft", "d", *extra])
        assert args.func(args) == 2
        assert f"--draft drafts for the target generating here, not with {extra[0]}" in caplog.text
    assert not (tmp_path / "x.jsonl").exists()
    from conftest import make_tiny_draft, make_tiny_target

    make_tiny_draft(make_tiny_target(vocab_size=16)).save_pretrained(tmp_path / "other")  # another target's draft
    caplog.clear()
    args = parser.parse_args([*common, "--out", str(tmp_path / "x.jsonl"), "--draft", str(tmp_path / "other")])
    assert args.func(args) == 2
    assert "does not fit the target" in caplog.text and not (tmp_path / "x.jsonl").exists()
