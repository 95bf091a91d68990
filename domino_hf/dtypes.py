"""Dtype names, in one place: what every `--dtype` / `--draft_dtype` option accepts, and their torch dtypes.

Importing this module does not import torch (the CLI lists choices before any heavy import).
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

DTYPE_NAMES = ("float32", "bfloat16", "float16")
DTYPE_CHOICES = ("auto", *DTYPE_NAMES)  # a target's --dtype in the data commands: see `resolve_dtype`


def torch_dtype(name: str):
    """"bfloat16" -> torch.bfloat16; a ValueError naming the choices for anything else."""
    import torch

    if name not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {name!r}: choose one of {', '.join(DTYPE_NAMES)}")
    return getattr(torch, name)


def dtype_name(dtype) -> str:
    """torch.bfloat16 -> "bfloat16" (the inverse of `torch_dtype`, for reports and JSON)."""
    return str(dtype).removeprefix("torch.")


def cpu_info() -> dict:
    """The CPU's model name and its flags (`/proc/cpuinfo`; empty where it cannot be read)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
                if "model name" in fields and "flags" in fields:
                    break
    except OSError:
        pass
    return {"model": fields.get("model name", ""), "flags": fields.get("flags", "").split()}


# The CPU features that decide which kernels run fast (reported with every benchmark).
KERNEL_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (avx512_bf16 or AMX), where oneDNN's bf16 matmuls beat fp32."""
    flags = cpu_info()["flags"]
    return "avx512_bf16" in flags or "amx_bf16" in flags


def bf16_is_fast(device: str) -> bool:
    """Whether bfloat16 is the faster precision for a forward on `device`: a CUDA GPU that supports it, or a CPU
    with native bf16. Why it matters: elsewhere PyTorch emulates bf16 GEMMs, and on an AVX2-only CPU a bf16
    matmul measured 60x slower than fp32 (1.1 against 70 GFLOPS on one thread; docs/cpu_kernels.md)."""
    import torch

    if str(device).startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return str(device) == "cpu" and cpu_has_native_bf16()


def resolve_dtype(name: str, device: str = "cpu"):
    """A data command's `--dtype` (`DTYPE_CHOICES`) as a torch dtype for a target on `device`.

    "auto" is bfloat16 where `bf16_is_fast(device)`, else float32. An explicit half precision on a CPU without
    native bf16 is kept (the user asked for it) with a warning, since float32 runs many times faster there."""
    import torch

    if name == "auto":
        return torch.bfloat16 if bf16_is_fast(device) else torch.float32
    dtype = torch_dtype(name)
    if dtype != torch.float32 and str(device) == "cpu":
        warn_if_emulated(f"--dtype {name}", "Use --dtype float32 or auto.")
    return dtype


def resolve_draft_dtype(name: str, target_dtype, device: str):
    """`domino bench --draft_dtype`: an explicit dtype name, or `auto`: bfloat16 for a float32 target on a CPU with
    native bf16 (drafting only proposes tokens, so a cheaper draft precision keeps the output exact), else the
    target's dtype."""
    import torch

    if name != "auto":
        return torch_dtype(name)
    if device == "cpu" and target_dtype == torch.float32 and cpu_has_native_bf16():
        return torch.bfloat16
    return target_dtype


def warn_if_emulated(option: str, fix: str) -> None:
    """Warn that `option` asks this CPU for a precision it has no native matmuls for, naming `fix`; silent on a CPU
    with native bf16. The one wording of that warning for every command (`resolve_dtype`, `domino train --bf16`)."""
    if not cpu_has_native_bf16():
        logger.warning("%s on a CPU without native bf16 (no avx512_bf16/amx_bf16): PyTorch emulates its matmuls, "
                       "many times slower than float32 here. %s", option, fix)
