"""The dm-math child: `PYTHONHASHSEED=0 python -m domino_hf.prompt_sources dm-math N` writes JSON lines."""

import json
import logging
import os
import sys

from .mathematics import generate_dm_math

logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
if sys.argv[1:2] != ["dm-math"] or os.environ.get("PYTHONHASHSEED") != "0":
    sys.exit("usage: PYTHONHASHSEED=0 python -m domino_hf.prompt_sources dm-math PER_MODULE")
for item in generate_dm_math(int(sys.argv[2])):
    sys.stdout.write(json.dumps(item, ensure_ascii=False) + "\n")
