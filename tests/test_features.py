"""Context-feature cache: storage that cannot overflow, non-finite values refused at write and read time,
the draft config written beside the shards, and training that stops at the first non-finite loss."""

import json
import logging
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from domino_hf.training.dataset import RegenDataset
from domino_hf.training.features import (CONFIG, META, STORES, FeatureStore, NonFiniteFeatures, decode, encode,
                                         extract_features)
from domino_hf.training.recipe import TrainSettings, build_draft, train_draft
from domino_hf.training.trainer import NonFiniteTraining

sys.path.insert(0, str(Path(__file__).parent))
from _train_worker import tiny_target  # noqa: E402
from test_training import write_regen  # noqa: E402


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def _massive(length=7, layers=3, width=8, peak=3e5):
    """(L, n·H) features like Gemma 3's: one channel per layer far beyond float16's 65504, the rest O(1)."""
    torch.manual_seed(0)
    features = torch.randn(length, layers, width)
    features[:, :, 0] *= peak
    return features.view(length, -1)


@pytest.mark.parametrize("store", STORES)
def test_every_store_keeps_values_beyond_float16_range(store):
    features = _massive()
    assert features.abs().max() > 65504 and torch.isinf(features.half()).any()  # plain fp16 would overflow
    stored = encode(features, 3, store)
    restored = decode(stored, 3).float()
    assert torch.isfinite(restored).all()
    relative = (restored - features).norm() / features.norm()
    assert relative < {"bfloat16": 4e-3, "float16-scaled": 5e-4, "float32": 1e-7}[store]


def test_float16_scaled_is_exact_for_small_layers_and_scales_by_powers_of_two():
    features = torch.cat([torch.randn(5, 4), torch.randn(5, 4) * 1e5], dim=1)  # layer 0 small, layer 1 massive
    stored = encode(features, 2, "float16-scaled")
    assert stored["s"][0] == 1.0 and torch.log2(stored["s"][1]) == torch.log2(stored["s"][1]).round()
    assert torch.equal(decode(stored, 2)[:, :4], features[:, :4].half().float())


def _dataset(path, target):
    return RegenDataset.from_jsonl(write_regen(path, target, count=6))


def test_extraction_writes_no_non_finite_value_and_names_the_layer(target, tmp_path):
    dataset = _dataset(tmp_path / "data.jsonl", target)
    with torch.no_grad():
        target.model.layers[2].post_attention_layernorm.weight[3] = float("inf")  # hidden state of layer 2 -> inf
    try:
        with pytest.raises(NonFiniteFeatures, match=r"example 0 of .*target layer 2 hold inf/NaN .*--dtype float32"):
            extract_features(target, dataset, [0, 2], tmp_path / "features", shard_size=4)
    finally:
        with torch.no_grad():
            target.model.layers[2].post_attention_layernorm.weight[3] = 1.0
    assert not list((tmp_path / "features").glob("shard-*"))  # nothing half-written


def test_old_float16_shards_with_inf_fail_on_read(target, tmp_path):
    dataset = _dataset(tmp_path / "data.jsonl", target)
    folder = tmp_path / "features"
    folder.mkdir()
    meta = {"target_layer_ids": [0, 2], "num_examples": 6, "source": "x", "shard_size": 64, "dtype": "float16"}
    (folder / META).write_text(json.dumps(meta))
    lengths = [len(e.prompt_ids) + len(e.response_ids) for e in dataset.examples]
    save_file(
        {f"f{i}": torch.full((n, 64), 7e4).half() for i, n in enumerate(lengths)},
        str(folder / "shard-0000000.safetensors"),
    )
    with pytest.raises(NonFiniteFeatures, match="target layer 0 hold inf/NaN.*extract them again"):
        FeatureStore(folder).get(0, lengths[0])


def test_training_stops_at_a_non_finite_loss_naming_the_cause(target, tmp_path):
    dataset = _dataset(tmp_path / "data.jsonl", target)
    draft = build_draft(target, None, num_hidden_layers=1, block_size=4, gru_hidden_dim=16, correction_rank=8)
    settings = TrainSettings(
        output_dir=str(tmp_path / "run"), max_steps=3, batch_size=2, num_anchors=4, logging_steps=1,
    )
    with torch.no_grad():
        target.model.layers[1].mlp.down_proj.weight[0, 0] = float("nan")
    try:
        match = r"step 1: non-finite loss .*from the target's forward hold inf/NaN"
        with pytest.raises(NonFiniteTraining, match=match):
            train_draft(target, draft, dataset, settings)
    finally:
        with torch.no_grad():
            target.model.layers[1].mlp.down_proj.weight[0, 0] = 0.0


def test_training_stops_at_a_non_finite_gradient_norm_before_the_update(target, tmp_path):
    dataset = _dataset(tmp_path / "data.jsonl", target)
    draft = build_draft(target, None, num_hidden_layers=1, block_size=4, gru_hidden_dim=16, correction_rank=8)
    before = {k: v.clone() for k, v in draft.state_dict().items()}
    draft.fc.weight.register_hook(lambda grad: grad * float("inf"))  # finite loss, infinite gradient
    settings = TrainSettings(
        output_dir=str(tmp_path / "run"), max_steps=3, batch_size=2, num_anchors=4, logging_steps=1,
    )
    with pytest.raises(NonFiniteTraining, match=r"step 1: non-finite gradient norm .*lower --lr"):
        train_draft(target, draft, dataset, settings)
    assert all(torch.equal(before[k], v) for k, v in draft.state_dict().items())  # no NaN written into the draft


def test_features_without_config_write_the_derived_config_that_train_uses(target, tmp_path, monkeypatch, caplog):
    import domino_hf.targets
    from domino_hf.cli import main

    data = write_regen(tmp_path / "data.jsonl", target, count=6)
    monkeypatch.setattr(domino_hf.targets, "load_target", lambda *a, **k: (target, None))
    sizing = ["--target", "tiny", "--data", str(data), "--num-layers", "1", "--block-size", "4",
              "--draft-vocab-size", "8"]
    assert main(["features", *sizing, "--out", str(tmp_path / "f")]) == 0
    config = json.loads((tmp_path / "f" / CONFIG).read_text())
    assert config["block_size"] == 4 and len(config["draft_vocab_ids"]) == 8
    assert json.loads((tmp_path / "f" / META).read_text())["dtype"] == "bfloat16"
    caplog.clear()
    caplog.set_level(logging.INFO, logger="domino_hf")
    argv = ["train", "--target", "tiny", "--data", str(data), "--features", str(tmp_path / "f"), "--out",
            str(tmp_path / "run"), "--max-steps", "2", "--num-anchors", "4"]
    assert main(argv) == 0
    assert f"Draft config from {tmp_path / 'f' / CONFIG}" in caplog.text
    trained = json.loads((tmp_path / "run" / "final" / "config.json").read_text())
    assert {k: trained[k] for k in ("block_size", "draft_vocab_ids", "target_layer_ids")} == {
        k: config[k] for k in ("block_size", "draft_vocab_ids", "target_layer_ids")}


def test_resuming_with_another_store_names_the_stored_one(target, tmp_path):
    dataset = _dataset(tmp_path / "data.jsonl", target)
    extract_features(target, dataset, [0, 2], tmp_path / "f", store="float16-scaled")
    with pytest.raises(ValueError, match="stored as float16-scaled, not bfloat16: pass --store float16-scaled"):
        extract_features(target, dataset, [0, 2], tmp_path / "f")
    store = FeatureStore(tmp_path / "f")  # and the scaled shards read back close to fp32
    length = len(dataset.examples[0].prompt_ids) + len(dataset.examples[0].response_ids)
    with torch.no_grad():
        out = target.model(torch.tensor([dataset.examples[0].prompt_ids + dataset.examples[0].response_ids]),
                           output_hidden_states=[1, 3])
    reference = torch.cat([out.hidden_states[1], out.hidden_states[3]], dim=-1)[0]
    assert torch.allclose(store.get(0, length), reference, rtol=1e-3, atol=1e-3)


def test_processes_split_the_shards_into_the_folder_one_process_writes(target, tmp_path, monkeypatch, caplog):
    import domino_hf.targets
    from domino_hf.cli import main

    dataset = _dataset(tmp_path / "data.jsonl", target)
    extract_features(target, dataset, [0, 2], tmp_path / "one", shard_size=2, kl_topk=4)
    extract_features(target, dataset, [0, 2], tmp_path / "two", shard_size=2, kl_topk=4, process=(1, 2))
    second = sorted(p.name for p in (tmp_path / "two").glob("shard-*"))
    assert second == [f"shard-{s:07d}.safetensors" for s in range(2, len(dataset), 4)]  # only its own shards
    assert FeatureStore(tmp_path / "two").available() == 0  # shard 0 is the other process's
    caplog.set_level(logging.INFO, logger="domino_hf")
    extract_features(target, dataset, [0, 2], tmp_path / "two", shard_size=2, kl_topk=4, process=(0, 2))
    assert "process 0 of 2" in caplog.text and f"({len(dataset)} of {len(dataset)} examples on disk)" in caplog.text
    one, two = FeatureStore(tmp_path / "one"), FeatureStore(tmp_path / "two")
    assert two.available() == len(dataset) and one.meta == two.meta
    for i, example in enumerate(dataset.examples):
        length = len(example.prompt_ids) + len(example.response_ids)
        assert torch.equal(one.get(i, length), two.get(i, length))
        assert all(torch.equal(a, b) for a, b in zip(one.get_topk(i, len(example.prompt_ids), length, 4),
                                                     two.get_topk(i, len(example.prompt_ids), length, 4)))
    with pytest.raises(ValueError, match="process index 2 is not in 0 … 1"):
        extract_features(target, dataset, [0, 2], tmp_path / "two", process=(2, 2))
    monkeypatch.setenv("WORLD_SIZE", "3")  # as torchrun sets them: the CLI's defaults
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setattr(domino_hf.targets, "load_target", lambda *a, **k: pytest.fail("loaded the target"))
    assert main(["features", "--target", "tiny", "--data", str(tmp_path / "data.jsonl"), "--out",
                 str(tmp_path / "three")]) == 2


def test_a_folder_grows_with_data_added_at_its_end(target, tmp_path, caplog):
    """Training in rounds: new answers listed after the old files extend the folder; only the last old shard
    (which lacked examples) and the new ones are extracted, and the folder equals a fresh extraction."""
    first = write_regen(tmp_path / "first.jsonl", target, count=6)
    second = write_regen(tmp_path / "second.jsonl", target, count=5, seed=1)
    with open(second, "a") as handle:  # a prompt the first file answers already: dropped, as in training
        handle.write(open(first).readline())
    old = RegenDataset.from_jsonl([str(first)])
    extract_features(target, old, [0, 2], tmp_path / "grown", shard_size=4)
    untouched = (tmp_path / "grown" / "shard-0000000.safetensors").stat().st_mtime_ns
    both = RegenDataset.from_jsonl([str(first), str(second)])
    assert len(both) == 11
    caplog.set_level(logging.INFO, logger="domino_hf")
    extract_features(target, both, [0, 2], tmp_path / "grown", shard_size=4)
    assert "Extending" in caplog.text and "from 6 to 11 examples" in caplog.text
    assert (tmp_path / "grown" / "shard-0000000.safetensors").stat().st_mtime_ns == untouched
    extract_features(target, both, [0, 2], tmp_path / "fresh", shard_size=4)
    grown, fresh = FeatureStore(tmp_path / "grown"), FeatureStore(tmp_path / "fresh")
    assert grown.meta == fresh.meta and grown.available() == 11
    for i, example in enumerate(both.examples):
        length = len(example.prompt_ids) + len(example.response_ids)
        assert torch.equal(grown.get(i, length), fresh.get(i, length))
    for data in ([str(second), str(first)], [str(second)]):  # other files first: not a growth
        with pytest.raises(ValueError, match="other data.*list the folder's data files first"):
            extract_features(target, RegenDataset.from_jsonl(data), [0, 2], tmp_path / "grown", shard_size=4)
    caplog.clear()  # an earlier round's data (a prefix of the folder's): nothing to extract, and it trains
    for data in (old, RegenDataset.from_jsonl([str(first)], limit=3)):
        extract_features(target, data, [0, 2], tmp_path / "grown", shard_size=4)
        assert f"holds these {len(data)} examples and {11 - len(data)} more" in caplog.text
    assert FeatureStore(tmp_path / "grown").meta == fresh.meta
    (tmp_path / "grown" / "shard-0000004.safetensors").unlink()  # a growth still under way
    with pytest.raises(ValueError, match="still missing shards.*finish it with its full data list"):
        extract_features(target, old, [0, 2], tmp_path / "grown", shard_size=4)
