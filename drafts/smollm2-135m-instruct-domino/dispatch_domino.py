# Copyright 2026 The domino-hf authors. Licensed under the Apache License, Version 2.0.
"""The `generate(assistant_model=domino_draft)` dispatch: routes a Domino draft to its candidate generator.

Remote-code file (torch + transformers only). transformers has no public plug-in point for a third-party
candidate generator, so four private `GenerationMixin` methods are wrapped, for the tested releases only
(`MIN_TRANSFORMERS` ≤ version < `MAX_TRANSFORMERS`); every other assistant and generation mode reaches the
stock methods untouched. `uninstall_generate_hook()` restores them.

What differs between the supported releases is handled here and nowhere else:
* 5.24 renamed the target's cache argument and output `past_key_values` → `cache` (`CACHE_ARGUMENT`,
  `user_cache`);
* 5.25 asks every candidate generator for `num_drafting_tokens` (the generator defines it on every release)
  and lets linear-attention ("stateful") targets into assisted decoding, which a Domino draft refuses
  (`check_target_supported`).
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import importlib
import logging
import weakref

import torch
import transformers

from .configuration_domino import (
    CALL_FIELDS,
    DRAFTING_FIELDS,
    DraftingSettings,
    check_call_setting,
    draft_level_settings,
)
from .generation_domino import DominoCandidateGenerator, DominoGenerationStats
from .suffix_domino import is_suffix_cache
from .target_domino import check_draft_fits_target, check_target_attention

logger = logging.getLogger(__name__)

MIN_TRANSFORMERS = (5, 23)  # supported releases: MIN <= (major, minor) < MAX
MAX_TRANSFORMERS = (5, 26)
_DYNAMIC_CACHES = (None, "dynamic")  # the `cache_implementation` values a Domino draft is tested with
# Attention layer types whose cache is plain keys/values, croppable after a verify step.
_ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention")

_STOPPING_CRITERIA = contextvars.ContextVar("domino_stopping_criteria", default=None)
_PROFILE = contextvars.ContextVar("domino_profile_phases", default=False)
_GENERATORS = contextvars.ContextVar("domino_candidate_generators", default=None)  # built in this decoding call
# Per-call `generate` keywords for the Domino generator: transformers would refuse them as unused model kwargs,
# so the dispatch moves them onto the call's GenerationConfig (`_prepare_generation_config`).
CALL_KWARGS = (*DRAFTING_FIELDS, "suffix_cache")


def is_domino_draft(model) -> bool:
    """A `DominoDraftModel` (from domino_hf or from any checkpoint's remote code)."""
    config = getattr(model, "config", None)
    return getattr(config, "model_type", None) == "domino_draft" and callable(getattr(model, "fuse_context", None))


def _draft_dispatch(draft):
    """The dispatch module shipped beside the draft's own class: a remote-code draft drafts with its checkpoint's
    files, a domino_hf draft with domino_hf's, whichever copy of this dispatch was installed first. A checkpoint
    whose remote code predates the running transformers is refused with the fix, rather than run with a
    generator written for other internals. None for a draft class defined outside a Domino package."""
    package = type(draft).__module__.rpartition(".")[0]
    try:
        module = importlib.import_module(f"{package}.dispatch_domino")
    except (ImportError, TypeError, ValueError):  # no such module; a class defined in a top-level module
        return None
    written_for = getattr(module, "MAX_TRANSFORMERS", None)
    if written_for is not None and _release(transformers.__version__) >= tuple(written_for):
        raise ValueError(
            f"This Domino draft's remote code ({module.__file__}) was written for transformers<"
            f"{_dotted(written_for)} and predates the installed {transformers.__version__}. Load the "
            "draft with domino-hf's own code instead (`domino_hf.DominoDraftModel.from_pretrained(path)`, or "
            "`AutoModel.from_pretrained(path)` without trust_remote_code once domino_hf is imported), or "
            "re-export it with the current domino-hf: `domino export PATH --out NEW_FOLDER --dtype <its dtype>`."
        )
    return module


def resolve_drafting_settings(draft, generation_config) -> DraftingSettings:
    """The drafting policy of one `generate` call: the call's own values, then the draft's
    (`draft_level_settings`: its generation config, then a config.json that still carries them, then the
    `DraftingSettings` defaults).

    The call's values are transformers' assisted-decoding fields, mapped as follows, and any `DRAFTING_FIELDS`
    name set on the `GenerationConfig` passed to `generate` (e.g. `GenerationConfig(draft_backoff=False)`):
    * `num_assistant_tokens` caps the tokens proposed per step, as `max_draft_tokens` does (the smaller wins);
      `num_assistant_tokens_schedule` is the cap's schedule.
    * `assistant_confidence_threshold` is `draft_confidence_threshold` when it differs from transformers'
      default 0.4: `generate` fills that default in before the dispatch sees the config, so an explicit 0.4
      cannot be told from an unset one, and the draft's threshold applies then.
    * `prompt_lookup_num_tokens` is `context_lookup_tokens` (0 turns the lookup off); `max_matching_ngram_size`
      is `context_lookup_ngram`.
    Every call value is checked first, under the name the caller wrote (`check_call_setting`): a value out of
    range (`num_assistant_tokens=0`, `prompt_lookup_num_tokens=-1`, `num_assistant_tokens=2.5`…) is refused, never
    clamped, rounded or read as unset. None leaves a transformers field unset.
    """
    values = draft_level_settings(getattr(draft, "generation_config", None), draft.config)
    call = {name: vars(generation_config)[name] for name in DRAFTING_FIELDS if name in vars(generation_config)}
    for name, value in [*call.items(), *((name, getattr(generation_config, name, None)) for name in CALL_FIELDS)]:
        check_call_setting(name, value)
    values.update(call)
    threshold = generation_config.assistant_confidence_threshold
    if threshold is not None and threshold != _stock_defaults(generation_config).get("assistant_confidence_threshold"):
        values["draft_confidence_threshold"] = threshold
    if generation_config.prompt_lookup_num_tokens is not None:
        values["context_lookup_tokens"] = generation_config.prompt_lookup_num_tokens
    if generation_config.max_matching_ngram_size is not None:
        values["context_lookup_ngram"] = generation_config.max_matching_ngram_size
    if generation_config.num_assistant_tokens is not None:
        caps = [generation_config.num_assistant_tokens, values["max_draft_tokens"]]
        values["max_draft_tokens"] = min(cap for cap in caps if cap is not None)
    if generation_config.num_assistant_tokens_schedule is not None:
        values["num_assistant_tokens_schedule"] = generation_config.num_assistant_tokens_schedule
    return DraftingSettings(**values)


def _stock_defaults(generation_config) -> dict:
    """The values `generate` fills into fields left unset (transformers' own defaults)."""
    return generation_config._get_default_generation_params()


@contextlib.contextmanager
def profile_drafting(draft):
    """Inside this block, every `generate` call with `draft` times the draft's phases (backbone, LM head, head
    rollout) into `draft.last_generation_stats.timings` (`domino bench --profile`). The timing is switched on in
    the dispatch that builds the draft's generator, so it reaches remote-code drafts too."""
    module = _draft_dispatch(draft) or importlib.import_module(__name__)
    token = module._PROFILE.set(True)
    try:
        yield
    finally:
        module._PROFILE.reset(token)


def make_candidate_generator(draft, target, generation_config, logits_processor, input_ids, stopping_criteria=None):
    """The candidate generator of one `generate` call, with its settings resolved once
    (`resolve_drafting_settings`) and a fresh `DominoGenerationStats`, which becomes `draft.last_generation_stats`
    (this is the one place that sets it)."""
    warn_if_target_inexact(target)
    stats = DominoGenerationStats()
    settings = resolve_drafting_settings(draft, generation_config)
    generator = DominoCandidateGenerator(
        draft=draft,
        target=target,
        generation_config=generation_config,
        logits_processor=logits_processor,
        input_ids=input_ids,
        settings=settings,
        stopping_criteria=stopping_criteria,
        stats=stats,
        profile_phases=_PROFILE.get(),
        suffix_cache=resolve_suffix_cache(draft, generation_config, settings),
    )
    draft.last_generation_stats = stats
    return generator


_INEXACT_DTYPES = (torch.bfloat16, torch.float16)
_WARNED_TARGETS = weakref.WeakSet()  # targets already warned about (`warn_if_target_inexact`)
_TREE_FALLBACKS: set = set()  # attention implementations already said to verify the chain instead of trees


def warn_if_target_inexact(target) -> None:
    """Warn once per target, at its first Domino call, when it runs in bf16 or fp16 on a CPU: there a forward over
    several tokens (a verify step) rounds differently from one-token steps, so greedy output can differ from the
    target decoding alone (measured with SmolLM2: 5 of 10 prompts in bf16, 1 of 10 in fp16). fp32 is exact, and so
    is a target on `domino_hf.optimize_for_cpu`'s length-invariant kernels (`target.domino_length_invariant`)."""
    dtype = getattr(target, "dtype", None)
    if dtype not in _INEXACT_DTYPES or target.device.type != "cpu" or target in _WARNED_TARGETS:
        return
    if getattr(target, "domino_length_invariant", False):  # on domino_hf's self-checked length-invariant kernels
        return
    _WARNED_TARGETS.add(target)
    logger.warning(
        "Domino: the target runs in %s on CPU, where a verify forward over several tokens rounds differently from "
        "one-token steps, so the output can differ from the target decoding alone; load the target with "
        "dtype=torch.float32 for output identical to it.",
        dtype,
    )


def resolve_suffix_cache(draft, generation_config, settings):
    """The suffix cache of one call: none with `use_suffix_cache=False`, or with it unset (None) when the call
    samples; else the call's own (`generate(..., suffix_cache=store)`), else the draft's (`draft.suffix_cache`).
    A call without a cache neither reads nor adds, so seeded sampling gives the same tokens call after call;
    `use_suffix_cache=True` reads the store when sampling too (exact, but each call then depends on the last)."""
    use = settings.use_suffix_cache
    if use is None:
        use = not generation_config.do_sample
    if not use:
        return None
    cache = vars(generation_config).get("suffix_cache")
    if cache is None:
        return getattr(draft, "suffix_cache", None)
    if not is_suffix_cache(cache):
        raise TypeError(
            f"suffix_cache must be a SuffixCache (`from domino_hf import SuffixCache`), got {type(cache).__name__}."
        )
    return cache


def _candidate_generator(draft, **arguments):
    """Built by the dispatch beside the draft's class; remote code from before `make_candidate_generator`
    existed builds its generator the way it was written for."""
    module = _draft_dispatch(draft)
    if module is None:
        return make_candidate_generator(draft, **arguments)
    if hasattr(module, "make_candidate_generator"):
        return module.make_candidate_generator(draft, **arguments)
    generation = importlib.import_module(f"{module.__package__}.generation_domino")
    return generation.DominoCandidateGenerator(draft=draft, **arguments)


def decode_batch(draft, target, arguments: dict):
    """`generate` with a batch of prompts (B ≥ 2) and a Domino draft: the batched verify loop
    (`DominoBatchDecoder`), with the call's settings resolved as for batch size 1. `arguments` are
    `_assisted_decoding`'s. Returns what plain batched `generate` returns: the padded sequences, or a
    `GenerateDecoderOnlyOutput` holding them with `return_dict_in_generate`."""
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    from .batch_domino import DominoBatchDecoder
    from .tree_domino import TreeShape

    config = arguments["generation_config"]
    asked = [name for name in _PER_STEP_OUTPUTS if getattr(config, name, False)]
    if asked and config.return_dict_in_generate:
        raise ValueError(
            f"{', '.join(asked)} with a Domino draft and a batch of prompts: the batched verify loop returns the "
            "sequences only (rows advance at different speeds, so there is no per-step tensor for the batch). Drop "
            f"{', '.join(asked)}, or generate one prompt at a time."
        )
    if arguments.get("synced_gpus"):
        raise ValueError("synced_gpus with a Domino draft and a batch of prompts is not supported: generate without "
                         "synced_gpus, or one prompt at a time.")
    model_kwargs = arguments.get("model_kwargs") or {}
    stats = DominoGenerationStats()
    settings = resolve_drafting_settings(draft, config)
    rows = arguments["input_ids"].shape[0]
    if settings.use_draft_tree and rows > 1:
        several = config.num_return_sequences
        what = f"{rows // several} prompt(s) × num_return_sequences={several}" if several > 1 else f"{rows} prompts"
        raise ValueError(
            f"use_draft_tree=True with a batch of {what}: draft trees are verified one prompt at a time. "
            "Pass use_draft_tree=False to decode the batch with chains (set on the call, or on "
            "draft.generation_config when it is the draft's default), or generate one prompt at a time."
        )
    warn_if_target_inexact(target)
    suffix_cache = resolve_suffix_cache(draft, config, settings)
    decoder = DominoBatchDecoder(draft, target, config, arguments.get("logits_processor"),
                                 arguments.get("stopping_criteria"), settings, stats, suffix_cache=suffix_cache,
                                 profile=_PROFILE.get(),
                                 tree=TreeShape() if settings.use_draft_tree else None,
                                 cache_argument=CACHE_ARGUMENT)
    draft.last_generation_stats = stats
    streamer = arguments.get("streamer")  # `generate` has already put the prompt
    sequences = decoder.decode(arguments["input_ids"], model_kwargs.get("attention_mask"), streamer)
    if streamer is not None:
        streamer.end()
    decoder.remember()  # every row's prompt and output into the suffix cache, if any
    return GenerateDecoderOnlyOutput(sequences=sequences) if config.return_dict_in_generate else sequences


_PER_STEP_OUTPUTS = ("output_scores", "output_logits", "output_attentions", "output_hidden_states")


def _verifies_tree(draft, target, config) -> bool:
    """Whether a single-prompt call verifies draft trees (`use_draft_tree`): greedy or sampling, with no per-step
    outputs, on a target whose attention takes a tree mask (else the chain, said once per attention implementation)."""
    if config.return_dict_in_generate and any(getattr(config, name, False) for name in _PER_STEP_OUTPUTS):
        return False
    if not resolve_drafting_settings(draft, config).use_draft_tree:
        return False
    from .ragged_domino import SUPPORTED_ATTENTION

    attention = getattr(target.config, "_attn_implementation", None)
    if attention in SUPPORTED_ATTENTION:
        return True
    if attention not in _TREE_FALLBACKS:
        _TREE_FALLBACKS.add(attention)
        logger.warning("Domino: use_draft_tree needs attention that takes a tree mask (%s), not %r: verifying the "
                       "chain instead. Load the target with attn_implementation='sdpa' for draft trees.",
                       ", ".join(SUPPORTED_ATTENTION), attention)
    return False


def _batch_decoder(draft, target, arguments: dict):
    """The batched verify loop shipped beside the draft's class; remote code from before it refuses a batch."""
    module = _draft_dispatch(draft)
    if module is not None and not hasattr(module, "decode_batch"):
        raise ValueError(
            f"This Domino draft's remote code ({module.__file__}) decodes one prompt at a time, and the inputs hold "
            f"{arguments['input_ids'].shape[0]}: load the draft with domino-hf's own class "
            "(`domino_hf.DominoDraftModel.from_pretrained(path)`), or generate one prompt at a time."
        )
    return (module.decode_batch if module is not None else decode_batch)(draft, target, arguments)


def _looks_like_domino_checkpoint(model) -> bool:
    """A Domino/DFlash draft checkpoint loaded as a plain model (i.e. without `trust_remote_code`)."""
    config = getattr(model, "config", None)
    if config is None or is_domino_draft(model):
        return False
    auto_map = str(getattr(config, "auto_map", "") or "")
    archs = str(getattr(config, "architectures", "") or "")
    return hasattr(config, "dflash_config") or "domino" in auto_map.lower() or "Domino" in archs


def _release(version: str) -> tuple[int, int]:
    parts = [int("".join(ch for ch in part if ch.isdigit()) or 0) for part in version.split(".")[:2]]
    return tuple(parts + [0] * (2 - len(parts)))


class UnsupportedTransformersError(ImportError):
    """The installed transformers is outside `MIN_TRANSFORMERS` ≤ version < `MAX_TRANSFORMERS`."""


def _dotted(release) -> str:
    return ".".join(map(str, release))


def supported_range() -> str:
    """The supported releases as a pip specifier, e.g. `>=5.23,<5.26`."""
    return f">={_dotted(MIN_TRANSFORMERS)},<{_dotted(MAX_TRANSFORMERS)}"


def _cache_argument(version: str) -> str:
    return "cache" if _release(version) >= (5, 24) else "past_key_values"


# The keyword a target's forward takes its cache by, on the running release.
CACHE_ARGUMENT = _cache_argument(transformers.__version__)


def user_cache(model_kwargs: dict):
    """The cache object `generate` holds for the target, under either release's name (None before prefill)."""
    for name in ("cache", "past_key_values"):
        if model_kwargs.get(name) is not None:
            return model_kwargs[name]
    return None


def check_target_supported(target) -> None:
    """Refuse targets whose cache a Domino step cannot roll back exactly: linear-attention / state-space layers
    (transformers 5.25 lets such "stateful" targets into assisted decoding; the Domino generator is not tested
    lossless on them)."""
    config = target.config.get_text_config() if hasattr(target.config, "get_text_config") else target.config
    layer_types = set(getattr(config, "layer_types", None) or ()) - set(_ATTENTION_LAYER_TYPES)
    if getattr(target, "_is_stateful", False) or layer_types:
        kind = f"layer types {sorted(layer_types)}" if layer_types else "a recurrent state"
        raise ValueError(
            f"{type(target).__name__} has {kind}: Domino speculative decoding needs a target whose every layer is "
            "attention with a key/value cache (it crops rejected tokens from it). Decode this target without "
            "`assistant_model`."
        )


def check_cache_supported(cache) -> None:
    """Refuse a cache object passed to `generate` that a Domino step cannot use exactly: anything but a
    `DynamicCache` (static, quantized and offloaded-static caches cannot be cropped the way a verify step
    needs)."""
    from transformers.cache_utils import DynamicCache

    if cache is not None and not isinstance(cache, DynamicCache):
        raise ValueError(
            f"Domino speculative decoding needs a DynamicCache for the target, got a {type(cache).__name__}: "
            "drop the cache argument (generate makes a DynamicCache) or pass `DynamicCache()`."
        )


def _validate_domino_request(target, draft, generation_config) -> None:
    if (generation_config.num_beams or 1) > 1:
        raise ValueError(
            f"num_beams={generation_config.num_beams} with a Domino draft: speculative decoding verifies one "
            "sequence, and beam search would never use the draft. Drop `num_beams` (or the `assistant_model`)."
        )
    if generation_config.speculation_type is not None:
        raise ValueError(
            f"speculation_type={generation_config.speculation_type!r} selects one of transformers' built-in "
            "drafters; a Domino draft drafts with its own generator. Drop `speculation_type`."
        )
    if generation_config.use_cache is False:
        raise ValueError(
            "use_cache=False with a Domino draft: speculative decoding verifies each proposal against the target's "
            "key/value cache and crops the rejected tokens from it, for one prompt, a batch or a draft tree alike. "
            "Drop use_cache=False (or the `assistant_model`)."
        )
    if generation_config.cache_implementation not in _DYNAMIC_CACHES:
        raise ValueError(
            f"Domino speculative decoding needs a dynamic cache, got cache_implementation="
            f"'{generation_config.cache_implementation}': drop `cache_implementation` (the rejected tokens are "
            "cropped from the cache after every step, which only a DynamicCache is tested to do exactly)."
        )
    check_target_supported(target)
    check_target_attention(target)  # every Domino path (one prompt, a batch, a draft tree) passes here
    check_draft_fits_target(draft.config, target)


_PATCHED = ("_prepare_generation_config", "_validate_generation_mode", "_get_candidate_generator", "_assisted_decoding")
_ORIGINALS_ATTR = "_domino_original_methods"


def is_generate_hook_installed() -> bool:
    """Whether the dispatch is installed (by this copy of the module or another: domino_hf's, a checkpoint's)."""
    from transformers.generation.utils import GenerationMixin

    return bool(getattr(GenerationMixin, _ORIGINALS_ATTR, None))


def check_generate_hook_installed() -> None:
    """Raise the fix when a Domino draft reaches stock transformers because the dispatch was uninstalled."""
    if not is_generate_hook_installed():
        raise RuntimeError(
            "A Domino draft was passed to generate, but the generate dispatch is uninstalled "
            "(uninstall_generate_hook()), so transformers would run it as an ordinary assistant model: reinstall it "
            "with domino_hf.install_generate_hook() (or install_generate_hook() of the draft's dispatch_domino)."
        )


def is_supported_transformers(version: str) -> bool:
    return MIN_TRANSFORMERS <= _release(version) < MAX_TRANSFORMERS


def check_transformers_version(version: str) -> None:
    """Raise an `UnsupportedTransformersError` (an ImportError) naming the supported range when `version` is
    outside it: the dispatch replaces private `GenerationMixin` methods whose signatures are only known for the
    tested releases."""
    if not is_supported_transformers(version):
        raise UnsupportedTransformersError(
            f"Domino drafts support transformers{supported_range()} (found {version}): the generate dispatch relies "
            f"on those releases' assisted-decoding internals. Install one with: "
            f"pip install 'transformers{supported_range()}'"
        )


def install_generate_hook_if_supported() -> bool:
    """Install the dispatch when the running transformers is supported; otherwise leave transformers untouched
    (loading a draft then raises `UnsupportedTransformersError`, see `DominoDraftModel`). Importing the model
    file calls this, so that importing never fails on the version alone."""
    import transformers

    if not is_supported_transformers(transformers.__version__):
        return False
    install_generate_hook()
    return True


def install_generate_hook() -> None:
    """Route `generate(assistant_model=<Domino draft>)` to the draft's candidate generator.

    Footprint: four private `GenerationMixin` methods are wrapped (`_PATCHED`); each wrapper checks whether
    the assistant is a Domino draft and otherwise calls the stock method untouched. One INFO log line is
    written at install; `uninstall_generate_hook()` restores the stock methods. Idempotent: the remote-code
    copy and the domino_hf copy of this module may both call it; the first one wins, and it builds the
    generator with the dispatch that ships beside each draft's class (`_draft_dispatch`), so either copy serves
    both.
    """
    import inspect

    import transformers
    from transformers.generation.utils import GenerationMixin

    if getattr(GenerationMixin, _ORIGINALS_ATTR, None):
        return
    check_transformers_version(transformers.__version__)
    originals = {name: getattr(GenerationMixin, name) for name in _PATCHED}
    assisted_signature = inspect.signature(originals["_assisted_decoding"])

    def _prepare_generation_config(self, generation_config, *args, **kwargs):
        # `generate(..., use_suffix_cache=False)` and the other drafting settings: onto the call's (copied)
        # config, where the generator reads them, instead of transformers' unused-model-kwargs error.
        passed = {name: kwargs.pop(name) for name in CALL_KWARGS if name in kwargs}
        result = originals["_prepare_generation_config"](self, generation_config, *args, **kwargs)
        if passed:
            config = result[0]
            for name, value in passed.items():
                setattr(config, name, value)
            config._domino_call_kwargs = tuple(passed)  # checked (and removed) by _validate_generation_mode
        return result

    def _validate_generation_mode(self, generation_mode, generation_config, generation_mode_kwargs):
        assistant = generation_mode_kwargs.get("assistant_model")
        passed = vars(generation_config).pop("_domino_call_kwargs", ())
        if passed and not is_domino_draft(assistant):
            raise ValueError(
                f"{', '.join(passed)}: Domino drafting setting(s), used only with a Domino draft as "
                "`assistant_model`. Pass one (`assistant_model=draft`) or drop them."
            )
        if is_domino_draft(assistant):
            _validate_domino_request(self, assistant, generation_config)
            if generation_config.num_return_sequences > 1:
                # transformers refuses several sequences per prompt for every assistant (its loop verifies one
                # row); `generate` repeats each prompt `num_return_sequences` times, as for plain sampling, and
                # the rows go to the batched verify loop. (Greedy with several is refused earlier, as plain.)
                generation_config = copy.copy(generation_config)
                generation_config.num_return_sequences = 1
        elif (assistant is not None and generation_config.speculation_type is None
              and _looks_like_domino_checkpoint(assistant)):
            # (with `speculation_type="dflash"` the draft goes to transformers' own DFlash drafting, untouched)
            raise ValueError(
                f"The assistant model is a Domino/DFlash draft checkpoint loaded as a plain "
                f"{type(assistant).__name__}, so its drafting code is missing. Load it with "
                "`AutoModel.from_pretrained(path, trust_remote_code=True)` or "
                "`domino_hf.DominoDraftModel.from_pretrained(path)` (or, for a DFlash draft with its own "
                "remote code, pass `speculation_type=\"dflash\"` to use transformers' DFlash drafting)."
            )
        return originals["_validate_generation_mode"](self, generation_mode, generation_config, generation_mode_kwargs)

    def _get_candidate_generator(self, *args, **kwargs):
        bound = inspect.signature(originals["_get_candidate_generator"]).bind(self, *args, **kwargs).arguments
        assistant = bound.get("assistant_model")
        if is_domino_draft(assistant):
            generator = _candidate_generator(
                assistant,
                target=self,
                generation_config=bound["generation_config"],
                logits_processor=bound.get("logits_processor"),
                input_ids=bound["input_ids"],
                stopping_criteria=_STOPPING_CRITERIA.get(),
            )
            built = _GENERATORS.get()
            if built is not None:
                built.append(generator)
            return generator
        return originals["_get_candidate_generator"](self, *args, **kwargs)

    def _assisted_decoding(self, *args, **kwargs):
        # Stop strings and custom criteria reach the generator through a context variable: transformers builds
        # the candidate generator inside this call without passing them on.
        bound = assisted_signature.bind_partial(self, *args, **kwargs).arguments
        if is_domino_draft(bound.get("assistant_model")):
            check_cache_supported(user_cache(bound.get("model_kwargs") or kwargs))
            draft, config = bound["assistant_model"], bound["generation_config"]
            if bound["input_ids"].shape[0] > 1 or _verifies_tree(draft, self, config):
                # a batch, or a draft tree: the Domino verify loop, not transformers' (a chain, batch 1 only)
                return _batch_decoder(draft, self, bound)
        token = _STOPPING_CRITERIA.set(bound.get("stopping_criteria"))
        built = []
        generators = _GENERATORS.set(built)
        try:
            output = originals["_assisted_decoding"](self, *args, **kwargs)
        finally:
            _STOPPING_CRITERIA.reset(token)
            _GENERATORS.reset(generators)
        sequences = output if isinstance(output, torch.Tensor) else output.sequences
        for generator in built:  # the call returned: its prompt and output go into its suffix cache
            if hasattr(generator, "remember"):
                generator.remember(sequences)
        return output

    wrappers = (_prepare_generation_config, _validate_generation_mode, _get_candidate_generator, _assisted_decoding)
    for name, wrapper in zip(_PATCHED, wrappers):
        wrapper.__wrapped__ = originals[name]
        setattr(GenerationMixin, name, wrapper)
    setattr(GenerationMixin, _ORIGINALS_ATTR, originals)
    logger.info(
        "Domino: generate(assistant_model=<Domino draft>) dispatch installed on transformers %s (wraps "
        "GenerationMixin.%s; undo with uninstall_generate_hook()).",
        transformers.__version__,
        ", .".join(_PATCHED),
    )


def uninstall_generate_hook() -> None:
    """Restore transformers' stock `GenerationMixin` methods (Domino drafts then no longer dispatch)."""
    from transformers.generation.utils import GenerationMixin

    originals = getattr(GenerationMixin, _ORIGINALS_ATTR, None)
    if not originals:
        return
    for name, method in originals.items():
        setattr(GenerationMixin, name, method)
    setattr(GenerationMixin, _ORIGINALS_ATTR, None)
