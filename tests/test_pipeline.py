"""🤗 pipelines take a Domino draft both ways, at construction and per call, and stay greedy-identical."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import assert_drafted, make_tiny_draft
from transformers import pipeline

pytestmark = pytest.mark.usefixtures("single_thread")

PROMPT = "w3 w7 w1 w9 w4"
GREEDY = dict(max_new_tokens=16, do_sample=False, return_full_text=False)


@pytest.fixture(scope="module")
def setup():
    from conftest import make_tiny_llama, make_tiny_tokenizer

    tokenizer = make_tiny_tokenizer()
    target = make_tiny_llama(tokenizer)
    draft = make_tiny_draft(target)
    reference = pipeline("text-generation", model=target, tokenizer=tokenizer)(PROMPT, **GREEDY)
    return target, tokenizer, draft, reference


def test_draft_shares_the_target_token_ids(setup):
    """What `load_assistant_model` compares to decide the two models share a tokenizer."""
    target, _, draft, _ = setup
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        assert getattr(draft.config, key) == getattr(target.config, key) is not None


def test_assistant_at_construction(setup):
    target, tokenizer, draft, reference = setup
    pipe = pipeline("text-generation", model=target, tokenizer=tokenizer, assistant_model=draft)
    assert pipe.assistant_model is draft and pipe.assistant_tokenizer is None
    draft.last_generation_stats = None
    assert pipe(PROMPT, **GREEDY) == reference
    assert_drafted(draft.last_generation_stats)  # the draft really drafted


def test_assistant_per_call(setup):
    target, tokenizer, draft, reference = setup
    pipe = pipeline("text-generation", model=target, tokenizer=tokenizer)
    draft.last_generation_stats = None
    assert pipe(PROMPT, assistant_model=draft, **GREEDY) == reference
    assert_drafted(draft.last_generation_stats)


def test_suffix_cache_keywords_reach_generate(setup):
    """`use_suffix_cache` and a per-call `suffix_cache` pass through the pipeline to the draft's generator."""
    from domino_hf import SuffixCache

    target, tokenizer, draft, reference = setup
    pipe = pipeline("text-generation", model=target, tokenizer=tokenizer)
    store = SuffixCache(max_tokens=1000)
    for _ in range(2):
        assert pipe(PROMPT, assistant_model=draft, use_suffix_cache=True, suffix_cache=store, **GREEDY) == reference
    assert store.num_sequences_added == 2 and "cache" in draft.last_generation_stats.sources



def test_seeded_sampling_through_the_pipeline_repeats_itself(setup):
    """A sampling pipeline (here the target's generation config says `do_sample`): with the shipped drafting
    defaults the same seed gives the same text call after call, though the draft keeps a suffix cache of earlier
    calls (a sampling call neither reads nor fills it unless asked)."""
    target, tokenizer, draft, _ = setup
    target, draft = copy.deepcopy(target), copy.deepcopy(draft)
    del draft.generation_config.use_suffix_cache  # the shipped default
    target.generation_config.do_sample = True
    pipe = pipeline("text-generation", model=target, tokenizer=tokenizer, assistant_model=draft)
    texts = []
    for seed in (0, 0, 0, 1):
        torch.manual_seed(seed)
        texts.append(pipe(PROMPT, max_new_tokens=16, return_full_text=False))
        assert_drafted(draft.last_generation_stats)
    assert texts[0] == texts[1] == texts[2] != texts[3]  # it samples, and repeats itself under one seed


def test_the_pipeline_samples_unless_told_do_sample_false(setup):
    """What the README's pipeline lines rest on: the text-generation pipeline samples when neither the call nor the
    target's generation config sets `do_sample` (transformers 5.25 adds `do_sample=True, temperature=0.7`), so a
    Domino pipeline call gives the greedy text, that of the pipeline without the draft, with `do_sample=False`."""
    from transformers import TextGenerationPipeline

    defaults = getattr(TextGenerationPipeline, "_default_generation_config", None)
    if defaults is None or not defaults.do_sample:
        pytest.skip("this transformers' text-generation pipeline does not sample by default")
    target, tokenizer, draft, reference = setup
    assert "do_sample" not in target.generation_config.to_diff_dict()
    pipe = pipeline("text-generation", model=target, tokenizer=tokenizer, assistant_model=draft)
    texts = set()
    for seed in range(3):
        torch.manual_seed(seed)
        texts.add(pipe(PROMPT, max_new_tokens=16, return_full_text=False)[0]["generated_text"])
    assert len(texts) > 1  # it samples
    assert pipe(PROMPT, **GREEDY) == reference


PROMPTS = ["w3 w7 w1 w9 w4", "w5", "w8 w2 w11", "w1 w2 w3 w4 w5 w6 w7 w8", "w40 w41", "w12 w60 w33 w2"]


@pytest.mark.parametrize("batch_size", [2, 3, 4])
def test_batch_size_batches_with_the_draft(setup, batch_size, monkeypatch):
    """`pipeline(..., assistant_model=draft, batch_size=N)` over prompts of different lengths: the pipeline pads each
    batch on the left (it switches a right-padding tokenizer to left padding itself) and generates it in one
    `generate` call, which the draft's batched verify loop serves; the texts are those of the pipeline without the
    draft at that batch size, on a first pass and on a second that drafts whole spans from the first's answers."""
    target, tokenizer, draft, _ = setup
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.padding_side = "right"
    draft = copy.deepcopy(draft)
    draft.generation_config.use_suffix_cache = True
    reference = pipeline("text-generation", model=target, tokenizer=tokenizer, batch_size=batch_size)(PROMPTS, **GREEDY)
    pipe = pipeline("text-generation", model=target, tokenizer=tokenizer, assistant_model=draft, batch_size=batch_size)
    assert tokenizer.padding_side == "left"
    calls = []
    generate = target.generate

    def spy(**kwargs):
        output = generate(**kwargs)
        calls.append((kwargs["input_ids"].shape[0], kwargs.get("assistant_model") is draft,
                      draft.last_generation_stats))
        return output

    monkeypatch.setattr(target, "generate", spy)
    for _ in range(2):
        assert pipe(PROMPTS, **GREEDY) == reference
    sizes = [min(batch_size, len(PROMPTS) - first) for first in range(0, len(PROMPTS), batch_size)]
    assert [(rows, drafted) for rows, drafted, _ in calls] == [(rows, True) for rows in sizes * 2]
    assert all(len(stats.per_row) == rows for rows, _, stats in calls if rows > 1)  # one record per row
    first, second = ([s for _, _, stats in half for s in stats.accepted] for half in (calls[:len(sizes)],
                                                                                       calls[len(sizes):]))
    assert sum(second) > sum(first)  # the second pass accepted the first pass's answers from the suffix cache
