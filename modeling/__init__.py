# The remote-code files copied into every Domino checkpoint; domino_hf imports them from here.
from transformers import AutoConfig, AutoModel

from .configuration_domino import DominoConfig, DominoConfigError, DraftingSettings
from .dispatch_domino import install_generate_hook, profile_drafting, uninstall_generate_hook
from .generation_domino import DominoCandidateGenerator, DominoContextCache, DominoGenerationStats
from .modeling_domino import REMOTE_CODE_FILES, DominoDraftModel
from .suffix_domino import SuffixCache, SuffixMatch
from .target_domino import DominoTargetHead

# With domino_hf.modeling imported (any `from domino_hf import …` does it), Domino folders also load through the
# Auto classes without remote code.
AutoConfig.register(DominoConfig.model_type, DominoConfig, exist_ok=True)
AutoModel.register(DominoConfig, DominoDraftModel, exist_ok=True)

__all__ = [
    "DominoConfig",
    "DominoConfigError",
    "DominoDraftModel",
    "DominoCandidateGenerator",
    "DominoContextCache",
    "DominoGenerationStats",
    "DraftingSettings",
    "profile_drafting",
    "DominoTargetHead",
    "install_generate_hook",
    "uninstall_generate_hook",
    "REMOTE_CODE_FILES",
    "SuffixCache",
    "SuffixMatch",
]
