"""`target.generate(**batch, assistant_model=draft)` with B ≥ 2 prompts: the batched verify loop must give every row
exactly what plain batched decoding gives it (greedy, fp32), and sample each row from the target's distribution.

Tiny random targets of five architectures; prompts of very different lengths in one left-padded batch; rows that
end at different steps (EOS, stop strings, custom criteria); a row the draft always gets right next to rows it never
does. The proposal length is chosen from measured timings, which the tests pin (`flat_cost`) where they need the
draft's tokens verified every step.
"""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_ARCHS, fit_tiny_draft, make_tiny_draft, make_tiny_target, tiny_prompts
from test_sampling import PROMPT, chi_square_pvalue, exact_distribution, peaked_draft
from transformers import LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

from domino_hf.modeling.batch_domino import DominoBatchDecoder
from domino_hf.modeling.batch_policy_domino import BatchPolicy

pytestmark = pytest.mark.usefixtures("single_thread")

EOS, PAD = 3, 0


@pytest.fixture
def flat_cost(monkeypatch):
    """Every forward costs the same: the loop then verifies each row's whole block every step."""
    monkeypatch.setattr(BatchPolicy, "seconds", lambda self, tokens: 1.0)


def left_pad(rows: list[torch.Tensor], pad: int = PAD) -> tuple[torch.Tensor, torch.Tensor]:
    """(1-D id tensors) -> left-padded (B, L) ids and their attention mask."""
    width = max(len(row) for row in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :] = row
        mask[i, width - len(row) :] = 1
    return ids, mask


def both(target, draft, ids, mask, **kwargs):
    """Plain batched greedy decoding and the same with the draft; asserts identical sequences; returns them."""
    reference = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, **kwargs)
    output = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, assistant_model=draft, **kwargs)
    assert output.shape == reference.shape, (output.shape, reference.shape)
    assert output.tolist() == reference.tolist()
    return output


@pytest.fixture(scope="module")
def fitted():
    """Per architecture: a target (EOS and pad ids set after fitting), a draft fitted to its greedy continuations of
    six 6-token prompts, and the prompts."""
    cache = {}

    def get(arch):
        if arch not in cache:
            target = make_tiny_target(arch)
            draft = make_tiny_draft(target)
            prompts = tiny_prompts(6, length=6)
            fit_tiny_draft(draft, target, prompts)
            cache[arch] = target, draft, prompts
        return cache[arch]

    return get


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_ragged_batch_is_lossless_and_accepts(arch, fitted, flat_cost):
    """Prompts of 1 to 13 tokens, some the draft was fitted on (it is right there), EOS ending some rows early."""
    target, draft, prompts = fitted(arch)
    others = tiny_prompts(3, length=13, seed=7)
    rows = [prompts[0][0], others[0][0, :1], prompts[1][0], others[1][0], others[2][0, :4]]
    ids, mask = left_pad(rows)
    both(target, draft, ids, mask, max_new_tokens=18)
    stats = draft.last_generation_stats
    assert len(stats.per_row) == len(rows) and sum(stats.accepted) > 0
    # the rows the draft was fitted on get more of its blocks accepted than the rows it has never seen
    rate = [sum(a for a, s in zip(r.accepted, r.sources) if s == "domino") / max(r.sources.count("domino"), 1)
            for r in stats.per_row]
    assert min(rate[0], rate[2]) > max(rate[1], rate[3])
    target.generation_config.eos_token_id, target.generation_config.pad_token_id = EOS, PAD
    try:
        output = both(target, draft, ids, mask, max_new_tokens=18)
        ends = [(row[ids.shape[1] :] == EOS).nonzero() for row in output]
        assert any(len(end) for end in ends)  # some rows stopped at EOS before others
    finally:
        target.generation_config.eos_token_id = target.generation_config.pad_token_id = None


def test_untimed_choice_is_lossless(fitted):
    """With the measured cost (no pinning), whatever lengths it picks, rows stay exact."""
    target, draft, prompts = fitted("llama")
    ids, mask = left_pad([p[0] for p in prompts[:4]])
    both(target, draft, ids, mask, max_new_tokens=20)


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_unpadded_prompts_prefill_as_plain_decoding_does(arch, fitted, flat_cost, monkeypatch):
    """Rows without left padding (equal lengths, or one prompt) prefill with the model's own causal mask into a
    `DynamicCache` that the ragged cache takes over; padded rows keep their explicit masks. Both exact."""
    from domino_hf.modeling.ragged_domino import RaggedStates

    adopted = []
    adopt = RaggedStates.adopt
    monkeypatch.setattr(RaggedStates, "adopt", lambda self, k, v: adopted.append(k[0].shape) or adopt(self, k, v))
    target, draft, prompts = fitted(arch)
    ids, mask = left_pad([p[0] for p in prompts[:3]])  # three 6-token prompts
    both(target, draft, ids, mask, max_new_tokens=14)
    assert len(adopted) == 1 and adopted[0][0] == 3 and adopted[0][2] == 6  # (b, h, n, d)
    ids, mask = left_pad([prompts[0][0], prompts[1][0, :4]])
    both(target, draft, ids, mask, max_new_tokens=14)
    assert len(adopted) == 1  # padded: the explicit masks


def test_never_right_rows_beside_always_right(fitted, flat_cost):
    target, draft, prompts = fitted("qwen3")
    strangers = tiny_prompts(3, length=9, seed=11)
    rows = [prompts[2][0], strangers[0][0], prompts[3][0], strangers[1][0]]
    ids, mask = left_pad(rows)
    both(target, draft, ids, mask, max_new_tokens=16)
    per_row = draft.last_generation_stats.per_row
    assert per_row[0].tau > 1.5 and per_row[2].tau > 1.5
    assert per_row[0].num_steps < per_row[1].num_steps


def test_verify_cost_is_kept_across_calls(fitted, monkeypatch):
    """The measured verify cost outlives the call: the next call at a similar context length starts from it (not
    from the fixed prior), a much longer context from a curve of its own."""
    from domino_hf.modeling.cost_domino import VERIFY_COSTS

    target, draft, prompts = fitted("qwen3")
    seen = []
    original = BatchPolicy.__init__

    def capture(self, batch, max_span, cost, *args, **kwargs):
        seen.append((cost, cost.seconds(4)))
        original(self, batch, max_span, cost, *args, **kwargs)

    monkeypatch.setattr(BatchPolicy, "__init__", capture)
    ids, mask = left_pad([prompts[2][0], prompts[3][0, :4]])
    for _ in range(2):
        target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=10, assistant_model=draft)
    (first, _), (second, measured) = seen[-2:]
    assert second is first and measured is not None and measured > 0
    assert VERIFY_COSTS.cost(target, ids.shape[1]) is first
    assert VERIFY_COSTS.cost(target, 4000) is not first


def test_batch_of_one_keeps_the_single_sequence_path(fitted):
    target, draft, prompts = fitted("llama")
    target.generate(prompts[0], do_sample=False, max_new_tokens=8, assistant_model=draft)
    stats = draft.last_generation_stats
    assert stats.per_row == [stats]  # transformers' loop: the call's stats are its one row's
    ids, mask = left_pad([prompts[0][0], prompts[1][0]])
    target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=8, assistant_model=draft)
    assert len(draft.last_generation_stats.per_row) == 2


def test_logits_processors_and_return_dict(fitted, flat_cost):
    target, draft, prompts = fitted("mistral")
    ids, mask = left_pad([prompts[0][0], prompts[4][0, :3]])
    both(target, draft, ids, mask, max_new_tokens=14, repetition_penalty=1.3, no_repeat_ngram_size=2)
    out = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, assistant_model=draft,
                          return_dict_in_generate=True)
    assert out.sequences.shape[0] == 2
    with pytest.raises(ValueError, match="output_scores.*one prompt at a time"):
        target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, assistant_model=draft,
                        return_dict_in_generate=True, output_scores=True)


class StopAfter(StoppingCriteria):
    """Stops a row once it holds `token` after the prompt (per-row answer), or, with `whole_batch`, answers one bool
    for the batch once every row has (lm-eval's stop sequences answer this way, keeping a per-row memory)."""

    def __init__(self, token: int, prompt_width: int, whole_batch: bool = False):
        self.token, self.width, self.whole_batch = token, prompt_width, whole_batch
        self.calls = 0

    def __call__(self, input_ids, scores, **kwargs):
        self.calls += 1
        done = (input_ids[:, self.width :] == self.token).any(dim=1)
        return bool(done.all()) if self.whole_batch else done


@pytest.mark.parametrize("whole_batch", [False, True])
@pytest.mark.parametrize("eos", [True, False])
def test_custom_criteria_stop_rows_as_plain_decoding_does(fitted, flat_cost, whole_batch, eos):
    """A user's criterion is asked about the batch column by column, as plain decoding asks it; rows it stops get
    pad tokens where plain decoding writes them (with an EOS id), else go on until the whole batch stops."""
    target, draft, prompts = fitted("gemma3")
    ids, mask = left_pad([prompts[0][0], prompts[1][0, :2], prompts[5][0]])
    reference = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=16)
    token = int(reference[0, ids.shape[1] + 3])  # a token row 0 produces, so the criterion fires
    if eos:
        target.generation_config.eos_token_id, target.generation_config.pad_token_id = 15, PAD
    try:
        criteria = [StoppingCriteriaList([StopAfter(token, ids.shape[1], whole_batch)]) for _ in range(2)]
        plain = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=16,
                                stopping_criteria=criteria[0])
        output = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=16,
                                 stopping_criteria=criteria[1], assistant_model=draft)
    finally:
        target.generation_config.eos_token_id = target.generation_config.pad_token_id = None
    assert output.tolist() == plain.tolist()
    if eos and not whole_batch:  # row 0 stopped at its 4th token, the others went on
        assert (plain[0, ids.shape[1] + 4 :] == PAD).all() and plain.shape[1] > ids.shape[1] + 4


@pytest.mark.parametrize("eos", [True, False])
def test_stop_strings_end_rows(fitted, flat_cost, eos):
    """Stop strings are checked per row right after its tokens; rows end there as in plain decoding."""
    from test_generation import _letter_tokenizer

    target, draft, prompts = fitted("llama")
    tokenizer = _letter_tokenizer()
    ids, mask = left_pad([prompts[0][0], prompts[1][0, :2], prompts[2][0]])
    reference = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=16)
    text = tokenizer.decode(reference[0, ids.shape[1] + 4 : ids.shape[1] + 6])  # two tokens row 0 says
    if eos:
        target.generation_config.eos_token_id, target.generation_config.pad_token_id = 15, PAD
    try:
        output = both(target, draft, ids, mask, max_new_tokens=16, stop_strings=[text], tokenizer=tokenizer)
    finally:
        target.generation_config.eos_token_id = target.generation_config.pad_token_id = None
    if eos:
        assert (output[0, ids.shape[1] + 6 :] == PAD).all() and output.shape[1] > ids.shape[1] + 6


def test_refuses_right_padding_and_flash_attention(fitted):
    target, draft, prompts = fitted("llama")
    ids, mask = left_pad([prompts[0][0], prompts[1][0, :3]])
    with pytest.raises(ValueError, match="left-padded"):
        target.generate(input_ids=ids.flip(1), attention_mask=mask.flip(1), assistant_model=draft, max_new_tokens=4)


# ------------------------------------------------------------------------------------------------ sampling
NEW = 4


def sample_rows(target, draft, n, seed, **kwargs):
    """Counts of each PROMPT row's continuation over `n` batched calls (rows 0 and 2 are PROMPT; row 1 a shorter,
    left-padded prompt)."""
    from collections import Counter

    ids, mask = left_pad([PROMPT[0], torch.tensor([2, 5]), PROMPT[0]])
    torch.manual_seed(seed)
    counts = [Counter(), Counter()]
    accepted = drafted = 0
    for _ in range(n):
        out = target.generate(input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=NEW,
                              assistant_model=draft, **kwargs)
        for slot, row in enumerate((0, 2)):
            counts[slot][tuple(out[row, ids.shape[1] :].tolist())] += 1
        accepted += sum(draft.last_generation_stats.accepted)
        drafted += sum(draft.last_generation_stats.drafted)
    return counts, drafted, accepted


def test_sampling_each_row_is_exact(sampling_pair, flat_cost):
    target, draft = sampling_pair
    counts, drafted, accepted = sample_rows(target, draft, 500, seed=3)
    assert 0 < accepted < drafted
    exact = exact_distribution(target, LogitsProcessorList())
    for row_counts in counts:
        assert chi_square_pvalue(row_counts, exact) > 1e-3


def test_sampling_beside_a_span_longer_than_the_block(sampling_pair, flat_cost, monkeypatch):
    """A row drafting its block beside a row verifying a longer context span: the step is as long as the span, the
    drafting row's q covers only its block, and that row still samples from the target's distribution."""
    from collections import Counter

    target, draft = sampling_pair
    original = DominoBatchDecoder._q_logits
    longer = []

    def watch(self, proposal, draft_logits, q):
        longer.append("domino" in proposal.sources and draft_logits is not None and q - 1 > draft_logits.shape[1])
        return original(self, proposal, draft_logits, q)

    monkeypatch.setattr(DominoBatchDecoder, "_q_logits", watch)
    ids, mask = left_pad([PROMPT[0], torch.tensor([1, 2, 5, 4, 0, 5, 2] * 4)])  # row 1 repeats itself: lookup spans
    torch.manual_seed(5)
    counts = Counter()
    for _ in range(400):
        out = target.generate(input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=14,
                              assistant_model=draft)
        counts[tuple(out[0, ids.shape[1] : ids.shape[1] + NEW].tolist())] += 1  # row 0's first NEW tokens
    assert sum(longer) > 0
    assert chi_square_pvalue(counts, exact_distribution(target, LogitsProcessorList())) > 1e-3


def test_sampling_check_catches_a_wrong_q(sampling_pair, flat_cost, monkeypatch):
    """Teeth: claiming a uniform q for the drafted tokens breaks every row's distribution."""
    target, _ = sampling_pair
    from domino_hf.modeling.proposer_domino import DominoProposer

    original = DominoProposer.rollout

    def uniform_q(self, *args, **kwargs):
        proposal = original(self, *args, **kwargs)
        proposal.logits = None if proposal.logits is None else torch.zeros_like(proposal.logits)
        return proposal

    monkeypatch.setattr(DominoProposer, "rollout", uniform_q)
    counts, drafted, _ = sample_rows(target, peaked_draft(target), 250, seed=1)
    assert drafted > 0
    exact = exact_distribution(target, LogitsProcessorList())
    assert all(chi_square_pvalue(row_counts, exact) < 1e-6 for row_counts in counts)


def test_profile_times_the_batch_overhead(fitted, flat_cost):
    """`profile_drafting` records the draft's phases, the verify and what the batch costs beyond them (`rows`)."""
    from domino_hf.modeling.dispatch_domino import profile_drafting

    target, draft, prompts = fitted("llama")
    ids, mask = left_pad([prompts[0][0], prompts[1][0, :3]])
    with profile_drafting(draft):
        target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=8, assistant_model=draft)
    timings = draft.last_generation_stats.timings
    assert all(timings[phase] > 0 for phase in ("backbone", "lm_head", "head_rollout", "verify", "rows"))
    target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=8, assistant_model=draft)
    assert "verify" not in draft.last_generation_stats.timings
