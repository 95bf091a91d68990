# The remote-code files copied into every Domino checkpoint; domino_hf imports them from here.
from .configuration_domino import DominoConfig
from .generation_domino import DominoCandidateGenerator, DominoContextCache, DominoTargetHead, install_generate_hook
from .modeling_domino import DominoDraftModel

__all__ = [
    "DominoConfig",
    "DominoDraftModel",
    "DominoCandidateGenerator",
    "DominoContextCache",
    "DominoTargetHead",
    "install_generate_hook",
]
