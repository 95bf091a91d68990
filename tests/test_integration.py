"""Integration: the real offline target (SmolLM2-135M-Instruct) with the shipped draft, as a user runs it."""

import pytest
import torch
from transformers import AutoModel

from domino_hf.data import chat_input_ids, read_prompts
from domino_hf.targets import load_target
from domino_hf.utils import project_root

SHIPPED = project_root() / "drafts" / "smollm2-135m-instruct-domino"

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def target_and_draft():
    target, tokenizer = load_target("smollm2")
    draft = AutoModel.from_pretrained(SHIPPED, trust_remote_code=True, dtype=torch.float32).eval()
    return target, tokenizer, draft


def prompts(tokenizer, source, count):
    return [torch.tensor([chat_input_ids(tokenizer, r.turns[:1])]) for r in read_prompts(source, limit=count).records]


def test_shipped_draft_fits_and_is_small():
    files = {p.name: p.stat().st_size for p in SHIPPED.iterdir()}
    assert {"config.json", "model.safetensors", "README.md", "modeling_domino.py"} <= set(files)
    assert sum(files.values()) <= 30 * 2**20


@pytest.mark.parametrize("source", ["humaneval", "mt_bench"])
def test_greedy_identity_on_the_real_model(target_and_draft, source):
    target, tokenizer, draft = target_and_draft
    accepted = steps = 0
    for input_ids in prompts(tokenizer, source, 2):
        expected = target.generate(input_ids, max_new_tokens=40, do_sample=False)
        output = target.generate(input_ids, max_new_tokens=40, do_sample=False, assistant_model=draft)
        assert output.tolist() == expected.tolist()
        accepted += sum(draft.last_generation_stats.accepted)
        steps += draft.last_generation_stats.num_steps
    assert accepted > 0 and steps > 0  # the trained draft really gets tokens accepted


def test_batched_greedy_identity_on_the_real_model(target_and_draft):
    """Four prompts of different lengths in one left-padded batch: every row as plain batched decoding gives it."""
    target, tokenizer, draft = target_and_draft
    rows = [ids[0].tolist() for source in ("humaneval", "mt_bench") for ids in prompts(tokenizer, source, 2)]
    width = max(map(len, rows))
    input_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(r)) + r for r in rows])
    attention_mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    expected = target.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=40, do_sample=False)
    output = target.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=40, do_sample=False,
                             assistant_model=draft)
    assert output.tolist() == expected.tolist()
    stats = draft.last_generation_stats
    assert len(stats.per_row) == 4 and sum(stats.accepted) > 0


def test_sampling_on_the_real_model_accepts_and_stays_in_vocabulary(target_and_draft):
    target, tokenizer, draft = target_and_draft
    torch.manual_seed(0)
    input_ids = prompts(tokenizer, "alpaca", 1)[0]
    output = target.generate(
        input_ids, max_new_tokens=32, do_sample=True, temperature=0.7, top_p=0.9, assistant_model=draft,
    )
    assert output.shape[1] > input_ids.shape[1] and int(output.max()) < target.config.vocab_size
    assert draft.last_generation_stats.num_steps > 0
