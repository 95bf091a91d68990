# Copyright 2026 The domino-hf authors. Licensed under the Apache License, Version 2.0.
"""Acceptance: which proposed tokens the target keeps, and its bonus token, for every verify loop.

Remote-code file (torch + transformers only). Pure functions over rows; the loops hand them the target's processed
logits (its logits processors and warpers already applied at every verified position) and what was proposed:

    chain, greedy     the target's argmax at each position; drafts kept while they match (`greedy_match`)
    chain, sampling   speculative sampling: draft token d_j kept with probability min(1, p(d_j) / q(d_j)), the
                      first rejected slot's token drawn from the residual max(p - q, 0), or after a fully accepted
                      proposal the bonus drawn from p (`accept_chain`)
    tree, greedy      walk from the anchor to the child holding the target's choice (`accept_tree`)
    tree, sampling    recursive rejection over siblings: each child accepted with its probability under what is
                      left of p, else removed from it; the bonus drawn from what is left (`accept_tree`)

A proposal's q is the draft's processed distribution, or one-hot for a span (fixed given the context). Every
decision is a function of the proposal and the target's distributions and of the random numbers drawn here, in a
fixed order (one uniform per row and slot, then one bonus draw per row; per child, then one bonus draw, for a tree),
so a seeded call repeats itself and every emitted token follows the target's distribution exactly.
"""

from __future__ import annotations

import torch


def greedy_match(step_ids: torch.Tensor, choice: torch.Tensor, proposed: torch.Tensor) -> torch.Tensor:
    """(b,) draft tokens accepted per row: `step_ids` (b, q) is [anchor, d_1 … d_{q-1}], `choice` (b, q) the target's
    token after each of them, `proposed` (b,) how many of each row's drafts count (the rest are padding)."""
    slot = torch.arange(step_ids.shape[1] - 1, device=step_ids.device)[None, :]
    match = (step_ids[:, 1:] == choice[:, :-1]) & (slot < proposed[:, None])
    return match.long().cumprod(dim=1).sum(dim=1)


def accept_chain(target_logits: torch.Tensor, step_ids: torch.Tensor, proposed: torch.Tensor,
                 draft_logits: torch.Tensor | None = None, do_sample: bool = False):
    """Acceptance of a chain per row.

    Args:
        target_logits (`torch.Tensor` of shape `(b, q, V)`): the target's processed logits after the anchor and
            after each proposed token.
        step_ids (`torch.LongTensor` of shape `(b, q)`): the anchor and the proposed tokens.
        proposed (`torch.LongTensor` of shape `(b,)`): proposed tokens per row; slots past a row's count are
            never accepted.
        draft_logits (`torch.Tensor` of shape `(b, q - 1, V)`, *optional*): the processed logits each row's tokens
            were drawn from (its q), needed when sampling with q > 1.
        do_sample (`bool`, defaults to `False`): speculative sampling instead of exact match.

    Returns:
        `tuple`: tokens (b, q) (the accepted drafts, then the bonus token at index `accepted[i]`) and accepted
        (b,) draft tokens accepted per row.
    """
    b, q, _ = target_logits.shape
    if not do_sample:
        choice = target_logits.argmax(dim=-1)  # (b, q)
        if q == 1:
            return choice, torch.zeros_like(proposed)
        return choice, greedy_match(step_ids, choice, proposed)
    p = target_logits.softmax(dim=-1)
    if q == 1:
        return torch.multinomial(p[:, 0], 1), torch.zeros_like(proposed)
    rows = torch.arange(b, device=target_logits.device)
    valid = torch.arange(q - 1, device=target_logits.device)[None, :] < proposed[:, None]  # (b, q - 1)
    q_probs = draft_logits.softmax(dim=-1)  # (b, q - 1, V)
    drafted = step_ids[:, 1:, None]
    ratio = p[:, :-1].gather(2, drafted)[..., 0] / q_probs.gather(2, drafted)[..., 0]
    accept = (torch.rand_like(ratio) < ratio) & valid
    accepted = accept.long().cumprod(dim=1).sum(dim=1)  # (b,)
    target_next = p[rows, accepted]  # (b, V)
    draft_next = q_probs[rows, accepted.clamp(max=q - 2)]
    residual = (target_next - draft_next).clamp(min=0)
    rejected = (accepted < proposed)[:, None] & (residual.sum(dim=-1, keepdim=True) > 0)
    dist = torch.where(rejected, residual, target_next)
    bonus = torch.multinomial(dist / dist.sum(dim=-1, keepdim=True), 1)[:, 0]
    tokens = step_ids.clone()  # (b, q): accepted drafts shifted left, the bonus at `accepted`
    tokens[:, :-1] = step_ids[:, 1:]
    tokens[rows, accepted] = bonus
    return tokens, accepted


def _children(parents: list[int]) -> dict[int, list[int]]:
    """Each node's children (node indices in verify order), the anchor as -1."""
    children: dict[int, list[int]] = {}
    for i, parent in enumerate(parents):
        children.setdefault(parent, []).append(i)
    return children


def accept_tree(tokens: torch.Tensor, parents: torch.Tensor, target_logits: torch.Tensor,
                do_sample: bool = False) -> tuple[list[int], int]:
    """Acceptance of one row's draft tree.

    Args:
        tokens (`torch.LongTensor` of shape `(N,)`): the nodes' target ids, ancestors before descendants.
        parents (`torch.LongTensor` of shape `(N,)`): each node's parent index, -1 for the anchor.
        target_logits (`torch.Tensor` of shape `(1 + N, V)`): the target's processed logits after the anchor and
            after each node.
        do_sample (`bool`, defaults to `False`): multi-branch speculative sampling (SpecInfer's recursive rejection,
            exact for any tree whose shape was fixed before the target answered) instead of the greedy walk.

    Returns:
        `tuple`: the accepted nodes (indices, root to leaf) and the bonus token.
    """
    token_list, children = tokens.tolist(), _children(parents.tolist())
    if not do_sample:
        choice = target_logits.argmax(dim=-1).tolist()
        path, node = [], -1
        while True:
            nxt = next((child for child in children.get(node, []) if token_list[child] == choice[node + 1]), None)
            if nxt is None:
                return path, choice[node + 1]
            path.append(nxt)
            node = nxt
    probs = target_logits.softmax(dim=-1)
    path, node = [], -1
    while True:
        p = probs[node + 1].clone()  # (V,) unnormalised: the target's, less the children rejected so far
        for child in children.get(node, []):
            token = token_list[child]
            if float(torch.rand(())) * float(p.sum()) < float(p[token]):
                break
            p[token] = 0.0
        else:
            return path, int(torch.multinomial(p, 1))
        path.append(child)
        node = child
