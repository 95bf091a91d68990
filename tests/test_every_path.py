"""The three ways a Domino draft decodes agree on what a user sees: one prompt (transformers' loop), a left-padded
batch (the batched verify loop) and a draft tree (`use_draft_tree=True`, the same loop at one row).

Each test runs every path: output lengths at the smallest `max_new_tokens`, seeded sampling that repeats in one
process and across fresh processes, every drafting setting honoured (or refused by name), `use_cache=False` refused,
and `last_generation_stats.per_row` present whatever the batch size.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import fit_tiny_draft, isolated_python_prelude, make_tiny_draft, make_tiny_target, tiny_prompts

from domino_hf.modeling import tree_domino
from domino_hf.modeling.batch_policy_domino import BatchPolicy
from domino_hf.modeling.cost_domino import VerifyCost
from domino_hf.modeling.hybrid_domino import SourceChooser
from domino_hf.modeling.proposer_domino import DominoProposer

pytestmark = pytest.mark.usefixtures("single_thread")

PATHS = ("one", "batch", "tree")
REPEATING = torch.tensor([[1, 2, 5, 4, 0, 5, 2] * 3])  # context spans every step


@pytest.fixture(scope="module")
def pair():
    """A tiny Llama target and a draft fitted to its greedy continuations of six prompts (and the prompts)."""
    target = make_tiny_target("llama")
    draft = make_tiny_draft(target)
    prompts = tiny_prompts(6, length=6)
    fit_tiny_draft(draft, target, prompts)
    return target, draft, prompts


def path_inputs(path: str, prompts) -> tuple[dict, dict]:
    """`generate` inputs and the extra keywords of one path: one prompt, two left-padded prompts, or a tree."""
    if path == "batch":
        ids = torch.zeros(2, 6, dtype=torch.long)
        mask = torch.zeros(2, 6, dtype=torch.long)
        ids[0], mask[0] = prompts[0][0], 1
        ids[1, 2:], mask[1, 2:] = prompts[1][0, :4], 1
        return {"input_ids": ids, "attention_mask": mask}, {}
    return {"input_ids": prompts[0]}, ({"use_draft_tree": True} if path == "tree" else {})


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("new", [1, 2, 3])
def test_the_fewest_new_tokens_are_plain_decodings(pair, path, new):
    target, draft, prompts = pair
    inputs, extra = path_inputs(path, prompts)
    width = inputs["input_ids"].shape[1]
    reference = target.generate(**inputs, do_sample=False, max_new_tokens=new)
    for limit in ({"max_new_tokens": new}, {"max_length": width + new}):
        output = target.generate(**inputs, do_sample=False, assistant_model=draft, **limit, **extra)
        assert output.shape[1] == width + new and output.tolist() == reference.tolist()


def seeded_runs(target, draft, prompts, calls: int = 3) -> dict[str, list]:
    """Each path's sampled output after `torch.manual_seed(0)`, `calls` times in this process."""
    runs = {}
    for path in PATHS:
        inputs, extra = path_inputs(path, prompts)
        runs[path] = []
        for _ in range(calls):
            torch.manual_seed(0)
            output = target.generate(**inputs, do_sample=True, max_new_tokens=24, assistant_model=draft, **extra)
            runs[path].append(output.tolist())
    return runs


def test_seeded_sampling_repeats_in_one_process(pair):
    target, draft, prompts = pair
    for path, outputs in seeded_runs(target, draft, prompts).items():
        assert outputs[0] == outputs[1] == outputs[2], path
    assert draft.last_generation_stats.num_steps > 0


_CHILD = """
import json, torch
from conftest import fit_tiny_draft, make_tiny_draft, make_tiny_target, tiny_prompts
from test_every_path import seeded_runs
torch.set_num_threads(1)
target = make_tiny_target("llama")
draft = make_tiny_draft(target)
prompts = tiny_prompts(6, length=6)
fit_tiny_draft(draft, target, prompts)
print(json.dumps(seeded_runs(target, draft, prompts, calls=1)))
"""


def test_seeded_sampling_repeats_across_processes():
    """Two fresh processes, the same seed: the same tokens on every path (no timing, no earlier call steers them)."""
    tests = Path(__file__).parent
    script = isolated_python_prelude() + f"sys.path.insert(0, {str(tests)!r})\n" + _CHILD
    outputs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert done.returncode == 0, done.stderr[-2000:]
        outputs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize("path", PATHS)
def test_sampling_uses_the_fixed_cost_unless_asked_to_measure(pair, path, monkeypatch):
    """`measure_verify_cost` on every path: sampling measures only when asked (greedy batches and trees measure)."""
    target, draft, prompts = pair
    costs = []
    monkeypatch.setattr(SourceChooser, "__init__", _spy(SourceChooser.__init__, costs))
    inputs, extra = path_inputs(path, prompts)
    for sample, measure, measured in ((True, None, False), (True, True, True), (False, None, path != "one")):
        asked = {} if measure is None else {"measure_verify_cost": measure}
        costs.clear()
        target.generate(**inputs, do_sample=sample, max_new_tokens=6, assistant_model=draft, **extra, **asked)
        assert costs and all(cost.measure is measured for cost in costs), (sample, measure)


def _spy(init, costs):
    def spy(self, max_span, cost=None, *args, **kwargs):
        costs.append(cost)
        init(self, max_span, cost, *args, **kwargs)

    return spy


def domino_tokens(stats) -> list[int]:
    return [d for d, source in zip(stats.drafted, stats.sources) if source == "domino"]


@pytest.mark.parametrize("path", PATHS)
def test_confidence_threshold_is_honoured(pair, path):
    """A threshold no chain probability reaches leaves no draft token to propose, on every path; output unchanged."""
    target, draft, prompts = pair
    inputs, extra = path_inputs(path, prompts)
    reference = target.generate(**inputs, do_sample=False, max_new_tokens=12)
    drafted = []
    for threshold in (0.0, 1.0):
        output = target.generate(**inputs, do_sample=False, max_new_tokens=12, assistant_model=draft,
                                 draft_confidence_threshold=threshold, context_lookup_tokens=0, draft_backoff=False,
                                 **extra)
        assert output.tolist() == reference.tolist()
        drafted.append(sum(domino_tokens(draft.last_generation_stats)))
    assert drafted[0] > 0 and drafted[1] == 0


@pytest.mark.parametrize("path", PATHS)
def test_heuristic_schedule_grows_the_cap(pair, path, monkeypatch):
    """`num_assistant_tokens=1` caps every proposal at one token; with the heuristic schedule the cap grows after
    proposals accepted in full, on every path (a tree's cap is its depth)."""
    target, draft, prompts = pair
    depths = []
    build = DominoProposer.tree
    monkeypatch.setattr(DominoProposer, "tree", lambda self, *a, **k:
                        depths.append(len(a[1])) or build(self, *a, **k))
    monkeypatch.setattr(BatchPolicy, "seconds", lambda self, tokens: 1.0)  # lengths are not cut for their cost
    inputs, extra = path_inputs(path, prompts)
    longest = {}
    for schedule in ("constant", "heuristic"):
        depths.clear()
        target.generate(**inputs, do_sample=False, max_new_tokens=20, assistant_model=draft, num_assistant_tokens=1,
                        num_assistant_tokens_schedule=schedule, context_lookup_tokens=0, draft_backoff=False, **extra)
        longest[schedule] = max(depths) if path == "tree" else max(domino_tokens(draft.last_generation_stats))
    assert longest["constant"] == 1 and longest["heuristic"] > 1


@pytest.mark.parametrize("path", PATHS)
def test_cut_lookup_spans_is_honoured(pair, path, monkeypatch):
    """With a verify cost that grows as fast as the tokens verified, a context span is worth one token alone:
    `cut_lookup_spans=True` sends that one, False the whole span (a tree adds the span as a branch). Once a span
    was accepted in full, the copy under way goes out whole either way."""
    target, draft, _ = pair
    monkeypatch.setattr(VerifyCost, "__call__", lambda self, k: float(k))
    monkeypatch.setattr(BatchPolicy, "seconds", lambda self, tokens: 1.0)
    chains = []
    add = tree_domino.add_chain
    monkeypatch.setattr(tree_domino, "add_chain", lambda tree, chain, probs: chains.append(len(chain))
                        or add(tree, chain, probs))
    ids = REPEATING if path != "batch" else REPEATING.expand(2, -1)
    extra = {"use_draft_tree": True} if path == "tree" else {}
    first = {}
    for cut in (False, True):
        chains.clear()
        target.generate(ids, do_sample=False, max_new_tokens=16, assistant_model=draft, cut_lookup_spans=cut, **extra)
        stats = draft.last_generation_stats
        spans = chains if path == "tree" else [d for d, s in zip(stats.drafted, stats.sources) if s == "lookup"]
        first[cut] = spans[0]
    assert first[False] > 1 and first[True] == 1


def test_a_tree_for_a_batch_is_refused_by_name(pair):
    target, draft, prompts = pair
    inputs, _ = path_inputs("batch", prompts)
    with pytest.raises(ValueError, match="use_draft_tree=True with a batch of 2 prompts.*use_draft_tree=False"):
        target.generate(**inputs, max_new_tokens=4, assistant_model=draft, use_draft_tree=True)


@pytest.mark.parametrize("path", PATHS)
def test_use_cache_false_is_refused_by_name(pair, path):
    target, draft, prompts = pair
    inputs, extra = path_inputs(path, prompts)
    with pytest.raises(ValueError, match="use_cache=False with a Domino draft.*Drop use_cache=False"):
        target.generate(**inputs, max_new_tokens=4, assistant_model=draft, use_cache=False, **extra)


@pytest.mark.parametrize("path", PATHS)
def test_per_row_is_always_present(pair, path):
    target, draft, prompts = pair
    inputs, extra = path_inputs(path, prompts)
    target.generate(**inputs, do_sample=False, max_new_tokens=8, assistant_model=draft, **extra)
    stats = draft.last_generation_stats
    assert len(stats.per_row) == len(inputs["input_ids"])
    assert sum(sum(row.accepted) for row in stats.per_row) == sum(stats.accepted)


def found_spans(monkeypatch) -> list:
    """Every span the proposer finds from here on, on any path (`DominoProposer.find_spans`)."""
    found = []
    find = DominoProposer.find_spans
    monkeypatch.setattr(DominoProposer, "find_spans", lambda self, *a, **k: found.extend(spans := find(self, *a, **k))
                        or spans)
    return found


def repeating_inputs(path: str) -> tuple[dict, dict]:
    """A prompt whose context has spans every step, on one path."""
    ids = REPEATING if path != "batch" else REPEATING.expand(2, -1)
    return {"input_ids": ids}, ({"use_draft_tree": True} if path == "tree" else {})


@pytest.mark.parametrize("path", PATHS)
def test_context_lookup_settings_are_honoured(pair, path, monkeypatch):
    """`context_lookup_tokens` (0: no context span; n: none longer than n) and `context_lookup_ngram` (no match
    longer than it) on every path."""
    target, draft, _ = pair
    found = found_spans(monkeypatch)
    inputs, extra = repeating_inputs(path)
    by_setting = {}
    for asked in ({}, {"context_lookup_tokens": 0}, {"context_lookup_tokens": 3}, {"context_lookup_ngram": 1}):
        found.clear()
        target.generate(**inputs, do_sample=False, max_new_tokens=12, assistant_model=draft, **asked, **extra)
        by_setting[tuple(asked.items())] = [span for span in found if span.source == "lookup"]
    default, off, short, unigram = by_setting.values()
    assert max(len(span.tokens) for span in default) > 3 and max(span.ngram for span in default) > 1
    assert off == []
    assert short and max(len(span.tokens) for span in short) <= 3
    assert unigram and {span.ngram for span in unigram} == {1}


@pytest.mark.parametrize("path", PATHS)
def test_suffix_cache_settings_are_honoured(pair, path, monkeypatch):
    """`use_suffix_cache` (False: no cache span even with a store passed; True: spans from it) and
    `suffix_cache_max_span` (no cache span longer) on every path."""
    from domino_hf import SuffixCache

    target, draft, _ = pair
    found = found_spans(monkeypatch)
    inputs, extra = repeating_inputs(path)
    store = SuffixCache(max_tokens=4096)
    store.add(REPEATING[0].tolist() * 3)
    by_setting = {}
    for asked in ({"use_suffix_cache": False}, {"use_suffix_cache": True},
                  {"use_suffix_cache": True, "suffix_cache_max_span": 2}):
        found.clear()
        target.generate(**inputs, do_sample=False, max_new_tokens=12, assistant_model=draft, suffix_cache=store,
                        context_lookup_tokens=0, **asked, **extra)
        by_setting[tuple(asked.items())] = [span for span in found if span.source == "cache"]
    off, on, short = by_setting.values()
    assert off == [] and max(len(span.tokens) for span in on) > 2
    assert short and max(len(span.tokens) for span in short) <= 2


def proposal_depths(path: str, monkeypatch) -> list:
    """The deepest proposed token of every step from here on: a chain's length, a tree step's deepest node."""
    depths = []
    if path == "tree":
        step = tree_domino.TreeSteps.step
        monkeypatch.setattr(tree_domino.TreeSteps, "step", lambda self, *a, **k:
                            depths.append((done := step(self, *a, **k)).depth) or done)
    return depths


@pytest.mark.parametrize("path", PATHS)
def test_max_draft_tokens_caps_every_proposal(pair, path, monkeypatch):
    """`max_draft_tokens=2`: no step proposes past its second token, block or span, on every path."""
    target, draft, _ = pair
    depths = proposal_depths(path, monkeypatch)
    inputs, extra = repeating_inputs(path)
    deepest = []
    for cap in (None, 2):
        depths.clear()
        target.generate(**inputs, do_sample=False, max_new_tokens=16, assistant_model=draft, max_draft_tokens=cap,
                        **extra)
        deepest.append(max(depths if path == "tree" else draft.last_generation_stats.drafted))
    assert deepest[0] > 2 and deepest[1] == 2


@pytest.mark.parametrize("path", PATHS)
def test_draft_backoff_is_honoured(pair, path):
    """A draft that never fits: with `draft_backoff` it is paused on some steps, with `draft_backoff=False` it runs
    on every step that has room for a draft token (all but the last ones), on every path; the output is the
    target's either way."""
    target, _, prompts = pair
    unfitted = make_tiny_draft(target, seed=3)
    inputs, extra = path_inputs(path, prompts)
    reference = target.generate(**inputs, do_sample=False, max_new_tokens=30)
    runs = {}
    for backoff in (True, False):
        output = target.generate(**inputs, do_sample=False, max_new_tokens=30, assistant_model=unfitted,
                                 draft_backoff=backoff, context_lookup_tokens=0, **extra)
        assert output.tolist() == reference.tolist()
        runs[backoff] = unfitted.last_generation_stats.draft_runs
    assert sum(runs[True]) < sum(runs[False]) and all(runs[False][:-2])


@pytest.mark.parametrize("sample", [False, True])
def test_the_chain_weighs_its_block_by_what_it_expects_when_sampling_too(pair, sample, monkeypatch):
    """One prompt's chain weighs a context span against the draft's expectation for its block (the proposer's
    `Proposal.expected`), greedy or sampling: never 0 for a block the draft is sure of."""
    target, draft, _ = pair
    weighed = []
    choose = SourceChooser.choose
    monkeypatch.setattr(SourceChooser, "choose", lambda self, domino, *a: weighed.append(domino)
                        or choose(self, domino, *a))
    torch.manual_seed(0)
    target.generate(REPEATING, do_sample=sample, max_new_tokens=16, assistant_model=draft, draft_backoff=False)
    assert weighed and max(weighed) > 0
