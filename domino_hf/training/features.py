"""Optional on-disk cache of the target's context features (hidden states of `target_layer_ids`).

On a CPU the frozen target's forward costs far more than the draft's training step, and every epoch would
pay it again. `domino features` runs the target once over the training data and stores, per example, the
concatenated hidden states (L, n_layers·H) in 16 bits, in shards written atomically (temp file + rename): a
killed extraction resumes at the first missing shard and loses at most one shard of work. Training with
`--features DIR` then needs no target forward at all. The draft config the features were extracted for is
written beside the shards (`draft_config.json`), and `domino train --features DIR` uses it.

Storage (`--store`, measured in docs/experiments.md): hidden states of some targets (Gemma 3) reach 1e5, beyond
fp16's 65504, so plain fp16 is no default. `bfloat16` (default) has fp32's range; `float16-scaled` keeps fp16's
three extra mantissa bits and stores a power-of-two scale per layer and example so nothing overflows;
`float32` is exact at twice the disk. Non-finite values are never written: extraction fails naming the
example and the layer.

Soft labels for `domino train --loss kl` (`--kl_topk K`, off by default): the target's K most probable next
tokens at every response position (prompt length … L-1, every position a label can be predicted from), as
int32 ids (`k`) and float16 log-probs over its whole vocabulary (`p`): 6·K bytes a response token (192 B for
K = 32, against 2·n_layers·H for the context features: 3,456 B for SmolLM2's three layers of 576). They cost
the target's LM head over those positions at extraction, and they fit any sub-vocabulary chosen later
(`distill.py` renormalises). Folders extracted without them still serve `--loss ce`.
"""

from __future__ import annotations

import ast
import json
import logging
import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from ..modeling.target_domino import target_features
from .choices import CONFIG, META, STORES
from .distill import next_token_topk

logger = logging.getLogger(__name__)

# features.json fields that a resumed extraction must repeat: how each is described, and its option
_RESUMED_OPTIONS = {"dtype": ("stored as {}", "--store"), "kl_topk": ("with --kl_topk {}", "--kl_topk")}
_FP16_TOP = 2.0**14  # float16-scaled: each layer's largest |value| is scaled into [2^13, 2^14], far below 65504


class NonFiniteFeatures(ValueError):
    """Context features holding inf/NaN: never written, never trained on."""


def encode(features: torch.Tensor, num_layers: int, store: str) -> dict[str, torch.Tensor]:
    """(L, n·H) fp32 features -> the tensors stored for one example (`f`, and `s` = per-layer scales)."""
    if store == "bfloat16":
        return {"f": features.to(torch.bfloat16)}
    if store == "float32":
        return {"f": features.float()}
    length = features.shape[0]
    layers = features.float().view(length, num_layers, -1)  # (L, n, H)
    amax = layers.abs().amax(dim=(0, 2)).clamp_min(1e-30)  # (n,)
    scale = torch.exp2(torch.ceil(torch.log2(amax / _FP16_TOP))).clamp_min(1.0)  # powers of two: exact rescale
    return {"f": (layers / scale[None, :, None]).to(torch.float16).view(length, -1), "s": scale}


def decode(stored: dict[str, torch.Tensor], num_layers: int) -> torch.Tensor:
    """Inverse of `encode`: (L, n·H) features (fp32 when scaled, else as stored)."""
    features = stored["f"]
    if "s" not in stored:
        return features
    length = features.shape[0]
    return (features.float().view(length, num_layers, -1) * stored["s"][None, :, None]).view(length, -1)


def check_finite(features: torch.Tensor, layer_ids, where: str, fix: str) -> None:
    """Raise `NonFiniteFeatures` naming the first layer of (…, n·H) `features` that holds inf/NaN, and `fix`."""
    finite = torch.isfinite(features.float().reshape(-1, len(layer_ids), features.shape[-1] // len(layer_ids)))
    if not bool(finite.all()):
        bad = [layer for layer, ok in zip(layer_ids, finite.all(dim=2).all(dim=0).tolist()) if not ok]
        raise NonFiniteFeatures(
            f"{where}: the context features of target layer {bad[0]} hold inf/NaN ({int((~finite).sum())} values; "
            f"layers {bad}): {fix}"
        )


def encode_topk(target, final_hidden: torch.Tensor, k: int, where: str) -> dict[str, torch.Tensor]:
    """(R, H) final hidden states of one example's response positions -> the stored top-K (`k`: (R, K) int32
    ids, `p`: (R, K) float16 log-probs). Raises `NonFiniteFeatures` rather than store a non-finite log-prob."""
    ids, logp = next_token_topk(target, final_hidden, k)
    if not bool(torch.isfinite(logp.half()).all()):
        raise NonFiniteFeatures(f"{where}: the target's next-token log-probs hold inf/NaN: the target overflows in "
                                "this --dtype; extract with --dtype float32.")
    return {"k": ids.to(torch.int32).cpu(), "p": logp.half().cpu()}


@torch.no_grad()
def extract_features(target, dataset, layer_ids, out_dir, shard_size: int = 64, batch_size: int = 8,
                     store: str = "bfloat16", draft_config=None, kl_topk: int = 0, process: tuple[int, int] = (0, 1)):
    """Write the context features of every example of `dataset` under `out_dir` (resumable), stored as `store`
    (one of `STORES`), with the target's top-`kl_topk` next tokens per response position when > 0, and
    `draft_config` (a `DominoConfig`, optional) beside them. Raises `NonFiniteFeatures` before writing a shard
    that would hold inf/NaN.

    `process` = (rank, count) splits the work between `count` processes writing the same folder (several
    cores or GPUs): this one extracts shards `rank`, `rank + count`, …; each shard is written whole by one
    process, so the folder is the same as a single process's, and any split resumes any other."""
    if store not in STORES:
        raise ValueError(f"unknown feature storage {store!r}: choose one of {', '.join(STORES)}")
    if kl_topk < 0:
        raise ValueError(f"--kl_topk must be >= 0 (got {kl_topk})")
    rank, count = process
    check_process(rank, count)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"target_layer_ids": list(layer_ids), "num_examples": len(dataset), "source": dataset.source,
            "shard_size": shard_size, "dtype": store, "kl_topk": kl_topk}
    meta_path = out / META
    previous = None
    if meta_path.exists():
        previous = {"kl_topk": 0, **json.loads(meta_path.read_text())}  # folders from before --kl_topk have none
        for key, (wording, option) in _RESUMED_OPTIONS.items():
            if {**previous, key: meta[key]} == meta and previous.get(key) != meta[key]:
                raise ValueError(f"{out} holds features {wording.format(previous.get(key))}, not {meta[key]}: pass "
                                 f"{option} {previous.get(key)} to resume, or use a new folder.")
        if _grows(meta, previous):  # a folder grown past this data (a later training stage's) holds all of it
            shards = [out / f"shard-{s:07d}.safetensors" for s in range(0, len(dataset), shard_size)]
            if not all(shard.exists() for shard in shards):
                raise ValueError(f"{out} was grown to {previous['num_examples']} examples and is still missing shards "
                                 f"of these {len(dataset)}: finish it with its full data list ({previous['source']}).")
            logger.info("%s holds these %d examples and %d more (it was grown): nothing to extract", out,
                        len(dataset), previous["num_examples"] - len(dataset))
            return out
        if previous != meta:
            if not _grows(previous, meta):
                raise ValueError(f"{out} holds features of other data or layers ({previous}); use a new folder, or "
                                 "list the folder's data files first and new ones after them to extend it.")
            if previous["num_examples"] % shard_size:  # the data grew at its end: the last shard lacks examples
                last = previous["num_examples"] // shard_size * shard_size
                (out / f"shard-{last:07d}.safetensors").unlink(missing_ok=True)
            logger.info("Extending %s from %d to %d examples", out, previous["num_examples"], meta["num_examples"])
    if previous != meta:  # a new or grown folder; processes may start together
        _write_atomically(meta_path, json.dumps(meta, indent=1), f".{rank}")
    if draft_config is not None:
        _write_atomically(out / CONFIG, draft_config.to_json_string(), f".{rank}")
    tokens = {s: sum(len(e.prompt_ids) + len(e.response_ids) for e in dataset.examples[s : s + shard_size])
              for s in range(rank * shard_size, len(dataset), count * shard_size)}  # this process's shards
    starts = [s for s in tokens if not (out / f"shard-{s:07d}.safetensors").exists()]
    bar = tqdm(total=sum(tokens.values()), unit="tok", desc="context features", dynamic_ncols=True, position=rank)
    bar.update(sum(tokens.values()) - sum(tokens[s] for s in starts))
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
            features, final_hidden = target_features(target, input_ids.to(target.device), mask.to(target.device),
                                                     layer_ids)  # (b, L, n·H), (b, L, H)
            features = features.float().cpu()
            for row, (index, seq) in enumerate(zip(batch, seqs)):
                where = f"example {index} of {dataset.source}"
                check_finite(features[row, : len(seq)], layer_ids, where,
                             "the target overflows in this --dtype; extract with --dtype float32.")
                stored = encode(features[row, : len(seq)], len(layer_ids), store)
                if kl_topk:
                    response = final_hidden[row, len(dataset.examples[index].prompt_ids) : len(seq)]  # (R, H)
                    stored.update(encode_topk(target, response, kl_topk, where))
                for key, tensor in stored.items():
                    tensors[f"{key}{index}"] = tensor.contiguous().cpu()
                bar.update(len(seq))
        tmp = out / f".shard-{start:07d}.tmp"
        save_file(tensors, str(tmp))
        os.replace(tmp, out / f"shard-{start:07d}.safetensors")
    bar.close()
    if count == 1:
        logger.info("Context features of %d examples in %s", len(dataset), out)
    else:
        logger.info("Context features of process %d of %d in %s (%d of %d examples on disk)", rank, count, out,
                    FeatureStore(out).available(), len(dataset))
    return out


def _sources(source: str) -> list[str]:
    """The data files of a `RegenDataset.source` (`str` of a path or of a list of paths)."""
    try:
        parsed = ast.literal_eval(source)
    except (ValueError, SyntaxError):
        return [source]
    return [str(p) for p in parsed] if isinstance(parsed, (list, tuple)) else [source]


def _grows(previous: dict, meta: dict) -> bool:
    """True when `meta`'s data is `previous`'s with records added at its end: the same files first (new files
    after them, or the last file grown), the same layers and storage, more examples. Training in rounds
    extends one folder instead of extracting every earlier record again. Earlier examples keep their indices
    because `RegenDataset.from_jsonl` keeps the first record per prompt, file by file; each read still checks
    the example's length."""
    same = {k: v for k, v in previous.items() if k not in ("num_examples", "source")} == {
        k: v for k, v in meta.items() if k not in ("num_examples", "source")}
    old, new = _sources(previous["source"]), _sources(meta["source"])
    return same and meta["num_examples"] > previous["num_examples"] and new[: len(old)] == old


def check_process(rank: int, count: int) -> None:
    """Raise a ValueError unless `rank` is a process index of `count` processes."""
    if not 0 <= rank < count:
        raise ValueError(f"process index {rank} is not in 0 … {count - 1} (--process_index, --num_processes)")


def _write_atomically(path: Path, text: str, suffix: str) -> None:
    tmp = path.with_name(f".{path.name}{suffix}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


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
        self._handles = {}  # shard start -> (safe_open handle, its tensor names)

    def _shard(self, start: int) -> Path:
        return self.directory / f"shard-{start:07d}.safetensors"

    def available(self) -> int:
        """Number of leading examples whose features are on disk."""
        size, count = self.meta["shard_size"], 0
        while count < self.meta["num_examples"] and self._shard(count).exists():
            count += size
        return min(count, self.meta["num_examples"])

    @property
    def kl_topk(self) -> int:
        """K of the target's top-K next tokens stored per response position; 0 when none (older folders too)."""
        return self.meta.get("kl_topk", 0)

    def require_topk(self, k: int) -> None:
        """Raise a ValueError naming the fix unless the folder holds the target's top-`k` (for `--loss kl`)."""
        if self.kl_topk >= k:
            return
        if self.kl_topk:
            held, lower = f"the target's top-{self.kl_topk} only", f"pass --kl_topk {self.kl_topk} or lower, "
        else:
            held, lower = "no target top-k (extracted without --kl_topk)", ""
        raise ValueError(
            f"--features {self.directory} holds {held}, and --loss kl --kl_topk {k} needs the target's top-{k}: "
            f"{lower}extract the features again into a new folder with `domino features … --kl_topk {k}`, or train "
            "without --features (the target then runs in every step)."
        )

    def _tensors(self, index: int, keys) -> dict[str, torch.Tensor]:
        """The stored tensors `keys` of example `index` (those present), from its shard (opened once)."""
        start = (index // self.meta["shard_size"]) * self.meta["shard_size"]
        if start not in self._handles:
            if not self._shard(start).exists():
                raise ValueError(
                    f"no features for example {index} in {self.directory}: run `domino features` to finish."
                )
            handle = safe_open(str(self._shard(start)), framework="pt")
            self._handles[start] = handle, set(handle.keys())
        handle, names = self._handles[start]
        return {key: handle.get_tensor(f"{key}{index}") for key in keys if f"{key}{index}" in names}

    def get_topk(self, index: int, prompt_length: int, length: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(R, k) int32 target ids and (R, k) float16 log-probs of the target's k most probable next tokens at
        example `index`'s response positions prompt_length … length-1 (R = length - prompt_length)."""
        self.require_topk(k)
        stored = self._tensors(index, ("k", "p"))
        if stored["k"].shape[0] != length - prompt_length:
            raise ValueError(
                f"the target top-k of example {index} in {self.directory} cover {stored['k'].shape[0]} response "
                f"tokens, the data has {length - prompt_length}: they were extracted from other data."
            )
        return stored["k"][:, :k], stored["p"][:, :k]

    def get(self, index: int, length: int) -> torch.Tensor:
        features = decode(self._tensors(index, ("f", "s")), len(self.meta["target_layer_ids"]))
        check_finite(features, self.meta["target_layer_ids"], f"example {index} in {self.directory}",
                     "plain float16 features (older domino-hf) overflowed; extract them again (bfloat16 by default).")
        if features.shape[0] != length:
            raise ValueError(
                f"features of example {index} in {self.directory} cover {features.shape[0]} tokens, the data has "
                f"{length}: they were extracted from other data or another --max_length."
            )
        return features
