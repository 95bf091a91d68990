"""lm-evaluation-harness with a Domino draft: `--model domino` gives exactly `--model hf`'s samples and scores, at
batch size 1 and in batches, on a local generate-until task and a loglikelihood task (the example tasks in
examples/lm_eval), reports τ, and runs through `domino lm-eval`. Tiny random targets of two architectures; no
download."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_tiny_draft, make_tiny_target, make_tiny_tokenizer

lm_eval = pytest.importorskip("lm_eval")

from domino_hf.eval import DominoLM  # noqa: E402  (registers `--model domino`)

# Runs through lm-evaluation-harness's whole evaluation pipeline (or, below, a second interpreter): the integration
# tier.
pytestmark = [pytest.mark.usefixtures("single_thread"), pytest.mark.integration]

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "lm_eval"
TASKS = ["domino_alpaca", "domino_alpaca_loglikelihood"]


def local_tasks(folder: Path) -> Path:
    """The example task files with the data file's absolute path (they name it relative to the repository)."""
    from domino_hf.data import packaged_set_path

    folder.mkdir(parents=True, exist_ok=True)
    for yaml in EXAMPLES.glob("*.yaml"):
        text = yaml.read_text().replace("domino_hf/prompt_sets/alpaca.jsonl", str(packaged_set_path("alpaca")))
        (folder / yaml.name).write_text(text)
    return folder


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def setup(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    tokenizer = make_tiny_tokenizer(chat_template=None)
    target = make_tiny_target(request.param, vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                              eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    target.save_pretrained(root / "target")
    tokenizer.save_pretrained(root / "target")
    make_tiny_draft(target).save_pretrained(root / "draft")
    return root, local_tasks(root / "tasks")


def evaluate(root, tasks, model, limit=6, **model_args):
    from lm_eval.tasks import TaskManager

    args = {"pretrained": str(root / "target"), "device": "cpu", "dtype": "float32", **model_args}
    # Only the example tasks are indexed: lm-eval's own thousands of task files take most of a minute to index.
    manager = TaskManager(include_path=str(tasks), include_defaults=False)
    return lm_eval.simple_evaluate(model=model, model_args=args, tasks=TASKS, limit=limit, log_samples=True,
                                   task_manager=manager)


def samples(results):
    return {task: [(s["doc_id"], s["resps"], s["filtered_resps"]) for s in rows]
            for task, rows in results["samples"].items()}


def scores(results):
    return {task: {k: v for k, v in metrics.items() if not k.startswith("domino_")}
            for task, metrics in results["results"].items()}


@pytest.mark.parametrize("batch_size", [1, 4])
def test_domino_gives_hf_samples_and_scores(setup, batch_size):
    """Same generations (every sample) and the same metrics as `hf` at the same batch size, task by task, with the
    suffix cache on (as `--model_args` passes it: a string). At batch size 4 the six requests go as batches of 4
    and 2, left-padded, through the draft's batched verify loop."""
    root, tasks = setup
    hf = evaluate(root, tasks, "hf", batch_size=batch_size)
    domino = evaluate(root, tasks, "domino", batch_size=batch_size, draft=str(root / "draft"), optimize_cpu=False,
                      use_suffix_cache="True")
    assert samples(domino) == samples(hf)
    assert scores(domino) == scores(hf)
    generated = domino["samples"]["domino_alpaca"]
    assert any(s["resps"][0][0] for s in generated)  # something was generated, not only empty strings


def test_batch_size_above_one_generates_each_batch_in_one_call(setup):
    """`batch_size=3`: one `generate` call per lm-eval batch (5 requests: batches of 3 and 2), each with the
    draft and a per-row record of its steps; the samples are `hf`'s at batch size 3, and its loglikelihoods too.
    Without a draft, `domino` is plain batched decoding: `hf`'s samples again."""
    root, tasks = setup
    hf = evaluate(root, tasks, "hf", limit=5, batch_size=3)
    lm = DominoLM(pretrained=str(root / "target"), draft=str(root / "draft"), device="cpu", optimize_cpu=False,
                  batch_size=3)
    calls = []
    generate = lm.model.generate

    def spy(*args, **kwargs):
        output = generate(*args, **kwargs)
        calls.append((kwargs["input_ids"].shape[0], kwargs.get("assistant_model"), lm.draft.last_generation_stats))
        return output

    lm.model.generate = spy
    domino = evaluate(root, tasks, lm, limit=5)
    assert samples(domino) == samples(hf) and scores(domino) == scores(hf)
    assert [(rows, assistant) for rows, assistant, _ in calls] == [(3, lm.draft), (2, lm.draft)]
    assert all(len(stats.per_row) == rows for rows, _, stats in calls)
    plain = evaluate(root, tasks, "domino", limit=5, batch_size=3, optimize_cpu=False)
    assert samples(plain) == samples(hf)


def test_stats_per_task(setup):
    from domino_hf.eval import add_domino_stats

    root, tasks = setup
    lm = DominoLM(pretrained=str(root / "target"), draft=str(root / "draft"), device="cpu", optimize_cpu=False,
                  use_suffix_cache=True)
    results = add_domino_stats(evaluate(root, tasks, lm, limit=4), lm)
    assert lm.draft.suffix_cache.num_sequences_added == 4  # every generation went into the draft's own store
    numbers = results["domino"]["tasks"]
    assert list(numbers) == ["domino_alpaca"]  # the loglikelihood task generates nothing
    row = numbers["domino_alpaca"]
    assert row["verify_steps"] > 0 and row["tau"] >= 1.0 and row["new_tokens"] > 0
    assert sum(row["source_share"].values()) == pytest.approx(1.0) and "cache" in row["source_share"]
    assert row["decode_tokens_per_s"] > 0 and row["generation_s"] > 0
    assert results["results"]["domino_alpaca"]["domino_tau,none"] == row["tau"]
    assert results["domino"]["draft"] == str(root / "draft")


def test_the_command_line(setup, tmp_path, capsys, caplog):
    """`domino lm-eval` is lm-eval's own command line: the printed table and the results JSON carry τ; on CPU
    the target runs on `optimize_for_cpu` kernels, said in the log."""
    import logging

    from domino_hf.cli import main

    root, tasks = setup
    out = tmp_path / "out"
    argv = ["lm-eval", "--model", "domino", "--model_args",
            f"pretrained={root / 'target'},draft={root / 'draft'}", "--tasks", "domino_alpaca",
            "--include_path", str(tasks), "--limit", "2", "--output_path", str(out), "--log_samples"]
    with caplog.at_level(logging.INFO, logger="domino_hf"):
        assert main(argv) == 0
    assert "domino_tau" in capsys.readouterr().out
    assert "optimize_for_cpu" in caplog.text
    (path,) = [p for p in out.rglob("results_*.json")]
    saved = json.loads(path.read_text())
    assert saved["domino"]["tasks"]["domino_alpaca"]["tau"] >= 1.0


def test_a_missing_lm_eval_names_the_extra():
    script = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'lm_eval': raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from domino_hf.cli import main\n"
        "print('EXIT', main(['lm-eval', '--model', 'domino']))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert "EXIT 2" in result.stdout, result.stderr[-2000:]
    assert "pip install 'domino-hf[eval]'" in result.stderr and len(result.stderr.strip().splitlines()) == 1
