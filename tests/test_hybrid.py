"""Hybrid drafting: the Domino block or a span looked up in the context, chosen before any draw; the per-call
GenerationConfig settings; the no-fit back-off. Greedy identity, exact sampling (with teeth), switches, stats."""

from __future__ import annotations

import pytest
import torch
from conftest import domino_drafted, greedy_both, make_tiny_draft, make_tiny_target, tiny_prompts
from test_sampling import PROMPT, VOCAB, chi_square_pvalue, exact_distribution, peaked_draft, sample
from transformers import LogitsProcessorList

from domino_hf import DominoCandidateGenerator
from domino_hf.modeling.generation_domino import DraftBackoff, expected_accepted

pytestmark = pytest.mark.usefixtures("single_thread")

ARCHS = ["llama", "qwen2", "qwen3", "gemma3", "mistral"]


def passage_prompt(vocab_size: int, seed: int = 0) -> torch.Tensor:
    """A random passage, then the passage again cut half-way: copying the rest is the likely continuation."""
    passage = torch.randint(0, vocab_size, (1, 24), generator=torch.Generator().manual_seed(seed))
    return torch.cat([passage, passage[:, :12]], dim=1)


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_identity_with_lookup_heavy_prompts(arch, fitted_pair):
    target, draft, _ = fitted_pair(arch, vocab_size=32)
    sources = []
    for seed in range(3):
        _, stats = greedy_both(target, draft, passage_prompt(32, seed), max_new_tokens=30)
        sources += stats.sources
        assert len(stats.sources) == stats.num_steps == len(stats.drafted)
    assert "lookup" in sources


def test_lookup_switches_and_caps(fitted_pair):
    target, draft, _ = fitted_pair("llama", vocab_size=32)
    ids = passage_prompt(32)
    _, stats = greedy_both(target, draft, ids, max_new_tokens=30)
    assert stats.source_counts()["lookup"] > 0
    for off in (dict(prompt_lookup_num_tokens=0),):
        out = target.generate(ids, do_sample=False, max_new_tokens=30, assistant_model=draft, **off)
        assert out.tolist() == target.generate(ids, do_sample=False, max_new_tokens=30).tolist()
        assert draft.last_generation_stats.source_counts()["lookup"] == 0
    draft.config.context_lookup_tokens = 0  # the draft-level default
    _, stats = greedy_both(target, draft, ids, max_new_tokens=30)
    assert stats.source_counts()["lookup"] == 0
    target.generate(ids, do_sample=False, max_new_tokens=30, assistant_model=draft, prompt_lookup_num_tokens=3)
    stats = draft.last_generation_stats
    assert stats.source_counts()["lookup"] > 0
    assert max(d for d, s in zip(stats.drafted, stats.sources) if s == "lookup") <= 3


def test_num_assistant_tokens_caps_every_proposal(fitted_pair):
    target, draft, _ = fitted_pair("llama", vocab_size=32)
    for ids in [passage_prompt(32), *tiny_prompts(2, vocab_size=32)]:
        _, stats = greedy_both(target, draft, ids, max_new_tokens=30, num_assistant_tokens=2)
        assert stats.num_steps > 0 and max(stats.drafted) <= 2


def test_heuristic_schedule_grows_and_shrinks_the_cap(fitted_pair):
    target, draft, prompts = fitted_pair("llama")
    draft.config.context_lookup_tokens = 0
    drafted = []
    for ids in prompts[:3]:
        _, stats = greedy_both(
            target, draft, ids, max_new_tokens=24, num_assistant_tokens=1, num_assistant_tokens_schedule="heuristic"
        )
        drafted += domino_drafted(stats)
    assert min(drafted) >= 1 and max(drafted) > 1  # grew past its start after fully accepted proposals


def test_explicit_assistant_confidence_threshold_shortens_blocks(fitted_pair):
    target, draft, prompts = fitted_pair("llama")
    draft.config.context_lookup_tokens = 0
    full = greedy_both(target, draft, prompts[0], max_new_tokens=20)[1]
    short = greedy_both(target, draft, prompts[0], max_new_tokens=20, assistant_confidence_threshold=0.95)[1]
    assert max(full.drafted) == draft.config.num_draft_tokens
    assert sum(short.drafted) < sum(full.drafted)


def test_backoff_takes_plain_steps_when_the_draft_never_fits():
    target = make_tiny_target("llama")
    produced = set()
    for ids in tiny_prompts(3):
        produced.update(target.generate(ids, do_sample=False, max_new_tokens=40)[0, ids.shape[1] :].tolist())
    draft = make_tiny_draft(target, draft_vocab_ids=sorted(set(range(16)) - produced))  # never right
    draft.config.context_lookup_tokens = 0
    for ids in tiny_prompts(3):
        _, stats = greedy_both(target, draft, ids, max_new_tokens=40)
        counts = stats.source_counts()
        assert sum(stats.accepted) == 0 and counts["none"] > counts["domino"] >= 5


def test_backoff_schedule():
    backoff = DraftBackoff(min_accepted=0.3, alpha=0.5, max_skip=4, start=1.0)  # average 1 → 0.5 → 0.25: skipping
    decisions = []
    for _ in range(12):
        draft = backoff.should_draft()
        decisions.append(draft)
        if draft:
            backoff.update(drafted=4, accepted=0)
    assert decisions == [True, True, False, True, False, False, True, False, False, False, False, True]
    backoff.update(drafted=4, accepted=2)  # the average is back above 0.3
    assert backoff.should_draft() and backoff.skip == 0
    weak = DraftBackoff()  # a weak draft that still pays (0.4 tokens per step on average) is never paused
    pattern = [0, 0, 1, 0, 1, 0, 0, 1, 0, 1]
    for step in range(200):
        assert weak.should_draft()
        weak.update(drafted=4, accepted=pattern[step % len(pattern)])


def test_expected_accepted():
    assert expected_accepted([]) == 0
    assert expected_accepted([0.5, 0.5]) == pytest.approx(0.75)
    assert expected_accepted([1.0, 1.0], length=5) == pytest.approx(5.0)
    assert expected_accepted([0.0, 1.0], length=5) == 0


def test_beam_search_and_speculation_type_are_refused(fitted_pair):
    target, draft, prompts = fitted_pair("llama")
    with pytest.raises(ValueError, match="num_beams"):
        target.generate(prompts[0], max_new_tokens=5, num_beams=2, assistant_model=draft)
    with pytest.raises(ValueError, match="speculation_type"):
        target.generate(prompts[0], max_new_tokens=5, speculation_type="dflash", assistant_model=draft)


# ------------------------------------------------------------------------------------------------ sampling
@pytest.fixture(scope="module")
def target():
    return make_tiny_target(
        "llama", vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, initializer_range=0.5,
    )


def always_lookup(monkeypatch):
    """Make the choice prefer any lookup span (exercises the lookup q on most steps)."""
    import domino_hf.modeling.generation_domino as generation

    monkeypatch.setattr(generation, "expected_accepted", lambda probs, length=None: 0.0 if length is None else 1.0)


def lookup_steps(target, draft, n, seed, **kwargs):
    torch.manual_seed(seed)
    steps = 0
    for _ in range(n):
        target.generate(PROMPT, do_sample=True, max_new_tokens=4, assistant_model=draft, **kwargs)
        steps += draft.last_generation_stats.source_counts()["lookup"]
    return steps


@pytest.mark.parametrize("forced", [False, True])
def test_sampling_with_lookup_is_exact(target, monkeypatch, forced):
    from domino_hf.modeling.generation_domino import SourceChooser

    draft = peaked_draft(target)
    if forced:
        always_lookup(monkeypatch)
    else:  # the calibrated rule as shipped, exploring often enough to matter within 4 new tokens
        monkeypatch.setattr(SourceChooser.__init__, "__defaults__", (2, 0.25, 0.3, 0.0))
    assert lookup_steps(target, draft, 50, seed=9) > (20 if forced else 2)
    counts, drafted, accepted = sample(target, 700, seed=11, assistant_model=draft)
    assert 0 < accepted < drafted
    assert chi_square_pvalue(counts, exact_distribution(target, LogitsProcessorList())) > 1e-3


def test_wrong_lookup_q_is_caught(target, monkeypatch):
    """Teeth: claiming a uniform q for lookup tokens (instead of one-hot) biases the output, and the test sees it."""
    always_lookup(monkeypatch)
    original = DominoCandidateGenerator._propose_lookup

    def uniform_q(self, input_ids, span, predicted=None):
        ids, logits = original(self, input_ids, span, predicted)
        return ids, None if logits is None else torch.zeros_like(logits)

    monkeypatch.setattr(DominoCandidateGenerator, "_propose_lookup", uniform_q)
    counts, _, _ = sample(target, 700, seed=11, assistant_model=peaked_draft(target))
    assert chi_square_pvalue(counts, exact_distribution(target, LogitsProcessorList())) < 1e-6


def test_source_chooser_learns_from_acceptance_and_explores():
    from domino_hf.modeling.generation_domino import SourceChooser

    chooser = SourceChooser(explore_every=4)
    assert [chooser.choose(2.0, 0.1) for _ in range(4)] == ["domino", "domino", "domino", "lookup"]
    chooser.update("lookup", predicted=0.1, accepted=5)  # the draft under-rated a copied span
    chooser.update("domino", predicted=2.0, accepted=1)  # and over-rated its own block
    assert chooser.lookup_average == pytest.approx(1.0 + 0.3 * 4)
    assert chooser.choose(2.0, 0.1) == "lookup"
    for _ in range(10):
        chooser.update("lookup", predicted=0.1, accepted=0)  # spans stop being accepted
    assert chooser.choose(2.0, 0.1) == "domino"


def test_spans_go_first_without_drafting_when_they_win_by_far(fitted_pair, monkeypatch):
    """On copy-heavy text the draft is skipped for steps with a span; still lossless, and cheaper."""
    from domino_hf.modeling.generation_domino import SourceChooser

    chooser = SourceChooser()
    assert not chooser.span_first()
    for _ in range(5):
        chooser.update("lookup", None, 4)
        chooser.update("domino", None, 0)
    assert chooser.span_first()

    target, draft, _ = fitted_pair("llama", vocab_size=32)
    calls = []
    original = DominoCandidateGenerator._backbone
    monkeypatch.setattr(DominoCandidateGenerator, "_backbone", lambda self, *a: calls.append(1) or original(self, *a))
    ids = torch.cat([passage_prompt(32)] * 3, dim=1)  # the passage three times: copying is right
    _, stats = greedy_both(target, draft, ids, max_new_tokens=40)
    assert stats.source_counts()["lookup"] > 0 and len(calls) < stats.num_steps
