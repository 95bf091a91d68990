"""Grouped-query attention over the KV cache without copying it, for multi-token forwards on the CPU.

Why: a verify step is one target forward over several new tokens against the whole KV cache, with a causal
mask. Given a mask, transformers' SDPA path on the CPU does not use grouped-query attention inside
`scaled_dot_product_attention`: it repeats every key/value head `num_key_value_groups` times first
(`repeat_kv`), a copy of the layer's whole cache on every verify (a third of a 5-token forward at 1,500 tokens
of context on SmolLM2, docs/cpu_kernels.md).

`gqa_attention_forward` folds the query heads of one group into the query length instead, from
(batch, heads, q_len, dim) to (batch, kv_heads, groups · q_len, dim), and repeats the (q_len × kv_len) mask
rows for each head of a group, which is tiny next to the cache. Each output row is the same dot products,
softmax and weighted sum as with repeated heads, so the result equals stock SDPA up to fp32 rounding.
Anything else (no mask, a single head per group, dropout while training, soft-capping, attention sinks or a
position bias, a per-head mask) goes to the stock SDPA function untouched.

Installed through transformers' public registries under `ATTENTION_NAME`: the attention function in
`AttentionInterface`, and transformers' own SDPA mask builder in `AttentionMaskInterface` (it builds only the
q_len × kv_len block a forward needs, sliding windows included). `use_gqa_attention(model)` switches a model
whose attention is "sdpa" to it with `set_attn_implementation`; `use_stock_attention(model)` switches back.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger(__name__)

ATTENTION_NAME = "domino_cpu_sdpa"
STOCK_ATTENTION = "sdpa"
# Keyword arguments that change what attention computes beyond mask and scale: the stock function handles them.
_STOCK_ONLY_KWARGS = ("softcap", "position_bias", "s_aux", "sinks", "output_attentions")


def _stock_sdpa():
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS[STOCK_ATTENTION]


def _packable(module, query, key, value, attention_mask, dropout, kwargs) -> bool:
    groups = getattr(module, "num_key_value_groups", 1)
    if groups <= 1 or attention_mask is None or attention_mask.dim() != 4 or attention_mask.shape[1] != 1:
        return False
    if dropout or any(kwargs.get(name) not in (None, False) for name in _STOCK_ONLY_KWARGS):
        return False
    return query.shape[1] == key.shape[1] * groups and key.shape[1] == value.shape[1]


def gqa_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention with the signature of transformers' attention functions: `query` (batch, heads, q_len, dim),
    `key`/`value` (batch, kv_heads, kv_len, dim), `attention_mask` (batch, 1, q_len, kv_len) boolean or
    additive; returns (batch, q_len, heads, dim) and no weights. See the module doc."""
    if not _packable(module, query, key, value, attention_mask, dropout, kwargs):
        return _stock_sdpa()(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    batch, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    # Head h attends with key/value head h // groups (repeat_kv's order): fold each group into the rows.
    packed_query = query.reshape(batch, kv_heads, groups * q_len, dim)
    mask = attention_mask[:, :, None].expand(-1, 1, groups, q_len, attention_mask.shape[-1])
    mask = mask.reshape(attention_mask.shape[0], 1, groups * q_len, attention_mask.shape[-1])
    output = F.scaled_dot_product_attention(packed_query, key, value, attn_mask=mask, scale=scaling)
    output = output.reshape(output.shape[0], heads, q_len, value.shape[-1])
    return output.transpose(1, 2).contiguous(), None


def register() -> None:
    """Register `gqa_attention_forward` and the SDPA mask builder under `ATTENTION_NAME` (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION_NAME, gqa_attention_forward)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)


def _implementation(model: nn.Module) -> str | None:
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None) if config is not None else None


def use_gqa_attention(model: nn.Module) -> bool:
    """Switch a model whose attention is transformers' "sdpa" to `ATTENTION_NAME`; True when it now runs it.
    Models on another implementation (eager, flash, a kernel of the user's) or that cannot switch are left
    alone."""
    if _implementation(model) == ATTENTION_NAME:
        return True
    if _implementation(model) != STOCK_ATTENTION or not callable(getattr(model, "set_attn_implementation", None)):
        return False
    can_set = getattr(model, "_can_set_attn_implementation", None)
    if callable(can_set) and not can_set():
        return False
    register()
    model.set_attn_implementation(ATTENTION_NAME)
    return _implementation(model) == ATTENTION_NAME


def use_stock_attention(model: nn.Module) -> None:
    """Undo `use_gqa_attention`: back to "sdpa" (nothing to do on a model that never switched)."""
    if _implementation(model) == ATTENTION_NAME:
        model.set_attn_implementation(STOCK_ATTENTION)
