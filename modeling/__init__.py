# The remote-code files copied into every Domino checkpoint; domino_hf imports them from here.
from .configuration_domino import DominoConfig
from .dispatch_domino import install_generate_hook, uninstall_generate_hook
from .generation_domino import DominoCandidateGenerator, DominoContextCache
from .modeling_domino import REMOTE_CODE_FILES, DominoDraftModel
from .target_domino import DominoTargetHead

__all__ = [
    "DominoConfig",
    "DominoDraftModel",
    "DominoCandidateGenerator",
    "DominoContextCache",
    "DominoTargetHead",
    "install_generate_hook",
    "uninstall_generate_hook",
    "REMOTE_CODE_FILES",
]
