"""Training data: regenerated (prompt, response) token ids, anchor sampling, and the draft sub-vocabulary.

Input is the JSONL that `domino regen` writes (`prompt_ids`, `response_ids`; see `domino_hf.training.answers`).
Anchors are drawn inside the response only, from a generator seeded by (seed, example, epoch): the same run
always sees the same blocks, whatever the number of processes and however often it was resumed.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import Dataset, Sampler
from transformers.trainer_pt_utils import get_length_grouped_indices

from ..prompt_records import open_text
from ..modeling.target_domino import draft_vocab_map

logger = logging.getLogger(__name__)


@dataclass
class RegenExample:
    prompt_ids: list[int]
    response_ids: list[int]
    prompt: str = ""  # the prompt's text, when the record has it (decontamination reads it)
    earlier_prompts: tuple[str, ...] = ()  # a later turn's earlier user turns (decontamination reads them too)
    from_source: bool = False  # the response is the source's reply, not the target's (`source_answers.py`)


@dataclass
class RegenDataset(Dataset):
    """Token-id examples; malformed lines are skipped and counted in `skipped`, never used."""

    examples: list[RegenExample]
    skipped: int = 0
    epoch: int = 0
    source: str = ""
    max_length: int = 3072
    features: object = None  # an optional `FeatureStore` with the target's context features
    kl_topk: int = 0  # > 0: also read the target's top-k next tokens from `features` (for `--loss kl`)

    def use_features(self, store, kl_topk: int = 0) -> None:
        """Read context features from `store` instead of running the target, and with `kl_topk` > 0 the target's
        top-`kl_topk` next tokens too (a ValueError naming the fix when `store` lacks them); keeps the
        extracted prefix."""
        if kl_topk or any(e.from_source for e in self.examples):  # source answers read the target's top-1
            store.require_topk(max(kl_topk, 1))
        self.kl_topk = kl_topk
        available = store.available()
        if available < len(self.examples):
            logger.warning("Features exist for %d of %d examples: training on those", available, len(self.examples))
            self.examples = self.examples[:available]
        self.features = store

    @classmethod
    def from_jsonl(
        cls, paths, max_length: int = 3072, vocab_size: int | None = None, limit: int | None = None, exclude=None
    ):
        """Read regen JSONL file(s), plain or gzipped (`.gz`). `exclude(prompt_text) -> bool` drops records (e.g.
        a `BenchmarkFilter`) when it flags the prompt or any earlier user turn of a multi-turn record
        (`earlier_prompts`); `domino train` and `domino features` apply the same filter, so feature shards stay
        aligned. A record whose `prompt_ids` an earlier one already has is dropped and counted: files of one
        target often answer the same prompts (a rerun at another dtype or length cap), and a second answer to one
        context would only weigh it twice. The first file listed wins. A source-answer record
        (`response_from: source`) is never a duplicate of a target-answer one: the two give different contexts."""
        examples, skipped, excluded, duplicates, seen = [], 0, 0, 0, set()
        for path in [paths] if isinstance(paths, (str, Path)) else paths:
            with open_text(path) as handle:
                for line in handle:
                    if limit is not None and len(examples) >= limit:
                        break
                    example = _parse_line(line, vocab_size)
                    if example is None:
                        skipped += line.strip() != ""
                        continue
                    if exclude is not None and any(map(exclude, (example.prompt, *example.earlier_prompts))):
                        excluded += 1
                        continue
                    if (key := (example.from_source, *example.prompt_ids)) in seen:
                        duplicates += 1
                        continue
                    seen.add(key)
                    room = max_length - len(example.prompt_ids)
                    if room < 2:
                        skipped += 1
                        continue
                    example.response_ids = example.response_ids[:room]
                    examples.append(example)
        if skipped:
            logger.warning("Skipped %d malformed or unusable lines in %s", skipped, paths)
        if excluded:
            logger.warning("Dropped %d record(s) whose prompt overlaps a benchmark prompt", excluded)
        if duplicates:
            logger.info("Dropped %d record(s) answering a prompt an earlier record answers", duplicates)
        logger.info(
            "Loaded %d training examples (%d response tokens)", len(examples),
            sum(len(e.response_ids) for e in examples),
        )
        return cls(examples=examples, skipped=skipped, source=str(paths), max_length=max_length)

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> dict:
        example = self.examples[index]
        item = {"index": index, "epoch": self.epoch,
                "prompt_ids": example.prompt_ids, "response_ids": example.response_ids}
        length = len(example.prompt_ids) + len(example.response_ids)
        if self.features is not None:
            item["features"] = self.features.get(index, length)
        if self.kl_topk or (example.from_source and self.features is not None):  # one read serves both
            topk = self.features.get_topk(index, len(example.prompt_ids), length, max(self.kl_topk, 1))
            if self.kl_topk:
                item["target_topk"] = topk
            if example.from_source:  # its labels are the target's next tokens (`source_answers.py`)
                item["target_top1"] = topk[0][:, 0]
        if example.from_source:
            item["from_source"] = True
        return item

    def num_response_tokens(self) -> int:
        return sum(len(e.response_ids) for e in self.examples)

    def lengths(self) -> list[int]:
        """Tokens each example trains on (prompt + response, at most `max_length`), for length-grouped batches."""
        return [min(len(e.prompt_ids) + len(e.response_ids), self.max_length) for e in self.examples]


class LengthGroupedEpochSampler(Sampler):
    """transformers' length grouping (random mega-batches of 50 batches, each sorted by length, so that a batch
    pads to about its own examples' length), with the order drawn from (seed, epoch) alone: the same in every
    process and after a resume, like the anchors. Why: a random batch of SmolLM2's mixed ShareGPT and built-source
    training data pads to 2.0× its tokens (docs/experiments.md)."""

    def __init__(self, lengths: list[int], batch_size: int, seed: int = 0):
        self.lengths, self.batch_size, self.seed, self.epoch = lengths, batch_size, seed, 0

    def set_epoch(self, epoch: int) -> None:  # called by accelerate's data loader at each epoch
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return iter(get_length_grouped_indices(self.lengths, self.batch_size, generator=generator))


def _parse_line(line: str, vocab_size: int | None) -> RegenExample | None:
    try:
        record = json.loads(line)
        prompt, response = record["prompt_ids"], record["response_ids"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return None
    ids_ok = all(isinstance(t, int) and t >= 0 and (vocab_size is None or t < vocab_size) for t in [*prompt, *response])
    if not (isinstance(prompt, list) and isinstance(response, list) and prompt and len(response) >= 2 and ids_ok):
        return None
    text = record.get("prompt") if isinstance(record.get("prompt"), str) else ""
    earlier = record.get("earlier_prompts", [])
    if not (isinstance(earlier, list) and all(isinstance(t, str) for t in earlier)):
        return None  # a later turn whose history cannot be checked against the benchmarks is not used
    return RegenExample(prompt_ids=prompt, response_ids=response, prompt=text, earlier_prompts=tuple(earlier),
                        from_source=record.get("response_from") == "source")


def build_draft_vocab(dataset: RegenDataset, size: int, always: tuple[int, ...] = ()) -> tuple[list[int], float]:
    """The `size` most frequent response tokens (plus `always`, e.g. EOS), sorted; and their coverage of the
    data's response tokens (the best acceptance a sub-vocabulary allows at the first draft position)."""
    counts = Counter(t for e in dataset.examples for t in e.response_ids)
    chosen = {t for t in always}
    for token, _ in counts.most_common():
        if len(chosen) >= size:
            break
        chosen.add(token)
    total = sum(counts.values())
    coverage = sum(counts[t] for t in chosen) / max(total, 1)
    return sorted(chosen), coverage


class AnchorCollator:
    """Pads a batch (right padding) and draws up to `num_anchors` anchors per sequence inside the response.

    An anchor a needs a label x_{a+1}, so a ∈ [len(prompt), len - 2]. Labels of draft token j are x_{a+1+j}
    mapped to draft-vocabulary indices (-1 = outside the sub-vocabulary, -100 = past the end / no anchor).
    Cached features come as `context_hidden` (b, L, n·H); a cached target top-k as `target_topk_ids` (b, L, K)
    target ids and `target_topk_logp` (b, L, K) log-probs, -inf at positions that have none (prompt, padding).
    `from_source` (b,) marks source-answer records, whose labels the trainer replaces with the target's own next
    token (cached as `target_top1` (b, L), -1 where none); see `source_answers.py`.
    """

    def __init__(self, config, num_anchors: int, pad_token_id: int = 0, seed: int = 0):
        self.block_size = config.block_size
        self.num_draft = config.num_draft_tokens
        self.mask_token_id = config.mask_token_id
        self.num_anchors = num_anchors
        self.pad_token_id = pad_token_id
        self.seed = seed
        self.vocab_map = draft_vocab_map(config.draft_vocab_ids, config.vocab_size)

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        seqs = [f["prompt_ids"] + f["response_ids"] for f in features]
        seq_len = max(len(s) for s in seqs)
        b = len(seqs)
        input_ids = torch.full((b, seq_len), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros(b, seq_len, dtype=torch.long)
        anchors = torch.zeros(b, self.num_anchors, dtype=torch.long)
        labels = torch.full((b, self.num_anchors, self.num_draft), -100, dtype=torch.long)
        for row, (feature, seq) in enumerate(zip(features, seqs)):
            input_ids[row, : len(seq)] = torch.tensor(seq)
            attention_mask[row, : len(seq)] = 1
            start, stop = len(feature["prompt_ids"]), len(seq) - 1  # anchors in [start, stop)
            generator = torch.Generator().manual_seed(hash((self.seed, feature["index"], feature["epoch"])) % 2**62)
            chosen = start + torch.randperm(stop - start, generator=generator)[: self.num_anchors]
            chosen = chosen.sort().values
            anchors[row, : len(chosen)] = chosen
            seq_t = torch.tensor(seq)
            for k, anchor in enumerate(chosen.tolist()):
                targets = seq_t[anchor + 1 : anchor + 1 + self.num_draft]
                labels[row, k, : len(targets)] = targets if self.vocab_map is None else self.vocab_map[targets]
        batch = {"input_ids": input_ids, "attention_mask": attention_mask, "anchors": anchors, "labels": labels,
                 "from_source": torch.tensor([bool(f.get("from_source")) for f in features])}
        if any("target_top1" in f for f in features):
            batch["target_top1"] = torch.full((b, seq_len), -1, dtype=torch.long)
            for row, feature in enumerate(features):
                if "target_top1" in feature:
                    start = len(feature["prompt_ids"])
                    batch["target_top1"][row, start : start + feature["target_top1"].shape[0]] = feature["target_top1"]
        if "features" in features[0]:
            width = features[0]["features"].shape[-1]
            context = torch.zeros(b, seq_len, width, dtype=features[0]["features"].dtype)
            for row, feature in enumerate(features):
                context[row, : feature["features"].shape[0]] = feature["features"]
            batch["context_hidden"] = context
        if "target_topk" in features[0]:
            k = features[0]["target_topk"][0].shape[-1]
            batch["target_topk_ids"] = torch.zeros(b, seq_len, k, dtype=torch.long)
            batch["target_topk_logp"] = torch.full((b, seq_len, k), float("-inf"))
            for row, feature in enumerate(features):
                ids, logp = feature["target_topk"]  # (R, K): response positions len(prompt) … len-1
                start = len(feature["prompt_ids"])
                batch["target_topk_ids"][row, start : start + ids.shape[0]] = ids
                batch["target_topk_logp"][row, start : start + ids.shape[0]] = logp.float()
        return batch


def load_training_data(paths, max_length, vocab_size, limit=None, exclude=None) -> RegenDataset:
    """`RegenDataset.from_jsonl`, refusing data with no usable example (a one-line error, not a traceback)."""
    dataset = RegenDataset.from_jsonl(paths, max_length=max_length, vocab_size=vocab_size, limit=limit, exclude=exclude)
    if len(dataset) == 0:
        names = " ".join(map(str, paths if isinstance(paths, (list, tuple)) else [paths]))
        raise ValueError(
            f"--data {names}: no usable training example ({dataset.skipped} malformed line(s) skipped). "
            "Expected `domino regen` JSONL: one object per line with prompt_ids and response_ids."
        )
    return dataset
