# Copyright 2026 The domino-hf authors. Licensed under the Apache License, Version 2.0.
"""Domino draft model: a DFlash parallel drafting backbone plus the Domino causal correction head.

Remote-code file: it imports only torch and transformers, so a saved checkpoint loads with
`AutoModel.from_pretrained(folder, trust_remote_code=True)` in a Python where domino_hf is not installed.
Importing it installs the `generate(assistant_model=draft)` dispatch (see `dispatch_domino.py`) on a supported
transformers (on any other, building a draft raises an ImportError naming the supported range); the dispatch builds
the candidate generator (`generation_domino.py`). Imports flow one way: this file → dispatch → generation.

Shapes: b = batch, c = context positions, q = block (query) positions, H = hidden size, E = target
embedding size (= H), Hg = GRU hidden size, V' = draft output vocabulary (sub-vocabulary or full).
"""

from __future__ import annotations

import logging
import os
import shutil
import weakref

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput

from .configuration_domino import DRAFTING_FIELDS, DominoConfig, _check_field, draft_level_settings
from .dispatch_domino import (
    check_generate_hook_installed,
    check_transformers_version,
    install_generate_hook_if_supported,
)
from .suffix_domino import SuffixCache, is_suffix_cache

logger = logging.getLogger(__name__)

# Each draft's own suffix cache, outside the module's state: a copy of a draft (`copy.deepcopy`) starts with an
# empty cache of its own, and the cache is never saved with the weights.
_DRAFT_SUFFIX_CACHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

# Copied beside every saved checkpoint, so it loads with `trust_remote_code=True` and nothing else installed.
REMOTE_CODE_FILES = (
    "configuration_domino.py",
    "modeling_domino.py",
    "target_domino.py",
    "hybrid_domino.py",
    "generation_domino.py",
    "dispatch_domino.py",
    "suffix_domino.py",
    "batch_domino.py",
    "batch_policy_domino.py",
    "ragged_domino.py",
    "stops_domino.py",
    "tree_domino.py",
    "acceptance_domino.py",
    "proposer_domino.py",
    "cost_domino.py",
)


class DominoRMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(dtype)


def rotary_cos_sin(position_ids: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """Default RoPE tables for `position_ids` (b, n) -> cos, sin of shape (b, 1, n, head_dim)."""
    exponents = torch.arange(0, head_dim, 2, device=position_ids.device, dtype=torch.float32) / head_dim
    inv_freq = 1.0 / (theta**exponents)
    freqs = position_ids.to(torch.float32)[..., None] * inv_freq  # (b, n, head_dim/2)
    emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # (b, 1, n, head_dim)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class DominoAttention(nn.Module):
    """Qwen3-style attention whose queries come from the block only and whose keys/values are this layer's
    projections of the fused context followed by those of the block (non-causal inside the block)."""

    def __init__(self, config: DominoConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.rope_theta = config.rope_theta
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=bias)
        self.q_norm = DominoRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = DominoRMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def key_values(self, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """(b, n, H) -> rotated keys and values, each (b, kv_heads, n, head_dim)."""
        b, n, _ = hidden_states.shape
        keys = self.k_norm(self.k_proj(hidden_states).view(b, n, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        values = self.v_proj(hidden_states).view(b, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return apply_rotary(keys, cos, sin), values

    def forward(self, block_states, block_cos, block_sin, context_keys, context_values, attention_mask=None):
        # block_states: (b, q, H); context_keys/values: (b, kv_heads, c, head_dim), already rotated
        b, q, _ = block_states.shape
        queries = self.q_norm(self.q_proj(block_states).view(b, q, self.num_heads, self.head_dim)).transpose(1, 2)
        queries = apply_rotary(queries, block_cos, block_sin)  # (b, heads, q, head_dim)
        block_keys, block_values = self.key_values(block_states, block_cos, block_sin)
        keys = torch.cat([context_keys, block_keys], dim=2)  # (b, kv_heads, c + q, head_dim)
        values = torch.cat([context_values, block_values], dim=2)
        attn = F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=attention_mask, enable_gqa=self.num_heads != self.num_kv_heads
        )  # (b, heads, q, head_dim)
        return self.o_proj(attn.transpose(1, 2).reshape(b, q, self.num_heads * self.head_dim))


class DominoMLP(nn.Module):
    def __init__(self, config: DominoConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DominoDecoderLayer(nn.Module):
    def __init__(self, config: DominoConfig):
        super().__init__()
        self.self_attn = DominoAttention(config)
        self.mlp = DominoMLP(config)
        self.input_layernorm = DominoRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = DominoRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, block_states, block_cos, block_sin, context_keys, context_values, attention_mask=None):
        residual = block_states
        hidden = self.self_attn(
            self.input_layernorm(block_states), block_cos, block_sin, context_keys, context_values, attention_mask
        )
        hidden = residual + hidden
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class DominoPreTrainedModel(PreTrainedModel):
    config_class = DominoConfig
    base_model_prefix = "domino"
    supports_gradient_checkpointing = False
    _no_split_modules = ["DominoDecoderLayer"]
    _supports_sdpa = True

    @torch.no_grad()
    def _init_weights(self, module):
        std = getattr(self.config, "initializer_range", 0.02)
        if isinstance(module, nn.Linear):
            module.weight.normal_(0.0, std)
            if module.bias is not None:
                module.bias.zero_()
        elif isinstance(module, DominoRMSNorm):
            module.weight.fill_(1.0)
        elif isinstance(module, nn.GRU):
            bound = 1.0 / module.hidden_size**0.5
            for weight in module.parameters():
                weight.uniform_(-bound, bound)


class DominoDraftModel(DominoPreTrainedModel):
    r"""
    Domino draft model. It owns no embedding and no LM head: callers pass the target's embeddings of the block
    tokens in, and apply the target's LM head to the returned hidden states (see `DominoTargetHead`).

    Args:
        config ([`DominoConfig`]): the architecture.

    Attributes:
        generation_config (`GenerationConfig`): the draft's drafting defaults (the `DRAFTING_FIELDS` of
            [`DraftingSettings`]), loaded by `from_pretrained` from the draft's `generation_config.json` and written
            by `save_pretrained`. `draft.generation_config.draft_backoff = False` changes the draft's default;
            `generate`'s own values still win.
        last_generation_stats ([`DominoGenerationStats`] or `None`): what the last `generate` call with this draft
            did, step by step (tokens proposed and accepted, where each proposal came from). The dispatch sets it
            when it builds the call's generator (`make_candidate_generator`); `None` before any call.
        suffix_cache ([`SuffixCache`]): the draft's own store of earlier generations, read by every `generate`
            call with this draft that uses a suffix cache (`use_suffix_cache`, on by default) and passes none of
            its own; created on first use with `suffix_cache_size` tokens of capacity, never saved with the
            weights, not shared by a copy of the draft. Assign a `SuffixCache` (e.g. `SuffixCache.load(path)`)
            to replace it, `draft.suffix_cache.clear()` to empty it.
    """

    def __init__(self, config: DominoConfig):
        import transformers

        check_transformers_version(transformers.__version__)  # a clear error, not a half-working draft
        super().__init__(config)
        n_context = len(config.target_layer_ids)
        self.fc = nn.Linear(n_context * config.target_hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = DominoRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList([DominoDecoderLayer(config) for _ in range(config.num_hidden_layers)])
        self.norm = DominoRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        if config.use_domino_head:
            # Causal encoder over the target embeddings of the tokens realised so far in the block: a bias-free
            # GRU, run step by step by `gru_step` (the module holds its weights under the published names).
            self.prefix_gru = nn.GRU(config.target_hidden_size, config.gru_hidden_dim, bias=False, batch_first=True)
            # Low-rank logit correction W2 · SiLU(W1 · [H ; S]) (`correction`; [0] is W1, [2] is W2).
            self.embed_proj = nn.Sequential(
                nn.Linear(config.hidden_size + config.gru_hidden_dim, config.correction_rank, bias=False),
                nn.SiLU(),
                nn.Linear(config.correction_rank, config.draft_vocab_size, bias=False),
            )
        self.generation_config = GenerationConfig()
        self.last_generation_stats = None
        self.post_init()

    @property
    def suffix_cache(self) -> SuffixCache:
        cache = _DRAFT_SUFFIX_CACHES.get(self)
        if cache is None:
            size = draft_level_settings(self.generation_config, self.config)["suffix_cache_size"]
            cache = _DRAFT_SUFFIX_CACHES[self] = SuffixCache(max_tokens=size)
        return cache

    @suffix_cache.setter
    def suffix_cache(self, cache: SuffixCache) -> None:
        if not is_suffix_cache(cache):
            raise TypeError(f"draft.suffix_cache takes a SuffixCache, got {type(cache).__name__}.")
        _DRAFT_SUFFIX_CACHES[self] = cache

    # ---------------------------------------------------------------- what stock assisted decoding calls
    # Without the dispatch (after `uninstall_generate_hook()`) transformers takes the draft for an ordinary
    # assistant model and calls these first (`_supports_logits_to_keep` when building its candidate generator,
    # `generate` for every candidate): they raise the fix instead of an AttributeError from deep inside.
    def _supports_logits_to_keep(self) -> bool:
        check_generate_hook_installed()
        return False

    def generate(self, *args, **kwargs):
        check_generate_hook_installed()
        raise TypeError(
            "A Domino draft does not generate on its own: it drafts for its target, "
            "`target.generate(**inputs, assistant_model=draft)`."
        )

    # ----------------------------------------------------------------------------------------- backbone
    @property
    def has_domino_head(self) -> bool:
        """Whether the head exists (weights) and is switched on (`config.use_domino_head`, togglable)."""
        return self.config.use_domino_head and hasattr(self, "prefix_gru")

    def fuse_context(self, target_hidden_states: torch.Tensor) -> torch.Tensor:
        """(b, c, n_layers * H_target) concatenated target hidden states -> (b, c, H) context features.

        A float16 draft projects in float32: target hidden states can exceed float16's range (Gemma-3's reach
        3e5); after the RMSNorm the features are back in range."""
        dtype = self.fc.weight.dtype
        if dtype == torch.float16:
            projected = F.linear(target_hidden_states.float(), self.fc.weight.float())
            return self.hidden_norm(projected).to(dtype)
        return self.hidden_norm(self.fc(target_hidden_states.to(dtype)))

    def forward(
        self,
        block_embeds: torch.Tensor,
        block_position_ids: torch.Tensor,
        target_hidden_states: torch.Tensor | None = None,
        context_position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values=None,
        **kwargs,
    ) -> BaseModelOutput:
        r"""
        Args:
            block_embeds: (b, q, H) target embeddings of the block(s) `[anchor, MASK, ...]`.
            block_position_ids: (b, q) absolute positions of the block slots.
            target_hidden_states: (b, c, n_layers * H) new context (target layers `target_layer_ids`,
                concatenated along features); with a cache, only positions not cached yet.
            context_position_ids: (b, c) positions of `target_hidden_states`.
            attention_mask: optional boolean (b, 1, q, c_total + q), True = may attend (training mask).
            past_key_values: the generator's context cache (`DominoContextCache`): new context keys/values are
                appended to it through its `update(layer_idx, keys, values)`.
        Returns:
            `BaseModelOutput` with `last_hidden_state` (b, q, H): the final-norm hidden states H of the slots.
        """
        dtype = self.fc.weight.dtype
        block_cos, block_sin = rotary_cos_sin(block_position_ids, self.config.head_dim, self.config.rope_theta, dtype)
        context = None
        if target_hidden_states is not None and target_hidden_states.shape[1] > 0:
            context = self.fuse_context(target_hidden_states)  # (b, c, H)
            ctx_cos, ctx_sin = rotary_cos_sin(context_position_ids, self.config.head_dim, self.config.rope_theta, dtype)
        hidden = block_embeds.to(dtype)
        for idx, layer in enumerate(self.layers):
            attn = layer.self_attn
            if context is not None:
                keys, values = attn.key_values(context, ctx_cos, ctx_sin)
            else:
                b = hidden.shape[0]
                keys = values = hidden.new_zeros(b, attn.num_kv_heads, 0, attn.head_dim)
            if past_key_values is not None:
                keys, values = past_key_values.update(idx, keys, values)
            hidden = layer(hidden, block_cos, block_sin, keys, values, attention_mask)
        return BaseModelOutput(last_hidden_state=self.norm(hidden))

    # --------------------------------------------------------------------------------------- Domino head
    # S_0 = 0, S_t = GRU(S_{t-1}, emb(token_t));  ΔL_j = W2 · SiLU(W1 · [H_j ; S_j]),  W1 = [W1_H | W1_S].
    # Training runs it teacher-forced over whole blocks (`causal_states`, `correction`); drafting runs the same
    # methods one token at a time, computing W1_H · H for all slots at once (`correction_hidden_part`).
    def head_parameters(self) -> tuple[torch.Tensor, ...]:
        """The Domino head's weights: what generation-time tables derived from them depend on."""
        return (*self.prefix_gru.parameters(), *self.embed_proj.parameters())

    def head_input_gates(self, token_embeds: torch.Tensor) -> torch.Tensor:
        """GRU input gates W_ih · x: (…, E) target embeddings -> (…, 3·Hg)."""
        weight = self.prefix_gru.weight_ih_l0
        return F.linear(token_embeds.to(weight), weight)

    def gru_step(self, state: torch.Tensor, input_gates: torch.Tensor) -> torch.Tensor:
        """One bias-free GRU step (PyTorch's gate order r, z, n): (N, Hg) state, (N, 3·Hg) `head_input_gates`
        -> (N, Hg) next state."""
        hidden_gates = F.linear(state, self.prefix_gru.weight_hh_l0)  # (N, 3·Hg)
        size = state.shape[-1]
        # Few, fused ops: this runs once per drafted token, where per-op overhead is the cost.
        reset_update = torch.sigmoid(input_gates[..., : 2 * size] + hidden_gates[..., : 2 * size])  # (N, 2·Hg)
        reset, update = reset_update[..., :size], reset_update[..., size:]
        candidate = torch.tanh(torch.addcmul(input_gates[..., 2 * size :], reset, hidden_gates[..., 2 * size :]))
        return torch.lerp(candidate, state, update)  # candidate + update · (state − candidate)

    def causal_states(self, token_embeds: torch.Tensor) -> torch.Tensor:
        """Teacher-forced GRU from a zero state: (N, T, E) embeddings -> (N, T, Hg) state after each token."""
        gates = self.head_input_gates(token_embeds)  # (N, T, 3·Hg): all input gates in one matmul
        state = gates.new_zeros(gates.shape[0], self.config.gru_hidden_dim)
        states = []
        for t in range(gates.shape[1]):
            state = self.gru_step(state, gates[:, t])
            states.append(state)
        return torch.stack(states, dim=1)

    def correction_hidden_part(self, base_hidden: torch.Tensor) -> torch.Tensor:
        """W1_H · H: (…, H) slot hidden states -> (…, r), the part of the correction that needs no token."""
        return F.linear(base_hidden, self.embed_proj[0].weight[:, : self.config.hidden_size])

    def correction_from_parts(self, hidden_part: torch.Tensor, causal_state: torch.Tensor) -> torch.Tensor:
        """ΔL = W2 · SiLU(W1_H·H + W1_S·S): (…, r) `correction_hidden_part`, (…, Hg) state -> (…, V')."""
        w1_state = self.embed_proj[0].weight[:, self.config.hidden_size :]  # (r, Hg)
        rank = hidden_part.shape[-1]
        state = causal_state.to(hidden_part.dtype).reshape(-1, w1_state.shape[1])
        mixed = torch.addmm(hidden_part.reshape(-1, rank), state, w1_state.t())  # (N, r), one fused op
        return F.linear(F.silu(mixed), self.embed_proj[2].weight).view(*hidden_part.shape[:-1], -1)

    def correction(self, base_hidden: torch.Tensor, causal_state: torch.Tensor) -> torch.Tensor:
        """ΔL = W2 · SiLU(W1 · [H ; S]): (…, H), (…, Hg) -> (…, V')."""
        return self.correction_from_parts(self.correction_hidden_part(base_hidden), causal_state)

    @classmethod
    def from_target(cls, target, tokenizer=None, num_hidden_layers=1, block_size=16, **config_overrides):
        """A freshly initialised draft that fits `target` (see `DominoConfig.for_target` for the choices of
        `target_layer_ids` and `mask_token_id`), on the target's device, in float32. Drafting settings among the
        keywords (`DRAFTING_FIELDS`) become the draft's `generation_config`, the rest configure the architecture."""
        drafting = {name: config_overrides.pop(name) for name in DRAFTING_FIELDS if name in config_overrides}
        for name, value in drafting.items():
            _check_field(name, value, owner="DraftingSettings")
        config = DominoConfig.for_target(
            target.config, tokenizer, num_hidden_layers=num_hidden_layers, block_size=block_size, **config_overrides
        )
        draft = cls(config).to(target.device)
        draft.generation_config = GenerationConfig(**drafting)
        return draft

    # ------------------------------------------------------------------------------------- loading, saving
    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """As `PreTrainedModel.from_pretrained`, plus the draft's `generation_config.json` (its drafting defaults),
        which 🤗 loads only for models that generate on their own. From a local folder or a Hub id, with the same
        download options (a Hub draft's file comes from the cache in offline mode); a `generation_config=`
        keyword replaces the file. A checkpoint without the file keeps the drafting keys of its `config.json`."""
        generation_config = kwargs.pop("generation_config", None)
        loaded = super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded  # (model, info) with output_loading_info
        if generation_config is None and pretrained_model_name_or_path is not None:
            download = {key: kwargs[key] for key in _DOWNLOAD_KEYWORDS if key in kwargs}
            try:
                generation_config = GenerationConfig.from_pretrained(pretrained_model_name_or_path, **download)
            except OSError:  # no generation_config.json: a checkpoint saved before drafting settings moved there
                legacy = sorted(name for name in DRAFTING_FIELDS if name in vars(model.config))
                if legacy:
                    logger.info("%s: drafting settings %s read from config.json (no generation_config.json).",
                                pretrained_model_name_or_path, ", ".join(legacy))
        model.generation_config = generation_config if generation_config is not None else GenerationConfig()
        draft_level_settings(model.generation_config, model.config)  # a bad value fails at load, naming it
        return loaded

    def save_pretrained(self, save_directory, *args, **kwargs):
        """Saves weights, `config.json` (the architecture), `generation_config.json` (every drafting setting the
        draft uses, `draft_level_settings`) and the remote-code files, so the folder is a Hub-ready repo. Drafting
        keys a config still carries (loaded from an older checkpoint) go to `generation_config.json` only."""
        self.config.auto_map = {
            "AutoConfig": "configuration_domino.DominoConfig",
            "AutoModel": "modeling_domino.DominoDraftModel",
        }
        self.config.architectures = ["DominoDraftModel"]
        generation_config = GenerationConfig.from_dict(self.generation_config.to_dict())
        for name, value in draft_level_settings(self.generation_config, self.config).items():
            setattr(generation_config, name, value)
        legacy = {name: vars(self.config).pop(name) for name in DRAFTING_FIELDS if name in vars(self.config)}
        try:
            super().save_pretrained(save_directory, *args, **kwargs)
        finally:
            vars(self.config).update(legacy)  # the in-memory draft drafts as before
        if kwargs.get("is_main_process", True):
            generation_config.save_pretrained(save_directory)
            here = os.path.dirname(os.path.abspath(__file__))
            for name in REMOTE_CODE_FILES:
                shutil.copyfile(os.path.join(here, name), os.path.join(save_directory, name))

    def push_to_hub(self, repo_id, *args, **kwargs):
        """🤗's upload (weights, config, generation config and remote code, through `save_pretrained`), tagged as
        a Domino draft. domino-hf's `push_draft(draft, repo_id)` (or `domino export --push_to_hub`) uploads the
        same folder with the Domino model card instead of 🤗's generic one."""
        kwargs["tags"] = [*(kwargs.get("tags") or []), "speculative-decoding", "draft-model", "domino"]
        return super().push_to_hub(repo_id, *args, **kwargs)


# `from_pretrained`'s keywords that say where and how to fetch a file; the generation config is fetched with them.
_DOWNLOAD_KEYWORDS = ("cache_dir", "force_download", "proxies", "local_files_only", "token", "revision", "subfolder")


install_generate_hook_if_supported()

__all__ = ["DominoDraftModel", "DominoPreTrainedModel"]
