"""domino-hf: Domino speculative decoding for 🤗 Transformers.

    from domino_hf import DominoDraftModel       # or AutoModel.from_pretrained(DRAFT, trust_remote_code=True)
    target.generate(**inputs, assistant_model=draft)

`import domino_hf` itself is cheap (the `domino` CLI starts in a blink): torch and transformers load on the
first use of a name below. That first use imports `domino_hf.modeling`, which installs the dispatch that
routes a Domino draft passed as `assistant_model` to its candidate generator, and registers `domino_draft`
with `AutoConfig` / `AutoModel` so Domino folders load through the Auto classes without remote code.
"""

import importlib
import logging

__version__ = "0.1.0"

# name -> submodule that defines it (imported on first access, PEP 562)
_EXPORTS = {
    "DominoConfig": "modeling",
    "DominoConfigError": "modeling",
    "DominoDraftModel": "modeling",
    "DominoCandidateGenerator": "modeling",
    "DominoContextCache": "modeling",
    "DominoTargetHead": "modeling",
    "SuffixCache": "modeling",
    "install_generate_hook": "modeling",
    "uninstall_generate_hook": "modeling",
    "optimize_for_cpu": "cpu_kernels",
    "restore_stock_kernels": "cpu_kernels",
    "stock_kernels": "cpu_kernels",
    "is_optimized": "cpu_kernels",
    "load_target": "targets",
}

logging.getLogger(__name__).addHandler(logging.NullHandler())


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value  # later lookups skip this function
        return value
    if name in ("modeling", "cpu_kernels", "targets", "data", "training", "bench", "utils", "cli"):
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_EXPORTS))


__all__ = [*_EXPORTS, "__version__"]
