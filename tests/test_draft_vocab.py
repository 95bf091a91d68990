"""A draft for a target with a large vocabulary gets a sub-vocabulary by default (`recipe.draft_config`, `domino
train`), said in one log line; an explicit `--draft_vocab_size` wins, 0 keeping the whole vocabulary."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from conftest import make_tiny_target
from domino_hf.modeling import DominoDraftModel
from domino_hf.training.choices import BIG_VOCAB, DEFAULT_DRAFT_VOCAB
from domino_hf.training.dataset import RegenDataset
from domino_hf.training.recipe import draft_config

VOCAB = 70_000  # over BIG_VOCAB


@pytest.fixture(scope="module")
def big_target():
    assert VOCAB > BIG_VOCAB
    return make_tiny_target(vocab_size=VOCAB, num_hidden_layers=4)


@pytest.fixture(scope="module")
def wide_data(tmp_path_factory):
    """Responses over 40,000 distinct token ids (more than the default sub-vocabulary), the lower ids more often."""
    path = tmp_path_factory.mktemp("wide") / "d.jsonl"
    with open(path, "w") as handle:
        for i in range(40):
            response = list(range(i * 1000, (i + 1) * 1000)) + list(range(100))
            handle.write(json.dumps({"id": str(i), "prompt_ids": [1, 2, i], "response_ids": response}) + "\n")
    return RegenDataset.from_jsonl(path)


def _vocab_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "vocabulary" in r.getMessage()]


def test_a_large_vocabulary_gets_the_default_sub_vocabulary_in_one_line(big_target, wide_data, caplog):
    caplog.set_level(logging.INFO, logger="domino_hf")
    config = draft_config(big_target, None, wide_data)
    assert config.draft_vocab_size == DEFAULT_DRAFT_VOCAB
    assert set(range(100)) <= set(config.draft_vocab_ids)  # the most frequent tokens are in
    lines = _vocab_lines(caplog)
    assert len(lines) == 1 and not any(r.levelno >= logging.WARNING for r in caplog.records)
    assert f"vocabulary has {VOCAB} tokens" in lines[0] and f"sub-vocabulary of {DEFAULT_DRAFT_VOCAB}" in lines[0]
    assert "--draft_vocab_size N sets another size, 0 the whole vocabulary" in lines[0]


def test_an_explicit_draft_vocab_size_wins(big_target, wide_data, caplog):
    caplog.set_level(logging.INFO, logger="domino_hf")
    assert draft_config(big_target, None, wide_data, draft_vocab_size=500).draft_vocab_size == 500
    whole = draft_config(big_target, None, wide_data, draft_vocab_size=0)
    assert whole.draft_vocab_ids is None and whole.draft_vocab_size == VOCAB
    assert not any("the default above" in line for line in _vocab_lines(caplog))


def test_a_small_vocabulary_keeps_the_whole_vocabulary(wide_data, caplog):
    caplog.set_level(logging.INFO, logger="domino_hf")
    config = draft_config(make_tiny_target(vocab_size=BIG_VOCAB, num_hidden_layers=4), None, wide_data)
    assert config.draft_vocab_ids is None and _vocab_lines(caplog) == []


def test_domino_train_on_a_large_vocabulary_picks_a_sub_vocabulary(big_target, tmp_path, monkeypatch, caplog):
    import domino_hf.targets
    from domino_hf.cli import main

    generator = torch.Generator().manual_seed(0)
    with open(tmp_path / "d.jsonl", "w") as handle:
        for i in range(4):
            prompt = torch.randint(0, VOCAB, (1, 5), generator=generator)
            response = big_target.generate(prompt, max_new_tokens=12, do_sample=False)[0, 5:].tolist()
            handle.write(json.dumps({"id": str(i), "prompt_ids": prompt[0].tolist(), "response_ids": response}) + "\n")
    monkeypatch.setattr(domino_hf.targets, "load_target", lambda *a, **k: (big_target, None))
    caplog.set_level(logging.INFO, logger="domino_hf")
    argv = ["train", "--target", "tiny", "--data", str(tmp_path / "d.jsonl"), "--num_anchors", "4", "--max_steps", "1",
            "--save_steps", "100", "--num_layers", "1", "--block_size", "4"]
    assert main([*argv, "--out", str(tmp_path / "run")]) == 0
    config = DominoDraftModel.from_pretrained(tmp_path / "run" / "final").config
    distinct = len({t for line in open(tmp_path / "d.jsonl") for t in json.loads(line)["response_ids"]})
    assert config.vocab_size == VOCAB and config.draft_vocab_size == distinct  # every token of this small data
    assert len([line for line in _vocab_lines(caplog) if "the default above" in line]) == 1
