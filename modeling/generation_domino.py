# Copyright 2026 The domino-hf authors. Licensed under the Apache License, Version 2.0.
"""`target.generate(assistant_model=domino_draft)`: the candidate generator and its dispatch.

Remote-code file (torch + transformers only). One speculative step, driven by transformers'
`_assisted_decoding`:

    target hidden states of the newly accepted positions ──► draft context cache (fc → K/V per layer)
    [anchor, MASK, …] ──► backbone (one forward) ──► H ──► target LM head (one call) ──► base logits
    for each draft slot j:  logits_j = base_j + W2·SiLU(W1·[H_j ; S])  →  token d_j  →  S = GRU(S, emb(d_j))
    transformers verifies [anchor, d_1 … d_k] in one target forward (exact match, or speculative sampling
    with our per-slot processed logits as q), appends the bonus token and crops its cache.
"""

from __future__ import annotations

import contextvars
import logging
import time

import torch
import torch.nn.functional as F
from transformers.generation.candidate_generator import CandidateGenerator
from transformers.generation.logits_process import LogitsProcessorList
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

logger = logging.getLogger(__name__)

MIN_TRANSFORMERS = (5, 23)
_STATIC_CACHES = ("static", "hybrid", "sliding_window", "offloaded_static", "offloaded_hybrid")


class DominoContextCache:
    """Per-layer keys/values of the verified context, each (b, kv_heads, c, head_dim). Only accepted
    positions are appended, so it is never cropped; the block's own keys/values are never stored."""

    def __init__(self):
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def __len__(self) -> int:
        return 0 if not self.keys else self.keys[0].shape[2]

    def update(self, layer_idx: int, keys: torch.Tensor, values: torch.Tensor):
        if layer_idx == len(self.keys):
            self.keys.append(keys)
            self.values.append(values)
        else:
            self.keys[layer_idx] = torch.cat([self.keys[layer_idx], keys], dim=2)
            self.values[layer_idx] = torch.cat([self.values[layer_idx], values], dim=2)
        return self.keys[layer_idx], self.values[layer_idx]


def _weights_key(*weights: torch.Tensor) -> tuple:
    """Identifies the current contents of `weights`: storage, in-place version counter, dtype, device."""
    return tuple((w.data_ptr(), w._version, w.dtype, w.device) for w in weights)


def _cached_on(draft, name: str, key: tuple, build):
    """`build()` memoised on `draft` under `name` while `key` is unchanged; never stored while the draft
    trains, since its weights change every step."""
    saved = getattr(draft, name, None)
    if saved is None or saved[0] != key:
        saved = (key, build())
        if not draft.training:
            setattr(draft, name, saved)
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
        return _cached_on(draft, "_domino_target_head", key, lambda: cls(target, draft.config, dtype=draft.dtype))

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


class DominoGenerationStats:
    """What one `generate` call did: tokens drafted and accepted per verify step (prefill excluded)."""

    def __init__(self):
        self.drafted: list[int] = []
        self.accepted: list[int] = []
        # Seconds per phase, filled when `draft.profile_timings` is set (bench --profile).
        self.timings = {"backbone": 0.0, "lm_head": 0.0, "head_rollout": 0.0}

    @property
    def num_steps(self) -> int:
        return len(self.accepted)

    @property
    def tau(self) -> float:
        """Mean acceptance length: tokens produced per target verify forward, bonus token included."""
        return (sum(self.accepted) + len(self.accepted)) / max(len(self.accepted), 1)

    def __repr__(self):
        return f"DominoGenerationStats(steps={self.num_steps}, tau={self.tau:.3f})"


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
    def cached(cls, draft, head: DominoTargetHead) -> "DominoHeadTables":
        """Reuse the tables while neither the draft's head nor the target embedding changed (in place)."""
        key = _weights_key(head.embed_tokens.weight, draft.prefix_gru.weight_ih_l0, draft.embed_proj[0].weight)
        key += (hash(tuple(draft.config.draft_vocab_ids or ())),)
        return _cached_on(draft, "_domino_head_tables", key, lambda: cls(draft, head))

    def input_gates(self, draft_index: torch.Tensor, target_id: torch.Tensor) -> torch.Tensor:
        """W_ih · emb(token) -> (1, 3·Hg)."""
        if self.gate_table is not None and draft_index is not None:
            return self.gate_table[draft_index.reshape(1)]
        return F.linear(self.head.embed(target_id.reshape(1)).to(self.w_ih), self.w_ih)

    def correction(self, hidden_part: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """W2 · SiLU(W1_H·H + W1_S·S) for one slot: (1, r), (1, Hg) -> (1, V')."""
        return F.linear(F.silu(torch.addmm(hidden_part, state, self.w1_state.t())), self.w2)


class DominoCandidateGenerator(CandidateGenerator):
    """Drafts one block per step with a Domino draft for transformers' assisted decoding (batch size 1)."""

    requires_model_outputs = True

    def __init__(self, draft, target, generation_config, logits_processor, input_ids, stopping_criteria=None):
        if input_ids.shape[0] != 1:
            raise ValueError(
                f"Domino speculative decoding supports batch size 1, got {input_ids.shape[0]} sequences. "
                "Call generate once per prompt (or drop `assistant_model` for batched decoding)."
            )
        check_draft_fits_target(draft.config, target)
        self.draft = draft
        self.config = draft.config
        # The draft may run in a cheaper precision than the target (e.g. bf16 draft, fp32 target): drafting
        # only proposes, the target's verification alone decides the output, so this stays lossless.
        self.head = DominoTargetHead.cached(draft, target)
        # Ask the target only for the hidden layers the draft reads (+1: index 0 is the embedding output), or for
        # all of them when the caller collects hidden states (`return_dict_in_generate` splits every layer).
        wanted = True if generation_config.output_hidden_states else [i + 1 for i in self.config.target_layer_ids]
        self.model_kwargs_overrides = {"output_hidden_states": wanted}
        self.cache = DominoContextCache()
        self.max_length = generation_config.max_length
        self.do_sample = bool(generation_config.do_sample)
        self.logits_processor = logits_processor if logits_processor is not None else LogitsProcessorList()
        # Criteria transformers does not enforce inside an accepted block (stop strings, user criteria).
        self.extra_stopping = [
            c for c in (stopping_criteria or []) if not isinstance(c, (MaxLengthCriteria, EosTokenCriteria))
        ]
        self.return_logits = self.do_sample or generation_config.assistant_ensemble_weight is not None
        self.use_head = draft.has_domino_head
        # Head tables once per generate call (weights do not change while generating), not per step.
        self.tables = DominoHeadTables.cached(draft, self.head) if self.use_head else None
        self.slot_offset = 0 if self.config.shift_label else 1
        self.mask_ids = torch.full((1, self.config.block_size - 1), self.config.mask_token_id, dtype=torch.long)
        self.stats = DominoGenerationStats()
        self._pending_drafted = None
        draft.last_generation_stats = self.stats
        # Adaptive draft length: stop proposing once the draft's own chain probability drops below this.
        self.threshold = float(getattr(self.config, "draft_confidence_threshold", 0.0) or 0.0)
        self.profile = bool(getattr(draft, "profile_timings", False))
        self._sync = torch.cuda.synchronize if (self.profile and draft.device.type == "cuda") else (lambda: None)

    @torch.no_grad()
    def get_candidates(self, input_ids, model_kwargs=None, model_outputs=None, is_first_iteration=False, **kwargs):
        # The first call comes before the target's prefill: no hidden states yet, so no candidates.
        if is_first_iteration:
            return input_ids, None
        cur_len = input_ids.shape[1]
        n_draft = min(self.config.num_draft_tokens, self.max_length - cur_len - 1)
        if getattr(self.config, "max_draft_tokens", None):
            n_draft = min(n_draft, self.config.max_draft_tokens)
        self._pending_drafted = 0
        if n_draft <= 0:  # the next target step reaches max_length: nothing left to draft
            return input_ids, None
        if model_outputs is None or getattr(model_outputs, "hidden_states", None) is None:
            raise ValueError("Domino drafting needs the target's hidden states from the previous forward.")

        # 1. Context: target hidden states of the positions verified since the last step (all but the anchor).
        n_cached = len(self.cache)
        n_new = cur_len - 1 - n_cached
        hidden_states = model_outputs.hidden_states
        new_context = torch.cat([hidden_states[i + 1][:, :n_new] for i in self.config.target_layer_ids], dim=-1)
        device = self.draft.device
        context_positions = torch.arange(n_cached, n_cached + n_new, device=device)[None]
        block_positions = torch.arange(cur_len - 1, cur_len - 1 + self.config.block_size, device=device)[None]
        attention_mask = self._key_mask(model_kwargs, cur_len)

        # 2. One backbone forward over [anchor, MASK, …] and one LM-head call for all draft slots.
        clock = self._clock()
        block_ids = torch.cat([input_ids[:, -1:], self.mask_ids.to(input_ids.device)], dim=1)  # (1, B)
        out = self.draft(
            block_embeds=self.head.embed(block_ids).to(device),
            block_position_ids=block_positions,
            target_hidden_states=new_context.to(device),
            context_position_ids=context_positions,
            attention_mask=attention_mask,
            past_key_values=self.cache,
        )
        slot_hidden = out.last_hidden_state[0, self.slot_offset : self.slot_offset + n_draft]  # (n, H)
        clock("backbone")
        base_logits = self.head.logits(slot_hidden)  # (n, V')
        clock("lm_head")

        # 3. Sequential rollout of the Domino head.
        draft_ids, draft_logits = self._rollout(slot_hidden, base_logits, input_ids)
        clock("head_rollout")
        self._pending_drafted = draft_ids.shape[1]
        candidate_ids = torch.cat([input_ids, draft_ids.to(input_ids.device)], dim=1)
        return candidate_ids, draft_logits

    def _clock(self):
        """A lap timer into `stats.timings` when profiling, else a no-op."""
        if not self.profile:
            return lambda phase: None
        self._sync()
        last = [time.perf_counter()]

        def lap(phase):
            self._sync()
            now = time.perf_counter()
            self.stats.timings[phase] += now - last[0]
            last[0] = now

        return lap

    def _key_mask(self, model_kwargs, cur_len):
        """Boolean (1, 1, 1, cur_len - 1 + B) key mask when the prompt has padding, else None."""
        mask = (model_kwargs or {}).get("attention_mask")
        if mask is None or bool(mask.all()):
            return None
        context = mask[:, : cur_len - 1].bool()
        block = torch.ones(1, self.config.block_size, dtype=torch.bool, device=mask.device)
        return torch.cat([context, block], dim=1)[:, None, None, :].to(self.draft.device)

    def _rollout(self, slot_hidden, base_logits, input_ids):
        """Choose the draft tokens slot by slot; returns ids (1, n) and, when sampling, logits (1, n, V).

        Slot j's logits are base_j (+ the head's correction once j ≥ pure_draft_prefix_len, from the GRU state
        after [anchor, d_1 … d_j]). Drafting stops early at a stop criterion, or when the draft's chain
        probability would fall below `draft_confidence_threshold` (fewer candidates: still lossless)."""
        n = base_logits.shape[0]
        tables = self.tables
        if tables is not None:
            hidden_part = F.linear(slot_hidden, tables.w1_hidden)  # (n, r): all slots in one matmul
            anchor = input_ids[:, -1]
            state = slot_hidden.new_zeros(1, self.config.gru_hidden_dim)
            state = self.draft.gru_step(state, tables.input_gates(None, anchor))  # the anchor may be off-vocabulary
        sequence = input_ids
        chosen, processed = [], []
        chain = 1.0
        for j in range(n):
            logits = base_logits[j : j + 1]  # (1, V')
            if tables is not None and j >= self.config.pure_draft_prefix_len:
                logits = torch.add(logits, tables.correction(hidden_part[j : j + 1], state))  # promotes to fp32
            full_logits = self._process(logits, sequence)
            if self.threshold > 0.0:
                # Decide on this slot from its distribution only, never from the token it will draw: a
                # stop that depended on the drawn token would bias speculative sampling.
                probs = (full_logits if full_logits is not None else logits).softmax(dim=-1)
                if chain * float(probs.max()) < self.threshold:
                    break
            token, index = self._pick(logits, full_logits)
            if self.threshold > 0.0:
                chain *= float(probs[0, index if full_logits is None else token].squeeze())
            if self.extra_stopping or self.logits_processor:  # only these read the drafted prefix
                sequence = torch.cat([sequence, token.to(sequence.device)], dim=1)
            if self.extra_stopping and any(bool(c(sequence, None).any()) for c in self.extra_stopping):
                break  # never draft past a stop: the target's own bonus token must be the one that stops
            chosen.append(token)
            processed.append(full_logits)
            if tables is not None and j + 1 < n:
                state = self.draft.gru_step(state, tables.input_gates(index, token))
        if not chosen:
            return input_ids.new_zeros(1, 0), None
        draft_ids = torch.cat(chosen, dim=1)
        draft_logits = torch.stack([p[0] for p in processed])[None] if self.return_logits else None
        return draft_ids, draft_logits

    def _process(self, logits, sequence):
        """The target's logits processors applied to the draft's (corrected) logits, at full vocabulary width;
        None on the plain greedy path, where nothing needs them."""
        if not (self.logits_processor or self.return_logits):
            return None
        return self.logits_processor(sequence, self.head.to_full_vocab(logits))  # (1, V)

    def _pick(self, logits, full_logits):
        """Argmax or sample; returns the target id (1, 1) and its draft-vocabulary index (1, 1)."""
        if full_logits is None:
            index = logits.argmax(dim=-1, keepdim=True)
            return self.head.to_target_ids(index), index
        if self.do_sample:
            token = self._sample(full_logits)
        else:
            token = full_logits.argmax(dim=-1, keepdim=True)
        return token, self.head.to_draft_index(token)

    def _sample(self, full_logits):
        """One draw from softmax(full_logits) (1, V) -> (1, 1). With a sub-vocabulary every other logit is
        normally −inf (probability 0), so drawing over the sub-vocabulary's columns is the same distribution
        with V/V' times fewer random numbers; a processor that put mass outside it falls back to the full draw."""
        ids = self.head.draft_vocab_ids
        if ids is not None:
            ids = ids.to(full_logits.device)
            sub_logits = full_logits[:, ids]  # (1, V')
            if int(torch.isfinite(full_logits).sum()) == int(torch.isfinite(sub_logits).sum()):
                return ids[torch.multinomial(sub_logits.softmax(dim=-1), num_samples=1)]
        return torch.multinomial(full_logits.softmax(dim=-1), num_samples=1)

    def update_candidate_strategy(self, input_ids, scores, num_matches):
        if self._pending_drafted is not None:
            self.stats.drafted.append(self._pending_drafted)
            self.stats.accepted.append(int(num_matches))
            self._pending_drafted = None


# ------------------------------------------------------------------------------------------------ dispatch
_STOPPING_CRITERIA = contextvars.ContextVar("domino_stopping_criteria", default=None)


def is_domino_draft(model) -> bool:
    config = getattr(model, "config", None)
    return getattr(config, "model_type", None) == "domino_draft" and hasattr(model, "get_candidate_generator")


def _looks_like_domino_checkpoint(model) -> bool:
    """A Domino/DFlash draft checkpoint loaded as a plain model (i.e. without `trust_remote_code`)."""
    config = getattr(model, "config", None)
    if config is None or is_domino_draft(model):
        return False
    auto_map = str(getattr(config, "auto_map", "") or "")
    archs = str(getattr(config, "architectures", "") or "")
    return hasattr(config, "dflash_config") or "domino" in auto_map.lower() or "Domino" in archs


def _validate_domino_request(target, draft, generation_config) -> None:
    if generation_config.cache_implementation in _STATIC_CACHES:
        raise ValueError(
            f"Domino speculative decoding needs a dynamic cache, got cache_implementation="
            f"'{generation_config.cache_implementation}': drop `cache_implementation` (the verified tokens are "
            "cropped from the cache after every step, which a static cache cannot do)."
        )
    check_draft_fits_target(draft.config, target)


def install_generate_hook() -> None:
    """Route `generate(assistant_model=<Domino draft>)` to `DominoCandidateGenerator`.

    Every other assistant and generation mode goes to the stock transformers code untouched. Idempotent:
    the remote-code copy and the domino_hf copy of this module may both call it; the first one wins and the
    dispatch asks the draft itself for its generator, so either copy serves both.
    """
    import transformers
    from transformers.generation.utils import GenerationMixin

    if getattr(GenerationMixin, "_domino_hook_installed", False):
        return
    release = tuple(int(p) for p in transformers.__version__.split(".")[:2] if p.isdigit())
    needed = ("_get_candidate_generator", "_assisted_decoding", "_validate_generation_mode")
    if release < MIN_TRANSFORMERS or not all(hasattr(GenerationMixin, name) for name in needed):
        raise ImportError(
            f"Domino drafts need transformers>={'.'.join(map(str, MIN_TRANSFORMERS))} (found "
            f"{transformers.__version__}), whose assisted decoding accepts model-output candidate generators: "
            "pip install -U 'transformers>=5.23,<5.24'"
        )
    original_validate = GenerationMixin._validate_generation_mode
    original_get_generator = GenerationMixin._get_candidate_generator
    original_assisted = GenerationMixin._assisted_decoding

    def _validate_generation_mode(self, generation_mode, generation_config, generation_mode_kwargs):
        assistant = generation_mode_kwargs.get("assistant_model")
        if is_domino_draft(assistant):
            _validate_domino_request(self, assistant, generation_config)
        elif assistant is not None and _looks_like_domino_checkpoint(assistant):
            raise ValueError(
                f"The assistant model is a Domino/DFlash draft checkpoint loaded as a plain "
                f"{type(assistant).__name__}, so its drafting code is missing. Load it with "
                "`AutoModel.from_pretrained(path, trust_remote_code=True)` or `domino_hf.DominoDraftModel.from_pretrained(path)`."
            )
        return original_validate(self, generation_mode, generation_config, generation_mode_kwargs)

    def _get_candidate_generator(self, *args, **kwargs):
        assistant = kwargs.get("assistant_model")
        if is_domino_draft(assistant):
            return assistant.get_candidate_generator(
                target=self,
                generation_config=kwargs["generation_config"],
                logits_processor=kwargs.get("logits_processor"),
                input_ids=kwargs["input_ids"],
                stopping_criteria=_STOPPING_CRITERIA.get(),
            )
        return original_get_generator(self, *args, **kwargs)

    def _assisted_decoding(self, *args, **kwargs):
        stopping = kwargs.get("stopping_criteria", args[2] if len(args) > 2 else None)
        token = _STOPPING_CRITERIA.set(stopping)
        try:
            return original_assisted(self, *args, **kwargs)
        finally:
            _STOPPING_CRITERIA.reset(token)

    GenerationMixin._validate_generation_mode = _validate_generation_mode
    GenerationMixin._get_candidate_generator = _get_candidate_generator
    GenerationMixin._assisted_decoding = _assisted_decoding
    GenerationMixin._domino_hook_installed = True
