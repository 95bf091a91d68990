"""The examples run: `examples/train_tiny.sh` is also the smoke test of the `domino` CLI end to end."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent


def run_train_tiny(out: Path, **env_vars: str) -> subprocess.CompletedProcess:
    """`examples/train_tiny.sh OUT` with extra environment (TINY_TARGET, DRAFT_ARGS, EXPORT_ARGS); must succeed."""
    # The CLI and `python` of this interpreter's environment, even when it is not activated.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": path, **env_vars}
    result = subprocess.run(["bash", str(REPO / "examples" / "train_tiny.sh"), str(out)],
                            capture_output=True, text=True, env=env, cwd=out.parent, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "greedy outputs identical with and without the draft" in result.stdout
    assert "final losses:" in result.stdout and "training from cached features matches" in result.stdout
    assert (out / "draft" / "model.safetensors").exists()
    seen = re.findall(r"^  seen   tau \S+  (.*) -> ", result.stdout, re.M)
    assert len(seen) == 4 and len(set(seen)) == 4, seen  # a repeat would be drafted from the suffix cache
    return result


def test_train_tiny_writes_distinct_prompts(tmp_path):
    """The example's prompt file has no repeats: a repeated "seen" prompt would be drafted from the suffix cache of
    its first generation and inflate the τ the example prints."""
    script = (REPO / "examples" / "train_tiny.sh").read_text()
    writer = re.search(r"""python - "\$OUT/prompts.jsonl" <<'EOF'\n(.*?)\nEOF\n""", script, re.S).group(1)
    path = tmp_path / "prompts.jsonl"
    subprocess.run([sys.executable, "-", str(path)], input=writer, text=True, check=True, timeout=60)
    prompts = [json.loads(line)["prompt"] for line in path.read_text().splitlines()]
    assert len(prompts) == 40 and len(set(prompts)) == 40


@pytest.mark.integration  # the whole regen → features → train → export → generate pipeline, through the CLI
def test_train_tiny_runs_the_whole_pipeline(tmp_path):
    run_train_tiny(tmp_path / "out")


@pytest.mark.integration
def test_train_tiny_on_a_gemma3_style_base_model_whose_features_overflow_float16(tmp_path):
    """regen → features → train → export → lossless generate for a base model (no chat template) with a 262k
    vocabulary, sliding-window layers and hidden states beyond 65504: the features stay finite, training is not NaN,
    and the exported draft is lossless and gets tokens accepted."""
    from domino_hf.training.dataset import RegenDataset
    from domino_hf.training.features import FeatureStore

    out = tmp_path / "out"
    result = run_train_tiny(out, TINY_TARGET="--gemma3", DRAFT_ARGS="--draft-vocab-size 128",
                            EXPORT_ARGS="--dtype bfloat16")
    assert "has no chat template: prompts are plain text" in result.stderr  # the base-model fallback is said
    examples = RegenDataset.from_jsonl(out / "data.jsonl").examples  # as features and train read them
    store = FeatureStore(out / "features")
    features = torch.cat([store.get(i, len(e.prompt_ids) + len(e.response_ids)) for i, e in enumerate(examples)])
    assert features.abs().max() > 65504 and torch.isfinite(features).all()  # beyond fp16, stored finite (bf16)
    assert "nan" not in (out / "run_features" / "final" / "training_summary.json").read_text().lower()


def test_regen_shards_round_trip(tmp_path, monkeypatch):
    """`regen_shards.py export` writes only records no shard holds; `seed` restores them into an empty cache
    (a new machine), skipping ids the cache already has; a line cut short by a kill is skipped by export and cut
    off by seed before it appends."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("regen_shards", REPO / "examples" / "regen_shards.py")
    shards = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shards)
    monkeypatch.setattr(shards, "SHARDS", tmp_path / "repo" / "data" / "regen")
    monkeypatch.setattr(shards, "ROOT", tmp_path / "repo")
    monkeypatch.setenv("DOMINO_HF_CACHE", str(tmp_path / "cache"))
    cache = tmp_path / "cache" / "data" / shards.STREAMS["a"]
    cache.parent.mkdir(parents=True)
    rows = [json.dumps({"id": f"r{i}", "response_ids": [1, 2, i]}) + "\n" for i in range(5)]
    cache.write_text("".join(rows[:3]) + rows[3][:10])  # the job was killed mid-line
    shards.export("a", "20261202")
    cache.write_text("".join(rows))
    shards.export("a", "20261202")
    shards.export("a", "20261202")  # nothing new: no third shard
    written = sorted(p.name for p in shards.SHARDS.iterdir())
    assert written == ["a-20261202-0.jsonl.gz", "a-20261202-1.jsonl.gz"]
    assert shards.shard_lines("a") == rows
    cache.write_text(rows[1] + rows[2][:7])  # a new machine's cache: one answer, then a kill mid-line
    shards.seed("a")
    assert sorted(cache.read_text().splitlines(keepends=True)) == sorted(rows)
    questions = tmp_path / "cache" / "data" / shards.STREAMS["p"]  # self-written prompts: beside, not among, answers
    questions.write_text(json.dumps({"id": "self-0-0-0", "prompt": "w1", "turns": ["w1"]}) + "\n")
    shards.export("p", "20261203")
    assert [p.name for p in (shards.SHARDS / "prompts").iterdir()] == ["p-20261203-0.jsonl.gz"]
    assert sorted(p.name for p in shards.SHARDS.glob("*.jsonl.gz")) == written
