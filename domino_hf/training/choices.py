"""The names the training commands' options offer, importable without torch: a subcommand's `--help` lists them
before any heavy import. The modules that give them meaning import them from here: the losses and the default
top-K of `--loss kl` (`distill.py`, `objective.py`), the feature stores' on-disk formats and the feature folder's
files (`features.py`), and the vocabulary size above which a draft gets a sub-vocabulary by default (`recipe.py`)."""

LOSSES = ("ce", "kl")
DEFAULT_TOPK = 32
# Above BIG_VOCAB tokens, training on the whole vocabulary is mostly vocabulary work (LM-head rows, head correction,
# cross entropy): the draft then predicts over the DEFAULT_DRAFT_VOCAB most frequent response tokens unless told.
BIG_VOCAB = 65536
DEFAULT_DRAFT_VOCAB = 32768

META = "features.json"
CONFIG = "draft_config.json"
STORES = ("bfloat16", "float16-scaled", "float32")
