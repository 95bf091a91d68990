# Copyright 2026 The domino-hf authors. Licensed under the Apache License, Version 2.0.
"""Key/value caches and attention masks for rows of different lengths (the batched verify loop, `batch_domino.py`).

Remote-code file (torch + transformers only). In a batch, each verify step accepts a different number of tokens
per row. Instead of padding every row to the longest (holes that grow step after step), each row keeps its
entries contiguous in a preallocated buffer, `[start, end)`: `start` is the row's left padding, `end` where its
next entries go. A forward over `n` new tokens per row writes row i's at `[end_i, end_i + n)` (a scatter), and
attention reads the buffers up to the longest row, with a mask that lets each row see its own entries only. A
row's rejected tokens lie past its `end` after the step and are overwritten by the next forward, so memory is
that of plain batched decoding plus one block per row, and nothing is ever copied to realign rows.

    buffer row i:  [ pad … | prompt and accepted tokens | new block ]  garbage past end_i + n
                    0    start_i                       end_i       end_i + n

Shapes: b = live rows, h = key/value heads, C = capacity, d = head dim, n = new tokens per row.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache


class RaggedStates:
    """Per-layer keys/values of `b` rows in (b, h, C, d) buffers; row i's entries are `[start[i], end[i])`.

    Args:
        start (`torch.LongTensor` of shape `(b,)`): each row's first entry (its left padding).
        capacity (`int`): entries per row the buffers hold (the longest sequence plus a block).
    """

    def __init__(self, start: torch.Tensor, capacity: int):
        self.start = start.clone()
        self.end = torch.zeros_like(self.start)
        self.capacity = capacity
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self._index: torch.Tensor | None = None  # (b, n) slots the planned forward writes
        self._read = 0  # entries attention reads after the planned write

    def __len__(self) -> int:
        return int(self.end.max()) if len(self.end) else 0

    def plan(self, new: int) -> None:
        """The next forward writes `new` entries per row at each row's `end` (before `advance`)."""
        if int(self.end.max()) + new > self.capacity:
            raise RuntimeError(f"Ragged cache overflow: {int(self.end.max())} + {new} > {self.capacity} entries.")
        self._index = self.end[:, None] + torch.arange(new, device=self.end.device)
        self._read = int(self.end.max()) + new

    def write(self, layer_idx: int, keys: torch.Tensor, values: torch.Tensor):
        """Write one layer's (b, h, n, d) new keys/values where `plan` said; return the layer's (b, h, read, d)."""
        if layer_idx == len(self.keys):
            b, h, _, d = keys.shape
            self.keys.append(keys.new_zeros(b, h, self.capacity, d))
            self.values.append(values.new_zeros(b, h, self.capacity, values.shape[-1]))
        key_buffer, value_buffer = self.keys[layer_idx], self.values[layer_idx]
        index = self._index.to(keys.device)[:, None, :, None]
        key_buffer.scatter_(2, index.expand(-1, keys.shape[1], -1, keys.shape[-1]), keys.to(key_buffer.dtype))
        value_buffer.scatter_(2, index.expand(-1, values.shape[1], -1, values.shape[-1]),
                              values.to(value_buffer.dtype))
        return key_buffer[:, :, : self._read], value_buffer[:, :, : self._read]

    def adopt(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        """Take a prefill's per-layer (b, h, n, d) keys/values, computed with another cache, as every row's first n
        entries (rows without left padding: `start` all 0)."""
        n = keys[0].shape[2]
        if n > self.capacity:
            raise RuntimeError(f"Ragged cache overflow: {n} > {self.capacity} entries.")
        for source, buffers in ((keys, self.keys), (values, self.values)):
            for layer in source:
                b, h, _, d = layer.shape
                buffers.append(layer.new_zeros(b, h, self.capacity, d))
                buffers[-1][:, :, :n] = layer
        self.end = torch.full_like(self.end, n)

    def advance(self, counts: torch.Tensor) -> None:
        """Keep the first `counts[i]` (b,) of the entries just written for row i."""
        self.end += counts.to(self.end)

    def compact(self, slots: torch.Tensor) -> None:
        """Before `advance`, for a single row: move the entries just written at offsets `slots` (k,) from its end
        (a draft tree's accepted path, ancestors first, each offset ≥ its new place) to the places right after
        the first new entry, so the row's kept entries stay contiguous."""
        if len(slots) == 0:
            return
        end = int(self.end[0])
        source = (end + slots).to(self.end.device)
        for buffer in (*self.keys, *self.values):
            buffer[:, :, end + 1 : end + 1 + len(slots)] = buffer[:, :, source]

    def select(self, rows: torch.Tensor) -> None:
        """Keep only `rows` (b',) of the batch, in that order (finished rows leave)."""
        self.start, self.end = self.start[rows], self.end[rows]
        self.keys = [buffer.index_select(0, rows.to(buffer.device)) for buffer in self.keys]
        self.values = [buffer.index_select(0, rows.to(buffer.device)) for buffer in self.values]


class RaggedCache(Cache):
    """The target's cache in the batched verify loop: a `Cache` whose `update` writes into `RaggedStates`.

    It is only ever driven by `batch_domino.py`, which plans each forward, passes its own attention masks
    (`verify_masks`) and explicit positions, so the model never asks it for mask sizes or its length."""

    is_compileable = False

    def __init__(self, start: torch.Tensor, capacity: int):
        super().__init__(layers=[])
        self.states = RaggedStates(start, capacity)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        return self.states.write(layer_idx, key_states, value_states)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return len(self.states)

    @property
    def is_croppable(self) -> bool:
        return False


class RaggedContextCache:
    """The draft's context cache in the batched verify loop (`DominoContextCache`'s `update(layer_idx, keys,
    values)`, over `RaggedStates`)."""

    def __init__(self, start: torch.Tensor, capacity: int):
        self.states = RaggedStates(start, capacity)

    def update(self, layer_idx: int, keys: torch.Tensor, values: torch.Tensor):
        return self.states.write(layer_idx, keys, values)


def verify_mask(states: RaggedStates, new: int, window: int | None = None, block=None) -> torch.Tensor:
    """Boolean (b, 1, new, read) mask of a forward over `new` tokens per row planned on `states` (before
    `advance`): row i's query j sees the row's entries `[start_i, end_i)` and, among the new ones, those `block`
    allows: causal by default, or a draft tree's ancestors (`block` = ((new, new) mask, (new,) position offsets from
    the row's first new token), see `tree_domino.py`). With a sliding `window`, only keys less than `window`
    positions back. A query with nothing to see (a left-padding position of the prefill) sees itself, so that no
    softmax is over an empty set."""
    device = states.end.device
    block_mask, offsets = block if block is not None else (None, torch.arange(new))
    offsets = offsets.to(device)
    read = int(states.end.max()) + new
    keys = torch.arange(read, device=device)[None, None, :]  # (1, 1, read)
    relative = keys - states.end[:, None, None]  # (b, 1, read): < 0 in the cache, 0 … new-1 for the new tokens
    slot = torch.arange(new, device=device)[None, :, None]  # (1, new, 1)
    inside = relative.clamp(0, new - 1)
    if block_mask is None:
        new_visible = relative <= slot
    else:
        new_visible = block_mask.to(device)[slot, inside]  # (b, new, read)
    mask = torch.where(relative < 0, True, new_visible & (relative < new)) & (keys >= states.start[:, None, None])
    if window is not None:
        base = (states.end - states.start)[:, None, None]
        key_positions = torch.where(relative < 0, keys - states.start[:, None, None], base + offsets[inside])
        mask &= base + offsets[slot] - key_positions < window
    mask |= relative == slot
    return mask[:, None]


def context_mask(states: RaggedStates, counts: torch.Tensor, block: int) -> torch.Tensor:
    """Boolean (b, 1, block, read + block) mask of a draft forward that writes `counts[i]` (b,) new context entries
    for row i on `states` (planned, not yet `advance`d): every block slot sees the row's context
    `[start_i, end_i + counts_i)` and the whole block."""
    keys = torch.arange(states._read, device=states.end.device)[None, :]
    context = (keys >= states.start[:, None]) & (keys < (states.end + counts.to(states.end))[:, None])  # (b, read)
    mask = torch.cat([context, context.new_ones(len(context), block)], dim=1)
    return mask[:, None, None, :].expand(-1, 1, block, -1)


def attention_masks(target, mask: torch.Tensor, states: RaggedStates, new: int, block=None):
    """What the target's forward takes as `attention_mask` for a planned forward: its sliding-window layers need
    their own mask (a dict keyed by layer type, as Gemma3/Qwen2/Qwen3 accept), other models one 4D mask (Llama,
    and Mistral, whose one window applies to every layer). Eager attention adds the mask to the scores, so it
    gets 0 / the dtype's minimum instead of booleans."""
    config = target.config.get_text_config() if hasattr(target.config, "get_text_config") else target.config
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)

    def form(boolean):
        if config._attn_implementation == "eager":
            return torch.zeros(boolean.shape, dtype=target.dtype, device=boolean.device).masked_fill(
                ~boolean, torch.finfo(target.dtype).min)
        return boolean

    if layer_types:
        masks = {"full_attention": form(mask)}
        if "sliding_attention" in layer_types:
            masks["sliding_attention"] = form(verify_mask(states, new, window, block))
        return masks
    return form(verify_mask(states, new, window, block) if window is not None else mask)


# domino_hf's CPU attention functions (domino_cpu_sdpa, domino_exact) take the boolean masks sdpa takes
SUPPORTED_ATTENTION = ("eager", "sdpa", "domino_cpu_sdpa", "domino_exact")


def check_attention_supported(target) -> None:
    """Refuse attention implementations that take no explicit 4D mask (flash attention, flex, paged)."""
    impl = target.config._attn_implementation
    if impl not in SUPPORTED_ATTENTION:
        raise ValueError(
            f"Batched Domino decoding gives each row its own attention mask, which attn_implementation='{impl}' "
            f"does not take: load the target with attn_implementation='sdpa' (or 'eager'), or generate one prompt "
            "at a time."
        )
