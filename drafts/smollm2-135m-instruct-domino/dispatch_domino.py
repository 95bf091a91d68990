# Copyright 2026 The domino-hf authors. Licensed under the Apache License, Version 2.0.
"""The `generate(assistant_model=domino_draft)` dispatch: routes a Domino draft to its candidate generator.

Remote-code file (torch + transformers only). transformers has no public plug-in point for a third-party
candidate generator, so three private `GenerationMixin` methods are wrapped, for the tested releases only
(`MIN_TRANSFORMERS` ≤ version < `MAX_TRANSFORMERS`); every other assistant and generation mode reaches the
stock methods untouched. `uninstall_generate_hook()` restores them.
"""

from __future__ import annotations

import contextvars
import importlib
import logging

from .target_domino import check_draft_fits_target

logger = logging.getLogger(__name__)

MIN_TRANSFORMERS = (5, 23)  # supported releases: MIN <= (major, minor) < MAX
MAX_TRANSFORMERS = (5, 24)
_STATIC_CACHES = ("static", "hybrid", "sliding_window", "offloaded_static", "offloaded_hybrid")

_STOPPING_CRITERIA = contextvars.ContextVar("domino_stopping_criteria", default=None)


def is_domino_draft(model) -> bool:
    """A `DominoDraftModel` (from domino_hf or from any checkpoint's remote code)."""
    config = getattr(model, "config", None)
    return getattr(config, "model_type", None) == "domino_draft" and callable(getattr(model, "fuse_context", None))


def candidate_generator_class(draft):
    """The `DominoCandidateGenerator` shipped beside the draft's own class: a remote-code draft drafts with its
    checkpoint's `generation_domino.py`, a domino_hf draft with domino_hf's, whichever copy of this dispatch
    was installed first."""
    package = type(draft).__module__.rpartition(".")[0]
    try:
        return importlib.import_module(f"{package}.generation_domino").DominoCandidateGenerator
    except (ImportError, AttributeError, ValueError):  # a draft class defined outside a Domino package
        from .generation_domino import DominoCandidateGenerator

        return DominoCandidateGenerator


def _looks_like_domino_checkpoint(model) -> bool:
    """A Domino/DFlash draft checkpoint loaded as a plain model (i.e. without `trust_remote_code`)."""
    config = getattr(model, "config", None)
    if config is None or is_domino_draft(model):
        return False
    auto_map = str(getattr(config, "auto_map", "") or "")
    archs = str(getattr(config, "architectures", "") or "")
    return hasattr(config, "dflash_config") or "domino" in auto_map.lower() or "Domino" in archs


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
    if generation_config.cache_implementation in _STATIC_CACHES:
        raise ValueError(
            f"Domino speculative decoding needs a dynamic cache, got cache_implementation="
            f"'{generation_config.cache_implementation}': drop `cache_implementation` (the verified tokens are "
            "cropped from the cache after every step, which a static cache cannot do)."
        )
    check_draft_fits_target(draft.config, target)


_PATCHED = ("_validate_generation_mode", "_get_candidate_generator", "_assisted_decoding")
_ORIGINALS_ATTR = "_domino_original_methods"


def _release(version: str) -> tuple[int, int]:
    parts = [int("".join(ch for ch in part if ch.isdigit()) or 0) for part in version.split(".")[:2]]
    return tuple(parts + [0] * (2 - len(parts)))


def check_transformers_version(version: str) -> None:
    """Raise an ImportError naming the supported range when `version` is outside it: the dispatch replaces
    private `GenerationMixin` methods whose signatures are only known for the tested releases."""
    if not MIN_TRANSFORMERS <= _release(version) < MAX_TRANSFORMERS:
        low, high = ".".join(map(str, MIN_TRANSFORMERS)), ".".join(map(str, MAX_TRANSFORMERS))
        raise ImportError(
            f"Domino drafts support transformers>={low},<{high} (found {version}): the generate dispatch relies on "
            f"that release's assisted-decoding internals. Install it with: pip install 'transformers>={low},<{high}'"
        )


def install_generate_hook() -> None:
    """Route `generate(assistant_model=<Domino draft>)` to the draft's candidate generator.

    Footprint: three private `GenerationMixin` methods are wrapped (`_PATCHED`); each wrapper checks whether
    the assistant is a Domino draft and otherwise calls the stock method untouched. One INFO log line is
    written at install; `uninstall_generate_hook()` restores the stock methods. Idempotent: the remote-code
    copy and the domino_hf copy of this module may both call it; the first one wins, and it builds the
    generator that ships beside each draft's class (`candidate_generator_class`), so either copy serves both.
    """
    import inspect

    import transformers
    from transformers.generation.utils import GenerationMixin

    if getattr(GenerationMixin, _ORIGINALS_ATTR, None):
        return
    check_transformers_version(transformers.__version__)
    originals = {name: getattr(GenerationMixin, name) for name in _PATCHED}
    assisted_signature = inspect.signature(originals["_assisted_decoding"])

    def _validate_generation_mode(self, generation_mode, generation_config, generation_mode_kwargs):
        assistant = generation_mode_kwargs.get("assistant_model")
        if is_domino_draft(assistant):
            _validate_domino_request(self, assistant, generation_config)
        elif assistant is not None and _looks_like_domino_checkpoint(assistant):
            raise ValueError(
                f"The assistant model is a Domino/DFlash draft checkpoint loaded as a plain "
                f"{type(assistant).__name__}, so its drafting code is missing. Load it with "
                "`AutoModel.from_pretrained(path, trust_remote_code=True)` or "
                "`domino_hf.DominoDraftModel.from_pretrained(path)`."
            )
        return originals["_validate_generation_mode"](self, generation_mode, generation_config, generation_mode_kwargs)

    def _get_candidate_generator(self, *args, **kwargs):
        bound = inspect.signature(originals["_get_candidate_generator"]).bind(self, *args, **kwargs).arguments
        assistant = bound.get("assistant_model")
        if is_domino_draft(assistant):
            return candidate_generator_class(assistant)(
                draft=assistant,
                target=self,
                generation_config=bound["generation_config"],
                logits_processor=bound.get("logits_processor"),
                input_ids=bound["input_ids"],
                stopping_criteria=_STOPPING_CRITERIA.get(),
            )
        return originals["_get_candidate_generator"](self, *args, **kwargs)

    def _assisted_decoding(self, *args, **kwargs):
        # Stop strings and custom criteria reach the generator through a context variable: transformers builds
        # the candidate generator inside this call without passing them on.
        stopping = assisted_signature.bind_partial(self, *args, **kwargs).arguments.get("stopping_criteria")
        token = _STOPPING_CRITERIA.set(stopping)
        try:
            return originals["_assisted_decoding"](self, *args, **kwargs)
        finally:
            _STOPPING_CRITERIA.reset(token)

    for name, wrapper in zip(_PATCHED, (_validate_generation_mode, _get_candidate_generator, _assisted_decoding)):
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
