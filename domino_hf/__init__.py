"""domino-hf: Domino speculative decoding for 🤗 Transformers.

    draft = AutoModel.from_pretrained(DRAFT, trust_remote_code=True)
    target.generate(**inputs, assistant_model=draft)

Importing this package (or loading a draft with `trust_remote_code`) installs the dispatch that routes a
Domino draft passed as `assistant_model` to its candidate generator.
"""

import logging

from transformers import AutoConfig, AutoModel

from .cpu_kernels import is_optimized, optimize_for_cpu, restore_stock_kernels, stock_kernels
from .modeling import (
    DominoCandidateGenerator,
    DominoConfig,
    DominoContextCache,
    DominoDraftModel,
    DominoTargetHead,
    install_generate_hook,
    uninstall_generate_hook,
)

__version__ = "0.1.0"

# With domino_hf imported, Domino folders also load through the Auto classes without remote code.
AutoConfig.register(DominoConfig.model_type, DominoConfig, exist_ok=True)
AutoModel.register(DominoConfig, DominoDraftModel, exist_ok=True)

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "DominoConfig",
    "DominoDraftModel",
    "DominoCandidateGenerator",
    "DominoContextCache",
    "DominoTargetHead",
    "install_generate_hook",
    "uninstall_generate_hook",
    "optimize_for_cpu",
    "restore_stock_kernels",
    "stock_kernels",
    "is_optimized",
    "__version__",
]
