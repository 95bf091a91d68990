"""Sampling with a Domino draft must leave the target's distribution exactly unchanged.

A 6-token-vocabulary target; the exact distribution of its 4-token continuations (1,296 sequences) is computed
from its logits with the same warpers generation applies, and compared by a chi-square test with the
continuations `generate(..., do_sample=True, assistant_model=draft)` samples (fixed seeds). The draft's q is
made peaked and unlike p, so acceptances and rejections (residual sampling) both happen often. The test has
teeth: the same check fails when the generator claims a wrong q (uniform) for the tokens it drafted.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch
from conftest import make_tiny_draft, make_tiny_target
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from domino_hf import DominoCandidateGenerator
from domino_hf.modeling.dispatch_domino import resolve_drafting_settings

pytestmark = pytest.mark.usefixtures("single_thread")

VOCAB = 6
PROMPT = torch.tensor([[1, 3, 2, 4]])
NEW_TOKENS = 4  # prefill gives token 1; drafting steps then propose up to 2 tokens (block 4 is capped)
P_MIN = 1e-3  # a correct sampler passes with this seed; a wrong q gives p-values far below it


def make_sampling_target():
    """A one-layer target over `VOCAB` tokens: small enough to compute its exact distribution."""
    return make_tiny_target(
        "llama",
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        initializer_range=0.5,
    )


@pytest.fixture(scope="module")
def target(sampling_pair):
    return sampling_pair[0]


def peaked_draft(target, **overrides):
    """A random draft whose q is sharp and unlike the target's p: rejections and residual sampling dominate."""
    draft = make_tiny_draft(target, gru_hidden_dim=16, correction_rank=8, **overrides)
    with torch.no_grad():
        draft.norm.weight.mul_(3.0)
    return draft


@pytest.fixture(scope="module")
def fitted_draft(sampling_pair):
    """A draft fitted to the target's greedy continuations (conftest's `sampling_pair`): about half its tokens
    are accepted, runs included."""
    return sampling_pair[1]


def exact_distribution(target, warpers: LogitsProcessorList) -> torch.Tensor:
    """P(x_1..x_N | PROMPT) under the target with `warpers`, as a (VOCAB,)*N tensor of probabilities."""
    prefixes = torch.tensor(list(itertools.product(range(VOCAB), repeat=NEW_TOKENS - 1)))  # (M, N-1)
    seqs = torch.cat([PROMPT.expand(len(prefixes), -1), prefixes], dim=1)  # (M, P+N-1)
    with torch.no_grad():
        logits = target(seqs).logits[:, -NEW_TOKENS:].float()  # (M, N, V): position i sees x_<i only
    start = PROMPT.shape[1]
    logprobs = torch.stack(
        [warpers(seqs[:, : start + i], logits[:, i]).log_softmax(-1) for i in range(NEW_TOKENS)], dim=1
    )
    joint = torch.zeros((VOCAB,) * NEW_TOKENS)
    for row, prefix in enumerate(prefixes.tolist()):
        for last in range(VOCAB):
            x = prefix + [last]
            joint[tuple(x)] = sum(logprobs[row, i, x[i]] for i in range(NEW_TOKENS)).exp()
    return joint


def sample(target, n: int, seed: int, **kwargs):
    """Counter of sampled continuations, and the summed (drafted, accepted) draft tokens."""
    torch.manual_seed(seed)
    counts, drafted, accepted = Counter(), 0, 0
    draft = kwargs.get("assistant_model")
    for _ in range(n):
        out = target.generate(PROMPT, do_sample=True, max_new_tokens=NEW_TOKENS, **kwargs)
        counts[tuple(out[0, PROMPT.shape[1] :].tolist())] += 1
        if draft is not None:
            drafted += sum(draft.last_generation_stats.drafted)
            accepted += sum(draft.last_generation_stats.accepted)
    return counts, drafted, accepted


def chi_square_pvalue(counts: Counter, probs: torch.Tensor) -> float:
    """Pearson chi-square goodness of fit; cells expected < 5 times are pooled into one bin."""
    n = sum(counts.values())
    expected = probs.flatten().double() * n
    observed = torch.zeros_like(expected)
    for seq, count in counts.items():
        index = 0
        for token in seq:
            index = index * VOCAB + token
        assert probs.flatten()[index] > 0, f"sampled {seq}, which the target can never produce"
        observed[index] = count
    big = expected >= 5
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    obs = torch.cat([observed[big], observed[~big].sum()[None]])
    if exp[-1] < 5:  # a too-small pooled bin joins the smallest regular one
        smallest = exp[:-1].argmin()
        exp[smallest] += exp[-1]
        obs[smallest] += obs[-1]
        exp, obs = exp[:-1], obs[:-1]
    stat = ((obs - exp) ** 2 / exp).sum()
    df = len(exp) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.double), stat / 2))


WARPERS = {
    "plain": ({}, []),
    "temperature_top_p": (dict(temperature=0.7, top_p=0.8), [TemperatureLogitsWarper(0.7), TopPLogitsWarper(0.8)]),
    "temperature_top_k": (dict(temperature=1.5, top_k=3), [TemperatureLogitsWarper(1.5), TopKLogitsWarper(3)]),
}


def test_exact_distribution_matches_target_alone(target):
    """Checks the harness itself: the target's own sampler agrees with the analytic distribution."""
    counts, _, _ = sample(target, 600, seed=0)
    assert chi_square_pvalue(counts, exact_distribution(target, LogitsProcessorList())) > P_MIN


@pytest.mark.parametrize(
    "warping, draft_vocab_ids, n",
    [
        ("plain", "fitted", 1000),
        # The variants run with the integration tier (CI); the fast loop keeps the plain case.
        pytest.param("temperature_top_p", "fitted", 700, marks=pytest.mark.integration),
        # sub-vocabulary without the target's second-best token
        pytest.param("temperature_top_k", [0, 2, 4], 700, marks=pytest.mark.integration),
        # sub-vocabulary without the target's favourite token
        pytest.param("plain", [1, 3, 4, 5], 600, marks=pytest.mark.integration),
    ],
)
def test_sampling_with_draft_is_lossless(target, fitted_draft, warping, draft_vocab_ids, n):
    kwargs, warpers = WARPERS[warping]
    draft = fitted_draft if draft_vocab_ids == "fitted" else peaked_draft(target, draft_vocab_ids=draft_vocab_ids)
    counts, drafted, accepted = sample(target, n, seed=1, assistant_model=draft, **kwargs)
    assert 0 < accepted < drafted  # both acceptances and rejections happened
    if draft is fitted_draft:
        assert accepted > drafted / 3
    assert chi_square_pvalue(counts, exact_distribution(target, LogitsProcessorList(warpers))) > P_MIN


@pytest.mark.integration  # a statistical variant (hundreds of sampled generations): the full suite
def test_adaptive_draft_length_keeps_sampling_exact(target, fitted_draft, monkeypatch):
    """Stopping the draft on its own chain probability depends only on draft-side values: still exact."""
    monkeypatch.setattr(fitted_draft.generation_config, "draft_confidence_threshold", 0.3, raising=False)
    counts, drafted, accepted = sample(target, 700, seed=2, assistant_model=fitted_draft)
    assert 0 < accepted < drafted
    assert chi_square_pvalue(counts, exact_distribution(target, LogitsProcessorList())) > P_MIN


@pytest.mark.integration  # a statistical variant: the full suite
def test_bf16_draft_keeps_sampling_exact(target, fitted_draft):
    """q is whatever the (bf16) draft drew from, upcast: a cheaper draft precision changes acceptance only."""
    import copy

    draft = copy.deepcopy(fitted_draft).to(torch.bfloat16)
    counts, drafted, accepted = sample(target, 700, seed=3, assistant_model=draft)
    assert 0 < accepted < drafted
    assert chi_square_pvalue(counts, exact_distribution(target, LogitsProcessorList())) > P_MIN


class LiftOutsideToken(LogitsProcessor):
    """Gives token 1 the best finite logit minus 1: with a sub-vocabulary [0, 2, 4] that is mass outside it."""

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        scores[:, 1] = scores.masked_fill(~torch.isfinite(scores), float("-inf")).max(dim=-1).values - 1.0
        return scores


@pytest.mark.integration  # a statistical variant: the full suite
def test_sampling_exact_when_a_processor_puts_mass_outside_the_sub_vocabulary(target, monkeypatch):
    """The draw normally runs over the sub-vocabulary's columns only; a processor that lifts a token outside
    it must send the draft back to the full-width draw, or q would be wrong."""
    drawn = []
    from domino_hf.modeling.proposer_domino import DominoProposer

    original = DominoProposer.sample
    monkeypatch.setattr(DominoProposer, "sample", lambda self, logits: drawn.append(t := original(self, logits)) or t)
    draft = peaked_draft(target, draft_vocab_ids=[0, 2, 4])
    processors = LogitsProcessorList([LiftOutsideToken()])
    counts, drafted, accepted = sample(target, 600, seed=5, assistant_model=draft, logits_processor=processors)
    assert drafted > 0 and any(int(t) == 1 for t in drawn)  # the draft proposed the outside token
    assert any(int(t) in (0, 2, 4) for t in drawn)
    assert chi_square_pvalue(counts, exact_distribution(target, processors)) > P_MIN


def test_wrong_q_is_caught(target, monkeypatch):
    """Teeth: drafting from the draft's q but handing transformers a uniform q breaks the distribution, and the
    chi-square check above notices with few samples."""
    original = DominoCandidateGenerator._rollout

    def rollout_claiming_uniform_q(self, *args, **kwargs):
        proposal = original(self, *args, **kwargs)
        if proposal.logits is not None:
            proposal.logits = torch.zeros_like(proposal.logits)
        return proposal

    monkeypatch.setattr(DominoCandidateGenerator, "_rollout", rollout_claiming_uniform_q)
    draft = peaked_draft(target)
    counts, drafted, accepted = sample(target, 300, seed=1, assistant_model=draft)
    assert drafted > 0
    assert chi_square_pvalue(counts, exact_distribution(target, LogitsProcessorList())) < 1e-6


def test_candidate_logits_span_the_target_vocabulary(target):
    """q rows are full-width processed logits, −inf outside a sub-vocabulary, one row per drafted token."""
    from transformers import GenerationConfig

    draft = peaked_draft(target, draft_vocab_ids=[0, 2, 4])
    generation_config = GenerationConfig(do_sample=True, max_length=20, temperature=0.5)
    warpers = LogitsProcessorList([TemperatureLogitsWarper(0.5)])
    settings = resolve_drafting_settings(draft, generation_config)
    generator = DominoCandidateGenerator(draft, target, generation_config, warpers, PROMPT, settings)
    with torch.no_grad():
        outputs = target(PROMPT, output_hidden_states=True)
    ids = torch.cat([PROMPT, torch.tensor([[5]])], dim=1)
    candidates, logits = generator.get_candidates(ids, model_kwargs={}, model_outputs=outputs)
    drafted = candidates[0, ids.shape[1] :]
    assert logits.shape == (1, len(drafted), VOCAB) and len(drafted) == draft.config.num_draft_tokens
    assert set(drafted.tolist()) <= {0, 2, 4}
    assert torch.isinf(logits[0, :, [1, 3, 5]]).all() and torch.isfinite(logits[0, :, [0, 2, 4]]).all()
