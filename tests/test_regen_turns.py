"""`domino regen --turns all`: later turns answered after the target's own answers, turn-major, resumable."""

from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

import pytest
import torch

from domino_hf.data import chat_input_ids, read_prompts
from domino_hf.training import regen_cli
from domino_hf.training.dataset import AnchorCollator, RegenDataset
from domino_hf.training.regen import regenerate

FIELDS = ["id", "prompt", "response", "prompt_ids", "response_ids", "finished"]
SOURCE_ANSWER = "w89 w88 w87 w86 w85"  # the source's assistant text: never part of a prompt
# (conversation id, user turns) in the tiny tokenizer's words; `c1` is single-turn.
CONVERSATIONS = [
    ("c0", ["w1 w2 w3", "w4 w5", "w6 w7 w8 w9"]),
    ("c1", ["w10 w11"]),
    ("c2", ["w12 w13 w14 w15", "w16"]),
]
TURN_MAJOR = ["c0", "c1", "c2", "c0#t2", "c2#t2", "c0#t3"]


def _write_sharegpt(path, conversations=CONVERSATIONS):
    """A ShareGPT-shaped JSONL: human / gpt turns, with the source's own assistant answers in between."""
    with path.open("w") as handle:
        for cid, users in conversations:
            turns = []
            for user in users:
                turns += [{"from": "human", "value": user}, {"from": "gpt", "value": SOURCE_ANSWER}]
            handle.write(json.dumps({"id": cid, "conversations": turns}) + "\n")
    return read_prompts(str(path))


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _assert_turn_major(ids):
    """Every turn-1 answer before any turn-2 one, and so on (within a turn, batches go by prompt length)."""
    turn = [int(rid.partition("#t")[2] or 1) for rid in ids]
    assert sorted(ids) == sorted(TURN_MAJOR) and turn == sorted(turn)


def _greedy(model, ids, max_new_tokens):
    return model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False)[0, len(ids):].tolist()


def test_later_turns_hold_the_targets_own_answers(tiny_llama, tmp_path):
    model, tokenizer = tiny_llama
    prompts = _write_sharegpt(tmp_path / "sharegpt.jsonl")
    out = tmp_path / "out.jsonl"
    summary = regenerate(model, tokenizer, prompts, out, batch_size=2, max_new_tokens=5, turns="all")
    rows = {row["id"]: row for row in _rows(out)}
    _assert_turn_major(list(rows))
    assert (summary["written"], summary["skipped_too_long"], summary["skipped_no_history"]) == (6, 0, 0)
    turns = dict(CONVERSATIONS)
    for rid, row in rows.items():
        cid, _, number = rid.partition("#t")
        turn = int(number or 1)
        users = turns[cid][:turn]
        assert row["prompt"] == users[-1]
        assert list(row) == FIELDS + (["turn", "earlier_prompts"] if turn > 1 else [])
        if turn > 1:
            assert row["turn"] == turn and row["earlier_prompts"] == users[:-1]
        # The prompt is the chat over the earlier user turns and the stored answers to them; each answer is the
        # target's greedy continuation of its own prompt.
        history = []
        for k, user in enumerate(users[:-1], start=1):
            history += [user, rows[cid if k == 1 else f"{cid}#t{k}"]["response"]]
        assert row["prompt_ids"] == chat_input_ids(tokenizer, [*history, users[-1]])
        assert row["response_ids"] == _greedy(model, row["prompt_ids"], 5)
    first = rows["c0"]
    assert not first["finished"] and len(first["response_ids"]) == 5  # cut at max_new_tokens, still history
    # The target's turn-1 tokens sit inside the turn-2 prompt; the source's assistant text is nowhere.
    prompt2, answer1 = rows["c0#t2"]["prompt_ids"], first["response_ids"]
    assert any(prompt2[i : i + len(answer1)] == answer1 for i in range(len(prompt2)))
    assert SOURCE_ANSWER not in tokenizer.decode(rows["c0#t3"]["prompt_ids"])


def test_turns_first_is_unchanged_and_all_extends_it(tiny_llama, tmp_path):
    """`first` writes turn 1 only; `all` on the same output reuses those rows as history (an edited answer
    shows up in the turn-2 prompt: it is never regenerated) and its turn-1 rows are byte-identical."""
    model, tokenizer = tiny_llama
    prompts = _write_sharegpt(tmp_path / "sharegpt.jsonl")
    first, full = tmp_path / "first.jsonl", tmp_path / "all.jsonl"
    regenerate(model, tokenizer, prompts, first, batch_size=2, max_new_tokens=5)
    regenerate(model, tokenizer, prompts, full, batch_size=2, max_new_tokens=5, turns="all")
    assert sorted(row["id"] for row in _rows(first)) == ["c0", "c1", "c2"]
    assert full.read_text().splitlines()[:3] == first.read_text().splitlines()

    edited = [{**row, "response": "w42 w43"} if row["id"] == "c0" else row for row in _rows(first)]
    first.write_text("".join(json.dumps(row) + "\n" for row in edited))
    summary = regenerate(model, tokenizer, prompts, first, batch_size=2, max_new_tokens=5, turns="all")
    assert (summary["written"], summary["skipped_existing"]) == (3, 3)
    rows = {row["id"]: row for row in _rows(first)}
    assert rows["c0#t2"]["prompt_ids"] == chat_input_ids(tokenizer, ["w1 w2 w3", "w42 w43", "w4 w5"])


@pytest.mark.parametrize("keep", [2, 3, 4, 5])  # inside turn 1, at the turn boundary, inside turn 2, before turn 3
def test_resume_after_a_kill_loses_and_duplicates_nothing(tiny_llama, tmp_path, keep):
    model, tokenizer = tiny_llama
    prompts = _write_sharegpt(tmp_path / "sharegpt.jsonl")
    reference = tmp_path / "reference.jsonl"
    regenerate(model, tokenizer, prompts, reference, batch_size=2, max_new_tokens=5, turns="all")
    lines = reference.read_text().splitlines(keepends=True)
    out = tmp_path / "killed.jsonl"
    out.write_text("".join(lines[:keep]) + lines[keep][: len(lines[keep]) // 2])  # a write cut short
    summary = regenerate(model, tokenizer, prompts, out, batch_size=4, max_new_tokens=5, turns="all")
    assert out.read_bytes() == reference.read_bytes()
    assert (summary["written"], summary["skipped_existing"]) == (len(lines) - keep, keep)


def test_a_turn_over_the_prompt_cap_ends_its_conversation(tiny_llama, tmp_path):
    model, tokenizer = tiny_llama
    long_turn = " ".join(f"w{i}" for i in range(20, 50))
    conversations = [("short", ["w1", "w2", "w3"]), ("cut", ["w4", long_turn, "w5"]), ("never", [long_turn, "w6"])]
    prompts = _write_sharegpt(tmp_path / "sharegpt.jsonl", conversations)
    cap = 30
    assert len(chat_input_ids(tokenizer, [long_turn])) > cap  # "never" is over the cap from its first turn
    out = tmp_path / "out.jsonl"
    summary = regenerate(model, tokenizer, prompts, out, max_new_tokens=4, max_prompt_tokens=cap, turns="all")
    rows = _rows(out)
    assert [row["id"] for row in rows] == ["short", "cut", "short#t2", "short#t3"]
    assert all(len(row["prompt_ids"]) <= cap for row in rows)
    assert summary["skipped_too_long"] == 2 + 2  # cut#t2 and cut#t3; never and never#t2
    # Rerun: nothing to do, the same counts (logged once per run).
    again = regenerate(model, tokenizer, prompts, out, max_new_tokens=4, max_prompt_tokens=cap, turns="all")
    assert (again["written"], again["skipped_existing"], again["skipped_too_long"]) == (0, 4, 4)
    first = regenerate(model, tokenizer, prompts, tmp_path / "first.jsonl", max_new_tokens=4, max_prompt_tokens=cap)
    assert (first["written"], first["skipped_too_long"]) == (2, 1)  # `first` counts first turns only, as before


def test_a_later_turn_waits_for_its_history(tiny_llama, tmp_path):
    """An answer row without its text cannot be history: the turn after it is counted, not guessed."""
    model, tokenizer = tiny_llama
    prompts = _write_sharegpt(tmp_path / "sharegpt.jsonl")
    out = tmp_path / "out.jsonl"
    regenerate(model, tokenizer, prompts, out, max_new_tokens=4)
    rows = [{k: v for k, v in row.items() if not (row["id"] == "c2" and k == "response")} for row in _rows(out)]
    out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    summary = regenerate(model, tokenizer, prompts, out, max_new_tokens=4, turns="all")
    assert [row["id"] for row in _rows(out)][3:] == ["c0#t2", "c0#t3"]
    assert summary["skipped_no_history"] == 1


def test_multi_turn_records_train_on_their_response_only(tiny_llama, tmp_path):
    model, tokenizer = tiny_llama
    out = tmp_path / "out.jsonl"
    regenerate(model, tokenizer, _write_sharegpt(tmp_path / "s.jsonl"), out, max_new_tokens=6, turns="all")
    dataset = RegenDataset.from_jsonl(out)
    assert len(dataset) == len(TURN_MAJOR)
    assert [e.earlier_prompts for e in dataset.examples][3:] == [("w1 w2 w3",), ("w12 w13 w14 w15",),
                                                                  ("w1 w2 w3", "w4 w5")]
    config = SimpleNamespace(block_size=4, num_draft_tokens=3, mask_token_id=0, draft_vocab_ids=None,
                             vocab_size=len(tokenizer))
    batch = AnchorCollator(config, num_anchors=16)([dataset[i] for i in range(len(dataset))])
    for row, example in enumerate(dataset.examples):
        used = batch["labels"][row, :, 0] != -100
        anchors = batch["anchors"][row][used].tolist()
        # Every position of the response is an anchor, and none of the prompt (which holds earlier answers).
        assert anchors == list(range(len(example.prompt_ids), len(example.prompt_ids) + len(example.response_ids) - 1))
        seq = example.prompt_ids + example.response_ids
        assert [batch["labels"][row, k, 0].item() for k in range(len(anchors))] == [seq[a + 1] for a in anchors]


def test_cli_turns_all(tiny_llama, tmp_path, monkeypatch, capsys):
    parser = argparse.ArgumentParser(prog="domino")
    regen_cli.register(parser.add_subparsers())
    with pytest.raises(SystemExit):
        parser.parse_args(["regen", "--out", "o", "--turns", "some"])
    assert "invalid choice: 'some'" in capsys.readouterr().err
    _write_sharegpt(tmp_path / "sharegpt.jsonl")
    monkeypatch.setattr("domino_hf.targets.load_target", lambda name, dtype, device, **hub_options: tiny_llama)
    out = tmp_path / "o.jsonl"
    args = parser.parse_args(["regen", "--prompts", str(tmp_path / "sharegpt.jsonl"), "--out", str(out),
                              "--max-new-tokens", "3", "--device", "cpu", "--turns", "all"])
    assert args.func(args) == 0
    _assert_turn_major([row["id"] for row in _rows(out)])
