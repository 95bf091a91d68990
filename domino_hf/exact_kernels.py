"""Length-invariant CPU kernels: a token's logits are bitwise the same whatever forward computes them.

Why: speculative decoding verifies k drafted tokens in one target forward, then keeps the tokens whose logits
agree with what plain decoding would have computed one token at a time. Stock CPU kernels pick their blocking
and reduction order by the number of rows (MKL's and oneDNN's GEMMs, SDPA's key blocks), so a token's logits in
a k-token forward differ in the last bits from the same token's logits in a 1-token step. In fp32 that flips a
greedy argmax rarely; in bf16 it flips one often enough to change outputs (docs/benchmark.md#precision).

`domino_hf/csrc/invariant_cpu.cpp` computes every output of a linear layer and of attention with one fixed
instruction sequence that depends only on that output's own inputs: one row of x and one row of the weight (a
linear layer), one query and the keys its mask allows, in key order (attention). The number of rows in the call,
the row's place, the other rows (left padding included) and keys past the causal limit never enter. Norms,
rotary embeddings, activations and residual additions are torch's own per-row and element-wise ops, which do
not depend on the number of rows either; the self-check proves the whole forward on the model's own shapes.

What runs where:
* x86-64 CPUs with AVX-512 (F, BW, VL, DQ): float32 linear layers and attention; bfloat16 linear layers
  additionally need AVX512-BF16 (dot products of bf16 pairs into fp32 lanes).
* The extension compiles once per machine on first use (about a minute; cached in
  `$DOMINO_HF_CACHE/extensions`, default `~/.cache/domino-hf/extensions`). Without a C++ compiler, on another
  CPU, or where the self-check fails, one log line says why and `optimize_for_cpu` keeps its calibrated
  (fastest, not invariant) kernels.

`install(model)` switches every plain `nn.Linear` to the invariant kernel (as `cpu_kernels.PackedLinear` with
`EXACT` at every length) and the attention to `ATTENTION_NAME`; `self_check(model)` compares a k-token forward
with one-token steps, chunks and a left-padded batch, bitwise, on random tokens.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import time
from pathlib import Path

import torch
from torch import nn

from .cpu_attention import _STOCK_ONLY_KWARGS, _stock_sdpa
from .dtypes import cpu_info

logger = logging.getLogger(__name__)

ATTENTION_NAME = "domino_exact"
SOURCE = Path(__file__).parent / "csrc" / "invariant_cpu.cpp"
# -fopenmp: at::parallel_for runs its tasks on torch's OpenMP threads only when the kernels are compiled with OpenMP
# (without it every kernel runs on one thread); the library links to the libgomp torch has already loaded.
BUILD_FLAGS = ("-O3", "-fopenmp")
AVX512_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512dq")
# Attention implementations whose computation the kernel reproduces (mask and scale): switched to it.
REPLACEABLE_ATTENTION = ("sdpa", "eager", "domino_cpu_sdpa", ATTENTION_NAME)

_extension = None
_extension_error: str | None = None
_fallbacks_said: set[str] = set()


def unsupported_reason(dtype: torch.dtype) -> str | None:
    """Why the invariant kernels cannot run `dtype` on this CPU, or None when they can."""
    if dtype not in (torch.float32, torch.bfloat16):
        return f"{dtype} (float32 and bfloat16 only)"
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"a {platform.machine()} CPU (the kernels are written for x86-64 AVX-512)"
    flags = set(cpu_info()["flags"])
    missing = [flag for flag in AVX512_FLAGS if flag not in flags]
    if missing:
        return f"a CPU without {', '.join(missing)}"
    if dtype == torch.bfloat16 and "avx512_bf16" not in flags:
        return "bfloat16 on a CPU without avx512_bf16"
    return None


def unavailable_reason(dtype: torch.dtype) -> str | None:
    """Why the kernels cannot run `dtype` here (this CPU, or a build that failed; compiles on first call), or None."""
    reason = unsupported_reason(dtype)
    if reason is None and load_extension() is None:
        reason = f"the length-invariant kernels did not compile: {extension_error()}"
    return reason


@functools.lru_cache(maxsize=None)
def supported(dtype: torch.dtype) -> bool:
    """Whether the kernels run `dtype` here: the CPU has their instructions and the extension is built."""
    return unavailable_reason(dtype) is None


def _build_directory() -> Path:
    cache = Path(os.environ.get("DOMINO_HF_CACHE", Path.home() / ".cache" / "domino-hf"))
    digest = hashlib.sha256(SOURCE.read_bytes() + torch.__version__.encode() + " ".join(BUILD_FLAGS).encode())
    digest = digest.hexdigest()[:16]
    return cache / "extensions" / f"invariant_cpu-{digest}"


STALE_LOCK_SECONDS = 600  # a build takes about a minute; a lock this old was left by a build that was killed


def _clear_stale_lock(lock: Path) -> None:
    """torch's extension builder waits for as long as its `lock` file exists, and a build that is killed (Ctrl-C,
    a job's time limit) leaves it behind: every later load would hang. A lock older than any build is removed."""
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return
    if age > STALE_LOCK_SECONDS:
        logger.warning("Removing %s, left %.0f s ago by a kernel build that did not finish; building again.", lock, age)
        lock.unlink(missing_ok=True)


def load_extension():
    """The compiled kernels (built once per machine and source version), or None with the reason in
    `extension_error()` (no compiler, a failed build)."""
    global _extension, _extension_error
    if _extension is not None or _extension_error is not None:
        return _extension
    try:
        from torch.utils.cpp_extension import load

        directory = _build_directory()
        directory.mkdir(parents=True, exist_ok=True)
        _clear_stale_lock(directory / "lock")
        if not any(directory.glob("*.so")):
            logger.info("Compiling the length-invariant CPU kernels once (about a minute) into %s.", directory)
        _extension = load(name=f"domino_invariant_cpu_{directory.name[-16:]}", sources=[str(SOURCE)],
                          extra_cflags=list(BUILD_FLAGS), extra_ldflags=["-fopenmp"],
                          build_directory=str(directory), verbose=False)
    except Exception as error:  # no compiler, no ninja, a failed build: the calibrated kernels run instead
        _extension_error = f"{type(error).__name__}: {str(error).strip().splitlines()[-1] if str(error) else ''}"
    return _extension


def extension_error() -> str | None:
    return _extension_error


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return _extension.linear(x, weight, bias)


def exact_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention with the signature of transformers' attention functions: `query` (batch, heads, q_len, dim),
    `key`/`value` (batch, kv_heads, kv_len, dim), `attention_mask` boolean (batch, 1, q_len, kv_len) or None
    (causal); returns (batch, q_len, heads, dim) and no weights. What the kernel does not cover (dropout while
    training, soft-capping, sinks, a float mask, gradients) runs on stock SDPA, said once per cause."""
    cause = None
    if dropout and module.training:
        cause = "dropout"
    elif any(kwargs.get(name) not in (None, False) for name in _STOCK_ONLY_KWARGS):
        cause = "soft-capping, sinks or a position bias"
    elif attention_mask is not None and (attention_mask.dtype != torch.bool or attention_mask.dim() != 4):
        cause = "a non-boolean attention mask"
    elif torch.is_grad_enabled() and query.requires_grad:
        cause = "gradients"
    elif query.dtype not in (torch.float32, torch.bfloat16) or query.device.type != "cpu":
        cause = f"{query.dtype} on {query.device}"
    if cause is not None:
        if cause not in _fallbacks_said:
            _fallbacks_said.add(cause)
            logger.warning("Length-invariant attention: %s is not covered; stock SDPA runs (not length-invariant).",
                           cause)
        return _stock_sdpa()(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return _extension.attention(query, key, value, attention_mask, float(scale)), None


def register_attention() -> None:
    """Register the attention function and transformers' boolean SDPA mask builder under `ATTENTION_NAME`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION_NAME, exact_attention_forward)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)


# ------------------------------------------------------------------------------------------------- self-check
def _logits(model, ids, position_ids=None, attention_mask=None, past=None):
    from .modeling.dispatch_domino import CACHE_ARGUMENT

    out = model(input_ids=ids, position_ids=position_ids, attention_mask=attention_mask, use_cache=True,
                **{CACHE_ARGUMENT: past})
    return out.logits, past


def _new_cache(model):
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def self_check(model: nn.Module, length: int = 12, seed: int = 0) -> str | None:
    """Whether every token's logits are bitwise the same in one forward over `length` tokens, in one-token steps
    after a prefill, in uneven chunks (3 + 5 + …), and as the second row of a batch whose first row is longer
    (so the second is left-padded). Returns None when they are, else what differed."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    generator = torch.Generator().manual_seed(seed)
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    if vocab < 4:
        return "no vocabulary size in the config"
    ids = torch.randint(3, vocab, (1, length), generator=generator)
    prefill = 4
    with torch.no_grad():
        whole, _ = _logits(model, ids, past=_new_cache(model))
        steps = {"one-token steps": [1] * (length - prefill), "chunks": []}
        left = length - prefill
        for size in (3, 5, 1, 7, 2) * length:
            if left <= 0:
                break
            steps["chunks"].append(min(size, left))
            left -= size
        for name, sizes in steps.items():
            logits, past = _logits(model, ids[:, :prefill], past=_new_cache(model))
            parts, start = [logits], prefill
            for size in sizes:
                logits, past = _logits(model, ids[:, start:start + size], past=past)
                parts.append(logits)
                start += size
            got = torch.cat(parts, dim=1)
            if not torch.equal(got, whole):
                return f"{name} differ from one forward (max |diff| {(got - whole).abs().max().item():.3g})"
        pad = 3  # row 0: `length` tokens; row 1: the first length - pad of them, left-padded
        longer = torch.randint(3, vocab, (1, length), generator=generator)
        batch = torch.cat([longer, torch.cat([torch.zeros(1, pad, dtype=ids.dtype), ids[:, :length - pad]], 1)])
        mask = torch.ones_like(batch)
        mask[1, :pad] = 0
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        batched, _ = _logits(model, batch, position_ids=positions, attention_mask=mask, past=_new_cache(model))
        if not torch.equal(batched[1, pad:], whole[0, :length - pad]):
            return "a left-padded batch row differs from the prompt alone"
    return None
