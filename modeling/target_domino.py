# Copyright 2026 The domino-hf authors. Licensed under the Apache License, Version 2.0.
"""The target as a Domino draft sees it: its frozen embedding and LM head, the fit check, and the head tables.

Remote-code file (torch + transformers only). Drafting and training both go through `DominoTargetHead`, so
the base logits a draft is trained against are the ones it drafts with (bias and soft-capping included).
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
        self.softcap = getattr(target.config.get_text_config(), "final_logit_softcapping", None)
        self.vocab_map = None  # target id -> draft index (-1 outside the sub-vocabulary)
        if self.draft_vocab_ids is not None:
            self.vocab_map = torch.full((self.vocab_size,), -1, dtype=torch.long, device=self.weight.device)
            self.vocab_map[self.draft_vocab_ids.to(self.weight.device)] = torch.arange(
                len(self.draft_vocab_ids), device=self.weight.device
            )

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

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(…, H) -> (…, V') float32 base logits over the draft vocabulary."""
        logits = F.linear(hidden.to(self.weight.dtype), self.weight, self.bias).float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def to_draft_index(self, target_ids: torch.Tensor) -> torch.Tensor:
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


class DominoHeadTables:
    """What the head rollout can compute before its sequential loop, once per (draft, target) weights.

    * W1 = [W1_H | W1_S]: the H-part for all slots is one matmul per step (`hidden_part`), so each sequential
      token only adds the small S-part: W2 · SiLU(hidden_part_j + W1_S · S).
    * GRU input gates W_ih · emb(token) of every draft-vocabulary token as a lookup table, when it fits in
      `MAX_TABLE_BYTES` (a sub-vocabulary always does for typical sizes); else computed per token.
    """

    MAX_TABLE_BYTES = 64 * 2**20

    def __init__(self, draft, head: DominoTargetHead):
        hidden = draft.config.hidden_size
        w1 = draft.embed_proj[0].weight  # (r, H + Hg)
        self.w1_hidden, self.w1_state = w1[:, :hidden], w1[:, hidden:]
        self.w2 = draft.embed_proj[2].weight  # (V', r)
        self.w_ih = draft.prefix_gru.weight_ih_l0  # (3·Hg, E)
        self.head = head
        rows = head.draft_vocab_ids
        if rows is None and head.vocab_size * self.w_ih.shape[0] * self.w_ih.element_size() <= self.MAX_TABLE_BYTES:
            rows = torch.arange(head.vocab_size, device=self.w_ih.device)
        self.gate_table = None if rows is None else F.linear(head.embed(rows).to(self.w_ih), self.w_ih)  # (V', 3·Hg)

    @classmethod
    def cached(cls, draft, target, head: DominoTargetHead) -> "DominoHeadTables":
        """Reuse the tables while neither the draft's head nor the target embedding changed (in place)."""
        key = _weights_key(head.embed_tokens.weight, draft.prefix_gru.weight_ih_l0, draft.embed_proj[0].weight)
        key += (hash(tuple(draft.config.draft_vocab_ids or ())),)
        return cached_for(draft, target, "head_tables", key, lambda: cls(draft, head))

    def input_gates(self, draft_index: torch.Tensor, target_id: torch.Tensor) -> torch.Tensor:
        """W_ih · emb(token) -> (1, 3·Hg)."""
        if self.gate_table is not None and draft_index is not None:
            return self.gate_table[draft_index.reshape(1)]
        return F.linear(self.head.embed(target_id.reshape(1)).to(self.w_ih), self.w_ih)

    def correction(self, hidden_part: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """W2 · SiLU(W1_H·H + W1_S·S) for one slot: (1, r), (1, Hg) -> (1, V')."""
        return F.linear(F.silu(torch.addmm(hidden_part, state, self.w1_state.t())), self.w2)
