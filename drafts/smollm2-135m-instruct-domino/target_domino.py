# Copyright 2026 The domino-hf authors. Licensed under the Apache License, Version 2.0.
"""The target as a Domino draft sees it: the one place that knows how the draft reads the target.

Remote-code file (torch + transformers only). Drafting, training, feature extraction, the benchmark and the
tests all go through this module, so each convention is written once:

* context features: which `output_hidden_states` entries hold target layer `i` (`i + 1`: entry 0 is the
  embedding output) and how they are concatenated (`hidden_state_indices`, `context_features`), and the final
  hidden states from which the target's own next-token logits come (`target_features`, `target_logits`);
* the block layout: `[anchor, MASK, …]` at positions anchor … anchor+B-1, which slots draft
  (`block_token_ids`, `block_position_ids`, `draft_slots`: slot 0 is the anchor unless `shift_label`), and
  the positions whose next token each draft token predicts (`draft_label_positions`);
* the vocabulary map between target ids and draft-vocabulary indices (`draft_vocab_map`);
* the frozen embedding and LM head, bias and soft-capping included (`DominoTargetHead`), so the base logits
  a draft is trained against are the ones it drafts with;
* the fit check (`check_draft_fits_target`), the attention check (`check_target_attention`) and the
  generation-time head tables (`DominoHeadTables`).
"""

from __future__ import annotations

import logging
import weakref

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)


# draft -> target -> {name: (key, value)}; weak on both sides, so a cache never keeps a model alive, is never
# deep-copied or saved with the draft, and dies with either model.
_GENERATION_CACHES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _weights_key(*weights: torch.Tensor) -> tuple:
    """Identifies the current contents of `weights`: the tensor object (a replaced weight never matches, even
    at a reused address), its storage, in-place version counter, dtype and device."""
    return tuple((id(w), w.data_ptr(), w._version, w.dtype, w.device) for w in weights)


def cached_for(draft, target, name: str, key: tuple, build):
    """`build()` memoised per (draft, target) pair under `name` while `key` is unchanged; never stored while
    the draft trains, since its weights change every step."""
    per_target = _GENERATION_CACHES.setdefault(draft, weakref.WeakKeyDictionary())
    entries = per_target.setdefault(target, {})
    saved = entries.get(name)
    if saved is None or saved[0] != key:
        saved = (key, build())
        if not draft.training:
            entries[name] = saved
    return saved[1]


# ------------------------------------------------------------------------------------------ context features
def hidden_state_indices(layer_ids) -> list[int]:
    """The `output_hidden_states` entries holding target decoder layers `layer_ids` (entry 0 is the embedding
    output, so layer i is entry i + 1): what a target forward is asked for."""
    return [i + 1 for i in layer_ids]


def context_features(hidden_states, layer_ids, length: int | None = None) -> torch.Tensor:
    """A target forward's `hidden_states` -> (b, L, n_layers·H) context features: layers `layer_ids`
    concatenated along features, for the first `length` positions (all when None)."""
    return torch.cat([hidden_states[i][:, :length] for i in hidden_state_indices(layer_ids)], dim=-1)


def target_features(target, input_ids, attention_mask, layer_ids) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward of the target's base model (no LM head) over (b, L) `input_ids` -> (b, L, n_layers·H) context
    features and (b, L, H) final hidden states (after the final norm: what `target_logits` reads)."""
    out = target.base_model(
        input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=hidden_state_indices(layer_ids)
    )
    return context_features(out.hidden_states, layer_ids), out.last_hidden_state


def target_context_features(target, input_ids, attention_mask, layer_ids) -> torch.Tensor:
    """`target_features` without the final hidden states: (b, L) `input_ids` -> (b, L, n_layers·H)."""
    return target_features(target, input_ids, attention_mask, layer_ids)[0]


def target_logits(target, final_hidden: torch.Tensor) -> torch.Tensor:
    """(…, H) final hidden states -> (…, V) the target's own next-token logits over its whole vocabulary: its LM
    head, bias and final soft-capping included (what the target samples from; training's soft labels)."""
    lm_head = target.get_output_embeddings()
    return soft_cap(lm_head(final_hidden.to(lm_head.weight.dtype)), final_logit_softcap(target))


def final_logit_softcap(target) -> float | None:
    """The target's final-logit soft-capping constant (Gemma), None when it has none."""
    return getattr(target.config.get_text_config(), "final_logit_softcapping", None)


def soft_cap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """cap · tanh(logits / cap), as the target applies it to its final logits; unchanged when `cap` is None."""
    return torch.tanh(logits / cap) * cap if cap else logits


# ---------------------------------------------------------------------------------------------- block layout
def block_token_ids(anchor_ids: torch.Tensor, config) -> torch.Tensor:
    """(…,) anchor ids -> (…, B) block `[anchor, MASK, …]`: what the backbone reads (as target embeddings)."""
    block = anchor_ids.new_full((*anchor_ids.shape, config.block_size), config.mask_token_id)
    block[..., 0] = anchor_ids
    return block


def block_position_ids(anchor_positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """(…,) anchor positions -> (…, B) positions of the block's slots (the anchor's, then the next B-1)."""
    return anchor_positions[..., None] + torch.arange(block_size, device=anchor_positions.device)


def draft_label_positions(anchor_positions: torch.Tensor, num_draft: int) -> torch.Tensor:
    """(…,) anchor positions a -> (…, n) positions a … a+n-1: draft token j predicts the token after position
    a+j (x_{a+1+j}). Teacher forcing feeds the GRU the tokens at these positions, and the target's next-token
    distribution at position a+j is draft token j's soft label (`domino train --loss kl`)."""
    return anchor_positions[..., None] + torch.arange(num_draft, device=anchor_positions.device)


def draft_slots(block_hidden: torch.Tensor, config) -> torch.Tensor:
    """(…, B, H) backbone output of one block -> (…, n, H) of the slots that draft, in order: slot k predicts
    the token at anchor + 1 + k with `shift_label` (Domino), else slot 0 is the anchor itself (DFlash)."""
    first = 0 if config.shift_label else 1
    return block_hidden[..., first : first + config.num_draft_tokens, :]


# ------------------------------------------------------------------------------------------ vocabulary map
def draft_vocab_map(draft_vocab_ids, vocab_size: int, device=None) -> torch.Tensor | None:
    """(V,) target id -> draft-vocabulary index, -1 outside the sub-vocabulary; None for the full vocabulary."""
    if draft_vocab_ids is None:
        return None
    ids = torch.as_tensor(draft_vocab_ids, dtype=torch.long, device=device)
    vocab_map = torch.full((vocab_size,), -1, dtype=torch.long, device=device)
    vocab_map[ids] = torch.arange(len(ids), device=device)
    return vocab_map


class DominoTargetHead:
    """The target's frozen input embedding and LM head, as the draft uses them.

    With a draft sub-vocabulary the LM head is a row selection of the target's (made here, at generation or
    training time: it is never stored in the checkpoint). `dtype` casts the LM head (rows), so a draft loaded
    in another precision than the target (bf16 draft, fp32 target) runs its base logits in its own precision.
    Final-logit soft-capping of the target (Gemma) is applied to the base logits, so the draft models the
    distribution the target actually produces.
    """

    def __init__(self, target, config, device=None, dtype=None):
        self.embed_tokens = target.get_input_embeddings()
        lm_head = target.get_output_embeddings()
        weight = lm_head.weight.detach()
        bias = getattr(lm_head, "bias", None)
        self.draft_vocab_ids = None
        if config.draft_vocab_ids is not None:
            self.draft_vocab_ids = torch.tensor(config.draft_vocab_ids, dtype=torch.long, device=weight.device)
            weight = weight.index_select(0, self.draft_vocab_ids)
            bias = bias.detach().index_select(0, self.draft_vocab_ids) if bias is not None else None
        self.weight = weight.to(device=device, dtype=dtype)
        self.bias = None if bias is None else bias.detach().to(self.weight)
        self.vocab_size = lm_head.weight.shape[0]
        self.softcap = final_logit_softcap(target)
        self.vocab_map = draft_vocab_map(config.draft_vocab_ids, self.vocab_size, self.weight.device)
        self.config = config

    @classmethod
    def cached(cls, draft, target) -> "DominoTargetHead":
        """The generation-time head in the draft's dtype, reused across `generate` calls while the target's
        embedding and LM head, the draft's dtype and its sub-vocabulary are unchanged. When the draft's dtype
        differs from the target's, this holds a copy of the LM head (its sub-vocabulary rows, or all of it)."""
        key = _weights_key(target.get_input_embeddings().weight, target.get_output_embeddings().weight)
        key += (draft.dtype, hash(tuple(draft.config.draft_vocab_ids or ())))
        return cached_for(draft, target, "target_head", key, lambda: cls(target, draft.config, dtype=draft.dtype))

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """(…,) ids -> (…, E) target input embeddings (including any scaling the target applies)."""
        return self.embed_tokens(token_ids.to(self.embed_tokens.weight.device))

    def block_embeds(self, anchor_ids: torch.Tensor) -> torch.Tensor:
        """(…,) anchor ids -> (…, B, E) target embeddings of the blocks `[anchor, MASK, …]`."""
        return self.embed(block_token_ids(anchor_ids, self.config))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(…, H) -> (…, V') float32 base logits over the draft vocabulary."""
        return soft_cap(F.linear(hidden.to(self.weight.dtype), self.weight, self.bias).float(), self.softcap)

    def to_draft_index(self, target_ids: torch.Tensor) -> torch.Tensor:
        """Target ids -> draft-vocabulary indices (-1 outside the sub-vocabulary)."""
        return target_ids if self.vocab_map is None else self.vocab_map.to(target_ids.device)[target_ids]

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids if self.draft_vocab_ids is None else self.draft_vocab_ids.to(draft_ids.device)[draft_ids]

    def to_full_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """(…, V') -> (…, V): scatter sub-vocabulary logits into −inf (the draft's q is 0 elsewhere)."""
        if self.draft_vocab_ids is None:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.vocab_size), float("-inf"))
        full[..., self.draft_vocab_ids.to(logits.device)] = logits
        return full


def check_draft_fits_target(config, target) -> None:
    """Raise a ValueError naming the mismatch when a draft was built for another target."""
    text = target.config.get_text_config()
    built_for = f" (it was built for {config.target_name_or_path})" if config.target_name_or_path else ""
    fix = f"Load the Domino draft trained for this target, or train one with `domino train`{built_for}."
    vocab = target.get_output_embeddings().weight.shape[0]
    problems = []
    if text.hidden_size != config.target_hidden_size:
        problems.append(f"hidden size {config.target_hidden_size} != target's {text.hidden_size}")
    elif text.hidden_size != config.hidden_size:  # the block reads the target's embeddings, H feeds its LM head
        problems.append(f"draft hidden size {config.hidden_size} != target's {text.hidden_size}")
    if vocab != config.vocab_size:
        problems.append(f"vocabulary {config.vocab_size} != target's LM head {vocab}")
    if getattr(text, "num_hidden_layers", None) not in (None, config.num_target_layers):
        problems.append(f"built for {config.num_target_layers} target layers, target has {text.num_hidden_layers}")
    if max(config.target_layer_ids) >= getattr(text, "num_hidden_layers", 10**9):
        problems.append(f"target_layer_ids {config.target_layer_ids} exceed the target's layers")
    if not 0 <= config.mask_token_id < vocab:
        problems.append(f"mask_token_id {config.mask_token_id} outside the target vocabulary")
    if problems:
        raise ValueError("This Domino draft does not fit the target model: " + "; ".join(problems) + ". " + fix)
    if config.target_model_type and config.target_model_type != getattr(text, "model_type", None):
        logger.warning(
            "Domino draft was trained for a %s target, this target is %s: outputs stay exact, acceptance may drop.",
            config.target_model_type,
            text.model_type,
        )


def target_attention(target) -> str | None:
    """The attention implementation of the target's text model (`config._attn_implementation`)."""
    config = target.config.get_text_config() if hasattr(target.config, "get_text_config") else target.config
    return getattr(config, "_attn_implementation", None)


def check_target_attention(target) -> None:
    """Refuse a target whose attention implementation has no mask function in transformers'
    `AttentionMaskInterface` (every built-in one has; one registered by the user with `AttentionInterface.register`
    alone has not). transformers then builds no causal mask at all: a one-token step needs none, but a forward over
    several new tokens after a cache, which every verify step is, would let each new token see the tokens after it
    (or, with SDPA's `is_causal`, hide the cache), so the output would silently differ from plain decoding."""
    from transformers.masking_utils import AttentionMaskInterface

    name = target_attention(target)
    if name in AttentionMaskInterface._global_mapping:  # the mapping transformers' mask builders look the name up in
        return
    raise ValueError(
        f"attn_implementation={name!r} has no mask function in transformers' AttentionMaskInterface, so a forward "
        "over several new tokens after the cache (every Domino verify step) gets no causal mask and would give "
        "tokens other than plain decoding's. Register the mask its attention function takes, e.g. "
        "`from transformers.masking_utils import AttentionMaskInterface, sdpa_mask; "
        f"AttentionMaskInterface.register({name!r}, sdpa_mask)` (eager_mask for additive masks), or load the "
        "target with attn_implementation='sdpa' (or 'eager')."
    )


class DominoHeadTables:
    """The GRU input gates W_ih · emb(token) of every draft-vocabulary token, as a lookup table: one gather per
    drafted token instead of an embedding lookup and a matmul. Built once per (draft, target) weights when it
    fits in `MAX_TABLE_BYTES` (a sub-vocabulary always does for typical sizes); else gates are computed per
    token. The head's math itself is the draft's (`DominoDraftModel.head_input_gates`, `gru_step`, …)."""

    MAX_TABLE_BYTES = 64 * 2**20

    def __init__(self, draft, head: DominoTargetHead):
        self.head = head  # never the draft itself: the cache holding these tables is keyed by it (weakly)
        rows = head.draft_vocab_ids
        gate_bytes = 3 * draft.config.gru_hidden_dim * draft.dtype.itemsize
        if rows is None and head.vocab_size * gate_bytes <= self.MAX_TABLE_BYTES:
            rows = torch.arange(head.vocab_size, device=head.weight.device)
        self.gate_table = None if rows is None else draft.head_input_gates(head.embed(rows))  # (V', 3·Hg)

    @classmethod
    def cached(cls, draft, target, head: DominoTargetHead) -> "DominoHeadTables":
        """Reuse the tables while neither the draft's head nor the target embedding changed (in place)."""
        key = _weights_key(head.embed_tokens.weight, *draft.head_parameters())
        key += (hash(tuple(draft.config.draft_vocab_ids or ())),)
        return cached_for(draft, target, "head_tables", key, lambda: cls(draft, head))

    def input_gates(self, draft, draft_index: torch.Tensor, target_id: torch.Tensor) -> torch.Tensor:
        """W_ih · emb(token) of each row's token -> (R, 3·Hg): `draft_index` (R,) the tokens' rows in the table
        (-1 off the sub-vocabulary), `target_id` (R,) their target ids (embedded when a row is off the table)."""
        if self.gate_table is not None and bool((draft_index >= 0).all()):
            return self.gate_table[draft_index.reshape(-1)]
        return draft.head_input_gates(self.head.embed(target_id.reshape(-1)))
