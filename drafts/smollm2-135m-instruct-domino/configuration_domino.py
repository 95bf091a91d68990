# Copyright 2026 The domino-hf authors. Licensed under the Apache License, Version 2.0.
"""Configuration of a Domino draft model (remote-code file: imports only torch and transformers)."""

from dataclasses import dataclass, fields

from transformers import PretrainedConfig


# The target layers a config without `target_layer_ids` reads: the published Qwen3 drafts' (36 layers).
DEFAULT_NUM_TARGET_LAYERS = 36
DEFAULT_TARGET_LAYER_IDS = (1, 9, 17, 25, 33)


class DominoConfig(PretrainedConfig):
    r"""
    Configuration of a [`DominoDraftModel`]: a DFlash parallel drafting backbone fed with hidden states of a
    frozen target, plus the Domino head (a bias-free GRU over the drafted tokens' target embeddings and a
    low-rank correction added to the base logits).

    The draft owns no embedding and no LM head: it borrows the target's at call time, so `hidden_size` and
    `vocab_size` must equal the target's.

    Args:
        vocab_size (`int`): vocabulary size of the target's LM head.
        hidden_size (`int`): hidden size of the draft layers; equal to the target's hidden size.
        intermediate_size (`int`): SwiGLU width of the draft layers.
        num_hidden_layers (`int`): number of draft decoder layers.
        num_attention_heads (`int`), num_key_value_heads (`int`), head_dim (`int`): attention shape.
        rms_norm_eps (`float`): epsilon of every RMSNorm.
        rope_theta (`float`): RoPE base (default RoPE only; taken from the target).
        max_position_embeddings (`int`): informational; RoPE is computed on the fly.
        attention_bias (`bool`): whether q/k/v/o projections have biases (Qwen3: no).
        target_layer_ids (`list[int]`): target layers whose hidden states form the context features. Layer `i`
            is `output_hidden_states[i + 1]` of the target (index 0 is the embedding output).
        num_target_layers (`int`): number of decoder layers of the target (used to validate the pairing).
        target_hidden_size (`int`): hidden size of the target (defaults to `hidden_size`).
        block_size (`int`): number of slots of one parallel draft block (anchor slot included).
        mask_token_id (`int`): target token id whose embedding fills the masked slots of a block.
        shift_label (`bool`): `True` (Domino checkpoints): slot k predicts the token at anchor+k+1, so all
            `block_size` slots draft. `False` (DFlash checkpoints): slot 0 is the anchor and slots 1..B-1 draft.
        use_domino_head (`bool`): apply the causal correction head. `False` drafts with the base logits only
            (pure DFlash drafting with the same weights, for ablations).
        gru_hidden_dim (`int`): hidden size of the causal GRU (paper: 1024).
        correction_rank (`int`): rank r of the logit correction `W2 · SiLU(W1 · [H ; S])` (paper: 256).
        pure_draft_prefix_len (`int`): the first this-many draft tokens use base logits only (paper: 1); the
            GRU is then primed on the anchor and the first drafted token.
        draft_vocab_ids (`list[int]` or `None`): optional sorted sub-vocabulary (target ids) the draft may
            propose. Base logits and correction are computed over these rows only; `None` = full vocabulary.
        target_model_type (`str`), target_name_or_path (`str`): provenance of the target the draft was built
            for (named in the error raised when the draft does not fit a target).
        bos_token_id, eos_token_id, pad_token_id (`int`, `list[int]` or `None`): the target's special token ids.
            The draft never uses them itself; 🤗 pipelines compare them with the target's to decide that the two
            models share a tokenizer (`pipeline(..., assistant_model=draft)`), so `for_target` copies them.

    The drafting policy (`draft_confidence_threshold`, `max_draft_tokens`, `context_lookup_tokens`,
    `context_lookup_ngram`, `draft_backoff`, `measure_verify_cost`, `cut_lookup_spans`; see [`DraftingSettings`])
    is not architecture: a draft keeps it in its `generation_config.json`. A config that still carries those keys
    (checkpoints saved before they moved) accepts and validates them, and drafting reads them after the draft's
    generation config (`draft_level_settings`).

    Every field is checked on construction, on load (`from_pretrained` of a `config.json`) and when set
    afterwards (`config.block_size = 0` raises): a [`DominoConfigError`] (a `ValueError`) names the field and the
    allowed range.
    """

    model_type = "domino_draft"

    def __init__(
        self,
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=5,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        max_position_embeddings=40960,
        attention_bias=False,
        target_layer_ids=None,
        num_target_layers=DEFAULT_NUM_TARGET_LAYERS,
        target_hidden_size=None,
        block_size=16,
        mask_token_id=151669,
        shift_label=True,
        use_domino_head=True,
        gru_hidden_dim=1024,
        correction_rank=256,
        pure_draft_prefix_len=1,
        draft_vocab_ids=None,
        target_model_type=None,
        target_name_or_path=None,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        **kwargs,
    ):
        # --- the published dialect (official Domino / z-lab DFlash checkpoints) -------------------------------
        dflash_config = kwargs.pop("dflash_config", None)
        published = dflash_config is not None
        emb_dim = kwargs.pop("emb_dim", None)
        rope_theta = _computed_as_here(kwargs, dflash_config or {}, rope_theta)
        if published:
            mask_token_id = dflash_config.get("mask_token_id", mask_token_id)
            target_layer_ids = dflash_config.get("target_layer_ids", target_layer_ids)
            use_domino_head = _projector_has_head(dflash_config.get("projector_type"))
            # DFlash checkpoints carry no shift_label: their slot 0 is the anchor (as SGLang and vLLM read them).
            shift_label = dflash_config.get("shift_label", False)
            pure_draft_prefix_len = dflash_config.get("pure_draft_prefix_len", pure_draft_prefix_len)
            if use_domino_head:
                for key in ("shift_label", "pure_draft_prefix_len"):
                    if key not in dflash_config:  # SGLang refuses it too: guessing would misalign or mis-correct
                        raise DominoConfigError(f"dflash_config has a Domino head but no {key}: add the value the "
                                                "draft was trained with (the official checkpoints: true / 1).")
            gru_hidden_dim = dflash_config.get("gru_hidden_dim", gru_hidden_dim)
            nested_emb_dim = dflash_config.get("emb_dim", emb_dim)
            if emb_dim is not None and nested_emb_dim != emb_dim:
                raise DominoConfigError(f"emb_dim differs between dflash_config ({nested_emb_dim}) and the "
                                        f"top-level config ({emb_dim}): they are the correction rank, one value.")
            emb_dim = nested_emb_dim
            kwargs.pop("model_type", None)  # "qwen3" in the official files; this class is the draft
        if emb_dim is not None:
            correction_rank = emb_dim

        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim if head_dim is not None else hidden_size // num_attention_heads
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = float(rope_theta)
        self.max_position_embeddings = max_position_embeddings
        self.attention_bias = attention_bias
        self.num_target_layers = num_target_layers
        ids_given = target_layer_ids is not None  # a saved config omits them when they equal the default
        self.target_layer_ids = list(target_layer_ids) if ids_given else list(DEFAULT_TARGET_LAYER_IDS)
        self.target_hidden_size = target_hidden_size if target_hidden_size is not None else hidden_size
        self.block_size = block_size
        self.mask_token_id = mask_token_id
        self.shift_label = bool(shift_label)
        self.use_domino_head = bool(use_domino_head)
        self.gru_hidden_dim = gru_hidden_dim
        self.correction_rank = correction_rank
        self.pure_draft_prefix_len = pure_draft_prefix_len
        self.draft_vocab_ids = sorted(int(i) for i in draft_vocab_ids) if draft_vocab_ids is not None else None
        for name in DRAFTING_FIELDS:  # drafting keys of a config.json saved before they moved (see above)
            if name in kwargs:
                _check_field(name, kwargs[name])
                setattr(self, name, kwargs.pop(name))
        self.target_model_type = target_model_type
        self.target_name_or_path = target_name_or_path
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self._check_all(ids_given)  # before 🤗's own checks, which only warn about a bad token id
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(**kwargs)
        self._checked = True  # from now on, __setattr__ checks every field that is set

    def to_dict(self) -> dict:
        output = super().to_dict()
        output.pop("_checked", None)  # the validation switch is state, not configuration
        return output

    # ------------------------------------------------------------------------------------------ validation
    def __setattr__(self, key, value):
        if self.__dict__.get("_checked") and (key in _FIELD_RULES or key in _DRAFTING_RULES):
            _check_field(key, value)
        super().__setattr__(key, value)

    def _check_all(self, ids_given: bool = True) -> None:
        for name in _FIELD_RULES:
            _check_field(name, getattr(self, name))
        if self.num_attention_heads % self.num_key_value_heads:
            _fail("num_attention_heads", self.num_attention_heads,
                  f"a multiple of num_key_value_heads ({self.num_key_value_heads})")
        if not ids_given and any(i >= self.num_target_layers for i in self.target_layer_ids):
            raise DominoConfigError(
                f"DominoConfig.target_layer_ids is missing: the target layers whose hidden states the draft reads "
                f"(the default is for a {DEFAULT_NUM_TARGET_LAYERS}-layer target, this config has num_target_layers="
                f"{self.num_target_layers}). Add to config.json the ids the draft was trained with (a new draft: "
                f"`DominoConfig.for_target(target.config)` spreads them over the target's layers)."
            )
        if any(i >= self.num_target_layers for i in self.target_layer_ids):
            _fail("target_layer_ids", self.target_layer_ids,
                  f"layer ids below num_target_layers ({self.num_target_layers})")
        if not 0 <= self.mask_token_id < self.vocab_size:
            _fail("mask_token_id", self.mask_token_id, f"a token id in [0, vocab_size) = [0, {self.vocab_size})")
        if self.draft_vocab_ids is not None and not all(0 <= i < self.vocab_size for i in self.draft_vocab_ids):
            _fail("draft_vocab_ids", f"{len(self.draft_vocab_ids)} ids up to {max(self.draft_vocab_ids)}",
                  f"token ids in [0, vocab_size) = [0, {self.vocab_size})")
        if not self.shift_label and self.block_size < 2:
            _fail("block_size", self.block_size, "at least 2 with shift_label=False (slot 0 is the anchor)")
        if self.pure_draft_prefix_len > self.num_draft_tokens:
            _fail("pure_draft_prefix_len", self.pure_draft_prefix_len,
                  f"an integer in [0, {self.num_draft_tokens}] (the draft tokens per block)")

    def validate(self):
        """🤗's save-time check (`save_pretrained` calls it), extended with the Domino fields."""
        super().validate()
        self._check_all()

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """As `PretrainedConfig.from_pretrained`; a bad value is reported with the folder it came from."""
        try:
            return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        except DominoConfigError as err:
            raise DominoConfigError(f"{pretrained_model_name_or_path}: {err}") from None

    @classmethod
    def for_target(cls, target_config, tokenizer=None, num_context_layers=5, **overrides):
        """A config that fits `target_config` (the target's `config`): draft layers shaped like the target's,
        `target_layer_ids` spread over its depth, and a mask token that is safe for `tokenizer`.

        * `target_layer_ids`: `num_context_layers` layers evenly spread from layer 1 to `num_layers - 3`, as
          in the published checkpoints (36-layer Qwen3: [1, 9, 17, 25, 33]); shallow targets use what exists.
        * `mask_token_id`: see `pick_mask_token_id`.
        * `gru_hidden_dim`, `correction_rank`: see `head_sizes_for` (the paper's 1024 / 256 from 2048-wide
          targets up, e.g. Qwen3-4B/8B; half the width, as a power of two, below).
        * `bos/eos/pad_token_id`: the target's, so 🤗 pipelines see that the draft shares its tokenizer.
        Any keyword in `overrides` (e.g. `num_hidden_layers`, `block_size`) wins.
        """
        text = target_config.get_text_config()
        heads = text.num_attention_heads
        rope = getattr(text, "rope_parameters", None) or {}
        fields = dict(
            vocab_size=text.vocab_size,
            hidden_size=text.hidden_size,
            intermediate_size=text.intermediate_size,
            num_hidden_layers=1,
            num_attention_heads=heads,
            num_key_value_heads=getattr(text, "num_key_value_heads", None) or heads,
            head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
            rms_norm_eps=getattr(text, "rms_norm_eps", 1e-6),
            rope_theta=rope.get("rope_theta", getattr(text, "rope_theta", 10000.0)),
            max_position_embeddings=getattr(text, "max_position_embeddings", 4096),
            target_layer_ids=spread_target_layers(text.num_hidden_layers, num_context_layers),
            num_target_layers=text.num_hidden_layers,
            target_hidden_size=text.hidden_size,
            mask_token_id=pick_mask_token_id(text.vocab_size, tokenizer),
            target_model_type=getattr(text, "model_type", None),
            target_name_or_path=getattr(target_config, "_name_or_path", None) or None,
            **head_sizes_for(text.hidden_size),
            **target_token_ids(target_config),
        )
        fields.update(overrides)
        return cls(**fields)

    @property
    def num_draft_tokens(self) -> int:
        """Tokens proposed per block: all slots with `shift_label`, all but the anchor slot without."""
        return self.block_size if self.shift_label else self.block_size - 1

    @property
    def draft_vocab_size(self) -> int:
        """Rows of the draft's output space (the sub-vocabulary if any, else the full vocabulary)."""
        return len(self.draft_vocab_ids) if self.draft_vocab_ids is not None else self.vocab_size


class DominoConfigError(ValueError):
    """A `DominoConfig` field outside its allowed range (the message names the field and the range)."""


# Domino head projector types: "domino", and "causal_v5", the older name of the same head in the official
# checkpoints (SGLang knows only "domino"; `domino export --format sglang` writes that). None: a DFlash draft.
_HEAD_PROJECTORS = ("domino", "causal_v5")
# dflash_config keys of other DFlash variants that change the computation, with the value that leaves it as here.
_NEUTRAL_DFLASH_KEYS = {"attention_sink_bias": False, "attention_value_scale": None, "conv_kernel_size": 0,
                        "selector_rank": 0, "output_multiplier": 1.0, "final_logit_softcapping": None,
                        "use_swa": False, "causal": False}


def _projector_has_head(projector) -> bool:
    if projector is None or projector in _HEAD_PROJECTORS:
        return projector is not None
    raise DominoConfigError(f"dflash_config.projector_type {projector!r} is a head this draft class does not compute "
                            f"(known: {', '.join(_HEAD_PROJECTORS)}, or none for a DFlash draft).")


def _computed_as_here(kwargs: dict, dflash_config: dict, rope_theta):
    """Refuse the published config keys that would make a draft compute otherwise than this class does (SiLU MLP,
    full attention, default RoPE), one line each; pops them from `kwargs`. Returns the RoPE base to use."""
    act = kwargs.pop("hidden_act", None)
    if act not in (None, "silu"):
        raise DominoConfigError(f"hidden_act {act!r}: this draft's MLP is SwiGLU with SiLU only.")
    layer_types = kwargs.pop("layer_types", None) or []
    window = kwargs.pop("sliding_window", None)
    sliding = kwargs.pop("use_sliding_window", False) and window is not None  # Qwen2/3's switch for its window
    kwargs.pop("max_window_layers", None)
    other = sorted({t for t in layer_types if t != "full_attention"})
    if other or sliding:
        raise DominoConfigError(f"{'layer_types ' + str(other) if other else 'use_sliding_window'} (window "
                                f"{window}): this draft computes full attention in every layer only.")
    rope = kwargs.pop("rope_parameters", None) or kwargs.pop("rope_scaling", None) or {}
    kwargs.pop("rope_scaling", None)
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise DominoConfigError(f"rope scaling {rope_type!r}: this draft computes default RoPE only.")
    for key, neutral in _NEUTRAL_DFLASH_KEYS.items():
        value = dflash_config.get(key)
        if value is not None and value != neutral and (neutral or value):  # 0, False, None: switched off
            raise DominoConfigError(f"dflash_config.{key}={dflash_config[key]!r}: a DFlash variant this draft class "
                                    "does not compute.")
    return rope.get("rope_theta", rope_theta)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value  # not NaN


def _is_token_id(value) -> bool:
    return _is_int(value) and value >= 0


def _is_id_list(value) -> bool:
    return isinstance(value, (list, tuple)) and len(value) > 0 and all(_is_token_id(i) for i in value) \
        and len(set(value)) == len(value)


# Field -> (allowed?, the allowed range in words). Checks that involve two fields live in `_check_all`.
_POSITIVE = (lambda v: _is_int(v) and v >= 1, "an integer >= 1")
_FIELD_RULES = {
    **{name: _POSITIVE for name in (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "max_position_embeddings", "num_target_layers", "target_hidden_size", "block_size",
        "gru_hidden_dim", "correction_rank")},
    "head_dim": (lambda v: _is_int(v) and v >= 2 and v % 2 == 0, "an even integer >= 2 (RoPE rotates pairs)"),
    "rms_norm_eps": (lambda v: _is_number(v) and v > 0, "a number > 0"),
    "rope_theta": (lambda v: _is_number(v) and v > 0, "a number > 0"),
    "target_layer_ids": (_is_id_list, "a non-empty list of distinct layer ids >= 0"),
    "mask_token_id": (_is_token_id, "a token id >= 0"),
    "pure_draft_prefix_len": (lambda v: _is_int(v) and v >= 0, "an integer >= 0"),
    "draft_vocab_ids": (lambda v: v is None or _is_id_list(v), "None (full vocabulary) or a non-empty list of "
                        "distinct token ids >= 0"),
    "bos_token_id": (lambda v: v is None or _is_token_id(v), "None or a token id >= 0"),
    "pad_token_id": (lambda v: v is None or _is_token_id(v), "None or a token id >= 0"),
    "eos_token_id": (lambda v: v is None or _is_token_id(v) or _is_id_list(v), "None, a token id >= 0 or a list "
                     "of them"),
}


def _fail(name, value, allowed, owner="DominoConfig") -> None:
    raise DominoConfigError(f"{owner}.{name} must be {allowed}, got {value!r}.")


def _check_field(name, value, owner="DominoConfig") -> None:
    allowed, description = _FIELD_RULES.get(name) or _DRAFTING_RULES[name]
    if not allowed(value):
        _fail(name, value, description, owner)



# ------------------------------------------------------------------------------------------------ drafting policy
@dataclass(frozen=True)
class DraftingSettings:
    r"""
    The drafting policy of one `generate(..., assistant_model=draft)` call, resolved once by the dispatch
    (`resolve_drafting_settings` in `dispatch_domino.py`) and handed to the candidate generator. Every field is
    lossless: it changes what is proposed, never what the target accepts.

    A value comes from, in order: the call (`generate`'s keyword or `GenerationConfig`, see the dispatch), the
    draft's `generation_config` (its `generation_config.json`), the draft's `config.json` (checkpoints saved
    before the policy moved out of it), and the defaults below, which are the only place the defaults live.

    Args:
        draft_confidence_threshold (`float`, defaults to 0.0): adaptive draft length. Drafting stops before slot
            j when the draft's chain probability (probabilities of the tokens drafted so far × slot j's top
            probability) falls below this; 0 always proposes the whole block. The stop never looks at the token
            slot j would draw, so sampling stays exact. Per call: `assistant_confidence_threshold`.
        max_draft_tokens (`int` or `None`, defaults to `None`): cap on the tokens proposed per step, Domino block
            or context-lookup span; `None` caps nothing. Per call, `num_assistant_tokens` caps too (the smaller
            cap wins).
        num_assistant_tokens_schedule (`str`, defaults to `"constant"`): per call only. `"heuristic"` grows the
            cap by 2 after a fully accepted proposal and shrinks it by 1 otherwise, as transformers does for its
            assistants.
        context_lookup_tokens (`int`, defaults to 10): hybrid drafting. Each step the generator also looks the
            sequence's last n-gram up in the prompt and the generated text (`ContextLookup`) and proposes the span
            that follows it, up to this many tokens, when that span is expected to get more tokens accepted than
            the Domino block. 0 = Domino blocks only. Per call: `prompt_lookup_num_tokens`.
        context_lookup_ngram (`int`, defaults to 3): the longest suffix n-gram looked up (a 3-gram match is a far
            better predictor than transformers' prompt-lookup default of 2). Per call: `max_matching_ngram_size`.
        draft_backoff (`bool`, defaults to `True`): while the draft's blocks get too few tokens accepted to pay
            for the longer verify, take plain steps between single probes (`DraftBackoff`). `False` drafts every
            step, as the field measures a draft's τ.
        measure_verify_cost (`bool`, defaults to `False`): time the target's verify forwards while generating and
            weigh block against span by this machine's measured cost (`VerifyCost`) instead of a fixed curve.
            Timing steers only which proposal goes out: greedy stays identical, sampling exact, but the per-step
            choices may differ between runs, and so may seeded sampling. Batches and draft trees measure when
            decoding greedily either way (their output cannot depend on it), into the costs kept across calls
            (`VerifyCostStore`); a sampling call measures only with `True`, into a curve of its own, so that without
            it a seeded call repeats itself and with it never depends on an earlier call.
        cut_lookup_spans (`bool`, defaults to `False`): send only the prefix of a context-lookup span with the most
            expected tokens per unit of verify cost (`SourceChooser.span_length`) instead of the whole span.
        use_suffix_cache (`bool` or `None`, defaults to `None`): also draft from a store of earlier generations (a
            `SuffixCache`: the prompts and outputs of earlier `generate` calls with this draft, and any documents
            added to it): the continuation most often seen after the longest match of the sequence's last tokens,
            sent when it is expected to beat the block and the context span. The store is the draft's own
            (`draft.suffix_cache`) unless the call passes one (`generate(..., suffix_cache=store)`); the call's
            prompt and output are added when it returns. `None` = on when decoding greedily, off when sampling
            (a sampling call then drafts as without a cache and adds nothing, so seeded sampling repeats itself
            call after call; at T = 0.7 the cache gained nothing); `True` = on for sampling too (exact, but a
            seeded call then depends on what earlier calls stored); `False` = drafting as without a cache, and
            nothing added.
        suffix_cache_max_span (`int`, defaults to 24): the longest span taken from the suffix cache; the span
            sent is the prefix with the most expected tokens per unit of verify cost under the history of cache
            spans with a match as long.
        suffix_cache_size (`int`, defaults to 1,000,000): capacity in tokens of the draft's own suffix cache
            (about 29 bytes a token, allocated when first used), the oldest tokens evicted first; read when that
            cache is created.
        use_draft_tree (`bool`, defaults to `False`): decoding a single prompt verifies a draft tree each step
            (the block's likeliest branches, grown by the Domino head, and the context span as one more branch; as
            many nodes as pay for the longer verify) instead of one chain, in domino-hf's verify loop
            (`tree_domino.py`); greedy by the target's choice at each node, sampling by recursive rejection over
            siblings. Calls asking for per-step scores, logits, attentions or hidden states verify the chain; a
            batch of several prompts is refused with the fix. `False` = the chain, exactly as without the setting.

    A bad value raises a [`DominoConfigError`] naming the setting and its allowed range.
    """

    draft_confidence_threshold: float = 0.0
    max_draft_tokens: int | None = None
    num_assistant_tokens_schedule: str = "constant"
    context_lookup_tokens: int = 10
    context_lookup_ngram: int = 3
    draft_backoff: bool = True
    measure_verify_cost: bool = False
    cut_lookup_spans: bool = False
    use_suffix_cache: bool | None = None
    suffix_cache_max_span: int = 24
    suffix_cache_size: int = 1_000_000
    use_draft_tree: bool = False

    def __post_init__(self):
        for item in fields(self):
            _check_field(item.name, getattr(self, item.name), owner="DraftingSettings")
        object.__setattr__(self, "draft_confidence_threshold", float(self.draft_confidence_threshold))


_BOOL = (lambda v: isinstance(v, bool), "True or False")
_SCHEDULES = ("constant", "heuristic", "heuristic_transient")
_DRAFTING_RULES = {
    "draft_confidence_threshold": (lambda v: _is_number(v) and 0 <= v <= 1, "a probability in [0, 1] "
                                   "(0 = always draft the whole block)"),
    "max_draft_tokens": (lambda v: v is None or (_is_int(v) and v >= 1), "None (no cap) or an integer >= 1"),
    "num_assistant_tokens_schedule": (lambda v: v in _SCHEDULES, f"one of {_SCHEDULES}"),
    "context_lookup_tokens": (lambda v: _is_int(v) and v >= 0, "an integer >= 0 (0 = no context lookup)"),
    "context_lookup_ngram": (lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
    "draft_backoff": _BOOL,
    "measure_verify_cost": _BOOL,
    "cut_lookup_spans": _BOOL,
    "use_suffix_cache": (lambda v: v is None or isinstance(v, bool), "None (on when decoding greedily, off when "
                         "sampling), True or False"),
    "suffix_cache_max_span": (lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
    "suffix_cache_size": (lambda v: _is_int(v) and v >= 64, "an integer >= 64 (tokens)"),
    "use_draft_tree": _BOOL,
}
# The settings a draft may carry as its own defaults (its generation_config.json); the schedule is per call only.
DRAFTING_FIELDS = tuple(item.name for item in fields(DraftingSettings) if item.name != "num_assistant_tokens_schedule")
# transformers' own assisted-decoding fields that a Domino draft reads per call (`resolve_drafting_settings` maps
# them onto `DraftingSettings`), each checked under its own name before it is mapped: never quietly reinterpreted.
_CALL_RULES = {
    "num_assistant_tokens": (lambda v: _is_int(v) and v >= 1, "an integer >= 1 (the most tokens a step proposes; to "
                             "decode without drafting, drop assistant_model)"),
    "num_assistant_tokens_schedule": _DRAFTING_RULES["num_assistant_tokens_schedule"],
    "assistant_confidence_threshold": _DRAFTING_RULES["draft_confidence_threshold"],
    "prompt_lookup_num_tokens": (lambda v: _is_int(v) and v >= 0, "an integer >= 0 (0 = Domino blocks only)"),
    "max_matching_ngram_size": (lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
}
CALL_FIELDS = tuple(_CALL_RULES)


def check_call_setting(name, value) -> None:
    """Refuse a drafting setting of one `generate` call (a `CALL_FIELDS` or `DRAFTING_FIELDS` name, passed to
    `generate` or set on a `GenerationConfig`) that is out of range, naming it as the caller wrote it. None leaves
    a `CALL_FIELDS` setting unset."""
    if value is None and name in _CALL_RULES:
        return
    allowed, description = _CALL_RULES.get(name) or _DRAFTING_RULES[name]
    if not allowed(value):
        raise DominoConfigError(
            f"{name} must be {description}, got {value!r} (a generate() keyword or a GenerationConfig field)."
        )


def draft_level_settings(generation_config, config) -> dict:
    """The draft's own drafting defaults, one value per `DRAFTING_FIELDS` name: its `generation_config`'s
    field when set, else the field of a `config` that still carries it (older checkpoints), else the
    `DraftingSettings` default. Each value is checked (a bad one names its setting and the allowed range)."""
    values = {}
    for item in fields(DraftingSettings):
        if item.name not in DRAFTING_FIELDS:
            continue
        for source, owner in ((generation_config, "generation_config"), (config, "DominoConfig")):
            if source is not None and item.name in vars(source):
                values[item.name] = vars(source)[item.name]
                _check_field(item.name, values[item.name], owner=owner)
                break
        else:
            values[item.name] = item.default
    return values

def head_sizes_for(hidden_size: int) -> dict:
    """Domino head sizes for a target of width `hidden_size`: `gru_hidden_dim` = min(1024, P) and
    `correction_rank` = min(256, P), where P is the largest power of two <= hidden_size / 2.

    The paper's 1024 / 256 (sized for 2560- and 4096-wide Qwen3-4B/8B) are kept from 2048-wide targets up;
    narrower targets get a head that does not outweigh them (SmolLM2-135M, 576 wide: 256 / 256, the shipped
    draft; a 64-wide test target: 32 / 32).
    """
    half = max(1, hidden_size // 2)
    power = 1 << (half.bit_length() - 1)
    return {"gru_hidden_dim": min(1024, power), "correction_rank": min(256, power)}


def target_token_ids(target_config) -> dict:
    """The target's `bos/eos/pad_token_id` (of its text config), which 🤗 pipelines compare with the draft's."""
    text = target_config.get_text_config()
    return {key: getattr(text, key, None) for key in ("bos_token_id", "eos_token_id", "pad_token_id")}


def spread_target_layers(num_layers: int, count: int = 5) -> list[int]:
    """`count` layer ids spread evenly from 1 to `num_layers - 3` (DFlash's choice), deduplicated."""
    low = min(1, num_layers - 1)
    high = max(low, num_layers - 3)
    if count <= 1:
        return [high]
    return sorted({int(low + i * (high - low) / (count - 1) + 0.5) for i in range(count)})


def pick_mask_token_id(vocab_size: int, tokenizer=None) -> int:
    """A token id whose target embedding can stand for "masked slot" without colliding with real text.

    In order: the tokenizer's own mask token; the first LM-head row beyond the tokenizer (unused padding rows,
    as Qwen3's 151669); the highest special token that is not BOS/EOS/PAD/UNK and does not occur in the
    chat template; finally `vocab_size - 1`.
    """
    if tokenizer is None:
        return vocab_size - 1
    if getattr(tokenizer, "mask_token_id", None) is not None:
        return tokenizer.mask_token_id
    if len(tokenizer) < vocab_size:
        return len(tokenizer)
    reserved = {getattr(tokenizer, f"{k}_token_id", None) for k in ("bos", "eos", "pad", "unk")}
    template = str(getattr(tokenizer, "chat_template", "") or "")
    special = [
        tid
        for tid, tok in getattr(tokenizer, "added_tokens_decoder", {}).items()
        if tid not in reserved and str(tok) not in template and tid < vocab_size
    ]
    return max(special) if special else vocab_size - 1
