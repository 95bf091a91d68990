"""The layout of a training run's folder, in one place: what the trainer writes, what resume and export read.

    <output_dir>/checkpoint-<step>/   a loadable draft (config.json, model.safetensors, remote code) + Trainer
                                      state; `COMPLETE_MARKER` is written last, so a folder without it was cut
                                      short by a kill and is never resumed from
    <output_dir>/final/               the trained draft + training_summary.json
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

logger = logging.getLogger(__name__)

COMPLETE_MARKER = ".domino-complete"
FINAL = "final"
SUMMARY = "training_summary.json"
WEIGHTS = "model.safetensors"


def checkpoint_folder(output_dir, step: int) -> Path:
    return Path(output_dir) / f"checkpoint-{step}"


def mark_complete(checkpoint, step: int) -> None:
    """Written after everything else of the checkpoint: from now on it may be resumed from."""
    (Path(checkpoint) / COMPLETE_MARKER).write_text(str(step))


def last_complete_checkpoint(output_dir) -> str | None:
    """Newest `checkpoint-N` whose save finished; incomplete ones (killed mid-write) are removed."""
    root = Path(output_dir)
    if not root.is_dir():
        return None
    done = [p for p in root.glob("checkpoint-*") if (p / COMPLETE_MARKER).exists() and p.name.split("-")[-1].isdigit()]
    for partial in set(root.glob("checkpoint-*")) - set(done):
        logger.warning("Removing incomplete checkpoint %s (the run was killed while saving it)", partial)
        shutil.rmtree(partial, ignore_errors=True)
    return str(max(done, key=lambda p: int(p.name.split("-")[-1]))) if done else None


def resolve_draft_folder(path) -> Path:
    """A run folder (its `final/`, else its newest complete checkpoint) or a draft folder itself."""
    path = Path(path)
    if (path / "config.json").exists() and (path / WEIGHTS).exists():
        return path
    if (path / FINAL / "config.json").exists():
        return path / FINAL
    checkpoint = last_complete_checkpoint(path)
    if checkpoint:
        return Path(checkpoint)
    raise FileNotFoundError(
        f"{path} holds no draft: expected config.json + {WEIGHTS}, a {FINAL}/ folder, or checkpoints."
    )
