"""No benchmark prompt reaches training: the filter, its use by the dataset, and the shipped draft's data."""

from __future__ import annotations

import json

import pytest

from domino_hf.data import read_prompts
from domino_hf.training.dataset import RegenDataset
from domino_hf.training.decontaminate import BenchmarkFilter


@pytest.fixture(scope="module")
def benchmark_filter():
    return BenchmarkFilter.for_benchmarks()


def test_filter_flags_exact_and_long_overlaps(benchmark_filter):
    mt_bench = read_prompts("mt_bench").records[0]
    humaneval = read_prompts("humaneval").records[3].turns[0]
    assert benchmark_filter(mt_bench.turns[0]) and benchmark_filter(mt_bench.turns[1])  # second turns too
    assert benchmark_filter("  " + mt_bench.turns[0].upper().replace(" ", "   ") + "!")  # normalised
    words = humaneval.split()
    assert benchmark_filter("Please help: " + " ".join(words[5:25]) + " thanks")  # a 13-word run inside
    assert not benchmark_filter("Write a haiku about the sea.")
    assert not benchmark_filter(" ".join(words[5:15]))  # 10 words in common is not enough


def test_dataset_drops_benchmark_prompts(tmp_path, benchmark_filter):
    alpaca = read_prompts("alpaca").records[0].turns[0]
    rows = [
        {"id": "a", "prompt": alpaca, "prompt_ids": [1, 2], "response_ids": [3, 4, 5]},
        {"id": "b", "prompt": "Tell me a joke about cats.", "prompt_ids": [1, 6], "response_ids": [3, 4, 5]},
    ]
    path = tmp_path / "regen.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert len(RegenDataset.from_jsonl(path)) == 2
    assert len(RegenDataset.from_jsonl(path, exclude=benchmark_filter)) == 1


def test_every_user_turn_of_a_multi_turn_record_is_checked(tiny_llama, tmp_path, benchmark_filter):
    """`regen --turns all` rows: a benchmark prompt as a later turn drops that turn and every turn after it (their
    prompts hold it); as a first turn, it drops the whole conversation."""
    from domino_hf.training.regen import regenerate

    model, tokenizer = tiny_llama
    mt_bench = read_prompts("mt_bench").records[0].turns[0]
    humaneval = read_prompts("humaneval").records[0].turns[0]
    conversations = {"clean": ["w1 w2", "w3", "w4"], "later": ["w5 w6", mt_bench, "w7"], "first": [humaneval, "w8"]}
    source = tmp_path / "sharegpt.jsonl"
    source.write_text("".join(json.dumps({"id": cid, "conversations": [{"from": "human", "value": u} for u in users]})
                              + "\n" for cid, users in conversations.items()))
    out = tmp_path / "regen.jsonl"
    regenerate(model, tokenizer, read_prompts(str(source)), out, max_new_tokens=3, max_prompt_tokens=400, turns="all")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 8  # every turn was answered
    kept = RegenDataset.from_jsonl(out, exclude=benchmark_filter).examples
    assert [(e.prompt, e.earlier_prompts) for e in kept] == [("w1 w2", ()), ("w5 w6", ()), ("w3", ("w1 w2",)),
                                                             ("w4", ("w1 w2", "w3"))]


def test_committed_regen_shards_have_no_benchmark_prompt(benchmark_filter):
    """The committed training data (data/regen/: the shipped draft's first data under base/, the data job's shards,
    and the self-written questions under prompts/): no prompt, nor any earlier user turn of a multi-turn record,
    overlaps a benchmark."""
    import gzip

    from domino_hf.utils import project_root

    shards = sorted((project_root() / "data" / "regen").rglob("*.jsonl.gz"))
    if not shards:
        pytest.skip("no committed shard")
    flagged = []
    for shard in shards:
        with gzip.open(shard, "rt", encoding="utf-8") as handle:
            flagged += [row["id"] for row in map(json.loads, handle)
                        if any(map(benchmark_filter, [row["prompt"], *row.get("earlier_prompts", [])]))]
    assert flagged == []
