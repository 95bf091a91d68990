"""The acceptance module (`acceptance_domino.py`) on hand-made distributions: greedy match lengths, speculative
sampling's emitted tokens following the target's distribution (chi-square, with a negative control that draws the
bonus from the whole distribution), and the tree walk, greedy and sampled."""

from __future__ import annotations

from collections import Counter

import torch
from test_sampling import chi_square_pvalue

from domino_hf.modeling.acceptance_domino import accept_chain, accept_tree, greedy_match

V = 5
P = torch.tensor([[0.10, 0.40, 0.05, 0.25, 0.20], [0.30, 0.10, 0.30, 0.20, 0.10]])  # target after anchor, after d_1
Q = torch.tensor([[0.40, 0.10, 0.30, 0.10, 0.10], [0.20, 0.20, 0.20, 0.20, 0.20]])  # the draft's q at slots 1, 2


def test_greedy_match_counts_the_matching_prefix_within_each_rows_proposal():
    step_ids = torch.tensor([[9, 1, 2, 3], [9, 1, 2, 3], [9, 1, 2, 3], [9, 4, 2, 3]])
    choice = torch.tensor([[1, 2, 3, 7], [1, 2, 0, 7], [1, 2, 3, 7], [1, 2, 3, 7]])
    proposed = torch.tensor([3, 3, 1, 3])
    assert greedy_match(step_ids, choice, proposed).tolist() == [3, 2, 1, 0]


def test_greedy_chain_returns_the_targets_choice_and_the_match():
    logits = torch.full((2, 3, V), -5.0)
    logits[0, torch.arange(3), torch.tensor([1, 2, 4])] = 0.0
    logits[1, torch.arange(3), torch.tensor([3, 2, 4])] = 0.0
    step_ids = torch.tensor([[0, 1, 2], [0, 1, 2]])
    tokens, accepted = accept_chain(logits, step_ids, torch.tensor([2, 2]))
    assert accepted.tolist() == [2, 0]
    assert tokens[0, 2] == 4 and tokens[1, 0] == 3  # the bonus token sits at `accepted`


def sample_chain(n: int, careless: bool = False):
    """`n` rows drafting two tokens from Q, verified against P: the first emitted token per row, and the second
    where the first draft was accepted (it then follows P[1] as well)."""
    torch.manual_seed(0)
    drafts = torch.stack([torch.multinomial(Q[j], n, replacement=True) for j in range(2)], dim=1)  # (n, 2)
    step_ids = torch.cat([torch.zeros(n, 1, dtype=torch.long), drafts], dim=1)
    target = P.log()[None].expand(n, 2, V)
    target = torch.cat([target, target[:, -1:]], dim=1)  # (n, 3, V): after the anchor, d_1, d_2
    tokens, accepted = accept_chain(target, step_ids, torch.full((n,), 2), Q.log()[None].expand(n, 2, V), True)
    if careless:  # the bonus after a rejection drawn from the target's whole distribution, not the residual
        rejected = accepted == 0
        tokens[rejected, 0] = torch.multinomial(P[0], int(rejected.sum()), replacement=True)
    first = Counter((int(t),) for t in tokens[:, 0])
    second = Counter((int(t),) for t in tokens[accepted >= 1, 1])
    return first, second


def test_speculative_sampling_emits_the_targets_distribution():
    first, second = sample_chain(20000)
    assert chi_square_pvalue(first, P[0]) > 1e-3
    assert chi_square_pvalue(second, P[1]) > 1e-3


def test_sampling_check_catches_a_bonus_from_the_whole_distribution():
    first, _ = sample_chain(20000, careless=True)
    assert chi_square_pvalue(first, P[0]) < 1e-6


def test_sampling_a_plain_step_draws_from_the_target():
    torch.manual_seed(0)
    tokens, accepted = accept_chain(P[:1].log()[None].expand(20000, 1, V), None, torch.zeros(20000, dtype=torch.long),
                                    do_sample=True)
    assert accepted.sum() == 0
    assert chi_square_pvalue(Counter((int(t),) for t in tokens[:, 0]), P[0]) > 1e-3


def small_tree():
    """anchor ─ a(0) ─ c(2)        tokens, parents (node indices, -1 the anchor)
              └ b(1) ─ d(3) ─ e(4)"""
    return torch.tensor([5, 6, 7, 8, 9]), torch.tensor([-1, -1, 0, 1, 3])


def one_hot_logits(choice):
    logits = torch.full((len(choice), 10), -9.0)
    logits[torch.arange(len(choice)), torch.tensor(choice)] = 0.0
    return logits


def test_greedy_tree_walk_follows_the_targets_choice():
    tokens, parents = small_tree()
    # target after anchor → 6 (b), after b → 8 (d), after d → 9 (e), after e → 1
    assert accept_tree(tokens, parents, one_hot_logits([6, 0, 8, 0, 9, 1])) == ([1, 3, 4], 1)
    assert accept_tree(tokens, parents, one_hot_logits([5, 3, 0, 0, 0, 0])) == ([0], 3)  # c (7) not chosen after a
    assert accept_tree(tokens, parents, one_hot_logits([4, 0, 0, 0, 0, 0])) == ([], 4)


def test_sampled_tree_walk_emits_the_targets_distribution():
    """Recursive rejection over siblings: the first token emitted after the anchor follows the target's distribution
    whatever the children are, and a child is entered exactly when its token is emitted."""
    tokens, parents = small_tree()  # children of the anchor: a (5), b (6)
    probs = torch.full((6, 10), 0.05)
    probs[0] = torch.tensor([0.0, 0.1, 0.0, 0.0, 0.0, 0.2, 0.5, 0.0, 0.0, 0.2])  # 6 likelier than 5
    torch.manual_seed(0)
    first = Counter()
    for _ in range(4000):
        path, bonus = accept_tree(tokens, parents, probs.log(), do_sample=True)
        assert not path or path[0] in (0, 1)
        assert path or bonus not in (5, 6)  # the bonus after rejecting both children is neither
        first[(int(tokens[path[0]]) if path else bonus,)] += 1
    assert chi_square_pvalue(first, probs[0]) > 1e-3
