# Copyright 2026 The domino-hf authors. Licensed under the Apache License, Version 2.0.
"""Draft trees: more tokens per verify at batch size 1, branched by the Domino head (`batch_domino.py` verifies them).

Remote-code file (torch + transformers only). The backbone gives base logits for every slot of the block in one
parallel forward; what makes slot j depend on the tokens before it is the head (a GRU step and a low-rank logit
correction), which costs microseconds. So a branch at slot j needs only the head's rollout along that branch:

    root = the anchor; each depth d = slot d of the block:
      every frontier node's distribution = base_d + correction(H_d, GRU state along its branch)
      children = each node's top `top_k` tokens; keep the `width` children with the highest path probability
      (the draft's probability of the whole branch), and step the GRU along each kept child
    then keep the nodes with the highest path probability, as many as pays (`tree_budget`): a node's path
    probability never exceeds its parent's, so the kept nodes always form a tree

The target verifies the tree in one forward: every node attends to the cache, the anchor and its own ancestors
(`tree_mask`), at position anchor + depth. Greedy acceptance walks from the anchor to the child holding the target's
choice, as long as there is one; the bonus token is the target's choice at the last accepted node. Sampling walks
the tree by recursive rejection over siblings, exact for any tree whose shape was fixed before the target answered
(both in `acceptance_domino.accept_tree`). A context or suffix-cache span is one more branch (`add_chain`). Trees
are built (`proposer_domino.DominoProposer.tree`) from the draft's distributions and the spans' histories only:
never from a drawn token.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import torch

from .acceptance_domino import accept_tree


class DraftTree(NamedTuple):
    """Tree nodes in verify order (ancestors before descendants), the anchor (root) excluded.

    tokens: (N,) target ids; parents: (N,) the parent's node index, -1 for the anchor; depths: (N,) 1 … n;
    probs: (N,) each node's estimated acceptance probability (path probability, calibrated)."""

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    probs: torch.Tensor

    @property
    def size(self) -> int:
        return len(self.tokens)


def reindexed(tokens, parents, depths, probs, order) -> DraftTree:
    """A tree of the nodes `order` (a list of node indices into the lists `tokens`, `parents`, `depths`, `probs`,
    ancestor-closed) with parents renumbered."""
    position = {node: i for i, node in enumerate(order)}
    return DraftTree(
        torch.tensor([tokens[i] for i in order], dtype=torch.long),
        torch.tensor([position.get(parents[i], -1) if parents[i] >= 0 else -1 for i in order], dtype=torch.long),
        torch.tensor([depths[i] for i in order], dtype=torch.long),
        torch.tensor([probs[i] for i in order], dtype=torch.float),
    )


def empty_tree() -> DraftTree:
    """A tree of no nodes (the anchor alone)."""
    return DraftTree(*(torch.zeros(0, dtype=torch.long) for _ in range(3)), torch.zeros(0))


def scale(tree: DraftTree, factor: float) -> DraftTree:
    """The tree with every node's probability times `factor` (the draft's calibration), capped at 1."""
    return tree._replace(probs=(tree.probs * factor).clamp(max=1.0))


def add_chain(tree: DraftTree, chain: list[int], probs: list[float]) -> DraftTree:
    """The tree with a chain of tokens from the anchor (a span), each with its acceptance probability: a node the
    tree already holds keeps the higher probability, the rest become new nodes. Sorted again by probability."""
    tokens, parents, depths, node_probs = (t.tolist() for t in tree)
    children = {(p, t): i for i, (p, t) in enumerate(zip(parents, tokens))}
    parent = -1
    for depth, (token, prob) in enumerate(zip(chain, probs), start=1):
        node = children.get((parent, token))
        if node is None:
            node = len(tokens)
            tokens.append(token)
            parents.append(parent)
            depths.append(depth)
            node_probs.append(prob)
            children[(parent, token)] = node
        else:
            node_probs[node] = max(node_probs[node], prob)
        parent = node
    for i in range(len(tokens)):  # a child is never likelier than its parent (the span raised some parents)
        if parents[i] >= 0:
            node_probs[i] = min(node_probs[i], node_probs[parents[i]])
    order = sorted(range(len(tokens)), key=lambda i: (-node_probs[i], depths[i]))
    return reindexed(tokens, parents, depths, node_probs, _ancestors_first(order, parents))


def _ancestors_first(order, parents) -> list[int]:
    """`order` with any node moved after its parent (ties in probability)."""
    placed, out = set(), []
    for node in order:
        chain = []
        while node >= 0 and node not in placed:
            chain.append(node)
            node = parents[node]
        for item in reversed(chain):
            placed.add(item)
            out.append(item)
    return out


def prefix(tree: DraftTree, count: int) -> DraftTree:
    """The `count` most probable nodes, in verify order (by depth: ancestors before descendants)."""
    kept = sorted(range(count), key=lambda i: (int(tree.depths[i]), i))
    tokens, parents, depths, probs = (t.tolist() for t in tree)
    return reindexed(tokens, parents, depths, probs, kept)


def tree_values(tree: DraftTree, seconds, room: int) -> list[float]:
    """Expected tokens (accepted + bonus) per second of verifying the tree's 0 … N most probable nodes, a forward
    over 1 + count tokens taking `seconds(tokens)`; nodes deeper than `room` are not counted."""
    usable = (tree.depths <= room).float() * tree.probs
    expected = torch.cat([torch.zeros(1), usable.cumsum(dim=0)])  # (N + 1,) for 0 … N nodes
    return [(1.0 + float(expected[count])) / seconds(1 + count) for count in range(len(expected))]


def best_count(values: list[float]) -> int:
    """The node count with the most expected tokens per second (`tree_values`), the fewest nodes on a tie."""
    return max(range(len(values)), key=lambda count: (values[count], -count))


def tree_budget(tree: DraftTree, seconds, room: int) -> int:
    """How many of the tree's nodes (most probable first) to verify: `best_count` of `tree_values`."""
    return best_count(tree_values(tree, seconds, room))


def path_keys(tree: DraftTree) -> list[tuple[int, ...]]:
    """Each node's tokens from the anchor down to it: a node's identity across `add_chain`, `scale` and `prefix`."""
    keys: list[tuple[int, ...]] = []
    for parent, token in zip(tree.parents.tolist(), tree.tokens.tolist()):  # parents come before their children
        keys.append((keys[parent] if parent >= 0 else ()) + (token,))
    return keys


def tree_positions(tree: DraftTree) -> torch.Tensor:
    """(1 + N,) offsets from the anchor's position: 0 for the anchor, each node's depth."""
    return torch.cat([torch.zeros(1, dtype=torch.long), tree.depths])


def tree_mask(tree: DraftTree) -> torch.Tensor:
    """(1 + N, 1 + N) boolean: the anchor and each node see themselves and their ancestors (the anchor included)."""
    size = tree.size + 1
    mask = torch.eye(size, dtype=torch.bool)
    mask[:, 0] = True
    for i, parent in enumerate(tree.parents.tolist(), start=1):
        if parent >= 0:
            mask[i] |= mask[parent + 1]
    return mask


class TreeShape(NamedTuple):
    """How wide a draft tree grows: each node's `top_k` most likely tokens are candidates, and at each depth the
    `width` candidates with the highest path probability are kept (and expanded further)."""

    width: int = 6
    top_k: int = 4


class TreeStep(NamedTuple):
    """What one tree step verified and kept: the target's forward `out`, the accepted `path` (node indices), the
    row's new tokens (the path and the bonus), the verify slots `kept` (the anchor and the path), the nodes verified
    (`count`), the deepest node's depth, whether the draft ran, the step's source and its lap timer."""

    out: object
    path: list
    new: list
    kept: torch.Tensor
    count: int
    depth: int
    drafted: bool
    source: str
    lap: object


class TreeSteps:
    """The draft-tree step of the batched verify loop (`DominoBatchDecoder`, one row): build the tree, add the
    row's best span as a branch, keep the nodes that pay, verify them in one forward, keep the accepted path. While
    a span is being copied, or spans like it lately expect over a token more than the draft's accepted depth, the
    span goes out alone without running the draft (`SourceChooser.span_first`, as the chain decides).

    Args:
        proposer ([`DominoProposer`]): builds the draft's tree.
        shape ([`TreeShape`]): how wide trees grow.
        n_draft (`int`): the draft's block (0: spans only).
        do_sample (`bool`): sampled acceptance (recursive rejection) instead of the greedy walk.
        process (`callable` or `None`): the target's processors on (1, V) logits after the sequence and extra ids
            ((1, k) or None); None without processors.
        row_free (`bool`): the processors read no ids (one call for every node).
    """

    def __init__(self, proposer, shape: TreeShape, n_draft: int, do_sample: bool, process=None, row_free=True):
        self.proposer, self.shape, self.n_draft, self.do_sample = proposer, shape, n_draft, do_sample
        self.process, self.row_free = process, row_free

    def step(self, row: int, anchors, room: int, span, policy, backbone, verify, clock, lap) -> TreeStep:
        """One step of row `row` from its anchor (`anchors` (1,)) with `room` draft tokens left and its best `span`
        (or None): `backbone(room)` gives the draft's slot states and base logits, `verify(step_ids, block)` runs
        the target's forward over the anchor and the tree, `policy` ([`BatchPolicy`]) decides and learns; `lap`
        times the phases, `clock()` starts a new lap timer (the draft's phases are laps of their own)."""
        tree = empty_tree()
        span_only = span is not None and policy.span_first(row, span)  # a copy under way, or spans beat the draft
        drafted = room > 0 and self.n_draft > 0 and not span_only and policy.should_draft()
        raw = None
        if drafted:
            began = time.perf_counter()
            slots, base = backbone(room)
            lap = clock()
            raw = self.proposer.tree(slots[0], base[0], anchors, self.shape.width, self.shape.top_k)
            if policy.threshold > 0:  # `draft_confidence_threshold`: the nodes whose path probability reaches it
                raw = prefix(raw, int((raw.probs >= policy.threshold).sum()))
            tree = scale(raw, policy.calibration())
            policy.observe_draft(time.perf_counter() - began)
            lap("head_rollout")
        alone = empty_tree()  # what the step verifies without the draft: the span's branch, or nothing
        if span is not None:
            branch = policy.span_branch(row, span)
            tree, alone = add_chain(tree, *branch), add_chain(alone, *branch)
        count = policy.tree_budget(tree, room, alone if drafted else None)
        tree = prefix(tree, count)
        step_ids = torch.cat([anchors, tree.tokens.to(anchors)])[None]  # (1, 1 + N)
        began = time.perf_counter()
        out = verify(step_ids, (tree_mask(tree), tree_positions(tree)))
        processed = self._target_logits(out.logits[0].float(), tree)  # (1 + N, V) after the anchor and each node
        path, bonus = accept_tree(tree.tokens, tree.parents, processed, self.do_sample)
        policy.observe_verify(1 + count, time.perf_counter() - began)
        lap("verify")
        new = tree.tokens[path].tolist() + [bonus]
        predicted = depth = None
        if raw is not None and count:  # the draft's own path probabilities against the draft nodes accepted
            own = dict(zip(path_keys(raw), raw.probs.tolist()))
            keys = path_keys(tree)
            depth = sum(keys[node] in own for node in path)  # accepted nodes the draft's own tree holds
            predicted = sum(own.get(key, 0.0) for key in keys if len(key) <= room)
        policy.record_tree_step(row, span, new, predicted, depth)
        kept = torch.tensor([0] + [node + 1 for node in path])  # verify slots of the anchor and the accepted path
        source = "domino" if drafted else (span.source if span is not None and count else "none")
        deepest = int(tree.depths.max()) if count else 0
        return TreeStep(out, path, new, kept, count, deepest, drafted, source, lap)

    def _target_logits(self, logits, tree: DraftTree) -> torch.Tensor:
        """(1 + N, V) the target's logits after the anchor and after each node, its processors (and warpers, when
        sampling) applied with the node's own path as the sequence."""
        if self.process is None:
            return logits
        if self.row_free:
            return self.process(logits, None)
        rows = [self.process(logits[:1], None)]  # after the anchor: the sequence as it is
        for node, path in enumerate(path_keys(tree)):
            rows.append(self.process(logits[node + 1 : node + 2], torch.tensor([path], dtype=torch.long)))
        return torch.cat(rows)
