"""Dtype names, in one place: what every `--dtype` / `--draft-dtype` option accepts, and their torch dtypes.

Importing this module does not import torch (the CLI lists choices before any heavy import).
"""

from __future__ import annotations

DTYPE_NAMES = ("float32", "bfloat16", "float16")


def torch_dtype(name: str):
    """"bfloat16" -> torch.bfloat16; a ValueError naming the choices for anything else."""
    import torch

    if name not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {name!r}: choose one of {', '.join(DTYPE_NAMES)}")
    return getattr(torch, name)


def dtype_name(dtype) -> str:
    """torch.bfloat16 -> "bfloat16" (the inverse of `torch_dtype`, for reports and JSON)."""
    return str(dtype).removeprefix("torch.")
