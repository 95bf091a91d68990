"""`python -m domino_hf.train …` / `accelerate launch -m domino_hf.train …`: the `domino train` entry point."""

import sys

from .training.train import main

if __name__ == "__main__":
    sys.exit(main())
