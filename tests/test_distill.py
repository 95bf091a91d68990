"""`domino train --loss kl` (training/distill.py): the soft labels and the KL loss against hand computations,
`ce` unchanged to the bit, the target's top-k cached by `domino features --kl-topk` (round trip, older folders,
the errors that name the fix), and short fits that lower the loss."""

import json
import logging
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY_ARCHS, make_tiny_draft, make_tiny_target
from transformers import TrainingArguments

from domino_hf import DominoTargetHead
from domino_hf.modeling.target_domino import draft_label_positions, target_features
from domino_hf.training import distill
from domino_hf.training.dataset import AnchorCollator, RegenDataset
from domino_hf.training.distill import SoftLabels, block_soft_labels, next_token_topk
from domino_hf.training.features import META, FeatureStore, extract_features
from domino_hf.training.objective import DominoObjective, position_weights
from domino_hf.training.recipe import TrainSettings, build_draft, train_draft
from domino_hf.training.trainer import DominoTrainer

sys.path.insert(0, str(Path(__file__).parent))
from _train_worker import tiny_target  # noqa: E402
from test_training import write_regen  # noqa: E402

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def target():
    return tiny_target()


@pytest.fixture(scope="module")
def dataset(target, tmp_path_factory):
    return RegenDataset.from_jsonl(write_regen(tmp_path_factory.mktemp("data") / "d.jsonl", target, count=6))


# ------------------------------------------------------------------------------------------------ the loss
def test_kl_matches_a_hand_computation():
    """Top-3 of the target: ids 5, 2, 9 (log-probs -0.5, -1.5, -2.0); the draft vocabulary is ids [2, 5, 7], so
    9 is dropped and the other two are renormalised at T = 2; loss T²·KL(p ‖ softmax(draft logits / T))."""
    temperature, logp, draft_logits = 2.0, [-0.5, -1.5, -2.0], [0.3, -0.2, 1.0]
    a, b = math.exp(-0.5 / temperature), math.exp(-1.5 / temperature)
    p5, p2 = a / (a + b), b / (a + b)
    z = sum(math.exp(v / temperature) for v in draft_logits)
    q2, q5 = math.exp(0.3 / temperature) / z, math.exp(-0.2 / temperature) / z
    expected = temperature**2 * (p5 * math.log(p5 / q5) + p2 * math.log(p2 / q2))

    index = torch.tensor([[1, 0, -1], [1, 0, 2], [-1, -1, -1]])  # draft indices of ids 5, 2, 9 (row 2: 5, 2, 7)
    logps = torch.tensor([logp, [-0.5, -1.5, float("-inf")], logp])  # row 1: the third entry is padding
    soft = SoftLabels.make(index, logps, temperature)
    kl = soft.kl(torch.tensor([draft_logits] * 3), temperature)
    assert soft.present.tolist() == [True, True, False]  # row 2: none of its tokens is in the draft vocabulary
    assert kl[0].item() == pytest.approx(expected, rel=1e-6) and kl[1].item() == pytest.approx(expected, rel=1e-6)
    assert kl[2].item() == 0.0 and torch.isfinite(soft.p).all() and torch.isfinite(soft.log_p).all()
    assert soft.p[0].sum().item() == pytest.approx(1.0)


def _batch(target, draft, count=2, length=20, seed=0):
    """Two random sequences with anchors, the inputs of `DominoObjective`, and the label positions."""
    head = DominoTargetHead(target, draft.config)
    n = draft.config.num_draft_tokens
    seqs = torch.randint(0, target.config.vocab_size, (count, length), generator=torch.Generator().manual_seed(seed))
    anchors = torch.tensor([[3, 7, 10], [4, 9, 15]])[:count]
    positions = draft_label_positions(anchors, n)  # (b, A, n)
    with torch.no_grad():
        context, final_hidden = target_features(target, seqs, None, draft.config.target_layer_ids)
        block_embeds = head.block_embeds(seqs.gather(1, anchors)).flatten(1, 2)
        label_embeds = head.embed(seqs.gather(1, positions.flatten(1))).view(count, 3, n, -1)
    labels = head.to_draft_index(seqs.gather(1, (positions + 1).flatten(1)).view(count, 3, n))
    labels[1, 2, 2:] = -100  # past the end
    inputs = dict(context_hidden=context, block_embeds=block_embeds, label_embeds=label_embeds, anchors=anchors,
                  labels=labels, target_head=head)
    return inputs, seqs, positions, final_hidden


def _capture_base_logits(head):
    """Make `head.logits` remember what it returned (the objective's base logits)."""
    seen = []
    original = type(head).logits
    head.logits = lambda hidden: seen.append(original(head, hidden)) or seen[-1]
    return seen


def test_ce_loss_is_unchanged_to_the_bit():
    """The default loss is the position-weighted cross entropy written out by hand, bit for bit, with labels
    outside a sub-vocabulary (-1) and past the end (-100)."""
    target = make_tiny_target("llama")
    draft = make_tiny_draft(target, use_domino_head=False, draft_vocab_ids=[0, 2, 3, 5, 7, 11, 12, 13])
    inputs, *_ = _batch(target, draft)
    seen = _capture_base_logits(inputs["target_head"])
    out = DominoObjective(draft)(**inputs, curriculum=0.3)
    labels, logits = inputs["labels"], seen[0]
    assert (labels == -1).any() and (labels == -100).any()
    weight = position_weights(draft.config.num_draft_tokens)[None, None, :] * (labels >= 0)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.clamp_min(0).reshape(-1), reduction="none")
    reference = (ce.view_as(weight) * weight).sum() / weight.sum().clamp_min(1e-6)
    assert torch.equal(out["base_loss"], reference) and torch.equal(out["loss"], 0.7 * reference + 0.3 * reference)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_kl_loss_is_the_weighted_kl_to_the_targets_own_distribution(arch):
    """With K = the whole vocabulary the soft label is the target's full next-token distribution, from its own
    forward (`target(ids).logits`, soft-capping included for Gemma 3): the loss is the position-weighted KL."""
    target = make_tiny_target(arch)
    draft = make_tiny_draft(target, use_domino_head=False)
    inputs, seqs, positions, final_hidden = _batch(target, draft)
    topk = block_soft_labels(target, final_hidden, positions, k=target.config.vocab_size)
    seen = _capture_base_logits(inputs["target_head"])
    out = DominoObjective(draft, loss="kl")(**inputs, curriculum=0.0, target_topk=topk)
    with torch.no_grad():
        own = target(seqs).logits.log_softmax(-1)  # (b, L, V)
    b, num_anchors, n = positions.shape
    p_log = own.gather(1, positions.reshape(b, -1, 1).expand(-1, -1, own.shape[-1])).view(b, num_anchors, n, -1)
    kl = (p_log.exp() * (p_log - seen[0].log_softmax(-1))).sum(-1)  # (b, A, n)
    weight = position_weights(n)[None, None, :] * (inputs["labels"] != -100)
    torch.testing.assert_close(out["loss"], (kl * weight).sum() / weight.sum(), rtol=1e-5, atol=1e-6)


def test_kl_to_a_one_hot_target_is_the_cross_entropy():
    target = make_tiny_target("qwen3")
    draft = make_tiny_draft(target, draft_vocab_ids=[0, 2, 3, 5, 7, 11, 12, 13])
    inputs, seqs, positions, _ = _batch(target, draft)
    label_ids = seqs.gather(1, (positions + 1).flatten(1)).view_as(positions)[..., None]  # top-1 = the token
    one_hot = (label_ids, torch.zeros(label_ids.shape))
    ce = DominoObjective(draft)(**inputs, curriculum=0.5)
    kl = DominoObjective(draft, loss="kl")(**inputs, curriculum=0.5, target_topk=one_hot)
    for key in ("loss", "base_loss", "final_loss", "final_acc"):
        torch.testing.assert_close(kl[key], ce[key])


def test_kl_needs_the_targets_topk_and_a_known_loss():
    target = make_tiny_target("llama")
    draft = make_tiny_draft(target)
    inputs, *_ = _batch(target, draft)
    with pytest.raises(ValueError, match="needs the target's top-k"):
        DominoObjective(draft, loss="kl")(**inputs, curriculum=0.5)
    with pytest.raises(ValueError, match="unknown loss 'mse'"):
        DominoObjective(draft, loss="mse")


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_next_token_topk_is_the_targets_own_top_k(arch, monkeypatch):
    """`target_logits` over the final hidden states is the target's own forward (bias, soft-capping), in chunks."""
    monkeypatch.setattr(distill, "_CHUNK_LOGITS", 3 * 16)  # 3 rows per chunk
    target = make_tiny_target(arch)
    seqs = torch.randint(0, 16, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        own = target(seqs).logits.log_softmax(-1).topk(5, dim=-1)
        _, final_hidden = target_features(target, seqs, None, [0])
    ids, logp = next_token_topk(target, final_hidden.reshape(-1, final_hidden.shape[-1]), 5)
    assert torch.equal(ids, own.indices.reshape(-1, 5))
    torch.testing.assert_close(logp, own.values.reshape(-1, 5))


# ------------------------------------------------------------------------------------ cached by `domino features`
def test_features_with_and_without_topk_round_trip(target, dataset, tmp_path):
    layers = [0, 2]
    extract_features(target, dataset, layers, tmp_path / "with", shard_size=4, kl_topk=6)
    extract_features(target, dataset, layers, tmp_path / "without", shard_size=4)
    with_topk, without = FeatureStore(tmp_path / "with", layers), FeatureStore(tmp_path / "without", layers)
    assert (with_topk.kl_topk, without.kl_topk) == (6, 0)
    for index, example in enumerate(dataset.examples):
        prompt, length = len(example.prompt_ids), len(example.prompt_ids) + len(example.response_ids)
        assert torch.equal(with_topk.get(index, length), without.get(index, length))  # the features are the same
        ids, logp = with_topk.get_topk(index, prompt, length, 4)
        assert ids.dtype == torch.int32 and logp.dtype == torch.float16 and ids.shape == (length - prompt, 4)
        with torch.no_grad():
            _, final_hidden = target_features(target, torch.tensor([example.prompt_ids + example.response_ids]),
                                              None, layers)
        expected_ids, expected_logp = next_token_topk(target, final_hidden[0, prompt:], 4)  # response positions
        assert torch.equal(ids.long(), expected_ids)
        torch.testing.assert_close(logp.float(), expected_logp, rtol=1e-3, atol=1e-2)
    without.require_topk(0)  # `--loss ce` reads a folder without top-k as before
    with pytest.raises(ValueError, match=r"holds no target top-k .* `domino features … --kl_topk 4`"):
        RegenDataset(examples=list(dataset.examples)).use_features(without, kl_topk=4)
    with pytest.raises(ValueError, match=r"top-6 only.*pass --kl_topk 6 or lower"):
        with_topk.require_topk(8)


def test_an_older_folder_resumes_and_names_the_kl_topk_it_was_extracted_with(target, dataset, tmp_path):
    folder = tmp_path / "f"
    extract_features(target, dataset, [0, 2], folder, shard_size=4)
    meta = json.loads((folder / META).read_text())
    del meta["kl_topk"]  # written by domino-hf before --kl-topk
    (folder / META).write_text(json.dumps(meta))
    assert FeatureStore(folder).kl_topk == 0
    (folder / "shard-0000004.safetensors").unlink()
    extract_features(target, dataset, [0, 2], folder, shard_size=4)  # resumes: no error, the shard is back
    assert FeatureStore(folder).available() == len(dataset)
    with pytest.raises(ValueError, match="holds features with --kl_topk 0, not 4: pass --kl_topk 0 to resume"):
        extract_features(target, dataset, [0, 2], folder, shard_size=4, kl_topk=4)


def test_training_from_cached_topk_matches_the_target_on_the_fly(target, dataset, tmp_path):
    """Same batch, same draft: the KL loss from `domino features --kl-topk` (float32 features, float16 log-probs)
    equals the one from the target's forward in the step."""
    draft = build_draft(target, None, num_hidden_layers=1, block_size=4, gru_hidden_dim=16, correction_rank=8,
                        draft_vocab_ids=list(range(0, 32, 2)))
    extract_features(target, dataset, draft.config.target_layer_ids, tmp_path / "f", store="float32", kl_topk=8)
    cached = RegenDataset(examples=list(dataset.examples))
    cached.use_features(FeatureStore(tmp_path / "f"), kl_topk=8)
    args = TrainingArguments(output_dir=str(tmp_path / "run"), report_to=[], use_cpu=True)
    losses = []
    for data in (dataset, cached):
        batch = AnchorCollator(draft.config, num_anchors=6)([data[i] for i in range(4)])
        assert ("target_topk_ids" in batch) == (data is cached)
        trainer = DominoTrainer(model=DominoObjective(draft, loss="kl"), args=args, target=target, train_dataset=data,
                                kl_topk=8)
        trainer.state.max_steps = 10
        with torch.no_grad():
            losses.append(float(trainer.compute_loss(trainer.model, batch)))
    assert losses[0] == pytest.approx(losses[1], rel=2e-3)


def test_cli_kl_on_features_without_topk_fails_before_loading_the_target(target, dataset, tmp_path, caplog):
    from domino_hf.cli import main

    extract_features(target, dataset, [0, 2], tmp_path / "f")
    data = tmp_path / "data.jsonl"
    data.write_text("{}\n")
    argv = ["train", "--target", "no/such-target-is-loaded", "--data", str(data), "--out", str(tmp_path / "run")]
    assert main(argv + ["--features", str(tmp_path / "f"), "--loss", "kl"]) == 2
    assert f"--features {tmp_path / 'f'} holds no target top-k" in caplog.text
    assert "`domino features … --kl_topk 32`" in caplog.text
    assert main(argv + ["--loss", "kl", "--kl-topk", "0"]) == 2
    assert "--kl_topk must be >= 1" in caplog.text


def test_cli_features_with_topk_then_kl_training(target, tmp_path, monkeypatch, caplog):
    import domino_hf.targets
    from domino_hf.cli import main

    data = write_regen(tmp_path / "data.jsonl", target, count=8)
    monkeypatch.setattr(domino_hf.targets, "load_target", lambda *a, **k: (target, None))
    sizing = ["--target", "tiny", "--data", str(data), "--num-layers", "1", "--block-size", "4"]
    assert main(["features", *sizing, "--kl-topk", "8", "--out", str(tmp_path / "f")]) == 0
    assert json.loads((tmp_path / "f" / META).read_text())["kl_topk"] == 8
    caplog.set_level(logging.INFO)
    argv = ["train", "--target", "tiny", "--data", str(data), "--features", str(tmp_path / "f"), "--out",
            str(tmp_path / "run"), "--max-steps", "3", "--num-anchors", "4", "--loss", "kl", "--kl-topk", "8",
            "--kl-temperature", "2", "--logging-steps", "1"]
    assert main(argv) == 0
    summary = json.loads((tmp_path / "run" / "final" / "training_summary.json").read_text())
    assert {k: summary["settings"][k] for k in ("loss", "kl_topk", "kl_temperature")} == {
        "loss": "kl", "kl_topk": 8, "kl_temperature": 2.0}
    assert all(math.isfinite(h["final_loss"]) for h in summary["log_history"] if "final_loss" in h)


@pytest.mark.parametrize("arch, sub_vocab", [("llama", None), ("gemma3", list(range(24)))])
def test_a_short_kl_fit_lowers_the_loss(arch, sub_vocab, tmp_path):
    """On the fly (the target's forward in each step), full vocabulary or a sub-vocabulary (renormalised soft
    labels, Gemma 3's soft-capped logits)."""
    target = make_tiny_target(arch, vocab_size=32, num_hidden_layers=2)
    data = RegenDataset.from_jsonl(write_regen(tmp_path / "d.jsonl", target, count=16))
    draft = build_draft(target, None, num_hidden_layers=1, block_size=4, gru_hidden_dim=16, correction_rank=8,
                        draft_vocab_ids=sub_vocab)
    settings = TrainSettings(output_dir=str(tmp_path / "run"), max_steps=30, batch_size=4, num_anchors=8,
                             learning_rate=3e-3, logging_steps=10, save_steps=1000, loss="kl", kl_topk=8)
    logs = [h for h in train_draft(target, draft, data, settings).state.log_history if "final_loss" in h]
    assert logs[-1]["final_loss"] < logs[0]["final_loss"] - 0.3 and logs[-1]["base_loss"] < logs[0]["base_loss"]
