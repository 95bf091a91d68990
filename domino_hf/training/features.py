"""Optional on-disk cache of the target's context features (hidden states of `target_layer_ids`).

On a CPU the frozen target's forward costs far more than the draft's training step, and every epoch would
pay it again. `domino features` runs the target once over the training data and stores, per example, the
concatenated hidden states (L, n_layers·H) in half precision, in shards written atomically (temp file +
rename): a killed extraction resumes at the first missing shard and loses at most one shard of work.
Training with `--features DIR` then needs no target forward at all.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from ..cli_common import HelpFormatter, add_target_arguments, target_kwargs
from .decontaminate import BenchmarkFilter
from .regen import DTYPES

logger = logging.getLogger(__name__)

META = "features.json"


@torch.no_grad()
def extract_features(target, dataset, layer_ids, out_dir, shard_size: int = 64, batch_size: int = 8, dtype=torch.float16):
    """Write the context features of every example of `dataset` under `out_dir` (resumable)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"target_layer_ids": list(layer_ids), "num_examples": len(dataset), "source": dataset.source,
            "shard_size": shard_size, "dtype": str(dtype).replace("torch.", "")}
    meta_path = out / META
    if meta_path.exists():
        previous = json.loads(meta_path.read_text())
        if previous != meta:
            raise ValueError(f"{out} holds features of other data or layers ({previous}); use a new folder.")
    else:
        meta_path.write_text(json.dumps(meta, indent=1))
    hidden_ids = [i + 1 for i in layer_ids]
    starts = [s for s in range(0, len(dataset), shard_size) if not (out / f"shard-{s:07d}.safetensors").exists()]
    tokens = sum(len(e.prompt_ids) + len(e.response_ids) for e in dataset.examples)
    bar = tqdm(total=tokens, unit="tok", desc="context features", dynamic_ncols=True)
    bar.update(sum(len(e.prompt_ids) + len(e.response_ids) for i, e in enumerate(dataset.examples)
                   if (i // shard_size) * shard_size not in starts))
    for start in starts:
        tensors = {}
        indices = list(range(start, min(start + shard_size, len(dataset))))
        indices.sort(key=lambda i: len(dataset.examples[i].prompt_ids) + len(dataset.examples[i].response_ids))
        for chunk in range(0, len(indices), batch_size):
            batch = indices[chunk : chunk + batch_size]
            seqs = [dataset.examples[i].prompt_ids + dataset.examples[i].response_ids for i in batch]
            length = max(len(s) for s in seqs)
            input_ids = torch.zeros(len(seqs), length, dtype=torch.long)
            mask = torch.zeros(len(seqs), length, dtype=torch.long)
            for row, seq in enumerate(seqs):
                input_ids[row, : len(seq)] = torch.tensor(seq)
                mask[row, : len(seq)] = 1
            outputs = target.base_model(input_ids=input_ids.to(target.device), attention_mask=mask.to(target.device),
                                        output_hidden_states=hidden_ids)
            features = torch.cat([outputs.hidden_states[i] for i in hidden_ids], dim=-1).to(dtype).cpu()
            for row, (index, seq) in enumerate(zip(batch, seqs)):
                tensors[f"f{index}"] = features[row, : len(seq)].contiguous()
                bar.update(len(seq))
        tmp = out / f".shard-{start:07d}.tmp"
        save_file(tensors, str(tmp))
        os.replace(tmp, out / f"shard-{start:07d}.safetensors")
    bar.close()
    logger.info("Context features of %d examples in %s", len(dataset), out)
    return out


class FeatureStore:
    """Read access to `extract_features` output: `store.get(i, length)` -> (L_i, n_layers·H) features of
    example i. Works on a partly extracted folder too (`available()` leading examples), so training can
    start while extraction goes on; every read checks the sequence length, so features of other data fail
    loudly instead of being used."""

    def __init__(self, directory, layer_ids=None):
        self.directory = Path(directory)
        self.meta = json.loads((self.directory / META).read_text())
        if layer_ids is not None and list(layer_ids) != self.meta["target_layer_ids"]:
            raise ValueError(
                f"features in {directory} are of target layers {self.meta['target_layer_ids']}, but the draft reads "
                f"{list(layer_ids)}: extract them again with the draft's config."
            )
        self._handles = {}

    def _shard(self, start: int) -> Path:
        return self.directory / f"shard-{start:07d}.safetensors"

    def available(self) -> int:
        """Number of leading examples whose features are on disk."""
        size, count = self.meta["shard_size"], 0
        while count < self.meta["num_examples"] and self._shard(count).exists():
            count += size
        return min(count, self.meta["num_examples"])

    def get(self, index: int, length: int) -> torch.Tensor:
        start = (index // self.meta["shard_size"]) * self.meta["shard_size"]
        if start not in self._handles:
            if not self._shard(start).exists():
                raise ValueError(f"no features for example {index} in {self.directory}: run `domino features` to finish.")
            self._handles[start] = safe_open(str(self._shard(start)), framework="pt")
        features = self._handles[start].get_tensor(f"f{index}")
        if features.shape[0] != length:
            raise ValueError(
                f"features of example {index} in {self.directory} cover {features.shape[0]} tokens, the data has "
                f"{length}: they were extracted from other data or another --max-length."
            )
        return features


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "features",
        help="Cache the target's context features of training data on disk (resumable).",
        description="Run the frozen target once over `domino regen` data and store the hidden states of the "
        "draft's target_layer_ids in half precision, so `domino train --features DIR` needs no target forward.",
        formatter_class=HelpFormatter,
    )
    add_target_arguments(parser)
    parser.add_argument("--data", "--train_file", dest="data", nargs="+", required=True, help="JSONL file(s) written by `domino regen`.")
    parser.add_argument("--config", "--config_name", dest="config", required=True, help="Draft config JSON whose target_layer_ids to store.")
    parser.add_argument("--out", "--output_dir", dest="out", required=True, help="Feature folder (shards + features.json).")
    parser.add_argument("--max-length", "--max_seq_length", dest="max_length", type=int, default=3072, help="Same truncation as `domino train`.")
    parser.add_argument("--limit", type=int, default=None, help="Only the first N examples (default: all).")
    parser.add_argument("--batch-size", "--per_device_batch_size", dest="batch_size", type=int, default=8, help="Sequences per target forward.")
    parser.add_argument("--shard-size", type=int, default=64, help="Examples per shard file.")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES),
                        help="Dtype of the target's forward (features are stored in float16 either way); bfloat16 "
                        "is several times faster on CPUs with native bf16.")
    parser.set_defaults(func=run)


def run(args) -> int:
    from ..targets import load_target
    from ..utils import require_paths
    from .dataset import load_training_data

    try:  # missing inputs fail before the (slower) target load
        require_paths(data=args.data, config=args.config)
        target, _ = load_target(args.target, dtype=DTYPES[args.dtype], **target_kwargs(args))
        vocab = target.config.get_text_config().vocab_size
        dataset = load_training_data(args.data, args.max_length, vocab, args.limit, exclude=BenchmarkFilter.for_benchmarks())
    except (OSError, ImportError, RuntimeError, ValueError) as err:  # missing/empty file, package, model; no Hub
        logger.error("%s", err)
        return 2
    with open(args.config, encoding="utf-8") as handle:
        layer_ids = json.load(handle)["target_layer_ids"]
    extract_features(target, dataset, layer_ids, args.out, shard_size=args.shard_size, batch_size=args.batch_size)
    return 0
