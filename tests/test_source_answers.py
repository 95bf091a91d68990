"""`domino regen --responses source`: the source's replies as answers, kept apart from the target's, and
trainable only with labels from the target (`--loss kl`)."""

from __future__ import annotations

import argparse
import json
import logging

import pytest
import torch

from domino_hf.data import chat_input_ids, parse_record, read_prompts
from domino_hf.training import regen_cli
from domino_hf.training.dataset import RegenDataset
from domino_hf.training.source_answers import write_source_answers

CONVERSATIONS = [
    {"id": "c0", "conversations": [{"from": "human", "value": "w1 w2 w3"}, {"from": "gpt", "value": "w4 w5 w6 w7 w8"},
                                   {"from": "human", "value": "w9"}, {"from": "gpt", "value": "w10 w11"}]},
    {"id": "c1", "conversations": [{"from": "human", "value": "w12"}]},  # no reply: counted, not written
    {"id": "c2", "messages": [{"role": "system", "content": "w13"}, {"role": "user", "content": "w14 w15"},
                              {"role": "assistant", "content": " ".join(f"w{i}" for i in range(20, 40))}]},
]


def _source_file(tmp_path):
    path = tmp_path / "conversations.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in CONVERSATIONS))
    return path


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _regen_args(*argv):
    parser = argparse.ArgumentParser(prog="domino")
    regen_cli.register(parser.add_subparsers())
    return parser.parse_args(["regen", *argv])


def test_conversation_records_keep_the_sources_replies_beside_the_user_turns():
    record = parse_record(CONVERSATIONS[0], "1")
    assert record.turns == ["w1 w2 w3", "w9"] and record.meta["replies"] == ["w4 w5 w6 w7 w8", "w10 w11"]
    assert "replies" not in parse_record(CONVERSATIONS[1], "2").meta
    assert parse_record(CONVERSATIONS[2], "3").meta["system"] == "w13"


def test_source_answers_are_written_cut_marked_and_resumable(tiny_tokenizer, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr("domino_hf.targets.load_target_tokenizer", lambda name, **hub: (tiny_tokenizer, None))
    out = tmp_path / "source.jsonl"
    args = _regen_args("--prompts", str(_source_file(tmp_path)), "--out", str(out), "--responses", "source",
                       "--max-new-tokens", "8")
    caplog.set_level(logging.INFO, logger="domino_hf")
    assert args.func(args) == 0
    rows = _rows(out)
    assert [r["id"] for r in rows] == ["c0", "c2"] and all(r["response_from"] == "source" for r in rows)
    assert rows[0]["prompt_ids"] == chat_input_ids(tiny_tokenizer, ["w1 w2 w3"])
    assert rows[0]["response_ids"] == tiny_tokenizer("w4 w5 w6 w7 w8", add_special_tokens=False)["input_ids"]
    assert rows[0]["finished"] and rows[0]["response"] == "w4 w5 w6 w7 w8"
    assert len(rows[1]["response_ids"]) == 8 and not rows[1]["finished"]  # 20 tokens cut to --max-new-tokens
    summary = write_source_answers(tiny_tokenizer, read_prompts(str(_source_file(tmp_path))), tmp_path / "again.jsonl")
    assert summary["written"] == 2 and summary["skipped_no_reply"] == 1  # c1 has no reply
    assert args.func(args) == 0 and len(_rows(out)) == 2  # a rerun resumes: nothing new
    assert "2 existing" in caplog.text and "holds an assistant reply" not in caplog.text  # c1's lack is not news

    caplog.set_level(logging.ERROR, logger="domino_hf")
    many = _regen_args("--prompts", str(_source_file(tmp_path)), "--out", str(tmp_path / "t.jsonl"),
                       "--responses", "source", "--turns", "all")
    assert many.func(many) == 2 and "first turns only" in caplog.text and not (tmp_path / "t.jsonl").exists()


def test_a_source_answer_is_kept_beside_the_targets_answer_to_the_same_prompt(tmp_path):
    row = {"id": "c0", "prompt": "w1", "prompt_ids": [2, 5, 6], "response_ids": [7, 8, 9], "response": "x"}
    target_file, source_file = tmp_path / "t.jsonl", tmp_path / "s.jsonl"
    target_file.write_text(json.dumps(row) + "\n" + json.dumps({**row, "id": "again"}) + "\n")
    source_file.write_text(json.dumps({**row, "response_ids": [9, 9, 9], "response_from": "source"}) + "\n")
    examples = RegenDataset.from_jsonl([target_file, source_file]).examples
    assert [(e.from_source, e.response_ids) for e in examples] == [(False, [7, 8, 9]), (True, [9, 9, 9])]


def test_source_answers_train_on_the_targets_next_token_at_the_first_slot(tiny_llama, tmp_path, monkeypatch):
    """A source-answer record's blocks are labelled with the target's own greedy next token at slot 0 and
    nothing after (the target chose neither the source's next tokens nor, from them, what follows); the label
    is the same from the target's forward and from cached features; target answers keep theirs; the CLI trains."""
    import domino_hf.targets
    from domino_hf.cli import main
    from domino_hf.training.features import FeatureStore, extract_features
    from domino_hf.training.recipe import TrainSettings, build_draft, train_draft

    model, tokenizer = tiny_llama
    monkeypatch.setattr("domino_hf.targets.load_target_tokenizer", lambda name, **hub: (tokenizer, None))
    source = tmp_path / "source.jsonl"
    args = _regen_args("--prompts", str(_source_file(tmp_path)), "--out", str(source), "--responses", "source")
    assert args.func(args) == 0
    answers = tmp_path / "target.jsonl"
    ids = chat_input_ids(tokenizer, ["w50 w51"])
    answers.write_text(json.dumps({"id": "t", "prompt": "w50 w51", "prompt_ids": ids,
                                   "response_ids": list(range(10, 22))}) + "\n")
    dataset = RegenDataset.from_jsonl([answers, source])
    assert [e.from_source for e in dataset.examples] == [False, True, True]

    draft = build_draft(model, tokenizer, num_hidden_layers=1, block_size=4, gru_hidden_dim=8, correction_rank=4)
    trainer = train_draft(model, draft, dataset, TrainSettings(output_dir=str(tmp_path / "run"), max_steps=0,
                                                                num_anchors=4))
    batch = trainer.data_collator([dataset[i] for i in range(3)])
    labels = trainer._target_inputs(batch)[-1]
    with torch.no_grad():
        greedy = model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits.argmax(-1)  # (b, L)
    present = batch["labels"][..., 0] != -100
    assert torch.equal(labels[0], batch["labels"][0])  # the target's own answer: unchanged
    for row in (1, 2):
        expected = greedy[row].gather(0, batch["anchors"][row])
        assert torch.equal(labels[row, present[row], 0], expected[present[row]])
        assert (labels[row, :, 1:] == -100).all() and (labels[row, ~present[row]] == -100).all()

    extract_features(model, dataset, list(draft.config.target_layer_ids), tmp_path / "f", kl_topk=2)
    dataset.use_features(FeatureStore(tmp_path / "f", draft.config.target_layer_ids))
    cached = trainer.data_collator([dataset[i] for i in range(3)])
    assert "target_top1" in cached and torch.equal(trainer._target_inputs(cached)[-1], labels)
    dataset.use_features(FeatureStore(tmp_path / "f", draft.config.target_layer_ids), kl_topk=2)
    assert torch.equal(trainer.data_collator([dataset[i] for i in range(3)])["target_top1"], cached["target_top1"])
    extract_features(model, dataset, list(draft.config.target_layer_ids), tmp_path / "plain")
    with pytest.raises(ValueError, match="--kl_topk"):  # features without the target's top-k cannot label them
        dataset.use_features(FeatureStore(tmp_path / "plain", draft.config.target_layer_ids))

    monkeypatch.setattr(domino_hf.targets, "load_target", lambda *a, **k: (model, tokenizer))
    argv = ["train", "--target", "tiny", "--data", str(answers), str(source), "--num-anchors", "4", "--max-steps",
            "2", "--block-size", "4", "--num-layers", "1", "--save-steps", "100"]
    assert main([*argv, "--out", str(tmp_path / "ce")]) == 0
    assert main([*argv, "--loss", "kl", "--kl-topk", "4", "--out", str(tmp_path / "kl")]) == 0


def test_a_source_without_replies_writes_nothing_and_says_why(tiny_tokenizer, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr("domino_hf.targets.load_target_tokenizer", lambda name, **hub: (tiny_tokenizer, None))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "p", "prompt": "w1 w2"}) + "\n")
    out = tmp_path / "o.jsonl"
    args = _regen_args("--prompts", str(prompts), "--out", str(out), "--responses", "source")
    assert args.func(args) == 0
    assert _rows(out) == [] and "holds an assistant reply" in caplog.text
