"""The names the training commands' options offer, importable without torch: a subcommand's `--help` lists them
before any heavy import. The modules that give them meaning import them from here: the losses and the default
top-K of `--loss kl` (`distill.py`, `objective.py`), the feature stores' on-disk formats and the feature folder's
files (`features.py`)."""

LOSSES = ("ce", "kl")
DEFAULT_TOPK = 32

META = "features.json"
CONFIG = "draft_config.json"
STORES = ("bfloat16", "float16-scaled", "float32")
