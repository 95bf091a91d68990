"""Hybrid drafting: the Domino block or a span looked up in the context, chosen before any draw; the per-call
GenerationConfig settings; the no-fit back-off. Greedy identity, exact sampling (with teeth), switches, stats."""

from __future__ import annotations

import pytest
import torch
from conftest import (
    domino_drafted, greedy_both, make_tiny_draft, make_tiny_target, never_right_draft, tiny_prompts,
)
from test_sampling import PROMPT, chi_square_pvalue, exact_distribution, make_sampling_target, peaked_draft, sample
from transformers import LogitsProcessorList

from domino_hf import DominoCandidateGenerator
from domino_hf.modeling.hybrid_domino import DraftBackoff, SourceChooser, expected_accepted

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
    draft = never_right_draft(target, tiny_prompts(3), max_new_tokens=40)
    draft.config.context_lookup_tokens = 0
    for ids in tiny_prompts(3):
        _, stats = greedy_both(target, draft, ids, max_new_tokens=40)
        counts = stats.source_counts()
        assert sum(stats.accepted) == 0 and counts["none"] > counts["domino"] >= 5


@pytest.mark.parametrize("where", ["generation_config", "draft_config"])
def test_draft_backoff_off_drafts_every_step(where):
    """`draft_backoff=False` (per call, or the draft's field): a draft that never fits still drafts at every
    step, as the field measures τ, and greedy output stays the target's."""
    from transformers import GenerationConfig

    target = make_tiny_target("llama")
    draft = never_right_draft(target, tiny_prompts(2), max_new_tokens=40)
    draft.config.context_lookup_tokens = 0
    for ids in tiny_prompts(2):
        if where == "draft_config":
            draft.config.draft_backoff = False
            _, stats = greedy_both(target, draft, ids, max_new_tokens=40)
        else:
            config = GenerationConfig(max_new_tokens=40, draft_backoff=False)
            _, stats = greedy_both(target, draft, ids, generation_config=config)
        counts = stats.source_counts()
        assert sum(stats.accepted) == 0 and counts["domino"] == stats.num_steps - 1 and counts["none"] == 1


def test_draft_backoff_must_be_a_bool():
    with pytest.raises(ValueError, match="draft_backoff"):
        make_tiny_draft(make_tiny_target("llama"), draft_backoff="off")


def test_backoff_schedule():
    backoff = DraftBackoff(min_gain=0.3, alpha=0.5, max_skip=4, start=1.0)  # average 1 → 0.5 → 0.25: skipping
    decisions = []
    for _ in range(12):
        draft = backoff.should_draft()
        decisions.append(draft)
        if draft:
            backoff.update(0)
    assert decisions == [True, True, False, True, False, False, True, False, False, False, False, True]
    backoff.update(2)  # the average is back above 0.3
    assert backoff.should_draft() and backoff.skip == 0
    weak = DraftBackoff()  # a weak draft that still pays (0.4 tokens per step on average) is never paused
    pattern = [0, 0, 1, 0, 1, 0, 0, 1, 0, 1]
    for step in range(200):
        assert weak.should_draft()
        weak.update(pattern[step % len(pattern)])


def test_backoff_bar_follows_the_measured_verify_cost():
    """Where verifying 5 tokens measures 1.6× a plain step, a draft averaging 0.4 accepted tokens no longer
    pays and is paused; with the (unmeasured) prior cost the bar stays `min_gain`."""
    from domino_hf.modeling.cost_domino import VerifyCost

    prior = DraftBackoff(cost=VerifyCost(), proposed=5)
    assert prior.bar == prior.min_gain == 0.25
    measured = VerifyCost(measure=True)
    for _ in range(60):  # a plain step 10 ms, a 5-token verify 16 ms
        measured.observe(1, 0.010)
        measured.observe(5, 0.016)
    backoff = DraftBackoff(cost=measured, proposed=5)
    assert backoff.bar == pytest.approx(0.6, abs=0.05)
    pattern = [0, 0, 1, 0, 1, 0, 0, 1, 0, 1]  # 0.4 tokens a step: paid at 1.2x, not at 1.6x
    drafted = 0
    for step in range(200):
        if backoff.should_draft():
            drafted += 1
            backoff.update(pattern[drafted % len(pattern)])
    assert drafted < 150


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
    """The sampling tests' target (test_sampling.py): its exact distribution is computable."""
    return make_sampling_target()


def always_lookup(monkeypatch):
    """Make the choice prefer any lookup span (exercises the lookup q on most steps)."""
    monkeypatch.setattr(SourceChooser, "choose", lambda self, domino, block, lookup, span: span.source)


def lookup_steps(target, draft, n, seed, **kwargs):
    torch.manual_seed(seed)
    steps = 0
    for _ in range(n):
        target.generate(PROMPT, do_sample=True, max_new_tokens=4, assistant_model=draft, **kwargs)
        steps += draft.last_generation_stats.source_counts()["lookup"]
    return steps


@pytest.mark.parametrize("forced, timed", [
    (False, False),
    # The variants run with the integration tier (CI); the fast loop keeps the rule as shipped.
    pytest.param(True, False, marks=pytest.mark.integration),
    pytest.param(False, True, marks=pytest.mark.integration),
])
def test_sampling_with_lookup_is_exact(target, monkeypatch, forced, timed):
    """The rule as shipped, lookup forced, and the timing-driven options (measured verify cost, cut spans)."""

    draft = peaked_draft(target)
    draft.config.measure_verify_cost = draft.config.cut_lookup_spans = timed
    if forced:
        always_lookup(monkeypatch)
    assert lookup_steps(target, draft, 50, seed=9) > (20 if forced else 2)
    counts, drafted, accepted = sample(target, 700, seed=11, assistant_model=draft)
    assert 0 < accepted < drafted
    assert chi_square_pvalue(counts, exact_distribution(target, LogitsProcessorList())) > 1e-3


@pytest.mark.integration  # hundreds of sampled generations: the full suite
def test_wrong_lookup_q_is_caught(target, monkeypatch):
    """Teeth: claiming a uniform q for lookup tokens (instead of one-hot) biases the output, and the test sees it."""
    always_lookup(monkeypatch)
    original = DominoCandidateGenerator._propose_lookup

    def uniform_q(self, input_ids, span, *args, **kwargs):
        ids, logits = original(self, input_ids, span, *args, **kwargs)
        return ids, None if logits is None else torch.zeros_like(logits)

    monkeypatch.setattr(DominoCandidateGenerator, "_propose_lookup", uniform_q)
    counts, _, _ = sample(target, 700, seed=11, assistant_model=peaked_draft(target))
    assert chi_square_pvalue(counts, exact_distribution(target, LogitsProcessorList())) < 1e-6


def _step(source, proposed, predicted=None, span=None):
    from domino_hf.modeling.hybrid_domino import _Step

    return _Step(proposed, source, predicted, None, source == "domino", () if span is None else (span,))


def _span(tokens, ngram=1):
    from domino_hf.modeling.hybrid_domino import Span

    return Span(list(tokens), ngram)


def test_source_chooser_learns_from_acceptance():
    from domino_hf.modeling.cost_domino import VerifyCost
    from domino_hf.modeling.hybrid_domino import SPAN_START_RATES, SourceChooser

    chooser = SourceChooser(max_span=4, cost=VerifyCost(step=0.0, per_token=0.0))  # tokens alone decide
    span = _span([1, 2, 3, 4])  # found by a 1-gram match
    h = SPAN_START_RATES[1]
    assert chooser.span_model(span).expected(4) == pytest.approx(h[0] * (1 + h[1] * (1 + h[2] + h[2] ** 2)))
    assert chooser.choose(2.0, 4, 0.1, span) == "domino"
    for _ in range(10):  # spans are copied verbatim, blocks over-rated by the draft
        chooser.update(_step("lookup", 4, span=span), 4, None, [1, 2, 3, 4, 5])
        chooser.update(_step("domino", 4, predicted=2.0), 1, None, [7, 8])
    assert chooser.span_model(span).expected(4) > 3.4 and chooser.calibration.ratio < 0.6
    assert chooser.choose(2.0, 4, 0.1, span) == "lookup"
    assert not chooser.needs_lookup_score(2.0, 4, span)  # history alone decides: no teacher-forced rollout
    for _ in range(10):  # spans stop being right, also on steps that did not send them
        chooser.update(_step("domino", 4, predicted=2.0, span=span), 2, None, [9, 9, 9])
    assert chooser.span_model(span).h[0] < 0.2
    assert chooser.choose(4.0, 4, 0.1, span) == "domino"
    assert chooser.needs_lookup_score(4.0, 4, span)
    assert chooser.choose(4.0, 4, 3.5, span) == "lookup"  # unless the draft itself vouches for the span


def test_spans_are_judged_by_the_length_of_their_match():
    """A 3-gram match is far more often right than a 1-gram one: each match length has its own history."""
    from domino_hf.modeling.hybrid_domino import SourceChooser

    chooser = SourceChooser(max_span=10)
    weak, strong, longer = _span(range(10), ngram=1), _span(range(10), ngram=3), _span(range(10), ngram=5)
    assert chooser.span_model(longer) is chooser.span_model(strong)  # 3 stands for 3 or more
    assert chooser.span_model(strong).expected(10) > chooser.span_model(weak).expected(10) + 3
    assert chooser.choose(1.5, 4, 0.0, strong) == "lookup" and chooser.choose(1.5, 4, 0.0, weak) == "domino"
    for _ in range(10):  # weak spans turn out right in this text: only their own history moves
        chooser.update(_step("lookup", 10, span=weak), 10, None, list(range(11)))
    assert chooser.span_model(weak).h[0] > 0.85
    assert chooser.span_model(_span(range(10), ngram=2)).h[0] == pytest.approx(0.55)


def test_the_choice_weighs_verify_cost():
    from domino_hf.modeling.cost_domino import VerifyCost
    from domino_hf.modeling.hybrid_domino import SourceChooser

    cost = VerifyCost(step=0.08, per_token=0.025)
    assert cost(1) == 1.0 and cost(5) == pytest.approx(1.18) and cost(11) == pytest.approx(1.33)
    chooser = SourceChooser(max_span=10, cost=cost)
    # 1.1 expected tokens either way: the 4-token block's verify is cheaper than the 10-token span's
    assert chooser.choose(1.1, 4, 1.1, _span(range(10))) == "domino"
    assert chooser.choose(1.1, 4, 1.2, _span(range(4))) == "lookup"  # same cost: more tokens win
    assert VerifyCost.for_device(torch.device("meta"))(11) < 1.05  # accelerators: more tokens ~ free


def test_verify_cost_is_refitted_to_the_measured_forwards():
    """The fixed curve is one machine's; measured forwards (a steeper CPU here) take over, and stalls are clipped."""
    from domino_hf.modeling.cost_domino import VerifyCost

    fixed = VerifyCost(step=0.08, per_token=0.025)
    fixed.observe(11, 0.5)
    assert fixed(11) == pytest.approx(1.33)  # measure=False ignores timings
    cost = VerifyCost(step=0.08, per_token=0.025, measure=True)
    assert cost(11) == pytest.approx(1.33) and cost.seconds(1) is None  # the prior until something is timed

    def machine(k):  # seconds: a plain step 0.14 s, +0.02 s per extra token, +0.03 s for any k > 1
        return 0.14 if k == 1 else 0.17 + 0.02 * (k - 1)

    for _ in range(60):
        for k in (1, 5, 11):
            cost.observe(k, machine(k))
    assert cost(5) == pytest.approx(machine(5) / machine(1), rel=0.02)
    assert cost(11) == pytest.approx(machine(11) / machine(1), rel=0.02)
    assert cost(8) == pytest.approx(machine(8) / machine(1), rel=0.02)  # between measured lengths: the line
    cost.observe(11, 30.0)  # a stall counts as at most twice the expected time
    assert cost(11) < 1.1 * machine(11) / machine(1)
    flat = VerifyCost(measure=True)
    for _ in range(30):
        flat.observe(1, 0.02)
        flat.observe(9, 0.019)  # noise below a plain step: never cheaper than 1
    assert flat(9) == 1.0


def test_verify_cost_keeps_the_steps_a_line_misses():
    """A GEMM library that switches algorithm at 4 rows (an AMX Xeon: 3 tokens 1.12×, 4 tokens 1.43× a plain step):
    each measured length follows its own forwards, unmeasured ones the line, and a length's own average fades
    when it stops being measured only as fast as the line's old points do."""
    from domino_hf.modeling.cost_domino import VerifyCost

    curve = {1: 0.048, 2: 0.052, 3: 0.054, 4: 0.068, 5: 0.070, 9: 0.080}
    cost = VerifyCost(measure=True)
    for _ in range(40):
        for k in (1, 3, 4, 5, 9):
            cost.observe(k, curve[k])
    for k in (3, 4, 5, 9):
        assert cost(k) == pytest.approx(curve[k] / curve[1], rel=0.03), k
    assert cost(4) - cost(3) > 0.25  # the step survives; a line through these points would put it at ~0.05
    line = cost.seconds(7)  # never measured: the least-squares line
    assert curve[5] < line < curve[9]
    for _ in range(200):  # only 3 and 9 measured from now on: 4's old average fades towards the line
        cost.observe(3, curve[3]), cost.observe(9, curve[9])
    assert cost.seconds(4) == pytest.approx(cost.seconds(3) + (curve[9] - curve[3]) / 6, rel=0.02)


def test_measured_verify_cost_times_every_step_and_stays_lossless(fitted_pair, monkeypatch):
    """`measure_verify_cost`: each verify forward is timed (k = tokens proposed + 1); output unchanged."""
    from domino_hf.modeling.cost_domino import VerifyCost

    target, draft, _ = fitted_pair("qwen3", vocab_size=32)
    seen = []
    original = VerifyCost.observe
    monkeypatch.setattr(VerifyCost, "observe", lambda self, k, s: seen.append((self.measure, k, s)) or original(
        self, k, s))
    for measure in (False, True):
        draft.config.measure_verify_cost = measure
        seen.clear()
        _, stats = greedy_both(target, draft, passage_prompt(32, seed=1), max_new_tokens=30)
        assert [k for _, k, _ in seen] == [d + 1 for d in stats.drafted]
        assert all(m == measure and s > 0 for m, s in ((m, s) for m, _, s in seen))


def test_cut_spans_stay_lossless_and_never_longer(fitted_pair):
    target, draft, _ = fitted_pair("gemma3", vocab_size=32)
    longest = {}
    for cut in (False, True):
        draft.config.cut_lookup_spans = cut
        lengths = []
        for seed in range(3):
            _, stats = greedy_both(target, draft, passage_prompt(32, seed), max_new_tokens=30)
            lengths += [d for d, source in zip(stats.drafted, stats.sources) if source == "lookup"]
        longest[cut] = max(lengths)
    assert longest[True] <= longest[False]


def test_span_cut_keeps_the_prefix_worth_its_verify():
    from domino_hf.modeling.cost_domino import VerifyCost
    from domino_hf.modeling.hybrid_domino import SourceChooser

    chooser = SourceChooser(max_span=10, cost=VerifyCost(step=0.08, per_token=0.06))
    weak = _span(range(10), ngram=1)
    assert chooser.span_length(weak) == 10  # off by default: spans go out whole
    chooser.cut_spans = True
    h = chooser.span_model(weak).h
    values = []
    for n in range(1, 11):
        chain = [1.0]
        for rate in h[:n]:
            chain.append(chain[-1] * rate)
        values.append((1 + sum(chain[1:])) / chooser.cost(n + 1))
    assert chooser.span_length(weak) == 1 + values.index(max(values)) < 10
    strong = _span(range(10), ngram=3)
    for _ in range(20):  # spans of this kind are copied whole: worth sending in full
        chooser.update(_step("lookup", 10, span=strong), 10, None, list(range(11)))
    assert chooser.span_length(strong) == 10



def test_span_model_scores_unsent_spans_as_far_as_the_verified_tokens_reach():
    from domino_hf.modeling.hybrid_domino import SpanModel

    spans = SpanModel(max_len=4, alpha=0.5, start=(0.5,))
    spans.observe([1, 2, 3, 4], [1, 2, 9])  # 2 accepted, 3rd rejected, 4th unseen
    assert spans.h == [0.75, 0.75, 0.25, 0.5]
    spans.observe([1, 2, 3, 4], [5])  # a plain step: only the first position is seen
    assert spans.h == [0.375, 0.75, 0.25, 0.5]


def test_spans_go_first_without_drafting_when_they_win_by_far(fitted_pair, monkeypatch):
    """On copy-heavy text the draft is skipped for steps with a span; still lossless, and cheaper."""
    from domino_hf.modeling.hybrid_domino import SourceChooser

    chooser = SourceChooser(max_span=4)
    span = _span([1, 2, 3, 4])
    assert not chooser.span_first(span)
    for _ in range(5):
        chooser.update(_step("lookup", 4, span=span), 3, None, [1, 2, 3, 9])
        chooser.update(_step("domino", 4), 0, None, [0])
    assert chooser.span_first(span)

    target, draft, _ = fitted_pair("llama", vocab_size=32)
    calls = []
    original = DominoCandidateGenerator._backbone
    monkeypatch.setattr(DominoCandidateGenerator, "_backbone", lambda self, *a: calls.append(1) or original(self, *a))
    ids = torch.cat([passage_prompt(32)] * 3, dim=1)  # the passage three times: copying is right
    _, stats = greedy_both(target, draft, ids, max_new_tokens=40)
    assert stats.source_counts()["lookup"] > 0 and len(calls) < stats.num_steps


def test_shadow_accepted_is_the_common_prefix_with_the_verified_tokens():
    from domino_hf.modeling.hybrid_domino import shadow_accepted

    verified = [5, 6, 7]  # accepted tokens + bonus
    assert shadow_accepted([5, 6, 9, 9], verified) == 2
    assert shadow_accepted([4, 6], verified) == 0
    assert shadow_accepted([5, 6, 7, 8], verified) == 3  # as far as the verified tokens show
    assert shadow_accepted([5], verified) == 1


def test_a_whole_accepted_span_means_a_copy_is_under_way():
    from domino_hf.modeling.hybrid_domino import SourceChooser

    chooser = SourceChooser(max_span=10)
    span = _span(range(10))
    chooser.domino_average = 20.0  # blocks do well lately: only the copy rule can put spans first
    chooser.update(_step("lookup", 10), 10, None, [])
    assert chooser.span_first(span)
    chooser.update(_step("lookup", 10), 3, None, [])  # the copy ended
    assert not chooser.span_first(span)
    chooser.update(_step("lookup", 2), 2, None, [])
    chooser.update(_step("domino", 4, predicted=1.0), 4, None, [])  # a block in between ends it too
    assert not chooser.span_first(span)
    chooser.update(_step("none", 0), 0, None, [])  # nothing sent is no copy
    assert not chooser.span_first(span)


def test_blocks_that_lose_to_spans_are_scored_and_backed_off(monkeypatch):
    """A draft that is never right, on a prompt where spans win: its blocks are compared with the target's
    tokens on span steps (shadow), which feeds the back-off, so it is paused instead of running unseen on every
    span step."""
    target = make_tiny_target("llama", vocab_size=64)
    produced = set()
    ids = torch.cat([passage_prompt(64)] * 2, dim=1)
    produced.update(target.generate(ids, do_sample=False, max_new_tokens=48)[0, ids.shape[1] :].tolist())
    draft = make_tiny_draft(target, draft_vocab_ids=sorted(set(range(64)) - produced))  # never right
    gains = []
    original = DraftBackoff.update
    monkeypatch.setattr(DraftBackoff, "update", lambda self, gain: gains.append(gain) or original(self, gain))
    _, stats = greedy_both(target, draft, ids, max_new_tokens=48)
    lookup_with_draft = [r for r, s in zip(stats.draft_runs, stats.sources) if s == "lookup" and r]
    assert lookup_with_draft and max(gains) <= 0  # span steps where the draft ran fed the back-off
    assert len(gains) == sum(stats.draft_runs)  # every draft run is accounted for
    assert sum(stats.draft_runs) < stats.num_steps / 2


def test_context_lookup_takes_the_most_recent_longest_match():
    from transformers.generation.logits_process import NoBadWordsLogitsProcessor

    from domino_hf.modeling.hybrid_domino import ContextLookup

    def lookup(ids, **kwargs):
        span, ngram = ContextLookup(**{"max_tokens": 3, "max_ngram": 3, **kwargs})(torch.tensor([ids]))
        return span.tolist(), ngram

    assert lookup([5, 1, 2, 6, 1, 2, 7, 8, 2]) == ([7, 8, 2], 1)  # the most recent "2", not the first
    assert lookup([9, 1, 2, 6, 4, 1, 2, 7, 4, 1, 2]) == ([7, 4, 1], 3)  # the 3-gram "4 1 2" beats the 2-gram "1 2"
    assert lookup([9, 1, 2, 6, 4, 1, 2, 7, 4, 1, 2], max_ngram=2) == ([7, 4, 1], 2)
    assert lookup([1, 2, 3, 4]) == ([], 0)  # nothing repeats
    assert lookup([1, 2, 3, 1]) == ([2, 3, 1], 1)  # a span may run into the suffix itself
    assert lookup([1, 2, 3, 1], max_tokens=1) == ([2], 1)
    assert lookup([7, 0, 0, 0]) == ([0, 0, 0], 2)  # a repeat continues periodically, not cut at the end
    assert lookup([7, 4, 5, 4, 5, 4], max_tokens=5) == ([5, 4, 5, 4, 5], 3)
    assert lookup([5, 1, 2, 0, 3, 1, 9, 0, 1], eos_token_id=[9]) == ([2, 0, 3], 1)  # "1 9…" cut empty: next match
    assert lookup([5, 1, 2, 0, 3, 1, 4, 9, 1], eos_token_id=9) == ([4], 1)  # cut before the eos
    no_sevens = LogitsProcessorList([NoBadWordsLogitsProcessor([[7]], eos_token_id=None)])
    assert lookup([1, 6, 7, 3, 1], logits_processor=no_sevens, vocab_size=10) == ([6], 1)
    with pytest.raises(ValueError, match="max_ngram > 0"):
        ContextLookup(max_tokens=4, max_ngram=0)
