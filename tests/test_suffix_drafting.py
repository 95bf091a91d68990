"""The suffix cache as a drafting source: spans from earlier generations, chosen before any draw. Greedy identity
on five architectures, exact sampling with the cache chosen (and a negative control), the switch (off = no cache
at all), per-call and draft-level stores, the generate keywords, and the draft skipped where spans win."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import make_tiny_draft, make_tiny_target
from test_sampling import PROMPT, chi_square_pvalue, exact_distribution, make_sampling_target, peaked_draft, sample
from transformers import LogitsProcessorList

from domino_hf import DominoCandidateGenerator, SuffixCache

pytestmark = pytest.mark.usefixtures("single_thread")

ARCHS = ["llama", "qwen2", "qwen3", "gemma3", "mistral"]


def question(vocab_size: int, seed: int) -> torch.Tensor:
    """A fixed preamble, then a short random question: as an evaluation run sends them."""
    preamble = torch.arange(2, 14) % vocab_size
    tail = torch.randint(0, vocab_size, (4,), generator=torch.Generator().manual_seed(seed))
    return torch.cat([preamble, tail])[None]


def generate(target, draft, ids, **kwargs):
    kwargs.setdefault("max_new_tokens", 24)
    return target.generate(ids, do_sample=False, assistant_model=draft, **kwargs)


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_identity_with_the_cache_chosen(arch, fitted_pair):
    target, draft, _ = fitted_pair(arch, vocab_size=32)
    store = SuffixCache(max_tokens=4096)
    sources = []
    for seed in [0, 1, 2, 0, 1, 2]:  # the second pass repeats the first: its answers are in the store
        ids = question(32, seed)
        reference = target.generate(ids, do_sample=False, max_new_tokens=24)
        output = generate(target, draft, ids, use_suffix_cache=True, suffix_cache=store)
        assert output.tolist() == reference.tolist()
        sources += draft.last_generation_stats.sources
    assert store.num_sequences_added == 6
    assert sources.count("cache") >= 3


def test_off_is_drafting_without_a_cache(fitted_pair):
    """`use_suffix_cache=False` proposes exactly what a draft that never had a cache proposes, and adds nothing."""
    target, draft, _ = fitted_pair("llama", vocab_size=32)
    fresh = copy.deepcopy(draft)
    store = SuffixCache(max_tokens=4096)
    ids = question(32, 0)
    generate(target, draft, ids, use_suffix_cache=True, suffix_cache=store)
    added = store.num_tokens
    off = generate(target, draft, ids, use_suffix_cache=False, suffix_cache=store)
    stats = draft.last_generation_stats
    assert store.num_tokens == added and "cache" not in stats.sources
    never = generate(target, fresh, ids)  # the fixture's drafts default to no cache
    assert off.tolist() == never.tolist()
    assert (stats.sources, stats.drafted, stats.accepted) == (
        fresh.last_generation_stats.sources, fresh.last_generation_stats.drafted, fresh.last_generation_stats.accepted
    )


def test_the_drafts_own_store_is_the_default_and_on_by_default():
    target = make_tiny_target("llama", vocab_size=32)
    draft = make_tiny_draft(target)
    del draft.generation_config.use_suffix_cache  # the shipped default
    assert draft.suffix_cache.num_tokens == 0 and draft.suffix_cache.max_tokens == 1_000_000
    ids = question(32, 3)
    out = generate(target, draft, ids)
    assert draft.suffix_cache.sequences() == [out[0].tolist()]
    generate(target, draft, ids)
    assert "cache" in draft.last_generation_stats.sources
    copied = copy.deepcopy(draft)  # a copy starts empty and fills its own store
    assert copied.suffix_cache.num_tokens == 0 and draft.suffix_cache.num_sequences_added == 2
    draft.generation_config.suffix_cache_size = 500  # read when the draft's store is created
    assert copy.deepcopy(draft).suffix_cache.max_tokens == 500
    draft.suffix_cache.clear()
    assert draft.suffix_cache.num_tokens == 0
    with pytest.raises(TypeError, match="SuffixCache"):
        draft.suffix_cache = {}
    draft.suffix_cache = store = SuffixCache(max_tokens=1000)
    generate(target, draft, ids)
    assert store.num_sequences_added == 1


def test_seeded_sampling_repeats_itself_call_after_call(fitted_pair):
    """Unset (the shipped default), `use_suffix_cache` is on for greedy calls only: a sampling call neither reads
    nor fills the draft's store, so the same seed gives the same tokens call after call. `use_suffix_cache=True`
    reads the store when sampling too (exact: `test_sampling_with_the_cache_chosen_is_exact`)."""
    target, draft, _ = fitted_pair("llama", vocab_size=32)
    del draft.generation_config.use_suffix_cache  # the shipped default
    ids = question(32, 8)
    generate(target, draft, ids)  # an earlier greedy call: its answer is in the store
    runs, sources = [], []
    for _ in range(3):
        torch.manual_seed(0)
        runs.append(target.generate(ids, do_sample=True, temperature=0.7, max_new_tokens=24, assistant_model=draft))
        sources += draft.last_generation_stats.sources
    assert runs[0].tolist() == runs[1].tolist() == runs[2].tolist()
    assert "cache" not in sources
    assert draft.suffix_cache.num_sequences_added == 1  # the greedy call only
    generate(target, draft, ids)
    assert "cache" in draft.last_generation_stats.sources and draft.suffix_cache.num_sequences_added == 2
    torch.manual_seed(0)
    target.generate(ids, do_sample=True, temperature=0.7, max_new_tokens=24, assistant_model=draft,
                    use_suffix_cache=True)
    assert "cache" in draft.last_generation_stats.sources and draft.suffix_cache.num_sequences_added == 3


def test_generate_keywords_and_config_fields(fitted_pair, tmp_path):
    from transformers import GenerationConfig

    target, draft, _ = fitted_pair("llama", vocab_size=32)
    ids = question(32, 4)
    store = SuffixCache(max_tokens=1000)
    config = GenerationConfig(max_new_tokens=12, do_sample=False, use_suffix_cache=True, suffix_cache=store)
    target.generate(ids, generation_config=config, assistant_model=draft)
    target.generate(ids, generation_config=config, assistant_model=draft)
    assert store.num_sequences_added == 2  # the config's store itself, not a copy of it
    assert "cache" in draft.last_generation_stats.sources
    generate(target, draft, ids, draft_backoff=False, use_suffix_cache=False)  # any drafting setting, per call
    with pytest.raises(ValueError, match="use_suffix_cache.*Domino draft"):
        target.generate(ids, max_new_tokens=4, use_suffix_cache=True)
    with pytest.raises(TypeError, match="suffix_cache must be a SuffixCache"):
        generate(target, draft, ids, use_suffix_cache=True, suffix_cache=[1, 2])
    with pytest.raises(ValueError, match="suffix_cache_max_span"):
        generate(target, draft, ids, use_suffix_cache=True, suffix_cache_max_span=0)
    store.save(tmp_path / "store.json")  # saved, loaded, used
    loaded = SuffixCache.load(tmp_path / "store.json")
    generate(target, draft, ids, max_new_tokens=12, use_suffix_cache=True, suffix_cache=loaded)
    assert "cache" in draft.last_generation_stats.sources


def test_cache_spans_stop_at_eos_and_stop_strings(fitted_pair):
    target, draft, _ = fitted_pair("llama", vocab_size=32)
    ids = question(32, 5)
    reference = target.generate(ids, do_sample=False, max_new_tokens=20)[0, ids.shape[1]:].tolist()
    eos = reference[6]
    store = SuffixCache(max_tokens=1000)
    store.add(ids[0].tolist() + reference)  # the whole answer, eos token included
    out = generate(target, draft, ids, max_new_tokens=20, eos_token_id=eos, use_suffix_cache=True,
                   suffix_cache=store, prompt_lookup_num_tokens=0)
    expected = target.generate(ids, do_sample=False, max_new_tokens=20, eos_token_id=eos)
    assert out.tolist() == expected.tolist()
    stats = draft.last_generation_stats
    assert "cache" in stats.sources and max(stats.drafted) <= 6  # no span crosses the eos token


def test_the_draft_is_skipped_where_spans_win(fitted_pair, monkeypatch):
    """Repeated answers come from the store without the draft's forward on most steps: the draft runs only while
    it might beat the span, then on probes."""
    target, draft, _ = fitted_pair("llama", vocab_size=32)
    store = SuffixCache(max_tokens=4096)
    ids = question(32, 6)
    generate(target, draft, ids, max_new_tokens=48, use_suffix_cache=True, suffix_cache=store)
    calls = []
    original = DominoCandidateGenerator._backbone
    monkeypatch.setattr(DominoCandidateGenerator, "_backbone", lambda self, *a: calls.append(1) or original(self, *a))
    generate(target, draft, ids, max_new_tokens=48, use_suffix_cache=True, suffix_cache=store)
    stats = draft.last_generation_stats
    assert stats.tau > 3 and stats.source_counts()["cache"] >= stats.num_steps - 1
    assert len(calls) <= stats.num_steps / 2


def test_run_gain_pauses_the_draft_on_span_steps_and_probes():
    from domino_hf.modeling.hybrid_domino import SourceChooser, Span, _Step

    chooser = SourceChooser(max_span=8)
    span = Span([1, 2, 3, 4], 8, "cache")
    chooser.domino_average = 3.0  # blocks do well on average: the history rule alone would run the draft
    assert not chooser.span_first(span)
    for _ in range(3):  # the draft ran (its block as good), the span was sent: running the draft was pure cost
        chooser.update(_Step(4, "cache", None, torch.tensor([1, 2, 3]), True, (span,)), 3, 3, [1, 2, 3, 5])
    assert chooser.run_gain[span.bucket] < 0
    decisions = [chooser.span_first(span) for _ in range(12)]
    probes = [i for i, skip in enumerate(decisions) if not skip]
    assert probes == [0, 2, 5, 10]  # the draft runs on probes 1, 2, 4 … skipped steps apart
    other = Span([1, 2], 2, "lookup")  # another kind of span has its own record
    assert not chooser.span_first(other)
    chooser.update(_Step(4, "domino", 1.0, None, True, (span,)), 4, None, [1, 7, 7, 7, 7])  # the draft won big
    chooser.update(_Step(4, "domino", 1.0, None, True, (span,)), 4, None, [1, 7, 7, 7, 7])
    assert chooser.run_gain[span.bucket] >= 0 and not chooser.span_first(span)


def test_better_span_prefers_the_one_expected_to_give_more():
    from domino_hf.modeling.hybrid_domino import SourceChooser, Span

    chooser = SourceChooser(max_span=24)
    weak_context, long_cache = Span([1] * 10, 1, "lookup"), Span([2] * 24, 20, "cache")
    assert chooser.better_span(weak_context, long_cache) is long_cache
    assert chooser.better_span(None, weak_context) is weak_context and chooser.better_span(None, None) is None
    assert long_cache.bucket == ("cache", 16) and Span([1], 5, "cache").bucket == ("cache", 4)
    assert Span([1], 2, "cache").bucket == ("cache", 2) and Span([1], 7, "lookup").bucket == ("lookup", 3)
    assert 1 <= chooser.span_length(long_cache) <= 24  # cache spans are cut to what pays for its verify


@pytest.fixture(scope="module")
def target():
    """The sampling tests' target (test_sampling.py): its exact distribution is computable."""
    return make_sampling_target()


def cache_steps(target, draft, store, n, seed):
    torch.manual_seed(seed)
    steps = 0
    for _ in range(n):
        target.generate(PROMPT, do_sample=True, max_new_tokens=4, assistant_model=draft, use_suffix_cache=True,
                        suffix_cache=store, prompt_lookup_num_tokens=0)
        steps += draft.last_generation_stats.source_counts()["cache"]
    return steps


def sampling_store() -> SuffixCache:
    """Earlier 'answers' to PROMPT: every continuation the store proposes has a match to the prompt's end."""
    store = SuffixCache(max_tokens=4096)
    for continuation in ([0, 1, 2, 3], [5, 5, 1, 0], [0, 1, 4, 4], [3, 2, 1, 0]):
        store.add(PROMPT[0].tolist() + continuation)
    return store


def test_sampling_with_the_cache_chosen_is_exact(target):
    draft = peaked_draft(target)
    store = sampling_store()
    assert cache_steps(target, draft, store, 30, seed=9) > 10
    counts, drafted, accepted = sample(target, 700, seed=11, assistant_model=draft, use_suffix_cache=True,
                                       suffix_cache=store, prompt_lookup_num_tokens=0)
    assert 0 < accepted < drafted
    assert chi_square_pvalue(counts, exact_distribution(target, LogitsProcessorList())) > 1e-3


@pytest.mark.integration  # hundreds of sampled generations: the full suite
def test_wrong_cache_q_is_caught(target, monkeypatch):
    """Teeth: claiming a uniform q for cache tokens (instead of one-hot) biases the output, and the test sees it."""
    original = DominoCandidateGenerator._propose_lookup

    def uniform_q(self, input_ids, span, *args, **kwargs):
        ids, logits = original(self, input_ids, span, *args, **kwargs)
        return ids, None if logits is None else torch.zeros_like(logits)

    monkeypatch.setattr(DominoCandidateGenerator, "_propose_lookup", uniform_q)
    draft = peaked_draft(target)
    store = sampling_store()
    assert cache_steps(target, draft, store, 30, seed=9) > 10
    counts, _, _ = sample(target, 700, seed=11, assistant_model=draft, use_suffix_cache=True, suffix_cache=store,
                          prompt_lookup_num_tokens=0)
    assert chi_square_pvalue(counts, exact_distribution(target, LogitsProcessorList())) < 1e-6


def test_the_store_keeps_its_span_history_across_calls(fitted_pair):
    """A call starts from what the store's spans were worth in the last call, not from the priors; `clear()`
    forgets it with the contents."""
    from domino_hf.modeling.hybrid_domino import CACHE_START_RATES, SourceChooser

    target, draft, _ = fitted_pair("llama", vocab_size=32)
    store = SuffixCache(max_tokens=4096)
    assert store.span_history == {}
    for _ in range(2):
        generate(target, draft, question(32, 7), use_suffix_cache=True, suffix_cache=store)
    learnt = store.span_history
    assert set(learnt) == {("cache", n) for n in CACHE_START_RATES}
    assert any(h[0] != CACHE_START_RATES[n][0] for (_, n), h in learnt.items())  # the repeat taught it something
    chooser = SourceChooser(max_span=24, history=learnt)
    assert all(chooser.spans[bucket].h == h[:24] for bucket, h in learnt.items())
    store.clear()
    assert store.span_history == {}


class _BareStore:
    """A store of the user's own: `add`, `lookup` and `max_match` delegated to a SuffixCache, no span history."""

    def __init__(self):
        self._cache = SuffixCache(max_tokens=4096)
        self.max_match = self._cache.max_match

    def add(self, tokens):
        self._cache.add(tokens)

    def lookup(self, context, max_tokens):
        return self._cache.lookup(context, max_tokens)


def test_a_store_without_span_history_starts_from_the_priors(fitted_pair):
    """A duck-typed store is taken (the same check as `draft.suffix_cache`'s setter), its spans are used, and a
    call keeps no history for it rather than writing into a throwaway dict."""
    from domino_hf.modeling.hybrid_domino import store_history
    from domino_hf.modeling.suffix_domino import is_suffix_cache

    target, draft, _ = fitted_pair("llama", vocab_size=32)
    store = _BareStore()
    assert is_suffix_cache(store) and not is_suffix_cache(object()) and store_history(store) is None
    plain = target.generate(question(32, 3), do_sample=False, max_new_tokens=24)
    for _ in range(2):
        out = generate(target, draft, question(32, 3), use_suffix_cache=True, suffix_cache=store)
        assert torch.equal(out, plain)
    assert draft.last_generation_stats.source_counts().get("cache", 0) > 0
    assert not hasattr(store, "span_history")
    draft.suffix_cache = store  # the setter takes what the per-call check takes
    assert draft.suffix_cache is store
