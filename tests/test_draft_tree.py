"""Draft trees (`use_draft_tree=True`): a single greedy prompt verifies the block's likeliest branches, grown by the
Domino head, in one forward with a tree mask; the output must stay token-identical to the target alone, and sampled
outputs must follow the target's distribution (chi-square, with a negative control).

Tiny random fp32 targets of five architectures (Gemma3's sliding window included) with drafts fitted to their
greedy continuations; the tree's pieces (mask, acceptance walk, budget, a span as a branch) on hand-built trees.
"""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_ARCHS, tiny_prompts
from test_sampling import NEW_TOKENS, PROMPT, chi_square_pvalue, exact_distribution
from transformers import (
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
)
from transformers.generation.streamers import BaseStreamer

from domino_hf.modeling.batch_policy_domino import BatchPolicy
from domino_hf.modeling.tree_domino import (
    DraftTree,
    add_chain,
    path_keys,
    prefix,
    tree_budget,
    tree_mask,
)

pytestmark = pytest.mark.usefixtures("single_thread")


def small_tree() -> DraftTree:
    """anchor ─ a(0) ─ c(2)        nodes in verify order, parents by index
              └ b(1) ─ d(3) ─ e(4)"""
    return DraftTree(torch.tensor([5, 6, 7, 8, 9]), torch.tensor([-1, -1, 0, 1, 3]), torch.tensor([1, 1, 2, 2, 3]),
                     torch.tensor([0.6, 0.3, 0.5, 0.2, 0.1]))


def test_tree_mask_sees_ancestors_only():
    mask = tree_mask(small_tree())
    # rows/columns: anchor, a, b, c, d, e
    assert mask[3].tolist() == [True, True, False, True, False, False]  # c: anchor, a, itself
    assert mask[5].tolist() == [True, False, True, False, True, True]  # e: anchor, b, d, itself
    assert mask[0].tolist() == [True, False, False, False, False, False]


def test_prefix_keeps_ancestors_and_a_span_branch_merges():
    tree = add_chain(small_tree(), [6, 8, 2], [0.9, 0.8, 0.7])  # shares b and d, adds a new leaf under d
    probs = dict(zip(tree.tokens.tolist(), tree.probs.tolist()))
    assert probs[6] == pytest.approx(0.9) and probs[8] == pytest.approx(0.8) and probs[2] == pytest.approx(0.7)
    top = prefix(tree, 3)  # b, d and the span's leaf: the three likeliest, an ancestor-closed subtree
    assert sorted(top.tokens.tolist()) == [2, 6, 8]
    for node, parent in enumerate(top.parents.tolist()):
        assert parent < node  # ancestors first


def test_path_keys_name_a_node_across_merges_and_prefixes():
    """The draft's calibration compares its own probabilities with what was accepted on its own nodes: a node is
    found again by its token path after a span merged into the tree and the tree was cut."""
    raw = small_tree()
    assert path_keys(raw) == [(5,), (6,), (5, 7), (6, 8), (6, 8, 9)]
    cut = prefix(add_chain(raw, [6, 8, 2], [0.9, 0.8, 0.7]), 3)
    own = dict(zip(path_keys(raw), raw.probs.tolist()))
    keys = path_keys(cut)
    assert sorted(keys) == [(6,), (6, 8), (6, 8, 2)]
    assert sum(own.get(key, 0.0) for key in keys) == pytest.approx(0.3 + 0.2)  # the draft's own, not the span's


def test_budget_grows_with_cheap_verifies():
    tree = small_tree()
    flat = tree_budget(tree, lambda tokens: 1.0, room=10)
    steep = tree_budget(tree, lambda tokens: 1.0 + 0.5 * tokens, room=10)
    assert flat == 5 and steep < flat
    assert tree_budget(tree, lambda tokens: 1.0, room=1) == 2  # depth-2 nodes cannot be verified


def chain_loop(stats) -> bool:
    """Whether the call ran transformers' chain loop: its one row's stats are the call's own (the tree loop keeps
    a record per row)."""
    return len(stats.per_row) == 1 and stats.per_row[0] is stats


@pytest.fixture
def flat_cost(monkeypatch):
    """Every forward costs the same: the tree is verified whole each step."""
    monkeypatch.setattr(BatchPolicy, "seconds", lambda self, tokens: 1.0)


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_tree_is_lossless_and_branches(arch, fitted_pair, flat_cost):
    target, draft, prompts = fitted_pair(arch)
    branched = accepted = 0
    for ids in prompts[:3] + tiny_prompts(2, length=9, seed=9):
        reference = target.generate(ids, do_sample=False, max_new_tokens=20)
        output = target.generate(ids, do_sample=False, max_new_tokens=20, assistant_model=draft, use_draft_tree=True)
        assert output.tolist() == reference.tolist()
        stats = draft.last_generation_stats
        branched += sum(d > draft.config.num_draft_tokens for d in stats.drafted)  # more nodes than a chain holds
        accepted += sum(stats.accepted)
    assert branched and accepted


def test_span_alone_skips_the_draft_while_copying(fitted_pair, flat_cost):
    """Where the target repeats its context, some steps send the lookup span alone without running the draft (as
    the chain does), others still draft a tree; the output stays identical."""
    target, draft, prompts = fitted_pair("llama")
    span_only = runs = 0
    for ids in prompts[:3]:
        reference = target.generate(ids, do_sample=False, max_new_tokens=60)
        output = target.generate(ids, do_sample=False, max_new_tokens=60, assistant_model=draft, use_draft_tree=True)
        assert output.tolist() == reference.tolist()
        stats = draft.last_generation_stats
        span_only += stats.num_steps - sum(stats.draft_runs)
        runs += sum(stats.draft_runs)
    assert span_only > 0 and runs > 0


def test_tree_with_processors_stop_criteria_and_streamer(fitted_pair, flat_cost):
    target, draft, prompts = fitted_pair("qwen2")

    class Stream(BaseStreamer):
        def __init__(self):
            self.tokens = []

        def put(self, value):
            self.tokens.extend(value.reshape(-1).tolist())

        def end(self):
            pass

    class StopAt(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return input_ids[:, -1] == 7

    ids = prompts[1]
    kwargs = dict(do_sample=False, max_new_tokens=20, repetition_penalty=1.2, no_repeat_ngram_size=3,
                  stopping_criteria=StoppingCriteriaList([StopAt()]))
    reference = target.generate(ids, **kwargs)
    stream = Stream()
    output = target.generate(ids, assistant_model=draft, use_draft_tree=True, streamer=stream, **kwargs)
    assert output.tolist() == reference.tolist()
    assert stream.tokens == output[0].tolist()


def test_off_keeps_the_chain(fitted_pair):
    target, draft, prompts = fitted_pair("llama")
    target.generate(prompts[0], do_sample=False, max_new_tokens=8, assistant_model=draft)
    assert chain_loop(draft.last_generation_stats)
    target.generate(prompts[0], do_sample=True, max_new_tokens=8, assistant_model=draft, use_draft_tree=False)
    assert chain_loop(draft.last_generation_stats)
    with pytest.raises(ValueError, match="use_draft_tree"):
        target.generate(prompts[0], max_new_tokens=4, assistant_model=draft, use_draft_tree="yes")


def sample_tree(target, draft, n, seed, **kwargs):
    """Counts of PROMPT's continuations over `n` sampled calls with draft trees; the calls that verified more nodes
    in a step than a chain holds; tokens accepted."""
    from collections import Counter

    torch.manual_seed(seed)
    counts, nodes, accepted = Counter(), 0, 0
    for _ in range(n):
        out = target.generate(PROMPT, do_sample=True, max_new_tokens=NEW_TOKENS, assistant_model=draft,
                              use_draft_tree=True, **kwargs)
        counts[tuple(out[0, PROMPT.shape[1] :].tolist())] += 1
        stats = draft.last_generation_stats
        assert not chain_loop(stats)  # the tree loop
        nodes += max(stats.drafted) > draft.config.num_draft_tokens
        accepted += sum(stats.accepted)
    return counts, nodes, accepted


@pytest.mark.parametrize("warpers", [{}, {"temperature": 0.7, "top_k": 4}])
def test_sampling_trees_are_exact(sampling_pair, flat_cost, warpers):
    target, draft = sampling_pair
    counts, branched, accepted = sample_tree(target, draft, 500, seed=2, **warpers)
    assert branched and accepted  # branched trees, some of them accepted
    processors = LogitsProcessorList()
    if warpers:
        processors = LogitsProcessorList([TemperatureLogitsWarper(0.7), TopKLogitsWarper(4)])
    assert chi_square_pvalue(counts, exact_distribution(target, processors)) > 1e-3


def test_sampling_check_catches_a_bonus_from_the_whole_distribution(sampling_pair, flat_cost, monkeypatch):
    """Teeth: drawing the bonus from the target's whole distribution, rejected children included, is biased."""
    from domino_hf.modeling import tree_domino

    original = tree_domino.accept_tree

    def careless(tokens, parents, logits, do_sample=False):
        path, bonus = original(tokens, parents, logits, do_sample)
        return path, int(torch.multinomial(logits[path[-1] + 1 if path else 0].softmax(dim=-1), 1))

    monkeypatch.setattr(tree_domino, "accept_tree", careless)
    target, draft = sampling_pair
    counts, _, _ = sample_tree(target, draft, 500, seed=2)
    assert chi_square_pvalue(counts, exact_distribution(target, LogitsProcessorList())) < 1e-6


def test_attention_without_tree_masks_verifies_the_chain(fitted_pair, caplog):
    """An attention implementation the tree mask cannot go through (a custom one registered by the user): the chain,
    said once in the log, output unchanged."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register("user_attention", sdpa_attention_forward)  # the user's kernel and its mask
    AttentionMaskInterface.register("user_attention", sdpa_mask)
    target, draft, prompts = fitted_pair("qwen2")
    plain = target.generate(prompts[0], do_sample=False, max_new_tokens=8)
    saved = target.config._attn_implementation
    target.config._attn_implementation = "user_attention"
    try:
        with caplog.at_level("WARNING"):
            for _ in range(2):
                out = target.generate(prompts[0], do_sample=False, max_new_tokens=8, assistant_model=draft,
                                      use_draft_tree=True)
                assert out.tolist() == plain.tolist()
                assert chain_loop(draft.last_generation_stats)
    finally:
        target.config._attn_implementation = saved
    said = [r for r in caplog.records if "use_draft_tree needs attention" in r.getMessage()]
    assert len(said) == 1 and "'user_attention'" in said[0].getMessage()
