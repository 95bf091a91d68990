"""`num_return_sequences` > 1 with sampling and a Domino draft (pass@k): each prompt is repeated as plain sampling
repeats it, the rows go through the batched verify loop, and every row is an exact sample of the target.

transformers refuses `num_return_sequences` > 1 for every assistant model; greedy decoding refuses it with or
without one, and so does a Domino draft, with the same message.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from test_sampling import NEW_TOKENS, PROMPT, P_MIN, chi_square_pvalue, exact_distribution
from transformers import LogitsProcessorList

pytestmark = pytest.mark.usefixtures("single_thread")


def padded_pair(prompts):
    """Two left-padded prompts of lengths 6 and 4, and their mask."""
    ids = torch.zeros(2, 6, dtype=torch.long)
    mask = torch.zeros(2, 6, dtype=torch.long)
    ids[0], mask[0] = prompts[0][0], 1
    ids[1, 2:], mask[1, 2:] = prompts[1][0, :4], 1
    return ids, mask


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("n", [2, 3])
def test_rows_are_each_prompt_repeated_and_sampled_apart(fitted_pair, batch, n):
    target, draft, prompts = fitted_pair("llama")
    ids, mask = padded_pair(prompts)
    ids, mask = ids[:batch], mask[:batch]
    torch.manual_seed(0)
    output = target.generate(ids, attention_mask=mask, do_sample=True, num_return_sequences=n, max_new_tokens=16,
                             assistant_model=draft)
    assert output.shape == (batch * n, ids.shape[1] + 16)
    assert output[:, : ids.shape[1]].tolist() == ids.repeat_interleave(n, dim=0).tolist()
    for row in range(batch):  # a prompt's rows are separate draws
        group = output[row * n : (row + 1) * n, ids.shape[1] :].tolist()
        assert len({tuple(tokens) for tokens in group}) > 1
    stats = draft.last_generation_stats
    assert len(stats.per_row) == batch * n and sum(stats.accepted) > 0
    torch.manual_seed(0)  # seeded: the same rows again
    again = target.generate(ids, attention_mask=mask, do_sample=True, num_return_sequences=n, max_new_tokens=16,
                            assistant_model=draft)
    assert again.tolist() == output.tolist()


def test_rows_are_plain_samplings_rows_when_sampling_is_deterministic(fitted_pair):
    """top_k=1 makes every draw the target's argmax: each row, padding included, equals plain sampling's row."""
    target, draft, prompts = fitted_pair("llama")
    ids, mask = padded_pair(prompts)
    common = dict(attention_mask=mask, do_sample=True, top_k=1, num_return_sequences=2, max_new_tokens=12)
    reference = target.generate(ids, **common)
    assert target.generate(ids, assistant_model=draft, **common).tolist() == reference.tolist()


def test_greedy_with_several_sequences_is_refused_as_plain_greedy_is(fitted_pair):
    target, draft, prompts = fitted_pair("llama")
    errors = []
    for assistant in ({}, {"assistant_model": draft}):
        with pytest.raises(ValueError, match="num_return_sequences") as error:
            target.generate(prompts[0], do_sample=False, num_return_sequences=2, max_new_tokens=4, **assistant)
        errors.append(str(error.value))
    assert errors[0] == errors[1]


def test_a_draft_tree_with_several_sequences_is_refused_by_name(fitted_pair):
    target, draft, prompts = fitted_pair("llama")
    with pytest.raises(ValueError, match="num_return_sequences=2: draft trees.*use_draft_tree=False"):
        target.generate(prompts[0], do_sample=True, num_return_sequences=2, max_new_tokens=4, assistant_model=draft,
                        use_draft_tree=True)


def test_every_row_samples_the_targets_distribution(sampling_pair):
    """Chi-square of the sampled continuations (8 rows per prompt, two copies of the prompt per call) against the
    target's exact distribution (test_sampling's harness), with drafts both accepted and rejected."""
    target, draft = sampling_pair
    torch.manual_seed(4)
    counts, drafted, accepted = Counter(), 0, 0
    for _ in range(50):
        output = target.generate(PROMPT.expand(2, -1), do_sample=True, num_return_sequences=8,
                                 max_new_tokens=NEW_TOKENS, assistant_model=draft)
        counts.update(tuple(row) for row in output[:, PROMPT.shape[1] :].tolist())
        drafted += sum(draft.last_generation_stats.drafted)
        accepted += sum(draft.last_generation_stats.accepted)
    assert sum(counts.values()) == 800 and 0 < accepted < drafted
    assert chi_square_pvalue(counts, exact_distribution(target, LogitsProcessorList())) > P_MIN


def test_a_wrong_q_is_caught(sampling_pair, monkeypatch):
    """Negative control: the batched loop claiming a uniform q for its drafts fails the same check."""
    from domino_hf.modeling.batch_domino import DominoBatchDecoder

    original = DominoBatchDecoder._q_logits
    monkeypatch.setattr(DominoBatchDecoder, "_q_logits", lambda *args: torch.zeros_like(original(*args)))
    with pytest.raises(AssertionError, match="chi_square_pvalue"):
        test_every_row_samples_the_targets_distribution(sampling_pair)
