"""Continuing a trained draft with more room: a wider sub-vocabulary (`--draft_vocab_size`) or more layers
(`--num_layers`) on top of `--init from:DIR`. Both keep what the draft learnt: new rows and new layers start at
zero output, so the grown draft drafts exactly as before until training fills them in."""

from __future__ import annotations

import copy

import torch

from ..modeling import DominoDraftModel
from .dataset import RegenDataset, build_draft_vocab


def grow_draft_vocab(draft: DominoDraftModel, dataset: RegenDataset, size: int) -> float:
    """Widen a continued draft's sub-vocabulary to `size` tokens: its own ids kept, then the data's most frequent
    others (`build_draft_vocab`). Returns the new coverage of the data's response tokens.

    Why this is cheap: the draft owns no LM head (the target's rows are selected at run time), so a new token's
    base logit is meaningful at once; only the head correction's output layer (W2, rank × V) has a row per
    token, and a new row starts at zero (no correction) for training to fill in."""
    old = draft.config.draft_vocab_ids
    if old is None or size < len(old):
        have = "the full vocabulary" if old is None else f"{len(old)} tokens"
        raise ValueError(f"--draft_vocab_size {size}: the draft in --init from: predicts over {have}; a continued "
                         "draft's sub-vocabulary can only grow. Train a fresh draft (--init random) to shrink it.")
    ids, coverage = build_draft_vocab(dataset, size, always=tuple(old))
    if hasattr(draft, "embed_proj"):  # the head correction
        w2 = draft.embed_proj[2].weight.data  # (V_old, r)
        grown = w2.new_zeros(len(ids), w2.shape[1])  # (V_new, r)
        grown[torch.searchsorted(torch.tensor(ids), torch.tensor(old))] = w2
        draft.embed_proj[2] = torch.nn.Linear(w2.shape[1], len(ids), bias=False, dtype=w2.dtype)
        draft.embed_proj[2].weight.data = grown
    draft.config.draft_vocab_ids = ids
    return coverage


def grow_draft_layers(draft: DominoDraftModel, num_layers: int) -> int:
    """Deepen a continued draft to `num_layers` decoder layers without changing what it computes; returns the
    layers added. Each new layer goes on top as a copy of the last one with its two residual outputs (attention
    `o_proj`, MLP `down_proj`) zeroed, so it adds nothing until training moves them.

    Why: passes of more data over the same two layers saturate (docs/experiments.md, the staged drafts), while a deeper
    draft trained from random weights starts far behind; growing keeps what the shallow draft learnt."""
    have = draft.config.num_hidden_layers
    if num_layers < have:
        raise ValueError(f"--num_layers {num_layers}: the draft in --init from: has {have} layers; a continued "
                         "draft can only grow. Train a fresh draft (--init random) to make it shallower.")
    for _ in range(num_layers - have):
        layer = copy.deepcopy(draft.layers[-1])
        for projection in (layer.self_attn.o_proj, layer.mlp.down_proj):
            torch.nn.init.zeros_(projection.weight)
            if projection.bias is not None:
                torch.nn.init.zeros_(projection.bias)
        draft.layers.append(layer)
    draft.config.num_hidden_layers = num_layers
    return num_layers - have
