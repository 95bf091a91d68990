"""`python -m domino_hf.train …` / `accelerate launch -m domino_hf.train …`: the `domino train` entry point.

The recipe lives in `domino_hf.training.recipe` and its options in `domino_hf.training.train_cli`; this module
only makes them runnable with `-m`, which `accelerate launch` and `torchrun` need."""

import sys

from .training.train_cli import main

if __name__ == "__main__":
    sys.exit(main())
