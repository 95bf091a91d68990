"""domino-hf: Domino speculative decoding for 🤗 Transformers.

    draft = AutoModel.from_pretrained(DRAFT, trust_remote_code=True)
    target.generate(**inputs, assistant_model=draft)

Importing this package (or loading a draft with `trust_remote_code`) installs the dispatch that routes a
Domino draft passed as `assistant_model` to its candidate generator.
"""

import logging

from .modeling import (
    DominoCandidateGenerator,
    DominoConfig,
    DominoContextCache,
    DominoDraftModel,
    DominoTargetHead,
    install_generate_hook,
)

__version__ = "0.1.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "DominoConfig",
    "DominoDraftModel",
    "DominoCandidateGenerator",
    "DominoContextCache",
    "DominoTargetHead",
    "install_generate_hook",
    "__version__",
]
