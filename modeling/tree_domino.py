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
from .ragged_domino import verify_mask
from .target_domino import context_features


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


def tree_budget(tree: DraftTree, seconds, room: int) -> int:
    """How many of the tree's nodes (most probable first) to verify: the most expected tokens (accepted + bonus)
    per second of a forward over 1 + count tokens (`seconds(tokens)`); nodes deeper than `room` are not counted."""
    usable = (tree.depths <= room).float() * tree.probs
    expected = torch.cat([torch.zeros(1), usable.cumsum(dim=0)])  # (N + 1,) for 0 … N nodes
    value = [(1.0 + float(expected[count])) / seconds(1 + count) for count in range(len(expected))]
    return max(range(len(value)), key=lambda count: (value[count], -count))


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


class TreeSteps:
    """The draft-tree step of the batched verify loop (`DominoBatchDecoder`, one row): build the tree, add the
    row's best span as a branch, keep the nodes that pay, verify them in one forward, keep the accepted path. While
    a span is being copied, or spans like it lately expect over a token more than the draft's accepted depth, the
    span goes out alone without running the draft (`SourceChooser.span_first`, as the chain decides)."""

    def _tree_step(self):
        lap = self._clock()
        row = int(self.rows[0])
        self.anchors = self.sequences[self.rows, self.width + self.generated[row] - 1]  # (1,)
        room = min(self.budget - self.generated[row] - 1, self.caps[row])  # draft tokens that can still be verified
        self.policy.begin_step([row])
        span = self._find_spans(torch.tensor([room]))[0]
        policy, tree = self.policy, DraftTree(*(torch.zeros(0, dtype=dtype) for dtype in (torch.long,) * 3),
                                              torch.zeros(0))
        span_only = span is not None and policy.span_first(row, span)  # a copy under way, or spans beat the draft
        drafted = room > 0 and self.n_draft > 0 and not span_only and policy.should_draft()
        raw = None
        if drafted:
            began = time.perf_counter()
            slots, base = self._backbone(room)
            lap = self._clock()
            raw = self.proposer.tree(slots[0], base[0], self.anchors, self.tree.width, self.tree.top_k)
            if policy.threshold > 0:  # `draft_confidence_threshold`: the nodes whose path probability reaches it
                raw = prefix(raw, int((raw.probs >= policy.threshold).sum()))
            tree = scale(raw, policy.calibration())
            policy.observe_draft(time.perf_counter() - began)
            lap("head_rollout")
        if span is not None:
            tree = add_chain(tree, *policy.span_branch(row, span))
        count = tree_budget(tree, policy.seconds, room) if tree.size else 0
        tree = prefix(tree, count)
        block = (tree_mask(tree), tree_positions(tree))
        step_ids = torch.cat([self.anchors, tree.tokens.to(self.anchors)])[None]  # (1, 1 + N)
        states = self.cache.states
        states.plan(1 + count)
        began = time.perf_counter()
        out = self._forward(step_ids, verify_mask(states, 1 + count, block=block), 1 + count, keep=1 + count,
                            block=block)
        processed = self._tree_logits(out.logits[0].float(), tree)  # (1 + N, V) after the anchor and each node
        path, bonus = accept_tree(tree.tokens, tree.parents, processed, self.do_sample)
        policy.observe_verify(1 + count, time.perf_counter() - began)
        lap("verify")
        if count:
            self._schedule([row], [int(tree.depths.max())], [len(path)])
        kept = torch.tensor([0] + [node + 1 for node in path])  # verify slots of the anchor and the accepted path
        states.compact(kept[1:])
        states.advance(torch.tensor([len(kept)]))
        new = tree.tokens[path].tolist() + [bonus]
        predicted = depth = None
        if raw is not None and count:  # the draft's own path probabilities against the draft nodes accepted
            own = dict(zip(path_keys(raw), raw.probs.tolist()))
            keys = path_keys(tree)
            depth = sum(keys[node] in own for node in path)  # accepted nodes the draft's own tree holds
            predicted = sum(own.get(key, 0.0) for key in keys if len(key) <= room)
        policy.record_tree_step(row, span, new, predicted, depth)
        features = context_features(out.hidden_states, self.layer_ids)[:, kept.to(out.logits.device)]
        before = self.generated[row]
        self._append([new], torch.tensor([len(kept)]), features)
        source = "domino" if drafted else (span.source if span is not None and count else "none")
        for record in (self.stats, self.stats.per_row[row]):  # the accepted depth the row kept (its end may cut it)
            record.record(count, self.generated[row] - before - 1, source, drafted)
        self._lap = lap

    def _tree_logits(self, logits, tree: DraftTree) -> torch.Tensor:
        """(1 + N, V) the target's logits after the anchor and after each node, its processors (and warpers, when
        sampling) applied with the node's own path as the sequence."""
        if not self.processors:
            return logits
        if self.row_free:
            return self._process(logits, None)
        rows = [self._process(logits[:1], None)]  # after the anchor: the sequence as it is
        for node, path in enumerate(path_keys(tree)):
            rows.append(self._process(logits[node + 1 : node + 2], torch.tensor([path], dtype=torch.long)))
        return torch.cat(rows)
