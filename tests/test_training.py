"""Training pipeline: objective, masks, schedule, resume, multi-process equivalence, export."""

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

from domino_hf.training.dataset import AnchorCollator, LengthGroupedEpochSampler, RegenDataset, build_draft_vocab
from domino_hf.training.export import export_draft
from domino_hf.training.objective import block_attention_mask, curriculum_lambda, position_weights
from domino_hf.training.checkpoint import last_complete_checkpoint
from domino_hf.training.grow import grow_draft_layers, grow_draft_vocab
from domino_hf.training.recipe import TrainSettings, build_draft, train_draft
from domino_hf.modeling import DominoDraftModel

sys.path.insert(0, str(Path(__file__).parent))
from _train_worker import tiny_target  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def write_regen(path, target, count=16, prompt_len=5, new_tokens=20, seed=0, equal=False):
    """The target's own greedy answers, as `domino regen` writes them (a learnable task for the draft)."""
    generator = torch.Generator().manual_seed(seed)
    with open(path, "w") as handle:
        for i in range(count):
            length = prompt_len if equal else prompt_len + i % 3
            prompt = torch.randint(0, 32, (1, length), generator=generator)
            out = target.generate(prompt, max_new_tokens=new_tokens, do_sample=False)
            row = {"id": str(i), "prompt_ids": prompt[0].tolist(), "response_ids": out[0, length:].tolist()}
            handle.write(json.dumps(row) + "\n")
    return path


def test_position_weights_and_lambda_are_exact():
    assert torch.allclose(position_weights(16), torch.exp(-torch.arange(16.0) / 7))
    assert torch.allclose(position_weights(8), torch.exp(-torch.arange(8.0) / 4))
    assert torch.allclose(position_weights(10), torch.exp(-torch.arange(10.0) / 5))
    assert curriculum_lambda(0, 101) == 1.0
    assert curriculum_lambda(50, 101) == pytest.approx(0.5)
    assert curriculum_lambda(100, 101) == 0.0


def test_block_mask_context_strictly_before_anchor_and_blocks_independent():
    anchors = torch.tensor([[3, 6]])
    mask = block_attention_mask(anchors, seq_len=9, block_size=2)[0, 0]  # (A·B, L + A·B)
    context, blocks = mask[:, :9], mask[:, 9:]
    assert context[0].tolist() == [True] * 3 + [False] * 6 and context[1].equal(context[0])
    assert context[2].tolist() == [True] * 6 + [False] * 3
    assert blocks.tolist() == [[True, True, False, False]] * 2 + [[False, False, True, True]] * 2


def test_anchors_never_fall_on_prompt_tokens_and_labels_follow(target, tmp_path):
    dataset = RegenDataset.from_jsonl(write_regen(tmp_path / "d.jsonl", target, count=4))
    draft = build_draft(target, None, num_hidden_layers=1, block_size=4)
    batch = AnchorCollator(draft.config, num_anchors=50)([dataset[i] for i in range(4)])
    for row in range(4):
        prompt_len = len(dataset.examples[row].prompt_ids)
        seq = dataset.examples[row].prompt_ids + dataset.examples[row].response_ids
        used = batch["labels"][row, :, 0] != -100
        anchors = batch["anchors"][row][used]
        assert anchors.min() >= prompt_len and anchors.max() <= len(seq) - 2
        assert len(set(anchors.tolist())) == len(anchors) == len(seq) - 1 - prompt_len
        for k, anchor in enumerate(anchors.tolist()):
            expected = seq[anchor + 1 : anchor + 5]
            assert batch["labels"][row, k, : len(expected)].tolist() == expected


def test_malformed_lines_are_skipped_and_counted(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt_ids": [1, 2], "response_ids": [3, 4, 5]}\nnot json\n{"prompt_ids": [1]}\n'
                    '{"prompt_ids": [1, 2], "response_ids": [3, -4]}\n\n{"prompt_ids": [7], "response_ids": [9, 99]}\n')
    dataset = RegenDataset.from_jsonl(path, vocab_size=32)
    assert len(dataset) == 1 and dataset.skipped == 4


def test_gzipped_shards_read_like_plain_ones(target, tmp_path):
    """Committed data shards are gzipped JSONL, read like plain files; and a prompt answered in two files (here
    the same records twice) is trained on once, from the first file listed."""
    import gzip

    plain = write_regen(tmp_path / "a.jsonl", target, count=5)
    packed = tmp_path / "b.jsonl.gz"
    packed.write_bytes(gzip.compress(Path(plain).read_bytes()))
    one = [(e.prompt_ids, e.response_ids) for e in RegenDataset.from_jsonl(plain).examples]
    assert [(e.prompt_ids, e.response_ids) for e in RegenDataset.from_jsonl(packed).examples] == one
    assert [(e.prompt_ids, e.response_ids) for e in RegenDataset.from_jsonl([plain, packed]).examples] == one


def test_a_prompt_answered_twice_is_kept_once(tmp_path, caplog):
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    first.write_text('{"prompt_ids": [1, 2], "response_ids": [3, 4]}\n{"prompt_ids": [1, 5], "response_ids": [6, 7]}\n')
    second.write_text('{"prompt_ids": [1, 2], "response_ids": [8, 9, 10]}\n'
                      '{"prompt_ids": [2, 1], "response_ids": [3, 4]}\n')
    with caplog.at_level("INFO"):
        dataset = RegenDataset.from_jsonl([first, second])
    assert [(e.prompt_ids, e.response_ids) for e in dataset.examples] == [([1, 2], [3, 4]), ([1, 5], [6, 7]),
                                                                           ([2, 1], [3, 4])]
    assert "Dropped 1 record(s) answering a prompt an earlier record answers" in caplog.text


def test_draft_vocab_keeps_eos_and_reports_coverage(target, tmp_path):
    dataset = RegenDataset.from_jsonl(write_regen(tmp_path / "d.jsonl", target, count=6))
    ids, coverage = build_draft_vocab(dataset, 4, always=(31,))
    assert ids == sorted(ids) and 31 in ids and len(ids) == 4 and 0 < coverage <= 1


@pytest.mark.parametrize("head", [True, False])
def test_loss_falls_and_draft_stays_lossless(target, tmp_path, head):
    dataset = RegenDataset.from_jsonl(write_regen(tmp_path / "d.jsonl", target, count=16))
    draft = build_draft(target, None, num_hidden_layers=1, block_size=4, gru_hidden_dim=16, correction_rank=8,
                        use_domino_head=head)
    settings = TrainSettings(output_dir=str(tmp_path / "run"), max_steps=60, batch_size=4, num_anchors=8,
                             learning_rate=3e-3, logging_steps=10, save_steps=1000)
    trainer = train_draft(target, draft, dataset, settings)
    logs = [h for h in trainer.state.log_history if "final_loss" in h]
    assert logs[-1]["final_loss"] < logs[0]["final_loss"] - 0.3
    assert logs[-1]["base_acc"] > logs[0]["base_acc"]
    assert logs[0]["lambda"] > 0.8 and logs[-1]["lambda"] < 0.2
    assert (tmp_path / "run" / "final" / "model.safetensors").exists()
    draft.eval()
    prompt = torch.tensor([[1, 5, 9, 2, 7]])
    expected = target.generate(prompt, max_new_tokens=20, do_sample=False)
    assert target.generate(prompt, max_new_tokens=20, do_sample=False, assistant_model=draft).equal(expected)
    assert draft.last_generation_stats.tau > 1.0


class StopAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_training_stop = True


@pytest.mark.parametrize("group_by_length,regularised", [(False, False), (True, False), (False, True)])
def test_resume_after_kill_ends_with_identical_weights(target, tmp_path, monkeypatch, group_by_length, regularised):
    """A killed run resumed from its last complete checkpoint ends where an unbroken one does; with the
    regularisers too (the feature noise comes from the RNG state that checkpoints carry)."""
    data = write_regen(tmp_path / "d.jsonl", target, count=12)
    regularisers = dict(weight_decay=0.1, feature_noise=0.2) if regularised else {}

    def run(out, stop_at=None, resume=False):
        dataset = RegenDataset.from_jsonl(data)
        draft = build_draft(target, None, num_hidden_layers=1, block_size=4, gru_hidden_dim=16, correction_rank=8)
        settings = TrainSettings(output_dir=str(out), max_steps=10, batch_size=4, num_anchors=8,
                                 learning_rate=3e-3, save_steps=4, logging_steps=5, resume=resume,
                                 group_by_length=group_by_length, **regularisers)
        if stop_at:  # simulate the kill: stop right after the step-4 checkpoint
            from domino_hf.training import recipe as train_module

            original = train_module.DominoTrainer

            class Killed(original):
                def __init__(self, *a, **k):
                    super().__init__(*a, **k)
                    self.add_callback(StopAt(stop_at))

            monkeypatch.setattr(train_module, "DominoTrainer", Killed)
        train_draft(target, draft, dataset, settings)
        monkeypatch.undo()
        return draft

    straight = run(tmp_path / "a")
    run(tmp_path / "b", stop_at=4)
    shutil.rmtree(tmp_path / "b" / "final")
    assert last_complete_checkpoint(tmp_path / "b").endswith("checkpoint-4")
    partial = tmp_path / "b" / "checkpoint-6"
    partial.mkdir()  # a checkpoint killed mid-write: no completion marker
    resumed = run(tmp_path / "b", resume=True)
    assert not partial.exists()
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        assert torch.allclose(a, b, atol=1e-6), name


@pytest.mark.integration  # torchrun starts two processes that each import torch and transformers
def test_two_processes_train_the_same_model_as_one(target, tmp_path):
    data = write_regen(tmp_path / "d.jsonl", target, count=8, equal=True)
    worker = str(REPO / "tests" / "_train_worker.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, worker, str(data), str(tmp_path / "one"), "4", "4"], check=True, env=env,
                   capture_output=True)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]  # a free port
    result = subprocess.run([*torchrun, worker, str(data), str(tmp_path / "two"), "2", "4"], env=env,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    one = load_file(tmp_path / "one" / "final" / "model.safetensors")
    two = load_file(tmp_path / "two" / "final" / "model.safetensors")
    sizes = dict(num_hidden_layers=1, block_size=4, gru_hidden_dim=16, correction_rank=8)
    initial = build_draft(tiny_target(), None, **sizes).state_dict()
    for name in one:
        assert not torch.equal(one[name], initial[name]) or "norm" in name, f"{name} did not train"
        assert torch.allclose(one[name], two[name], atol=1e-5), name


def test_export_loads_in_a_clean_process_and_generates_losslessly(target, tmp_path):
    dataset = RegenDataset.from_jsonl(write_regen(tmp_path / "d.jsonl", target, count=8))
    draft = build_draft(target, None, num_hidden_layers=1, block_size=4, gru_hidden_dim=16, correction_rank=8)
    train_draft(target, draft, dataset, TrainSettings(output_dir=str(tmp_path / "run"), max_steps=5, batch_size=4,
                                                      num_anchors=8, save_steps=1000))
    out = export_draft(tmp_path / "run", tmp_path / "export", dtype="float16")
    files = sorted(p.name for p in out.iterdir())
    assert files == ["README.md", "acceptance_domino.py", "batch_domino.py", "batch_policy_domino.py", "config.json",
                     "configuration_domino.py", "cost_domino.py", "dispatch_domino.py", "generation_config.json",
                     "generation_domino.py", "hybrid_domino.py", "model.safetensors", "modeling_domino.py",
                     "proposer_domino.py", "ragged_domino.py", "stops_domino.py", "suffix_domino.py",
                     "target_domino.py", "tree_domino.py"]
    card = (out / "README.md").read_text()
    assert "trust_remote_code=True" in card and "base_loss" not in card.split("## Training")[0]
    assert "AutoModel" in json.loads((out / "config.json").read_text())["auto_map"]
    target.save_pretrained(tmp_path / "target")
    script = f"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] == 'domino_hf': raise ImportError('domino_hf blocked')
sys.meta_path.insert(0, Block())
import torch
from transformers import AutoModel, AutoModelForCausalLM
target = AutoModelForCausalLM.from_pretrained({str(tmp_path / 'target')!r}).eval()
draft = AutoModel.from_pretrained({str(out)!r}, trust_remote_code=True, dtype=torch.float32).eval()
assert type(draft).__module__.startswith('transformers_modules'), type(draft).__module__
prompt = torch.tensor([[3, 1, 4, 1, 5]])
ref = target.generate(prompt, max_new_tokens=16, do_sample=False)
out = target.generate(prompt, max_new_tokens=16, do_sample=False, assistant_model=draft)
assert out.equal(ref) and draft.last_generation_stats.num_steps > 0
print('ok')
"""
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "PYTHONPATH": ""}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert result.stdout.strip().endswith("ok"), result.stderr[-3000:]


def test_export_refuses_a_published_dialect_sub_vocabulary_before_writing(target, tmp_path):
    draft = build_draft(target, None, num_hidden_layers=1, block_size=4, gru_hidden_dim=16, correction_rank=8,
                        draft_vocab_ids=list(range(8)))
    draft.save_pretrained(tmp_path / "draft")
    with pytest.raises(ValueError, match="SGLang drafts over the target's full vocabulary .* 8 tokens"):
        export_draft(tmp_path / "draft", tmp_path / "export", published_dialect=True)
    assert not (tmp_path / "export").exists()  # no half-exported folder left behind


def test_export_push_to_hub_uploads_the_folder(target, tmp_path, monkeypatch):
    """`--push-to-hub` goes through huggingface_hub (create the repo, upload the exported folder)."""
    import huggingface_hub

    calls = []

    class FakeApi:
        def create_repo(self, repo_id, private=False, exist_ok=False):
            calls.append(("create", repo_id, private, exist_ok))

        def upload_folder(self, folder_path, repo_id, commit_message):
            calls.append(("upload", repo_id, sorted(p.name for p in Path(folder_path).iterdir())))

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    build_draft(target, None, num_hidden_layers=1, block_size=4).save_pretrained(tmp_path / "draft")
    export_draft(tmp_path / "draft", tmp_path / "out", repo_id="user/tiny-domino", push=True, private=True)
    assert calls[0] == ("create", "user/tiny-domino", True, True)
    assert calls[1][0] == "upload" and "model.safetensors" in calls[1][2] and "README.md" in calls[1][2]
    assert "user/tiny-domino" in (tmp_path / "out" / "README.md").read_text()


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["train", "--data", "{missing}", "--out", "{tmp}/run"], "--data"),
        (["train", "--data", "{data}", "--config", "{missing}", "--out", "{tmp}/run"], "--config"),
        (["train", "--data", "{data}", "--features", "{missing}", "--out", "{tmp}/run"], "--features"),
        (["features", "--data", "{missing}", "--config", "{data}", "--out", "{tmp}/f"], "--data"),
    ],
)
def test_cli_missing_inputs_are_clean_errors(tmp_path, caplog, argv, flag):
    """A wrong path fails at once with the option's name (exit 2), before any target is loaded."""
    from domino_hf.cli import main

    data = tmp_path / "data.jsonl"
    data.write_text("{}\n")
    names = {"missing": str(tmp_path / "missing"), "tmp": str(tmp_path), "data": str(data)}
    argv = [a.format(**names) for a in argv]
    assert main(argv + ["--target", "no/such-target-is-loaded"]) == 2
    assert f"{flag} {tmp_path / 'missing'}: no such file or folder" in caplog.text


def test_features_cli_loads_the_target_in_the_requested_dtype_and_device(tmp_path, monkeypatch):
    import domino_hf.targets
    from domino_hf.cli import main

    seen = []

    def fake_load_target(name, dtype=torch.float32, device="cpu", **hub_options):
        seen.append((dtype, device))
        raise OSError("no target in this test")

    monkeypatch.setattr(domino_hf.targets, "load_target", fake_load_target)
    data = tmp_path / "data.jsonl"
    data.write_text("{}\n")
    argv = ["features", "--data", str(data), "--config", str(data), "--out", str(tmp_path / "f")]
    assert main(argv + ["--dtype", "bfloat16", "--device", "cpu"]) == 2 and main(argv) == 2
    assert seen == [(torch.bfloat16, "cpu"), (torch.float32, "cuda" if torch.cuda.is_available() else "cpu")]
    import domino_hf.dtypes

    for native, expected in ((True, torch.bfloat16), (False, torch.float32)):  # auto: bf16 only where it is fast
        monkeypatch.setattr(domino_hf.dtypes, "cpu_has_native_bf16", lambda native=native: native)
        assert main(argv + ["--dtype", "auto", "--device", "cpu"]) == 2
        assert seen[-1] == (expected, "cpu")


def test_training_sees_the_biased_lm_head_that_drafting_uses(target, tmp_path):
    """A target whose LM head has a bias: the objective's base logits come from `DominoTargetHead.logits`, the
    very function drafting uses, so the bias changes the training loss (it was silently dropped before)."""
    import copy

    from transformers import TrainingArguments

    from domino_hf import DominoTargetHead
    from domino_hf.training.dataset import AnchorCollator
    from domino_hf.training.objective import DominoObjective
    from domino_hf.training.trainer import DominoTrainer

    biased = copy.deepcopy(target)
    weight = biased.get_output_embeddings().weight.detach().clone()
    biased.lm_head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=True)
    with torch.no_grad():
        biased.lm_head.weight.copy_(weight)
        biased.lm_head.bias.copy_(torch.linspace(-4.0, 4.0, weight.shape[0]))
    dataset = RegenDataset.from_jsonl(write_regen(tmp_path / "d.jsonl", target, count=4))
    draft = build_draft(target, None, num_hidden_layers=1, block_size=4, gru_hidden_dim=16, correction_rank=8)
    batch = AnchorCollator(draft.config, num_anchors=4)([dataset[i] for i in range(4)])
    args = TrainingArguments(output_dir=str(tmp_path / "run"), report_to=[], use_cpu=True)
    losses, seen = [], []
    original = DominoTargetHead.logits
    for model in (target, biased):
        trainer = DominoTrainer(model=DominoObjective(draft), args=args, target=model, train_dataset=dataset)
        trainer.state.max_steps = 10
        head = trainer.target_head
        head.logits = lambda hidden, head=head: seen.append(head.bias is not None) or original(head, hidden)
        with torch.no_grad():
            losses.append(float(trainer.compute_loss(trainer.model, batch)))
    assert seen == [False, True]  # the objective's base logits went through the drafting head, bias and all
    assert abs(losses[0] - losses[1]) > 1e-3


def test_cli_bf16_trains_in_mixed_precision_on_the_cpu(target, tmp_path, monkeypatch, caplog):
    import domino_hf.dtypes
    import domino_hf.targets
    from domino_hf.cli import main

    data = write_regen(tmp_path / "d.jsonl", target, count=8)
    monkeypatch.setattr(domino_hf.targets, "load_target", lambda *a, **k: (target, None))
    monkeypatch.setattr(domino_hf.dtypes, "cpu_has_native_bf16", lambda: False)  # AVX2-only: warned, still done
    argv = ["train", "--target", "tiny", "--data", str(data), "--num-layers", "1", "--block-size", "4",
            "--num-anchors", "4", "--max-steps", "3", "--save-steps", "3", "--out", str(tmp_path / "run")]
    assert main([*argv, "--bf16"]) == 0
    assert "--bf16 on a CPU without native bf16" in caplog.text and "--no_bf16" in caplog.text
    args = torch.load(tmp_path / "run" / "checkpoint-3" / "training_args.bin", weights_only=False)
    assert args.bf16 and args.use_cpu  # autocast on the CPU; the weights stay fp32
    weights = load_file(tmp_path / "run" / "final" / "model.safetensors")
    assert all(t.dtype == torch.float32 and bool(torch.isfinite(t).all()) for t in weights.values())
    summary = json.loads((tmp_path / "run" / "final" / "training_summary.json").read_text())
    assert summary["settings"]["bf16"] is True
    assert main([*argv[:-1], str(tmp_path / "plain")]) == 0  # default on a CPU: off
    assert not torch.load(tmp_path / "plain" / "checkpoint-3" / "training_args.bin", weights_only=False).bf16


def test_length_grouped_batches_pad_less_in_an_order_fixed_by_seed_and_epoch():
    lengths = torch.randint(10, 1000, (800,), generator=torch.Generator().manual_seed(0)).tolist()
    sampler = LengthGroupedEpochSampler(lengths, batch_size=8, seed=3)

    def order(epoch):
        sampler.set_epoch(epoch)
        return list(sampler)

    first = order(0)
    assert sorted(first) == list(range(800)) and first == order(0) and first != order(1)
    assert first == list(LengthGroupedEpochSampler(lengths, batch_size=8, seed=3))  # a new process, epoch 0

    def padded(indices):
        return sum(8 * max(lengths[i] for i in indices[b : b + 8]) for b in range(0, len(indices), 8))

    assert padded(first) < 0.6 * padded(list(range(800)))  # random order pads ~1.8x here; grouped, ~1.05x


def test_a_continued_draft_grows_its_sub_vocabulary(target, tmp_path, monkeypatch, caplog):
    """`--init from:DIR --draft-vocab-size N` keeps the draft's tokens and adds the data's next most frequent:
    old correction rows carry over, new ones start at zero, and the grown draft stays lossless."""
    import domino_hf.targets
    from domino_hf.cli import main

    data = write_regen(tmp_path / "d.jsonl", target, count=8)
    monkeypatch.setattr(domino_hf.targets, "load_target", lambda *a, **k: (target, None))
    argv = ["train", "--target", "tiny", "--data", str(data), "--num-anchors", "4", "--max-steps", "2",
            "--save-steps", "100"]
    assert main([*argv, "--num-layers", "1", "--block-size", "4", "--draft-vocab-size", "12",
                 "--out", str(tmp_path / "small")]) == 0
    small = DominoDraftModel.from_pretrained(tmp_path / "small" / "final")
    dataset = RegenDataset.from_jsonl(data)
    grown = DominoDraftModel.from_pretrained(tmp_path / "small" / "final")
    coverage = grow_draft_vocab(grown, dataset, 20)
    old, new = small.config.draft_vocab_ids, grown.config.draft_vocab_ids
    assert len(new) == 20 and set(old) < set(new) and new == sorted(new)
    assert coverage == build_draft_vocab(dataset, 20, always=tuple(old))[1]
    w2_old, w2_new = small.embed_proj[2].weight, grown.embed_proj[2].weight
    for row, token in enumerate(new):
        expected = w2_old[old.index(token)] if token in old else torch.zeros_like(w2_old[0])
        assert torch.equal(w2_new[row], expected)
    grown.eval()
    prompt = torch.tensor([[1, 5, 9, 2, 7]])
    expected = target.generate(prompt, max_new_tokens=16, do_sample=False)
    assert target.generate(prompt, max_new_tokens=16, do_sample=False, assistant_model=grown).equal(expected)
    caplog.set_level(logging.INFO, logger="domino_hf")
    from_small = ["--init", f"from:{tmp_path / 'small' / 'final'}"]
    assert main([*argv, *from_small, "--draft-vocab-size", "20", "--out", str(tmp_path / "grown")]) == 0
    assert "grown to 20 tokens" in caplog.text
    assert DominoDraftModel.from_pretrained(tmp_path / "grown" / "final").config.draft_vocab_size == 20
    assert main([*argv, *from_small, "--draft-vocab-size", "8", "--out", str(tmp_path / "shrunk")]) == 2
    assert "can only grow" in caplog.text and not (tmp_path / "shrunk" / "final").exists()


def test_a_continued_draft_deepens_without_changing_its_output(target, tmp_path, monkeypatch, caplog):
    """`--init from:DIR --num-layers N` adds layers that start as identity: the deepened draft computes exactly
    what the shallow one did (so no training is lost), its new residual outputs then train, and it stays
    lossless; a shallower N is refused."""
    import domino_hf.targets
    from domino_hf.cli import main

    data = write_regen(tmp_path / "d.jsonl", target, count=8)
    monkeypatch.setattr(domino_hf.targets, "load_target", lambda *a, **k: (target, None))
    argv = ["train", "--target", "tiny", "--data", str(data), "--num-anchors", "4", "--max-steps", "3",
            "--save-steps", "100", "--lr", "1e-2"]
    assert main([*argv, "--num-layers", "1", "--block-size", "4", "--out", str(tmp_path / "shallow")]) == 0
    shallow = DominoDraftModel.from_pretrained(tmp_path / "shallow" / "final").eval()
    deep = DominoDraftModel.from_pretrained(tmp_path / "shallow" / "final").eval()
    assert grow_draft_layers(deep, 3) == 2 and len(deep.layers) == deep.config.num_hidden_layers == 3
    generator = torch.Generator().manual_seed(0)
    block = torch.randn(2, 4, deep.config.hidden_size, generator=generator)
    context = torch.randn(2, 6, len(deep.config.target_layer_ids) * deep.config.target_hidden_size,
                          generator=generator)
    inputs = dict(block_embeds=block, block_position_ids=torch.arange(6, 10).expand(2, 4),
                  target_hidden_states=context, context_position_ids=torch.arange(6).expand(2, 6))
    with torch.no_grad():
        assert torch.equal(deep(**inputs).last_hidden_state, shallow(**inputs).last_hidden_state)

    caplog.set_level(logging.INFO, logger="domino_hf")
    from_shallow = ["--init", f"from:{tmp_path / 'shallow' / 'final'}"]
    assert main([*argv, *from_shallow, "--num-layers", "2", "--out", str(tmp_path / "deep")]) == 0
    assert "deepened by 1 layer(s) to 2" in caplog.text
    trained = DominoDraftModel.from_pretrained(tmp_path / "deep" / "final").eval()
    assert trained.config.num_hidden_layers == 2 and trained.layers[1].self_attn.o_proj.weight.abs().sum() > 0
    prompt = torch.tensor([[1, 5, 9, 2, 7]])
    expected = target.generate(prompt, max_new_tokens=16, do_sample=False)
    assert target.generate(prompt, max_new_tokens=16, do_sample=False, assistant_model=trained).equal(expected)
    assert main([*argv, "--init", f"from:{tmp_path / 'deep' / 'final'}", "--num-layers", "1",
                 "--out", str(tmp_path / "shallower")]) == 2
    assert "can only grow" in caplog.text and not (tmp_path / "shallower" / "final").exists()


def test_layers_added_to_a_continued_draft_can_train_at_a_larger_rate(target, tmp_path, monkeypatch, caplog):
    """`--new-layer-lr-scale S` puts the deepened draft's new layers in optimizer groups of their own at S × the
    learning rate (the schedule scales all groups alike); everything else keeps the base rate. Misuse is refused."""
    import domino_hf.targets
    from domino_hf.cli import main
    from domino_hf.training import recipe

    data = write_regen(tmp_path / "d.jsonl", target, count=8)
    monkeypatch.setattr(domino_hf.targets, "load_target", lambda *a, **k: (target, None))
    argv = ["train", "--target", "tiny", "--data", str(data), "--num-anchors", "4", "--max-steps", "2",
            "--save-steps", "100", "--lr", "1e-3"]
    assert main([*argv, "--num-layers", "1", "--block-size", "4", "--out", str(tmp_path / "shallow")]) == 0
    trainers = []
    real_train_draft = recipe.train_draft
    monkeypatch.setattr(recipe, "train_draft", lambda *a, **k: trainers.append(real_train_draft(*a, **k)) or
                        trainers[-1])
    from_shallow = ["--init", f"from:{tmp_path / 'shallow' / 'final'}", "--num-layers", "2"]
    assert main([*argv, *from_shallow, "--new-layer-lr-scale", "10", "--out", str(tmp_path / "deep")]) == 0
    trainer = trainers[-1]
    new_layer = {id(p) for p in trainer.model.draft.layers[1].parameters()}
    groups = trainer.optimizer.param_groups
    scaled = [g for g in groups if any(id(p) in new_layer for p in g["params"])]
    rest = [g for g in groups if g not in scaled]
    assert scaled and rest and all(id(p) in new_layer for g in scaled for p in g["params"])
    assert sum(len(g["params"]) for g in scaled) == len(new_layer)
    assert {g["initial_lr"] for g in scaled} == {1e-2} and {g["initial_lr"] for g in rest} == {1e-3}
    caplog.set_level(logging.ERROR, logger="domino_hf")
    assert main([*argv, "--new-layer-lr-scale", "10", "--out", str(tmp_path / "fresh")]) == 2
    assert main([*argv, *from_shallow, "--new-layer-lr-scale", "0", "--out", str(tmp_path / "zero")]) == 2
    assert main([*argv, *from_shallow[:2], "--new-layer-lr-scale", "10", "--out", str(tmp_path / "same")]) == 2
    assert caplog.text.count("applies only to the layers --num_layers adds") == 3 and "adds none" in caplog.text
    assert not any((tmp_path / name).exists() for name in ("fresh", "zero", "same"))


def test_feature_noise_perturbs_training_only_and_bad_regularisers_are_refused(target, tmp_path, monkeypatch, caplog):
    """`--feature-noise σ` multiplies the context features by (1 + σ·N(0, 1)) in training steps only: same
    features, different loss while training, the exact loss in eval mode. Out-of-range values are refused."""
    import domino_hf.targets
    from domino_hf.cli import main
    from domino_hf.training.trainer import DominoTrainer

    dataset = RegenDataset.from_jsonl(write_regen(tmp_path / "d.jsonl", target, count=4))
    draft = build_draft(target, None, num_hidden_layers=1, block_size=4, gru_hidden_dim=16, correction_rank=8)
    settings = TrainSettings(output_dir=str(tmp_path / "run"), max_steps=0, num_anchors=8, feature_noise=0.3)
    trainer = train_draft(target, draft, dataset, settings)
    assert isinstance(trainer, DominoTrainer) and trainer.feature_noise == 0.3
    batch = trainer.data_collator([dataset[i] for i in range(4)])
    features = torch.full((4, 64, 96), 1000.0)
    noisy = trainer.noisy(features)
    assert noisy.shape == features.shape and 0.28 < (noisy / features - 1).std() < 0.32
    trainer.model.train()
    assert trainer.compute_loss(trainer.model, batch) != trainer.compute_loss(trainer.model, batch)
    trainer.model.eval()
    assert trainer.compute_loss(trainer.model, batch) == trainer.compute_loss(trainer.model, batch)
    trainer.feature_noise = 0.0
    assert trainer.compute_loss(trainer.model, batch) == trainer.compute_loss(trainer.model.train(), batch)

    with pytest.raises(ValueError, match="feature_noise"):
        TrainSettings(output_dir="x", feature_noise=1.5)
    data = write_regen(tmp_path / "d2.jsonl", target, count=4)
    monkeypatch.setattr(domino_hf.targets, "load_target", lambda *a, **k: (target, None))
    caplog.set_level(logging.ERROR, logger="domino_hf")
    argv = ["train", "--target", "tiny", "--data", str(data), "--max-steps", "1"]
    assert main([*argv, "--weight-decay", "-1", "--out", str(tmp_path / "wd")]) == 2
    assert main([*argv, "--feature-noise", "-0.1", "--out", str(tmp_path / "fn")]) == 2
    assert caplog.text.count("--weight_decay, --feature_noise") == 2
    assert not (tmp_path / "wd").exists() and not (tmp_path / "fn").exists()


def test_a_sub_vocabulary_smaller_than_asked_is_said(target, tmp_path, monkeypatch, caplog):
    """`--draft-vocab-size` above the data's distinct response tokens still trains, and says how many it got."""
    import domino_hf.targets
    from domino_hf.cli import main

    data = write_regen(tmp_path / "d.jsonl", target, count=4)
    monkeypatch.setattr(domino_hf.targets, "load_target", lambda *a, **k: (target, None))
    caplog.set_level(logging.INFO, logger="domino_hf")
    assert main(["train", "--target", "tiny", "--data", str(data), "--num-anchors", "4", "--max-steps", "1",
                 "--save-steps", "100", "--num-layers", "1", "--block-size", "4", "--draft-vocab-size", "1000",
                 "--out", str(tmp_path / "run")]) == 0
    size = DominoDraftModel.from_pretrained(tmp_path / "run" / "final").config.draft_vocab_size
    assert size < 1000
    assert f"--draft_vocab_size 1000: the draft's sub-vocabulary has only {size} tokens" in caplog.text
