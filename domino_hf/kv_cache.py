"""A `DynamicCache` whose append costs O(new tokens): preallocated buffers grown geometrically, returned as views.

Why: transformers' `DynamicLayer` appends with `torch.cat`, which copies every layer's whole cache on every
forward — a quarter of a plain 1-token step at 1,500 tokens of context on SmolLM2 (docs/cpu_kernels.md),
and growing with the context. `GrowingCache` writes new keys/values into spare room at the end of a buffer
and hands attention a view of the filled part; a full buffer is replaced by one half as large again (copied
once), so appends are amortised O(new tokens).

It is a `DynamicCache` subclass and behaves as one for everything generation asks of it: `get_seq_length`,
`get_mask_sizes`, `crop(-n)` (assisted decoding and the Domino generator roll back rejected tokens; a crop
only moves the end of the view, and the next append overwrites the rejected slots), `reset`, and the
batch/beam operations (which replace a layer's tensors; the next append re-adopts them into a buffer).
Sliding-window layers (Gemma3, Mistral with a window) return exactly the states the stock sliding layer
returns, and keep a few tokens more than the window so that the rejected tokens of the last forward can
always be cropped, with or without `activate_past_recording`. Other layer types (linear attention, shared
KV) keep their stock classes.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

HEADROOM = 256  # tokens of spare room in a fresh buffer
GROWTH = 1.5  # a full buffer is replaced by one this many times larger (geometric: amortised O(1) per token)


class _BufferedStates:
    """Keys and values kept in preallocated (batch, heads, capacity, dim) buffers; `self.keys`/`self.values`
    are views of the live slots `[_start, _end)`."""

    keys: torch.Tensor | None
    values: torch.Tensor | None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._clear_buffers()

    def _clear_buffers(self) -> None:
        self._key_buffer = self._value_buffer = None
        self._start = self._end = 0

    def _own_views(self) -> bool:
        """Whether `keys`/`values` are still the views this layer set (a base-class method may have replaced
        them, e.g. `reorder_cache`, `batch_select_indices`, `offload`)."""
        return (
            getattr(self, "_key_buffer", None) is not None
            and self.keys is self._key_view
            and self.values is self._value_view
        )

    def _set_views(self) -> None:
        self._key_view = self._key_buffer[:, :, self._start : self._end]
        self._value_view = self._value_buffer[:, :, self._start : self._end]
        self.keys, self.values = self._key_view, self._value_view

    def _rebuffer(self, keep_from: int, capacity: int, like_keys, like_values) -> None:
        """New buffers of `capacity` slots, shaped and typed for states like `like_keys`/`like_values` (the
        dtype promoted with the old buffers'), holding the live slots from `keep_from` on."""
        kept = self._end - keep_from

        def fresh(old, like):
            dtype = like.dtype if old is None else torch.promote_types(old.dtype, like.dtype)
            buffer = torch.empty((*like.shape[:2], capacity, like.shape[-1]), dtype=dtype, device=like.device)
            if kept:
                buffer[:, :, :kept].copy_(old[:, :, keep_from : self._end])
            return buffer

        self._key_buffer = fresh(self._key_buffer, like_keys)
        self._value_buffer = fresh(self._value_buffer, like_values)
        self._start, self._end = 0, kept

    def _adopt(self) -> None:
        """Make the buffers hold exactly `keys`/`values`, whatever replaced them."""
        if self._own_views():
            return
        keys, values = self.keys, self.values
        self._clear_buffers()
        if keys is not None and keys.dim() == 4 and keys.shape[-2] > 0:
            self._key_buffer, self._value_buffer = keys, values
            self._end = keys.shape[-2]
            self._rebuffer(0, self._end + HEADROOM, keys, values)
            self._set_views()

    def _keep_from(self) -> int:
        """The first slot worth keeping when the buffers must be replaced (all of them for a full layer)."""
        return self._start

    def _capacity(self, needed: int) -> int:
        old = 0 if self._key_buffer is None else self._key_buffer.shape[-2]
        return max(needed + HEADROOM, int(old * GROWTH))

    def _append(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self._adopt()
        new = key_states.shape[-2]
        buffer = self._key_buffer
        if buffer is not None:
            if key_states.shape[:2] != buffer.shape[:2] or key_states.shape[-1] != buffer.shape[-1]:
                raise ValueError(
                    f"Key states of shape {tuple(key_states.shape)} do not match the cached ones "
                    f"{tuple(self.keys.shape)} (batch, heads, tokens, head_dim)."
                )
        if (
            buffer is None
            or self._end + new > buffer.shape[-2]
            or torch.promote_types(buffer.dtype, key_states.dtype) != buffer.dtype
            or torch.promote_types(self._value_buffer.dtype, value_states.dtype) != self._value_buffer.dtype
        ):
            keep_from = self._keep_from() if buffer is not None else 0
            self._rebuffer(keep_from, self._capacity(self._end - keep_from + new), key_states, value_states)
        self._key_buffer[:, :, self._end : self._end + new].copy_(key_states)
        self._value_buffer[:, :, self._end : self._end + new].copy_(value_states)
        self._end += new
        self._set_views()

    def _croppable(self, tokens_to_remove: int) -> bool:
        """Whether a `crop(tokens_to_remove)` has anything to remove (refusing a positive count, as stock does)."""
        if tokens_to_remove > 0:
            raise ValueError(
                f"Calling `crop` with a positive value (`{tokens_to_remove}`) is not supported. "
                "Please use a negative integer to remove that number of tokens from the cache instead."
            )
        if tokens_to_remove == 0 or not self.is_initialized:
            return False
        self._adopt()
        return self._key_buffer is not None


class GrowingLayer(_BufferedStates, DynamicLayer):
    """A full-attention `DynamicLayer` on preallocated buffers (see the module doc)."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self._append(key_states, value_states)
        return self.keys, self.values

    def crop(self, tokens_to_remove: int) -> None:
        if not self._croppable(tokens_to_remove):
            return
        self._end = max(self._start, self._end + tokens_to_remove)
        self._set_views()


class GrowingSlidingWindowLayer(_BufferedStates, DynamicSlidingWindowLayer):
    """A sliding-window `DynamicSlidingWindowLayer` on preallocated buffers: returns what the stock layer
    returns (the last `sliding_window - 1` cached tokens, at most, then the new ones) and keeps at least the
    window before the tokens of the last forward, so those can be cropped."""

    def _keep_from(self) -> int:
        return max(self._start, self._end - (self.sliding_window - 1))

    def _capacity(self, needed: int) -> int:
        # Room for a window's worth of appends past what is needed now: the next replacement keeps only a
        # window, so a long prompt's buffer shrinks back, and each replacement copies a window per window appended.
        return needed + self.sliding_window + HEADROOM

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        visible_before = min(self.cumulative_length, self.sliding_window - 1)
        self.cumulative_length += key_states.shape[-2]
        self._append(key_states, value_states)
        first = self._end - visible_before - key_states.shape[-2]
        return self._key_buffer[:, :, first : self._end], self._value_buffer[:, :, first : self._end]

    def crop(self, tokens_to_remove: int) -> None:
        if not self._croppable(tokens_to_remove):
            return
        remaining = self.cumulative_length + tokens_to_remove
        if remaining < 0 or self._end + tokens_to_remove - self._start < min(remaining, self.sliding_window - 1):
            raise RuntimeError(
                f"Cannot crop {-tokens_to_remove} tokens from a sliding-window layer that kept "
                f"{self._end - self._start} of them (window {self.sliding_window}): only the tokens of the last "
                "forward can be rolled back."
            )
        self._end += tokens_to_remove
        self.cumulative_length = remaining
        self._set_views()


_GROWING_CLASSES = {DynamicLayer: GrowingLayer, DynamicSlidingWindowLayer: GrowingSlidingWindowLayer}


def _growing(layer):
    """The buffered counterpart of a fresh stock layer (other layer types are kept as they are)."""
    if type(layer) is DynamicLayer:
        return GrowingLayer()
    if type(layer) is DynamicSlidingWindowLayer:
        return GrowingSlidingWindowLayer(sliding_window=layer.sliding_window)
    return layer


class GrowingCache(DynamicCache):
    """`DynamicCache` on `GrowingLayer`/`GrowingSlidingWindowLayer` (see the module doc). Same constructor."""

    def __init__(self, ddp_cache_data=None, config=None, offloading: bool = False,
                 offload_only_non_sliding: bool = False):
        super().__init__(config=config, offloading=offloading, offload_only_non_sliding=offload_only_non_sliding)
        self.layers = [_growing(layer) for layer in self.layers]
        if self.layer_class_to_replicate is not None:
            self.layer_class_to_replicate = _GROWING_CLASSES.get(
                self.layer_class_to_replicate, self.layer_class_to_replicate)
        for layer_idx, states in enumerate(ddp_cache_data or ()):
            key_states, value_states = states[:2]
            sliding = states[2] if len(states) == 3 else None
            if layer_idx >= len(self.layers):
                self.layers.append(GrowingLayer() if sliding is None else
                                   GrowingSlidingWindowLayer(sliding_window=int(sliding)))
            if key_states is not None and value_states is not None:
                self.layers[layer_idx].update(key_states, value_states)


def supports_growing_cache(config) -> bool:
    """Whether `GrowingCache(config=config)` buffers every attention layer of this config's decoder: all its
    layers are full or sliding-window attention (no linear-attention, shared-KV or indexed layers)."""
    try:
        cache = DynamicCache(config=config)
    except (TypeError, ValueError, KeyError, AttributeError):
        return False
    return bool(cache.layers) and all(type(layer) in _GROWING_CLASSES for layer in cache.layers)


def _default_cache_wanted(model, kwargs: dict) -> bool:
    """Whether `generate(**kwargs)` would build a default `DynamicCache` for `model` (and only then)."""
    if any(kwargs.get(name) is not None for name in ("cache", "past_key_values", "cache_implementation")):
        return False
    config = kwargs.get("generation_config") or getattr(model, "generation_config", None)

    def setting(name, default):
        value = kwargs.get(name)
        return value if value is not None else getattr(config, name, default)

    return (
        setting("use_cache", True) is not False
        and setting("cache_implementation", None) is None
        and (setting("num_beams", 1) or 1) == 1
    )


class GrowingCacheGenerate:
    """`model.generate` that passes a fresh `GrowingCache` where `generate` would build a default
    `DynamicCache` (no cache, `cache_implementation` or beam search asked for); every other call, and every
    argument, goes to the class's `generate` unchanged. Installed on one model instance by
    `use_growing_cache`; a deep copy of the model gets its own."""

    def __init__(self, model):
        self.model = model

    def __call__(self, *args, **kwargs):
        model = self.model
        if _default_cache_wanted(model, kwargs):
            from .modeling.dispatch_domino import CACHE_ARGUMENT

            kwargs[CACHE_ARGUMENT] = GrowingCache(config=model.config.get_text_config(decoder=True))
        return type(model).generate(model, *args, **kwargs)


def use_growing_cache(model) -> bool:
    """Make `model.generate` decode on a `GrowingCache` by default; True when installed. Left alone: models
    that cannot generate, encoder-decoders, and decoders with layers other than full or sliding-window
    attention."""
    if isinstance(model.__dict__.get("generate"), GrowingCacheGenerate):
        return True
    can_generate = getattr(model, "can_generate", None)
    config = getattr(model, "config", None)
    if not callable(can_generate) or not can_generate() or config is None or "generate" in model.__dict__:
        return False
    if getattr(config, "is_encoder_decoder", False) or not supports_growing_cache(config.get_text_config(decoder=True)):
        return False
    model.__dict__["generate"] = GrowingCacheGenerate(model)
    return True


def use_default_cache(model) -> None:
    """Undo `use_growing_cache`."""
    if isinstance(model.__dict__.get("generate"), GrowingCacheGenerate):
        del model.__dict__["generate"]
