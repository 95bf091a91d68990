"""The shrinking batch decoder of `domino regen`: the same answers as `generate`, greedy (several
architectures, early EOS, stop texts), the target's distribution when sampling, and the fallback to `generate`
when the generation config asks for logits processors."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import make_tiny_target
from scipy.stats import chisquare

from domino_hf.data import PromptRecord, PromptSet
from domino_hf.training.batch_decode import decode_shrinking, needs_generate
from domino_hf.training.regen import generate_batch, regenerate

VOCAB = 16


def _prompt_ids(count: int = 6) -> list[list[int]]:
    gen = torch.Generator().manual_seed(5)
    return [torch.randint(0, VOCAB, (3 + 2 * i,), generator=gen).tolist() for i in range(count)]


def _early_eos(model, prompt_ids) -> list[int]:
    """An EOS id that ends some greedy answers early and not others (a token some answers emit)."""
    answers = generate_batch(model, prompt_ids, 0, [VOCAB + 99], max_new_tokens=10, decoder="generate")
    for token in range(VOCAB):
        ends = [row.index(token) if token in row else None for row, _ in answers]
        if any(end is None for end in ends) and any(end is not None and end < 6 for end in ends):
            return [token]
    raise AssertionError("no token ends some answers early")  # pragma: no cover - seed-dependent


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral", "gemma3"])
def test_greedy_equals_generate(arch):
    model = make_tiny_target(arch, vocab_size=VOCAB)
    prompt_ids = _prompt_ids()
    eos = _early_eos(model, prompt_ids)
    shrinking = generate_batch(model, prompt_ids, 0, eos, max_new_tokens=12, decoder="shrinking")
    reference = generate_batch(model, prompt_ids, 0, eos, max_new_tokens=12, decoder="generate")
    assert shrinking == reference
    assert {finished for _, finished in shrinking} == {True, False}  # rows really were dropped mid-batch


def test_stop_texts_equal_generate(tiny_llama):
    model, tokenizer = tiny_llama
    prompt_ids = [tokenizer(f"w{i} w{2 * i} w{i + 3}")["input_ids"] for i in range(5)]
    plain = generate_batch(model, prompt_ids, tokenizer.pad_token_id, [tokenizer.eos_token_id], 10,
                           tokenizer=tokenizer)
    stop = [tokenizer.decode(plain[0][0][3:5])]  # a text the first answer writes mid-way
    kwargs = dict(max_new_tokens=10, stop=stop, tokenizer=tokenizer)
    shrinking = generate_batch(model, prompt_ids, tokenizer.pad_token_id, [tokenizer.eos_token_id], **kwargs)
    reference = generate_batch(model, prompt_ids, tokenizer.pad_token_id, [tokenizer.eos_token_id],
                               decoder="generate", **kwargs)
    assert shrinking == reference
    assert shrinking[0][1] and stop[0] in tokenizer.decode(shrinking[0][0])


def _logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1].double()


def _assert_follows(tokens: list[int], probs: torch.Tensor) -> None:
    """Chi square of sampled `tokens` against `probs`, over the tokens expected at least 5 times."""
    observed = torch.bincount(torch.tensor(tokens), minlength=VOCAB).double()
    expected = probs * len(tokens)
    keep = expected >= 5
    observed, expected = observed[keep], expected[keep]
    assert chisquare(observed, expected * observed.sum() / expected.sum()).pvalue > 1e-3


def test_sampling_follows_the_target_after_rows_are_dropped():
    """Sample 2 tokens for 3,000 rows of each of two prompts, interleaved, with an EOS that ends some answers
    after one token, so the batch shrinks between the steps. The first token and the second (given the
    likeliest first) must follow the target's tempered distribution for the row's own prompt (chi square); the
    negative control, the other prompt's distribution, must be rejected."""
    model = make_tiny_target("qwen2", vocab_size=VOCAB, initializer_range=0.15)
    prompts, temperature, rows = ([3, 1, 4, 1, 5], [2, 7, 1, 8, 2]), 1.3, 3000
    first_probs = [torch.softmax(_logits(model, prompt) / temperature, -1) for prompt in prompts]
    eos = int(torch.argsort(first_probs[0])[-2])  # a likely first token, not the likeliest
    torch.manual_seed(0)
    batch = torch.tensor(list(prompts) * rows)
    answers = decode_shrinking(model, batch, torch.ones_like(batch), 2, [eos], temperature=temperature)
    assert all(finished == (eos in row) and len(row) == (1 if row[0] == eos else 2) for row, finished in answers)
    assert 0.05 < sum(row[0] == eos for row, _ in answers) / len(answers) < 0.9  # the batch did shrink

    for which, prompt in enumerate(prompts):
        mine = [row for row, _ in answers[which::2]]
        _assert_follows([row[0] for row in mine], first_probs[which])
        with pytest.raises(AssertionError):  # negative control: the other prompt's distribution
            _assert_follows([row[0] for row in mine], first_probs[1 - which])
        head = next(int(t) for t in torch.argsort(first_probs[which], descending=True) if int(t) != eos)
        second_probs = torch.softmax(_logits(model, prompt + [head]) / temperature, -1)
        _assert_follows([row[1] for row in mine if row[0] == head], second_probs)


def test_processors_in_the_generation_config_fall_back_to_generate(tiny_llama, tmp_path):
    model, tokenizer = tiny_llama
    assert needs_generate(model.generation_config) == []
    model.generation_config.repetition_penalty = 3.0
    assert needs_generate(model.generation_config) == ["repetition_penalty"]
    records = [PromptRecord(id=f"p{i}", turns=[f"w{i} w{i + 1}"]) for i in range(3)]
    regenerate(model, tokenizer, PromptSet(records, 0, "test"), tmp_path / "o.jsonl", max_new_tokens=8)
    written = [json.loads(line)["response_ids"] for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    prompt_ids = [json.loads(line)["prompt_ids"] for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    pad, eos = tokenizer.pad_token_id, [tokenizer.eos_token_id]
    penalised = [generate_batch(model, [ids], pad, eos, 8, decoder="generate")[0][0] for ids in prompt_ids]
    plain = [generate_batch(model, [ids], pad, eos, 8)[0][0] for ids in prompt_ids]
    assert written == penalised and penalised != plain  # the penalty was applied, so generate decoded


def test_unknown_decoder_is_a_clear_error(tiny_llama):
    model, tokenizer = tiny_llama
    with pytest.raises(ValueError, match="decoder must be one of"):
        generate_batch(model, [[1, 2]], 0, [1], 2, decoder="fast")
