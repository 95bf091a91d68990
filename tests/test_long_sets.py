"""The long-prompt sets: read by short name, long enough, kept out of training, and rebuilt byte for byte by their
generator where its sources exist."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from domino_hf.benchmark_sets import PACKAGED_SETS, packaged_set_path
from domino_hf.data import read_prompts
from domino_hf.training.decontaminate import BenchmarkFilter

REPO = Path(__file__).resolve().parents[1]
LONG_SETS = ("long_qa", "long_sum", "long_chat")


@pytest.mark.parametrize("name", LONG_SETS)
def test_long_sets_read_by_name_and_are_long(name):
    assert name in PACKAGED_SETS
    prompts = read_prompts(name)
    assert len(prompts) >= 10 and prompts.skipped == 0
    ids = [record.id for record in prompts.records]
    assert len(set(ids)) == len(ids)
    for record in prompts.records:
        # 700-3,000 tokens of the SmolLM2 tokenizer (3.3-4.6 characters a token on these texts)
        assert 2_800 <= len(record.turns[0]) <= 14_000, (record.id, len(record.turns[0]))


def test_long_sets_are_kept_out_of_training():
    text = read_prompts("long_qa").records[0].turns[0]
    passage = " ".join(text.split()[40:80])
    assert BenchmarkFilter.for_benchmarks(LONG_SETS)(f"Please explain: {passage}")
    assert not BenchmarkFilter.for_benchmarks(LONG_SETS)("Please explain how a hash table works.")


def test_generator_rebuilds_the_committed_files(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("make_long_sets", REPO / "examples" / "make_long_sets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not (module.LICENSES / "GPL-3").is_file() or not (module.STDLIB / "idlelib" / "NEWS.txt").is_file():
        pytest.skip("the licence texts or IDLE's release notes are not on this machine")
    monkeypatch.setattr(sys, "argv", ["make_long_sets.py", "--out", str(tmp_path)])
    module.main()
    for name in LONG_SETS:
        assert (tmp_path / f"{name}.jsonl").read_bytes() == packaged_set_path(name).read_bytes(), name
