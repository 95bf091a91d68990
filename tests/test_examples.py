"""The examples run: `examples/train_tiny.sh` is also the smoke test of the `domino` CLI end to end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_train_tiny_runs_the_whole_pipeline(tmp_path):
    # The CLI and `python` of this interpreter's environment, even when it is not activated.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(["bash", str(REPO / "examples" / "train_tiny.sh"), str(tmp_path / "out")],
                            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "greedy outputs identical with and without the draft" in result.stdout
    assert "final losses:" in result.stdout and "training from cached features matches" in result.stdout
    assert (tmp_path / "out" / "draft" / "model.safetensors").exists()
