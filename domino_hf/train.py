"""`python -m domino_hf.train …` / `accelerate launch -m domino_hf.train …`: the `domino train` entry point.

The recipe and its options live in `domino_hf.training.recipe`; this module only makes them runnable with
`-m`, which `accelerate launch` and `torchrun` need."""

import sys

from .training.recipe import main

if __name__ == "__main__":
    sys.exit(main())
