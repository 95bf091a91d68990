"""domino-hf: Domino speculative decoding for 🤗 Transformers.

    from domino_hf import load_draft, load_target  # or DominoDraftModel / AutoModel.from_pretrained(folder, …)
    target, tokenizer = load_target("smollm2")
    draft = load_draft("smollm2", target)          # the draft shipped with domino-hf, from any folder
    target.generate(**inputs, assistant_model=draft)

`import domino_hf` itself is cheap (the `domino` CLI starts in a blink): torch and transformers load on the
first use of a name below. That first use imports `domino_hf.modeling`, which installs the dispatch that
routes a Domino draft passed as `assistant_model` to its candidate generator, and registers `domino_draft`
with `AutoConfig` / `AutoModel` so Domino folders load through the Auto classes without remote code.

`domino_hf.modeling` and `domino_hf.hub_configs` are the checkout's top-level `modeling/` and `hub_configs/`
folders (pyproject maps them at install time). When this package is imported from a checkout whose `domino_hf/`
lacks them (a non-editable install used with the checkout as the working directory: its `domino_hf/` shadows the
installed one), `_CheckoutFolders` finds them in the checkout instead.
"""

import importlib
import importlib.machinery
import logging
import sys
from pathlib import Path

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
    "load_draft": "targets",
    "draft_path": "targets",
}

logging.getLogger(__name__).addHandler(logging.NullHandler())

# the subpackages installed from top-level checkout folders of the same name (pyproject's package-dir)
_CHECKOUT_FOLDERS = ("modeling", "hub_configs")


class _CheckoutFolders:
    """Finds `domino_hf.modeling` / `domino_hf.hub_configs` in the checkout around this package. Appended to
    `sys.meta_path`, it is asked only after every other finder came up empty, so an installed package's own
    subpackages (or an editable install's mapping) always win."""

    def __init__(self, root: Path):
        self.root = str(root)

    def find_spec(self, fullname, path=None, target=None):
        package, _, name = fullname.rpartition(".")
        if package != __name__ or name not in _CHECKOUT_FOLDERS:
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, [self.root])


def _install_checkout_finder() -> None:
    here = Path(__file__).resolve().parent
    root = here.parent
    in_checkout = (root / "pyproject.toml").is_file() and (root / "modeling" / "__init__.py").is_file()
    if in_checkout and not (here / "modeling").exists() and not any(
        isinstance(finder, _CheckoutFolders) for finder in sys.meta_path
    ):
        sys.meta_path.append(_CheckoutFolders(root))


_install_checkout_finder()


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
